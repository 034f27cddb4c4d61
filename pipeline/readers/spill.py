"""What the dedup's first pass read from an input file, kept on this machine's disk (or in memory) for
the second.

CCNet reads every file twice: once to hash its paragraphs, once to take the duplicates out. Where
the run's workers share the driver's disk (the DirectRunner), the first pass writes each file's
read results to ``<scratch>/<file index>.spill`` as it parses them, and the second loads them
instead of parsing the file again, then deletes them. On the benchmark's 8 WET files (53,328
documents) parsing takes 2.9-3.6 s a pass; writing and loading the spill 0.5-0.7 s together.

Where the second pass runs in the process that made the run's scratch folder (the DirectRunner's
own workers, ``in_memory``: every 1-worker run), the first pass's results are held there instead,
as they are, up to the ``hold_bytes`` its :class:`Scratch` was made with in all (:func:`hold_bytes`:
a quarter of the memory available when the run starts); so are they in each of the DirectRunner's
forked workers, which the runner gives both passes of the files they read
(``transforms.placement``), up to its share of that (:func:`hold_here`). No spill is written or
loaded (0.17 s and 0.19 s for the benchmark's 8 files), and a 1-worker ``[dedup, lid]`` run of the benchmark took
0.975x the time (medians of 6 alternated runs, BENCHMARKS.md, 2026-11-30); LID's model is loaded
apart from the held documents (``transforms.apply.ApplyStep``), without which fastText took 1.25x
the time. Past that, a file's results go to its spill on the disk as above.

A spill is written under a temporary name and renamed when whole, so one that is there is
complete; none is written to a tmpfs (memory), which is why a run's scratch folder goes to
``/var/tmp`` where ``/tmp`` is one and ``TMPDIR`` is not set (:func:`scratch_parent`), nor while
the disk has less than :data:`SPARE_BYTES` (or 5 % of it; :data:`SPARE_ENV`'s size where set) free,
and a writer gives up past a quarter of what was free above that. The second pass reads the input
file again wherever there is no whole spill (a full disk, a retried bundle whose spill was taken,
one cut short): the same documents either way.

The format: frames of an 8-byte little-endian length and a ``marshal`` blob (a chunk of results;
documents as dicts, drops, notes and rejected records as tagged tuples), ended by a zero length.
``marshal`` is the fastest of Python's serializers for dicts of strings (dump 0.2-0.3 s, load
0.3-0.4 s here, pickle 0.5 s each) and needs the same Python on both sides, as one run has.
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import marshal
import os
import re
import shutil
import sys
import tempfile
import threading
from typing import Any, BinaryIO, Iterable, Iterator

from ..steps.base import CHUNK_DOCS, Drop, Note, Rejected
from ..util import locks
from ..util.errors import UserError
from ..util.memory import available_bytes

SPARE_BYTES = 2**30
"""Free bytes a spill never takes (nor 5 % of the disk, whichever is more), unless :data:`SPARE_ENV`
says otherwise."""
SPARE_ENV = "POLYGLOT_SCRATCH_SPARE"
"""Set to a size (``0``, ``512M``, ``20G``): the free space a spill leaves on its disk instead (a big
disk nearly full whose few free gigabytes hold the spills well; the tests, whatever the host's)."""
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
DISK_TEMP = "/var/tmp"
"""The temporary folder on a disk (the FHS's, kept across reboots), where ``/tmp`` is memory."""
SCRATCH_PREFIX = "polyglot-scratch-"
LOG = logging.getLogger(__name__)
_KINDS: dict[str, type] = {"drop": Drop, "note": Note, "rejected": Rejected}
_TAGS = {cls: tag for tag, cls in _KINDS.items()}
_FRAME = 8


def hold_bytes() -> int:
    """What a run's scratch folder may hold in memory (:class:`Scratch`): a quarter of the memory
    available now."""
    return available_bytes() // 4


def path_of(scratch: str, index: int) -> str:
    return os.path.join(scratch, f"{index:06d}.spill")


def _encode(result: Any) -> Any:
    if isinstance(result, dict):
        return result
    return (_TAGS[type(result)], *dataclasses.astuple(result))


def _decode(item: Any) -> Any:
    if isinstance(item, dict):
        return item
    tag, *fields = item
    return _KINDS[tag](*fields)


def memory_backed(path: str, mounts: str = "/proc/self/mounts") -> bool:
    """Whether ``path`` is on a tmpfs or ramfs (its nearest mount point's type; False where the
    mount table cannot be read)."""
    try:
        with open(mounts) as table:
            entries = [line.split()[1:3] for line in table]
    except OSError:
        return False
    path = os.path.realpath(path)
    best, kind = "", ""
    for point, fstype in entries:
        point = point.replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fstype
    return kind in ("tmpfs", "ramfs")


def scratch_parent(mounts: str = "/proc/self/mounts") -> str:
    """Where a run's scratch folder goes: the system's temporary folder, or :data:`DISK_TEMP` where
    that is a tmpfs (``/tmp`` is one on Debian 13, Fedora and Arch), ``TMPDIR`` is not set and
    :data:`DISK_TEMP` is a folder on a disk this process may write. In memory the scratch holds
    no spill and no stage's files: tables move between stages as bytes, and a file whose first
    pass's results no worker holds in its memory is parsed again by the dedup pass (every file,
    before workers held them: 1.05-1.15x the time of a 1-worker ``[dedup, lid]`` run on the 50 MB
    benchmark, BENCHMARKS.md)."""
    temp = tempfile.gettempdir()
    if ("TMPDIR" not in os.environ and memory_backed(temp, mounts) and os.path.isdir(DISK_TEMP)
            and os.access(DISK_TEMP, os.W_OK | os.X_OK) and not memory_backed(DISK_TEMP, mounts)):
        return DISK_TEMP
    return temp


class Scratch:
    """A run's scratch folder under :func:`scratch_parent` (spills, stashed tables), removed by
    :meth:`remove` when the run ends, failed or not. With ``hold_bytes``, spills that this process
    writes are held in its memory instead, up to about that many bytes in all (:func:`keeping`).
    A run whose process was killed (SIGKILL, out of memory) cannot remove its own, and on a disk
    it could hold a copy of every input file read: so this process holds the folder
    (``util.locks.FolderLock``), and each new scratch folder first removes those beside it that
    :func:`abandoned` finds."""

    def __init__(self, parent: str | None = None, hold_bytes: int = 0) -> None:
        parent = parent or scratch_parent()
        for path in abandoned(parent):
            shutil.rmtree(path, ignore_errors=True)
            LOG.info("removed %s, the scratch folder of a run that was killed", path)
        try:
            self.path = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent)
        except OSError as exc:
            raise UserError(f"cannot make the run's scratch folder in {parent}: {exc.strerror}; set TMPDIR to a "
                            "writable folder on a local disk") from None
        self._lock = locks.FolderLock(self.path)
        if hold_bytes > 0:
            _IN_MEMORY[self.path] = _Memory(hold_bytes)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        _IN_MEMORY.pop(self.path, None)
        self._lock.release()


def abandoned(parent: str) -> list[str]:
    """The scratch folders in ``parent`` whose run was killed (``util.locks.abandoned``)."""
    return [path for path in sorted(glob.glob(os.path.join(glob.escape(parent), f"{SCRATCH_PREFIX}*")))
            if locks.abandoned(path)]


def budget(scratch: str) -> int:
    """Bytes one spill (or one table stashed there, ``transforms.write.stash``) may take now: a
    quarter of the free space above the spare (several workers write at once); none in memory (a
    tmpfs): the workers need it more than the second read does."""
    try:
        usage = shutil.disk_usage(scratch)
    except OSError:  # the folder is gone (the run is ending): no spill
        return 0
    if memory_backed(scratch):
        return 0
    return max(0, (usage.free - spare_bytes(usage.total)) // 4)


def spare_bytes(total: int) -> int:
    """The free space a spill leaves on a disk of ``total`` bytes: :data:`SPARE_ENV`'s, or the more of
    :data:`SPARE_BYTES` and 5 % of the disk."""
    value = os.environ.get(SPARE_ENV, "").strip()
    if not value:
        return max(SPARE_BYTES, total // 20)
    size = re.fullmatch(r"([0-9]{1,20})([KMGT]?)", value, re.IGNORECASE)
    if size is None:
        raise UserError(f"{SPARE_ENV}={value!r}: a size in bytes, or with K, M, G or T (e.g. 0, 512M, 20G)")
    return int(size.group(1)) * _UNITS[size.group(2).upper()]


def no_room(scratch: str) -> str:
    """Why a spill finds no room in ``scratch`` (for a warning), or "" where one does."""
    if budget(scratch):
        return ""
    if memory_backed(scratch):
        return "is in memory (a tmpfs)"
    usage = shutil.disk_usage(scratch)
    rule = SPARE_ENV if os.environ.get(SPARE_ENV, "").strip() else f"5 % of the disk, at least 1 GiB; {SPARE_ENV}=<size> sets it"
    return (f"is on a disk with {usage.free / 2**30:.1f} GiB free, under the {spare_bytes(usage.total) / 2**30:.1f} GiB "
            f"a spill leaves spare ({rule})")


HELD_DOCUMENT_BYTES = 1200
"""What a held document takes beyond its text (its dict, id, URL, date, digest: 1.17 KB a document
of the benchmark, whose 53,328 documents took 186 MB of memory for 177 MB so counted)."""
HELD_OTHER_BYTES = 200
"""What a held drop, note or rejected record takes."""


def _held_bytes(result: Any) -> int:
    if isinstance(result, dict):
        return sys.getsizeof(result["text"]) + HELD_DOCUMENT_BYTES
    return HELD_OTHER_BYTES


class _Memory:
    """The spills held in the memory of the process that made a scratch folder, or of a worker
    told to (:func:`hold_here`): per file index,
    its results and their size, up to ``budget`` bytes in all (a file being read counts once it is
    whole, so files read at the same time, by threads, may pass it together)."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used = budget, 0
        self.files: dict[int, tuple[list[Any], int]] = {}
        self.lock = threading.Lock()  # (the DirectRunner's multi_threading workers share it)

    def put(self, index: int, results: list[Any], size: int) -> None:
        with self.lock:
            _, before = self.files.get(index, ((), 0))  # a retried bundle's file replaces what it held
            self.files[index] = results, size
            self.used += size - before

    def take(self, index: int) -> list[Any] | None:
        with self.lock:
            results, size = self.files.pop(index, (None, 0))
            self.used -= size
            return results


_IN_MEMORY: dict[str, _Memory] = {}
"""This process's scratch folders that hold spills in its memory (``Scratch(hold_bytes=...)``, or
:func:`hold_here`)."""
_held_here = 0


def hold_here(hold_bytes: int) -> None:
    """This process (a worker of the run, not the process that made its scratch folder) holds the
    spills it writes in its memory, up to ``hold_bytes`` in all per scratch folder: the runner runs
    the second pass of a file on the worker that ran its first
    (:data:`~pipeline.transforms.placement.BY_FILE`)."""
    global _held_here
    _held_here = hold_bytes


def _memory(scratch: str) -> _Memory | None:
    """Where this process holds ``scratch``'s spills, if it does."""
    memory = _IN_MEMORY.get(scratch)
    if memory is None and _held_here > 0:
        memory = _IN_MEMORY.setdefault(scratch, _Memory(_held_here))
    return memory


def keeping(scratch: str, index: int, results: Iterable[Any]) -> Iterator[Any]:
    """``results`` passed on as they come, kept meanwhile as file ``index``'s spill (complete
    when the last result has been taken): in this process's memory where it made the scratch
    folder or :func:`hold_here` says so, with room to hold them, else written to the disk. Without
    room on the disk either, they are only passed on."""
    memory = _memory(scratch)
    held: list[Any] | None = [] if memory is not None else None
    size = 0
    writer = None if memory is not None else _Writer(path_of(scratch, index), budget(scratch))
    try:
        for result in results:
            yield result
            if held is None:
                writer.add(result)
                continue
            held.append(result)
            size += _held_bytes(result)
            if memory.used + size > memory.budget:  # no room left: this file's spill goes to the disk
                writer = _Writer(path_of(scratch, index), budget(scratch))
                for kept in held:
                    writer.add(kept)
                held = None
        if held is not None:
            memory.put(index, held, size)
        else:
            writer.finish()
    finally:
        if writer is not None:
            writer.abandon()


class _Writer:
    """One spill being written: frames of :data:`CHUNK_DOCS` results, renamed into place by
    :meth:`finish`; past its budget or on a write error it stops and removes what it wrote."""

    def __init__(self, final: str, budget: int) -> None:
        self.final, self.temporary = final, f"{final}.{os.getpid()}.tmp"
        self.budget, self.written, self.chunk = budget, 0, []
        self.out: BinaryIO | None = None
        if budget:
            try:
                self.out = open(self.temporary, "wb")
            except OSError:  # a scratch folder it cannot write: the second pass reads the file again
                pass

    def add(self, result: Any) -> None:
        if self.out is None:
            return
        self.chunk.append(_encode(result))
        if len(self.chunk) >= CHUNK_DOCS:
            self._flush()
            if self.written > self.budget:
                self.abandon()

    def finish(self) -> None:
        self._flush()
        self._write(bytes(_FRAME))  # the end mark
        if self.out is not None:
            try:
                self.out.close()
            except OSError:
                self.abandon()
                return
            os.replace(self.temporary, self.final)
            self.out = None

    def abandon(self) -> None:
        if self.out is not None:
            out, self.out = self.out, None
            try:
                out.close()  # (a second close after a failed one does nothing)
            except OSError:
                pass
            os.remove(self.temporary)

    def _flush(self) -> None:
        if self.chunk and self.out is not None:
            try:
                blob = marshal.dumps(self.chunk)
            except ValueError:  # a value marshal cannot write (a reader's new field type): no spill
                self.abandon()
                return
            finally:
                self.chunk = []
            self._write(len(blob).to_bytes(_FRAME, "little"), blob)

    def _write(self, *parts: bytes) -> None:
        if self.out is None:
            return
        try:
            for part in parts:
                self.written += self.out.write(part)
        except OSError:  # the disk filled up after all: the second pass reads the file again
            self.abandon()


def take(scratch: str, index: int) -> Iterator[Any] | None:
    """File ``index``'s spilled results, in the order they were read, or None when there is no
    whole spill (none written, or one cut short: its frames do not end in the end mark at the end
    of the file). One held in this process's memory is taken from there. The spill is deleted as
    it is opened, a held one let go of: a retried bundle reads the input file again."""
    memory = _IN_MEMORY.get(scratch)
    held = memory.take(index) if memory is not None else None
    if held is not None:
        return _handed_over(held)
    path = path_of(scratch, index)
    try:
        stream = open(path, "rb")
    except FileNotFoundError:
        return None
    os.remove(path)
    if not _whole(stream):
        stream.close()
        return None
    return _frames(stream)


def _handed_over(held: list[Any]) -> Iterator[Any]:
    """``held`` in order, each result let go of as it is handed over (as a spill's frames are read)."""
    held.reverse()
    while held:
        yield held.pop()


def _whole(stream: BinaryIO) -> bool:
    """Whether the frames' lengths lead from the start to an end mark that ends the file."""
    end = os.fstat(stream.fileno()).st_size
    position = 0
    while position + _FRAME <= end:
        stream.seek(position)
        size = int.from_bytes(stream.read(_FRAME), "little")
        position += _FRAME + size
        if size == 0:
            break
    else:
        return False
    stream.seek(0)
    return position == end


def _frames(stream: BinaryIO) -> Iterator[Any]:
    with stream:
        while size := int.from_bytes(stream.read(_FRAME), "little"):
            yield from map(_decode, marshal.loads(stream.read(size)))
