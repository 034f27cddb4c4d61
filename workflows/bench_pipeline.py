"""Benchmark the corpus pipeline: Beam (1 and 2 workers) against a plain single-process loop and
against datatrove 0.10.1's same chain.

Builds >= 50 MB (gzip) of CommonCrawl-format WET by repeating the bundled sample with varied
text (every copy gets new record ids and URLs, and one word per paragraph swapped, so most
paragraphs stay unique while boilerplate stays duplicated, as in a crawl), then runs
read -> exact paragraph dedup -> language ID -> columnar files five ways and prints documents/s,
documents/s per core and the ratios:
  * the single-process loop (baseline): the same step functions with in-memory dedup (the floor
    Beam adds its overhead to);
  * ``pipeline run``, DirectRunner, 1 and 2 workers (Arrow shards);
  * datatrove 0.10.1, ``LocalPipelineExecutor`` with 1 and 2 workers, a task per input file:
    ``WarcReader`` -> ``SentenceDedupSignature``; ``SentenceFindDedups``; ``WarcReader`` ->
    ``SentenceDedupFilter`` -> ``LanguageFilter`` -> ``ParquetWriter``, sentence dedup set to
    whole lines (``split_sentences=False, n_sentences=1``: CCNet's paragraphs), no minimum words,
    LID on the same ``lid.176`` model with the same threshold (its logs go to ``WORK/datatrove.log``).
The runs take turns ``--repeat`` times, every other round in reverse order, and the best time of
each counts, as timeit does: on a shared machine a slow spell otherwise decides the ratio.

    .venv/bin/python workflows/bench_pipeline.py [--target-mb 50] [--work out/bench] [--repeat 3]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import io
import os
import random
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import psutil
from warcio.archiveiterator import ArchiveIterator
from warcio.warcwriter import WARCWriter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config import load_config  # noqa: E402
from pipeline.output import layout, shards  # noqa: E402
from pipeline.readers.warc import RecordReader  # noqa: E402
from pipeline.run import run_corpus  # noqa: E402
from pipeline.steps import dedup  # noqa: E402
from pipeline.steps.base import Drop  # noqa: E402
from pipeline.steps.lid import LanguageIdentifier  # noqa: E402

STEPS = "[dedup, lid]"  # the chain every run does: read -> exact dedup -> LID -> columnar files


def sample_records(sample: Path) -> list[tuple[str, str, bytes]]:
    records = []
    for path in sorted(sample.glob("wet/*.warc.wet.gz")):
        with open(path, "rb") as f:
            for r in ArchiveIterator(f):
                if r.rec_type == "conversion":
                    records.append((r.rec_headers.get_header("WARC-Target-URI"),
                                    r.rec_headers.get_header("WARC-Date"), r.content_stream().read()))
    return records


def vary(text: str, rng: random.Random) -> str:
    """Swap one word per paragraph with another word of the same document."""
    paragraphs = text.split("\n")
    words = text.split()
    out = []
    for para in paragraphs:
        tokens = para.split(" ")
        if len(tokens) > 3:
            tokens[rng.randrange(len(tokens))] = rng.choice(words)
        out.append(" ".join(tokens))
    return "\n".join(out)


class CpuUse(threading.Thread):
    """CPU seconds by kind of process (``java``, ``python``, ``other``) while it runs, and the busy
    share of all cores. A process is sampled every ``interval`` s: one that ends between two
    samples loses at most that much of its CPU time."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval, self.done = interval, threading.Event()
        self.start_cpu: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self.machine = psutil.cpu_times()

    def sample(self) -> dict[int, tuple[str, float]]:
        seen = {}
        for proc in psutil.process_iter(["name", "cpu_times"]):
            times, name = proc.info["cpu_times"], proc.info["name"] or ""
            if times is not None:
                kind = "java" if name == "java" else "python" if name.startswith("python") else "other"
                seen[proc.pid] = kind, times.user + times.system
        return seen

    def __enter__(self) -> "CpuUse":
        self.start_cpu = {pid: cpu for pid, (_, cpu) in self.sample().items()}
        self.machine = psutil.cpu_times()
        self.start()
        return self

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self.last.update(self.sample())

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.join()
        self.last.update(self.sample())
        now = psutil.cpu_times()
        busy = [sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in (self.machine, now)]
        self.busy_share = (busy[1] - busy[0]) / ((sum(now) - sum(self.machine)) or 1)
        self.by_kind: dict[str, float] = {}
        for pid, (kind, cpu) in self.last.items():
            self.by_kind[kind] = self.by_kind.get(kind, 0.0) + cpu - self.start_cpu.get(pid, 0.0)

    def describe(self) -> str:
        kinds = ", ".join(f"{kind} {self.by_kind.get(kind, 0.0):.0f}" for kind in ("python", "java", "other"))
        return f"CPU s: {kinds}; cores busy {self.busy_share:.0%}"


def build_input(sample: Path, work: Path, target_mb: float, files: int = 8) -> list[str]:
    """Write varied copies of the sample as ``files`` WET files totalling >= target_mb (gzip)."""
    stamp = work / f"input-{target_mb:g}mb.done"
    inputs = sorted(glob.glob(str(work / "input" / "*.warc.wet.gz")))
    if stamp.exists() and inputs:
        print(f"reusing benchmark input: {len(inputs)} files in {work / 'input'}")
        return inputs
    shutil.rmtree(work / "input", ignore_errors=True)
    (work / "input").mkdir(parents=True)
    records = sample_records(sample)
    rng = random.Random(1234)
    handles = [open(work / "input" / f"BENCH-{i:05d}.warc.wet.gz", "wb") for i in range(files)]
    writers = [WARCWriter(h, gzip=True) for h in handles]
    copy, written = 0, 0
    while sum(h.tell() for h in handles) < target_mb * 2**20:
        for n, (url, date, body) in enumerate(records):
            text = body.decode("utf-8") if copy == 0 else vary(body.decode("utf-8"), rng)
            payload = text.encode("utf-8")
            headers = {"WARC-Target-URI": f"{url}?copy={copy}", "WARC-Date": date,
                       "WARC-Record-ID": f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128))}>",
                       "Content-Type": "text/plain"}
            record = writers[written % files].create_warc_record(
                headers["WARC-Target-URI"], "conversion", payload=io.BytesIO(payload),
                warc_headers_dict=headers, length=len(payload))
            writers[written % files].write_record(record)
            written += 1
        copy += 1
    for h in handles:
        h.close()
    stamp.write_text("ok\n")
    total = sum(os.path.getsize(p) for p in glob.glob(str(work / "input" / "*.gz")))
    print(f"built benchmark input: {written} documents, {total / 2**20:.1f} MB gzip in {work / 'input'}")
    return sorted(glob.glob(str(work / "input" / "*.warc.wet.gz")))


def after_dedup(inputs: list[str], cfg) -> Iterator[dict]:
    """read -> exact dedup (one in-memory partition), with the pipeline's step functions."""
    files = []
    for path in inputs:
        with open(path, "rb") as f:
            files.append([r for r in RecordReader(path, "wet", cfg.read.verify_digests).read(f) if isinstance(r, dict)])
    dedup_cfg = cfg.section("dedup")
    removed = dedup.duplicates([(i, dedup.Occurrences.of(docs)) for i, docs in enumerate(files)], dedup_cfg.policy)
    for i, docs in enumerate(files):
        index = dedup.removal_index([removed[i]] if i in removed else [])
        for ordinal, doc in enumerate(docs):
            kept = dedup.remove_paragraphs(doc, index.get(ordinal, ()), dedup_cfg.min_length)
            if not isinstance(kept, Drop):
                yield kept


def deduplicated(inputs: list[str], cfg) -> Iterator[dict]:
    """read -> exact dedup (one in-memory partition) -> LID, with the pipeline's step functions."""
    lid = LanguageIdentifier(cfg.section("lid"))
    for doc in after_dedup(inputs, cfg):
        kept = lid(doc)
        if not isinstance(kept, Drop):
            yield kept


SAMPLE_CONFIG = ROOT / "configs" / "corpus" / "sample.yaml"


def bench_sets(workers: int, steps: str, extra: list[str] = ()) -> list[str]:
    """The ``--set`` overrides of the sample profile every benchmark run uses: ``steps`` (and
    ``extra`` settings), on the DirectRunner with ``workers`` processes; no removed/ (it costs about
    3 %, BENCHMARKS.md), shards of 64 MB."""
    beam = "[]" if workers == 1 else f"[--direct_num_workers={workers}, --direct_running_mode=multi_processing]"
    return ["progress=false", "write.shard_size_mb=64", f"steps={steps}", "write.removed=false",
            f"beam_options={beam}", *extra]


def bench_config(inputs: list[str], out: str, workers: int, steps: str, extra: list[str] = ()):
    """The config of :func:`bench_sets` on ``inputs``, written to ``out``."""
    return load_config(str(SAMPLE_CONFIG), {"input": inputs, "output": out}, bench_sets(workers, steps, extra))


def single_process_loop(inputs: list[str], out: Path, cfg) -> int:
    """read -> exact dedup (one in-memory partition) -> LID -> shards, with the pipeline's step functions."""
    partitions = collections.defaultdict(list)
    for kept in deduplicated(inputs, cfg):
        partitions[(kept["lang"], "all")].append(kept)  # no perplexity step: bucket all
    target = int(cfg.write.shard_size_mb * 2**20)
    written = 0
    for (lang, bucket), part in partitions.items():
        n = shards.shard_count(sum(len(d["text"].encode()) for d in part), target)
        by_shard = collections.defaultdict(list)
        for doc in part:
            by_shard[shards.shard_of_id(doc["id"], n)].append(doc)
        for shard, docs in by_shard.items():
            table = shards.shard_table([shards.docs_to_table(docs)])
            shards.write_table(table, layout.shard_path(str(out), lang, bucket, shard, "arrow"), "arrow")
            written += len(docs)
    return written


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send file descriptor 2 (this process's and its children's) to ``path`` for a while."""
    saved = os.dup(2)
    with open(path, "ab") as log:
        sys.stderr.flush()
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def datatrove_chain(inputs: list[str], out: Path, workers: int, cfg) -> int:
    """datatrove 0.10.1's read -> paragraph dedup -> LID -> Parquet over ``inputs`` (one folder), a task
    per file on ``workers`` processes; returns the documents written."""
    import pyarrow.parquet as pq
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.sentence_dedup import (SentDedupConfig, SentenceDedupFilter,
                                                         SentenceDedupSignature, SentenceFindDedups)
    from datatrove.pipeline.filters import LanguageFilter
    from datatrove.pipeline.readers import WarcReader
    from datatrove.pipeline.writers import ParquetWriter
    from datatrove.utils import _import_utils

    folder = os.path.dirname(inputs[0])
    if any(os.path.dirname(path) != folder for path in inputs):
        raise ValueError("datatrove's reader takes one folder: every input must lie in it")
    lines = SentDedupConfig(n_sentences=1, split_sentences=False, min_doc_words=0, min_num_sentences=0)
    # datatrove asks for the distribution fasttext-numpy2-wheel; ours, fasttext-numpy2, is the same
    # `fasttext` module: count it as that. Its workers are forked, so they inherit this.
    installed = _import_utils._is_distribution_available
    _import_utils._is_distribution_available = lambda name: installed(
        "fasttext-numpy2" if name == "fasttext-numpy2-wheel" else name)
    lid = LanguageFilter(language_threshold=cfg.section("lid").threshold)
    lid.model.MODEL_URL = LanguageIdentifier(cfg.section("lid")).model_path  # lid.176 from our wheel, no download

    def run(name: str, tasks: int, *pipeline) -> None:
        LocalPipelineExecutor(list(pipeline), tasks=tasks, workers=min(workers, tasks),
                              logging_dir=str(out / "logs" / name), skip_completed=False, start_method="fork").run()

    def reader() -> WarcReader:
        return WarcReader(folder, glob_pattern="*.warc.wet.gz")

    with stderr_to(out.parent / "datatrove.log"):
        run("signatures", len(inputs), reader(), SentenceDedupSignature(str(out / "sigs"), config=lines))
        run("duplicates", 1, SentenceFindDedups(str(out / "sigs"), str(out / "dups"), config=lines))
        run("filter", len(inputs), reader(), SentenceDedupFilter(str(out / "dups"), config=lines), lid,
            ParquetWriter(str(out / "parquet"), output_filename="${language}/${rank}.parquet"))
    return sum(pq.ParquetFile(path).metadata.num_rows for path in glob.glob(str(out / "parquet" / "*" / "*.parquet")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-mb", type=float, default=50.0, help="size of the generated WET input (gzip MB)")
    parser.add_argument("--work", default=str(ROOT / "out" / "bench"), help="working directory")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of all five runs; the best time of each counts")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    work = Path(args.work)
    inputs = build_input(ROOT / "tests" / "data" / "sample", work, args.target_mb)
    n_docs = sum(1 for p in inputs for r in ArchiveIterator(open(p, "rb")) if r.rec_type == "conversion")

    def config(out: str, workers: int):
        return bench_config(inputs, out, workers, STEPS)

    runs = {"single-process loop (baseline)": ("loop", 1), "Beam DirectRunner, 1 worker": ("beam", 1),
            "Beam DirectRunner, 2 workers": ("beam", 2), "datatrove 0.10.1, 1 worker": ("datatrove", 1),
            "datatrove 0.10.1, 2 workers": ("datatrove", 2)}
    best: dict[str, tuple[float, int, int]] = {}
    for round_ in range(args.repeat):  # interleaved, every other round in reverse (ABBA): a slow spell of
        # the machine, or a slowdown under sustained load, then hits every run alike
        order = list(runs.items()) if round_ % 2 == 0 else list(reversed(runs.items()))
        for name, (kind, workers) in order:
            out = work / f"{kind}{workers}"
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            if kind == "loop":
                kept = single_process_loop(inputs, out, config(str(out), 1))
            elif kind == "datatrove":
                kept = datatrove_chain(inputs, out, workers, config(str(out), 1))
            else:
                kept = run_corpus(config(str(out), workers))["counters"]["write"]["documents"]
            seconds = time.perf_counter() - start
            print(f"round {round_ + 1}: {name}: {seconds:.1f} s", flush=True)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, workers, kept)
    baseline = best["single-process loop (baseline)"][0]
    print(f"\n{n_docs} input documents, {sum(os.path.getsize(p) for p in inputs) / 2**20:.1f} MB gzip WET, "
          f"{os.cpu_count()} cores; read -> exact paragraph dedup -> LID -> Arrow (ours) / Parquet (datatrove)")
    print(f"{'run':36} {'seconds':>8} {'docs/s':>8} {'docs/s/core':>12} {'kept':>7} {'speed vs loop':>14}")
    for name, (seconds, cores, kept) in best.items():
        rate = n_docs / seconds
        print(f"{name:36} {seconds:8.1f} {rate:8.0f} {rate / cores:12.0f} {kept:7d} {baseline / seconds:13.2f}x")
    for workers in (1, 2):
        ours = best[f"Beam DirectRunner, {workers} worker{'s' if workers > 1 else ''}"][0]
        theirs = best[f"datatrove 0.10.1, {workers} worker{'s' if workers > 1 else ''}"][0]
        print(f"per core, {workers} worker{'s' if workers > 1 else ''}: this project {theirs / ours:.2f}x datatrove")


if __name__ == "__main__":
    main()
