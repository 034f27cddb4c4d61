"""Where a process's memory comes from: a model's tables allocated apart from the documents, and the
memory a run may hold documents in."""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def in_own_arena(load: Callable[[], T]) -> T:
    """``load()``, run in a thread of its own and waited for: glibc's malloc gives a new thread
    another arena than the main thread's, so what ``load`` allocates and keeps (a model's tables)
    lies together there rather than in the gaps that documents made and left in the main arena.

    LID's fastText took 5.8-6.0 s of a 1-worker run of the benchmark with its model loaded in the
    main arena while the hash pass's documents were held there (``readers.spill``), and 4.7 s with
    it loaded in a thread of its own; where no documents were held (2 workers, or spills on the
    disk) it made no difference (BENCHMARKS.md, 2026-11-30). Exceptions are raised here, in the
    caller's thread. Elsewhere than glibc it is a thread's call of ``load``, nothing more."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(load())
        except BaseException as exc:  # noqa: BLE001  raised again in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name="load-in-own-arena")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def available_bytes(meminfo: str = "/proc/meminfo") -> int:
    """The memory the kernel says a process could still take without swapping (``MemAvailable``),
    or 0 where it does not say (not Linux)."""
    try:
        with open(meminfo) as stream:
            for line in stream:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
