"""Write a training checkpoint as an HF transformers model directory (config.json, model.safetensors,
tokenizer files): XLMRobertaForMaskedLM for XLM-R, DebertaV2ForMaskedLM for mDeBERTa-v3 (its discriminator;
the RTD generator goes to <out>/generator).

--checkpoint takes a run dir, its checkpoints/ dir (the checkpoint `latest` names, or --tag) or one
step-<N> dir. ZeRO-1/2/3 partitions are merged into fp32 weights by DeepSpeed's zero_to_fp32, so
the export needs no GPU and works for any ZeRO stage and rank count.
"""
from __future__ import annotations

import argparse
import os
import shutil
import uuid
from pathlib import Path

from pipeline.util.configfile import path_argument


def export(checkpoint: str, tag: str | None, out: str, tokenizer: str | None = None) -> None:
    """Export ``checkpoint`` (``tag``, or ``latest``) to ``out``, with the tokenizer files of
    ``tokenizer`` (default: the folder the checkpoint's meta.json names). The model is written to a
    folder beside ``out`` and swapped in whole, so a failed export leaves the previous one as it was."""
    from pipeline.output import fs
    from pipeline.util.errors import UserError
    from pretrain.checkpoint import load_for_inference
    from pretrain.models.hf import TOKENIZER_FILES, save_hf

    final = Path(os.path.realpath(out))  # a link to a folder: the folder is swapped, the link kept
    fs.check_folder(out, "--out", ("config.json", "model.safetensors", "generator", *TOKENIZER_FILES))
    held = sorted(p.name for p in final.iterdir()) if final.is_dir() else []
    if held and "config.json" not in held:  # every export has one: this is a tokenizer's folder, say
        raise UserError(f"--out {out}: the folder holds {', '.join(held[:3])}{' ...' if len(held) > 3 else ''} and no "
                        "config.json: not an earlier export (an export replaces its folder whole); give a new or empty "
                        "folder, or an earlier export's")
    fs.restore_folder(final)  # an export killed between its two renames
    cfg, model, tokenizer_dir = load_for_inference(checkpoint, tag, tokenizer=tokenizer)
    staging = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex}")
    try:
        save_hf(model, cfg, staging, tokenizer_dir=tokenizer_dir, generator=cfg.objective == "rtd")
        fs.swap_folder(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="run dir, checkpoints dir, or checkpoint (step-<N>) dir")
    parser.add_argument("--tag", help="checkpoint tag (step-<N>) in a run or checkpoints dir (default: `latest`)")
    parser.add_argument("--out", required=True, type=path_argument,
                        help="output directory for the HF model (replaced whole once written)")
    parser.add_argument("--tokenizer", help="tokenizer dir whose files go with the model (default: the one the "
                        "checkpoint's meta.json names, e.g. after the run was copied from another machine)")


def main(args: argparse.Namespace) -> int:
    export(args.checkpoint, args.tag, args.out, args.tokenizer)
    print(f"exported {args.checkpoint} to {args.out}")
    return 0
