"""Whole models: masked LM and sequence classifier over either encoder, the builders, and taking a
classifier's encoder from a pretraining state dict."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.util.errors import UserError

from .config import ModelConfig
from .heads import (IGNORE, ClassifierOutput, ContextPooler, LMHead, PretrainOutput, RobertaClassificationHead,
                    PREDICTED, accuracy, classifier_dropout, cross_entropy, masked_lm_logits)
from .layers import init_weights
from .rtd import ReplacedTokenDetection

ENCODER_NAMES = {"xlmr": "roberta", "deberta-v3": "deberta"}
"""The encoder's attribute (and state-dict prefix) per family, as in HF."""


def build_encoder(cfg: ModelConfig) -> nn.Module:
    """The bare encoder of ``cfg.arch``: ``forward(input_ids, attention_mask) -> [B, S, d]``."""
    if cfg.arch == "xlmr":
        from .xlmr import XLMRModel
        return XLMRModel(cfg)
    from .deberta import DebertaModel
    return DebertaModel(cfg)


class EncoderHolder(nn.Module):
    """A model whose encoder sits at HF's attribute (``roberta`` / ``deberta``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder_name = ENCODER_NAMES[cfg.arch]
        self.add_module(self.encoder_name, build_encoder(cfg))

    @property
    def encoder(self) -> nn.Module:
        return getattr(self, self.encoder_name)

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.encoder.embeddings.word_embeddings


class MaskedLM(EncoderHolder):
    """Encoder + tied MLM head. ``forward`` returns the MLM loss over predicted positions."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.lm_head = LMHead(cfg)
        init_weights(self, cfg.initializer_range)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense MLM logits [B, S, V] (for evaluation and parity with HF)."""
        return self.lm_head(self.encoder(input_ids, attention_mask), self.word_embeddings.weight)

    def masked_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits [M, V], targets [M], predicted [B, S]) at the positions to predict."""
        hidden = self.encoder(input_ids, attention_mask)
        return masked_lm_logits(self.lm_head, hidden, self.word_embeddings.weight, labels, self.cfg.sparse_mlm_head)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor,
                divisors: torch.Tensor | None = None) -> PretrainOutput:
        """The MLM loss and accuracy over the predicted positions (``divisors``: :data:`heads.PREDICTED`)."""
        logits, targets, _ = self.masked_logits(input_ids, attention_mask, labels)
        per = None if divisors is None else divisors[PREDICTED]
        loss = cross_entropy(logits, targets, per)
        return PretrainOutput(loss, {"mlm_loss": loss.detach().float(), "mlm_acc": accuracy(logits, targets, per)})


class Classifier(EncoderHolder):
    """Encoder + HF's sequence-classification head of the family (parameter names as HF's
    ``XLMRobertaForSequenceClassification`` / ``DebertaV2ForSequenceClassification``)."""

    def __init__(self, cfg: ModelConfig, num_labels: int) -> None:
        super().__init__(cfg)
        self.num_labels = num_labels
        if cfg.arch == "xlmr":
            self.classifier = RobertaClassificationHead(cfg, num_labels)
        else:
            self.pooler = ContextPooler(cfg)
            self.classifier = nn.Linear(cfg.hidden_size, num_labels)
            self.dropout = nn.Dropout(classifier_dropout(cfg))
        init_weights(self, cfg.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> ClassifierOutput:
        hidden = self.encoder(input_ids, attention_mask)
        if self.cfg.arch == "xlmr":
            logits = self.classifier(hidden)
        else:
            logits = self.classifier(self.dropout(self.pooler(hidden)))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE)
        return ClassifierOutput(loss, logits)


def build_pretraining_model(cfg: ModelConfig) -> nn.Module:
    """MaskedLM (objective mlm) or ReplacedTokenDetection (deberta-v3, objective rtd), freshly initialised."""
    if cfg.objective == "rtd":
        return ReplacedTokenDetection(cfg, MaskedLM(cfg.generator_config()))
    return MaskedLM(cfg)


def build_classifier(cfg: ModelConfig, num_labels: int, source: str = "") -> Classifier:
    """A freshly initialised sequence classifier of ``cfg.arch`` with ``num_labels`` outputs."""
    if num_labels < 2:  # one class: a cross-entropy of 0 whatever the weights (HF takes it for regression)
        raise UserError(f"{source + ': ' if source else ''}num_labels must be at least 2 (a classifier; HF's "
                        f"num_labels=1 means regression, which is not implemented), got {num_labels}")
    return Classifier(cfg, num_labels)


def encoder_state_dict(cfg: ModelConfig, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder's weights (keys under ``roberta.`` / ``deberta.``) from a pretraining model's state dict.

    For RTD the discriminator's encoder, with GDES embeddings materialised (generator's + delta)."""
    name = ENCODER_NAMES[cfg.arch]
    source = f"discriminator.{name}." if cfg.objective == "rtd" else f"{name}."
    encoder = {f"{name}.{key[len(source):]}": value for key, value in state_dict.items() if key.startswith(source)}
    if not encoder:
        raise UserError(f"the state dict holds no {source}* weights: not a {cfg.arch}/{cfg.objective} pretraining model")
    if cfg.objective == "rtd" and cfg.gdes:
        key = f"{name}.embeddings.word_embeddings.weight"
        encoder[key] = state_dict[f"generator.{key}"] + encoder[key]
    return encoder


def classifier_from_pretrained(cfg: ModelConfig, pretrain_state_dict: dict[str, torch.Tensor],
                               num_labels: int) -> Classifier:
    """A classifier whose encoder comes from a pretraining model's state dict; the head is freshly initialised."""
    model = build_classifier(cfg, num_labels)
    missing, unexpected = model.load_state_dict(encoder_state_dict(cfg, pretrain_state_dict), strict=False)
    prefix = f"{model.encoder_name}."
    missing_encoder = [key for key in missing if key.startswith(prefix)]
    if missing_encoder or unexpected:
        raise UserError(f"pretraining weights do not fit the {cfg.arch} classifier: missing {missing_encoder[:3]}, "
                        f"unexpected {unexpected[:3]}")
    return model
