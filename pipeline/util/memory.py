"""Where a process's memory comes from: a step's models and buffers allocated apart from the documents,
and the memory a run may hold documents in."""
from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")


class OwnArena:
    """Calls run one at a time in a thread of its own, the same thread for this object's life, each
    waited for: glibc's malloc gives a new thread another arena than the main thread's, so what the
    calls allocate, kept (a model's tables) or freed again at once (a prediction's buffers), lies
    there rather than in the gaps that documents made and left in the main arena. Where nothing
    fragmented the main arena (a model and its input loaded in a process of their own), it made no
    difference (fastText, SentencePiece and KenLM, BENCHMARKS.md, 2026-11-30). The calls share
    their thread's context (what one sets in a context variable, NumPy's error state say, the next
    finds), but for the variables in ``carry``, which each call finds as its caller has them (where
    a task notes its writes, say). Exceptions are raised in the caller's thread. Elsewhere than
    glibc it is a thread's call, no more."""

    def __init__(self, carry: Iterable[contextvars.ContextVar[Any]] = ()) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="own-arena")
        self._carry = tuple(carry)

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in this object's thread, with the caller's values of the carried variables."""
        values = [(var, var.get(None)) for var in self._carry]
        return self._thread.submit(_with_values, values, fn, *args).result()

    def close(self) -> None:
        """Let the thread end (once a call running there returns); no call may follow."""
        self._thread.shutdown(wait=False)


def _with_values(values: list[tuple[contextvars.ContextVar[Any], Any]], fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with each variable set to its value, then set back."""
    tokens = [var.set(value) for var, value in values]
    try:
        return fn(*args)
    finally:
        for (var, _), token in zip(reversed(values), reversed(tokens)):
            var.reset(token)


def available_bytes(meminfo: str = "/proc/meminfo", cgroups: str = "/sys/fs/cgroup",
                    own: str = "/proc/self/cgroup") -> int:
    """The memory the kernel says a process could still take without swapping (``MemAvailable``),
    lowered to the room the memory cgroups it runs in leave under their limits (a container's, a
    Kubernetes pod's, a Slurm job's: ``/proc/meminfo`` shows the host's memory there); 0 where the
    kernel says nothing (not Linux)."""
    try:
        with open(meminfo) as stream:
            host = next((int(line.split()[1]) * 1024 for line in stream if line.startswith("MemAvailable:")), 0)
    except (OSError, ValueError, IndexError):
        return 0
    return min([host, *cgroup_rooms(cgroups, own)]) if host else 0


CGROUP_FILES = {"v2": ("memory.max", "memory.current", "inactive_file"),
                "v1": ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")}
"""Per cgroup version: its memory limit, usage and (in ``memory.stat``) the page cache it can drop."""


def cgroup_rooms(cgroups: str, own: str) -> list[int]:
    """The room under the limit of each memory cgroup this process is in, from its own up to the
    mount's root (the limit less the usage, plus the inactive page cache the kernel reclaims first):
    cgroup v2's unified hierarchy, or v1's memory controller. A level without a limit adds nothing."""
    try:
        with open(own) as stream:
            lines = stream.read().splitlines()
    except OSError:
        return []
    rooms = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:  # (no cgroup line)
            continue
        _, controllers, path = fields
        if controllers == "":
            version, mount = "v2", Path(cgroups) if Path(cgroups, "cgroup.controllers").exists() else Path(cgroups, "unified")
        elif "memory" in controllers.split(","):
            version, mount = "v1", Path(cgroups, "memory")
        else:
            continue
        folder = mount / path.lstrip("/")
        for level in [folder, *folder.parents]:
            if level == mount.parent:
                break
            room = _room(level, *CGROUP_FILES[version])
            if room is not None:
                rooms.append(room)
    return rooms


def _room(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    """``folder``'s limit less its usage plus its inactive page cache; None without a limit."""
    try:
        limit = (folder / limit_file).read_text().strip()
        if limit == "max" or int(limit) >= 1 << 60:  # (v1 writes "no limit" as a page-rounded 2**63)
            return None
        usage = int((folder / usage_file).read_text())
    except (OSError, ValueError):
        return None
    try:  # (without it, none of the cache counts as room)
        stat = dict(line.split()[:2] for line in (folder / "memory.stat").read_text().splitlines() if " " in line)
        inactive = int(stat.get(inactive_key, 0))
    except (OSError, ValueError):
        inactive = 0
    return max(0, int(limit) - usage + inactive)
