"""A capacity plan for one CommonCrawl snapshot, from the measured scaling benchmark.

Reads the numbers workflows/bench_scaling.py wrote (``docs/bench_scaling.json``; several files may
be given, each runner is then taken from the file where it ran on the largest input): the full
chain's throughput per core in MB of gzip WET, the peak RSS of a worker process, the output and
dedup-shuffle volume per MB of input, all at the largest input measured. Scales them to a
snapshot whose WET size and page count are inputs (default: CC-MAIN-2019-09, the snapshot CCNet's
paper processed, 64,000 WET files, 7.62 TiB gzip, 2.9 billion pages, as published in Common
Crawl's "February 2019 crawl archive now available" post) and prints, for a run of ``--hours``
hours on Dataflow and on a Dask cluster: CPU-hours, worker count, memory per worker, shuffle
volume, output size and cost at the prices given (the defaults are examples to replace with your
provider's price list, not facts).

    .venv/bin/python workflows/capacity.py [--results docs/bench_scaling.json ...] [--hours 24] [--out docs/capacity.md]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIB = 2**40
MB = 2**20


def measured(results: dict, runner: str) -> dict:
    """Per-core rates and per-MB volumes of ``runner`` at the largest input measured."""
    row = results["runs"][runner][-1]
    scale = str(row["scale"])
    cores = results["cores"]
    return {
        "mb_per_core_s": row["input_mb"] / row["wall_s"] / cores,
        "docs_per_core_s": row["documents"] / row["wall_s"] / cores,
        "mb_per_doc": row["input_mb"] / row["documents"],
        "worker_rss_mb": max(row["worker_rss_mb"]),
        "output_per_input": row["output_mb"] / row["input_mb"],
        "dedup_shuffle_per_input": results["dedup_shuffle_mb"][scale] / row["input_mb"],
        "input_mb": row["input_mb"], "scale": row["scale"],
    }


def plan(m: dict, wet_bytes: float, pages: float, hours: float, vcpus_per_worker: int, headroom: float) -> dict:
    cpu_hours = wet_bytes / MB / m["mb_per_core_s"] / 3600
    cores = math.ceil(cpu_hours / hours)
    workers = math.ceil(cores / vcpus_per_worker)
    return {
        "cpu_hours": cpu_hours,
        "cpu_hours_by_pages": pages / m["docs_per_core_s"] / 3600,
        "cores": cores, "workers": workers,
        "memory_per_worker_gb": m["worker_rss_mb"] * vcpus_per_worker * headroom / 1024,
        "shuffle_tib": wet_bytes * m["dedup_shuffle_per_input"] / TIB,
        "output_tib": wet_bytes * m["output_per_input"] / TIB,
    }


def dask_shuffle(results: dict, wet_bytes: float, args: argparse.Namespace) -> list[str]:
    """The DaskRunner's shuffle folder at the snapshot's size: its disk (the stages' files, all kept
    until the run ends, in proportion to the input) and its reads (each GroupByKey reads a piece
    of every partition's file for every output partition: at most partitions^2, whatever the
    number of input files), from the largest measured Dask run that recorded them."""
    rows = [r for r in results["runs"].get("DaskRunner 2 workers", []) if "shuffle" in r]
    if not rows:
        return []
    row, m = rows[-1], measured(results, "DaskRunner 2 workers")
    s = row["shuffle"]
    cores = plan(m, wet_bytes, args.pages, args.hours, args.vcpus, args.headroom)["cores"]
    partitions = min(1024, 4 * cores)  # TASKS_PER_THREAD per worker thread, at most MAX_CREATE_PARTITIONS
    return ["", f"Dask's shuffle folder (`--temp_location`): measured at {row['input_mb']} MB, {s['mb']:,} MB of "
            f"stage files ({s['mb'] / row['input_mb']:.2f} MB per MB of input), {s['files']:,} files and {s['reads']:,} "
            f"piece reads over {s['shuffles']} GroupByKeys at {s['partitions']} partitions "
            f"({s['reads'] / max(1, s['shuffles']):,.0f} reads per GroupByKey). At the snapshot's size: "
            f"{wet_bytes * s['mb'] / row['input_mb'] / TIB:.2f} TiB of disk at the peak (the end of the run), and "
            f"{partitions:,} partitions (4 per core of {cores:,}), so at most {partitions ** 2:,} reads and "
            f"{partitions:,} files per GroupByKey, whatever the number of WET files (1,000 and 90,000 WET files "
            f"gave the same tasks as 8 at 2 workers: BENCHMARKS.md)."] + partition_memory(rows, wet_bytes, partitions)


def partition_memory(rows: list[dict], wet_bytes: float, partitions: int) -> list[str]:
    """What the measured growth of a worker's peak memory with the input per partition says for the
    snapshot: a stage reads its partition's piece of a shuffle, and a GroupByKey groups it, in memory."""
    first, last = rows[0], rows[-1]
    per_part = [r["input_mb"] / r["shuffle"]["partitions"] for r in (first, last)]
    rss = [max(r["worker_rss_mb"]) for r in (first, last)]
    if per_part[1] <= per_part[0]:  # one size measured, or no more WET per partition
        return []
    snapshot = wet_bytes / MB / partitions
    slope = (rss[1] - rss[0]) / (per_part[1] - per_part[0])
    return ["", f"Memory per partition: a stage reads its partition's piece of a shuffle, and a GroupByKey groups it, "
            f"in memory, so a worker's peak grows with the WET per partition: {rss[0]:,.0f} MB at {per_part[0]:,.1f} MB "
            f"per partition, {rss[1]:,.0f} MB at {per_part[1]:,.1f} MB (about {slope:.1f} MB of memory per MB of WET "
            f"per partition). The memory per worker above is the peak at {per_part[1]:,.1f} MB; at the snapshot's "
            f"size each of {partitions:,} partitions holds {snapshot:,.0f} MB, {snapshot / per_part[1]:,.0f}x that, "
            f"about {rss[0] + slope * (snapshot - per_part[0]):,.0f} MB by the same slope. Keeping to the measured "
            f"peak needs {math.ceil(wet_bytes / MB / per_part[1]):,} partitions (`--dask_npartitions`), whose "
            f"GroupByKeys would read up to their square in pieces: a snapshot on the DaskRunner needs a reader that "
            f"streams its pieces (not built; Dataflow's and Flink's shuffles do)."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", nargs="+", default=[str(ROOT / "docs" / "bench_scaling.json")],
                        help="bench_scaling.py's results; per runner, the file with its largest input counts")
    parser.add_argument("--wet-tib", type=float, default=7.62, help="gzip WET size of the snapshot (TiB)")
    parser.add_argument("--pages", type=float, default=2.9e9, help="pages (WET records) in the snapshot")
    parser.add_argument("--snapshot", default="CC-MAIN-2019-09")
    parser.add_argument("--hours", type=float, default=24.0, help="wall-clock target")
    parser.add_argument("--vcpus", type=int, default=4, help="vCPUs per worker machine (one SDK/Dask process each)")
    parser.add_argument("--headroom", type=float, default=1.5, help="memory per process = measured peak x this")
    parser.add_argument("--dataflow-vcpu-hour", type=float, default=0.056, help="example price, $ per vCPU-hour")
    parser.add_argument("--dataflow-gb-hour", type=float, default=0.003557, help="example price, $ per GB-hour")
    parser.add_argument("--dataflow-shuffle-gb", type=float, default=0.011, help="example price, $ per GB shuffled")
    parser.add_argument("--vm-vcpu-hour", type=float, default=0.031611, help="example VM price for Dask, $ per vCPU-hour")
    parser.add_argument("--vm-gb-hour", type=float, default=0.004237, help="example VM price for Dask, $ per GB-hour")
    parser.add_argument("--out", help="also write the plan (Markdown) here")
    args = parser.parse_args()
    for flag in ("wet_tib", "pages", "hours", "vcpus", "headroom"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    by_runner: dict[str, dict] = {}  # runner -> the results file where it ran on the largest input
    for path in args.results:
        try:
            results = json.loads(Path(path).read_text())
            runs = results["runs"]
            if not runs or any(not rows for rows in runs.values()):
                raise KeyError("runs")
        except FileNotFoundError:
            parser.error(f"--results {path}: no such file (workflows/bench_scaling.py writes it)")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            parser.error(f"--results {path}: not bench_scaling.py's results ({type(exc).__name__}: {exc})")
        for runner, rows in runs.items():
            if runner not in by_runner or rows[-1]["input_mb"] > by_runner[runner]["runs"][runner][-1]["input_mb"]:
                by_runner[runner] = results
    first = next(iter(by_runner.values()))
    wet = args.wet_tib * TIB
    lines = [f"# Capacity plan: {args.snapshot} ({args.wet_tib} TiB gzip WET, {args.pages:.3g} pages) in {args.hours:g} h",
             "",
             f"Measured by workflows/bench_scaling.py on {first['cores']} worker processes ({first['machine']}); "
             "rates from each runner's largest input ("
             + ", ".join(f"{runner}: {results['runs'][runner][-1]['input_mb']} MB" for runner, results in by_runner.items())
             + "). Prices are inputs (examples), not facts.", ""]
    lines += ["| engine (measured runner) | MB/s per core | CPU-hours | cores | workers x vCPUs | memory per worker | "
              "dedup shuffle | output | cost |", "|---|---|---|---|---|---|---|---|---|"]
    for engine, runner in (("Dataflow", "DirectRunner 2 workers"), ("Dask cluster", "DaskRunner 2 workers")):
        if runner not in by_runner:
            continue
        m = measured(by_runner[runner], runner)
        p = plan(m, wet, args.pages, args.hours, args.vcpus, args.headroom)
        mem_gb = p["memory_per_worker_gb"]
        if engine == "Dataflow":
            cost = (p["workers"] * args.vcpus * args.hours * args.dataflow_vcpu_hour
                    + p["workers"] * mem_gb * args.hours * args.dataflow_gb_hour
                    + p["shuffle_tib"] * 1024 * args.dataflow_shuffle_gb)
        else:
            cost = p["workers"] * args.hours * (args.vcpus * args.vm_vcpu_hour + mem_gb * args.vm_gb_hour)
        lines.append(f"| {engine} ({runner}) | {m['mb_per_core_s']:.2f} | {p['cpu_hours']:,.0f} "
                     f"(by pages: {p['cpu_hours_by_pages']:,.0f}) | {p['cores']:,} | {p['workers']:,} x {args.vcpus} | "
                     f"{mem_gb:.1f} GB | {p['shuffle_tib']:.2f} TiB | {p['output_tib']:.2f} TiB | ${cost:,.0f} |")
    lines += ["",
              "CPU-hours come from the measured MB of gzip WET per core-second; \"by pages\" divides the page count "
              "by the measured documents per core-second instead (our benchmark documents are shorter than an average "
              "CommonCrawl page, so the byte rate is the better guide). Memory per worker is one process per vCPU "
              "at its measured peak RSS times the headroom. The dedup shuffle is the paragraph-hash occurrences "
              "(16 bytes each); the near-dup stage shuffles LSH band hashes in addition: per document 14 bytes a band, "
              "plus its id and signature (num_perm x 4 bytes) once for each band-hash partition its bands fall in "
              "(at most bands: about 3.3 KB a document at 128 permutations, 9 bands and 8 partitions, about "
              "5.2 KB at 4,096 partitions). Dataflow adds its own per-job overhead; a Dask cluster adds a scheduler machine."]
    if "DaskRunner 2 workers" in by_runner:
        lines += dask_shuffle(by_runner["DaskRunner 2 workers"], wet, args)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
