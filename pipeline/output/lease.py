"""A run's hold on a folder in a bucket, where nothing locks (a local one is held with
``util.locks``): an object its driver's thread renews every :data:`RENEW_S` seconds while the run
lives. Two are held: ``<output>/_lease-<id>.json`` beside the run's ``_staging-<id>/``, and
``<output>/.run.lock`` for the whole output while the run lives (``run.claim_output``, the bucket
counterpart of a local output's lock file). A lease is written only where there is none, or over
one a killed run left once it is :data:`EXPIRES_S` seconds old, and renewed only over its own last
version: each write is conditional on the object's version (``stores.put_if``: S3's ``If-Match`` /
``If-None-Match``, GCS's ``ifGenerationMatch``), so of two runs that take a lease at once one does
and the other is refused. ``--resume`` refuses to continue a run whose driver still renews its
lease. A run that lost its lease (cut off for longer than that, or its lease taken) fails before
its commit (:meth:`Lease.check`). The lease's time is its writer's clock, read by another
machine's: their clocks must agree to well within ``EXPIRES_S - RENEW_S`` (NTP keeps them within a
second)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from . import fs, stores
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
    return unreadable(path)


def unreadable(path: str) -> dict:
    """What a lease that cannot be read is taken for: one just renewed (its run alive)."""
    LOG.warning("%s: not a lease this version can read; its run is taken to be alive", path)
    return {"renewed": time.time()}


def fresh(path: str, info: Any) -> bool:
    """Whether lease ``info`` (read from ``path``) was renewed less than :data:`EXPIRES_S` ago; one
    error line where it is no lease (a local run's lock file copied up with its folder, say), which
    would otherwise hold the output for good."""
    try:
        renewed = float(info["renewed"])
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{path}: not a lease that `pipeline run` wrote; delete it if no run is writing there") from None
    return time.time() - renewed < EXPIRES_S


class Held(Exception):
    """The lease is a live run's: ``info`` is what it says (``host``, ``pid``, ``renewed``)."""

    def __init__(self, info: Any) -> None:
        super().__init__(info)
        self.info: dict = info if isinstance(info, dict) else {}


def live(staging: str) -> bool | None:
    """Whether the run of ``staging`` still renews its lease; None where there is no lease (a local
    folder, a run that has ended, or one of a version before leases)."""
    path = lease_path(staging)
    found = read(path)
    return None if found is None else fresh(path, found)


class Lease:
    """Holds what the lease object at ``path`` stands for (``what``, for the error lines) until
    :meth:`release`: the lease is taken now (:class:`Held` where a live run holds it; a store's
    error is one line) and renewed by a thread every ``renew_s`` seconds, which first reads it
    back: a lease gone or another run's is lost for good (a failed renewal is a warning; the next
    one tries again, and one more than ``EXPIRES_S`` after the last loses it too)."""

    def __init__(self, path: str, what: str = "its staging folder", renew_s: float = RENEW_S) -> None:
        self.path, self.what, self.renew_s, self.token = path, what, renew_s, uuid.uuid4().hex
        self.lost = ""
        self._stop = threading.Event()
        try:
            self.version = self._take()
        except (Held, UserError):
            raise
        except Exception as exc:  # a store's error, whose write may have gone through: no lease left behind
            with contextlib.suppress(Exception):
                if (found := stores.read_versioned(self.path)) is not None and self._mine(found[0]):
                    fs.delete([self.path])
            raise UserError(f"{self.path}: cannot take this lease for {self.what} ({stores.reason(exc)})") from None
        self.renewed = time.monotonic()
        self._thread = threading.Thread(target=self._keep, name="lease", daemon=True)
        self._thread.start()

    def _body(self) -> bytes:  # always the same length, so that a reader never gets a cut one
        return (f'{{"host": {json.dumps(socket.gethostname())}, "pid": {os.getpid()}, '
                f'"token": "{self.token}", "renewed": {time.time():.6f}}}').encode()

    def _take(self) -> str:
        """Write the lease where there is none (a create-only write), or over a killed run's expired
        one (a write conditional on the version read: of two runs taking it at once, one does); the
        version written. A live run's is not written to (:class:`Held`): on a store that ignores the
        conditions, a run refused leaves the live one's lease as it was."""
        info: Any = {}
        for attempt in range(3):  # (a lease released or taken between the read and the write: read again)
            time.sleep(0.2 * attempt)
            if (found := stores.read_versioned(self.path)) is None:
                version = stores.put_if(self.path, self._body(), None)
            else:
                try:
                    info = json.loads(found[0])
                except ValueError:
                    info = None
                if self._mine(found[0]):  # this write went through on a try the client retried
                    return found[1]
                if fresh(self.path, info):
                    raise Held(info)
                if (version := stores.put_if(self.path, self._body(), found[1])) is not None:
                    LOG.warning("%s: took over the lease of a run whose driver stopped renewing it", self.path)
            if version is not None:
                return version
        raise Held(info)  # taken by another run at the same moment

    def _renew(self) -> str | None:
        """The lease rewritten over its last version, or over the version there if that is still
        this run's (a write that went through on a try the client retried); None if neither."""
        if (version := stores.put_if(self.path, self._body(), self.version)) is not None:
            return version
        found = stores.read_versioned(self.path)
        if found is None or not self._mine(found[0]):
            return None
        if (version := stores.put_if(self.path, self._body(), found[1])) is None:  # (still its own: try again later)
            raise OSError("the store refused to rewrite the run's own lease")
        return version

    def _mine(self, data: bytes) -> bool:
        """Whether lease object ``data`` is this one's (a lease's token is unique to it)."""
        return f'"token": "{self.token}"'.encode() in data

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
                elif (version := self._renew()) is None:
                    self.lost = "another run removed or took it"
                else:
                    self.version, self.renewed = version, time.monotonic()
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
            raise UserError(f"{self.path}: this run lost its hold on {self.what} ({self.lost}), so another run may "
                            "have taken it; the previous corpus is left as it was")

    def release(self) -> None:
        """Stop renewing (no renewal comes after this returns) and delete the lease if it is still
        this run's and renewed less than half of :data:`EXPIRES_S` ago (so that no other run can have
        taken it meanwhile: an older one is left to expire); another run's is left alone."""
        self._stop.set()
        self._thread.join()
        if time.monotonic() - self.renewed >= EXPIRES_S / 2:
            return
        try:
            found = stores.read_versioned(self.path)
            if found is not None and self._mine(found[0]):
                fs.delete([self.path])
        except Exception as exc:  # noqa: BLE001 (the run is done: the next run on the output removes the expired lease)
            LOG.warning("%s: could not delete the run's lease (%s)", self.path, exc)
