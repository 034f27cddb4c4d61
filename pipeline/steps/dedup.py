"""The ``dedup`` step: exact paragraph dedup, CCNet style: a hash pass over the files, then a dedup pass.

As in CCNet, every file is read twice (on the DirectRunner the second read loads what the first
spilled to this machine's disk, ``readers.spill``). The hash pass turns each file into a table of paragraph
occurrences ``(hash, document ordinal, line)``; the hash space is cut into partitions, and the
Beam stage groups every file's slice of a partition under one key, so each partition's
duplicates are found with a sort over that partition only (keyed aggregation: no global set,
no per-paragraph Beam elements). The dedup pass reads each file again with the list of
occurrences to remove. Policies:

* ``drop_all`` (CCNet's mine): every copy of a paragraph found in two or more documents is removed.
* ``keep_first``: the first occurrence in (input path order, position in file, line) stays.

Under both, a paragraph repeated inside one document only keeps its first copy (as CCNet's
``finalize_doc`` does). With ``group_files`` the input files are cut into runs of that many
consecutive files by their place in the input, each deduplicated on its own (CCNet's
``hash_in_mem`` groups of shards); a run over fewer files is one group.
Documents left shorter than ``min_length`` characters are dropped.

The Beam side (the two passes) is ``pipeline.transforms.dedup``; this module is Beam-free.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from .base import Document, Drop, Step, StepResult
from .normalize import paragraph_hashes

POLICIES = ("drop_all", "keep_first")


def auto_partitions(n_files: int) -> int:
    """Shuffle partitions of a stage that groups by hash (exact dedup's paragraphs, near-dup's band
    hashes) when none are configured: min(4096, max(8, input files))."""
    return min(4096, max(8, n_files))


@dataclasses.dataclass
class DedupConfig:
    policy: str = "drop_all"
    """drop_all (CCNet: every copy of a paragraph found in two or more documents goes) or keep_first (the first copy in input order stays). Either way a paragraph repeated inside one document keeps its first copy only."""
    min_length: int = 300
    """Documents with fewer characters left after dedup are dropped."""
    group_files: float = 0
    """Consecutive input files (by place in the input, path order) deduplicated together, each group on its own; 0: all files, one group. CCNet's groups (50 of its 1600 shards) are a dump's files / 32: 2000 for 64,000 files; a fraction places the boundaries as CCNet's (2812.5 for 90,000)."""
    partitions: int = 0
    """Hash partitions grouped separately (memory per group ~ 1/partitions of all paragraphs). 0: auto, min(4096, max(8, input files))."""

    choices = {"policy": POLICIES}
    ranges = {"min_length": (0, None), "partitions": (0, 1 << 20), "group_files": (0, None)}


class ParagraphDedup(Step):
    """Global step on the input files: removes paragraphs seen in other documents (two passes)."""

    name = "dedup"
    Config = DedupConfig
    counters = ("documents_in", "documents_out", "paragraphs_removed", "all_paragraphs_duplicated", "too_short")
    transform = "pipeline.transforms.dedup:ReadAndDedup"
    reads_files = True


class Occurrences(NamedTuple):
    """Paragraph occurrences of one file (or one partition of it), as parallel arrays."""

    hashes: np.ndarray  # uint64
    docs: np.ndarray    # uint32: ordinal of the document among the file's documents
    lines: np.ndarray   # uint32: line number inside the document

    @classmethod
    def of(cls, docs: Iterable[Document]) -> "Occurrences":
        """Of documents as the reader gives them (every line stripped)."""
        packed = [paragraph_hashes(doc["text"], stripped=True) for doc in docs]
        counts = np.array([len(p) // 8 for p in packed], dtype=np.int64)
        starts = np.cumsum(counts) - counts
        ordinals = np.repeat(np.arange(len(counts), dtype=np.uint32), counts)
        lines = (np.arange(counts.sum()) - np.repeat(starts, counts)).astype(np.uint32)
        return cls(np.frombuffer(b"".join(packed), dtype="<u8").astype(np.uint64), ordinals, lines)

    def partitions(self, n: int) -> Iterator[tuple[int, "Occurrences"]]:
        """Split by ``hash % n``; empty partitions are left out."""
        part = (self.hashes % np.uint64(n)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(n + 1))
        for p in range(n):
            idx = order[bounds[p]:bounds[p + 1]]
            if len(idx):
                yield p, Occurrences(self.hashes[idx], self.docs[idx], self.lines[idx])


def duplicates(tables: Iterable[tuple[int, Occurrences]], policy: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The occurrences to remove, per file index: ``{file: (document ordinals, lines)}``.

    ``tables`` holds ``(file index, occurrences)`` for one hash partition of every file. The rows
    are put in position order (file, document, line), which a file's table from
    :meth:`Occurrences.of` and :meth:`Occurrences.partitions` already is, so one stable sort by
    hash orders them by (hash, position): the first of each hash is its keeper. A four-key
    ``np.lexsort`` did the same in 3-4 times the time.
    """
    by_file: dict[int, list[Occurrences]] = {}
    for f, t in tables:
        if len(t.hashes):
            by_file.setdefault(f, []).append(t)
    if not by_file:
        return {}
    files, hashes, docs, lines = [], [], [], []
    for f in sorted(by_file):
        parts = by_file[f]
        h, d, line = (np.concatenate([getattr(t, name) for t in parts]) for name in Occurrences._fields)
        position = d.astype(np.uint64) << np.uint64(32) | line.astype(np.uint64)
        if (position[1:] < position[:-1]).any():
            order = np.argsort(position, kind="stable")
            h, d, line = h[order], d[order], line[order]
        files.append(np.full(len(h), f, dtype=np.uint32))
        hashes.append(h), docs.append(d), lines.append(line)
    hashes, files, docs, lines = (np.concatenate(a) for a in (hashes, files, docs, lines))
    order = np.argsort(hashes, kind="stable")  # by hash, then position
    h, f, d = hashes[order], files[order], docs[order]
    new_hash = np.r_[True, h[1:] != h[:-1]]
    new_doc = new_hash | np.r_[True, (f[1:] != f[:-1]) | (d[1:] != d[:-1])]  # a hash's first copy in a document
    if policy == "keep_first":
        repeated = ~new_hash
    else:
        hash_ids = np.cumsum(new_hash) - 1
        in_documents = np.bincount(hash_ids, weights=new_doc)  # how many documents hold each hash
        repeated = (in_documents > 1)[hash_ids] | ~new_doc
    removed = order[repeated]
    result = {}
    for f in np.unique(files[removed]):
        sel = removed[files[removed] == f]
        result[int(f)] = (docs[sel], lines[sel])
    return result


def removal_index(removals: Iterable[tuple[np.ndarray, np.ndarray]]) -> dict[int, list[int]]:
    """Merge per-partition removals of one file into ``{document ordinal: [lines, ascending]}``.

    One sort of ``ordinal << 32 | line`` over all of them, each line kept once, then a slice per
    document: the bench's 727,657 removals took 0.68x the time of a set per document filled pair by
    pair (``remove_paragraphs`` included, BENCHMARKS.md). ``np.sort`` and a comparison of
    neighbours, rather than ``np.unique``: 0.03 s against 0.13 s on them."""
    keys = [docs.astype(np.uint64) << np.uint64(32) | lines.astype(np.uint64) for docs, lines in removals]
    key = np.sort(np.concatenate(keys)) if keys else np.zeros(0, np.uint64)
    if not len(key):
        return {}
    key = key[np.r_[True, key[1:] != key[:-1]]]
    ordinals = key >> np.uint64(32)
    starts = np.flatnonzero(np.r_[True, ordinals[1:] != ordinals[:-1]])
    lines = (key & np.uint64(0xFFFFFFFF)).tolist()
    ends = starts[1:].tolist() + [len(lines)]
    return {d: lines[s:e] for d, s, e in zip(ordinals[starts].tolist(), starts.tolist(), ends)}


def group_of(index: int, group_files: float) -> int:
    """The dedup group of input file ``index`` (0-based): group ``g`` holds files ``floor(g*k)`` up
    to ``floor((g+1)*k)`` for ``k = group_files``, as CCNet's group ``g`` holds the segments of its
    shards ``50g`` to ``50g+49`` when a dump of ``32k`` files is cut into 1600 shards; 0 if ``k`` is 0."""
    if not group_files:
        return 0
    return -(-(index + 1) // Fraction(group_files)) - 1  # ceil((index + 1) / k) - 1, exactly


def remove_paragraphs(doc: Document, removed: Sequence[int], min_length: int) -> StepResult:
    """The document without the given line numbers (distinct, ascending, as :func:`removal_index`
    gives them; ``line_ids``: the line numbers kept), or a drop reason if too little is left."""
    if removed:
        lines = doc["text"].split("\n")
        kept = list(range(len(lines)))
        for line in reversed(removed):  # from the end: each deletion leaves the lines before it in place
            del lines[line], kept[line]
        kept_text = "\n".join(lines)
    else:
        kept, kept_text = list(range(doc["nlines"])), doc["text"]
    if not kept or not kept_text:
        return Drop("all_paragraphs_duplicated")
    if len(kept_text) < min_length:
        return Drop("too_short")
    return {**doc, "text": kept_text, "nlines": len(kept), "length": len(kept_text), "line_ids": kept}
