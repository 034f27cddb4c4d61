"""Where a process's memory comes from: a step's models and buffers allocated apart from the documents,
and the memory a run may hold documents in."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class OwnArena:
    """Calls run one at a time in a thread of its own, the same thread for this object's life, each
    waited for: glibc's malloc gives a new thread another arena than the main thread's, so what the
    calls allocate, kept (a model's tables) or freed again at once (a prediction's buffers), lies
    there rather than in the gaps that documents made and left in the main arena. Where nothing
    fragmented the main arena (a model and its input loaded in a process of their own), it made no
    difference (fastText, SentencePiece and KenLM, BENCHMARKS.md, 2026-11-30). Exceptions are
    raised in the caller's thread. Elsewhere than glibc it is a thread's call, no more."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="own-arena")

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in this object's thread."""
        return self._thread.submit(fn, *args).result()

    def close(self) -> None:
        """Let the thread end (once a call running there returns); no call may follow."""
        self._thread.shutdown(wait=False)


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
