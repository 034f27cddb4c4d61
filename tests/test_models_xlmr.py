"""XLM-R against HF transformers: logits, losses and classifier logits after weight import (fp32,
eval, real text, padded batches), exact round trips, bf16."""
from __future__ import annotations

import pytest
import torch

from pretrain.models import MaskedLM, build_classifier, load_model_config
from pretrain.models.hf import load_hf, save_hf
from test_models_support import (one_thread,  # noqa: F401  (autouse)
                                 check_classifier_parity, check_hf_round_trip, mask_batch, sample_spm,
                                 text_batch)

transformers = pytest.importorskip("transformers")


def hf_xlmr_config(vocab_size: int, num_labels: int = 2):
    return transformers.XLMRobertaConfig(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, num_labels=num_labels)


@pytest.fixture(scope="module")
def hf_mlm(tmp_path_factory):
    """An HF XLMRobertaForMaskedLM with random weights, saved by HF, and our import of it."""
    torch.manual_seed(0)
    hf = transformers.XLMRobertaForMaskedLM(hf_xlmr_config(sample_spm()[1])).eval()
    out = tmp_path_factory.mktemp("hf_xlmr")
    hf.save_pretrained(out)
    cfg, ours = load_hf(out)
    return hf, cfg, ours.eval(), out


def test_mlm_logits_match_hf_on_padded_real_text(hf_mlm):
    hf, cfg, ours, _ = hf_mlm
    input_ids, attention_mask = text_batch(4, 48)
    assert attention_mask.sum(1).min() < 48  # padded rows
    with torch.no_grad():
        expected = hf(input_ids=input_ids, attention_mask=attention_mask).logits
        got = ours.logits(input_ids, attention_mask)
    assert cfg.arch == "xlmr" and cfg.num_hidden_layers == 2 and cfg.pad_token_id == 1
    assert (got - expected).abs().max().item() <= 1e-5


def test_sparse_and_dense_mlm_loss_equal_hf_loss(hf_mlm):
    hf, cfg, ours, _ = hf_mlm
    input_ids, attention_mask = text_batch(4, 48, start=11)
    masked, labels = mask_batch(input_ids, attention_mask, cfg.vocab_size, seed=1)
    with torch.no_grad():
        expected = hf(input_ids=masked, attention_mask=attention_mask, labels=labels).loss
        sparse = ours(masked, attention_mask, labels)
        ours.cfg.sparse_mlm_head = False
        dense = ours(masked, attention_mask, labels)
        ours.cfg.sparse_mlm_head = True
    assert abs(sparse.loss.item() - expected.item()) <= 1e-5
    assert abs(dense.loss.item() - expected.item()) <= 1e-5
    assert set(sparse.metrics) == {"mlm_loss", "mlm_acc"} and not sparse.metrics["mlm_loss"].requires_grad


def test_round_trip_ours_hf_ours_is_exact(tmp_path):
    _, vocab_size = sample_spm()
    cfg = load_model_config("xlmr-tiny", overrides={"vocab_size": vocab_size})
    torch.manual_seed(1)
    ours = MaskedLM(cfg)
    check_hf_round_trip(ours, cfg, tmp_path / "hf", "XLMRobertaForMaskedLM")


def test_unreadable_weights_are_one_line(tmp_path):
    from pipeline.util.errors import UserError

    _, vocab_size = sample_spm()
    cfg = load_model_config("xlmr-tiny", overrides={"vocab_size": vocab_size})
    out = save_hf(MaskedLM(cfg), cfg, tmp_path / "hf")
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:300])
    with pytest.raises(UserError, match="model.safetensors: not a readable safetensors file"):
        load_hf(out)


def test_classifier_matches_hf_and_round_trips(tmp_path):
    _, vocab_size = sample_spm()
    torch.manual_seed(2)
    hf = transformers.XLMRobertaForSequenceClassification(hf_xlmr_config(vocab_size, num_labels=3))
    check_classifier_parity(hf, tmp_path)


def test_bf16_forward_backward_is_finite():
    _, vocab_size = sample_spm()
    cfg = load_model_config("xlmr-tiny", overrides={"vocab_size": vocab_size})
    torch.manual_seed(3)
    model = MaskedLM(cfg).to(torch.bfloat16)
    input_ids, attention_mask = text_batch(4, 64, start=7)
    masked, labels = mask_batch(input_ids, attention_mask, vocab_size, seed=3)
    out = model(masked, attention_mask, labels)
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.loss.dtype == torch.float32
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    classifier = build_classifier(cfg, 3).to(torch.bfloat16)
    assert torch.isfinite(classifier(input_ids, attention_mask).logits).all()
