"""Benchmark FineWeb-2's quality layer: our steps against datatrove 0.10.1's own classes, on the
same documents in the same process (one core each, taking turns).

The documents are those the quality steps see in the pipeline: ``bench_pipeline.py``'s input
(the bundled sample's pages, then copies with one word per paragraph swapped) after exact
paragraph dedup and LID, in XNLI languages: each side first filters ``--docs`` of them untimed (as
a worker has filtered earlier documents: caches warm, but not with these), then the next
``--docs``, timed. Both sides run FineWeb-2's chain per language: Gopher repetition, FineWeb quality, Gopher
quality (``configs/corpus/fineweb2.yaml``; datatrove's classes built as ``fineweb-2-pipeline.py``
builds them), then ftfy, PII and symbol-line removal on the kept documents. Each side runs
``--repeat`` times, in turns, and its best time counts; the decisions and the final text are
checked identical. Prints documents/s per side and the ratio, and each stage's seconds.

    .venv/bin/python workflows/bench_quality.py [--docs 4000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_pipeline import build_input, deduplicated  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.steps.base import Drop  # noqa: E402
from pipeline.steps.formatters import Ftfy, Pii, SymbolLines  # noqa: E402
from pipeline.steps.quality import FineWebQuality, GopherQuality, GopherRepetition  # noqa: E402
from pipeline.steps.words import forget_words  # noqa: E402
from quality_docs import XNLI, reference_filters, restart_pii_turn  # noqa: E402

STAGES = ("gopher_repetition", "fineweb_quality", "gopher_quality", "ftfy", "pii", "symbol_lines")


def documents(n: int, work: Path) -> list[tuple[str, str]]:
    """``n`` (text, lang) pairs in XNLI languages, as the quality steps see them in the pipeline:
    bench_pipeline.py's input (the sample's pages, then copies with one word per paragraph
    swapped) after exact paragraph dedup and LID."""
    inputs = build_input(ROOT / "tests" / "data" / "sample", work, target_mb=max(1.0, n / 800))
    cfg = load_config(str(ROOT / "configs" / "corpus" / "sample.yaml"), {"input": inputs, "output": str(work / "unused")})
    return [(doc["text"], doc["lang"]) for doc in deduplicated(inputs, cfg) if doc["lang"] in XNLI][:n]


Chain = Callable[[str, str, dict[str, float]], tuple[str | None, str]]


def ours() -> Chain:
    cfg = load_config(str(ROOT / "configs" / "corpus" / "fineweb2.yaml"))
    filters = [cls(cfg.section(cls.name)) for cls in (GopherRepetition, FineWebQuality, GopherQuality)]
    formatters = [cls(cfg.section(cls.name)) for cls in (Ftfy, Pii, SymbolLines)]
    for step in (*filters, *formatters):
        step.setup()

    def run(text: str, lang: str, seconds: dict[str, float]) -> tuple[str | None, str]:
        doc: Any = {"text": text, "lang": lang}
        for step in filters:
            start = time.perf_counter()
            doc = step(doc)
            seconds[step.name] += time.perf_counter() - start
            if isinstance(doc, Drop):
                return doc.reason, text
        for step in formatters:
            start = time.perf_counter()
            doc = step(doc)
            seconds[step.name] += time.perf_counter() - start
        return None, doc["text"]

    return run


def datatrove() -> Chain:
    from datatrove.data import Document
    from datatrove.pipeline.formatters import FTFYFormatter, PIIFormatter, SymbolLinesFormatter

    filters = {lang: reference_filters(lang) for lang in XNLI}
    formatters = (FTFYFormatter(), PIIFormatter(), SymbolLinesFormatter(symbols_to_remove=["|"], replace_char="\n"))

    def run(text: str, lang: str, seconds: dict[str, float]) -> tuple[str | None, str]:
        doc = Document(text=text, id="bench")
        for name, flt in zip(STAGES, filters[lang]):
            start = time.perf_counter()
            result = flt.filter(doc)
            seconds[name] += time.perf_counter() - start
            if result is not True:
                return result[1], text
        restart_pii_turn(formatters[1])
        for name, formatter in zip(STAGES[3:], formatters):
            start = time.perf_counter()
            doc.text = formatter.format(doc.text)
            seconds[name] += time.perf_counter() - start
        return None, doc.text

    return run


def timed(chain: Chain, warm: list[tuple[str, str]], docs: list[tuple[str, str]]
          ) -> tuple[float, dict[str, float], list[tuple[str | None, str]]]:
    """``chain`` over ``docs``, timed, after it has filtered ``warm`` (other documents), as a worker
    that has filtered earlier documents: its caches hold what those left, not these."""
    forget_words()
    for text, lang in warm:
        chain(text, lang, defaultdict(float))
    seconds: dict[str, float] = defaultdict(float)
    start = time.perf_counter()
    results = [chain(text, lang, seconds) for text, lang in docs]
    return time.perf_counter() - start, seconds, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=4000, help="documents to filter")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of both sides; the best time of each counts")
    parser.add_argument("--work", default=str(ROOT / "out" / "bench-quality"), help="working directory")
    args = parser.parse_args()
    both = documents(2 * args.docs, Path(args.work))
    warm, docs = both[:args.docs], both[args.docs:]
    langs = sorted({lang for _, lang in docs})
    mb = sum(len(text.encode()) for text, _ in docs) / 1e6
    print(f"{len(docs)} documents, {mb:.1f} MB of text, languages: {' '.join(langs)}")
    sides = {"datatrove 0.10.1": datatrove, "this project": ours}  # each round builds its chain anew
    best: dict[str, tuple[float, dict[str, float]]] = {}
    outputs: dict[str, list[tuple[str | None, str]]] = {}
    for round_ in range(args.repeat):
        for name in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
            wall, seconds, results = timed(sides[name](), warm, docs)
            print(f"round {round_ + 1}: {name}: {wall:.2f} s")
            if name not in best or wall < best[name][0]:
                best[name] = (wall, dict(seconds))
            outputs[name] = results
    theirs, mine = (outputs[name] for name in sides)
    differ = sum(a != b for a, b in zip(theirs, mine))
    kept = sum(reason is None for reason, _ in mine)
    print(f"decisions and text identical on {len(docs) - differ} of {len(docs)} documents ({kept} kept)")
    print("\n| stage | datatrove 0.10.1 (s) | this project (s) | ratio |\n|---|---:|---:|---:|")
    (dt_wall, dt_stages), (our_wall, our_stages) = best["datatrove 0.10.1"], best["this project"]
    for stage in STAGES:
        a, b = dt_stages.get(stage, 0.0), our_stages.get(stage, 0.0)
        print(f"| {stage} | {a:.2f} | {b:.2f} | {a / b if b else float('inf'):.1f}x |")
    print(f"| **whole chain** ({len(docs) / dt_wall:.0f} vs {len(docs) / our_wall:.0f} docs/s) | {dt_wall:.2f} | "
          f"{our_wall:.2f} | **{dt_wall / our_wall:.1f}x** |")
    if differ:
        raise SystemExit(f"{differ} documents got a different decision or text: the benchmark compared different work")


if __name__ == "__main__":
    main()
