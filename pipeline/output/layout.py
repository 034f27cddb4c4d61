"""The corpus folder's layout: every name a run writes, in one place.

```
<out>/lang=<l>/bucket=<b>/part-NNNNN.arrow   shards (.parquet; or <l>_<b>_NNNN.json.gz in CCNet's layout)
<out>/rejected/part-NNNNN.jsonl             records that could not become documents, with the reason
<out>/removed/<step>/part-NNNNN.jsonl       what each step removed, with the reason (write.removed)
<out>/stats.json  <out>/sampling.json        counters and per-language totals; alpha-sampling weights
<out>/run.json                               what differs between runs (runner, elapsed time, time per part)
<out>/report/                                the corpus report (HTML, Markdown, PNG)
<out>/_staging-<id>/                         a run in progress (replaces the corpus when complete)
<out>/_staging-<id>/_run-state.json          its config and input fingerprint, DaskRunner task folder, start time
<out>/_staging-<id>/_io.json                 the workers' I/O counts (S3 retries), for run.json
<out>/_lease-<id>.json                       a run's hold on its staging folder in a bucket (``output.lease``)
<out>/.run.lock                              the live run's hold on a local output (``util.locks.FileLock``)
```
"""
from __future__ import annotations

import re

from ..util.errors import UserError
from . import fs

FORMATS = {"arrow": ".arrow", "parquet": ".parquet", "json": ".json.gz"}
"""Shard file suffixes. ``json``: CCNet's layout, ``<lang>_<bucket>_NNNN.json.gz`` files of one JSON document a line."""
SCHEMAS = ("polyglot", "ccnet")
"""The shards' columns (``write.schema``): ours, or CCNet's fields (``output.shards.CCNET_COLUMNS``)."""
REJECTED = "rejected"
REMOVED = "removed"
REPORT = "report"
ARTIFACTS = ("stats.json", "sampling.json")
RUN_FILE = "run.json"  # runner, elapsed time, time per part: what differs between runs of the same input and config
STAGING = "_staging-"  # a run writes below <output>/_staging-<id>/ ("_": dataset readers skip it)
RUN_STATE = "_run-state.json"  # in the staging folder: what --resume and `pipeline status` read (see run.py)
TASK_FOLDER = "polyglot-run-"  # a DaskRunner run's task folder: <temp_location or system temp>/polyglot-run-<id>
IO_FILE = "_io.json"  # in the staging folder: the workers' I/O counts (S3 retries), which run.json takes
RUN_LOCK = ".run.lock"  # <output>/.run.lock: held while a run lives (a lock file; a lease in a bucket)
LEASE = "_lease-"  # <output>/_lease-<id>.json: the run of _staging-<id> lives (a bucket, where nothing locks)
COMMIT = "_COMMIT.json"  # in the staging folder: the moves that replace the corpus (see run.commit)
RECORD_SHARDS = 16  # part files of rejected/ and of each removed/<step>/
NOT_SHARDS = [".", "_", REJECTED, REMOVED, REPORT, *ARTIFACTS, RUN_FILE]
"""Name prefixes of a corpus folder's entries that are not shards: ``ignore_prefixes`` for
``pyarrow.dataset.dataset(folder, format="ipc", partitioning="hive", ignore_prefixes=NOT_SHARDS)``."""
PARTITION_FOLDERS = ("lang=*/bucket=*", "lang=*")
RECORD_FOLDERS = (REJECTED, f"{REMOVED}/*", REMOVED)  # deepest first


def partition_dir(output: str, lang: str, bucket: str) -> str:
    return fs.join(output, f"lang={lang}", f"bucket={bucket}")


def shard_path(output: str, lang: str, bucket: str, shard: int, fmt: str) -> str:
    if fmt == "json":
        return fs.join(output, f"{lang}_{bucket}_{shard:04d}{FORMATS[fmt]}")
    return fs.join(partition_dir(output, lang, bucket), f"part-{shard:05d}{FORMATS[fmt]}")


def shard_glob(fmt: str) -> tuple[str, ...]:
    """The glob of the shards a run wrote in format ``fmt``, below the corpus folder, as path parts."""
    return ("*_*_*.json.gz",) if fmt == "json" else ("lang=*", "bucket=*", "part-*")


def shard_pattern(output: str, fmt: str) -> str:
    """The glob of the shards a run wrote in format ``fmt`` (to show)."""
    return fs.join(output, *shard_glob(fmt))


def shard_files(output: str, fmt: str = "arrow") -> list[str]:
    """The shards of a corpus folder in format ``fmt`` (``lang=*/bucket=*/part-*`` for Arrow and
    Parquet), sorted: the files by the names a run gives them (:func:`written_name`; a user's
    ``my_crawl_2024.json.gz`` beside a JSON corpus matches the glob, and was counted and read as one)."""
    return [path for path in fs.match_optional(output, *shard_glob(fmt)) if written_name(fs.relative(path, output))]


def missing_shards(output: str) -> str | None:
    """How a finished corpus's shard files fall short of the count its ``stats.json`` records (shards
    removed by hand or a copy cut short: a reader would see a smaller corpus than stats.json and
    sampling.json describe), or None when they are all there, or there is no stats.json to say
    (none, or one that is not ours: what reads it says so)."""
    stats_path = fs.join(output, ARTIFACTS[0])
    try:
        stats = fs.read_json(stats_path, ("config", "counters")) if fs.exists(stats_path) else None
        fmt = stats["config"].get("write", {}).get("format", "arrow") if stats else None
        expected = int(stats["counters"].get("write", {}).get("shards", 0)) if stats else 0
    except (UserError, AttributeError, TypeError, ValueError):
        return None
    if fmt not in FORMATS:
        return None
    found = len([p for p in shard_files(output, fmt) if p.endswith(FORMATS[fmt])])
    if found >= expected:
        return None
    return (f"{expected - found} of the {expected} shards {stats_path} counts are missing ({found} found under "
            f"{shard_pattern(output, fmt)}): removed, or not copied whole")


def records_path(output: str, folder: str, part: int) -> str:
    """Part ``part`` of a record folder (``rejected`` or ``removed/<step>``)."""
    return fs.join(output, folder, f"part-{part:05d}.jsonl")


def removed_folder(step: str) -> str:
    """Where step ``step`` writes what it removed, relative to the corpus folder."""
    return f"{REMOVED}/{step}"


def record_files(output: str) -> list[str]:
    """Every record part file of a corpus folder (rejected/ and removed/<step>/)."""
    return fs.match_optional(output, REJECTED, "part-*") + fs.match_optional(output, REMOVED, "*", "part-*")


_WRITTEN = re.compile(r"(lang=[^/]+/bucket=[^/]+/part-\d{5,}\.(arrow|parquet)|[^/]+_(head|middle|tail|all)_\d{4,}\.json\.gz"
                      rf"|{REJECTED}/part-\d{{5,}}\.jsonl|{REMOVED}/[^/]+/part-\d{{5,}}\.jsonl)")


def written_name(relative: str) -> bool:
    """Whether a path below a corpus folder (relative, with ``/``) is a shard or record part file
    by the name a run gives it (:func:`shard_path`, :func:`records_path`): a user's
    ``my_web_crawl.json.gz`` matches the globs of :func:`shard_files`, not this."""
    return bool(_WRITTEN.fullmatch(relative))
