"""DeBERTa-v2/v3 encoder (the mDeBERTa-v3 layout): disentangled attention with content->position and
position->content terms over log-bucketed relative positions, the attention key/query projections
shared with the relative embeddings, LayerNorm on the relative embeddings, no absolute positions.
Parameter names are those of HF ``DebertaV2Model``.

Attention scores are ``(q.k + c2p + p2c) / sqrt(3 * head_dim)`` (HF's scale factor: 1 + number of
position terms). The relative terms become an additive bias of ``scaled_dot_product_attention``;
pairs with a padded query or key are filled with the dtype's most negative value, as HF (no
fp16/bf16 overflow: queries are scaled before the products, the mask is a fill, not an addition of a
large number; a padded query's row stays finite).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .layers import LayerStack, TransformerLayer, key_padding_mask, merge_heads, split_heads


def log_bucket_position(relative_pos: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa's bucketing: distances below bucket_size/2 kept, larger ones log-spaced up to max_position."""
    sign = torch.sign(relative_pos)
    mid = bucket_size // 2
    abs_pos = torch.where((relative_pos < mid) & (relative_pos > -mid), torch.tensor(mid - 1).type_as(relative_pos),
                          torch.abs(relative_pos))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                         * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative_pos.type_as(log_pos), log_pos * sign)


@functools.lru_cache(maxsize=16)
def relative_position_indices(length: int, span: int, bucket_size: int, max_position: int,
                              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(c2p index, p2c index) [S, S] into the 2*span relative embeddings, for a sequence of ``length``."""
    ids = torch.arange(length)
    relative = ids[:, None] - ids[None, :]
    if bucket_size > 0 and max_position > 0:
        relative = log_bucket_position(relative, bucket_size, max_position)
    relative = relative.long()
    c2p = torch.clamp(relative + span, 0, 2 * span - 1)
    p2c = torch.clamp(-relative + span, 0, 2 * span - 1)
    return c2p.to(device), p2c.to(device)


class DisentangledSelfAttention(nn.Module):
    """Self-attention with DeBERTa's relative c2p / p2c terms (share_att_key: the relative embeddings
    go through the same query/key projections as the content)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.query_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.pos_att_type = tuple(cfg.pos_att_type)
        self.scale = 1.0 / math.sqrt(cfg.head_dim * (1 + len(self.pos_att_type)))
        self.pos_dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.dropout_p = cfg.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rel_embeddings: torch.Tensor,
                c2p_index: torch.Tensor, p2c_index: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(proj(x), self.heads) for proj in (self.query_proj, self.key_proj, self.value_proj))
        bias = self.relative_bias(q, k, self.pos_dropout(rel_embeddings), c2p_index, p2c_index)
        if mask is not None:
            bias = bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale,
                                             dropout_p=self.dropout_p if self.training else 0.0)
        return merge_heads(out)

    def relative_bias(self, q: torch.Tensor, k: torch.Tensor, rel_embeddings: torch.Tensor,
                      c2p_index: torch.Tensor, p2c_index: torch.Tensor) -> torch.Tensor:
        """The scaled c2p + p2c scores [B, H, S, S]."""
        batch, heads, length, _ = q.shape
        rel = rel_embeddings.unsqueeze(0)
        bias = q.new_zeros(())
        if "c2p" in self.pos_att_type:
            pos_key = split_heads(self.key_proj(rel), heads)  # [1, H, 2span, D]
            c2p = torch.matmul(q * self.scale, pos_key.transpose(-1, -2))  # [B, H, S, 2span]
            bias = bias + torch.gather(c2p, -1, c2p_index.expand(batch, heads, length, length))
        if "p2c" in self.pos_att_type:
            pos_query = split_heads(self.query_proj(rel), heads)
            p2c = torch.matmul(k * self.scale, pos_query.transpose(-1, -2))  # [B, H, S_key, 2span]
            bias = bias + torch.gather(p2c, -1, p2c_index.expand(batch, heads, length, length)).transpose(-1, -2)
        return bias


class DebertaEmbeddings(nn.Module):
    """Word embeddings (no positions: position_biased_input false), LayerNorm, zeroed at padding, dropout."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        x = self.LayerNorm(self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds)
        if attention_mask is not None:
            x = x * attention_mask.unsqueeze(-1).to(x.dtype)
        return self.dropout(x)


class DebertaEncoder(LayerStack):
    """The layers plus the relative-position embeddings (2*span rows) and their LayerNorm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__([TransformerLayer(DisentangledSelfAttention(cfg), cfg) for _ in range(cfg.num_hidden_layers)])
        self.span = cfg.relative_span
        self.bucket_size = cfg.position_buckets
        self.max_position = cfg.max_relative_positions if cfg.max_relative_positions > 0 else cfg.max_position_embeddings
        self.rel_embeddings = nn.Embedding(2 * self.span, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        c2p_index, p2c_index = relative_position_indices(x.shape[1], self.span, self.bucket_size, self.max_position,
                                                         x.device)
        rel_embeddings = self.LayerNorm(self.rel_embeddings.weight)
        mask = key_padding_mask(attention_mask)
        if mask is not None:  # HF's pairwise mask: a padded query attends uniformly (finite, as HF)
            mask = mask & mask.transpose(-1, -2)
        for layer in self.layer:
            x = layer(x, mask=mask, rel_embeddings=rel_embeddings, c2p_index=c2p_index, p2c_index=p2c_index)
        return x


class DebertaModel(nn.Module):
    """The DeBERTa-v3 encoder (HF ``DebertaV2Model``): token ids -> hidden states [B, S, d].

    ``inputs_embeds`` replaces the word-embedding lookup (the RTD discriminator's GDES embeddings)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embeddings = DebertaEmbeddings(cfg)
        self.encoder = DebertaEncoder(cfg)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(self.embeddings(input_ids, attention_mask, inputs_embeds), attention_mask)
