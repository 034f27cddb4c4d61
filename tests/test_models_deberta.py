"""mDeBERTa-v3 encoder against HF DebertaV2: MLM and classifier logits after weight import (fp32,
eval, real text, padded batches, log-bucketed positions beyond the linear range), the legacy MLM head
layout, exact round trips, bf16."""
from __future__ import annotations

import pytest
import torch

from pretrain.models import MaskedLM, build_classifier, load_model_config
from pretrain.models.deberta import log_bucket_position
from pretrain.models.hf import load_hf
from test_models_support import (one_thread,  # noqa: F401  (autouse)
                                 check_classifier_parity, check_hf_round_trip, mask_batch, sample_spm,
                                 text_batch)

transformers = pytest.importorskip("transformers")
deberta_v2 = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")


def hf_deberta_config(vocab_size: int, legacy: bool = False, num_labels: int = 2, max_positions: int = 512):
    """mDeBERTa-v3's options (relative attention, c2p|p2c, shared key, LayerNorm'd relative
    embeddings, no absolute positions) at a tiny size; 16 buckets so 100-token rows reach the log range."""
    return transformers.DebertaV2Config(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=max_positions, relative_attention=True, position_buckets=16, max_relative_positions=128,
        pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
        type_vocab_size=0, layer_norm_eps=1e-7, pad_token_id=1, legacy=legacy, num_labels=num_labels)


def test_log_buckets_equal_hf():
    relative = torch.arange(-600, 600)
    for buckets, max_position in ((256, 512), (16, 128)):
        assert torch.equal(log_bucket_position(relative, buckets, max_position),
                           deberta_v2.make_log_bucket_position(relative, buckets, max_position))


@pytest.mark.parametrize("legacy", [False, True])
def test_mlm_logits_match_hf_on_padded_real_text(tmp_path, legacy):
    torch.manual_seed(0)
    hf = transformers.DebertaV2ForMaskedLM(hf_deberta_config(sample_spm()[1], legacy=legacy)).eval()
    hf.save_pretrained(tmp_path)
    cfg, ours = load_hf(tmp_path)
    assert cfg.arch == "deberta-v3" and cfg.relative_span == 16 and cfg.pad_token_id == 1
    input_ids, attention_mask = text_batch(4, 100)
    assert attention_mask.sum(1).min() < 100
    masked, labels = mask_batch(input_ids, attention_mask, cfg.vocab_size, seed=2)
    with torch.no_grad():
        expected = hf(input_ids=masked, attention_mask=attention_mask, labels=labels)
        got = ours.eval().logits(masked, attention_mask)
        loss = ours(masked, attention_mask, labels).loss
    assert (got - expected.logits).abs().max().item() <= 1e-5  # padded positions included
    assert abs(loss.item() - expected.loss.item()) <= 1e-5


def test_inputs_longer_than_max_position_embeddings_as_hf(tmp_path):
    """Relative positions only: HF's DebertaV2 takes rows longer than ``max_position_embeddings``
    (mDeBERTa-v3-base's 512 included), and so does ours, with the same logits."""
    torch.manual_seed(3)
    hf = transformers.DebertaV2ForMaskedLM(hf_deberta_config(sample_spm()[1], max_positions=64)).eval()
    hf.save_pretrained(tmp_path)
    cfg, ours = load_hf(tmp_path)
    assert cfg.max_position_embeddings == 64 and cfg.max_sequence_length is None
    input_ids, attention_mask = text_batch(2, 100)
    assert attention_mask.sum(1).max() > 64
    with torch.no_grad():
        expected = hf(input_ids=input_ids, attention_mask=attention_mask).logits
        got = ours.eval().logits(input_ids, attention_mask)
    assert (got - expected).abs().max().item() <= 1e-5


def test_round_trip_ours_hf_ours_is_exact(tmp_path):
    cfg = load_model_config("mdeberta-tiny",
                            overrides={"vocab_size": sample_spm()[1], "objective": "mlm", "generator_layers": 0})
    torch.manual_seed(1)
    ours = MaskedLM(cfg)
    check_hf_round_trip(ours, cfg, tmp_path / "hf", "DebertaV2ForMaskedLM")


def test_classifier_matches_hf_and_round_trips(tmp_path):
    torch.manual_seed(2)
    hf = transformers.DebertaV2ForSequenceClassification(hf_deberta_config(sample_spm()[1], num_labels=3))
    check_classifier_parity(hf, tmp_path)


def test_bf16_forward_backward_is_finite():
    cfg = load_model_config("mdeberta-tiny", overrides={"vocab_size": sample_spm()[1]})
    torch.manual_seed(3)
    classifier = build_classifier(cfg, 3).to(torch.bfloat16)
    input_ids, attention_mask = text_batch(4, 96, start=7)
    out = classifier(input_ids, attention_mask, torch.tensor([0, 1, 2, 1]))
    out.loss.backward()
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    grads = [p.grad for p in classifier.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
