"""Deterministic corpus shards (Arrow IPC with zstd, or Parquet) and the rejected-records sink.

Shard names and contents depend only on the documents: each document goes to shard
``stable_hash(id) % n`` of its ``(lang, bucket)`` where ``n`` follows from the partition's total
size and the target shard size; inside a shard rows are sorted by :data:`SORT_KEYS` and written as
one chunk, so how the documents were batched on their way to the shard does not change its bytes.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any, BinaryIO, Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import fs
from .documents import Document

SCHEMA = pa.schema([
    ("id", pa.string()), ("url", pa.string()), ("date", pa.string()), ("digest", pa.string()),
    ("source", pa.string()), ("text", pa.string()), ("lang", pa.string()),
    ("lang_score", pa.float64()), ("perplexity", pa.float64()), ("bucket", pa.string()),
    ("nlines", pa.int32()), ("original_nlines", pa.int32()), ("length", pa.int32()),
    ("original_length", pa.int32()), ("minhash_cluster_size", pa.int32()),
])
FORMATS = {"arrow": ".arrow", "parquet": ".parquet"}
SORT_KEYS = [(name, "ascending") for name in ("id", "source", "url", "date", "digest", "text")]
BATCH_ROWS = 1024


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "little")


def shard_count(total_bytes: int, target_bytes: int) -> int:
    return max(1, math.ceil(total_bytes / target_bytes))


def shard_of_id(doc_id: str, n_shards: int) -> int:
    return stable_hash(doc_id) % n_shards


def partition_dir(output: str, lang: str, bucket: str) -> str:
    return fs.join(output, f"lang={lang}", f"bucket={bucket}")


def shard_path(output: str, lang: str, bucket: str, shard: int, fmt: str) -> str:
    return fs.join(partition_dir(output, lang, bucket), f"part-{shard:05d}{FORMATS[fmt]}")


def docs_to_table(docs: list[Document]) -> pa.Table:
    """Documents as a table with the corpus schema, in the given order (columns they lack are null)."""
    return pa.Table.from_arrays([pa.array([d.get(f.name) for d in docs], type=f.type) for f in SCHEMA], schema=SCHEMA)


def partition_sums(table: pa.Table) -> Iterator[tuple[tuple[str, str], tuple[int, int, int]]]:
    """``((lang, bucket), (documents, characters, UTF-8 bytes of text))`` of a table's rows."""
    sums = pa.table({
        "lang": table.column("lang"), "bucket": table.column("bucket"),
        "chars": pc.utf8_length(table.column("text")), "bytes": pc.binary_length(table.column("text")),
    }).group_by(["lang", "bucket"]).aggregate([("chars", "count"), ("chars", "sum"), ("bytes", "sum")])
    for row in sums.to_pylist():
        yield (row["lang"], row["bucket"]), (row["chars_count"], row["chars_sum"], row["bytes_sum"])


def split_by_shard(table: pa.Table, totals: Mapping[tuple[str, str], int],
                   target_bytes: int) -> Iterator[tuple[tuple[str, str, int], pa.Table]]:
    """The rows of ``table`` grouped by ``(lang, bucket, shard)``; ``totals`` are each partition's bytes."""
    groups: dict[tuple[str, str, int], list[int]] = {}
    columns = (table.column(name).to_pylist() for name in ("id", "lang", "bucket"))
    for i, (doc_id, lang, bucket) in enumerate(zip(*columns)):
        n = shard_count(totals[(lang, bucket)], target_bytes)
        groups.setdefault((lang, bucket, shard_of_id(doc_id, n)), []).append(i)
    for key, rows in sorted(groups.items()):
        yield key, table.take(rows)


def shard_table(parts: Iterable[pa.Table]) -> pa.Table:
    """One shard from its parts: rows sorted by :data:`SORT_KEYS`, as a single chunk."""
    parts = list(parts)
    table = pa.concat_tables(parts) if parts else docs_to_table([])
    return table.sort_by(SORT_KEYS).combine_chunks()


def write_table(table: pa.Table, path: str, fmt: str) -> None:
    """Write one shard atomically; identical tables give identical bytes."""
    def arrow(stream: BinaryIO) -> None:
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_file(stream, SCHEMA, options=options) as writer:
            writer.write_table(table, max_chunksize=BATCH_ROWS)

    def parquet(stream: BinaryIO) -> None:
        pq.write_table(table, stream, compression="zstd", row_group_size=BATCH_ROWS * 16)

    fs.write_atomic(path, arrow if fmt == "arrow" else parquet)


def read_shard(path: str) -> pa.Table:
    """Read a shard written by :func:`write_table` (either format)."""
    with fs.open_read(path) as stream:
        if path.endswith(FORMATS["parquet"]):
            return pq.read_table(stream)
        return pa.ipc.open_file(pa.BufferReader(stream.read())).read_all()


def write_jsonl(records: Iterable[dict[str, Any]], path: str) -> None:
    """Records (rejected, near-duplicates) as sorted JSON lines."""
    lines = sorted(json.dumps(r, ensure_ascii=False, sort_keys=True) for r in records)
    body = "".join(line + "\n" for line in lines)
    fs.write_atomic(path, lambda stream: stream.write(body.encode("utf-8")))


def write_json(obj: Any, path: str) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    fs.write_atomic(path, lambda stream: stream.write(text.encode("utf-8")))
