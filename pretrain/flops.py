"""Training FLOPs per token (forward + backward) of our models, for MFU.

What is counted is what the model computes in matrix products, as torch's ``FlopCounterMode``
counts them (``tests/test_flops.py`` holds this formula to within 2 % of that count for both
families, both MLM heads, seq 128 and 512, batch 2 and 8). A product of an [n, a] by an [a, b]
matrix costs 2nab FLOPs forward and twice that backward (the gradients of both operands), so a
weight matrix applied to every token costs 6 x its size per token. With d = hidden_size,
L = layers, F = intermediate_size, s = sequence length, b = sequences in one forward pass (the
micro-batch), V = vocab_size:

- encoder weights: 6 * L * (4 d^2 + 2 d F)                (Q, K, V, output projections; feed-forward)
- attention scores and weighted sum: 12 * L * d * s       (QK^T and PV, each 2 s d per token forward)
- DeBERTa's disentangled attention, per term (c2p, p2c) and layer, with R = 2 * position_buckets
  relative embeddings: 6 * d * R per token for the content-by-position product (each token's
  query, or key, against the R projected embeddings: 2 d R forward), plus 6 * R d^2 / (b s) for
  the relative embeddings' pass through the key (c2p) or query (p2c) projection, done once per
  forward pass for the whole micro-batch (``share_att_key``; a separate projection would cost the
  same)
- MLM head: 6 * f * (d^2 + d V), f = share of tokens whose logits are computed (the sparse head:
  the tokens with a label, 0.15 by default; the dense head: 1)
- RTD: the generator (its own depth, its MLM head at f) + the discriminator + its per-token head
  6 * (d^2 + d)

Not counted: embedding lookups, biases, LayerNorms, softmax, activations, the gather of the
relative scores (all under 1 % at base size), and recomputation: with activation checkpointing the
GPU does a second forward of each checkpointed layer, which MFU does not credit (the usual
convention, as in PaLM's MFU).
"""
from __future__ import annotations

from pretrain.models.config import ModelConfig

MASKED_SHARE = 0.15
"""Share of tokens the MLM head predicts (the loader's mask_prob)."""


def encoder_flops_per_token(cfg: ModelConfig, seq_len: int, batch_size: int) -> float:
    """Training FLOPs per token of the encoder layers of ``cfg`` at ``seq_len``, ``batch_size``
    sequences a forward pass."""
    d, layers = cfg.hidden_size, cfg.num_hidden_layers
    flops = 6.0 * layers * (4 * d * d + 2 * d * cfg.intermediate_size) + 12.0 * layers * d * seq_len
    if cfg.arch == "deberta-v3":
        relative = 2 * cfg.relative_span
        per_term = 6.0 * d * relative + 6.0 * relative * d * d / (batch_size * seq_len)
        flops += layers * len(cfg.pos_att_type) * per_term
    return flops


def mlm_head_flops_per_token(cfg: ModelConfig, predicted_share: float) -> float:
    """Training FLOPs per token of the tied MLM head computed on ``predicted_share`` of the tokens."""
    d = cfg.hidden_size
    return 6.0 * predicted_share * (d * d + d * cfg.vocab_size)


def flops_per_token(cfg: ModelConfig, seq_len: int, batch_size: int, predicted_share: float = MASKED_SHARE) -> float:
    """Training FLOPs (forward + backward) per input token of the pretraining model of ``cfg``,
    for micro-batches of ``batch_size`` sequences of ``seq_len`` tokens.

    ``predicted_share``: share of tokens with an MLM label; the dense head (``sparse_mlm_head``
    false) computes logits everywhere and costs the full head."""
    share = predicted_share if cfg.sparse_mlm_head else 1.0
    flops = encoder_flops_per_token(cfg, seq_len, batch_size)
    if cfg.objective == "rtd":
        generator = cfg.generator_config()
        d = cfg.hidden_size
        return (encoder_flops_per_token(generator, seq_len, batch_size) + mlm_head_flops_per_token(generator, share)
                + flops + 6.0 * (d * d + d))
    return flops + mlm_head_flops_per_token(cfg, share)
