"""How the DaskRunner's shuffle grows with the number of input files: files written and pieces read.

Input: N small WET files (one record each, taken in turn from the bundled sample, so every file
is a real WET file), for each N given. Each N runs the sample profile (read, exact dedup, LID,
near-dup, shards) as ``python -m pipeline run --runner DaskRunner --dask_num_workers 2`` in a
child process, and prints what its run.json records: stage tasks, and the files the stages
wrote for one another (the shuffle), the pieces they read and the bytes. Before partitions were
set per worker thread, each input file was a partition (up to 1,024): every stage wrote a file per
input file, and a shuffle's reader read a piece of each.

    .venv/bin/python workflows/bench_shuffle.py [--files 8,1000] [--work out/bench/shuffle]
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator
from warcio.warcwriter import WARCWriter

ROOT = Path(__file__).resolve().parents[1]


def records(sample: Path) -> list[tuple[str, bytes]]:
    """The sample's WET conversion records: (URI, text)."""
    found = []
    for path in sorted(sample.glob("*.warc.wet.gz")):
        with path.open("rb") as stream:
            for record in ArchiveIterator(stream):
                if record.rec_type == "conversion":
                    found.append((record.rec_headers.get_header("WARC-Target-URI"), record.content_stream().read()))
    return found


def write_inputs(folder: Path, n: int, pool: list[tuple[str, bytes]]) -> None:
    """``n`` WET files of one record each, the pool's records in turn (a new id each)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        uri, payload = pool[i % len(pool)]
        with (folder / f"tiny-{i:06d}.warc.wet.gz").open("wb") as out:
            writer = WARCWriter(out, gzip=True)
            record = writer.create_warc_record(f"{uri}#{i}", "conversion", payload=io.BytesIO(payload),
                                               warc_headers_dict={"WARC-Record-ID": f"<urn:uuid:{i:08d}-0000-0000-0000-000000000000>",
                                                                  "Content-Type": "text/plain"})
            writer.write_record(record)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default="8,1000", help="comma-separated input file counts")
    parser.add_argument("--per-file", action="store_true",
                        help="also run each N as the runner did before: one partition per input file (up to 1,024)")
    parser.add_argument("--work", default=str(ROOT / "out" / "bench" / "shuffle"))
    args = parser.parse_args()
    counts = [int(n) for n in args.files.split(",")]
    if not counts or min(counts) < 1:
        parser.error("--files: positive counts")
    work = Path(args.work).resolve()  # its runs go in the repository's root
    pool = records(ROOT / "tests" / "data" / "sample" / "wet")
    print(f"{'input files':>12} {'tasks':>6} {'files':>7} {'reads':>8} {'MB':>7} {'time s':>7}")
    for n in counts:
        shutil.rmtree(work / str(n), ignore_errors=True)
        write_inputs(work / str(n) / "in", n, pool)
        for label, extra in [("", []), *([(" per file", [f"--dask_npartitions={min(n, 1024)}"])] if args.per_file else [])]:
            out = work / str(n) / "out"
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pipeline", "run", "--no-progress", "--config", "configs/corpus/sample.yaml",
                            "--input", str(work / str(n) / "in" / "*.gz"), "--output", str(out),
                            "--set", "beam_options=[]", "--runner", "DaskRunner", "--dask_num_workers", "2", *extra],
                           cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            elapsed = time.perf_counter() - start
            tasks = json.loads((out / "run.json").read_text())["tasks"]
            print(f"{f'{n:,}{label}':>12} {tasks['total']:>6,} {tasks['files']:>7,} {tasks['reads']:>8,} "
                  f"{tasks['bytes'] / 2**20:>7.1f} {elapsed:>7.1f}", flush=True)
        shutil.rmtree(work / str(n), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
