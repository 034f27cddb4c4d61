"""Objects between stages through the run's scratch folder (``RunInfo.scratch``: the DirectRunner's,
on the disk every worker shares): pickled into one file per bundle there, only where each lies
moving through the runner's data plane; as the pickles themselves on other runners. Used by exact
dedup for its paragraph occurrences and the removals found in them, and by near-dup for its band
rows and for the documents waiting for its join (the write's tables go the same way as Arrow
streams, ``transforms.write.stash``)."""
from __future__ import annotations

import os
import pickle
import uuid
from typing import Any, BinaryIO, Iterable, Iterator, TypeVar, Union

import apache_beam as beam
from apache_beam.utils.windowed_value import WindowedValue

from ..readers import spill
from .counting import CountingDoFn


K = TypeVar("K")
Pickled = Union[bytes, str]
"""An object on its way to a later stage: pickled, or ``<path>@<offset>:<length>`` where its pickle lies
in a file of the run's scratch folder (:class:`ScratchPickles`)."""


class ScratchPickles:
    """Pickles written to one file of the scratch folder (``RunInfo.scratch``: the DirectRunner's, on
    the disk every worker shares), for a DoFn's bundle: :meth:`put` gives where each lies, once
    written, so that only that moves through the runner's data plane. The pickles themselves where
    there is no scratch folder (other runners), no room (the spill's
    :func:`~pipeline.readers.spill.budget`, taken when the file is made) or a write fails."""

    def __init__(self, scratch: str) -> None:
        self.scratch, self.path, self.room = scratch, "", 0
        self.out: BinaryIO | None = None

    def put(self, blobs: list[bytes]) -> list[Pickled]:
        size = sum(map(len, blobs))
        if blobs and self.scratch and not self.path:  # the file, on the first call with something to put
            self.path, self.room = os.path.join(self.scratch, f"{uuid.uuid4().hex}.pickles"), spill.budget(self.scratch)
            if self.room:
                try:
                    self.out = open(self.path, "wb")
                except OSError:
                    pass
        if self.out is None or size > self.room:
            return list(blobs)
        try:
            start = self.out.tell()
            self.out.write(b"".join(blobs))
            self.out.flush()
        except OSError:  # the disk filled up after all: these and the rest as bytes
            self.close()
            return list(blobs)
        self.room -= size
        refs: list[Pickled] = []
        for blob in blobs:
            refs.append(f"{self.path}@{start}:{len(blob)}")
            start += len(blob)
        return refs

    def close(self) -> None:
        out, self.out = self.out, None
        if out is not None:
            try:
                out.close()
            except OSError:  # nothing is left unflushed: every put flushed
                pass


class PicklingDoFn(beam.DoFn):
    """A DoFn whose outputs hold :data:`Pickled` objects, written by a :class:`ScratchPickles` of
    its bundle into the scratch folder ``self.scratch`` (set by the subclass; empty: the pickles
    themselves). Cooperative: a counting subclass's ``finish_bundle`` still yields its counts."""

    scratch: str

    def start_bundle(self) -> Any:
        self.pickles = ScratchPickles(self.scratch)
        return super().start_bundle()

    def finish_bundle(self) -> Any:
        self.pickles.close()
        return super().finish_bundle()

    def teardown(self) -> None:  # after a bundle that failed
        if hasattr(self, "pickles"):
            self.pickles.close()
        super().teardown()

    def put(self, keyed: list[tuple[K, bytes]]) -> Iterable[tuple[K, Pickled]]:
        """``(key, pickle)`` pairs as ``(key, Pickled)``, written in one go."""
        return zip([key for key, _ in keyed], self.pickles.put([blob for _, blob in keyed]))


class Unpickler:
    """Objects back from their :data:`Pickled`, each scratch file opened once (until :meth:`close`,
    or until :data:`OPEN_FILES` are open); its open files are not copied with it."""

    OPEN_FILES = 64

    def __init__(self) -> None:
        self.files: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"files": {}}

    def load(self, ref: Pickled) -> Any:
        if isinstance(ref, bytes):
            return pickle.loads(ref)
        path, _, span = ref.rpartition("@")
        start, length = (int(n) for n in span.split(":"))
        if path not in self.files:
            if len(self.files) >= self.OPEN_FILES:
                self.close()
            self.files[path] = os.open(path, os.O_RDONLY)
        return pickle.loads(os.pread(self.files[path], length, start))

    def close(self) -> None:
        for fd in self.files.values():
            os.close(fd)
        self.files.clear()


class UnpicklingDoFn(CountingDoFn):
    """A counting DoFn whose inputs hold :data:`Pickled` objects (``self.unpickler.load``); the
    scratch files it opened are closed at the end of each bundle."""

    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.unpickler = Unpickler()

    def finish_bundle(self) -> Iterator[WindowedValue]:
        self.unpickler.close()
        yield from super().finish_bundle()

    def teardown(self) -> None:
        self.unpickler.close()
        super().teardown()
