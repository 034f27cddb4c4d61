"""DeBERTa-v3 pretraining: replaced-token detection (ELECTRA) with gradient-disentangled embedding
sharing (GDES).

The generator (same width, fewer layers) is trained with MLM on the masked input. At every predicted
position a token is sampled from its (detached) distribution; the discriminator reads the original
sequence with those positions replaced and predicts, per real token, whether it was replaced.
loss = gen_loss + rtd_weight * rtd_loss (BCE mean over non-pad tokens; both terms over the whole
optimizer step's counts when the trainer passes ``divisors``: ``heads.PREDICTED``).

GDES: the discriminator's input embeddings are ``stop_gradient(E_generator) + E_delta``; E_delta is
the discriminator's own ``word_embeddings`` table, zero at init. The RTD loss therefore trains E_delta
but never the generator's embeddings, which only the MLM loss moves. ``gdes: false`` gives the
discriminator its own independent embeddings (no sharing).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .deberta import DebertaModel
from .heads import PREDICTED, TOKENS, PretrainOutput, RTDHead, accuracy, average, cross_entropy
from .layers import init_weights


class Discriminator(nn.Module):
    """DeBERTa encoder + per-token replaced/original logit (``mask_predictions``, the name DeBERTa uses)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.deberta = DebertaModel(cfg)
        self.mask_predictions = RTDHead(cfg)


def sample_tokens(logits: torch.Tensor) -> torch.Tensor:
    """One token per row from softmax(logits) (Gumbel-max on fp32, torch's RNG; no gradient)."""
    logits = logits.detach().float()
    noise = torch.empty_like(logits).exponential_().log()
    return (logits - noise).argmax(-1)


class ReplacedTokenDetection(nn.Module):
    """Generator (MLM) + discriminator (RTD); ``forward`` returns their weighted loss and metrics.

    ``generator``: the masked LM of ``cfg.generator_config()`` (``modeling.build_pretraining_model``
    builds it), with ``masked_logits`` and ``word_embeddings``."""

    def __init__(self, cfg: ModelConfig, generator: nn.Module) -> None:
        super().__init__()
        self.cfg = cfg
        self.generator = generator
        self.discriminator = Discriminator(cfg)
        init_weights(self.discriminator, cfg.initializer_range)
        if cfg.gdes:
            nn.init.zeros_(self.discriminator.deberta.embeddings.word_embeddings.weight)

    def discriminator_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """GDES input embeddings sg(E_g)[ids] + E_delta[ids]; None without GDES (own table)."""
        if not self.cfg.gdes:
            return None
        shared = F.embedding(input_ids, self.generator.word_embeddings.weight.detach())
        return shared + self.discriminator.deberta.embeddings.word_embeddings(input_ids)

    def losses(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor,
               divisors: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """gen_loss and rtd_loss (with graphs) plus detached metrics: gen_acc, disc_acc, replaced (share of
        real tokens replaced), disc_recall (replaced tokens detected, in this micro batch); each but
        disc_recall over ``divisors`` where given (``heads.PREDICTED``)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        gen_logits, targets, predicted = self.generator.masked_logits(input_ids, attention_mask, labels)
        per_predicted, per_token = (None, None) if divisors is None else (divisors[PREDICTED], divisors[TOKENS])
        gen_loss = cross_entropy(gen_logits, targets, per_predicted)
        original = torch.where(predicted, labels, input_ids)
        corrupted = original.masked_scatter(predicted, sample_tokens(gen_logits))
        replaced = corrupted.ne(original)
        hidden = self.discriminator.deberta(corrupted, attention_mask, self.discriminator_embeddings(corrupted))
        real = attention_mask.bool()
        rtd_logits = self.discriminator.mask_predictions(hidden)[real].float()
        rtd_targets = replaced[real].float()
        rtd_loss = average(F.binary_cross_entropy_with_logits(rtd_logits, rtd_targets, reduction="none"), per_token)
        with torch.no_grad():
            guesses = rtd_logits.gt(0).float()
            recall = (guesses * rtd_targets).sum() / rtd_targets.sum().clamp(min=1.0)
            metrics = {"gen_acc": accuracy(gen_logits, targets, per_predicted),
                       "disc_acc": average(guesses.eq(rtd_targets).float(), per_token),
                       "replaced": average(rtd_targets, per_token), "disc_recall": recall}
        return {"gen_loss": gen_loss, "rtd_loss": rtd_loss, **metrics}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor,
                divisors: torch.Tensor | None = None) -> PretrainOutput:
        parts = self.losses(input_ids, attention_mask, labels, divisors)
        loss = parts["gen_loss"] + self.cfg.rtd_weight * parts["rtd_loss"]
        metrics = {name: value.detach().float() for name, value in parts.items()}
        metrics["loss"] = loss.detach().float()
        return PretrainOutput(loss, metrics)
