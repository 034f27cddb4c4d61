"""Benchmark the perplexity step against the bare SentencePiece + KenLM loop, and check LM sanity.

Trains (or reuses) a model per sample language on 80 % of its reference text, then on the
sample's WET documents measures, in one run:
  * bare loop (baseline): ``model.score(" ".join(sp.encode(text)))`` on the raw text;
  * our step: ``PerplexityScorer`` (CCNet normalization + pieces + score + bucket);
  * CCNet's own ``text_normalizer.normalize`` + pieces + score (what CCNet's pipeline costs).
It prints documents/s and pieces/s per core and the ratio to the bare loop, then, per language,
how often held-out text scores lower than the same text shuffled and than another language.

    .venv/bin/python workflows/bench_perplexity.py [--work out/bench/lm]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reference_data import CCNET, SAMPLE, SAMPLE_LANGS, sanity_rates, split_reference  # noqa: E402
from warcio.archiveiterator import ArchiveIterator  # noqa: E402

from pipeline.steps.lm import train_lm  # noqa: E402
from pipeline.steps.perplexity import PerplexityConfig, PerplexityScorer  # noqa: E402


def ensure_models(work: Path) -> None:
    for lang in SAMPLE_LANGS:
        if (work / f"{lang}.arpa.bin").exists():
            continue
        train, _ = split_reference(lang)
        text = work / f"{lang}.train.txt"
        text.parent.mkdir(parents=True, exist_ok=True)
        text.write_text("\n".join(train) + "\n", encoding="utf-8")
        print(train_lm(lang, [str(text)], work, vocab_size=8000).describe())


def sample_documents() -> list[dict]:
    langs = {d["id"]: d["lang"] for d in json.loads((SAMPLE / "manifest.json").read_text())["documents"]}
    docs = []
    for path in sorted(SAMPLE.glob("wet/*.warc.wet.gz")):
        with open(path, "rb") as f:
            for r in ArchiveIterator(f):
                rid = r.rec_headers.get_header("WARC-Record-ID")
                if r.rec_type == "conversion" and rid in langs:
                    docs.append({"id": rid, "lang": langs[rid], "text": r.content_stream().read().decode()})
    return docs


def timed(fn, docs) -> tuple[float, int]:
    start, pieces = time.perf_counter(), 0
    for doc in docs:
        pieces += fn(doc)
    return time.perf_counter() - start, pieces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(ROOT / "out" / "bench" / "lm"))
    parser.add_argument("--repeat", type=int, default=3, help="passes over the documents per measurement")
    args = parser.parse_args()
    work = Path(args.work)
    ensure_models(work)
    spec = importlib.util.spec_from_file_location("ccnet_text_normalizer", CCNET / "text_normalizer.py")
    ccnet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ccnet)

    scorer = PerplexityScorer(PerplexityConfig(models=str(work)), languages=SAMPLE_LANGS)
    docs = [d for d in sample_documents() if d["lang"] in SAMPLE_LANGS] * args.repeat
    for lang in SAMPLE_LANGS:
        scorer.models(lang)  # load outside the timed region
    scorer({"lang": "en", "text": "warm up the normalization tables"})

    def bare(doc) -> int:
        sp, lm = scorer.models(doc["lang"])
        pieces = sp.encode(doc["text"], out_type=str)
        lm.score(" ".join(pieces))
        return len(pieces)

    def ours(doc) -> int:
        scorer(doc)
        return 0

    def ccnet_way(doc) -> int:
        sp, lm = scorer.models(doc["lang"])
        pieces = sp.encode(ccnet.normalize(doc["text"]), out_type=str)
        lm.score(" ".join(pieces))
        return len(pieces)

    results = {name: timed(fn, docs) for name, fn in
               [("bare sp.encode + model.score (baseline)", bare), ("pipeline perplexity step", ours),
                ("CCNet normalize + sp.encode + score", ccnet_way)]}
    pieces = results["CCNet normalize + sp.encode + score"][1]
    base = results["bare sp.encode + model.score (baseline)"][0]
    print(f"\n{len(docs)} documents ({len(docs) // args.repeat} sample WET documents x {args.repeat}), 1 core")
    print(f"{'run':42} {'seconds':>8} {'docs/s':>8} {'pieces/s':>10} {'vs baseline':>12}")
    for name, (seconds, _) in results.items():
        print(f"{name:42} {seconds:8.2f} {len(docs) / seconds:8.0f} {pieces / seconds:10.0f} {base / seconds:11.2f}x")

    print("\nheld-out reference text (LM trained on the other 80 %), documents of >= 300 characters:")
    print("share scoring lower than the same text shuffled, than the next language's text, and than the")
    print("hardest other language's text")
    print(f"{'lang':6} {'shuffled':>9} {'next lang':>14} {'hardest other':>18}")
    for i, lang in enumerate(SAMPLE_LANGS):
        vs_shuffled, vs_next = sanity_rates(work, lang)
        hardest = min((sanity_rates(work, lang, other)[1], other) for other in SAMPLE_LANGS if other != lang)
        nxt = SAMPLE_LANGS[(i + 1) % len(SAMPLE_LANGS)]
        print(f"{lang:6} {vs_shuffled:9.3f} {vs_next:9.3f} ({nxt}) {hardest[0]:12.3f} ({hardest[1]})")


if __name__ == "__main__":
    main()
