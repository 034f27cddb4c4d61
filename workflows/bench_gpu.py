"""Benchmark our trainer against HF ``Trainer`` + ``DataCollatorForLanguageModeling`` on one GPU:
XLM-R base and mDeBERTa-v3 base at seq 512, bf16, the same micro-batch and sequences.

For each model: tokens/s (non-padding, median step after --warmup), MFU (model FLOPs from
``pretrain.flops``, which tests/test_flops.py holds against torch's count; the same useful FLOPs per
token for both sides, so the MFU ratio is the speed ratio: HF's dense MLM head does extra work that
is not credited), peak GPU memory, and the ratio ours / HF. mDeBERTa-v3 runs as a masked LM on both
sides (HF has no RTD trainer). The vocabulary is the sample tokenizer's (--vocab-size), not
250k: the MLM head is a smaller share of the FLOPs than in the published models.

    .venv/bin/python workflows/bench_gpu.py [--models xlmr-base mdeberta-v3-base] [--batch 16] [--steps 30]

Without a CUDA device it says so in one line and exits 0, measuring nothing. ``--device cpu`` runs
the same code on the CPU (tests/test_bench_gpu.py does, with a tiny model).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trainer  # noqa: E402  (the shared steppers; it also puts the repository on sys.path)


def model_file(name: str, folder: Path) -> str:
    """A model config as our trainer takes it: mDeBERTa with objective mlm (what HF can train)."""
    import yaml

    from pretrain.models.config import model_config_path

    data = yaml.safe_load(model_config_path(name).read_text(encoding="utf-8"))
    data["objective"] = "mlm"
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def peak_memory_gb() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def reset_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def measure(args: argparse.Namespace, name: str, tokenizer: Path, tokens: Path, work: Path) -> dict[str, Any]:
    """Our trainer's and HF Trainer's median step time, tokens/s, MFU and peak memory for one model."""
    from pretrain.flops import flops_per_token
    from pretrain.metrics import default_peak_flops
    from pretrain.models import load_model_config
    from pretrain.tokenizer import Tokenizer

    args.model = model_file(name, work)
    reset_memory()
    ours, batches = bench_trainer.our_stepper(args, tokenizer, tokens, work / f"{name}-ours")
    times, per_step = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        per_step.append(ours())  # the step's record reads its loss: the GPU is done when it returns
        times.append(time.perf_counter() - start)
    ours_memory = peak_memory_gb()
    del ours
    reset_memory()
    hf_times = bench_trainer.hf_trainer_step_times(args, tokenizer, batches[:args.steps], work / f"{name}-hf")
    hf_memory = peak_memory_gb()
    cfg = load_model_config(args.model, overrides={"vocab_size": Tokenizer.load(tokenizer).vocab_size})
    flops = flops_per_token(cfg, args.seq_len, args.batch)
    peak = default_peak_flops()
    result: dict[str, Any] = {"model": name, "seq_len": args.seq_len, "batch": args.batch, "precision": args.precision,
                              "vocab_size": cfg.vocab_size, "flops_per_token": flops, "peak_flops": peak}
    tokens_per_step = statistics.median(per_step)
    for side, step_times, memory in (("ours", times, ours_memory), ("hf", hf_times, hf_memory)):
        seconds = statistics.median(step_times[args.warmup:])
        result[side] = {"step_s": seconds, "tokens_per_s": tokens_per_step / seconds, "peak_memory_gb": memory,
                        "mfu": flops * tokens_per_step / seconds / peak if peak else None}
    result["ratio_tokens_per_s"] = result["ours"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
    return result


def line(r: dict[str, Any]) -> str:
    def side(s: dict[str, Any]) -> str:
        mfu = f"MFU {s['mfu']:.1%}" if s["mfu"] is not None else "MFU n/a"
        memory = f"{s['peak_memory_gb']:.1f} GiB" if s["peak_memory_gb"] is not None else "memory n/a"
        return f"{s['tokens_per_s']:10.0f} tokens/s  {mfu:>10}  {memory:>9}"
    return (f"{r['model']:<18} ours {side(r['ours'])} | HF Trainer {side(r['hf'])} | "
            f"ours/HF {r['ratio_tokens_per_s']:.2f}x")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A wrong option is one usage error line, before anything is built or loaded (and the plain
    checks before torch is imported: ``pretrain.models`` imports it)."""
    if args.steps <= args.warmup or args.batch < 1 or args.seq_len < 8:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}); --batch >= 1, --seq-len >= 8")
    if bool(args.tokenizer) != bool(args.tokens):
        parser.error("--tokenizer and --tokens go together (or neither: both are built under --work)")
    if args.tokens and not (Path(args.tokens) / "meta.json").is_file():
        parser.error(f"--tokens {args.tokens}: no meta.json (pretrain tokenize writes it)")
    from pipeline.util.errors import UserError
    from pretrain.models.config import model_config_path
    from pretrain.tokenizer import Tokenizer

    try:
        for name in args.models:
            model_config_path(name)
        if args.tokenizer:
            Tokenizer.load(args.tokenizer)
    except UserError as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_trainer.add_arguments(parser, seq_len=512, batch=16, steps=30)
    parser.set_defaults(precision="bf16", work="out/bench/gpu")
    parser.add_argument("--models", nargs="+", default=["xlmr-base", "mdeberta-v3-base"])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--vocab-size", type=int, default=8000, help="of the tokenizer trained on the sample")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: trained under --work)")
    parser.add_argument("--tokens", help="token shards (default: built under --work)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device on this machine: nothing measured (run it where nvidia-smi lists a GPU)")
        return 0
    if args.tokenizer and args.tokens:
        tokenizer, tokens = Path(args.tokenizer), Path(args.tokens)
    else:
        tokenizer, tokens = bench_trainer.ensure_data(Path(args.work), args.vocab_size)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"{device}: seq {args.seq_len}, batch {args.batch}, {args.precision}, {args.steps} steps "
          f"({args.warmup} warm-up), compile {args.compile}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            results.append(measure(args, name, tokenizer, tokens, Path(tmp)))
            print(line(results[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
