"""Pretraining on the corpus: a SentencePiece tokenizer trained on alpha-sampled text, token
shards, XLM-R or mDeBERTa-v3 pretraining with DeepSpeed, and export to HF transformers format."""
from __future__ import annotations

import sys

from .cli import Commands, dispatch

COMMANDS: Commands = {
    "tokenizer": ("pretrain.tokenizer", "train a SentencePiece unigram tokenizer on alpha-sampled corpus text"),
    "tokenize": ("pretrain.shards", "write memory-mapped token shards per language from a corpus"),
    "train": ("pretrain.trainer", "pretrain XLM-R or mDeBERTa-v3 with DeepSpeed (ZeRO 1/2/3, bf16, multi-node)"),
    "export": ("pretrain.export", "write a checkpoint as an HF transformers model directory"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m pretrain", __doc__ or "", COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
