"""Pieces shared by both encoders: the post-LN transformer layer (HF BERT layout and parameter names),
the layer stack, the key-padding mask bias and the weight init."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class AddNorm(nn.Module):
    """``LayerNorm(dropout(dense(x)) + residual)``: HF's ``*SelfOutput`` / ``*Output`` (post-LN)."""

    def __init__(self, d_in: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class Intermediate(nn.Module):
    """The feed-forward's first half: ``gelu(dense(x))`` (exact erf GELU, as HF's "gelu")."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class Attention(nn.Module):
    """A self-attention module (``self``) followed by its output projection + residual + LayerNorm."""

    def __init__(self, self_attention: nn.Module, cfg: ModelConfig) -> None:
        super().__init__()
        self.self = self_attention
        self.output = AddNorm(cfg.hidden_size, cfg)

    def forward(self, x: torch.Tensor, **attention_inputs: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, **attention_inputs), x)


class TransformerLayer(nn.Module):
    """Post-LN encoder layer: attention, then GELU feed-forward, each with residual + LayerNorm."""

    def __init__(self, self_attention: nn.Module, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention = Attention(self_attention, cfg)
        self.intermediate = Intermediate(cfg)
        self.output = AddNorm(cfg.intermediate_size, cfg)

    def forward(self, x: torch.Tensor, **attention_inputs: torch.Tensor) -> torch.Tensor:
        attended = self.attention(x, **attention_inputs)
        return self.output(self.intermediate(attended), attended)


class LayerStack(nn.Module):
    """``encoder.layer.<i>``: the layers applied in order."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(layers)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, S, H*D] -> [B, H, S, D]."""
    batch, length, _ = x.shape
    return x.view(batch, length, heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> [B, S, H*D]."""
    batch, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * dim)


def key_padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[B, S] 1/0 mask -> bool [B, 1, 1, S] (True: a key to attend to); None stays None (no padding)."""
    if attention_mask is None:
        return None
    return attention_mask.bool()[:, None, None, :]


def init_weights(module: nn.Module, std: float) -> None:
    """HF's BERT init: normal(0, std) weights, zero biases, unit LayerNorms, zero padding embedding."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.normal_(sub.weight, 0.0, std)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.Embedding):
            nn.init.normal_(sub.weight, 0.0, std)
            if sub.padding_idx is not None:
                with torch.no_grad():
                    sub.weight[sub.padding_idx].zero_()
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)
