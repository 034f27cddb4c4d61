"""How the corpus pipeline's time and memory grow with its input: 1x, 2x, 4x and 8x.

Input: varied copies of the bundled sample, in files of a fixed size whose number grows with the
input, as a CommonCrawl snapshot does (8 files at 1x, 64 at 8x). Every copy of a document has the
words of each of its longer paragraphs shuffled, so it is new text for both dedup stages; short
paragraphs (menus, boilerplate) are kept as they are, so the share of exact duplicate paragraphs
is the same at every size; and 10 % of the records are near copies of an earlier record of the
same input (a space doubled in every paragraph, one word added: exact dedup keeps them, MinHash
finds them), so the share of near duplicates is the same at every size too.

The full chain runs (read, exact dedup, LID, near-dup, perplexity with head/middle/tail buckets
from cutoffs computed on the 1x input) as ``python -m pipeline run`` in a child process, on
DirectRunner with 2 worker processes (with glibc's adaptive mmap threshold, and with
``--worker_mmap_threshold_mb=4``) and DaskRunner with a 2-worker LocalCluster. For each run:
wall time, documents/s per core, the peak RSS of the driver and of every worker process (sampled
every 0.2 s over the whole process tree), and the largest in-memory structure of the dedup stage
(the biggest hash partition: 16 bytes per paragraph occurrence). Neither runner reports bytes
shuffled; the dedup stage's shuffle (every partition) is computed the same way. Printed: time(2n)/time(n) (aim <= 2.2) and peak worker RSS at 8x / at 1x (aim <= 1.3);
written: ``--json`` (the numbers, read by workflows/capacity.py) and ``--plot`` (a PNG).

    .venv/bin/python workflows/bench_scaling.py [--base-mb 12.5] [--scales 1,2,4,8] [--work out/bench/scaling]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
from warcio.warcwriter import WARCWriter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "workflows"))

from bench_perplexity import ensure_models  # noqa: E402
from bench_pipeline import sample_records  # noqa: E402
from reference_data import near_copy  # noqa: E402

from pipeline.steps import dedup  # noqa: E402
from pipeline.readers.files import read_file  # noqa: E402
from pipeline.config import ReadConfig  # noqa: E402
from pipeline.output.layout import shard_files  # noqa: E402
from pipeline.steps.perplexity import compute_cutoffs, write_cutoffs  # noqa: E402

FILES_PER_SCALE = 8
NEAR_SHARE = 0.10
SHUFFLED_WORDS = 6  # paragraphs with at least this many words are shuffled in every copy
RUNNERS = {
    "DirectRunner 2 workers": ["--runner", "DirectRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
    "DaskRunner 2 workers": ["--runner", "DaskRunner", "--dask_num_workers=2"],
    "DirectRunner 2 workers (mmap threshold 4 MB)": ["--runner", "DirectRunner", "--direct_num_workers=2",
                                                             "--direct_running_mode=multi_processing",
                                                             "--worker_mmap_threshold_mb=4"],
}
CORES = 2


def shuffled(text: str, rng: random.Random) -> str:
    out = []
    for para in text.split("\n"):
        words = para.split(" ")
        if len(words) >= SHUFFLED_WORDS:
            rng.shuffle(words)
        out.append(" ".join(words))
    return "\n".join(out)


def build_scaled(folder: Path, scale: int, base_mb: float) -> list[str]:
    """``FILES_PER_SCALE * scale`` WET files of about ``base_mb / FILES_PER_SCALE`` MB (gzip) each."""
    stamp = folder / "done"
    if stamp.exists():
        return sorted(str(p) for p in folder.glob("*.warc.wet.gz"))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    records = sample_records(ROOT / "tests" / "data" / "sample")
    rng = random.Random(scale)
    n_files = FILES_PER_SCALE * scale
    file_bytes = base_mb * 2**20 / FILES_PER_SCALE
    written: list[str] = []
    for i in range(n_files):
        with open(folder / f"SCALE-{i:05d}.warc.wet.gz", "wb") as handle:
            writer = WARCWriter(handle, gzip=True)
            while handle.tell() < file_bytes:
                url, date, body = records[rng.randrange(len(records))]
                if written and rng.random() < NEAR_SHARE:
                    text = near_copy(written[rng.randrange(len(written))])
                else:
                    text = shuffled(body.decode("utf-8"), rng)
                    written.append(text)
                payload = text.encode("utf-8")
                headers = {"WARC-Target-URI": f"{url}?scaled={uuid.UUID(int=rng.getrandbits(128)).hex[:12]}",
                           "WARC-Date": date, "WARC-Record-ID": f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128))}>",
                           "Content-Type": "text/plain"}
                writer.write_record(writer.create_warc_record(headers["WARC-Target-URI"], "conversion",
                                                              payload=io.BytesIO(payload), warc_headers_dict=headers,
                                                              length=len(payload)))
    stamp.write_text("ok\n")
    return sorted(str(p) for p in folder.glob("*.warc.wet.gz"))


def dedup_partitions(files: list[str]) -> tuple[int, int]:
    """Bytes of the biggest hash partition the dedup stage groups (as the pipeline partitions), and
    of all of them together (what its GroupByKey shuffles)."""
    partitions = dedup.auto_partitions(len(files))
    sizes = np.zeros(partitions, dtype=np.int64)
    for path in files:
        docs = (r for r in read_file(path, ReadConfig()) if isinstance(r, dict))
        for part, table in dedup.Occurrences.of(docs).partitions(partitions):
            sizes[part] += len(table.hashes)
    return int(sizes.max()) * 16, int(sizes.sum()) * 16


class TreeMemory:
    """Peak RSS of a process and of each of its descendants, sampled every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.root, self.interval, self.peaks, self.parents = psutil.Process(pid), interval, {}, set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for proc in procs:
                try:
                    rss = proc.memory_info().rss
                    name = " ".join(proc.cmdline()[1:4])
                    self.parents.add(proc.ppid())
                except psutil.Error:
                    continue
                prev = self.peaks.get(proc.pid, (0, name))
                self.peaks[proc.pid] = (max(prev[0], rss), name)
            time.sleep(self.interval)

    def finish(self) -> tuple[int, list[int]]:
        """(driver peak, peaks of the worker processes: every descendant that is Python and starts
        no other, which leaves out a fork server)."""
        self.stop.set()
        self.thread.join()
        driver = self.peaks.get(self.root.pid, (0, ""))[0]
        workers = [rss for pid, (rss, _) in self.peaks.items() if pid not in self.parents and rss > 50 * 2**20]
        return driver, workers


def run(files: list[str], out: Path, runner: list[str], lms: Path, cutoffs: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipeline", "run", "--no-progress", "--config", "configs/corpus/sample.yaml",
           "--output", str(out), "--set", "beam_options=[]", "--set", "write.shard_size_mb=64",
           "--set", f"perplexity.models={lms}", "--set", f"perplexity.cutoffs={cutoffs}",
           *[a for f in files for a in ("--input", f)], *runner]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    memory = TreeMemory(proc.pid)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - start
    driver, workers = memory.finish()
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd[:8])} ...\n{stderr[-3000:]}")
    stats = json.loads((out / "stats.json").read_text())
    output = sum(os.path.getsize(p) for p in shard_files(str(out)))
    tasks = json.loads((out / "run.json").read_text()).get("tasks")  # the DaskRunner's shuffle
    shuffle = {"shuffle": {"partitions": tasks["partitions"], "shuffles": tasks["shuffles"], "files": tasks["files"],
                           "reads": tasks["reads"], "mb": round(tasks["bytes"] / 2**20, 1)}} if tasks else {}
    return {**shuffle, "wall_s": round(wall, 2), "output_mb": round(output / 2**20, 2), "documents": stats["counters"]["read"]["documents"],
            "kept": stats["counters"]["write"]["documents"], "driver_rss_mb": round(driver / 2**20, 1),
            "worker_rss_mb": sorted(round(w / 2**20, 1) for w in workers),
            "near_duplicates": stats["counters"]["near_dedup"]["documents_in"] - stats["counters"]["near_dedup"]["documents_out"]}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in results["runs"].items():
        mb = [r["input_mb"] for r in rows]
        ax_t.plot(mb, [r["wall_s"] for r in rows], marker="o", label=name)
        ax_m.plot(mb, [max(r["worker_rss_mb"]) for r in rows], marker="o", label=f"{name}: worker peak")
        ax_m.plot(mb, [r["driver_rss_mb"] for r in rows], marker="x", linestyle="--", label=f"{name}: driver peak")
    ideal = results["runs"][next(iter(results["runs"]))]
    ax_t.plot([r["input_mb"] for r in ideal], [ideal[0]["wall_s"] * r["scale"] for r in ideal], color="grey",
              linestyle=":", label="linear from 1x")
    ax_t.set(title="Wall time against input size", xlabel="input (MB of gzip WET)", ylabel="seconds")
    ax_m.set(title="Peak RSS per process", xlabel="input (MB of gzip WET)", ylabel="MB")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Corpus pipeline scaling (full chain, {CORES} worker processes)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-mb", type=float, default=12.5, help="input size at 1x (MB of gzip WET)")
    parser.add_argument("--scales", default="1,2,4,8", help="comma-separated multiples of --base-mb")
    parser.add_argument("--runners", default=",".join(RUNNERS), help=f"comma-separated, of: {', '.join(RUNNERS)}")
    parser.add_argument("--work", default=str(ROOT / "out" / "bench" / "scaling"))
    parser.add_argument("--json", default=str(ROOT / "docs" / "bench_scaling.json"), help="results file")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "bench_scaling.png"), help="PNG of time and RSS")
    args = parser.parse_args()
    try:
        scales = [int(s) for s in args.scales.split(",")]
    except ValueError:
        parser.error(f"--scales {args.scales!r}: expected comma-separated whole numbers, e.g. 1,2,4,8")
    if args.base_mb <= 0 or min(scales) < 1:
        parser.error("--base-mb must be positive and every scale at least 1")
    runners = [r.strip() for r in args.runners.split(",")]
    if [r for r in runners if r not in RUNNERS] or scales[0] != 1:
        parser.error(f"--runners must name {', '.join(RUNNERS)}; --scales must start at 1")
    work = Path(args.work).resolve()  # its runs go in the repository's root
    lms = work.parent / "lm"
    ensure_models(lms)
    inputs = {s: build_scaled(work / f"input-{s}x", s, args.base_mb) for s in scales}
    cutoffs = work / "cutoff.csv"
    if not cutoffs.exists():  # percentiles of the 1x input, scored once
        scored = work / "scored-1x"
        subprocess.run([sys.executable, "-m", "pipeline", "run", "--no-progress", "--config", "configs/corpus/sample.yaml",
                        "--output", str(scored), "--overwrite", "--set", f"perplexity.models={lms}",
                        *[a for f in inputs[1] for a in ("--input", f)]], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        write_cutoffs(compute_cutoffs(str(scored), 100_000, 0)[0], str(cutoffs))
    results: dict = {"base_mb": args.base_mb, "cores": CORES, "machine": f"{os.cpu_count()} cores", "runs": {}}
    for name in runners:
        rows = []
        for s in scales:
            mb = sum(os.path.getsize(f) for f in inputs[s]) / 2**20
            row = {"scale": s, "input_mb": round(mb, 1), "files": len(inputs[s]),
                   **run(inputs[s], work / "out" / f"{name.split()[0]}-{s}x", RUNNERS[name], lms, cutoffs)}
            row["docs_per_s_per_core"] = round(row["documents"] / row["wall_s"] / CORES, 1)
            rows.append(row)
            print(f"{name:44s} {s}x  {row['input_mb']:6.1f} MB {row['files']:3d} files {row['documents']:7d} docs  "
                  f"{row['wall_s']:7.1f} s  {row['docs_per_s_per_core']:6.1f} docs/s/core  driver {row['driver_rss_mb']:6.0f} MB  "
                  f"workers {', '.join(f'{w:.0f}' for w in row['worker_rss_mb'])} MB", flush=True)
        results["runs"][name] = rows
    for s in scales:
        largest, total = dedup_partitions(inputs[s])
        results.setdefault("largest_dedup_partition_mb", {})[str(s)] = round(largest / 2**20, 2)
        results.setdefault("dedup_shuffle_mb", {})[str(s)] = round(total / 2**20, 2)
    print("\nratios (aims: time(2n)/time(n) <= 2.2; worker peak RSS 8x/1x <= 1.3)")
    for name, rows in results["runs"].items():
        steps = ", ".join(f"{b['scale']}x/{a['scale']}x={b['wall_s'] / a['wall_s']:.2f}" for a, b in zip(rows, rows[1:]))
        rss = max(rows[-1]["worker_rss_mb"]) / max(rows[0]["worker_rss_mb"])
        print(f"  {name}: time {steps}; worker peak RSS {rows[-1]['scale']}x/1x={rss:.2f}")
    print("  largest dedup partition (MB): " + ", ".join(f"{k}x={v}" for k, v in results["largest_dedup_partition_mb"].items()))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    plot(results, Path(args.plot))
    print(f"results: {args.json}  plot: {args.plot}")


if __name__ == "__main__":
    main()
