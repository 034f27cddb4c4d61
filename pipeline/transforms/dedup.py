"""The ``dedup`` step in Beam, and the read every run starts with: CCNet's two passes over the
input files (hash every paragraph, group the hashes by partition, then read each file again
without its duplicate paragraphs). The maths is ``pipeline.steps.dedup``.

The second pass works in slices of a file (``readers.spill.Slice``: :data:`~pipeline.readers.spill.SLICE_DOCS`
documents each, where the first pass kept what it read in the scratch folder; else the whole
file), each its own element after a shuffle, so that the pass and the steps fused after it
spread over the workers in pieces smaller than a file (``runners.balance``)."""
from __future__ import annotations

import itertools
import pickle
import sys
from collections import Counter
from typing import Any, Iterable, Iterator

import numpy as np

import apache_beam as beam

from ..config import ReadConfig
from ..output.layout import REJECTED
from ..readers import spill
from ..readers.files import read_ahead, read_file
from ..steps import dedup
from ..steps.base import Drop, Note, Rejected, RunInfo
from ..steps.dedup import DedupConfig, ParagraphDedup
from .apply import REMOVED, removed_record
from .counting import MAIN, Counted
from .scratch import Pickled, PicklingDoFn, UnpicklingDoFn

SLICES = "slices"
"""HashFile's tagged output, and the join's input by that name: ``((file index, slice), (path,
readers.spill.Slice))`` for each slice of each file."""


def progress(index: int, n_files: int, path: str, read: Counter[str]) -> None:
    """The line ``progress: true`` prints for each file read: its documents, rejected records and
    the rest (drops: warcinfo and the like)."""
    rejected = sum(n for name, n in read.items() if name.startswith("rejected_"))
    skipped = sum(read.values()) - read["documents"] - rejected
    print(f"[read {index + 1}/{n_files}] {path}: {read['documents']} documents, {rejected} rejected, "
          f"{skipped} skipped", file=sys.stderr, flush=True)


def _tally(results: Iterable[Any], read: Counter[str]) -> Iterator[Any]:
    """``results`` passed on, counted into ``read`` as :class:`ReadFiles` counts them."""
    for result in results:
        read["documents" if isinstance(result, dict) else
             f"rejected_{result.reason}" if isinstance(result, Rejected) else result.reason] += 1
        yield result


class HashFile(PicklingDoFn):
    """Dedup pass 1: (file index, path) -> ((group, partition), :data:`Pickled` (file index, the first
    document of each of its slices, paragraph occurrences)), and to :data:`SLICES` the file's slices.
    With a scratch folder, what it read is kept there for pass 2, slice by slice
    (``readers.spill``), and the occurrences wait there for :class:`FindDuplicates`: only where
    each table lies moves through the runner (its 1.3 M occurrences took 0.14-0.18 s of the
    driver's CPU in a 2-worker run of the 50 MB benchmark, between the stages)."""

    def __init__(self, cfg: ReadConfig, partitions: int, group_files: float, run: RunInfo) -> None:
        self.cfg, self.partitions, self.group_files, self.run = cfg, partitions, group_files, run
        self.scratch = run.scratch

    def process(self, item: tuple[int, str]) -> Iterator[Any]:
        index, path = item
        read: Counter[str] = Counter()
        plan = [spill.WHOLE_FILE]
        results = read_file(path, self.cfg)
        if self.run.progress:
            results = _tally(results, read)
        if self.scratch:
            results = spill.keeping(self.scratch, index, results, plan)
        table = dedup.Occurrences.of(r for r in read_ahead(results) if isinstance(r, dict))
        group, first_docs = dedup.group_of(index, self.group_files), [piece.first_doc for piece in plan]
        yield from self.put([((group, part), pickle.dumps((index, first_docs, rows), pickle.HIGHEST_PROTOCOL))
                             for part, rows in table.partitions(self.partitions)])
        for part, piece in enumerate(plan):
            yield beam.pvalue.TaggedOutput(SLICES, ((index, part), (path, piece)))
        if self.run.progress:
            progress(index, self.run.n_files, path, read)


class FindDuplicates(PicklingDoFn, UnpicklingDoFn):
    """A partition's :class:`HashFile` tables -> ``((file index, slice), Pickled removal keys)``: the
    paragraphs to remove (``dedup.duplicates``) of each slice of a file, as ``ordinal << 32 | line``
    keys; it counts nothing. With a scratch folder the removals wait there for :class:`ReadFiles`,
    as the occurrences did for this stage: the benchmark's 727,657 removals (6 MB) otherwise
    crossed the runner's data plane three times, through the driver."""

    def __init__(self, policy: str, scratch: str) -> None:
        super().__init__(ParagraphDedup.name)
        self.policy, self.scratch = policy, scratch

    def process(self, item: tuple[tuple[int, int], Iterable[Pickled]]) -> Iterator[tuple[tuple[int, int], Pickled]]:
        tables = [self.unpickler.load(ref) for ref in item[1]]
        first_docs = {index: firsts for index, firsts, _ in tables}
        found = dedup.duplicates([(index, rows) for index, _, rows in tables], self.policy)
        yield from self.put([((index, part), pickle.dumps(keys, pickle.HIGHEST_PROTOCOL))
                             for index, removed in found.items()
                             for part, keys in enumerate(dedup.cut_at_documents(dedup.removal_keys([removed]),
                                                                                first_docs[index]))
                             if len(keys)])


def whole_file(item: tuple[int, str]) -> tuple[tuple[int, int], dict[str, list[Any]]]:
    """A file read without dedup: one slice, the whole file, no removals."""
    index, path = item
    return (index, 0), {SLICES: [(path, spill.WHOLE_FILE)], "duplicates": []}


class ReadFiles(UnpicklingDoFn):
    """Dedup pass 2 (or the only read): documents without their duplicate paragraphs.

    Takes ``((file index, slice), {SLICES: [(path, Slice)], "duplicates": [Pickled removal keys,
    ...]})``; rejected records go to the ``rejected`` output. The slice's spill, where pass 1 kept
    one, is taken instead of reading the file again.
    """

    def __init__(self, cfg: ReadConfig, dedup_cfg: DedupConfig | None, run: RunInfo) -> None:
        super().__init__("read")
        self.cfg, self.dedup, self.run = cfg, dedup_cfg, run

    def process(self, item: tuple[tuple[int, int], dict[str, Iterable[Any]]]) -> Iterator[Any]:
        (index, part), grouped = item
        [(path, piece)] = grouped[SLICES]
        runs = [self.unpickler.load(ref) for ref in grouped["duplicates"]]  # (hash partitions: disjoint)
        removed = dedup.removal_index(np.sort(np.concatenate(runs)) if runs else np.zeros(0, np.uint64))
        read: Counter[str] = Counter()  # counted once per slice: the read step sees every record
        deduped: Counter[str] = Counter()
        spilled = spill.take(self.run.scratch, index, part) if piece.kept and self.run.scratch else None
        if spilled is None:  # not kept, or taken by an earlier try of this bundle: from the file
            stop = None if piece.count is None else piece.start + piece.count
            spilled = itertools.islice(read_file(path, self.cfg), piece.start, stop)
        ordinal = piece.first_doc
        for result in spilled:
            if isinstance(result, Rejected):
                read[f"rejected_{result.reason}"] += 1
                yield beam.pvalue.TaggedOutput(REJECTED, result)
                continue
            if isinstance(result, (Drop, Note)):  # a note: counted, its record is kept
                read[result.reason] += 1
                continue
            lines = removed.get(ordinal, ())
            ordinal += 1
            read["documents"] += 1
            if self.dedup is not None:
                deduped["paragraphs_removed"] += len(lines)
                kept = dedup.remove_paragraphs(result, lines, self.dedup.min_length)
                if isinstance(kept, Drop):
                    deduped[kept.reason] += 1
                    if self.run.write_removed:
                        yield beam.pvalue.TaggedOutput(REMOVED, removed_record(result, kept.reason))
                    continue
                deduped["documents_out"] += 1
                result = kept
            yield result
        if self.run.progress and self.dedup is None:  # (with dedup, pass 1 said it)
            progress(index, self.run.n_files, path, read)
        if part == 0:
            read["files"] += 1
        if self.dedup is not None:
            deduped["documents_in"] = read["documents"]
        for step, counts in (("read", read), (ParagraphDedup.name, deduped)):
            for name, n in counts.items():
                self.count(name, n, step=step)


class ReadAndDedup(beam.PTransform):
    """Files -> documents (``main``), ``rejected`` records and ``removed`` documents, with global
    exact paragraph dedup when the ``dedup`` step is given (two passes, CCNet style). Without it,
    this is the plain read every run starts with."""

    def __init__(self, step: ParagraphDedup | None, read_cfg: ReadConfig, run: RunInfo) -> None:
        super().__init__()
        self.read_cfg, self.run = read_cfg, run
        self.dedup_cfg = step.cfg if step is not None else None

    def expand(self, files: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        cfg, n_files = self.dedup_cfg, self.run.n_files
        if cfg is not None:
            partitions = cfg.partitions or dedup.auto_partitions(n_files)
            hashed = files | "HashParagraphs" >> beam.ParDo(
                HashFile(self.read_cfg, partitions, cfg.group_files, self.run)).with_outputs(SLICES, main=MAIN)
            duplicates = (
                hashed[MAIN]
                | "GroupByPartition" >> beam.GroupByKey()
                | "FindDuplicates" >> Counted(FindDuplicates(cfg.policy, self.run.scratch))
            )
            work = {SLICES: hashed[SLICES], "duplicates": duplicates} | "JoinBySlice" >> beam.CoGroupByKey()
        else:
            work = files | "WholeFiles" >> beam.Map(whole_file)
        return work | "Read" >> Counted(ReadFiles(self.read_cfg, cfg, self.run), outputs=(REJECTED, REMOVED))
