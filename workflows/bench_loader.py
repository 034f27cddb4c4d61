"""Benchmark the MLM loader against HF ``DataCollatorForLanguageModeling``, on one core.

Uses the sample corpus's token shards (built under ``--work`` by bench_tokenize's ``prepare``) and
measures, in one process with one torch thread, tokens/s of collated ``[batch, seq_len]`` tensors:
  * baseline: HF transformers' ``DataCollatorForLanguageModeling`` (mlm_probability 0.15, 80/10/10)
    over sequences our loader packed beforehand, given as lists of ids (collation + masking only: the
    baseline does no language sampling, document reading or packing, which flatters it), and its
    masking function alone (``torch_mask_tokens``) on one pre-stacked tensor, flattering it further;
  * ours: ``MLMLoader`` end to end (language choice, reading memory-mapped documents, packing,
    masking, torch tensors) for token, whole-word and span masking, and one document per sequence.

    .venv/bin/python workflows/bench_loader.py [--work out/bench/pretrain] [--seconds 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_tokenize import prepare  # noqa: E402

from pretrain.loader import LoaderConfig, MLMLoader  # noqa: E402
from pretrain.shards import TokenShards  # noqa: E402


def rate(seconds: float, batch: Callable[[], dict[str, torch.Tensor]]) -> float:
    """Tokens (attention_mask ones) per second of ``batch()`` calls over about ``seconds``, after a warm-up."""
    for _ in range(3):
        batch()
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += int(batch()["attention_mask"].sum())
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="out/bench/pretrain", help="where the sample corpus, tokenizer and tokens live")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per run")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, tok_dir, tokens_dir = prepare(Path(args.work))
    shards = TokenShards.open(tokens_dir)
    cfg = LoaderConfig(seq_len=args.seq_len, batch_size=args.batch_size)

    from transformers import DataCollatorForLanguageModeling, XLMRobertaTokenizer

    hf_tok = XLMRobertaTokenizer.from_pretrained(tok_dir)
    collator = DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, return_tensors="pt")
    packed = MLMLoader(shards, dataclasses.replace(cfg, mask_prob=0.0))
    examples = [{"input_ids": row} for _ in range(20) for row in next(packed)["input_ids"].tolist()]
    cursor = iter(range(10**12))

    def hf_batch() -> dict[str, torch.Tensor]:
        start = next(cursor) * args.batch_size % len(examples)
        return collator(examples[start:start + args.batch_size])

    stacked = torch.tensor([e["input_ids"] for e in examples[:args.batch_size]])
    ones = torch.ones_like(stacked)

    def hf_masking_only() -> dict[str, torch.Tensor]:
        inputs, labels = collator.torch_mask_tokens(stacked.clone())
        return {"input_ids": inputs, "labels": labels, "attention_mask": ones}

    baseline = rate(args.seconds, hf_batch)
    masking_only = rate(args.seconds, hf_masking_only)
    runs = {"MLMLoader token masking (full sentences)": cfg,
            "MLMLoader whole-word masking": dataclasses.replace(cfg, masking="whole_word"),
            "MLMLoader span masking": dataclasses.replace(cfg, masking="span"),
            "MLMLoader token, one document per sequence": dataclasses.replace(cfg, cross_document=False)}
    print(f"batch {args.batch_size} x seq_len {args.seq_len}, vocab {shards.vocab_size}, {len(shards.languages)} "
          f"languages, 1 core (torch threads 1), {args.seconds:g} s per run")
    print(f"{'run':<46} {'tokens/s':>12} {'ratio':>7}")
    print(f"{'HF DataCollatorForLanguageModeling (baseline)':<46} {baseline:>12,.0f} {1.0:>6.2f}x")
    print(f"{'HF torch_mask_tokens only, stacked tensor':<46} {masking_only:>12,.0f} {masking_only / baseline:>6.2f}x")
    for name, run_cfg in runs.items():
        loader = MLMLoader(shards, run_cfg)
        ours = rate(args.seconds, lambda: next(loader))
        print(f"{name:<46} {ours:>12,.0f} {ours / baseline:>6.2f}x")


if __name__ == "__main__":
    main()
