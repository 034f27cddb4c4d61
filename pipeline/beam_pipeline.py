"""The Beam graph: read -> exact paragraph dedup -> language ID -> near-dup -> perplexity ->
sharded Arrow + stats.

The DoFns are thin: the logic lives in the step modules (``warc``, ``dedup``, ``lid``,
``neardup``, ``perplexity``, ``sinks``, ``stats``); here they are wired together, models are loaded in
``setup()`` and drop reasons become counts that travel as data into stats.json (``counting``).
The graph needs only what every runner has: ParDo, GroupByKey, Flatten, side inputs, and
combines whose inputs are small (no runner has to lift a combine to keep a stage in memory).
"""
from __future__ import annotations

import itertools
import math
import os
import sys
from collections import Counter
from typing import Any, Callable, Iterable, Iterator, TypeVar

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows

from . import dedup, fs, neardup, sinks, stats
from .config import CorpusConfig, DedupConfig, LidConfig, PerplexityConfig, ReadConfig, WriteConfig
from .counting import MAIN, Counted, CountingDoFn, Counts, total_counts
from .documents import Document, Drop, Note, Rejected
from .lid import LanguageIdentifier
from .neardup import NearDedup
from .perplexity import PerplexityScorer
from .warc import RecordReader

REJECTED = "rejected"
NEAR_DUPLICATES = "near_duplicates"
RECORD_SHARDS = 16
ARTIFACTS = ("stats.json", "sampling.json")
RUN_FILE = "run.json"  # runner, elapsed time: what differs between runs of the same input and config
REPORT = "report"  # the corpus report (pipeline/report.py)
NOT_SHARDS = [".", "_", REJECTED, NEAR_DUPLICATES, REPORT, *ARTIFACTS, RUN_FILE]
"""Name prefixes of a corpus folder's entries that are not shards: ``ignore_prefixes`` for
``pyarrow.dataset.dataset(folder, format="ipc", partitioning="hive", ignore_prefixes=NOT_SHARDS)``."""
CONFIG_SECTIONS = ("read", "dedup", "lid", "near_dedup", "perplexity", "write", "sampling")
CHUNK_DOCS = 256  # records or documents one step handles in a row (see read_ahead, StepFn)
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
    hashes them (about 5 % less CPU); after the dedup pass, :class:`StepFn` does the same.
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


class HashFile(beam.DoFn):
    """Dedup pass 1: (file index, path) -> ((group, partition), (file index, paragraph occurrences))."""

    def __init__(self, cfg: ReadConfig, partitions: int, n_files: int, groups: int) -> None:
        self.cfg, self.partitions, self.n_files, self.groups = cfg, partitions, n_files, groups

    def process(self, item: tuple[int, str]) -> Iterator[tuple[tuple[int, int], tuple[int, dedup.Occurrences]]]:
        index, path = item
        group = dedup.group_of(index, self.n_files, self.groups)
        docs = (r for r in read_ahead(read_file(path, self.cfg)) if isinstance(r, dict))
        for part, table in dedup.Occurrences.of(docs).partitions(self.partitions):
            yield (group, part), (index, table)


class ReadFiles(CountingDoFn):
    """Dedup pass 2 (or the only read): documents without their duplicate paragraphs.

    Takes ``(file index, {"path": [path], "removed": [(ordinals, lines), ...]})``; rejected
    records go to the ``rejected`` output.
    """

    def __init__(self, cfg: ReadConfig, dedup_cfg: DedupConfig, n_files: int, progress: bool) -> None:
        super().__init__("read")
        self.cfg, self.dedup, self.n_files, self.progress = cfg, dedup_cfg, n_files, progress

    def process(self, item: tuple[int, dict[str, Iterable[Any]]]) -> Iterator[Any]:
        index, grouped = item
        [path] = grouped["path"]
        removed = dedup.removal_index(grouped["removed"])
        read: Counter[str] = Counter()  # counted once per file: the read step sees every record
        deduped: Counter[str] = Counter()
        for result in read_file(path, self.cfg):
            if isinstance(result, Rejected):
                read[f"rejected_{result.reason}"] += 1
                yield beam.pvalue.TaggedOutput(REJECTED, result)
                continue
            if isinstance(result, (Drop, Note)):  # a note: counted, its record is kept
                read[result.reason] += 1
                continue
            lines = removed.get(read["documents"], ())
            read["documents"] += 1
            if self.dedup.enabled:
                deduped["paragraphs_removed"] += len(lines)
                result = dedup.remove_paragraphs(result, lines, self.dedup.min_length)
                if isinstance(result, Drop):
                    deduped[result.reason] += 1
                    continue
                deduped["documents_out"] += 1
            yield result
        if self.progress:
            rejected = sum(n for name, n in read.items() if name.startswith("rejected_"))
            skipped = sum(read.values()) - read["documents"] - rejected  # the drops: warcinfo and the like
            print(f"[read {index + 1}/{self.n_files}] {path}: {read['documents']} documents, "
                  f"{rejected} rejected, {skipped} skipped", file=sys.stderr, flush=True)
        read["files"] += 1
        if self.dedup.enabled:
            deduped["documents_in"] = read["documents"]
        for step, counts in (("read", read), ("dedup", deduped)):
            for name, n in counts.items():
                self.count(name, n, step=step)


class ReadAndDedup(beam.PTransform):
    """Files -> documents, with global exact paragraph dedup when enabled (two passes, CCNet style)."""

    def __init__(self, read_cfg: ReadConfig, dedup_cfg: DedupConfig, n_files: int, progress: bool) -> None:
        super().__init__()
        self.read_cfg, self.dedup_cfg, self.n_files, self.progress = read_cfg, dedup_cfg, n_files, progress

    def expand(self, files: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        policy = self.dedup_cfg.policy
        partitions = self.dedup_cfg.partitions or min(4096, max(8, self.n_files))
        removed = (
            files
            | "HashParagraphs" >> beam.ParDo(HashFile(self.read_cfg, partitions, self.n_files, self.dedup_cfg.groups))
            | "GroupByPartition" >> beam.GroupByKey()
            | "FindDuplicates" >> beam.FlatMap(lambda kv: dedup.duplicates(kv[1], policy).items())
        ) if self.dedup_cfg.enabled else files | "NoRemovals" >> beam.FlatMap(lambda _: ())
        return (
            {"path": files, "removed": removed}
            | "JoinByFile" >> beam.CoGroupByKey()
            | "Read" >> Counted(ReadFiles(self.read_cfg, self.dedup_cfg, self.n_files, self.progress),
                                outputs=(REJECTED,))
        )


class StepFn(CountingDoFn):
    """Runs a document step built in ``setup()`` (where models load); drops become counters.

    Documents are taken ``chunk`` at a time (the rest at the end of the bundle), so fused steps
    run a whole chunk each in a row instead of taking turns per document and evicting each
    other's working set from the CPU caches: parsing then fastText costs about 20 % less CPU
    this way, fastText then KenLM about 10 % less (measured on the benchmark's WET files).
    """

    def __init__(self, step: str, factory: Callable[[], Callable[[Document], Any]], chunk: int = CHUNK_DOCS) -> None:
        super().__init__(step)
        self.factory, self.chunk = factory, chunk
        self.fn: Callable[[Document], Any] | None = None
        self.waiting: list[Document] = []

    def setup(self) -> None:
        self.fn = self.factory()

    def start_bundle(self) -> None:
        super().start_bundle()
        self.waiting = []

    def process(self, doc: Document) -> Iterator[Document]:
        self.waiting.append(doc)
        if len(self.waiting) >= self.chunk:
            yield from self._run()

    def finish_bundle(self) -> Iterator[Any]:
        for doc in self._run():  # batch pipelines: every document is in the global window
            yield GlobalWindows.windowed_value(doc)
        yield from super().finish_bundle()

    def _run(self) -> list[Document]:
        assert self.fn is not None
        kept = []
        for doc in self.waiting:
            result = self.fn(doc)
            events = getattr(self.fn, "events", None)
            while events:
                self.count(events.pop())
            if isinstance(result, Drop):
                self.count(result.reason)
                if doc.get("lang"):  # per language where the document has one (the report's funnel)
                    self.count(f"{result.reason}/{doc['lang']}")
            else:
                self.count("documents_out")
                kept.append(result)
        self.waiting = []
        return kept


def language_identifier(cfg: LidConfig) -> Callable[[], LanguageIdentifier]:
    def build() -> LanguageIdentifier:
        lid = LanguageIdentifier(cfg.model, cfg.threshold, cfg.thresholds, cfg.below_threshold, cfg.newlines,
                                 cfg.score_digits, cfg.threshold_on_rounded)
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


class ArrowTableCoder(beam.coders.Coder):
    """Arrow tables between stages as an LZ4-compressed IPC stream: half the bytes of a pickled
    table for text, and moving bytes between workers is what a shuffle costs."""

    OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")

    def encode(self, table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=self.OPTIONS) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    def decode(self, encoded: bytes) -> pa.Table:
        return pa.ipc.open_stream(encoded).read_all()

    def estimate_size(self, table: pa.Table) -> int:
        return table.nbytes  # Beam samples element sizes: without this it would compress to measure


beam.coders.registry.register_coder(pa.Table, ArrowTableCoder)


class WriteShard(CountingDoFn):
    def __init__(self, output: str, fmt: str, schema: str) -> None:
        super().__init__("write")
        self.output, self.fmt, self.schema = output, fmt, schema

    def process(self, item: tuple[tuple[str, str, int], Iterable[pa.Table]]) -> Iterator[str]:
        (lang, bucket, shard), parts = item
        table = sinks.shard_table(parts)
        path = sinks.shard_path(self.output, lang, bucket, shard, self.fmt)
        sinks.write_table(sinks.output_table(table, self.schema), path, self.fmt)
        self.count("shards")
        self.count("documents", table.num_rows)
        yield path


class AsTables(beam.PTransform):
    """Documents -> Arrow tables of up to ``batch_rows`` rows (the corpus schema).

    A few large elements cost Beam far less to encode, move and count than one element per
    document. Batches are cut per bundle, so they differ between runs; nothing written does
    (shards are sorted, statistics are sums).
    """

    def __init__(self, batch_rows: int = sinks.BATCH_ROWS) -> None:
        super().__init__()
        self.batch_rows = batch_rows

    def expand(self, docs: beam.PCollection) -> beam.PCollection:
        return (
            docs
            | "Batch" >> beam.BatchElements(min_batch_size=self.batch_rows, max_batch_size=self.batch_rows)
            | "ToTable" >> beam.Map(sinks.docs_to_table).with_output_types(pa.Table)
        )


class WriteCorpus(beam.PTransform):
    """Tables of documents -> ``lang=<l>/bucket=<b>/part-NNNNN`` shards (``<l>_<b>_NNNN.json.gz``
    in CCNet's layout).

    Returns ``{"paths": written paths, "stats": the one CorpusStats result}``: the partition sizes
    that set each partition's shard count also go into sampling.json.
    """

    def __init__(self, output: str, cfg: WriteConfig) -> None:
        super().__init__()
        self.output, self.cfg, self.target = output, cfg, int(cfg.shard_size_mb * 2**20)

    def expand(self, tables: beam.PCollection) -> dict[str, beam.PCollection]:
        stats = (tables | "TableStats" >> beam.Map(table_stats)
                 | "Stats" >> beam.CombineGlobally(CorpusStats()))
        sizes = stats | "Bytes" >> beam.Map(lambda s: {key: sums[2] for key, sums in s[0].items()})
        paths = (
            tables
            | "SplitByShard" >> beam.FlatMap(sinks.split_by_shard, totals=beam.pvalue.AsSingleton(sizes),
                                             target_bytes=self.target)
            .with_output_types(tuple[tuple[str, str, int], pa.Table])
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> Counted(WriteShard(self.output, self.cfg.format, self.cfg.schema))
        )
        return {"paths": paths, "stats": stats}


class WriteRecords(beam.PTransform):
    """Dict records -> ``<output>/<folder>/part-NNNNN.jsonl`` (16 shards by source file, sorted lines)."""

    def __init__(self, output: str, folder: str) -> None:
        super().__init__()
        self.output, self.folder = output, folder

    def expand(self, records: beam.PCollection) -> beam.PCollection:
        output, folder = self.output, self.folder

        def write(item: tuple[int, Iterable[dict[str, Any]]]) -> str:
            path = fs.join(output, folder, f"part-{item[0]:05d}.jsonl")
            sinks.write_jsonl(item[1], path)
            return path

        return (
            records
            | "KeyBySource" >> beam.Map(lambda r: (sinks.stable_hash(r.get("source") or "") % RECORD_SHARDS, r))
            | "Group" >> beam.GroupByKey()
            | "Write" >> beam.Map(write)
        )


DECILE_BIN = 1.01  # perplexity histogram bins grow by 1 %: deciles exact to 1 %, and deterministic


Totals = dict[tuple[str, str], tuple[int, int, int]]
Bins = Counter[tuple[str, int]]


def perplexity_bins(table: pa.Table) -> Bins:
    """``{(lang, bin): documents}`` of the scored documents of a table."""
    langs, perplexities = table.column("lang").to_pylist(), table.column("perplexity").to_pylist()
    return Counter((lang, int(math.floor(math.log(max(pp, 1e-3), DECILE_BIN))))
                   for lang, pp in zip(langs, perplexities) if pp is not None)


def table_stats(table: pa.Table) -> tuple[Totals, Bins]:
    """One table's ``(totals, bins)``: per ``(lang, bucket)`` the (documents, characters, UTF-8
    bytes) of its rows, and the perplexity histogram."""
    return dict(sinks.partition_sums(table)), perplexity_bins(table)


class CorpusStats(beam.CombineFn):
    """:func:`table_stats` of every table -> their sums. Sums only, so bundling does not change
    them; small inputs, so a runner that does not lift combines (Dask) moves no tables for it."""

    def create_accumulator(self) -> tuple[Totals, Bins]:
        return {}, Counter()

    def add_input(self, acc: tuple[Totals, Bins], stats: tuple[Totals, Bins]) -> tuple[Totals, Bins]:
        return self.merge_accumulators([acc, stats])

    def merge_accumulators(self, accs: Iterable[tuple[Totals, Bins]]) -> tuple[Totals, Bins]:
        merged, merged_bins = self.create_accumulator()
        for totals, bins in accs:
            for key, sums in totals.items():
                merged[key] = sum_columns([merged.get(key, (0, 0, 0)), sums])
            merged_bins.update(bins)
        return merged, merged_bins

    def extract_output(self, acc: tuple[Totals, Bins]) -> tuple[Totals, Bins]:
        totals, bins = acc  # in key order: the order of merging must not show
        return dict(sorted(totals.items())), Counter(dict(sorted(bins.items())))


def perplexity_deciles(bins: Bins) -> dict[str, list[float]]:
    """Per language, the deciles of its histogram (languages without scores are left out)."""
    by_lang: dict[str, list[tuple[int, int]]] = {}
    for (lang, b), count in bins.items():
        by_lang.setdefault(lang, []).append((b, count))
    return {lang: deciles(lang_bins) for lang, lang_bins in sorted(by_lang.items())}


def deciles(bins: Iterable[tuple[int, int]]) -> list[float]:
    """Deciles (0, 10, ..., 100th percentile) of one language's perplexity histogram."""
    ordered = sorted(bins)
    total = sum(count for _, count in ordered)
    result, seen, it = [], 0, iter(ordered)
    b, count = next(it)
    for decile in range(11):
        target = decile * (total - 1) / 10
        while seen + count <= target:
            seen += count
            b, count = next(it)
        result.append(round(DECILE_BIN ** (b + 0.5), 1))
    return result


def sum_columns(values: Iterable[tuple[int, int, int]]) -> tuple[int, int, int]:
    """Column sums of ``(documents, characters, bytes)`` rows."""
    documents = characters = size = 0
    for d, c, b in values:
        documents, characters, size = documents + d, characters + c, size + b
    return documents, characters, size


def corpus_summary(totals: Totals, quantiles: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per language: documents, characters, the same per bucket, and perplexity deciles."""
    summary: dict[str, dict[str, Any]] = {}
    for (lang, bucket), (documents, characters, _) in sorted(totals.items()):
        entry = summary.setdefault(lang, {"documents": 0, "characters": 0, "buckets": {}})
        entry["documents"] += documents
        entry["characters"] += characters
        entry["buckets"][bucket] = {"documents": documents, "characters": characters}
    for lang, values in quantiles.items():
        summary[lang]["perplexity_deciles"] = values
    return summary


def perplexity_report(bins: Bins, cutoffs: dict[str, list[float]] | None, cfg: PerplexityConfig) -> dict[str, Any]:
    """Per scored language: its perplexity histogram (``[bin, documents]``, bin b holding
    perplexities in [1.01^b, 1.01^(b+1))) and the head/tail cutoffs its buckets used."""
    report: dict[str, Any] = {}
    for (lang, b), count in sorted(bins.items()):
        report.setdefault(lang, {"histogram": []})["histogram"].append([b, count])
    for lang, entry in report.items():
        if cutoffs and lang in cutoffs:
            entry["cutoffs"] = {"head": cutoffs[lang][cfg.head], "tail": cutoffs[lang][cfg.tail]}
    return {"bin_base": DECILE_BIN, "languages": report} if report else {}


def versions() -> dict[str, str]:
    """Python's and the installed versions of what shapes the corpus, as the worker writing stats.json has them."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("polyglot-corpus", "apache-beam", "pyarrow", "fastwarc", "resiliparse", "warcio", "fasttext-numpy2",
                 "kenlm", "sentencepiece", "datasketch", "numpy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def write_artifacts(corpus: tuple[Totals, Bins], counters: Counts, cfg: CorpusConfig, n_files: int,
                    cutoffs: dict[str, list[float]] | None = None) -> None:
    """``sampling.json`` (weights over the configured buckets, and the corpus summary) and
    ``stats.json`` (counters of every step, per-language totals, perplexity histograms and cutoffs,
    the config). Both depend only on the input and config: what differs per run (runner, time)
    goes to run.json."""
    totals, bins = corpus
    summary = corpus_summary(totals, perplexity_deciles(bins))
    counted: dict[str, dict[str, int]] = {}
    for (lang, bucket), (documents, characters, _) in totals.items():
        if not cfg.sampling.buckets or bucket in cfg.sampling.buckets:
            entry = counted.setdefault(lang, {"documents": 0, "characters": 0})
            entry["documents"] += documents
            entry["characters"] += characters
    report = stats.sampling_report(counted, cfg.sampling.alpha, cfg.sampling.unit)
    report["buckets"] = cfg.sampling.buckets or "all"
    report["corpus"] = summary
    sinks.write_json(report, fs.join(cfg.output, "sampling.json"))
    sinks.write_json({
        "input_files": n_files,
        "counters": counters,
        "languages": summary,
        "perplexity": perplexity_report(bins, cutoffs, cfg.perplexity),
        "config": {name: vars(getattr(cfg, name)) for name in CONFIG_SECTIONS},
        "versions": versions(),
    }, fs.join(cfg.output, "stats.json"))


def near_dedup(docs: beam.PCollection, cfg: CorpusConfig) -> beam.PCollection:
    """The MinHash stage; removed documents go to ``near_duplicates/`` when asked."""
    result = docs | "NearDedup" >> NearDedup(cfg.near_dedup)
    if cfg.near_dedup.write_removed:
        _ = result[neardup.REMOVED] | "WriteNearDuplicates" >> WriteRecords(cfg.output, NEAR_DUPLICATES)
    return result[MAIN]


def build_pipeline(p: beam.Pipeline, cfg: CorpusConfig, files: list[str], languages: list[str],
                   cutoffs: dict[str, list[float]] | None) -> None:
    """Add the whole corpus graph for ``files`` to pipeline ``p``.

    ``languages`` are the ones with a perplexity model (checked by the driver), ``cutoffs`` the
    parsed cutoff file (or None).
    """
    indexed = p | "Files" >> beam.Create(list(enumerate(files))) | "Distribute" >> beam.Reshuffle()
    read = indexed | "ReadAndDedup" >> ReadAndDedup(cfg.read, cfg.dedup, len(files), cfg.progress)
    docs, rejected = read[MAIN], read[REJECTED]
    near = cfg.near_dedup
    if near.enabled and near.position == "before_lid":
        docs = near_dedup(docs, cfg)
    docs = docs | "LanguageID" >> Counted(StepFn("lid", language_identifier(cfg.lid)))
    if near.enabled and near.position == "after_lid":
        docs = near_dedup(docs, cfg)
    if cfg.perplexity.models:
        docs = docs | "Perplexity" >> Counted(StepFn("perplexity", perplexity_scorer(cfg.perplexity, languages, cutoffs)))
    else:
        docs = docs | "Bucket" >> beam.Map(without_perplexity)
    if near.enabled and near.position == "after_perplexity":
        docs = near_dedup(docs, cfg)
    tables = docs | "AsTables" >> AsTables()
    written = tables | "WriteCorpus" >> WriteCorpus(cfg.output, cfg.write)
    _ = rejected | "RejectedAsDicts" >> beam.Map(Rejected.to_dict) | "WriteRejected" >> WriteRecords(cfg.output, REJECTED)
    counters = total_counts(p)  # last: every counting step is in the graph by now
    _ = written["stats"] | "WriteStats" >> beam.Map(write_artifacts, beam.pvalue.AsSingleton(counters), cfg, len(files),
                                                    cutoffs)
