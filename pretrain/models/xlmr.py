"""XLM-R encoder: RoBERTa embeddings (learned absolute positions with the padding offset) and
post-LN layers whose attention runs through ``scaled_dot_product_attention``. Parameter names are
those of HF ``XLMRobertaModel``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .layers import LayerStack, TransformerLayer, key_padding_mask, merge_heads, split_heads


def roberta_position_ids(input_ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """fairseq/HF positions: pad tokens get ``padding_idx``, the others padding_idx+1, +2, ... in order."""
    real = input_ids.ne(padding_idx).int()
    return (torch.cumsum(real, dim=1).type_as(real) * real).long() + padding_idx


class XLMREmbeddings(nn.Module):
    """word + position (+ the single token-type row XLM-R checkpoints carry), LayerNorm, dropout."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.padding_idx = cfg.pad_token_id
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size,
                                                padding_idx=cfg.pad_token_id)
        self.token_type_embeddings = nn.Embedding(1, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = roberta_position_ids(input_ids, self.padding_idx)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0] + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class SdpaSelfAttention(nn.Module):
    """Multi-head self-attention through ``torch.nn.functional.scaled_dot_product_attention``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = (split_heads(proj(x), self.heads) for proj in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             dropout_p=self.dropout_p if self.training else 0.0)
        return merge_heads(out)


class XLMRModel(nn.Module):
    """The XLM-R encoder (HF ``XLMRobertaModel`` without pooler): token ids -> hidden states [B, S, d]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embeddings = XLMREmbeddings(cfg)
        self.encoder = LayerStack([TransformerLayer(SdpaSelfAttention(cfg), cfg) for _ in range(cfg.num_hidden_layers)])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = key_padding_mask(attention_mask)
        x = self.embeddings(input_ids)
        for layer in self.encoder.layer:
            x = layer(x, mask=mask)
        return x
