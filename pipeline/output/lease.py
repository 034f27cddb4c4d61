"""A run's hold on its staging folder in a bucket, where nothing locks (a local one is held with
``util.locks``): the object ``<output>/_lease-<id>.json`` beside ``_staging-<id>/``, which a thread
of the run's driver renews every :data:`RENEW_S` seconds while the run lives. Another run takes
the folder for one a killed run left once the lease is :data:`EXPIRES_S` seconds old: it leaves a
live run's folder alone, and ``--resume`` refuses to continue a run whose driver still renews it.
A run that lost its lease (cut off for longer than that, or its lease taken) fails before its
commit (:meth:`Lease.check`): its folder may have been removed meanwhile. The lease's time is its
writer's clock, read by another machine's: their clocks must agree to well within
``EXPIRES_S - RENEW_S`` (NTP keeps them within a second)."""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

from . import fs
from ..util.errors import UserError
from .layout import LEASE, STAGING

LOG = logging.getLogger(__name__)
RENEW_S = 20.0
EXPIRES_S = 120.0


def lease_path(staging: str) -> str:
    """The lease of staging folder ``staging`` (``<output>/_staging-<id>``): ``<output>/_lease-<id>.json``."""
    output, _, run_id = staging.rstrip("/").rpartition(f"/{STAGING}")
    return fs.join(output, f"{LEASE}{run_id}.json")


def expired(output: str) -> list[str]:
    """The staging folders in bucket folder ``output`` whose lease has expired: their runs were killed."""
    found = [fs.join(output, f"{STAGING}{fs.relative(path, output).removeprefix(LEASE).removesuffix('.json')}")
             for path in fs.match_optional(output, f"{LEASE}*.json")]
    return [staging for staging in found if live(staging) is False]


def read(path: str) -> dict | None:
    """The lease at ``path``; None where there is none. One that cannot be read twice over (not one a
    renewal replaces while it is read: a lease keeps its length) is taken for one just renewed."""
    for attempt in range(2):
        try:
            with fs.open_read(path) as stream:
                return json.loads(stream.read())
        except Exception:  # noqa: BLE001 (gone meanwhile: GCS's NotFound is no OSError; or not ours)
            if not fs.exists(path):
                return None
            time.sleep(0.5 * (attempt + 1))
    LOG.warning("%s: not a lease this version can read; its run is taken to be alive", path)
    return {"renewed": time.time()}


def live(staging: str) -> bool | None:
    """Whether the run of ``staging`` still renews its lease; None where there is no lease (a local
    folder, a run that has ended, or one of a version before leases)."""
    found = read(lease_path(staging))
    return None if found is None else time.time() - float(found["renewed"]) < EXPIRES_S


class Lease:
    """Holds staging folder ``staging`` in a bucket until :meth:`release`: the lease is written now
    (an error is the caller's) and renewed by a thread every ``renew_s`` seconds, which first reads
    it back: a lease gone or another run's is lost for good (a failed renewal is a warning; the next
    one tries again, and one more than ``EXPIRES_S`` after the last loses it too)."""

    def __init__(self, staging: str, renew_s: float = RENEW_S) -> None:
        self.path, self.renew_s, self.token = lease_path(staging), renew_s, uuid.uuid4().hex
        self.lost = ""
        self._stop = threading.Event()
        self._renew()
        self._thread = threading.Thread(target=self._keep, name="staging-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:  # always the same length, so that a reader never gets a cut one
        fs.put_object(self.path, (f'{{"host": {json.dumps(socket.gethostname())}, "pid": {os.getpid()}, '
                                  f'"token": "{self.token}", "renewed": {time.time():.6f}}}').encode())
        self.renewed = time.monotonic()

    def _keep(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                found = read(self.path)
                if found is not None and "token" not in found:  # could not be read back: no renewal this time
                    LOG.warning("%s: could not read the run's lease back; trying again in %.0f s", self.path, self.renew_s)
                    continue
                if found is None or found["token"] != self.token:
                    self.lost = "another run removed or took it"
                elif time.monotonic() - self.renewed >= EXPIRES_S:
                    self.lost = f"not renewed for {time.monotonic() - self.renewed:.0f} s"
                else:
                    self._renew()
                    continue
                LOG.error("%s: this run lost its lease (%s); it will not replace the corpus", self.path, self.lost)
                return
            except Exception as exc:  # noqa: BLE001 (a store that fails for a while: the lease holds until EXPIRES_S)
                LOG.warning("%s: could not renew the run's lease (%s); trying again in %.0f s", self.path, exc,
                            self.renew_s)

    def check(self) -> None:
        """Before the commit: one error line if the lease is lost, or if it was last renewed more than
        half of ``EXPIRES_S`` ago (another run may take the folder before the commit is under way)."""
        if not self.lost and time.monotonic() - self.renewed >= EXPIRES_S / 2:
            self.lost = f"not renewed for {time.monotonic() - self.renewed:.0f} s"
        if self.lost:
            raise UserError(f"{self.path}: this run lost its hold on its staging folder ({self.lost}), so another "
                            "run may have removed what it wrote; the previous corpus is left as it was")

    def release(self) -> None:
        """Stop renewing (no renewal comes after this returns) and delete the lease, unless lost."""
        self._stop.set()
        self._thread.join()
        if self.lost:
            return
        try:
            fs.delete([self.path])
        except Exception as exc:  # noqa: BLE001 (the run is done: the next run on the output removes the expired lease)
            LOG.warning("%s: could not delete the run's lease (%s)", self.path, exc)
