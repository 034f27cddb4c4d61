"""Benchmark the corpus pipeline on every engine: the same graph and input on Beam's DirectRunner,
our DaskRunner (a LocalCluster started for the run), Beam's portable job API, Beam's Prism runner
(the binary set-up built; its one SDK worker in this process or from Beam's worker pool), and Beam's FlinkRunner
and SparkRunner on clusters started on 127.0.0.1 for the benchmark (workflows/clusters.py: a Flink
session cluster with 2 slots, Spark standalone clusters of 1 and 2 cores, SDK workers from Beam's
worker pool), with 1 and 2 workers each where the engine has them.

The input is bench_pipeline.py's (varied copies of the bundled sample, >= 50 MB of gzip WET) and
the chain is the same: read -> exact dedup -> language ID -> Arrow shards. The runs take turns
``--repeat`` times, every other round in reverse order, and the best time of each counts. Printed:
seconds, documents/s, documents/s per core, the ratio to the named baseline (DirectRunner, 1
worker) and, per engine, the speed-up of 2 workers over 1. Every run's shards and stats are
checked to be byte-identical to the baseline's. For the best run of each, the CPU seconds its
processes used (every process on the machine, sampled every 0.5 s at about 2 % of one core):
Java (the Flink/Spark cluster and Beam's job server) against Python (this driver and the SDK
workers), and the share of the machine's cores that were busy: where a 2-core machine's time went.

    .venv/bin/python workflows/bench_engines.py [--target-mb 50] [--work out/bench] [--repeat 3]
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "workflows"))

import clusters  # noqa: E402
from bench_pipeline import CpuUse, build_input  # noqa: E402
from warcio.archiveiterator import ArchiveIterator  # noqa: E402

from pipeline.output.layout import RUN_FILE  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.run import run_corpus  # noqa: E402

BASELINE = "DirectRunner 1 worker"
Flags = list[str] | Callable[["Clusters"], list[str]]
RUNS: dict[str, tuple[str, int, Flags]] = {  # name: (engine, worker processes, Beam flags)
    BASELINE: ("DirectRunner", 1, []),
    "DirectRunner 2 workers": ("DirectRunner", 2, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]),
    "DaskRunner 1 worker": ("DaskRunner", 1, ["--dask_num_workers=1"]),
    "DaskRunner 2 workers": ("DaskRunner", 2, ["--dask_num_workers=2"]),
    "PortableRunner 1 SDK worker (embed LOOPBACK)": ("PortableRunner", 1, ["--job_endpoint=embed", "--environment_type=LOOPBACK"]),
    "PrismRunner 1 SDK worker (LOOPBACK)": ("PrismRunner", 1, []),
    "PrismRunner 1 SDK worker process (EXTERNAL pool)": ("PrismRunner", 1, lambda c: c.pool_flags()),
    "FlinkRunner 1 SDK worker (parallelism 1)": ("FlinkRunner", 1, lambda c: c.flags("FlinkRunner", 1)),
    "FlinkRunner 2 SDK workers (parallelism 2)": ("FlinkRunner", 2, lambda c: c.flags("FlinkRunner", 2)),
    "SparkRunner 1 SDK worker (1 core)": ("SparkRunner", 1, lambda c: c.flags("SparkRunner", 1)),
    "SparkRunner 2 SDK workers (2 cores)": ("SparkRunner", 2, lambda c: c.flags("SparkRunner", 2)),
}


class Clusters(contextlib.ExitStack):
    """The Flink and Spark clusters and the worker pool, each started when a run first needs it."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root, self.started = root, {}

    def _get(self, key: str, make: Callable):
        if key not in self.started:
            self.started[key] = self.enter_context(make(self.root / key))
        return self.started[key]

    def pool_flags(self) -> list[str]:
        """SDK workers from Beam's worker pool, for a runner with no cluster (Prism)."""
        return ["--environment_type=EXTERNAL", f"--environment_config={self._get('pool', clusters.WorkerPool).address}"]

    def flags(self, engine: str, workers: int) -> list[str]:
        pool = self._get("pool", clusters.WorkerPool)
        cluster = (self._get("flink", lambda root: clusters.FlinkCluster(root, slots=2)) if engine == "FlinkRunner" else
                   self._get(f"spark-{workers}", lambda root: clusters.SparkCluster(root, cores=workers)))
        return clusters.flags(engine, cluster, pool, workers)


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
    if any(RUNS[n][0] in ("FlinkRunner", "SparkRunner") for n in names) and (why := clusters.missing()):
        parser.error(f"Flink/Spark runs: {why}; leave them out with --runs")
    work = Path(args.work).resolve()  # Flink's and Spark's SDK workers run in other folders
    inputs = build_input(ROOT / "tests" / "data" / "sample", work, args.target_mb)
    n_docs = sum(1 for p in inputs for r in ArchiveIterator(open(p, "rb")) if r.rec_type == "conversion")
    sets = ["progress=false", "write.shard_size_mb=64", "steps=[dedup, lid, perplexity]", "write.removed=false", "beam_options=[]"]

    best: dict[str, float] = {}
    use: dict[str, str] = {}  # CPU use of the best run
    digests: dict[str, str] = {}
    with Clusters(Path(tempfile.mkdtemp(prefix="clusters-", dir=work))) as started:
        for round_ in range(args.repeat):  # interleaved, every other round in reverse (ABBA)
            for name in names if round_ % 2 == 0 else list(reversed(names)):
                engine, _, flags = RUNS[name]
                out = work / "engines" / f"{engine}-{RUNS[name][1]}"
                shutil.rmtree(out, ignore_errors=True)
                cfg = load_config("configs/corpus/sample.yaml", {"input": inputs, "output": str(out), "runner": engine}, sets)
                cfg.beam_options = flags(started) if callable(flags) else flags
                with CpuUse() as cpu:
                    seconds = run_corpus(cfg)["elapsed_s"]
                digests[name] = digest(out)
                print(f"round {round_ + 1}: {name}: {seconds:.1f} s ({cpu.describe()})", flush=True)
                if seconds < best.get(name, float("inf")):
                    best[name], use[name] = seconds, cpu.describe()
    baseline = best[BASELINE]
    print(f"\n{n_docs} input documents, {sum(os.path.getsize(p) for p in inputs) / 2**20:.1f} MB gzip WET, "
          f"{os.cpu_count()} cores; read -> exact dedup -> LID -> Arrow shards; best of {args.repeat}")
    print(f"{'run':48} {'seconds':>8} {'docs/s':>8} {'docs/s/core':>12} {'vs baseline':>12} {'2 vs 1 worker':>14}")
    for name in names:
        engine, workers, _ = RUNS[name]
        rate = n_docs / best[name]
        one = next((best[n] for n in names if RUNS[n][0] == engine and RUNS[n][1] == 1), None)
        speedup = f"{one / best[name]:13.2f}x" if workers == 2 and one else ""
        print(f"{name:48} {best[name]:8.1f} {rate:8.0f} {rate / workers:12.0f} {baseline / best[name]:11.2f}x {speedup:>14}"
              f"   {use[name]}")
    same = all(d == digests[BASELINE] for d in digests.values())
    print(f"outputs byte-identical to the baseline's: {'yes' if same else 'NO: ' + str(digests)}")


if __name__ == "__main__":
    main()
