"""The floor of the corpus chain on this machine: each stage of read -> exact dedup -> LID -> Arrow
done alone, the fastest known way, on one core, summed; and ``pipeline run`` (DirectRunner, 1, 2 or
more workers) on the same files in the same run, as a share of that floor.

Floor stages, each timed over every document in a new process of its own, its input made once
beforehand and loaded untimed (in the benchmark's own process, after the others, a stage took up
to 1.25x as long):
  * read: fastwarc's iterator over the gzip WET records, bodies decoded (no headers kept);
  * hash: CCNet's normalization and 64-bit paragraph hashes (``normalize.paragraph_hashes``,
    equal to CCNet's) of every line of every document, each line's strip left out where the
    reader's check finds every line stripped already (``warc.clean_lines``; 2.19 s against 2.27
    s, medians of 5 alternated rounds);
  * LID: fastText on exactly the text our LID sees (after dedup, newlines replaced as
    ``lid.newlines`` says), the texts first sorted by ``lid.script_block`` (the sort timed too;
    fastText is faster on texts of one script in a row, 15.0-15.8 s sorted against 17.1-21.6 s in
    input order on the benchmark's 46,420 texts), then fastText's binding (``multilinePredict``,
    what its ``predict`` calls for a list, as LID calls it) in chunks of LID's ``chunk_docs``:
    5.57 s against 5.93 s for one ``predict`` call of them all (medians of 5 alternated rounds).
    The model is loaded before the texts, as a worker loads it in its setup before its first
    bundle: the first model a process loads after them took 5.6-6.6 s on these texts, one loaded
    before them 4.7-4.8 s, and a third loaded after them 4.5-4.9 s (a run's own LID: 4.7-5.0 s).
    fastText's speed follows where its model's tables land in memory; why that arrangement is slow
    is not known (BENCHMARKS.md, 2026-11-29 and 11-30);
  * Arrow: the kept rows as one Arrow table, written as one IPC file, zstd-compressed in record
    batches of ``shards.BATCH_ROWS`` rows as the corpus shards are (0.26-0.28 s against 0.30-0.40 s
    as one batch) (unsorted: the shards' sort for byte-identical output is left out).
With ``--full`` the chain is the whole one (``+ near_dedup, perplexity``; SentencePiece + KenLM
models per sample language trained once by ``bench_perplexity.ensure_models``) and two stages join
the floor:
  * MinHash: the vectorized signatures (``minhash.signatures``, one call per shingle kind) of the
    text near-dup sees (after LID);
  * perplexity: CCNet's normalization, SentencePiece pieces and the KenLM score of every document
    whose language has a model (``perplexity.document_perplexity``), the documents first sorted
    by language (the sort timed too; one language's models in a row: about 0.8x the time), the
    models loaded after the documents, as a run loads a language's models at its first document
    (12.9-13.4 s, against 15.2-15.5 s loaded before them).
The floor leaves out what a chain must also do: find the duplicates among the hashes, cut the
paragraphs out, band and join the near-duplicates, shard by language and write stats.
``pipeline run`` is the command a user types (``python -m pipeline run``), each run in a new
process; its time is run.json's ``elapsed_s`` (the graph built and run; not the checks before nor
the report after), at each worker count ``--workers`` names (1 and 2 by default). Run inside this
process instead, after the floor, the same chain took 20-50 % longer (95 s against 79 s at 1
worker, one pair). Each run's CPU seconds in Python processes (driver, fork server, workers; the
whole command, its imports and report included) are sampled too, and the round's floor as a share
of them printed: the part of the gap to the floor that is work beyond it, on any core, rather than
cores left idle (serial stages, one worker waiting for the other). Each run's line also gives the
seconds its workers spent in each part of the graph (run.json's ``transform_s``, Beam's own
measure), so that a gap can be put on the stage that has it. ``floor / time`` is printed per run
(for n workers against the floor divided by n: n cores busy), best against best over ``--repeat``
rounds, and each round's runs against that round's own floor (the machine's speed per core can
swing within minutes: the `predict` floor took 11.3 s and 17.3 s an hour apart here, so a best
floor from one round against a best run from another says little). A round times the floor before
its runs and again after them, and takes the mean of the two, so that a drift of the machine's
speed across the round cancels; its runs go in the order of ``--workers`` in odd rounds and the
reverse in even ones. For each worker count n above 1, a round also times the floor on n cores at
once, before and after its runs: each stage's input cut into n consecutive parts (files, or
documents), one process per part, started together, the stage's time the slowest part's. The
n-worker run is printed against it too, and it against the floor divided by n: the part of the
gap that the machine's cores, sharing caches and memory, leave even to the floor. The machine's
speed per core is printed as the time of a fixed 10-million-addition Python loop, to compare
figures taken on other machines.

    .venv/bin/python workflows/bench_floor.py [--target-mb 50] [--repeat 2] [--full] [--workers 1,2]
"""
from __future__ import annotations

import argparse
import json
import marshal
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_perplexity import ensure_models
from bench_pipeline import ROOT, SAMPLE_CONFIG, STEPS, CpuUse, after_dedup, bench_config, bench_sets, build_input
from pipeline.output import shards
from pipeline.readers import spill
from pipeline.readers.warc import clean_lines
from pipeline.steps.base import Drop
from pipeline.steps.lid import LanguageIdentifier, script_block
from pipeline.steps import minhash
from pipeline.steps.normalize import paragraph_hashes
from pipeline.steps.perplexity import PerplexityScorer, document_perplexity
from pipeline.util.errors import UserError


def loop_seconds() -> float:
    """A fixed 10-million-addition Python loop: the machine's speed per core."""
    start, total = time.perf_counter(), 0
    for i in range(10_000_000):
        total += i
    return time.perf_counter() - start


FLOOR_STAGES = ("read", "hash", "lid", "minhash", "perplexity", "arrow")


def floor_data(inputs: list[str], work: Path, cfg) -> None:
    """What each floor stage takes as input, made once (untimed) and kept in ``work/floor-data/``
    as marshal files: the WET bodies (hash), the texts LID sees (after dedup), and the documents
    LID keeps (MinHash, perplexity, Arrow)."""
    import fastwarc.warc as fw

    data = work / "floor-data"
    data.mkdir(parents=True, exist_ok=True)
    texts = []
    for path in inputs:
        with open(path, "rb") as stream:
            for record in fw.ArchiveIterator(stream, record_types=fw.WarcRecordType.conversion, parse_http=False):
                texts.append(record.reader.read().decode("utf-8", "replace"))
    docs = list(after_dedup(inputs, cfg))
    kept = [doc for doc in LanguageIdentifier(cfg.section("lid")).apply_chunk(docs) if not isinstance(doc, Drop)]
    for name, value in (("texts", texts), ("lid", [doc["text"] for doc in docs]), ("kept", kept)):
        (data / f"{name}.marshal").write_bytes(marshal.dumps(value))


def floor(inputs: list[str], work: Path, chain: str, extra: list[str], stages: list[str],
          cores: int = 1) -> dict[str, float]:
    """Seconds of each floor stage, each in a new process of its own (``--stage``): a stage run in
    the benchmark's process, after the others, took up to 1.25x as long (fastText ``predict``: 6.0
    against 4.8 s on the same texts, its heap holding every file's parsed records).

    With ``cores`` above 1, the stage on that many cores at once: its input cut into ``cores``
    consecutive parts, each in a process of its own, which start their timed work together once
    every one has loaded its part; the stage's seconds are the slowest part's. What the floor
    divided by ``cores`` leaves out: the cores share the machine's caches and memory bandwidth
    (the LID floor, two copies at once: 0-5 % slower than one alone, BENCHMARKS.md), and the parts
    need not take equal times."""
    seconds = {}
    for stage in stages:
        parts = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--stage", stage, "--work", str(work),
                                   "--chain", chain, *(f"--extra={e}" for e in extra), f"--part={k}/{cores}", *inputs],
                                  cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for k in range(cores)]
        ready = [part.stdout.readline() == "ready\n" for part in parts]  # its input loaded, before any starts
        for part, is_ready in zip(parts, ready):
            if is_ready:  # (one that failed before it was ready is reported below)
                part.stdin.write("go\n")
                part.stdin.flush()
        times = []
        for part in parts:
            out, err = part.communicate()
            if part.returncode:
                sys.exit(f"floor stage {stage} failed: {(err.strip().splitlines() or ['?'])[-1]}")
            times.append(float(out.split()[-1]))
        seconds[stage] = max(times)
    return seconds


def floor_stage(stage: str, inputs: list[str], work: Path, cfg, part: int = 0, parts: int = 1) -> float:
    """One floor stage alone, the fastest known way, on one core (its input loaded and what it sets
    up once done untimed: models loaded, MinHash's permutations drawn, pyarrow's first conversion,
    which imports pandas, made): ``read`` fastwarc's iteration; ``hash`` CCNet's paragraph hashes
    of every body; ``lid`` sorted chunks through fastText's binding; ``minhash`` the signatures per
    shingle kind; ``perplexity`` every kept document by language; ``arrow`` one zstd IPC file of
    the kept rows. Of its input (the files, or the documents) only consecutive part ``part`` of
    ``parts``. It prints ``ready`` once set up and starts when a line comes on its standard input."""
    import fastwarc.warc as fw
    import pyarrow as pa

    data = work / "floor-data"
    if stage == "lid":  # its model before its input (see the module's docstring)
        lid = LanguageIdentifier(cfg.section("lid"))
        model = lid.model
    loaded = marshal.loads((data / {"hash": "texts", "lid": "lid"}.get(stage, "kept")).with_suffix(".marshal")
                           .read_bytes()) if stage != "read" else None
    inputs, loaded = part_of(inputs, part, parts), part_of(loaded, part, parts) if loaded is not None else None
    if stage == "minhash":
        near = cfg.section("near_dedup")
        by_kind: dict[str, list[str]] = {}
        for doc in loaded:
            by_kind.setdefault(minhash.shingle_kind(doc["lang"], near.shingle), []).append(doc["text"])
        for kind, texts in by_kind.items():
            minhash.signatures(texts[:1], near, kind)
    if stage == "arrow":
        shards.docs_to_table(loaded[:1])
    if stage == "lid":
        docs = [{"text": text} for text in loaded]
    if stage == "perplexity":  # its models after its input (see the module's docstring)
        scorer = PerplexityScorer(cfg.section("perplexity"))
        scorer.prepare()
        for doc in loaded:
            scorer.models(doc["lang"])
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    if stage == "read":
        for path in inputs:
            with open(path, "rb") as stream:
                for record in fw.ArchiveIterator(stream, record_types=fw.WarcRecordType.conversion, parse_http=False):
                    record.reader.read().decode("utf-8", "replace")
    elif stage == "hash":
        for text in loaded:
            paragraph_hashes(text, stripped=clean_lines(text))
    elif stage == "lid":
        docs.sort(key=script_block)
        for at in range(0, len(docs), lid.chunk_docs):
            lines = [doc["text"].replace("\n", lid.newline) + "\n" for doc in docs[at:at + lid.chunk_docs]]
            model.f.multilinePredict(lines, 1, 0.0, "strict")
    elif stage == "minhash":
        for kind, texts in by_kind.items():
            minhash.signatures(texts, near, kind)
    elif stage == "perplexity":
        for doc in sorted(loaded, key=scorer.order_key):
            if models := scorer.models(doc["lang"]):
                document_perplexity(doc["text"], *models)
    else:
        table = shards.docs_to_table(loaded)
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.OSFile(str(data / f"floor-{part}.arrow"), "wb") as sink, \
                pa.ipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(table, max_chunksize=shards.BATCH_ROWS)
    return time.perf_counter() - start


def part_of(items: list, part: int, parts: int) -> list:
    """Consecutive part ``part`` (from 0) of ``items`` cut into ``parts`` parts of sizes differing by one at most."""
    return items[len(items) * part // parts:len(items) * (part + 1) // parts]


def pipeline_run(inputs: list[str], out: Path, workers: int, steps: str,
                 extra: list[str]) -> tuple[float, float, dict[str, float]]:
    """``python -m pipeline run`` on ``inputs`` in a new process: the ``elapsed_s`` of its run.json,
    the CPU seconds of the Python processes meanwhile (its driver, fork server and workers, over
    the whole command: imports and report included), and run.json's ``transform_s`` (the seconds
    Beam's workers spent in each part of the graph, summed over them)."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "pipeline", "run", "--config", str(SAMPLE_CONFIG), "--output", str(out),
               *(f"--input={path}" for path in inputs), *(f"--set={s}" for s in bench_sets(workers, steps, extra))]
    with CpuUse() as cpu:
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:  # its stderr is Beam's warnings otherwise
        sys.exit(f"pipeline run failed (exit {done.returncode}): {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    with open(out / "run.json") as f:
        run = json.load(f)
    return run["elapsed_s"], cpu.by_kind.get("python", 0.0), run.get("transform_s", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target-mb", type=float, default=50.0, help="size of the generated WET input (gzip MB)")
    parser.add_argument("--work", default=str(ROOT / "out" / "bench"), help="working directory")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of everything; the best time of each counts")
    parser.add_argument("--full", action="store_true", help="the whole chain: + near_dedup and perplexity")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts of the pipeline runs")
    parser.add_argument("--stage", choices=FLOOR_STAGES, help="(internal) time one floor stage in this process")
    parser.add_argument("--chain", default=STEPS, help="(with --stage) the chain's steps")
    parser.add_argument("--extra", action="append", default=[], help="(with --stage) a --set of the chain")
    parser.add_argument("--part", default="0/1", help="(with --stage) K/N: only part K (from 0) of N of the input")
    parser.add_argument("inputs", nargs="*", help="(with --stage) the input files")
    args = parser.parse_args()
    if args.stage:
        if not (Path(args.work) / "floor-data" / "kept.marshal").is_file():
            parser.error(f"--stage: no floor data in {args.work}/floor-data (a bench_floor.py run makes it)")
        part, _, parts = args.part.partition("/")
        if not (part.isdigit() and parts.isdigit() and int(part) < int(parts)):
            parser.error(f"--part takes K/N with 0 <= K < N, got {args.part!r}")
        try:
            cfg = bench_config(args.inputs, str(Path(args.work) / "unused"), 1, args.chain, args.extra)
        except UserError as exc:
            parser.error(f"--stage: {exc}")
        print(f"{floor_stage(args.stage, args.inputs, Path(args.work), cfg, int(part), int(parts)):.4f}")
        return
    if args.repeat < 1 or args.target_mb <= 0:
        parser.error(f"--repeat must be at least 1 and --target-mb above 0, got {args.repeat} and {args.target_mb}")
    try:
        counts = [int(n) for n in args.workers.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        parser.error(f"--workers takes counts of 1 or more separated by commas, got {args.workers!r}")
    work = Path(args.work).resolve()  # the runs and floor stages run in the repository's root
    inputs = build_input(ROOT / "tests" / "data" / "sample", work, args.target_mb)
    steps, extra = STEPS, []
    if args.full:
        ensure_models(work / "lm")
        steps, extra = "[dedup, lid, near_dedup, perplexity]", [f"perplexity.models={work / 'lm'}"]
    best: dict[str, float] = {}
    rounds: list[dict[str, float]] = []  # each round's floor and runs: the machine's speed drifts between rounds
    own_cpu: dict[str, list[float]] = {}  # per run and round: the round's floor / the run's CPU seconds
    config = bench_config(inputs, str(work / "unused"), 1, steps, extra)
    floor_data(inputs, work, config)
    stages = [s for s in FLOOR_STAGES if s not in ("minhash", "perplexity") or args.full]
    loop_before = loop_seconds()  # again at the end: a shared machine's speed per core drifts
    scratch = spill.scratch_parent()
    room = spill.budget(scratch)
    print(f"the runs' scratch folders go to {scratch}: "
          + ("in memory, so no spill: the dedup pass parses every file again" if spill.memory_backed(scratch)
             else f"on a disk, {room / 2**30:.1f} GiB a spill may take" if room else
             "on a disk too full to spill (free space under its spare): the dedup pass parses every file again"),
          flush=True)
    many = [n for n in counts if n > 1]  # worker counts whose floor is also measured on that many cores at once
    for round_ in range(args.repeat):
        before = timed_floor(work, inputs, steps, extra, stages, f"round {round_ + 1}: floor before the runs")
        before_many = {n: timed_floor(work, inputs, steps, extra, stages, f"round {round_ + 1}: floor on {n} cores "
                                      "at once before the runs", n) for n in many}
        times: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for workers in counts if round_ % 2 == 0 else counts[::-1]:  # each count first in every other round
            name = run_name(workers)
            times[name], cpu[name], parts = pipeline_run(inputs, work / f"floor-run{workers}", workers, steps, extra)
            print(f"round {round_ + 1}: {name}: {times[name]:.1f} s; {cpu[name]:.1f} CPU-s in its Python processes; "
                  f"{sum(parts.values()):.1f} s in the graph's transforms (all workers): "
                  + ", ".join(f"{label} {s:.1f}" for label, s in sorted(parts.items(), key=lambda kv: -kv[1])),
                  flush=True)
        after_many = {n: timed_floor(work, inputs, steps, extra, stages, f"round {round_ + 1}: floor on {n} cores "
                                     "at once after the runs", n) for n in many}
        after = timed_floor(work, inputs, steps, extra, stages, f"round {round_ + 1}: floor after the runs")
        for stage in before:  # the round's floor: the mean of the two around its runs (a linear drift cancels)
            times[stage] = (before[stage] + after[stage]) / 2
            best[stage] = min(best.get(stage, before[stage]), before[stage], after[stage])
        floor_sum = sum(times[stage] for stage in before)
        for n in many:
            times[on_cores(n)] = (sum(before_many[n].values()) + sum(after_many[n].values())) / 2
        for workers in counts:
            name = run_name(workers)
            own_cpu.setdefault(name, []).append(floor_sum / cpu[name])
            best[name] = min(best.get(name, times[name]), times[name])
        print(f"round {round_ + 1}: floor {sum(before.values()):.2f} s before, {sum(after.values()):.2f} s after; "
              + ", ".join(f"{run_name(w)} {floor_sum / w / times[run_name(w)]:.0%}"
                          + (f" (of the floor on {w} cores at once, {times[on_cores(w)]:.2f} s: "
                             f"{times[on_cores(w)] / times[run_name(w)]:.0%})" if w > 1 else "") for w in counts)
              + " of the round's floor", flush=True)
        rounds.append(times)
    total = sum(best[stage] for stage in stages)
    print(f"\nPython 10M-addition loop: {loop_before:.2f} s before, {loop_seconds():.2f} s after (the machine's speed per core)")
    print(f"chain {steps}; floor, one core (best of each stage): " + ", ".join(f"{s} {best[s]:.2f} s" for s in stages)
          + f"; sum {total:.2f} s")
    for workers in counts:
        name = run_name(workers)
        own = [sum(r[s] for s in stages) / workers / r[name] for r in rounds]
        print(f"{name}: {best[name]:.1f} s, {total / workers / best[name]:.0%} of the floor (best against best); "
              f"each round against its own floor: " + ", ".join(f"{share:.0%}" for share in own)
              + f" (median {statistics.median(own):.0%}); the floor is {statistics.median(own_cpu[name]):.0%} of "
              f"its CPU seconds (median of rounds: the rest is work beyond the floor, on any core)")
        if workers > 1:
            shares = [r[on_cores(workers)] / r[name] for r in rounds]
            scaling = [sum(r[s] for s in stages) / workers / r[on_cores(workers)] for r in rounds]
            print(f"  against the floor on {workers} cores at once (each stage's input cut in {workers}, run together): "
                  + ", ".join(f"{share:.0%}" for share in shares) + f" (median {statistics.median(shares):.0%}); "
                  f"that floor is {statistics.median(scaling):.0%} of the one-core floor's / {workers} (median of rounds)")


def timed_floor(work: Path, inputs: list[str], chain: str, extra: list[str], stages: list[str],
                label: str, cores: int = 1) -> dict[str, float]:
    """:func:`floor`, printed."""
    times = floor(inputs, work, chain, extra, stages, cores)
    print(f"{label}: " + ", ".join(f"{s} {t:.2f} s" for s, t in times.items()), flush=True)
    return times


def on_cores(cores: int) -> str:
    return f"floor on {cores} cores"


def run_name(workers: int) -> str:
    return f"pipeline run, {workers} worker{'s' if workers > 1 else ''}"


if __name__ == "__main__":
    main()
