"""Input files as records: the format from the file name, one file's records as documents, drops
(warcinfo and the like) and rejected records (an unreadable file is one rejected record)."""
from __future__ import annotations

import itertools
import os
from typing import Any, Iterable, Iterator, TypeVar

from ..config import ReadConfig
from ..output import fs
from ..steps.base import CHUNK_DOCS, Rejected
from .warc import RecordReader

T = TypeVar("T")


def detect_format(path: str, configured: str) -> str:
    """``wet`` for ``*.wet`` / ``*.wet.gz`` files under ``auto``, otherwise ``warc``."""
    if configured != "auto":
        return configured
    name = path.rsplit("/", 1)[-1].lower().removesuffix(".gz")
    return "wet" if name.endswith(".wet") else "warc"


def read_ahead(items: Iterable[T], n: int = CHUNK_DOCS) -> Iterator[T]:
    """``items`` in order, pulled ``n`` at a time before the first of them is passed on.

    Consumed one at a time, parsing and the step after it take turns per record and evict each
    other's working set from the CPU caches. The hash pass parses ``n`` records in a row, then
    hashes them (about 5 % less CPU); after the dedup pass, ``ApplyStep`` does the same.
    """
    it = iter(items)
    while chunk := list(itertools.islice(it, n)):
        yield from chunk


def read_file(path: str, cfg: ReadConfig) -> Iterator[Any]:
    """Every record of one file as a document, a Drop or a Rejected (an unreadable file: one Rejected)."""
    reader = RecordReader(path, detect_format(path, cfg.format), cfg.verify_digests, cfg.title, cfg.empty_lines,
                          cfg.min_length)
    try:
        with fs.open_read(path) as stream:
            yield from reader.read(stream)
    except Exception as exc:  # noqa: BLE001  vanished, unreadable, or the store's client gave up (S3/GCS
        # errors are not OSErrors): the file goes to rejected/ and the rest of the job goes on
        link = f" (a dangling symlink to {os.readlink(path)})" if fs.is_local(path) and os.path.islink(path) else ""
        yield Rejected(path, 0, "unreadable_file", f"{type(exc).__name__}: {exc}{link}")
