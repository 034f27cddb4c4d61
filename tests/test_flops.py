"""The FLOPs formula behind MFU, held against what torch counts on one training step."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from pretrain.flops import flops_per_token
from pretrain.models import build_pretraining_model, load_model_config

SHAPES = [(128, 2), (128, 8), (512, 2), (512, 8)]


def counted_step_flops(cfg, seq_len: int, batch: int) -> tuple[int, float]:
    """(FLOPs torch counts in one forward + backward of the pretraining model, share of tokens with
    an MLM label). SDPA runs on its math backend, whose matrix products the counter sees."""
    torch.manual_seed(0)
    model = build_pretraining_model(cfg).train()
    ids = torch.randint(5, cfg.vocab_size - 1, (batch, seq_len))
    predicted = torch.rand(batch, seq_len) < 0.15
    labels = torch.where(predicted, ids, torch.full_like(ids, -100))
    ids = torch.where(predicted, torch.full_like(ids, cfg.vocab_size - 1), ids)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids, torch.ones_like(ids), labels).loss.backward()
    return counter.get_total_flops(), predicted.float().mean().item()


@pytest.mark.parametrize("seq_len, batch", SHAPES)
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse_head", "dense_head"])
@pytest.mark.parametrize("name", ["xlmr-tiny", "mdeberta-tiny"])
def test_flops_per_token_is_what_torch_counts(name, sparse, seq_len, batch):
    cfg = dataclasses.replace(load_model_config(name), sparse_mlm_head=sparse)
    counted, share = counted_step_flops(cfg, seq_len, batch)
    estimated = flops_per_token(cfg, seq_len, batch, predicted_share=share) * batch * seq_len
    assert estimated / counted == pytest.approx(1.0, abs=0.02), (estimated, counted)


def test_deberta_variants_are_counted():
    """One disentangled term only, a generator as deep as the discriminator, mDeBERTa with MLM."""
    base = load_model_config("mdeberta-tiny")
    for cfg in (dataclasses.replace(base, pos_att_type=["c2p"]), dataclasses.replace(base, generator_layers=2),
                dataclasses.replace(base, objective="mlm")):
        counted, share = counted_step_flops(cfg, 128, 4)
        estimated = flops_per_token(cfg, 128, 4, predicted_share=share) * 4 * 128
        assert estimated / counted == pytest.approx(1.0, abs=0.02), (cfg, estimated, counted)
