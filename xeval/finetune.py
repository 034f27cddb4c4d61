"""Fine-tuning and evaluation: AdamW with linear warmup/decay, seeded (bitwise reproducible on CPU;
on a GPU some of torch's kernels, the embedding's backward among them, are not deterministic), optional
data-parallel ranks (torch.distributed, launched by the DeepSpeed launcher or torchrun).

Checkpoint selection uses the selection languages' *dev* accuracy only (:func:`select`); the test
sets are evaluated once, on the selected weights.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import random
from typing import Any, Iterator

import numpy as np
import torch

from .config import TrainConfig
from .data import LABELS, NLISet
from .model import Classifier


@dataclasses.dataclass
class Encoded:
    """Token ids of sentence pairs (HF pair encoding, truncated to max_length) and labels."""

    ids: list[list[int]]
    labels: list[int]
    types: list[list[int]] | None = None
    """Segment ids (``token_type_ids``) where they go to the model: the hf engine's, when its
    tokenizer gives them (BERT's family), as HF's Trainer passes every input its tokenizer makes."""

    @classmethod
    def joined(cls, parts: list["Encoded"]) -> "Encoded":
        """The pairs of ``parts`` in order."""
        types = [t for e in parts for t in e.types] if parts and all(e.types is not None for e in parts) else None
        return cls([i for e in parts for i in e.ids], [y for e in parts for y in e.labels], types)

    def inputs(self, rows: list[int], pad_id: int, device: str) -> dict[str, torch.Tensor]:
        """The model's keyword inputs for ``rows``: right-padded ``input_ids``, ``attention_mask``
        and, where there are segment ids, ``token_type_ids`` (padded with 0)."""
        ids = [self.ids[i] for i in rows]
        width = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        segments = torch.zeros((len(ids), width), dtype=torch.long) if self.types is not None else None
        for row, (index, seq) in enumerate(zip(rows, ids)):
            input_ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, :len(seq)] = 1
            if segments is not None:
                segments[row, :len(seq)] = torch.tensor(self.types[index], dtype=torch.long)
        out = {"input_ids": input_ids.to(device), "attention_mask": mask.to(device)}
        if segments is not None:
            out["token_type_ids"] = segments.to(device)
        return out


@dataclasses.dataclass
class Dist:
    """This process's rank among ``world`` data-parallel ranks."""

    rank: int = 0
    world: int = 1

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(tensor)
        return tensor


def init_distributed(device: str) -> Dist:
    """Join the process group when launched with RANK/WORLD_SIZE (DeepSpeed launcher, torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Dist(torch.distributed.get_rank(), world)


def encode(tokenizer: Any, nli: NLISet, max_length: int, segments: bool = False) -> Encoded:
    """HF's own pair encoding (special tokens, longest-first truncation) of every example, with the
    segment ids the tokenizer gives where ``segments`` (a model that takes them)."""
    out = tokenizer(nli.premises, nli.hypotheses, truncation=True, max_length=max_length)
    types = [list(t) for t in out["token_type_ids"]] if segments and "token_type_ids" in out else None
    return Encoded([list(ids) for ids in out["input_ids"]], list(nli.labels), types)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


@torch.no_grad()
def confusion(classifier: Classifier, data: Encoded, pad_id: int, cfg: TrainConfig, dist: Dist) -> np.ndarray:
    """3x3 counts [gold, predicted] over ``data`` (each rank takes every world-th example; summed)."""
    module = classifier.module
    was_training = module.training
    module.eval()
    counts = torch.zeros((len(LABELS), len(LABELS)), dtype=torch.long)
    # longest first, so each batch holds pairs of similar length (little padding); counts ignore the order
    mine = sorted(range(dist.rank, len(data.labels), dist.world), key=lambda i: -len(data.ids[i]))
    for start in range(0, len(mine), cfg.eval_batch_size):
        batch = mine[start:start + cfg.eval_batch_size]
        inputs = data.inputs(batch, pad_id, cfg.device)
        with torch.autocast(device_type=cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.bf16):
            predicted = module(**inputs).logits.float().argmax(-1).cpu()
        for gold, pred in zip((data.labels[i] for i in batch), predicted.tolist()):
            counts[gold, pred] += 1
    module.train(was_training)
    counts = dist.all_sum(counts.to(cfg.device)).cpu()
    return counts.numpy()


def scores(matrix: np.ndarray) -> dict[str, Any]:
    """Accuracy, example count and the confusion matrix (rows gold, columns predicted)."""
    total = int(matrix.sum())
    return {"accuracy": float(np.trace(matrix)) / total if total else 0.0, "n": total,
            "confusion": matrix.astype(int).tolist()}


def select(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluation point with the highest selection-language dev score (earliest on ties).

    Each point holds ``score`` (mean dev accuracy over the selection languages); test results are
    not part of a point, so they cannot influence the choice.
    """
    best = history[0]
    for point in history[1:]:
        if point["score"] > best["score"]:
            best = point
    return best


def _batches(n: int, batch_size: int, seed: int, epoch: int) -> Iterator[list[int]]:
    """The global batches of one epoch: a permutation seeded by (seed, epoch)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=generator).tolist()
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]


def _optimizer(module: torch.nn.Module, cfg: TrainConfig, total_steps: int) -> tuple[torch.optim.Optimizer, Any]:
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.learning_rate)
    warmup = int(round(cfg.warmup * total_steps)) if cfg.warmup < 1 else int(cfg.warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def finetune(classifier: Classifier, train: Encoded, dev: dict[str, Encoded], selection: list[str],
             pad_id: int, cfg: TrainConfig, seed: int, dist: Dist, log: Any = print) -> dict[str, Any]:
    """Train ``classifier`` in place; returns the history of dev evaluations and the selected point,
    and leaves the selected point's weights loaded."""
    module = classifier.module.to(cfg.device)
    trainable: torch.nn.Module = module
    if dist.world > 1:
        trainable = torch.nn.parallel.DistributedDataParallel(
            module, device_ids=[torch.device(cfg.device).index] if cfg.device.startswith("cuda") else None)
    steps_per_epoch = sum(1 for b in _batches(len(train.labels), cfg.batch_size, seed, 0) if len(b) >= dist.world)
    total = steps_per_epoch * cfg.epochs
    optimizer, schedule = _optimizer(module, cfg, total)
    history: list[dict[str, Any]] = []
    best_state: dict[str, torch.Tensor] | None = None
    step, loss_sum, loss_count = 0, 0.0, 0
    module.train()

    def evaluate(epoch: int) -> None:
        nonlocal best_state, loss_sum, loss_count
        dev_acc = {lang: scores(confusion(classifier, dev[lang], pad_id, cfg, dist))["accuracy"] for lang in selection}
        # each rank's share of the global mean loss, summed over the ranks (every rank evaluates)
        loss_sum = float(dist.all_sum(torch.tensor([loss_sum], dtype=torch.float64, device=cfg.device))[0])
        point = {"epoch": epoch, "step": step, "train_loss": loss_sum / max(1, loss_count),
                 "dev": dev_acc, "score": sum(dev_acc.values()) / len(dev_acc)}
        if not history or point["score"] > select(history)["score"]:
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
        history.append(point)
        loss_sum, loss_count = 0.0, 0
        log(f"seed {seed} epoch {epoch} step {step}/{total}: train loss {point['train_loss']:.4f}, "
            f"dev {' '.join(f'{k} {v:.4f}' for k, v in dev_acc.items())}")

    for epoch in range(1, cfg.epochs + 1):
        for batch in _batches(len(train.labels), cfg.batch_size, seed, epoch):
            if len(batch) < dist.world:
                continue
            mine = batch[dist.rank::dist.world]
            inputs = train.inputs(mine, pad_id, cfg.device)
            labels = torch.tensor([train.labels[i] for i in mine], device=cfg.device)
            with torch.autocast(device_type=cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.bf16):
                logits = trainable(**inputs).logits
            # sum over this rank's examples / global batch size, x world (DDP averages ranks): the global mean
            loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum") * dist.world / len(batch)
            loss.backward()
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_sum += float(loss.detach()) / dist.world
            loss_count += 1
            if cfg.eval_every and step % cfg.eval_every == 0 and step % steps_per_epoch:
                evaluate(epoch)
        evaluate(epoch)
    selected = select(history)
    assert best_state is not None
    module.load_state_dict(best_state)
    return {"history": history, "selected": copy.deepcopy(selected), "steps": total}
