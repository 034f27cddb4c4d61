"""Writing in Beam: documents to Arrow tables, tables to deterministic shards (``lang=<l>/bucket=<b>/
part-NNNNN``), the corpus sums stats.json is made of, and JSON-lines record folders (rejected/,
removed/<step>/)."""
from __future__ import annotations

import os
import uuid
from collections import Counter
from typing import Any, Iterable, Iterator, Sequence, Union

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from ..config import WriteConfig
from ..output import layout, shards
from ..readers import spill
from ..report.stats import Stats, sum_columns, table_stats
from ..steps.base import Document
from .counting import Counted, CountingDoFn


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

Stashed = Union[bytes, str]
"""A table between stages: :class:`ArrowTableCoder`'s bytes, or ``<path>@<offset>:<length>``, where
an Arrow IPC stream of it lies in a file."""


def stash(tables: Sequence[pa.Table], scratch: str) -> list[Stashed]:
    """``tables`` made ready to move to a later stage: :class:`ArrowTableCoder`'s bytes each; with
    a scratch folder (``RunInfo.scratch``: the DirectRunner's, on the disk every worker shares) one
    file there instead, holding each table as an uncompressed Arrow IPC stream, and where each
    lies in it moves: the bytes stay out of the runner's data plane, where each stage boundary
    costs the driver and every worker a gRPC copy, and the next stage reads its part of the file
    instead of decompressing it (compressing and decompressing the benchmark's tables with LZ4
    took 0.7-1.4 s a hop). One file per call, however many tables: a split table's parts for
    thousands of shards are one file, not thousands. Bytes where the disk has no room (the
    spill's :func:`~pipeline.readers.spill.budget`) or the write fails. The files go with the
    run's scratch folder at its end."""
    if tables and scratch and sum(table.nbytes for table in tables) <= spill.budget(scratch):
        path = os.path.join(scratch, f"{uuid.uuid4().hex}.tables")
        try:
            spans = []
            with pa.OSFile(path, "wb") as sink:
                for table in tables:
                    start = sink.tell()
                    with pa.ipc.new_stream(sink, table.schema) as writer:
                        writer.write_table(table)
                    spans.append(f"{path}@{start}:{sink.tell() - start}")
            return spans
        except OSError:
            if os.path.exists(path):
                os.remove(path)
    return [ArrowTableCoder().encode(table) for table in tables]


def unstash(part: Stashed) -> pa.Table:
    """The table :func:`stash` gave ``part`` for."""
    if isinstance(part, str):
        path, _, span = part.rpartition("@")
        start, length = (int(n) for n in span.split(":"))
        with open(path, "rb") as stream:
            stream.seek(start)
            part = stream.read(length)
    return ArrowTableCoder().decode(part)


class WriteShard(CountingDoFn):
    def __init__(self, output: str, fmt: str, schema: str) -> None:
        super().__init__("write")
        self.output, self.fmt, self.schema = output, fmt, schema

    def process(self, item: tuple[tuple[str, str, int], Iterable[Stashed]]) -> Iterator[str]:
        (lang, bucket, shard), parts = item
        table = shards.shard_table(map(unstash, parts))
        path = layout.shard_path(self.output, lang, bucket, shard, self.fmt)
        shards.write_table(shards.output_table(table, self.schema), path, self.fmt)
        self.count("shards")
        self.count("documents", table.num_rows)
        yield path


TABLE_ROWS = 8192
"""Rows of the tables :class:`AsTables` makes. Each table is then summed, split by partition and
stashed, and each of its parts read back, concatenated and sorted into its shard, at a cost per
table and per part: on half the benchmark's kept documents (23,191, one worker's share at 2
workers), those write stages took 0.32-0.39 s in tables of 8,192 rows against 0.39-0.48 s in
tables of 1,024 (3 alternated rounds, BENCHMARKS.md). A table holds 8,192 documents at most (20 MB of
them on the benchmark) before it is made."""


class AsTables(beam.PTransform):
    """Documents -> Arrow tables of up to ``batch_rows`` rows (the corpus schema), each table's rows
    of one ``(lang, bucket)`` together (:func:`~pipeline.output.shards.partitioned_table`).

    A few large elements cost Beam far less to encode, move and count than one element per
    document. Tables are cut per bundle, so they differ between runs; nothing written does
    (shards are sorted, statistics are sums).
    """

    def __init__(self, batch_rows: int = TABLE_ROWS) -> None:
        super().__init__()
        self.batch_rows = batch_rows

    def expand(self, docs: beam.PCollection) -> beam.PCollection:
        return docs | "ToTable" >> beam.ParDo(_Tables(self.batch_rows)).with_output_types(pa.Table)


class _Tables(beam.DoFn):
    """:class:`AsTables`' one DoFn: documents held until ``batch_rows`` of them, or the bundle's end,
    make a table (one Beam operation per document, where ``BatchElements`` and a ``Map`` were two)."""

    def __init__(self, batch_rows: int) -> None:
        super().__init__()
        self.batch_rows = batch_rows
        self.docs: list[Document] = []

    def start_bundle(self) -> None:
        self.docs = []

    def process(self, doc: Document) -> Iterator[pa.Table]:
        self.docs.append(doc)
        if len(self.docs) >= self.batch_rows:
            docs, self.docs = self.docs, []
            yield shards.partitioned_table(docs)

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self.docs:  # batch pipelines: every document is in the global window
            docs, self.docs = self.docs, []
            yield GlobalWindows.windowed_value(shards.partitioned_table(docs))


def _stashed_partitions(table: pa.Table, scratch: str) -> Iterator[tuple[tuple[str, str], Stashed]]:
    """:func:`shards.split_by_partition` of a table, its parts stashed (one file)."""
    split = list(shards.split_by_partition(table))
    return zip([key for key, _ in split], stash([part for _, part in split], scratch))


def _stashed_shards(item: tuple[tuple[str, str], Stashed], totals: dict[tuple[str, str], int], target_bytes: int,
                    scratch: str) -> Iterator[tuple[tuple[str, str, int], Stashed]]:
    """A stashed part of one partition by shard: as it is where the partition has one shard (its
    size known only now); otherwise split by :func:`shards.split_by_shard` and stashed again."""
    (lang, bucket), part = item
    n = shards.shard_count(totals[(lang, bucket)], target_bytes)
    if n == 1:
        yield (lang, bucket, 0), part
        return
    split = list(shards.split_by_shard(unstash(part), n))
    if len(split) == 1:  # all its rows in one shard: the part as it is
        yield (lang, bucket, split[0][0]), part
        return
    for (shard, _), stashed in zip(split, stash([table for _, table in split], scratch)):
        yield (lang, bucket, shard), stashed


class WriteCorpus(beam.PTransform):
    """Tables of documents -> ``lang=<l>/bucket=<b>/part-NNNNN`` shards (``<l>_<b>_NNNN.json.gz``
    in CCNet's layout).

    Returns ``{"paths": written paths, "stats": the one CorpusStats result}`` (none where no table
    came: read it with :data:`NO_STATS` for a default); the partition sizes that set each
    partition's shard count also go into sampling.json. Tables and their parts move between stages
    as :func:`stash` gives them (files in ``scratch`` where there is one).
    """

    def __init__(self, output: str, cfg: WriteConfig, scratch: str = "") -> None:
        super().__init__()
        self.output, self.cfg, self.target = output, cfg, int(cfg.shard_size_mb * 2**20)
        self.scratch = scratch

    def expand(self, tables: beam.PCollection) -> dict[str, beam.PCollection]:
        stats = (tables | "TableStats" >> beam.Map(table_stats)  # no default (a stage of its own): readers give one
                 | "Stats" >> beam.CombineGlobally(CorpusStats()).without_defaults())
        sizes = stats | "Bytes" >> beam.Map(lambda s: {key: sums[2] for key, sums in s[0].items()})
        paths = (
            tables
            | "Stash" >> beam.FlatMap(_stashed_partitions, self.scratch)
            .with_output_types(tuple[tuple[str, str], Stashed])
            | "SplitByShard" >> beam.FlatMap(_stashed_shards, totals=beam.pvalue.AsSingleton(sizes, default_value={}),
                                             target_bytes=self.target, scratch=self.scratch)
            .with_output_types(tuple[tuple[str, str, int], Stashed])
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> Counted(WriteShard(self.output, self.cfg.format, self.cfg.schema))
        )
        return {"paths": paths, "stats": stats}


class WriteRecords(beam.PTransform):
    """Dict records -> ``<output>/<folder>/part-NNNNN.jsonl``: :data:`~pipeline.output.layout.RECORD_SHARDS`
    parts by document id (a rejected record, which has none, by its source file), sorted lines."""

    def __init__(self, output: str, folder: str) -> None:
        super().__init__()
        self.output, self.folder = output, folder

    def expand(self, records: beam.PCollection) -> beam.PCollection:
        output, folder = self.output, self.folder

        def write(item: tuple[int, Iterable[dict[str, Any]]]) -> str:
            path = layout.records_path(output, folder, item[0])
            shards.write_jsonl(item[1], path)
            return path

        return (
            records
            | "KeyByRecord" >> beam.Map(lambda r: (shards.stable_hash(r.get("id") or r.get("source") or "")
                                                 % layout.RECORD_SHARDS, r))
            | "Group" >> beam.GroupByKey()
            | "Write" >> beam.Map(write)
        )


class CorpusStats(beam.CombineFn):
    """:func:`table_stats` of every table -> their sums. Sums only, so bundling does not change
    them; small inputs, so a runner that does not lift combines (Dask) moves no tables for it."""

    def create_accumulator(self) -> Stats:
        return {}, Counter(), {}

    def add_input(self, acc: Stats, stats: Stats) -> Stats:
        return self.merge_accumulators([acc, stats])

    def merge_accumulators(self, accs: Iterable[Stats]) -> Stats:
        merged, merged_bins, merged_clusters = self.create_accumulator()
        for totals, bins, clusters in accs:
            for key, sums in totals.items():
                merged[key] = sum_columns([merged.get(key, (0, 0, 0)), sums])
            for key, pair in clusters.items():
                merged_clusters[key] = sum_columns([merged_clusters.get(key, (0, 0)), pair])
            merged_bins.update(bins)
        return merged, merged_bins, merged_clusters

    def extract_output(self, acc: Stats) -> Stats:
        totals, bins, clusters = acc  # in key order: the order of merging must not show
        return dict(sorted(totals.items())), Counter(dict(sorted(bins.items()))), dict(sorted(clusters.items()))


NO_STATS: Stats = CorpusStats().extract_output(CorpusStats().create_accumulator())
"""What :class:`CorpusStats` gives for no table."""
