"""Fine-tuning hyperparameters, a light module (no torch) so that `--help` stays fast."""
from __future__ import annotations

import dataclasses

ENGINES = ("auto", "ours", "hf")
"""Model code: ours (pretrain.models), hf (transformers), auto (ours where it supports the model)."""


@dataclasses.dataclass
class TrainConfig:
    """Fine-tuning hyperparameters (keys of configs/xnli/*.yaml)."""

    learning_rate: float = 2e-5
    """AdamW peak learning rate."""
    epochs: int = 3
    """Passes over the training set; dev is evaluated after each (and every eval_every steps)."""
    batch_size: int = 32
    """Global batch size (split over data-parallel ranks)."""
    eval_batch_size: int = 128
    """Batch size for dev/test evaluation."""
    max_length: int = 128
    """Tokens per pair after HF's pair encoding (longest-first truncation)."""
    warmup: float = 0.1
    """Linear warmup: a fraction of all steps (< 1) or a number of steps (>= 1); then linear decay to 0."""
    weight_decay: float = 0.01
    """AdamW weight decay (not on biases and LayerNorm weights)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0: off)."""
    eval_every: int = 0
    """Also evaluate dev every this many steps (0: only at epoch ends)."""
    device: str = "auto"
    """auto (cuda when available), cpu or cuda."""
    bf16: bool = False
    """bfloat16 autocast (GPU)."""
