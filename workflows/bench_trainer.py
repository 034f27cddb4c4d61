"""Benchmark our DeepSpeed trainer against HF's MLM recipe on the same tiny XLM-R, data and batch:

  * baseline 1, HF ``Trainer`` (transformers + accelerate) with ``DataCollatorForLanguageModeling``
    (mlm_probability 0.15), as ``run_mlm`` sets it up: AdamW, linear schedule, clipping; step times from
    a callback (between consecutive ``on_step_end``: data, masking, forward, backward, optimizer);
  * baseline 2, the same recipe as a plain loop (what ``Trainer`` runs, without its own overhead).

All train HF's model built from our config on the same sequences (our loader's batches, unmasked again for
HF's collator to mask) with the same micro batch, AdamW, lr and clipping, in this one process. Reports
median step times after ``--warmup`` steps (ours and the plain loop alternate step by step, so both see
the same load; ``Trainer`` runs after them), non-padding tokens/s, and ratios ours / baseline (< 1: ours
is faster).

    .venv/bin/python workflows/bench_trainer.py [--work out/bench/trainer] [--steps 30] [--seq-len 128] [--batch 8]

The sample corpus, tokenizer and token shards are built under --work on the first run (~1 min).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)


def ensure_data(work: Path, vocab_size: int = 4000) -> tuple[Path, Path]:
    """(tokenizer dir, token shards dir) of the bundled sample, built under ``work`` if missing."""
    from pipeline.__main__ import main as pipeline_main
    from pretrain.shards import tokenize_corpus
    from pretrain.tokenizer import train_tokenizer

    corpus, tokenizer, tokens = work / "corpus", work / "tokenizer", work / "tokens"
    if not (corpus / "sampling.json").is_file():
        assert pipeline_main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--output", str(corpus),
                              "--set", "beam_options=[]", "--set", "write.shard_size_mb=0.25"]) == 0
    if not (tokenizer / "tokenizer_meta.json").is_file():
        train_tokenizer(corpus, tokenizer, vocab_size=vocab_size, sample_size=20_000, seed=0)
    if not (tokens / "meta.json").is_file():
        tokenize_corpus(corpus, tokenizer, tokens, valid_fraction=0.02)
    return tokenizer, tokens


def our_stepper(args: argparse.Namespace, tokenizer: Path, tokens: Path, run_dir: Path) -> tuple[Callable[[], int], list[dict]]:
    """(a function running one optimizer step of our trainer and returning its non-padding tokens, the list that
    collects the batches it consumed)."""
    from pretrain.trainer import Trainer, _single_process_env, load_run_config

    cfg = load_run_config(None, [
        f"model={args.model}", f"tokens={tokens}", f"tokenizer={tokenizer}", f"output={run_dir}",
        "deepspeed=configs/deepspeed/zero1.json", f"steps={args.steps}", f"loader.seq_len={args.seq_len}",
        f"loader.batch_size={args.batch}", "optimizer.lr=0.0005", "optimizer.torch_adam=true", "progress=false",
        "tensorboard=false", "export_hf=false", f"precision={args.precision}",
        f"compile={str(args.compile).lower()}"])
    _single_process_env()
    trainer = Trainer(cfg, "bench")
    seen: list[dict] = []
    batches = (seen.append(b) or b for b in iter(trainer.loader))

    def step() -> int:
        record = trainer._train_step(batches)
        return round(record["tokens_per_s"] * record["step_time"])
    return step, seen


def hf_model_and_collator(tokenizer_dir: Path, model: str = "xlmr-tiny") -> tuple[Any, Any]:
    """HF's masked LM of our ``model`` config (``XLMRobertaForMaskedLM`` or ``DebertaV2ForMaskedLM``,
    seed 0) and run_mlm's collator."""
    import torch
    from transformers import (DataCollatorForLanguageModeling, DebertaV2Config, DebertaV2ForMaskedLM, XLMRobertaConfig,
                              XLMRobertaForMaskedLM, XLMRobertaTokenizer)

    from pretrain.models import load_model_config
    from pretrain.models.hf import hf_config
    from pretrain.tokenizer import Tokenizer

    vocab = Tokenizer.load(tokenizer_dir).vocab_size
    cfg = load_model_config(model, overrides={"vocab_size": vocab})
    config_class, model_class = ((XLMRobertaConfig, XLMRobertaForMaskedLM) if cfg.arch == "xlmr"
                                 else (DebertaV2Config, DebertaV2ForMaskedLM))
    torch.manual_seed(0)
    hf = model_class(config_class(**hf_config(cfg))).train()
    return hf, DataCollatorForLanguageModeling(XLMRobertaTokenizer.from_pretrained(str(tokenizer_dir)), mlm_probability=0.15)


def unmasked(batch: dict) -> list[dict]:
    """A loader batch as the plain sequences HF's collator takes (masking undone)."""
    import torch

    original = torch.where(batch["labels"] == -100, batch["input_ids"], batch["labels"])
    return [{"input_ids": ids.tolist(), "attention_mask": mask.tolist()}
            for ids, mask in zip(original, batch["attention_mask"])]


def hf_stepper(args: argparse.Namespace, tokenizer_dir: Path, batches: list[dict]) -> Callable[[], None]:
    """One optimizer step of the HF recipe as a plain loop, on the next of ``batches``."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    model, collator = hf_model_and_collator(tokenizer_dir, args.model)
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=5e-4, betas=(0.9, 0.98), eps=1e-6)
    schedule = get_linear_schedule_with_warmup(optimizer, 0, args.steps)
    position = iter(range(len(batches) + args.steps))

    def step() -> None:
        model(**collator(unmasked(batches[next(position)]))).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def hf_trainer_step_times(args: argparse.Namespace, tokenizer_dir: Path, batches: list[dict], out: Path) -> list[float]:
    """Seconds between consecutive optimizer steps of HF ``Trainer`` over the same sequences (its sampler shuffles them)."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model, collator = hf_model_and_collator(tokenizer_dir, args.model)
    examples = [example for batch in batches for example in unmasked(batch)]
    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            ends.append(time.perf_counter())

    training = TrainingArguments(
        output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=5e-4,
        adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-6, weight_decay=0.01, lr_scheduler_type="linear",
        warmup_steps=0, max_grad_norm=1.0, logging_strategy="no", save_strategy="no", report_to=[],
        use_cpu=not torch.cuda.is_available(), bf16=args.precision == "bf16",
        optim="adamw_torch_fused" if torch.cuda.is_available() else "adamw_torch",
        dataloader_num_workers=0, seed=0, disable_tqdm=True, ddp_find_unused_parameters=False)
    Trainer(model=model, args=training, train_dataset=examples, data_collator=collator,
            callbacks=[StepClock()]).train()
    return [b - a for a, b in zip(ends, ends[1:])]


def add_arguments(parser: argparse.ArgumentParser, seq_len: int, batch: int, steps: int) -> None:
    """The options this benchmark and bench_gpu.py share."""
    parser.add_argument("--work", default="out/bench/trainer", help="cache of the sample corpus, tokenizer and shards")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    parser.add_argument("--seq-len", type=int, default=seq_len)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--compile", action="store_true", help="our trainer with compile: true")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, seq_len=128, batch=8, steps=30)
    args = parser.parse_args()
    args.model = "xlmr-tiny"
    tokenizer, tokens = ensure_data(Path(args.work))
    import torch

    print(f"tiny XLM-R (configs/models/xlmr-tiny.yaml), seq {args.seq_len}, batch {args.batch}, {args.steps} steps "
          f"({args.warmup} warm-up), {torch.get_num_threads()} threads")
    ours_times, hf_times, tokens_per_step = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        ours, batches = our_stepper(args, tokenizer, tokens, Path(tmp))
        hf = None
        for _ in range(args.steps):  # alternate, so both see the same load on a shared machine
            start = time.perf_counter()
            tokens_per_step.append(ours())
            ours_times.append(time.perf_counter() - start)
            hf = hf or hf_stepper(args, tokenizer, batches)
            start = time.perf_counter()
            hf()
            hf_times.append(time.perf_counter() - start)
        trainer_times = hf_trainer_step_times(args, tokenizer, batches[:args.steps], Path(tmp) / "hf-trainer")
    ours_s, hf_s = (statistics.median(t[args.warmup:]) for t in (ours_times, hf_times))
    trainer_s = statistics.median(trainer_times[args.warmup:])
    per_step = statistics.median(tokens_per_step)
    for name, seconds in (("HF Trainer + DataCollatorForLanguageModeling (baseline)", trainer_s),
                          ("HF XLMRobertaForMaskedLM + collator, plain loop", hf_s),
                          ("pretrain train (DeepSpeed ZeRO-1, fp32)", ours_s)):
        print(f"{name:<58} {seconds * 1000:8.1f} ms/step  {per_step / seconds:9.0f} tokens/s")
    print(f"ratio ours / HF Trainer step time: {ours_s / trainer_s:.2f}x   ours / plain HF loop: {ours_s / hf_s:.2f}x")


if __name__ == "__main__":
    main()
