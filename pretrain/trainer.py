"""Pretrain XLM-R (MLM) or mDeBERTa-v3 (RTD) on token shards with DeepSpeed (ZeRO 1/2/3, bf16, multi-node).

Launch one process (`python -m pretrain train --config C`), several local ranks
(`deepspeed --num_nodes 1 --num_accelerators N --no_local_rank --module pretrain train --config C`, or
`torchrun --standalone --nproc_per_node N -m pretrain train --config C`) or many nodes
(`deepspeed --hostfile hosts --no_local_rank --module pretrain train --config C`; see
workflows/train_multinode.sh). The rank comes from the environment the launchers set.
On CPU it runs with gloo in fp32. Writes <output>/metrics.jsonl, <output>/tensorboard/,
<output>/checkpoints/step-<N>/ (+ `latest`), and at the end <output>/hf/ (HF transformers format).
`--resume` continues from `latest` (or `--resume step-<N>`) with the same losses as an uninterrupted run.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import json
import math
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from pipeline.util.configfile import (KeysHelpParser, Source, build_dataclass, check_choices_and_ranges, describe,
                                      merged_config_data, path_argument, source_of)
from pipeline.util.errors import UserError
from pretrain.loader import IGNORE, LoaderConfig, MLMLoader

if TYPE_CHECKING:
    from pretrain.shards import TokenShards


@dataclasses.dataclass
class OptimizerConfig:
    lr: float = 5e-4
    """Peak learning rate of AdamW."""
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.98])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-6
    """AdamW epsilon."""
    weight_decay: float = 0.01
    """Decoupled weight decay; biases and LayerNorm weights get none."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0: no clipping)."""
    torch_adam: bool | None = None
    """Use torch's AdamW (fused kernel on CUDA) rather than DeepSpeed's FusedAdam/CPU Adam (null: torch's on CPU, where DeepSpeed's would be compiled first)."""


@dataclasses.dataclass
class ScheduleConfig:
    warmup_steps: int = 0
    """Steps of linear warmup from 0 to lr."""
    decay: str = "linear"
    """After warmup: linear or cosine decay reaching min_lr_ratio * lr at step `steps`, one past the last update (as HF's schedules), or constant."""
    min_lr_ratio: float = 0.0
    """Where the decay ends (at step `steps`), as a fraction of lr."""


@dataclasses.dataclass
class IntervalConfig:
    log: int = 10
    """Write a metrics record every this many steps."""
    validate: int = 0
    """Per-language validation loss every this many steps (0: only at the end)."""
    checkpoint: int = 1000
    """Save a checkpoint every this many steps (and at the last step)."""
    keep: int = 3
    """Keep the newest this many checkpoints."""


@dataclasses.dataclass
class RunConfig:
    model: str = "xlmr-base"
    """Model config name (configs/models/<name>.yaml) or YAML path; vocab_size comes from the tokenizer."""
    tokens: str = ""
    """Token shards directory (`pretrain tokenize --out`)."""
    tokenizer: str = ""
    """Tokenizer directory (`pretrain tokenizer --out`) the shards were built with."""
    output: str = ""
    """Run directory: checkpoints/, metrics.jsonl, tensorboard/, hf/."""
    deepspeed: str = "configs/deepspeed/zero2.json"
    """DeepSpeed JSON (ZeRO stage, offload, buckets); batch sizes, optimizer, precision and clipping come from this run config, not the JSON."""
    steps: int = 1000
    """Optimizer steps to train."""
    global_batch_size: int | None = None
    """Sequences per optimizer step over all ranks = loader.batch_size x grad_accum x world size (null: from grad_accum)."""
    grad_accum: int | None = None
    """Micro batches per optimizer step and rank (null: from global_batch_size, else 1)."""
    seed: int = 0
    """Seed of model init, dropout and RTD sampling (loader.seed drives data order and masking)."""
    precision: str = "auto"
    """auto (bf16 where the GPU supports it, else fp32), bf16 or fp32."""
    activation_checkpointing: bool = False
    """Recompute each encoder layer's activations in the backward pass (less memory, ~30% more compute)."""
    compile: bool = False
    """torch.compile the model (DeepSpeed engine.compile)."""
    validation_batches: int = 20
    """Validation batches per language (from the held-out split)."""
    peak_flops: float | None = None
    """Peak FLOP/s of one device for MFU (null: by GPU name, A100 312e12, H100/H200 989e12, H100 PCIe 756e12, NVL 835e12; no MFU on CPU)."""
    tensorboard: bool = True
    """Write TensorBoard scalars to <output>/tensorboard."""
    progress: bool = True
    """Show a progress bar on rank 0."""
    export_hf: bool = True
    """Write <output>/hf (HF transformers format) after the last step."""
    loader: LoaderConfig = dataclasses.field(default_factory=LoaderConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    intervals: IntervalConfig = dataclasses.field(default_factory=IntervalConfig)


CHOICES = {"precision": ("auto", "bf16", "fp32"), "schedule.decay": ("linear", "cosine", "constant")}
RANGES = {
    "steps": (1, None),
    "global_batch_size": (1, None),
    "grad_accum": (1, None),
    "validation_batches": (0, None),
    "seed": (0, 2**32 - 1),
    "peak_flops": (1.0, None),
    "optimizer.lr": (0.0, None),
    "optimizer.eps": (0.0, None),
    "optimizer.weight_decay": (0.0, None),
    "optimizer.grad_clip": (0.0, None),
    "schedule.warmup_steps": (0, None),
    "schedule.min_lr_ratio": (0.0, 1.0),
    "intervals.log": (1, None),
    "intervals.validate": (0, None),
    "intervals.checkpoint": (1, None),
    "intervals.keep": (1, None),
}
RUN_OWNED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer",
                  "scheduler", "bf16", "fp16", "gradient_clipping")
"""DeepSpeed JSON keys the run YAML sets; finding one in the JSON is an error rather than a silent override."""


def load_run_config(path: str | None, sets: list[str] | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The run YAML with ``--set`` strings and overrides applied, checked (unknown keys, types, ranges, paths)."""
    return run_config_and_source(path, sets, overrides)[0]


def run_config_and_source(path: str | None, sets: list[str] | None = None,
                          overrides: dict[str, Any] | None = None) -> tuple[RunConfig, Source]:
    """:func:`load_run_config`, and where each value came from (for the checks that need the run's world size)."""
    data, source = merged_config_data(path, overrides, sets)
    cfg = build_dataclass(RunConfig, data, source)
    check_choices_and_ranges(cfg, source, CHOICES, RANGES)
    cfg.loader.validate(source, "loader")
    if cfg.loader.mask_prob == 0:  # (the loader takes it: unmasked batches)
        raise UserError(f"{source_of(source, 'loader.mask_prob')}: loader.mask_prob=0 masks nothing: a run would "
                        "predict nothing and learn nothing")
    if len(cfg.optimizer.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.optimizer.betas):
        raise UserError(f"{source_of(source, 'optimizer.betas')}: optimizer.betas must be two numbers in [0, 1), got {cfg.optimizer.betas}")
    for key in ("tokens", "tokenizer", "output"):
        value = getattr(cfg, key)
        if not value.strip():  # (blanks: a folder named by them, in the current one)
            raise UserError(f"{source_of(source, key)}: {key} {value!r} names no path" if value else
                            f"{source_of(source, key)}: {key} is not set")
    return cfg, source


def batch_layout(cfg: RunConfig, world_size: int, source: Source | str) -> tuple[int, int]:
    """(grad_accum, global batch) with global = micro (loader.batch_size) x grad_accum x world_size; UserError if they do not fit."""
    micro = cfg.loader.batch_size
    per_step = micro * world_size
    if cfg.global_batch_size is None:
        accum = cfg.grad_accum or 1
        return accum, per_step * accum
    if cfg.global_batch_size % per_step:
        raise UserError(f"{source_of(source, 'global_batch_size', 'loader.batch_size')}: global_batch_size "
                        f"{cfg.global_batch_size} is not divisible by loader.batch_size "
                        f"{micro} x world size {world_size} = {per_step}")
    accum = cfg.global_batch_size // per_step
    if cfg.grad_accum is not None and cfg.grad_accum != accum:
        raise UserError(f"{source_of(source, 'global_batch_size', 'loader.batch_size', 'grad_accum')}: global_batch_size "
                        f"{cfg.global_batch_size} != loader.batch_size {micro} x grad_accum "
                        f"{cfg.grad_accum} x world size {world_size}; set one of global_batch_size, grad_accum")
    return accum, cfg.global_batch_size


def use_bf16(precision: str) -> bool:
    """bf16 when asked, or for auto when a CUDA GPU supports it; fp32 otherwise (CPU)."""
    import torch

    if precision == "auto":  # not bf16 emulated in fp32 (V100, T4), which torch calls supported by default
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    return precision == "bf16"


@functools.lru_cache(maxsize=1)
def deepspeed_keys() -> frozenset[str]:
    """Every name DeepSpeed's source quotes (its config keys among them). DeepSpeed keeps no list
    of its top-level keys and ignores one it does not read; a key that appears nowhere in its
    source is a typo (``zero_optimisation``) or a setting of another tool."""
    import importlib.util

    root = Path(importlib.util.find_spec("deepspeed").origin).parent
    quoted = re.compile(r"""["']([a-z][a-z0-9_]+)["']""")
    return frozenset(word for path in root.rglob("*.py")
                     for word in quoted.findall(path.read_text(encoding="utf-8", errors="replace")))


def model_code(model_cfg: Any) -> dict[str, str]:
    """What a checkpoint's meta.json records of model code that its config does not say: an RTD
    model's head is DeBERTa's ``LMMaskPredictionHead`` (``rtd_head``; before 2026-12-01 it computed
    another function under the same parameter names, so such a checkpoint cannot be resumed)."""
    return {"rtd_head": "deberta"} if model_cfg.objective == "rtd" else {}


def deepspeed_config(cfg: RunConfig, world_size: int, source: Source | str) -> dict[str, Any]:
    """The DeepSpeed config dict: the JSON file's ZeRO settings plus batch sizes, AdamW, clipping and precision from ``cfg``."""
    import torch

    try:
        ds = json.loads(Path(cfg.deepspeed).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{source_of(source, 'deepspeed')}: deepspeed: no such file {cfg.deepspeed}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{cfg.deepspeed}: not valid JSON ({exc})") from None
    if not isinstance(ds, dict):
        raise UserError(f"{cfg.deepspeed}: not a DeepSpeed config (a JSON object of settings)")
    unknown = [k for k in ds if k not in deepspeed_keys()]
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(deepspeed_keys()), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(f"{cfg.deepspeed}: unknown key {unknown[0]!r}{hint}: DeepSpeed reads no such setting and "
                        "would ignore it")
    clash = [k for k in RUN_OWNED_KEYS if k in ds]
    if clash:
        raise UserError(f"{cfg.deepspeed}: key {clash[0]!r} is set from the run config; remove it from the JSON")
    zero = ds.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise UserError(f"{cfg.deepspeed}: zero_optimization must be an object ({{\"stage\": 1, ...}}), got {zero!r}")
    stage = zero.get("stage", 0)
    if stage not in (1, 2, 3):
        raise UserError(f"{cfg.deepspeed}: zero_optimization.stage must be 1, 2 or 3, got {stage!r}")
    accum, global_batch = batch_layout(cfg, world_size, source)
    opt = cfg.optimizer
    torch_adam = (not torch.cuda.is_available()) if opt.torch_adam is None else opt.torch_adam
    ds.update({
        "train_micro_batch_size_per_gpu": cfg.loader.batch_size,
        "gradient_accumulation_steps": accum,
        "train_batch_size": global_batch,
        "gradient_clipping": opt.grad_clip,
        # bf16 has fp32's exponent range: no loss scale, so DeepSpeed's per-parameter overflow test before
        # every step (on by default since DeepSpeed PR #6976, for fp16) only costs time, 14 ms a step on an H100
        # at micro-batch 16 (BENCHMARKS.md); a non-finite loss still shows in metrics.jsonl
        "bf16": {"enabled": use_bf16(cfg.precision), "check_grad_overflow": False},
        "optimizer": {"type": "AdamW", "params": {"lr": opt.lr, "betas": list(opt.betas), "eps": opt.eps,
                                                  "weight_decay": opt.weight_decay, "torch_adam": torch_adam}},
    })
    if ds["bf16"]["enabled"] and stage > 1:
        # micro batches' gradients summed in fp32 (bf16 keeps 8 bits), as Megatron and HF's autocast do, unless the
        # JSON says otherwise. Not at ZeRO-1: there DeepSpeed does it with its BF16_Optimizer, whose checkpoints
        # its zero_to_fp32 cannot merge ("not a zero checkpoint"), so no export could read them
        ds.setdefault("data_types", {"grad_accum_dtype": "fp32"})
    if torch_adam:
        ds["zero_force_ds_cpu_optimizer"] = False
        if torch.cuda.is_available():  # torch's fused AdamW: one kernel for all parameters
            ds["optimizer"]["params"]["fused"] = True
    return ds


def lr_factor(step: int, schedule: ScheduleConfig, total_steps: int) -> float:
    """Learning rate multiplier for optimizer update ``step`` (0-based): linear warmup, then decay."""
    if step < schedule.warmup_steps:
        return (step + 1) / schedule.warmup_steps
    if schedule.decay == "constant":
        return 1.0
    progress = min(1.0, (step - schedule.warmup_steps) / max(1, total_steps - schedule.warmup_steps))
    shape = 1.0 - progress if schedule.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return schedule.min_lr_ratio + (1.0 - schedule.min_lr_ratio) * shape


def param_groups(model: Any, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices, none on biases and LayerNorm weights (1-d parameters)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def enable_activation_checkpointing(model: Any) -> int:
    """Make every encoder layer (each ``LayerStack`` entry, generator and discriminator alike) recompute its
    activations in the backward pass (non-reentrant torch checkpoint, dropout replayed); returns the count."""
    from torch.utils.checkpoint import checkpoint

    from pretrain.models.layers import LayerStack

    layers = [layer for stack in model.modules() if isinstance(stack, LayerStack) for layer in stack.layer]
    for layer in layers:
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
    return len(layers)


def _mlm_loss(metrics: dict[str, Any]) -> Any:
    """The masked-LM loss of a forward pass: XLM-R's mlm_loss or the RTD generator's gen_loss."""
    return metrics["mlm_loss"] if "mlm_loss" in metrics else metrics["gen_loss"]


def _warn_of_no_held_out_tokens(shards: TokenShards, cfg: RunConfig) -> None:
    """Say which languages of the run have no held-out tokens, so no validation loss (which was
    missing from every record without a word): tokens written with ``--valid-fraction 0``, or a
    language of one document, or whose held-out documents are blank."""
    languages = [lang for lang in cfg.loader.languages or shards.languages if lang in shards.languages]
    unheld = [lang for lang in languages if not shards.docs(lang, "valid").num_tokens]
    if unheld:
        fraction = shards.meta.get("valid_fraction")
        why = (f"written with `pretrain tokenize --valid-fraction {fraction}`" if not fraction
               else "a language of one document, or whose held-out documents are blank")
        print(f"warning: tokens {cfg.tokens}: no held-out tokens for {', '.join(unheld)} ({why}): no validation "
              f"loss for {'them' if len(unheld) > 1 else 'it'}", file=sys.stderr, flush=True)


class Trainer:
    """One rank of a training run: engine, loader, checkpoints and metrics."""

    def __init__(self, cfg: RunConfig, source: Source | str, universal: bool = False) -> None:
        import deepspeed
        import deepspeed.comm as dist
        import torch

        from pretrain.checkpoint import CheckpointManager
        from pretrain.flops import flops_per_token
        from pretrain.models import build_pretraining_model, load_model_config
        from pretrain.shards import TokenShards
        from pretrain.tokenizer import Tokenizer

        self.cfg = cfg
        _no_shared_memory_op_for_one_rank()
        deepspeed.init_distributed(verbose=False)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.tokenizer = tokenizer = Tokenizer.load(cfg.tokenizer)
        shards = TokenShards.open(cfg.tokens)
        try:
            shards.check_tokenizer(tokenizer)
        except UserError as exc:
            raise UserError(f"{source_of(source, 'tokens', 'tokenizer')}: {exc}") from None
        self.model_cfg = load_model_config(cfg.model, overrides={"vocab_size": tokenizer.vocab_size})
        longest = self.model_cfg.max_sequence_length
        if longest is not None and cfg.loader.seq_len > longest:
            raise UserError(f"{source_of(source, 'loader.seq_len')}: loader.seq_len {cfg.loader.seq_len} exceeds the model's maximum {longest}")
        self.ds_config = deepspeed_config(cfg, self.world_size, source)
        self.universal = universal
        if universal:
            self.ds_config["checkpoint"] = {**self.ds_config.get("checkpoint", {}), "load_universal": True}
        self.accum = self.ds_config["gradient_accumulation_steps"]
        self.meta = {"model_config": self.model_cfg.to_dict(), **model_code(self.model_cfg),
                     "tokenizer_fingerprint": tokenizer.fingerprint,
                     "tokenizer_dir": str(Path(cfg.tokenizer).resolve()), "world_size": self.world_size,
                     "global_batch": self.ds_config["train_batch_size"], "run_config": dataclasses.asdict(cfg)}
        self.flops_per_token = flops_per_token(self.model_cfg, cfg.loader.seq_len, cfg.loader.batch_size,
                                               cfg.loader.mask_prob)
        self.device_peak = cfg.peak_flops or _default_peak()

        torch.manual_seed(cfg.seed)
        model = build_pretraining_model(self.model_cfg)
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(model)
        if self.rank == 0 and cfg.validation_batches:
            _warn_of_no_held_out_tokens(shards, cfg)
        schedule, steps = cfg.schedule, cfg.steps
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, cfg.optimizer.weight_decay), config=self.ds_config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, schedule, steps)))
        if cfg.compile:
            self.engine.compile()
        self.loader = MLMLoader(shards, cfg.loader, rank=self.rank, world_size=self.world_size, tokenizer=tokenizer)
        self.run_dir = Path(cfg.output)
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", cfg.intervals.keep, self.rank, self.world_size)
        self.step = 0
        self.interval = {"start": 0.0, "steps": 0, "tokens": 0}  # the steps since the last metrics record

    def _reseeded(self, seed: int) -> MLMLoader:
        """The run's loader with its training streams on ``seed``; validation keeps the config's, so
        that losses stay comparable across resumes."""
        return MLMLoader(self.loader.shards, dataclasses.replace(self.cfg.loader, seed=seed), self.rank,
                         self.world_size, self.tokenizer, valid_seed=self.cfg.loader.seed)

    def resume(self, tag: str | None) -> None:
        """Load a checkpoint (``latest`` when ``tag`` is None): weights, optimizer, schedule, loader, RNG, step.
        Through a universal checkpoint (another rank count) the loaders and RNGs restart from seeds offset by the step."""
        import random

        import deepspeed.comm as dist
        import numpy as np
        import torch

        from pretrain.checkpoint import set_rng_state

        tag = self.checkpoints.resolve(tag)
        meta, rank_state = self.checkpoints.load(self.engine, tag, self.meta, universal=self.universal)
        self.step = meta["step"]
        if self.step > self.cfg.steps:
            raise UserError(f"--resume: checkpoint {tag} is at step {self.step}, past --steps {self.cfg.steps}: nothing "
                            f"to train; give --steps above {self.step} to go on")
        if rank_state is None:
            # (the seeds wrap around within their 32 bits; the loader's RNGs take no more)
            self.loader = self._reseeded((self.cfg.loader.seed + self.step) % 2**32)
            seed = (self.cfg.seed + self.step * self.world_size + self.rank) % 2**32
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            if self.rank == 0:
                print(f"resumed {tag} (written by {meta['world_size']} ranks) on {self.world_size} ranks through a "
                      f"universal checkpoint: data order restarts with loader seed {self.loader.cfg.seed}", flush=True)
        else:
            seed = rank_state["loader"].get("seed")  # another: a universal resume of this run restarted its data order
            if isinstance(seed, int) and 0 <= seed < 2**32 and seed != self.loader.cfg.seed:  # (else refused below)
                self.loader = self._reseeded(seed)
            self.loader.load_state_dict(rank_state["loader"])
            set_rng_state(rank_state["rng"])
        if self.rank == 0 and self.checkpoints.latest() != tag:
            self.checkpoints.point_latest(tag)  # checkpoints after this one belong to an abandoned future
        dist.barrier()

    def train(self) -> dict[str, Any]:
        """Train to ``cfg.steps``; returns the last training record."""
        from pretrain.metrics import MetricsLogger

        cfg = self.cfg
        logger = MetricsLogger(self.run_dir, self.rank == 0, cfg.tensorboard, cfg.progress, cfg.steps, self.step)
        record: dict[str, Any] = {}
        batches = iter(self.loader)
        try:
            while self.step < cfg.steps:
                logged = (self.step + 1) % cfg.intervals.log == 0 or self.step + 1 == cfg.steps
                record = self._train_step(batches, read=logged)
                self.step += 1
                last = self.step == cfg.steps
                if logged:
                    logger.log(self.step, record)
                if (cfg.intervals.validate and self.step % cfg.intervals.validate == 0) or last:
                    with self._outside_interval():
                        logger.log(self.step, self.validate())
                if self.step % cfg.intervals.checkpoint == 0 or last:
                    with self._outside_interval():
                        self.save()
                        logger.flush()
                logger.advance()
        finally:
            logger.close()
        if cfg.export_hf and self.rank == 0:
            from pretrain.export import export

            export(str(self.run_dir / "checkpoints"), None, str(self.run_dir / "hf"))
        return record

    def _train_step(self, batches: Iterator[dict[str, Any]], read: bool = True) -> dict[str, Any]:
        """One optimizer step of ``accum`` micro batches. With ``read`` (a log step) it returns the
        record: this step's losses and metrics over its predicted positions and tokens on every
        rank (the models' ``divisors``; RTD's disc_recall: the micro batches' mean), and the time
        and tokens/s of the steps since the last record. Without, nothing is read back from the
        device (no sync: the GPU runs ahead) and the record is empty."""
        import deepspeed.comm as dist
        import torch

        from pretrain.metrics import memory_gb, mfu

        if self.interval["steps"] == 0:
            self.interval["start"] = time.perf_counter()
        engine = self.engine
        engine.train()
        lr = engine.get_lr()[0]
        sums: dict[str, Any] = {}
        hosts = [next(batches) for _ in range(self.accum)]
        counts = [(int(host["labels"].ne(IGNORE).sum()), int(host["attention_mask"].sum())) for host in hosts]
        tokens = sum(real for _, real in counts)  # on the host: no wait for the device
        divisors = self._divisors(counts)
        for host in hosts:
            # packed rows without padding need no mask: attention may then take SDPA's flash kernel
            mask = None if bool(host["attention_mask"].all()) else host["attention_mask"].to(engine.device)
            batch = {k: v.to(engine.device, non_blocking=True) for k, v in host.items() if k != "attention_mask"}
            out = engine(input_ids=batch["input_ids"], attention_mask=mask, labels=batch["labels"], divisors=divisors)
            engine.backward(out.loss)
            engine.step()
            for key, value in {"loss": out.loss.detach(), **out.metrics}.items():
                sums[key] = sums.get(key, 0.0) + value.float()
        self.interval["steps"] += 1
        self.interval["tokens"] += tokens
        if not read:
            return {}
        keys = sorted(sums)
        interval_tokens = torch.tensor(float(self.interval["tokens"]), device=engine.device)
        totals = torch.stack([sums[k] for k in keys] + [interval_tokens]).double()
        dist.all_reduce(totals)
        values = (totals[:-1] / (self.accum * self.world_size)).tolist()  # the sync: the device finishes here
        elapsed = time.perf_counter() - self.interval["start"]
        tokens_per_s = float(totals[-1]) / elapsed
        step_time = elapsed / self.interval["steps"]
        self.interval = {"start": 0.0, "steps": 0, "tokens": 0}
        grad_norm = engine.get_global_grad_norm()
        return {**dict(zip(keys, values)), "lr": lr, "grad_norm": None if grad_norm is None else float(grad_norm),
                "step_time": step_time, "tokens_per_s": tokens_per_s, "flops_per_token": self.flops_per_token,
                "mfu": mfu(self.flops_per_token, tokens_per_s, self.device_peak, self.world_size), **memory_gb()}

    @contextlib.contextmanager
    def _outside_interval(self) -> Iterator[None]:
        """What runs inside (a validation, a checkpoint between two log steps) is left out of the next
        record's step_time and tokens/s; the steps the device still had queued are finished first,
        and still count."""
        from deepspeed.accelerator import get_accelerator

        if not self.interval["steps"]:  # (the interval starts at the next step)
            yield
            return
        get_accelerator().synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.interval["start"] += time.perf_counter() - start

    def _divisors(self, counts: list[tuple[int, int]]) -> Any:
        """The step's (predicted positions, real tokens) over this rank's micro batches and every rank,
        each divided by micro batches x ranks (at least 1 in all), on the device: the models'
        ``divisors`` (``heads.PREDICTED``). DeepSpeed divides each micro batch's loss by the micro
        batches and averages the gradients over the ranks, so the step's gradient is then the sum of
        every term over the step's own count. All-reduced on the device: the host does not wait."""
        import deepspeed.comm as dist
        import torch

        total = torch.tensor([sum(column) for column in zip(*counts)], dtype=torch.float64)
        total = total.to(self.engine.device, non_blocking=True)  # (a blocking copy would wait for the device)
        dist.all_reduce(total)
        return (total.clamp(min=1.0) / (self.accum * self.world_size)).float()

    def validate(self) -> dict[str, float]:
        """Per-language MLM loss and perplexity on the held-out split (every rank runs the same batches, so
        ZeRO-3 gathers stay in step); the training RNG streams are left untouched."""
        import torch

        engine = self.engine
        engine.eval()
        record: dict[str, float] = {}
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            for lang in self.loader.languages:
                loss_sum, count = 0.0, 0
                for _, batch in zip(range(self.cfg.validation_batches), self.loader.valid_batches(lang)):
                    batch = {k: v.to(engine.device) for k, v in batch.items()}
                    out = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
                    predicted = int((batch["labels"] != -100).sum())
                    loss_sum += float(_mlm_loss(out.metrics)) * predicted
                    count += predicted
                if count:
                    record[f"valid/{lang}/loss"] = loss_sum / count
                    record[f"valid/{lang}/ppl"] = math.exp(min(loss_sum / count, 50.0))
        engine.train()
        return record

    def save(self) -> str:
        from pretrain.checkpoint import rng_state

        meta = {**self.meta, "step": self.step}
        return self.checkpoints.save(self.engine, self.step, meta, {"loader": self.loader.state_dict(), "rng": rng_state()})


def _default_peak() -> float | None:
    from pretrain.metrics import default_peak_flops

    return default_peak_flops()


def add_arguments(parser: KeysHelpParser) -> None:
    parser.add_argument("--config", required=True, help="run YAML (configs/pretrain/*.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (value read as YAML), e.g. --set optimizer.lr=1e-4; repeatable")
    parser.add_argument("--output", type=path_argument, help="run directory (overrides `output`)")
    parser.add_argument("--steps", type=int, help="optimizer steps (overrides `steps`)")
    parser.add_argument("--deepspeed-config", dest="deepspeed", help="DeepSpeed JSON (overrides `deepspeed`)")
    parser.add_argument("--resume", nargs="?", const="latest", metavar="TAG",
                        help="continue from the checkpoint `latest` names, or from TAG (step-<N>)")
    parser.add_argument("--universal", action="store_true",
                        help="with --resume: load through a DeepSpeed universal checkpoint (step-<N> is converted to "
                             "step-<N>-universal once), to continue on another number of GPUs; not bit-exact: the "
                             "data order restarts with a seed offset by the step")
    parser.epilog = lambda: "config keys (YAML, or --set KEY=VALUE):\n" + "\n".join(describe(RunConfig, "", CHOICES))


MPI_WORLD_SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
"""What Open MPI, MPICH, MVAPICH and srun set to the number of processes they start (DeepSpeed's
``--launcher openmpi|mvapich|slurm``, or mpirun and srun themselves), which set no RANK: DeepSpeed
reads the ranks from MPI there, through mpi4py (on Azure ML and SageMaker from Open MPI's variables)."""


def _mpi_launch() -> str | None:
    """``VAR=n`` of the MPI launcher or srun that started this process among others, or None."""
    return next((f"{var}={os.environ[var]}" for var in MPI_WORLD_SIZE
                 if os.environ.get(var, "1").strip() not in ("", "1")), None)


def _single_process_env() -> None:
    """Plain `python -m pretrain train`: a world of one, like the launchers would describe it. Not
    under an MPI launcher or srun of several processes, whose ranks DeepSpeed finds itself."""
    if "RANK" in os.environ:
        return
    launched = _mpi_launch()
    if launched is None:
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"})
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        return
    import importlib.util

    platform = any(var in os.environ for var in ("AZUREML_EXPERIMENT_ID", "SM_TRAINING_ENV"))
    if not platform and importlib.util.find_spec("mpi4py") is None:
        raise UserError(f"{launched}: started by an MPI launcher or srun, which set no RANK; DeepSpeed reads the "
                        "ranks from MPI through mpi4py, which is not installed (pip install mpi4py), or start with "
                        "deepspeed's ssh launcher (workflows/train_multinode.sh) or torchrun")


def _no_shared_memory_op_for_one_rank() -> None:
    """A world of one has nothing to all-reduce: DeepSpeed's CPU backend would still JIT-compile its
    shared-memory all-reduce (``deepspeed_shm_comm``, about a minute on 2 cores, and again whenever
    the virtualenv moves) in ``init_distributed``. Marked unusable here, DeepSpeed keeps to
    torch.distributed, as it does where the op cannot be built. With several ranks it is built; on a
    GPU DeepSpeed has no such op."""
    from deepspeed.accelerator import get_accelerator

    if int(os.environ.get("WORLD_SIZE", "1")) == 1 and _mpi_launch() is None and get_accelerator().device_name() == "cpu":
        import deepspeed.ops
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


OTHER_OUTPUTS = {("config.json", "model_type"): "an HF model (pretrain export)",
                 ("meta.json", "tokenizer"): "token shards (pretrain tokenize)",
                 ("tokenizer_meta.json", "fingerprint"): "a tokenizer (pretrain tokenizer)",
                 ("stats.json", "counters"): "a corpus (pipeline run)"}
"""Files at the top of another command's output folder (a JSON object with that key: not a user's own
``config.json``), which a run directory never holds there."""


def check_run_dir(cfg: RunConfig, source: Source | str) -> None:
    """UserError if ``output`` is, or lies in, the token shards or the tokenizer the run reads, or is
    another command's output folder: the run's files would mix with them (and the command that
    wrote them would refuse its folder afterwards)."""
    from pipeline.output import fs

    where = f"{source_of(source, 'output')}: output {cfg.output}"
    for key in ("tokens", "tokenizer"):
        read = getattr(cfg, key)
        if os.path.realpath(cfg.output) == os.path.realpath(read) or fs.below(cfg.output, read):
            raise UserError(f"{where}: the {key} folder the run reads ({read}), or in it; give the run a folder of "
                            "its own")
    out = Path(cfg.output)
    found = next(((name, what) for (name, key), what in OTHER_OUTPUTS.items() if _json_has(out / name, key)), None)
    if found:
        raise UserError(f"{where}: the folder holds {found[0]}, {found[1]}; give the run a folder of its own")


def _json_has(path: Path, key: str) -> bool:
    """Whether ``path`` is a JSON object holding ``key``."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and key in data


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM as an exit that runs the handlers on its way out (DeepSpeed's launcher and torchrun
    send it to the ranks left when one fails)."""
    raise SystemExit(128 + signum)


def _rank_zero() -> bool:
    """Whether this process is rank 0: the process group's, else the launcher's RANK (none: one process)."""
    import torch.distributed as dist

    return dist.get_rank() == 0 if dist.is_available() and dist.is_initialized() else \
        os.environ.get("RANK", "0").strip() == "0"


def _remove_if_nothing_recorded(run_dir: Path) -> None:
    """Remove the run folder a failed run made if it holds no checkpoint and no metrics record (bad
    shards, a tokenizer mismatch, an interruption before the first logged step): only an empty
    metrics.jsonl and TensorBoard's header. A run that logged a step keeps its records to look at."""
    metrics = run_dir / "metrics.jsonl"
    if not (run_dir / "checkpoints").exists() and (not metrics.exists() or metrics.stat().st_size == 0):
        shutil.rmtree(run_dir, ignore_errors=True)


def main(args: argparse.Namespace) -> int:
    cfg, source = run_config_and_source(args.config, args.set, {"output": args.output, "steps": args.steps,
                                                                "deepspeed": args.deepspeed})
    _single_process_env()
    if args.universal and not args.resume:
        raise UserError("--universal goes with --resume")
    latest = Path(cfg.output) / "checkpoints" / "latest"
    if not args.resume and latest.exists():
        raise UserError(f"run dir {cfg.output} already holds checkpoints (latest: {latest.read_text().strip()}): "
                        f"pass --resume to continue it, or choose another output")
    check_run_dir(cfg, source)
    run_dir = Path(cfg.output)
    made = not run_dir.exists()
    terminated = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # a launcher ends the other ranks so when one fails
    try:
        trainer = Trainer(cfg, source, universal=args.universal)
        if args.resume:
            trainer.resume(None if args.resume == "latest" else args.resume)
        record = trainer.train()
    except BaseException:
        if made and _rank_zero():
            _remove_if_nothing_recorded(run_dir)
        raise
    finally:
        signal.signal(signal.SIGTERM, terminated)
    if trainer.rank == 0:
        print(f"trained {trainer.step} steps: loss {record.get('loss', float('nan')):.4f}; run dir {cfg.output}")
    return 0
