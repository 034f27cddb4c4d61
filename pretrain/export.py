"""Write a training checkpoint as an HF transformers model directory (config.json, model.safetensors,
tokenizer files): XLMRobertaForMaskedLM for XLM-R, DebertaV2ForMaskedLM for mDeBERTa-v3 (its discriminator;
the RTD generator goes to <out>/generator).

--checkpoint takes a run dir, its checkpoints/ dir (the checkpoint `latest` names, or --tag) or one
step-<N> dir. ZeRO-1/2/3 partitions are merged into fp32 weights by DeepSpeed's zero_to_fp32, so
the export needs no GPU and works for any ZeRO stage and rank count.
"""
from __future__ import annotations

import argparse


def export(checkpoint: str, tag: str | None, out: str) -> None:
    """Export ``checkpoint`` (``tag``, or ``latest``) to ``out``."""
    from pretrain.checkpoint import load_for_inference
    from pretrain.models.hf import save_hf

    cfg, model, tokenizer_dir = load_for_inference(checkpoint, tag)
    save_hf(model, cfg, out, tokenizer_dir=tokenizer_dir, generator=cfg.objective == "rtd")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="run dir, checkpoints dir, or checkpoint (step-<N>) dir")
    parser.add_argument("--tag", help="checkpoint tag (step-<N>) in a run or checkpoints dir (default: `latest`)")
    parser.add_argument("--out", required=True, help="output directory for the HF model")


def main(args: argparse.Namespace) -> int:
    export(args.checkpoint, args.tag, args.out)
    print(f"exported {args.checkpoint} to {args.out}")
    return 0
