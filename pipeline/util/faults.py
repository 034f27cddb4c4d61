"""Fault injection for tests: with ``<VARIABLE>=<point>@<n>`` in the environment, the process
prints ``fault point <point> step <n>`` to stderr when it reaches that point and sleeps until it
is killed (the tests send SIGKILL). ``PRETRAIN_FAULT`` serves the trainer, ``POLYGLOT_FAULT`` the
corpus pipeline's commit."""
from __future__ import annotations

import os
import sys
import time


def fault_point(variable: str, point: str, n: int) -> None:
    """Stop here until killed when ``variable`` names this point and ``n``."""
    if os.environ.get(variable) == f"{point}@{n}":
        print(f"fault point {point} step {n}", file=sys.stderr, flush=True)
        while True:
            time.sleep(60)
