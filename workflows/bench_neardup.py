"""Benchmark MinHash near-duplicate removal at 10k, 20k and 40k documents against datasketch.

Documents of ~500 characters are cut from the bundled sample's distinct pages (a window of
consecutive paragraphs, one word per paragraph swapped for another word of the language, one
character for zh), 10 % of them followed by a near-duplicate (2 % of the words edited). The same
seeded corpus is used at every size (the smaller ones are its prefixes). Everything runs in this
one process, so documents/s per core = documents / CPU seconds of the process (wall-clock seconds
are printed too; they include waiting for a shared CPU). For each size it prints:

* signatures: ``pipeline.steps.minhash.signatures``, per shingle kind and overall;
* Beam stage: ``NearDedup`` on the DirectRunner (one in-process worker), reading the documents
  from JSON lines, minus the same pipeline without the stage;
* datasketch (the single-machine baseline): ``MinHash.bulk`` over the shingle strings (its SHA-1
  hash), then a ``MinHashLSH`` in memory with the same threshold: insert all, query all,
  keep pairs whose estimated Jaccard reaches the threshold, union-find;

and the time ratio for each doubling of the input. Every measurement is the fastest of ``--repeat``
runs (by CPU time).

With ``--bucket N`` it times instead the check of one LSH bucket's candidates
(``minhash.bucket_edges``) at its worst: N members equal in one band (13 positions) and in about
70 % of the others (each ~93 of 128 positions like a common signature, so a pair ~69), alike in a
band but not in whole (under the 103 positions that threshold 0.8 needs), with ``verify_limit``
and against every pair checked (the baseline).

    .venv/bin/python workflows/bench_neardup.py [--sizes 10000 20000 40000] [--work out/bench-neardup]
    .venv/bin/python workflows/bench_neardup.py --bucket 10000
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import re
import sys
import time
from functools import partial
from pathlib import Path
from typing import Callable, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import apache_beam as beam  # noqa: E402
import numpy as np  # noqa: E402
from datasketch import MinHash, MinHashLSH  # noqa: E402

from pipeline.steps import minhash  # noqa: E402
from pipeline.steps.base import RunInfo  # noqa: E402
from pipeline.steps.near_dedup import NearDedup, NearDupConfig  # noqa: E402
from pipeline.transforms.near_dedup import NearDedupTransform  # noqa: E402
from pipeline.readers.warc import RecordReader  # noqa: E402
from pipeline.runners.options import direct_pipeline  # noqa: E402

DOC_CHARS = 500
T = TypeVar("T")


def distinct_pages(sample: Path) -> dict[str, list[str]]:
    """The sample's pages that are neither copies nor near-duplicates, by language."""
    manifest = json.loads((sample / "manifest.json").read_text(encoding="utf-8"))
    truth = {d["id"]: d for d in manifest["documents"]}
    pages: dict[str, list[str]] = {}
    for path in sorted((sample / "wet").glob("*.warc.wet.gz")):
        with open(path, "rb") as stream:
            for doc in RecordReader(str(path), "wet").read(stream):
                if not isinstance(doc, dict):
                    continue
                entry = truth[doc["id"]]
                if not entry.get("dup_of") and not entry.get("near_dup_of"):
                    pages.setdefault(entry["lang"], []).append(doc["text"])
    return pages


def swap(line: str, vocab: list[str], rng: random.Random, chars: bool) -> str:
    units = list(line) if chars else line.split(" ")
    units[rng.randrange(len(units))] = rng.choice(vocab)
    return ("" if chars else " ").join(units)


def build_documents(sample: Path, n: int, seed: int = 1234) -> list[dict]:
    pages = distinct_pages(sample)
    langs = sorted(pages)
    vocab = {lang: sorted({u for text in texts for u in (text if minhash.shingle_kind(lang, "auto") == "char"
                                                          else text.split()) if not u.isspace()})
             for lang, texts in pages.items()}
    rng = random.Random(seed)
    docs: list[dict] = []
    while len(docs) < n:
        lang = langs[len(docs) % len(langs)]
        chars = minhash.shingle_kind(lang, "auto") == "char"
        lines = rng.choice(pages[lang]).split("\n")
        start, window = rng.randrange(len(lines)), []
        while sum(len(line) + 1 for line in window) < DOC_CHARS and len(window) < len(lines):
            window.append(swap(lines[(start + len(window)) % len(lines)], vocab[lang], rng, chars))
        text = "\n".join(window)
        docs.append({"id": f"<urn:uuid:bench-{len(docs):08d}>", "lang": lang, "text": text, "url": ""})
        if rng.random() < 0.1 and len(docs) < n:
            units = list(text) if chars else text.split(" ")
            for i in rng.sample(range(len(units)), max(1, len(units) // 50)):
                units[i] = rng.choice(vocab[lang])
            docs.append({"id": f"<urn:uuid:bench-{len(docs):08d}>", "lang": lang,
                         "text": ("" if chars else " ").join(units), "url": ""})
    return docs


@dataclasses.dataclass(frozen=True)
class Seconds:
    """Wall-clock and CPU seconds of this process (the DirectRunner's in-process worker included)."""

    wall: float
    cpu: float

    def __sub__(self, other: Seconds) -> Seconds:
        return Seconds(self.wall - other.wall, self.cpu - other.cpu)

    def __add__(self, other: Seconds) -> Seconds:
        return Seconds(self.wall + other.wall, self.cpu + other.cpu)


def clock() -> Seconds:
    return Seconds(time.perf_counter(), time.process_time())


def fastest(repeat: int, run: Callable[[], tuple[Seconds, T]]) -> tuple[Seconds, T]:
    """The run with the least CPU time of ``repeat`` (a shared machine only ever slows a run down)."""
    return min((run() for _ in range(repeat)), key=lambda result: result[0].cpu)


def time_signatures(docs: list[dict], cfg: NearDupConfig, kind: str) -> tuple[Seconds, int]:
    """Time of the signatures of the documents shingled as ``kind``, and their number."""
    texts = [d["text"] for d in docs if minhash.shingle_kind(d["lang"], cfg.shingle) == kind]
    minhash.signatures(texts[:2000], cfg, kind)  # warm up: the code point table and the power tables
    start = clock()
    minhash.signatures(texts, cfg, kind)
    return clock() - start, len(texts)


def time_beam(path: Path, cfg: NearDupConfig, stage: bool) -> tuple[Seconds, int]:
    """Time of the pipeline read -> (NearDedup) -> count, and the documents it kept."""
    out = path.with_suffix(".kept" if stage else ".read")
    out.unlink(missing_ok=True)
    start = clock()
    with direct_pipeline() as p:
        docs = p | beam.io.ReadFromText(str(path)) | beam.Map(json.loads)
        if stage:
            docs = (docs | NearDedupTransform(NearDedup(cfg, RunInfo()))).main
        _ = docs | beam.combiners.Count.Globally() | beam.io.WriteToText(str(out), shard_name_template="")
    return clock() - start, int(out.read_text().strip())


def python_shingles(text: str, kind: str, n: int) -> list[bytes]:
    """The stage's shingles, approximately, as strings (the input datasketch expects)."""
    words = re.findall(r"\w+", re.sub(r"\d+", "0", text.lower()))
    units = list("".join(words)) if kind == "char" else words
    sep = "" if kind == "char" else " "
    if len(units) < n:
        return [sep.join(units).encode("utf-8")] if units else []
    return [sep.join(units[i:i + n]).encode("utf-8") for i in range(len(units) - n + 1)]


def time_datasketch(docs: list[dict], cfg: NearDupConfig) -> tuple[Seconds, tuple[Seconds, int]]:
    """Time of datasketch alone, and (of which LSH insert + query, documents removed)."""
    start = clock()
    kinds = [minhash.shingle_kind(d["lang"], cfg.shingle) for d in docs]
    shingles = [python_shingles(d["text"], kind, cfg.char_ngram if kind == "char" else cfg.word_ngram)
                for d, kind in zip(docs, kinds)]
    minhashes = MinHash.bulk(shingles, num_perm=cfg.num_perm, seed=cfg.seed)
    signed = clock()
    lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm)
    keys = [f"{d['lang']}\t{d['id']}" for d in docs]
    for key, m in zip(keys, minhashes):
        if not m.is_empty():
            lsh.insert(key, m)
    index = dict(zip(keys, minhashes))
    parent = {key: key for key in keys}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for key, m in zip(keys, minhashes):
        if m.is_empty():
            continue
        for other in lsh.query(m):
            if other != key and other.split("\t")[0] == key.split("\t")[0] and m.jaccard(index[other]) >= cfg.threshold:
                a, b = find(key), find(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    done = clock()
    return done - start, (done - signed, sum(1 for key in keys if find(key) != key))


def time_bucket(n: int, cfg: NearDupConfig, repeat: int) -> None:
    """Print the check of one bucket of ``n`` members alike in a band, not in whole (see the module's
    docstring), with ``cfg.verify_limit`` and with every pair checked."""
    rng = np.random.default_rng(1234)
    sigs = np.repeat(rng.integers(1, 2**32, cfg.num_perm, dtype=np.uint32)[None, :], n, axis=0)
    changed = rng.random(sigs.shape) < 0.3
    changed[:, :13] = False  # the band they share
    sigs[changed] = rng.integers(1, 2**32, int(changed.sum()), dtype=np.uint32)
    members = [(f"doc-{i:08d}", sig.tobytes()) for i, sig in enumerate(sigs)]
    times = {}
    for label, limit in ((f"verify_limit {cfg.verify_limit}", cfg.verify_limit), ("every pair (no limit)", None)):
        def check(limit: int | None = limit) -> tuple[Seconds, int]:
            start = clock()
            edges, _ = minhash.bucket_edges(members, cfg.min_matches(), limit)
            return clock() - start, len(edges)
        times[label], edges = fastest(repeat, check)
        print(f"one bucket of {n} members, {label}: {times[label].cpu:.2f} s CPU, {edges} edges", flush=True)
    limited, every = times.values()
    print(f"every pair / verify_limit: {every.cpu / limited.cpu:.1f}x the CPU time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket", type=int, help="time one worst-case LSH bucket of this many members instead")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 20_000, 40_000])
    parser.add_argument("--sample", default=str(ROOT / "tests" / "data" / "sample"))
    parser.add_argument("--work", default=str(ROOT / "out" / "bench-neardup"))
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement (the fastest counts)")
    args = parser.parse_args()
    if args.bucket is not None:
        if args.bucket < 2:
            parser.error(f"--bucket takes 2 or more members, got {args.bucket}")
        time_bucket(args.bucket, NearDupConfig(), args.repeat)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cfg = NearDupConfig()
    corpus = build_documents(Path(args.sample), max(args.sizes))
    rows = []
    for n in args.sizes:
        docs = corpus[:n]
        path = work / f"docs-{n}.jsonl"
        path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
        sig, rates = Seconds(0.0, 0.0), {}
        for kind in ("word", "char"):
            spent, count = fastest(args.repeat, partial(time_signatures, docs, cfg, kind))
            sig, rates[kind] = sig + spent, count / spent.cpu
        read, _ = fastest(args.repeat, partial(time_beam, path, cfg, stage=False))
        total, kept = fastest(args.repeat, partial(time_beam, path, cfg, stage=True))
        ds, (ds_lsh, ds_removed) = fastest(args.repeat, partial(time_datasketch, docs, cfg))
        rows.append((n, sig, total - read, n - kept, ds, ds_removed))
        print(f"{n} documents: signatures " + ", ".join(f"{k} shingles {r:,.0f} docs/s" for k, r in rates.items())
              + f"; Beam {total.wall:.1f} s wall, {total.cpu:.1f} s CPU (read alone {read.wall:.1f} / {read.cpu:.1f}); "
              f"datasketch {ds.cpu:.1f} s CPU, of which LSH insert+query {ds_lsh.cpu:.1f} s", flush=True)
    chars = sum(len(d["text"]) for d in corpus[:args.sizes[0]]) / args.sizes[0]
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, Python "
          f"{platform.python_version()}, apache-beam {beam.__version__}; {chars:.0f} characters per document; "
          f"num_perm {cfg.num_perm}, threshold {cfg.threshold}, bands x rows {cfg.band_rows()}; one core per "
          f"run (docs/s per core = documents / CPU seconds), fastest of {args.repeat} runs; Beam stage = "
          f"the pipeline minus the read-only pipeline")
    print("| documents | signatures docs/s/core | Beam stage wall s | Beam stage CPU s | Beam stage docs/s/core "
          "| removed | datasketch wall s | datasketch CPU s | datasketch docs/s/core | removed "
          "| datasketch CPU / Beam stage CPU |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, sig, stage, removed, ds, ds_removed in rows:
        print(f"| {n} | {n / sig.cpu:,.0f} | {stage.wall:.1f} | {stage.cpu:.1f} | {n / stage.cpu:,.0f} | {removed} "
              f"| {ds.wall:.1f} | {ds.cpu:.1f} | {n / ds.cpu:,.0f} | {ds_removed} | {ds.cpu / stage.cpu:.2f}x |")
    print("\n| doubling | signatures CPU | Beam stage CPU | Beam stage wall | datasketch CPU |")
    print("|---|---:|---:|---:|---:|")
    for (n0, s0, b0, _, d0, _), (n1, s1, b1, _, d1, _) in zip(rows, rows[1:]):
        print(f"| {n0} -> {n1} | {s1.cpu / s0.cpu:.2f}x | {b1.cpu / b0.cpu:.2f}x | {b1.wall / b0.wall:.2f}x "
              f"| {d1.cpu / d0.cpu:.2f}x |")


if __name__ == "__main__":
    main()
