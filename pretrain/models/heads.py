"""Heads on top of an encoder: the tied MLM head (sparse at masked positions by default), the two
sequence-classification heads (HF names) and the replaced-token-detection head; output records."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig

IGNORE = -100
"""Label of a position that is not predicted."""
PREDICTED, TOKENS = 0, 1
"""Entries of a pretraining model's ``divisors`` (a tensor [2]): an optimizer step's positions to
predict and its real tokens, over all its micro batches and ranks, each divided by micro batches x
ranks. A loss term is then its sum over the micro batch over its unit's divisor, so that the step's
gradient weighs every predicted position (and, for the RTD discriminator, every real token) alike,
however the micro batches' counts differ (padding, whole-word and span masking): fairseq's
normalization by an update's sample size, HF Trainer's by ``num_items_in_batch``. ``None``: each
term is its mean over its own micro batch."""


@dataclasses.dataclass
class PretrainOutput:
    loss: torch.Tensor
    """Scalar training loss (with its graph)."""
    metrics: dict[str, torch.Tensor]
    """Detached scalars for logging (xlmr/mlm: mlm_loss, mlm_acc; rtd: gen_loss, rtd_loss, disc_acc, ...)."""


@dataclasses.dataclass
class ClassifierOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor
    """[B, num_labels]."""


class LMHead(nn.Module):
    """``LayerNorm(gelu(dense(h))) @ E^T + bias`` with E the (tied) word embeddings."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, hidden: torch.Tensor, embedding_weight: torch.Tensor) -> torch.Tensor:
        return F.linear(self.layer_norm(F.gelu(self.dense(hidden))), embedding_weight, self.bias)


def masked_lm_logits(head: LMHead, hidden: torch.Tensor, embedding_weight: torch.Tensor, labels: torch.Tensor,
                     sparse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits [M, V], targets [M], predicted [B, S] bool) at the M positions whose label is not -100.

    Sparse: the head runs on those M positions only (at 250k vocabulary the dense head costs more
    than the encoder); dense: on every position, then the M rows are taken."""
    predicted = labels.ne(IGNORE)
    if sparse:
        logits = head(hidden[predicted], embedding_weight)
    else:
        logits = head(hidden, embedding_weight)[predicted]
    return logits, labels[predicted], predicted


def average(values: torch.Tensor, divisor: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of ``values`` (0 for none, with a graph), or their sum over ``divisor``: one micro
    batch's share of an optimizer step's count (``divisors`` of a pretraining model's forward)."""
    if divisor is not None:
        return values.sum() / divisor
    return values.mean() if values.numel() else values.sum()


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, divisor: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy in fp32, averaged over the rows as :func:`average` does."""
    return average(F.cross_entropy(logits.float(), targets, reduction="none"), divisor)


def accuracy(logits: torch.Tensor, targets: torch.Tensor, divisor: torch.Tensor | None = None) -> torch.Tensor:
    """Share of rows whose argmax is the target (detached), averaged over the rows as :func:`average` does."""
    return average((logits.detach().argmax(-1) == targets).float(), divisor)


class RobertaClassificationHead(nn.Module):
    """HF ``XLMRobertaClassificationHead``: dropout, dense, tanh, dropout, out_proj on the ``<s>`` token."""

    def __init__(self, cfg: ModelConfig, num_labels: int) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = nn.Dropout(classifier_dropout(cfg))
        self.out_proj = nn.Linear(cfg.hidden_size, num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.dense(self.dropout(hidden[:, 0])))
        return self.out_proj(self.dropout(x))


class ContextPooler(nn.Module):
    """HF DeBERTa ``ContextPooler``: gelu(dense(token 0)) (pooler dropout 0, as HF's default)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(hidden[:, 0]))


class RTDHead(nn.Module):
    """Replaced-token detection as microsoft/DeBERTa's ``LMMaskPredictionHead``, whose weights
    (``mask_predictions.*``) the published checkpoints carry: a logit per token,
    ``classifier(gelu(dense(LayerNorm(h + h[:, 0]))))``, each token's state with the first token's
    (``[CLS]``/``<s>``, the sequence's context) added."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.classifier = nn.Linear(cfg.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(F.gelu(self.dense(self.LayerNorm(hidden + hidden[:, :1])))).squeeze(-1)


def classifier_dropout(cfg: ModelConfig) -> float:
    return cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout
