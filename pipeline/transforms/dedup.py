"""The ``dedup`` step in Beam, and the read every run starts with: CCNet's two passes over the
input files (hash every paragraph, group the hashes by partition, then read each file again
without its duplicate paragraphs). The maths is ``pipeline.steps.dedup``."""
from __future__ import annotations

import pickle
import sys
from collections import Counter
from typing import Any, Iterable, Iterator

import apache_beam as beam

from ..config import ReadConfig
from ..output.layout import REJECTED
from ..readers import spill
from ..readers.files import read_ahead, read_file
from ..steps import dedup
from ..steps.base import Drop, Note, Rejected, RunInfo
from ..steps.dedup import DedupConfig, ParagraphDedup
from .apply import REMOVED, removed_record
from .counting import Counted
from .placement import by_file
from .scratch import Pickled, PicklingDoFn, UnpicklingDoFn


class HashFile(PicklingDoFn):
    """Dedup pass 1: (file index, path) -> ((group, partition), :data:`Pickled` (file index, paragraph
    occurrences)). With a scratch folder, what it read is spilled there for pass 2
    (``readers.spill``), and the occurrences wait there for :class:`FindDuplicates`: only where
    each table lies moves through the runner (its 1.3 M occurrences took 0.14-0.18 s of the
    driver's CPU in a 2-worker run of the 50 MB benchmark, between the stages)."""

    def __init__(self, cfg: ReadConfig, partitions: int, group_files: float, scratch: str) -> None:
        self.cfg, self.partitions, self.group_files, self.scratch = cfg, partitions, group_files, scratch

    def process(self, item: tuple[int, str]) -> Iterator[tuple[tuple[int, int], Pickled]]:
        index, path = item
        group = dedup.group_of(index, self.group_files)
        results = read_file(path, self.cfg)
        if self.scratch:
            results = spill.keeping(self.scratch, index, results)
        docs = (r for r in read_ahead(results) if isinstance(r, dict))
        yield from self.put([((group, part), pickle.dumps((index, table), pickle.HIGHEST_PROTOCOL))
                             for part, table in dedup.Occurrences.of(docs).partitions(self.partitions)])


class FindDuplicates(PicklingDoFn, UnpicklingDoFn):
    """A partition's :class:`HashFile` tables -> ``(file index, Pickled (document ordinals, lines))``
    to remove (``dedup.duplicates``); it counts nothing. With a scratch folder the removals wait
    there for :class:`ReadFiles`, as the occurrences did for this stage: the benchmark's 727,657
    removals (6 MB) otherwise crossed the runner's data plane three times, through the driver."""

    def __init__(self, policy: str, scratch: str) -> None:
        super().__init__(ParagraphDedup.name)
        self.policy, self.scratch = policy, scratch

    def process(self, item: tuple[tuple[int, int], Iterable[Pickled]]) -> Iterator[tuple[int, Pickled]]:
        found = dedup.duplicates([self.unpickler.load(ref) for ref in item[1]], self.policy)
        yield from self.put([(index, pickle.dumps(removed, pickle.HIGHEST_PROTOCOL))
                             for index, removed in found.items()])


class ReadFiles(UnpicklingDoFn):
    """Dedup pass 2 (or the only read): documents without their duplicate paragraphs.

    Takes ``(file index, {"path": [path], "duplicates": [Pickled (ordinals, lines), ...]})``; rejected
    records go to the ``rejected`` output. What pass 1 spilled for the file, where it did, is
    taken instead of reading the file again.
    """

    def __init__(self, cfg: ReadConfig, dedup_cfg: DedupConfig | None, run: RunInfo) -> None:
        super().__init__("read")
        self.cfg, self.dedup, self.run = cfg, dedup_cfg, run

    def process(self, item: tuple[int, dict[str, Iterable[Any]]]) -> Iterator[Any]:
        index, grouped = item
        [path] = grouped["path"]
        removed = dedup.removal_index(map(self.unpickler.load, grouped["duplicates"]))
        read: Counter[str] = Counter()  # counted once per file: the read step sees every record
        deduped: Counter[str] = Counter()
        spilled = spill.take(self.run.scratch, index) if self.run.scratch else None
        for result in read_file(path, self.cfg) if spilled is None else spilled:
            if isinstance(result, Rejected):
                read[f"rejected_{result.reason}"] += 1
                yield beam.pvalue.TaggedOutput(REJECTED, result)
                continue
            if isinstance(result, (Drop, Note)):  # a note: counted, its record is kept
                read[result.reason] += 1
                continue
            lines = removed.get(read["documents"], ())
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
        if self.run.progress:
            rejected = sum(n for name, n in read.items() if name.startswith("rejected_"))
            skipped = sum(read.values()) - read["documents"] - rejected  # the drops: warcinfo and the like
            print(f"[read {index + 1}/{self.run.n_files}] {path}: {read['documents']} documents, "
                  f"{rejected} rejected, {skipped} skipped", file=sys.stderr, flush=True)
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
            policy = cfg.policy
            partitions = cfg.partitions or dedup.auto_partitions(n_files)
            duplicates = (
                files
                | "HashParagraphs" >> beam.ParDo(HashFile(self.read_cfg, partitions, cfg.group_files,
                                                         self.run.scratch))
                | "GroupByPartition" >> beam.GroupByKey()
                | "FindDuplicates" >> Counted(FindDuplicates(policy, self.run.scratch), main_type=tuple[int, Any])
            )
        else:
            duplicates = files | "NoRemovals" >> beam.FlatMap(lambda _: ()).with_output_types(tuple[int, Any])
        with by_file(files.pipeline):  # file i's read on the worker that hashed it (its results kept there)
            joined = {"path": files, "duplicates": duplicates} | "JoinByFile" >> beam.CoGroupByKey()
        return joined | "Read" >> Counted(ReadFiles(self.read_cfg, cfg, self.run), outputs=(REJECTED, REMOVED))
