"""Training FLOPs per token (forward + backward = 3x forward) of our models, for MFU.

A matrix product of an [n, a] by an [a, b] matrix costs 2nab FLOPs forward and twice that backward,
so a weight matrix used once per token costs 6 x its size per token. With d = hidden_size, L layers,
F = intermediate_size, s = sequence length, V = vocab_size:

- encoder weights: 6 * L * (4 d^2 + 2 d F)                (Q, K, V, output projections; feed-forward)
- attention scores and weighted sum: 12 * L * d * s       (QK^T and PV, each 2 s d per token forward)
- DeBERTa's disentangled terms, per term (c2p, p2c) and layer, with 2k relative embeddings
  (k = position_buckets): 12 * d * 2k per token for the content-by-position product, plus
  12 * 2k * d^2 / s for projecting the relative embeddings (once per sequence)
- MLM head: 6 * f * (d^2 + d V), f = share of tokens whose logits are computed (the sparse head:
  the masked share, 0.15; the dense head: 1)
- RTD: the generator (its own depth, its MLM head at f) + the discriminator + its per-token head
  6 * (d^2 + d)

Embedding lookups, biases, LayerNorms, softmax and activations are left out (under 1 % at base size).
"""
from __future__ import annotations

from pretrain.models.config import ModelConfig

MASKED_SHARE = 0.15
"""Share of tokens the MLM head predicts (the loader's mask_prob)."""


def encoder_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token of the encoder layers of ``cfg`` at ``seq_len``."""
    d, layers = cfg.hidden_size, cfg.num_hidden_layers
    flops = 6.0 * layers * (4 * d * d + 2 * d * cfg.intermediate_size) + 12.0 * layers * d * seq_len
    if cfg.arch == "deberta-v3":
        relative = 2 * cfg.relative_span
        per_term = 12.0 * d * relative + 12.0 * relative * d * d / seq_len
        flops += layers * len(cfg.pos_att_type) * per_term
    return flops


def mlm_head_flops_per_token(cfg: ModelConfig, predicted_share: float) -> float:
    """Training FLOPs per token of the tied MLM head computed on ``predicted_share`` of the tokens."""
    d = cfg.hidden_size
    return 6.0 * predicted_share * (d * d + d * cfg.vocab_size)


def flops_per_token(cfg: ModelConfig, seq_len: int, predicted_share: float = MASKED_SHARE) -> float:
    """Training FLOPs (forward + backward) per input token of the pretraining model of ``cfg``.

    ``predicted_share``: share of tokens with an MLM label; the dense head (``sparse_mlm_head``
    false) computes logits everywhere and costs the full head."""
    share = predicted_share if cfg.sparse_mlm_head else 1.0
    if cfg.objective == "rtd":
        generator = cfg.generator_config()
        d = cfg.hidden_size
        return (encoder_flops_per_token(generator, seq_len) + mlm_head_flops_per_token(generator, share)
                + encoder_flops_per_token(cfg, seq_len) + 6.0 * (d * d + d))
    return encoder_flops_per_token(cfg, seq_len) + mlm_head_flops_per_token(cfg, share)
