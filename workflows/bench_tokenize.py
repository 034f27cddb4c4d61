"""Benchmark `pretrain tokenize` against bare ``sp.encode`` over the same text, on one core.

Builds (or reuses, under ``--work``) the sample corpus, an 8,000-piece tokenizer and its token
shards, then measures in one process, best of ``--repeats``:
  * baseline: ``sp.encode(texts)`` (SentencePiece's batch call, one thread) over every document's text,
    already in memory;
  * ours: ``tokenize_shard`` over every corpus shard: read the Arrow shard, encode, split held-out
    documents, write the memory-mapped arrays (what one `--workers` process does per shard).
It prints tokens/s for both and the ratio.

    .venv/bin/python workflows/bench_tokenize.py [--work out/bench/pretrain] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pretrain.shards import ShardJob, tokenize_corpus, tokenize_shard  # noqa: E402
from pretrain.tokenizer import Tokenizer, language_shards, read_texts, train_tokenizer  # noqa: E402

VOCAB = 8000


def prepare(work: Path) -> tuple[Path, Path, Path]:
    """(corpus, tokenizer, tokens) directories for the bundled sample, built once under ``work``."""
    from pipeline.__main__ import main as pipeline_main

    corpus, tok, tokens = work / "corpus", work / "tokenizer", work / "tokens"
    if not (corpus / "sampling.json").is_file():
        assert pipeline_main(["run", "--no-progress", "--config", str(ROOT / "configs/corpus/sample.yaml"),
                              "--output", str(corpus), "--set", "beam_options=[]",
                              "--set", "write.shard_size_mb=0.25"]) == 0
    if not (tok / "tokenizer_meta.json").is_file():
        train_tokenizer(corpus, tok, vocab_size=VOCAB, sample_size=50_000)
    if not (tokens / "meta.json").is_file():
        tokenize_corpus(corpus, tok, tokens, valid_fraction=0.01)
    return corpus, tok, tokens


def best_rate(repeats: int, run) -> float:
    """Best tokens/s of ``repeats`` calls of ``run() -> tokens``."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = run()
        rates.append(tokens / (time.perf_counter() - start))
    return max(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="out/bench/pretrain", help="where the sample corpus, tokenizer and tokens live")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side; the best counts")
    args = parser.parse_args()
    corpus, tok_dir, _ = prepare(Path(args.work))
    tok = Tokenizer.load(tok_dir)
    paths = [(lang, p) for lang, ps in language_shards(corpus).items() for p in ps]
    texts = [t or "" for _, p in paths for t in read_texts(p)]
    characters = sum(map(len, texts))

    def bare() -> int:
        return sum(map(len, tok.sp.encode(texts, num_threads=1)))  # its default uses every core

    def ours() -> int:
        with tempfile.TemporaryDirectory() as out:
            infos = [tokenize_shard(ShardJob(p, Path(out) / lang / Path(p).stem, lang, 0.01, None), tok) for lang, p in paths]
        return sum(i["train"]["tokens"] + i["valid"]["tokens"] for i in infos)

    assert bare() == ours()
    base, mine = best_rate(args.repeats, bare), best_rate(args.repeats, ours)
    print(f"{len(texts)} documents, {characters} characters, {bare()} tokens, vocab {tok.vocab_size}, 1 core, "
          f"best of {args.repeats}")
    print(f"{'run':<44} {'tokens/s':>12} {'ratio':>7}")
    print(f"{'sp.encode(texts) in memory (baseline)':<44} {base:>12,.0f} {1.0:>6.2f}x")
    print(f"{'tokenize_shard: read + encode + split + write':<44} {mine:>12,.0f} {mine / base:>6.2f}x")


if __name__ == "__main__":
    main()
