"""A run's hold on its staging folder in a bucket, where nothing locks (a local one is held with
``util.locks``): the object ``<output>/_lease-<id>.json`` beside ``_staging-<id>/``, which a thread
of the run's driver renews every :data:`RENEW_S` seconds while the run lives. Another run takes
the folder for one a killed run left once the lease is :data:`EXPIRES_S` seconds old: it leaves a
live run's folder alone, and ``--resume`` refuses to continue a run whose driver still renews it.
The lease's time is its writer's clock, read by another machine's: their clocks must agree to
well within ``EXPIRES_S - RENEW_S`` (NTP keeps them within a second)."""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from . import fs
from .layout import LEASE, STAGING

LOG = logging.getLogger(__name__)
RENEW_S = 20.0
EXPIRES_S = 120.0


def lease_path(staging: str) -> str:
    """The lease of staging folder ``staging`` (``<output>/_staging-<id>``): ``<output>/_lease-<id>.json``."""
    output, _, run_id = staging.rstrip("/").rpartition(f"/{STAGING}")
    return fs.join(output, f"{LEASE}{run_id}.json")


def expired(output: str) -> list[str]:
    """The staging folders in ``output`` whose lease has expired: their runs were killed."""
    found = [fs.join(output, f"{STAGING}{fs.relative(path, output).removeprefix(LEASE).removesuffix('.json')}")
             for path in fs.match_optional(output, f"{LEASE}*.json")]
    return [staging for staging in found if live(staging) is False]


def age(staging: str) -> float | None:
    """Seconds since the lease of ``staging`` was last renewed; None where there is none (a local
    folder, a run that has ended, or one of a version before leases)."""
    path = lease_path(staging)
    if not fs.exists(path):
        return None
    try:
        with fs.open_read(path) as stream:
            renewed = json.load(stream)["renewed"]
    except (OSError, ValueError, KeyError, TypeError):  # gone meanwhile, or not ours: no hold
        return None
    return time.time() - float(renewed)


def live(staging: str) -> bool | None:
    """Whether the run of ``staging`` still renews its lease; None where there is no lease."""
    seconds = age(staging)
    return None if seconds is None else seconds < EXPIRES_S


class Lease:
    """Holds staging folder ``staging`` in a bucket until :meth:`release`: the lease is written now
    (an error is the caller's) and renewed by a thread every ``renew_s`` seconds (a failed renewal is
    a warning; the next one tries again)."""

    def __init__(self, staging: str, renew_s: float = RENEW_S) -> None:
        self.path, self.renew_s = lease_path(staging), renew_s
        self._stop = threading.Event()
        self._renew()
        self._thread = threading.Thread(target=self._keep, name="staging-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        body = {"host": socket.gethostname(), "pid": os.getpid(), "renewed": time.time()}
        fs.put_object(self.path, json.dumps(body).encode())

    def _keep(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                self._renew()
            except Exception as exc:  # a store that fails for a while: the lease holds until EXPIRES_S
                LOG.warning("%s: could not renew the run's lease (%s); trying again in %.0f s", self.path, exc,
                            self.renew_s)

    def release(self) -> None:
        """Stop renewing (no renewal comes after this returns) and delete the lease."""
        self._stop.set()
        self._thread.join()
        try:
            fs.delete([self.path])
        except Exception as exc:  # the run is done: the next run on the output removes the expired lease
            LOG.warning("%s: could not delete the run's lease (%s)", self.path, exc)
