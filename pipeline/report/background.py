"""The corpus report drawn by a process of its own that ``pipeline run`` starts at the lowest CPU
priority as soon as it has read its config (:func:`start`), so that matplotlib's import (about half
a second of CPU) is done by the time the pipeline ends, on cycles the run leaves idle: a core the
driver's in-process worker does not use, the gaps between stages. At the end :func:`build` sends it
``stats.json`` and ``sampling.json`` and writes the files it draws, the same bytes as
``corpus_report.build`` gives (the same code).

Where it cannot help, the driver draws the report itself, as without it: a process not started
(tests, workflows calling ``run_corpus``), one that has not imported matplotlib by the run's end
(the driver would wait for an import it does as fast itself), one that failed or is gone, and one
that has not answered within :data:`WAIT_S` seconds of the request (at the lowest priority on a
machine other work keeps busy it may get almost no CPU). It never decides what the report says:
for a ``stats.json`` it cannot draw it answers nothing, and the driver's own attempt gives the
error. A process ends after its one report, when :func:`stop` ends it (a run that failed) or when
its standard input closes (the driver ended, however). Importing this module imports nothing of
the report's (``pipeline run`` starts the process before it imports Beam).
"""
from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

WAIT_S = 30.0
"""How long the driver waits for the report process's answer, once it asked, before drawing the report
itself: drawing took 0.4 s for the 50 MB benchmark's corpus and 1.5-3.6 s for a corpus with perplexity
buckets and near-duplicate clusters (``tests/test_report.py``). A process started by ``pipeline run``
is in the run's own session, where the kernel's autogroups have it compete for CPU with that run's
processes only, done by then; elsewhere other work at normal priority can keep it waiting."""
READY = b"ready\n"
_started: subprocess.Popen | None = None


def start() -> None:
    """Start this process's report process (:func:`build` uses it once). Nothing where one runs."""
    global _started
    if _started is not None or not sys.executable:  # (an embedded interpreter has none to start)
        return
    root = str(Path(__file__).resolve().parents[2])  # where `pipeline` is, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        _started = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    except OSError:  # no process to spare: the driver draws it
        _started = None


def stop() -> None:
    """End this process's report process where :func:`build` did not take it (a run that failed)."""
    global _started
    process, _started = _started, None
    if process is not None:
        _end(process)


def build(corpus: str) -> list[str]:
    """``corpus_report.build(corpus)``, drawn by the report process where one was started, is ready
    and answers in time; returns the written paths."""
    from ..output import fs
    from ..output.layout import REPORT
    from . import corpus_report
    from .html import write_files

    global _started
    process, _started = _started, None
    if process is not None:
        try:
            files = _drawn(process, corpus_report.inputs(corpus))
        finally:
            _end(process)
        if files is not None:
            return write_files(fs.join(corpus, REPORT), files)
    return corpus_report.build(corpus)


def _drawn(process: subprocess.Popen, request: tuple[dict[str, Any], dict[str, Any]]) -> list[tuple[str, bytes]] | None:
    """The files ``process`` draws for ``request``; None where it has not imported matplotlib yet
    (the driver would wait for an import it can do as fast itself, or, on a busy machine, for a
    process that gets almost no CPU), fails, or has not answered within :data:`WAIT_S` seconds."""
    try:
        if not select.select([process.stdout], [], [], 0)[0] or process.stdout.readline() != READY:
            return None
        answer, _ = process.communicate(pickle.dumps(request, pickle.HIGHEST_PROTOCOL), timeout=WAIT_S)
        return pickle.loads(answer)
    except (OSError, EOFError, pickle.UnpicklingError, subprocess.TimeoutExpired):
        return None


def _end(process: subprocess.Popen) -> None:
    """``process`` stopped (where it still runs) and its pipes closed."""
    process.kill()
    process.wait()
    for pipe in (process.stdin, process.stdout):
        pipe.close()


def main() -> None:
    """The report process: lowest priority, matplotlib imported, then one request answered."""
    os.nice(19)
    from . import corpus_report

    corpus_report.pyplot()
    out = sys.stdout.buffer
    out.write(READY)
    out.flush()
    try:
        stats, sampling = pickle.load(sys.stdin.buffer)
    except (EOFError, pickle.UnpicklingError):  # the driver ended, or needs no report
        return
    try:
        files = corpus_report.render(stats, sampling)
    except Exception:  # noqa: BLE001  (the driver draws it and says what is wrong)
        files = None
    pickle.dump(files, out, pickle.HIGHEST_PROTOCOL)
    out.flush()


if __name__ == "__main__":
    main()
