"""Benchmark the corpus pipeline on every engine: the same graph and input on Beam's DirectRunner,
our DaskRunner (a LocalCluster started for the run) and Beam's portable job API, with 1 and 2
workers each where the engine has them.

The input is bench_pipeline.py's (varied copies of the bundled sample, >= 50 MB of gzip WET) and
the chain is the same: read -> exact dedup -> language ID -> Arrow shards. The runs take turns
``--repeat`` times, every other round in reverse order, and the best time of each counts. Printed:
seconds, documents/s, documents/s per core, the ratio to the named baseline (DirectRunner, 1
worker) and, per engine, the speed-up of 2 workers over 1. Every run's shards and stats are
checked to be byte-identical to the baseline's.

    .venv/bin/python workflows/bench_engines.py [--target-mb 50] [--work out/bench] [--repeat 3]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "workflows"))

from bench_pipeline import build_input  # noqa: E402
from warcio.archiveiterator import ArchiveIterator  # noqa: E402

from pipeline.output.layout import RUN_FILE  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.run import run_corpus  # noqa: E402

BASELINE = "DirectRunner 1 worker"
RUNS: dict[str, tuple[str, int, list[str]]] = {  # name: (engine, worker processes, Beam flags)
    BASELINE: ("DirectRunner", 1, []),
    "DirectRunner 2 workers": ("DirectRunner", 2, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]),
    "DaskRunner 1 worker": ("DaskRunner", 1, ["--dask_num_workers=1"]),
    "DaskRunner 2 workers": ("DaskRunner", 2, ["--dask_num_workers=2"]),
    "PortableRunner 1 SDK worker (embed LOOPBACK)": ("PortableRunner", 1, ["--job_endpoint=embed", "--environment_type=LOOPBACK"]),
}


def digest(out: Path) -> str:
    """One sha1 over every file the run wrote but run.json."""
    h = hashlib.sha1()
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != RUN_FILE:
            h.update(str(p.relative_to(out)).encode() + p.read_bytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-mb", type=float, default=50.0, help="size of the generated WET input (gzip MB)")
    parser.add_argument("--work", default=str(ROOT / "out" / "bench"), help="working directory")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every run; the best time of each counts")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated run names (default: all)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS]
    if unknown or BASELINE not in names:
        parser.error(f"--runs: unknown {unknown} or no {BASELINE!r}; known: {', '.join(RUNS)}")
    work = Path(args.work)
    inputs = build_input(ROOT / "tests" / "data" / "sample", work, args.target_mb)
    n_docs = sum(1 for p in inputs for r in ArchiveIterator(open(p, "rb")) if r.rec_type == "conversion")
    sets = ["progress=false", "write.shard_size_mb=64", "steps=[dedup, lid, perplexity]", "write.removed=false", "beam_options=[]"]

    best: dict[str, float] = {}
    digests: dict[str, str] = {}
    for round_ in range(args.repeat):  # interleaved, every other round in reverse (ABBA)
        for name in names if round_ % 2 == 0 else list(reversed(names)):
            engine, _, flags = RUNS[name]
            out = work / "engines" / f"{engine}-{RUNS[name][1]}"
            shutil.rmtree(out, ignore_errors=True)
            cfg = load_config("configs/corpus/sample.yaml", {"input": inputs, "output": str(out), "runner": engine}, sets)
            cfg.beam_options = flags
            seconds = run_corpus(cfg)["elapsed_s"]
            digests[name] = digest(out)
            print(f"round {round_ + 1}: {name}: {seconds:.1f} s", flush=True)
            best[name] = min(seconds, best.get(name, seconds))
    baseline = best[BASELINE]
    print(f"\n{n_docs} input documents, {sum(os.path.getsize(p) for p in inputs) / 2**20:.1f} MB gzip WET, "
          f"{os.cpu_count()} cores; read -> exact dedup -> LID -> Arrow shards; best of {args.repeat}")
    print(f"{'run':48} {'seconds':>8} {'docs/s':>8} {'docs/s/core':>12} {'vs baseline':>12} {'2 vs 1 worker':>14}")
    for name in names:
        engine, workers, _ = RUNS[name]
        rate = n_docs / best[name]
        one = next((best[n] for n in names if RUNS[n][0] == engine and RUNS[n][1] == 1), None)
        speedup = f"{one / best[name]:13.2f}x" if workers == 2 and one else ""
        print(f"{name:48} {best[name]:8.1f} {rate:8.0f} {rate / workers:12.0f} {baseline / best[name]:11.2f}x {speedup:>14}")
    same = all(d == digests[BASELINE] for d in digests.values())
    print(f"outputs byte-identical to the baseline's: {'yes' if same else 'NO: ' + str(digests)}")


if __name__ == "__main__":
    main()
