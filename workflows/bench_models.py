"""Benchmark our XLM-R against HF transformers' ``XLMRobertaForMaskedLM`` (baseline), same run,
same weights, same batch: forward + backward time of one training step's loss. DeBERTa configs
(``--configs mdeberta-tiny``) compare our DeBERTa encoder with an MLM head against
``DebertaV2ForMaskedLM`` the same way.

Per config and sequence length it times, interleaved (ours, HF, ours, HF, ...) so that load on a
shared machine hits both alike:
  * ours (sparse MLM head: logits at the 15 % masked positions only) vs HF (dense head + CE with labels)
  * ours dense (logits everywhere, cross-entropy on the masked rows) vs HF
and prints ms per step, tokens/s and the ratio ours/HF (< 1: ours faster). With ``--device cuda``
it runs in bf16 (weights in bf16, as DeepSpeed's bf16 mode) and prints MFU from
``pretrain.flops.flops_per_token`` and the GPU's peak (``pretrain.metrics``).

    .venv/bin/python workflows/bench_models.py                      # CPU: tiny and base, seq 128 and 512
    .venv/bin/python workflows/bench_models.py --configs xlmr-base --seq 512 --device cuda --batch 32
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pretrain.flops import flops_per_token  # noqa: E402
from pretrain.models import MaskedLM, load_model_config  # noqa: E402
from pretrain.models.hf import hf_config, to_hf_state_dict  # noqa: E402


def hf_twin(ours: MaskedLM, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """HF's MaskedLM (XLMRobertaForMaskedLM with SDPA attention; DebertaV2ForMaskedLM) with our weights."""
    import transformers

    data = hf_config(ours.cfg)
    if ours.cfg.arch == "xlmr":
        data["attn_implementation"] = "sdpa"
    hf = transformers.AutoModelForMaskedLM.from_config(transformers.AutoConfig.for_model(data.pop("model_type"), **data))
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours.cfg, ours.state_dict()), strict=False)
    assert not unexpected and all("decoder" in key for key in missing), (missing, unexpected)
    hf.tie_weights()
    return hf.to(device=device, dtype=dtype).train()


def make_batch(cfg, batch: int, seq_len: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Unpadded rows of random ordinary tokens, 15 % of them masked with labels."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, cfg.vocab_size - 1, (batch, seq_len), generator=generator)
    ids[:, 0], ids[:, -1] = 0, 2
    chosen = torch.rand(ids.shape, generator=generator) < 0.15
    chosen[:, 0] = chosen[:, -1] = False
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    ids = torch.where(chosen, torch.full_like(ids, cfg.vocab_size - 1), ids)
    return {k: v.to(device) for k, v in
            {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}.items()}


def step_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor], hf: bool) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        if hf:
            loss = model(**batch).loss
        else:
            loss = model(batch["input_ids"], batch["attention_mask"], batch["labels"]).loss
        loss.backward()
    return step


def timed(step: Callable[[], None], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def compare(steps: dict[str, Callable[[], None]], iters: int, warmup: int, device: str) -> dict[str, float]:
    """Median seconds per step of each callable, run interleaved."""
    for _ in range(warmup):
        for step in steps.values():
            timed(step, device)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(iters):
        for name, step in steps.items():
            times[name].append(timed(step, device))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="xlmr-tiny,xlmr-base", help="model config names, comma-separated")
    parser.add_argument("--seq", default="128,512", help="sequence lengths, comma-separated")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--iters", type=int, default=0, help="timed steps (0: 10 for tiny, 3 for larger configs)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    print(f"device={args.device} dtype={str(dtype).removeprefix('torch.')} threads={torch.get_num_threads()} "
          f"batch={args.batch} torch={torch.__version__}")
    peak = None
    if args.device == "cuda":
        from pretrain.metrics import default_peak_flops
        peak = default_peak_flops()
        print(f"gpu={torch.cuda.get_device_name()} peak_bf16={peak}")
    for name in args.configs.split(","):
        for seq_len in (int(s) for s in args.seq.split(",")):
            torch.manual_seed(0)
            cfg = load_model_config(name, overrides={"objective": "mlm"})
            ours = MaskedLM(cfg).to(device=args.device, dtype=dtype).train()
            ours_dense = MaskedLM(dataclasses.replace(cfg, sparse_mlm_head=False)).to(device=args.device, dtype=dtype)
            ours_dense.load_state_dict(ours.state_dict())
            hf = hf_twin(ours, dtype, args.device)
            batch = make_batch(cfg, args.batch, seq_len, args.device)
            iters = args.iters or (10 if cfg.hidden_size < 256 else 3)
            result = compare({"ours_sparse": step_fn(ours, batch, False),
                              "ours_dense": step_fn(ours_dense.train(), batch, False),
                              "hf": step_fn(hf, batch, True)}, iters, warmup=1, device=args.device)
            tokens = args.batch * seq_len
            line = (f"{name:>12} seq={seq_len:<4} iters={iters:<3} "
                    f"ours(sparse)={result['ours_sparse'] * 1e3:8.1f}ms ours(dense)={result['ours_dense'] * 1e3:8.1f}ms "
                    f"hf={result['hf'] * 1e3:8.1f}ms  ratio sparse/hf={result['ours_sparse'] / result['hf']:.3f} "
                    f"dense/hf={result['ours_dense'] / result['hf']:.3f}  ours tokens/s={tokens / result['ours_sparse']:,.0f}")
            if peak:
                achieved = flops_per_token(cfg, seq_len, args.batch) * tokens / result["ours_sparse"]
                hf_flops = flops_per_token(dataclasses.replace(cfg, sparse_mlm_head=False), seq_len, args.batch) * tokens / result["hf"]
                line += f"  MFU ours={achieved / peak:.3f} hf(dense-head FLOPs)={hf_flops / peak:.3f}"
            print(line, flush=True)
            del ours, ours_dense, hf
    return 0


if __name__ == "__main__":
    sys.exit(main())
