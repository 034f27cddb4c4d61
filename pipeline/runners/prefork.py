"""The fork server that SDK workers are forked from (DirectRunner ``multi_processing``, a Dask
LocalCluster: ``forkserver``, ``dask_runner``), started without importing Beam.

``pipeline run`` starts it right after reading the config (:func:`start_for_run`), before the
driver imports Beam (about 1.2 s). The server then imports Beam's worker, the graph and the
steps' worker modules (about 2.5 s in all) on another core while the driver imports Beam and
builds the graph. Started from inside the run instead, it was still importing when the
driver asked for the first worker, which waited 0.6-0.8 s on the benchmark.
"""
from __future__ import annotations

import argparse
import ast
import gc
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import threading
from pathlib import Path
from types import ModuleType

LOCAL_NAMES = ("DirectRunner", "SwitchingDirectRunner")
WORKER_MODULES = ["apache_beam.runners.worker.sdk_worker_main", "pipeline.graph"]  # the fork server's imports
FORKSERVER = multiprocessing.get_context("forkserver")
GC_THRESHOLD = 50_000
"""The cyclic collector's first-generation threshold in a process that runs the chain (Python's
default is 700 allocations). Documents are dicts and lists by the hundred thousand, none of them in
a cycle, so the collections find nothing while each older one walks every live document: at 700 the
process of a 1-worker run of the benchmark (11.6 s) collected 1,023 times, 0.71 s in all; at 50,000
all along, 8 times (0.11 s). Cycles are still collected, 50,000 allocations later at most."""


def main_is_guarded(main: ModuleType) -> bool:
    """Whether a process started by multiprocessing can prepare itself without running the
    driver's ``__main__`` again: a package's ``__main__`` (``python -m pipeline``, ``-m pytest``)
    and ``-c`` are not imported by it; a script or ``-m`` module must keep its work under
    ``if __name__ == "__main__":`` (besides it, only definitions, imports, assignments and
    :data:`SET_UP_CALLS`: each forked worker runs them again)."""
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    path = getattr(main, "__file__", None)
    if name == "__main__" or name.endswith(".__main__") or path is None:
        return True
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    return (any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test)
                for node in tree.body)
            and all(_only_sets_up(node) for node in tree.body))


SET_UP_CALLS = ("sys.path.insert", "sys.path.append", "os.environ.setdefault", "os.environ.update",
                "warnings.filterwarnings", "warnings.simplefilter", "logging.basicConfig")
"""Calls a script may make at its top level beside its guard: each worker runs them again, harmlessly."""


def _only_sets_up(node: ast.stmt) -> bool:
    """Whether a script's top-level statement only defines, imports, assigns or sets up
    (:data:`SET_UP_CALLS`; a ``try`` of such, an optional import): a call or a loop there besides
    the guard (a script that runs its work at the top level and guards something else) would run
    again in every forked worker. An assignment is taken for set-up (``ROOT = Path(...)``): this
    cannot tell it from ``stats = run_corpus(cfg)``, which a script must keep under its guard."""
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Constant) or (isinstance(node.value, ast.Call)
                                                        and ast.unparse(node.value.func) in SET_UP_CALLS)
    if isinstance(node, ast.Try):
        return all(_only_sets_up(inner) for inner in [*node.body, *node.orelse, *node.finalbody,
                                                       *(s for handler in node.handlers for s in handler.body)])
    return isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                             ast.Assign, ast.AnnAssign, ast.AugAssign, ast.If, ast.Pass))


def raise_gc_threshold() -> tuple[int, int, int]:
    """Set the collector's first-generation threshold to at least :data:`GC_THRESHOLD` in this
    process; returns the thresholds it had (for ``gc.set_threshold`` to put them back)."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], GC_THRESHOLD), *before[1:])
    return before


def start_fork_server(modules: list[str]) -> bool:
    """Start multiprocessing's fork server importing ``modules``, where workers can be forked from it
    (:func:`main_is_guarded`); one per driver process: a later call finds it running, with the
    modules and environment it started with. Returns whether it runs."""
    if "forkserver" not in multiprocessing.get_all_start_methods() or not main_is_guarded(sys.modules["__main__"]):
        return False
    FORKSERVER.set_forkserver_preload(modules)
    # Ctrl-C is the driver's to handle: the server starts ignoring it (as it does itself only once it has
    # imported the modules), and so do the workers it forks (a Ctrl-C in the few ms of its start is lost)
    main = threading.current_thread() is threading.main_thread()
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if main:
            signal.signal(signal.SIGINT, interrupt)
    return True


def forks_workers(runner: str, beam_flags: list[str]) -> bool:
    """Whether a run with this ``--runner`` and these Beam flags forks its SDK workers: the
    DirectRunner with ``--direct_running_mode multi_processing`` (Beam's default is in_memory). The
    flags are read as Beam reads them, a later one winning, without importing Beam."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--runner")
    parser.add_argument("--direct_running_mode")
    flags = parser.parse_known_args([f"--runner={runner}", *beam_flags])[0]
    return flags.runner in LOCAL_NAMES and flags.direct_running_mode == "multi_processing"


def start_for_run(runner: str, beam_flags: list[str], step_modules: list[str], lean: bool = False) -> bool:
    """Start the fork server for a run that forks its workers (:func:`forks_workers`), importing
    what its workers need; ``forkserver.install`` finds it running. With ``lean`` it leaves Beam's
    cloud clients out of its import (``lean_import``). Returns whether it runs."""
    if not forks_workers(runner, beam_flags):
        return False
    if not lean:
        return start_fork_server([*WORKER_MODULES, *step_modules])
    from . import lean_import

    before = os.environ.get(lean_import.ENV)
    os.environ[lean_import.ENV] = "1"  # the server's environment, not this process's
    try:
        return start_fork_server([lean_import.__name__, *WORKER_MODULES, *step_modules])
    finally:
        if before is None:
            del os.environ[lean_import.ENV]
        else:
            os.environ[lean_import.ENV] = before
