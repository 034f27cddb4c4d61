"""Deterministic corpus shards (Arrow IPC with zstd, or Parquet) and the rejected-records sink.

Shard names and contents depend only on the documents: each document goes to shard
``stable_hash(id) % n`` of its ``(lang, bucket)`` where ``n`` follows from the partition's total
size and the target shard size; inside a shard rows are sorted by :data:`SORT_KEYS` and written as
one chunk, so how the documents were batched on their way to the shard does not change its bytes.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
from typing import Any, BinaryIO, Iterable, Iterator
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import fs
from .layout import FORMATS
from ..steps.base import Document
from ..util.errors import first_line

SCHEMA = pa.schema([
    ("id", pa.string()), ("url", pa.string()), ("date", pa.string()), ("digest", pa.string()),
    ("source", pa.string()), ("title", pa.string()), ("text", pa.string()), ("lang", pa.string()),
    ("lang_score", pa.float64()), ("perplexity", pa.float64()), ("bucket", pa.string()),
    ("nlines", pa.int32()), ("original_nlines", pa.int32()), ("length", pa.int32()),
    ("original_length", pa.int32()), ("content_length", pa.int64()), ("line_ids", pa.list_(pa.int32())),
    ("minhash_cluster_size", pa.int32()),
])
"""The corpus schema (``write.schema: polyglot``), also the tables between the pipeline's stages."""
def _after_dedup(table: pa.Table, deduped: str, read: str | None = None) -> pa.ChunkedArray:
    """Column ``deduped`` where a row went through dedup (it has ``line_ids``), else column ``read``
    (as ``deduped``'s type) or null: CCNet's reader gives a document ``length`` (its Content-Length, in
    bytes) and ``nlines``; its dedup's ``finalize_doc`` adds ``original_length`` (that Content-Length)
    and ``original_nlines`` and makes ``length`` the characters kept."""
    column = table.column(deduped)
    if table.column("line_ids").null_count == 0:  # every row deduplicated (the ccnet profile): as it is
        return column
    other = table.column(read).cast(column.type) if read else pa.nulls(len(table), column.type)
    return pc.if_else(pc.is_valid(table.column("line_ids")), column, other)


CCNET_COLUMNS = [  # CCNet's mined documents, in its order: (name, our column or a function of a table)
    ("url", "url"), ("date_download", "date"), ("digest", "digest"),
    ("length", lambda t: _after_dedup(t, "length", "content_length")),
    ("nlines", "nlines"), ("source_domain", lambda t: pa.array([_netloc(u) for u in t.column("url").to_pylist()])),
    ("title", "title"), ("raw_content", "text"),
    ("cc_segment", lambda t: pa.array([cc_segment(s) for s in t.column("source").to_pylist()])),
    ("original_nlines", lambda t: _after_dedup(t, "original_nlines")),
    ("original_length", lambda t: _after_dedup(t, "content_length")), ("line_ids", "line_ids"),
    ("language", "lang"), ("language_score", "lang_score"), ("perplexity", "perplexity"), ("bucket", "bucket"),
]
"""``write.schema: ccnet``: CCNet's fields, with its meanings (``length`` and ``original_length``
as :func:`_after_dedup` says, ``cc_segment`` the WET file's path from ``crawl-data/``)."""


def _netloc(url: str | None) -> str:
    """The host part of ``url`` (CCNet's ``source_domain``); "" for a URL ``urlsplit`` refuses (an
    unclosed IPv6 bracket: it ended the whole run at its last stage)."""
    try:
        return urlsplit(url or "").netloc
    except ValueError:
        return ""


SORT_KEYS = [(name, "ascending") for name in ("id", "source", "url", "date", "digest", "text")]
BATCH_ROWS = 1024


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "little")


def shard_count(total_bytes: int, target_bytes: int) -> int:
    return max(1, math.ceil(total_bytes / target_bytes))


def shard_of_id(doc_id: str, n_shards: int) -> int:
    return stable_hash(doc_id) % n_shards


def cc_segment(source: str) -> str:
    """CCNet's ``cc_segment`` of an input path: from ``crawl-data/`` on, or the path as it is."""
    at = source.find("crawl-data/")
    return source[at:] if at >= 0 else source


def output_table(table: pa.Table, schema: str) -> pa.Table:
    """A shard's rows as written: the corpus schema, or CCNet's fields (``write.schema``)."""
    if schema == "polyglot":
        return table
    columns = [table.column(source) if isinstance(source, str) else source(table) for _, source in CCNET_COLUMNS]
    return pa.Table.from_arrays(columns, names=[name for name, _ in CCNET_COLUMNS])


DEFAULTS = {"bucket": "all"}
"""Column values of documents that lack them: no perplexity step, or one without models, buckets nothing."""
_ROW = pa.struct(list(SCHEMA))


def docs_to_table(docs: list[Document]) -> pa.Table:
    """Documents as a table with the corpus schema, in the given order (columns they lack are
    :data:`DEFAULTS` or null; fields outside the schema are left out).

    Arrow reads the dicts itself, as one struct array: 0.35x the time of a Python list per column
    (the benchmark's 46,381 kept documents in tables of 1,024: 0.10 s against 0.29 s of CPU)."""
    columns = pa.array(docs, type=_ROW).flatten()
    for name, default in DEFAULTS.items():
        field = SCHEMA.field(name)
        columns[SCHEMA.get_field_index(name)] = pa.array([d.get(name, default) for d in docs], type=field.type)
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def partitioned_table(docs: list[Document]) -> pa.Table:
    """:func:`docs_to_table` of ``docs`` with the rows of each ``(lang, bucket)`` together, so that
    :func:`split_by_partition` slices the table instead of copying its rows (the write stages of
    the 50 MB benchmark: 0.71x the time, BENCHMARKS.md)."""
    return docs_to_table(sorted(docs, key=lambda doc: (doc.get("lang") or "", doc.get("bucket") or "")))


def partition_sums(table: pa.Table) -> Iterator[tuple[tuple[str, str], tuple[int, int, int]]]:
    """``((lang, bucket), (documents, characters, UTF-8 bytes of text))`` of a table's rows."""
    sums = pa.table({
        "lang": table.column("lang"), "bucket": table.column("bucket"),
        "chars": pc.utf8_length(table.column("text")), "bytes": pc.binary_length(table.column("text")),
    }).group_by(["lang", "bucket"]).aggregate([("chars", "count"), ("chars", "sum"), ("bytes", "sum")])
    for row in sums.to_pylist():
        yield (row["lang"], row["bucket"]), (row["chars_count"], row["chars_sum"], row["bytes_sum"])


def cluster_sums(table: pa.Table) -> Iterator[tuple[tuple[str, str, int], tuple[int, int]]]:
    """``((lang, bucket, minhash_cluster_size), (documents, characters))`` of a table's rows (size 1
    where near-dup did not run)."""
    if "minhash_cluster_size" in table.column_names:
        sizes = pc.fill_null(table.column("minhash_cluster_size"), 1)
    else:
        sizes = pa.array([1] * table.num_rows, pa.int32())
    sums = pa.table({"lang": table.column("lang"), "bucket": table.column("bucket"), "size": sizes,
                     "chars": pc.utf8_length(table.column("text"))}
                    ).group_by(["lang", "bucket", "size"]).aggregate([("chars", "count"), ("chars", "sum")])
    for row in sums.to_pylist():
        yield (row["lang"], row["bucket"], int(row["size"])), (row["chars_count"], row["chars_sum"])


def split_by_partition(table: pa.Table) -> Iterator[tuple[tuple[str, str], pa.Table]]:
    """The rows of ``table`` grouped by ``(lang, bucket)``, in key order."""
    return _grouped(table, zip(table.column("lang").to_pylist(), table.column("bucket").to_pylist()))


def split_by_shard(part: pa.Table, n_shards: int) -> Iterator[tuple[int, pa.Table]]:
    """The rows of one partition's table grouped by shard (:func:`shard_of_id` of ``n_shards``), in
    shard order."""
    if n_shards == 1:
        return iter([(0, part)])
    return _grouped(part, (shard_of_id(doc_id, n_shards) for doc_id in part.column("id").to_pylist()))


def _grouped(table: pa.Table, keys: Iterable[Any]) -> Iterator[tuple[Any, pa.Table]]:
    """``table``'s rows grouped by their ``keys`` (one per row), in key order; one group is ``table``
    itself, and a group whose rows are consecutive a slice of it (no copy)."""
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    if len(groups) == 1:
        return iter([(next(iter(groups)), table)])
    return ((key, table.slice(rows[0], len(rows)) if rows[-1] - rows[0] == len(rows) - 1 else table.take(rows))
            for key, rows in sorted(groups.items()))


def shard_table(parts: Iterable[pa.Table]) -> pa.Table:
    """One shard from its parts: rows sorted by :data:`SORT_KEYS`, as a single chunk."""
    parts = list(parts)
    table = pa.concat_tables(parts) if parts else docs_to_table([])
    return table.sort_by(SORT_KEYS).combine_chunks()


def write_table(table: pa.Table, path: str, fmt: str) -> None:
    """Write one shard atomically; identical tables give identical bytes."""
    def arrow(stream: BinaryIO) -> None:
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_file(stream, table.schema, options=options) as writer:
            writer.write_table(table, max_chunksize=BATCH_ROWS)

    def parquet(stream: BinaryIO) -> None:
        pq.write_table(table, stream, compression="zstd", row_group_size=BATCH_ROWS * 16)

    def json_lines(stream: BinaryIO) -> None:  # as CCNet writes them: json.dumps, no null fields
        with gzip.GzipFile(filename="", fileobj=stream, mode="wb", mtime=0) as out:  # no (temporary) name in it
            for row in table.to_pylist():
                out.write(json.dumps({k: v for k, v in row.items() if v is not None}, ensure_ascii=False).encode("utf-8") + b"\n")

    fs.write_atomic(path, {"arrow": arrow, "parquet": parquet, "json": json_lines}[fmt])


def read_shard(path: str) -> pa.Table:
    """Read a shard written by :func:`write_table` (any format)."""
    with fs.open_read(path) as stream:
        if path.endswith(FORMATS["json"]):
            rows = [json.loads(line) for line in gzip.decompress(stream.read()).splitlines()]
            names = list(dict.fromkeys(name for row in rows for name in row))  # every row's: a null field is left
            return pa.Table.from_pydict({name: [row.get(name) for row in rows] for name in names})  # out of its line
        if path.endswith(FORMATS["parquet"]):
            return pq.read_table(stream)
        return pa.ipc.open_file(pa.BufferReader(stream.read())).read_all()


class _Watched:
    """A stream that keeps what its own calls raised: pyarrow raises again what a Python stream's
    read raised, which tells a store's failure (the network, a permission) from a damaged file."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.failure: Exception | None = None

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.stream, name)
        if not callable(attribute):
            return attribute

        def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                return attribute(*args, **kwargs)
            except Exception as exc:
                self.failure = exc
                raise
        return watched


def unreadable(path: str) -> str | None:
    """Why Arrow or Parquet shard ``path`` cannot be opened (a copy cut short, another file under its
    name, none there), from its footer alone; None when it opens. ``pipeline status`` asks it of
    every shard. Raises :class:`fs.ReadFailed` where the store did not give the bytes."""
    try:
        stream = _Watched(fs.open_read(path))
    except FileNotFoundError:  # removed since it was listed: damage, not the store's failure
        return "no such file"
    except IsADirectoryError:
        return "a folder, not a file"
    except Exception as exc:  # noqa: BLE001  a store's client
        if not fs.is_local(path) and not fs.exists(path):
            return "no such file"
        raise fs.ReadFailed(f"shard {path}: cannot read it ({first_line(exc, typed=True)})") from exc
    try:
        with stream.stream:
            if path.endswith(FORMATS["parquet"]):
                pq.ParquetFile(stream)
            else:
                pa.ipc.open_file(stream)
    except Exception as exc:
        if stream.failure is not None:
            raise fs.ReadFailed(f"shard {path}: cannot read it ({first_line(stream.failure, typed=True)})") from exc
        if not isinstance(exc, (OSError, ValueError, pa.ArrowException)):  # a bug of ours: its traceback
            raise
        return first_line(exc)  # a footer cut short, or of a wrong length or type
    return None


def write_jsonl(records: Iterable[dict[str, Any]], path: str) -> None:
    """Records (rejected, removed) as sorted JSON lines."""
    lines = sorted(json.dumps(r, ensure_ascii=False, sort_keys=True) for r in records)
    body = "".join(line + "\n" for line in lines)
    fs.write_atomic(path, lambda stream: stream.write(body.encode("utf-8")))
