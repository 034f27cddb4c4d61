"""Benchmark our DeepSpeed trainer against HF ``Trainer`` + ``DataCollatorForLanguageModeling`` (run_mlm's recipe).

Both train the same tiny XLM-R (HF ``XLMRobertaForMaskedLM`` built from the same config) on the same
sequences (our loader's batches, unmasked again for HF's collator to mask with mlm_probability 0.15)
with the same micro batch, AdamW, lr and clipping, in this one process, one after the other. Reports the
median step time (end of one optimizer step to the end of the next, data and masking included) after
``--warmup`` steps, non-padding tokens/s, and the ratio ours / HF (< 1: ours is faster).

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)


def ensure_data(work: Path) -> tuple[Path, Path]:
    """(tokenizer dir, token shards dir) of the bundled sample, built under ``work`` if missing."""
    from pipeline.__main__ import main as pipeline_main
    from pretrain.shards import tokenize_corpus
    from pretrain.tokenizer import train_tokenizer

    corpus, tokenizer, tokens = work / "corpus", work / "tokenizer", work / "tokens"
    if not (corpus / "sampling.json").is_file():
        assert pipeline_main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--output", str(corpus),
                              "--set", "beam_options=[]", "--set", "write.shard_size_mb=0.25"]) == 0
    if not (tokenizer / "tokenizer_meta.json").is_file():
        train_tokenizer(corpus, tokenizer, vocab_size=4000, sample_size=20_000, seed=0)
    if not (tokens / "meta.json").is_file():
        tokenize_corpus(corpus, tokenizer, tokens, valid_fraction=0.02)
    return tokenizer, tokens


def median_interval(ends: list[float], warmup: int) -> float:
    """Median time between consecutive step ends, skipping the first ``warmup`` steps."""
    gaps = [b - a for a, b in zip(ends, ends[1:])][warmup:]
    return statistics.median(gaps)


def run_ours(args: argparse.Namespace, tokenizer: Path, tokens: Path, run_dir: Path) -> tuple[float, float, list[dict]]:
    """(median step time, median non-padding tokens per step, the batches it trained on)."""
    from pretrain.trainer import Trainer, load_run_config, _single_process_env

    cfg = load_run_config(None, [
        "model=xlmr-tiny", f"tokens={tokens}", f"tokenizer={tokenizer}", f"output={run_dir}",
        "deepspeed=configs/deepspeed/zero1.json", f"steps={args.steps}", f"loader.seq_len={args.seq_len}",
        f"loader.batch_size={args.batch}", "optimizer.lr=0.0005", "optimizer.torch_adam=true", "progress=false",
        "tensorboard=false", "export_hf=false", "precision=fp32"])
    _single_process_env()
    trainer = Trainer(cfg, "bench")
    seen: list[dict] = []
    batches = (seen.append(b) or b for b in iter(trainer.loader))
    ends, tokens_per_step = [time.perf_counter()], []
    for _ in range(args.steps):
        record = trainer._train_step(batches)
        ends.append(time.perf_counter())
        tokens_per_step.append(record["tokens_per_s"] * record["step_time"])
    return median_interval(ends, args.warmup), statistics.median(tokens_per_step), seen


def run_hf(args: argparse.Namespace, tokenizer_dir: Path, batches: list[dict], out: Path) -> float:
    """Median step time of HF Trainer on the same sequences."""
    import torch
    from transformers import (DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments,
                              XLMRobertaConfig, XLMRobertaForMaskedLM, XLMRobertaTokenizer)

    from pretrain.models import load_model_config
    from pretrain.models.hf import hf_config
    from pretrain.tokenizer import Tokenizer

    vocab = Tokenizer.load(tokenizer_dir).vocab_size
    config = XLMRobertaConfig(**hf_config(load_model_config("xlmr-tiny", overrides={"vocab_size": vocab})))
    torch.manual_seed(0)
    model = XLMRobertaForMaskedLM(config)
    examples = []
    for batch in batches:
        original = torch.where(batch["labels"] == -100, batch["input_ids"], batch["labels"])
        examples += [{"input_ids": ids.tolist(), "attention_mask": mask.tolist()}
                     for ids, mask in zip(original, batch["attention_mask"])]
    collator = DataCollatorForLanguageModeling(XLMRobertaTokenizer.from_pretrained(str(tokenizer_dir)), mlm_probability=0.15)
    ends = [time.perf_counter()]

    class StepTimer(TrainerCallback):
        def on_step_end(self, *_args, **_kwargs) -> None:
            ends.append(time.perf_counter())

    training = TrainingArguments(output_dir=str(out), per_device_train_batch_size=args.batch, max_steps=args.steps,
                                 learning_rate=5e-4, weight_decay=0.01, adam_beta2=0.98, adam_epsilon=1e-6,
                                 max_grad_norm=1.0, lr_scheduler_type="linear", logging_steps=args.steps,
                                 save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                                 disable_tqdm=True, seed=0)
    Trainer(model=model, args=training, train_dataset=examples, data_collator=collator,
            callbacks=[StepTimer()]).train()
    return median_interval(ends, args.warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="out/bench/trainer", help="cache of the sample corpus, tokenizer and shards")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    tokenizer, tokens = ensure_data(Path(args.work))
    import torch

    print(f"tiny XLM-R (configs/models/xlmr-tiny.yaml), seq {args.seq_len}, batch {args.batch}, {args.steps} steps "
          f"({args.warmup} warm-up), {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        ours, tokens_per_step, batches = run_ours(args, tokenizer, tokens, Path(tmp) / "ours")
        hf = run_hf(args, tokenizer, batches, Path(tmp) / "hf")
    print(f"HF Trainer + DataCollatorForLanguageModeling: {hf * 1000:8.1f} ms/step  {tokens_per_step / hf:9.0f} tokens/s")
    print(f"pretrain train (DeepSpeed ZeRO-1, fp32):      {ours * 1000:8.1f} ms/step  {tokens_per_step / ours:9.0f} tokens/s")
    print(f"ratio ours / HF step time: {ours / hf:.2f}x")


if __name__ == "__main__":
    main()
