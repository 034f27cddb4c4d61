"""The Beam graph: read -> exact paragraph dedup -> language ID -> sharded Arrow + stats.

The DoFns are thin: the logic lives in the step modules (``warc``, ``dedup``, ``lid``,
``sinks``, ``stats``); here they are wired together, models are loaded in ``setup()`` and drop
reasons become ``Metrics.counter(step, reason)``.
"""
from __future__ import annotations

import sys
from collections import Counter
from typing import Any, Callable, Iterable, Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics

from . import dedup, fs, sinks, stats
from .config import CorpusConfig, DedupConfig, LidConfig, PerplexityConfig, ReadConfig, SamplingConfig
from .documents import Document, Drop, Rejected
from .lid import LanguageIdentifier
from .perplexity import PerplexityScorer
from .warc import RecordReader

REJECTED = "rejected"
REJECTED_SHARDS = 16
ARTIFACTS = ("stats.json", "sampling.json")


def detect_format(path: str, configured: str) -> str:
    """``wet`` for ``*.wet`` / ``*.wet.gz`` files under ``auto``, otherwise ``warc``."""
    if configured != "auto":
        return configured
    name = path.rsplit("/", 1)[-1].lower().removesuffix(".gz")
    return "wet" if name.endswith(".wet") else "warc"


class _Counted(beam.DoFn):
    """A DoFn with cached Beam counters in one namespace (the step's name)."""

    def __init__(self, step: str) -> None:
        self.step = step
        self._counters: dict[str, Any] = {}

    def count(self, name: str, n: int = 1) -> None:
        if name not in self._counters:
            self._counters[name] = Metrics.counter(self.step, name)
        self._counters[name].inc(n)


class ReadFiles(_Counted):
    """(index, path) -> documents; rejected records to the ``rejected`` output."""

    def __init__(self, cfg: ReadConfig, n_files: int, progress: bool) -> None:
        super().__init__("read")
        self.cfg, self.n_files, self.progress = cfg, n_files, progress

    def process(self, item: tuple[int, str]) -> Iterator[Any]:
        index, path = item
        tally: Counter[str] = Counter()
        reader = RecordReader(path, detect_format(path, self.cfg.format), self.cfg.verify_digests)
        try:
            with fs.open_read(path) as stream:
                for result in reader.read(stream):
                    if isinstance(result, Rejected):
                        tally["rejected"] += 1
                        self.count(f"rejected_{result.reason}")
                        yield beam.pvalue.TaggedOutput(REJECTED, result)
                    elif isinstance(result, Drop):
                        tally["skipped"] += 1
                        self.count(result.reason)
                    else:
                        tally["documents"] += 1
                        self.count("documents")
                        yield result
        except OSError as exc:  # the file vanished or cannot be read: the rest of the job goes on
            self.count("rejected_unreadable_file")
            yield beam.pvalue.TaggedOutput(REJECTED, Rejected(path, 0, "unreadable_file", str(exc)))
        self.count("files")
        if self.progress:
            print(f"[read {index + 1}/{self.n_files}] {path}: {tally['documents']} documents, "
                  f"{tally['rejected']} rejected, {tally['skipped']} skipped", file=sys.stderr, flush=True)


class ApplyDedup(_Counted):
    """(id, {doc: [...], removed: [...]}) -> the document without its duplicate paragraphs."""

    def __init__(self, min_length: int) -> None:
        super().__init__("dedup")
        self.min_length = min_length

    def process(self, item: tuple[str, dict[str, Iterable[Any]]]) -> Iterator[Any]:
        _, grouped = item
        docs = sorted(grouped["doc"], key=lambda d: (d["source"], d["text"]))
        removed = set(grouped["removed"])
        for extra in docs[1:]:
            self.count("rejected_duplicate_record_id")
            yield beam.pvalue.TaggedOutput(REJECTED, Rejected(
                extra["source"], -1, "duplicate_record_id", f"record id also read from {docs[0]['source']}", extra["id"]))
        if not docs:
            return
        self.count("documents_in")
        self.count("paragraphs_removed", len(removed))
        result = dedup.remove_paragraphs(docs[0], removed, self.min_length)
        if isinstance(result, Drop):
            self.count(result.reason)
            return
        self.count("documents_out")
        yield result


class ExactDedup(beam.PTransform):
    """Global paragraph dedup by keyed aggregation: group occurrences by hash, rejoin by id."""

    def __init__(self, cfg: DedupConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def expand(self, docs: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        policy = self.cfg.policy
        removed = (
            docs
            | "Occurrences" >> beam.FlatMap(dedup.occurrences)
            | "GroupByHash" >> beam.GroupByKey()
            | "Duplicates" >> beam.FlatMap(lambda kv: dedup.duplicates(kv[1], policy))
        )
        keyed = docs | "KeyById" >> beam.Map(lambda d: (dedup.doc_key(d), d))
        return (
            {"doc": keyed, "removed": removed}
            | "JoinById" >> beam.CoGroupByKey()
            | "Apply" >> beam.ParDo(ApplyDedup(self.cfg.min_length)).with_outputs(REJECTED, main="docs")
        )


class StepFn(_Counted):
    """Runs a document step built in ``setup()`` (where models load); drops become counters."""

    def __init__(self, step: str, factory: Callable[[], Callable[[Document], Any]]) -> None:
        super().__init__(step)
        self.factory = factory
        self.fn: Callable[[Document], Any] | None = None

    def setup(self) -> None:
        self.fn = self.factory()

    def process(self, doc: Document) -> Iterator[Document]:
        assert self.fn is not None
        result = self.fn(doc)
        events = getattr(self.fn, "events", None)
        while events:
            self.count(events.pop())
        if isinstance(result, Drop):
            self.count(result.reason)
            return
        self.count("documents_out")
        yield result


def language_identifier(cfg: LidConfig) -> Callable[[], LanguageIdentifier]:
    def build() -> LanguageIdentifier:
        lid = LanguageIdentifier(cfg.model, cfg.threshold, cfg.thresholds, cfg.below_threshold)
        lid.model  # load once per worker, here rather than on the first document
        return lid
    return build


def perplexity_scorer(cfg: PerplexityConfig, languages: list[str],
                      cutoffs: dict[str, list[float]] | None) -> Callable[[], PerplexityScorer]:
    def build() -> PerplexityScorer:
        assert cfg.models is not None
        return PerplexityScorer(cfg.models, languages, cfg.mode, cutoffs, cfg.head, cfg.tail,
                                cfg.drop_buckets, cfg.max_perplexity)
    return build


def without_perplexity(doc: Document) -> Document:
    """No LM configured: every document goes to bucket ``all``."""
    return {**doc, "perplexity": None, "bucket": "all"}


class WriteShard(_Counted):
    def __init__(self, output: str, fmt: str) -> None:
        super().__init__("write")
        self.output, self.fmt = output, fmt

    def process(self, item: tuple[tuple[str, str, int], Iterable[Document]]) -> Iterator[str]:
        (lang, bucket, shard), docs = item
        table = sinks.to_table(docs)
        path = sinks.shard_path(self.output, lang, bucket, shard, self.fmt)
        sinks.write_table(table, path, self.fmt)
        self.count("shards")
        self.count("documents", table.num_rows)
        yield path


class WriteCorpus(beam.PTransform):
    """Documents -> ``lang=<l>/bucket=<b>/part-NNNNN`` shards; returns the written paths."""

    def __init__(self, output: str, fmt: str, shard_size_mb: float) -> None:
        super().__init__()
        self.output, self.fmt, self.target = output, fmt, int(shard_size_mb * 2**20)

    def expand(self, docs: beam.PCollection) -> beam.PCollection:
        sizes = (
            docs
            | "PartitionBytes" >> beam.Map(lambda d: ((d["lang"], d["bucket"]), len(d["text"].encode("utf-8"))))
            | "SumBytes" >> beam.CombinePerKey(sum)
        )
        target = self.target

        def assign(doc: Document, totals: dict[tuple[str, str], int]) -> tuple[tuple[str, str, int], Document]:
            part = (doc["lang"], doc["bucket"])
            return (*part, sinks.shard_of(doc, sinks.shard_count(totals[part], target))), doc

        return (
            docs
            | "AssignShard" >> beam.Map(assign, totals=beam.pvalue.AsDict(sizes))
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(WriteShard(self.output, self.fmt))
        )


class WriteRejected(beam.PTransform):
    def __init__(self, output: str) -> None:
        super().__init__()
        self.output = output

    def expand(self, rejected: beam.PCollection) -> beam.PCollection:
        output = self.output

        def write(item: tuple[int, Iterable[Rejected]]) -> str:
            path = fs.join(output, REJECTED, f"part-{item[0]:05d}.jsonl")
            sinks.write_rejected(item[1], path)
            return path

        return (
            rejected
            | "KeyBySource" >> beam.Map(lambda r: (sinks.stable_hash(r.source) % REJECTED_SHARDS, r))
            | "Group" >> beam.GroupByKey()
            | "Write" >> beam.Map(write)
        )


QUANTILES = 11  # perplexity deciles per language in stats.json


def partition_totals(doc: Document) -> tuple[tuple[str, str], tuple[int, int]]:
    return (doc["lang"], doc["bucket"]), (1, len(doc["text"]))


def sum_pairs(values: Iterable[tuple[int, int]]) -> tuple[int, int]:
    documents = characters = 0
    for d, c in values:
        documents, characters = documents + d, characters + c
    return documents, characters


def corpus_summary(totals: dict[tuple[str, str], tuple[int, int]],
                   quantiles: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per language: documents, characters, the same per bucket, and perplexity deciles."""
    summary: dict[str, dict[str, Any]] = {}
    for (lang, bucket), (documents, characters) in sorted(totals.items()):
        entry = summary.setdefault(lang, {"documents": 0, "characters": 0, "buckets": {}})
        entry["documents"] += documents
        entry["characters"] += characters
        entry["buckets"][bucket] = {"documents": documents, "characters": characters}
    for lang, values in quantiles.items():
        summary[lang]["perplexity_deciles"] = [round(v, 1) for v in values]
    return summary


def write_sampling(totals: dict[tuple[str, str], tuple[int, int]], quantiles: dict[str, list[float]],
                   output: str, cfg: SamplingConfig) -> None:
    """``sampling.json``: weights over the configured buckets, and the corpus summary stats.json reuses."""
    summary = corpus_summary(totals, quantiles)
    counted: dict[str, dict[str, int]] = {}
    for (lang, bucket), (documents, characters) in totals.items():
        if not cfg.buckets or bucket in cfg.buckets:
            entry = counted.setdefault(lang, {"documents": 0, "characters": 0})
            entry["documents"] += documents
            entry["characters"] += characters
    report = stats.sampling_report(counted, cfg.alpha, cfg.unit)
    report["buckets"] = cfg.buckets or "all"
    report["corpus"] = summary
    sinks.write_json(report, fs.join(output, "sampling.json"))


def build_pipeline(p: beam.Pipeline, cfg: CorpusConfig, files: list[str], languages: list[str],
                   cutoffs: dict[str, list[float]] | None) -> None:
    """Add the whole corpus graph for ``files`` to pipeline ``p``.

    ``languages`` are the ones with a perplexity model (checked by the driver), ``cutoffs`` the
    parsed cutoff file (or None).
    """
    read = (
        p
        | "Files" >> beam.Create(list(enumerate(files)))
        | "Distribute" >> beam.Reshuffle()
        | "Read" >> beam.ParDo(ReadFiles(cfg.read, len(files), cfg.progress)).with_outputs(REJECTED, main="docs")
    )
    docs, rejected = read.docs, [read[REJECTED]]
    if cfg.dedup.enabled:
        deduped = docs | "ExactDedup" >> ExactDedup(cfg.dedup)
        docs = deduped.docs
        rejected.append(deduped[REJECTED])
    docs = docs | "LanguageID" >> beam.ParDo(StepFn("lid", language_identifier(cfg.lid)))
    if cfg.perplexity.models:
        docs = docs | "Perplexity" >> beam.ParDo(StepFn("perplexity", perplexity_scorer(cfg.perplexity, languages, cutoffs)))
    else:
        docs = docs | "Bucket" >> beam.Map(without_perplexity)
    _ = docs | "WriteCorpus" >> WriteCorpus(cfg.output, cfg.write.format, cfg.write.shard_size_mb)
    _ = tuple(rejected) | "AllRejected" >> beam.Flatten() | "WriteRejected" >> WriteRejected(cfg.output)
    quantiles = (
        docs
        | "ScoredOnly" >> beam.Filter(lambda d: d["perplexity"] is not None)
        | "LangPerplexity" >> beam.Map(lambda d: (d["lang"], d["perplexity"]))
        | "Deciles" >> beam.transforms.stats.ApproximateQuantiles.PerKey(QUANTILES)
        | "DecilesAsDict" >> beam.combiners.ToDict()
    )
    _ = (
        docs
        | "PartitionTotals" >> beam.Map(partition_totals)
        | "SumPartitions" >> beam.CombinePerKey(sum_pairs)
        | "TotalsAsDict" >> beam.combiners.ToDict()
        | "WriteSampling" >> beam.Map(write_sampling, beam.pvalue.AsSingleton(quantiles), cfg.output, cfg.sampling)
    )
