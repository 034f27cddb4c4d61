"""mDeBERTa-v3 pretraining: replaced-token detection learns on real text, GDES keeps the
discriminator's gradient out of the generator's embeddings, the discriminator exports to HF and
comes back as a pretraining model."""
from __future__ import annotations

import shutil

import pytest
import torch

from pretrain.models import build_pretraining_model, classifier_from_pretrained, load_model_config
from pretrain.models.hf import load_hf_for_pretraining, save_hf
from test_models_support import (one_thread,  # noqa: F401  (autouse)
                                 mask_batch, sample_spm, text_batch)


def tiny_rtd(**overrides):
    cfg = load_model_config("mdeberta-tiny", overrides={"vocab_size": sample_spm()[1], **overrides})
    torch.manual_seed(0)
    return cfg, build_pretraining_model(cfg)


def real_batches(count: int, batch_size: int = 8, seq_len: int = 64) -> list[tuple[torch.Tensor, ...]]:
    """(input_ids, attention_mask, labels) of masked real text, distinct lines per batch."""
    batches = []
    for i in range(count):
        input_ids, attention_mask = text_batch(batch_size, seq_len, start=i * batch_size)
        masked, labels = mask_batch(input_ids, attention_mask, sample_spm()[1], seed=i)
        batches.append((masked, attention_mask, labels))
    return batches


def train(model, steps: int, lr: float = 2e-3) -> list[dict[str, float]]:
    """AdamW steps over 40 real batches; the metrics of every step."""
    batches = real_batches(40)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    history = []
    for step in range(steps):
        out = model(*batches[step % len(batches)])
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        history.append({name: value.item() for name, value in out.metrics.items()})
    return history


def mean(history: list[dict[str, float]], key: str) -> float:
    return sum(row[key] for row in history) / len(history)


def test_rtd_head_is_deberta_s_own_on_its_weights():
    """The head computes what microsoft/DeBERTa's ``LMMaskPredictionHead`` computes with the same
    ``mask_predictions.*`` weights (a published checkpoint's): LayerNorm of each token's state plus
    the first token's, then dense, gelu and the classifier (written out here from that code)."""
    cfg, model = tiny_rtd()
    head = model.discriminator.mask_predictions
    with torch.no_grad():
        for param in head.parameters():
            param.normal_(0.0, 0.5)
    hidden = torch.randn(3, 7, cfg.hidden_size)
    ctx = torch.nn.functional.layer_norm(hidden[:, 0, :].unsqueeze(-2) + hidden, (cfg.hidden_size,),
                                         head.LayerNorm.weight, head.LayerNorm.bias, cfg.layer_norm_eps)
    expected = torch.nn.functional.linear(torch.nn.functional.gelu(head.dense(ctx)), head.classifier.weight,
                                          head.classifier.bias).squeeze(-1)
    torch.testing.assert_close(head(hidden), expected)


def test_generator_and_discriminator_losses_fall_on_real_text():
    _, model = tiny_rtd()
    history = train(model, steps=150)
    first, last = history[:3], history[-30:]
    assert set(history[0]) >= {"gen_loss", "rtd_loss", "disc_acc", "gen_acc", "replaced", "loss"}
    assert mean(last, "gen_loss") < mean(first, "gen_loss") - 1.0  # ~7.6 -> ~6
    assert mean(last, "rtd_loss") < 0.75 * mean(first, "rtd_loss")  # ~0.68 -> ~0.4
    assert mean(last, "disc_acc") > 0.75 and 0.05 < mean(last, "replaced") < 0.3


def test_discriminator_detects_replacements_of_a_fixed_generator():
    """With the generator frozen at init (replacements nearly uniform), the discriminator learns to
    find them: accuracy well above the all-original baseline, most replacements recalled."""
    _, model = tiny_rtd(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.generator.requires_grad_(False)
    history = train(model, steps=200, lr=1e-3)
    last = history[-50:]
    assert mean(last, "disc_acc") > 1 - mean(last, "replaced") + 0.05
    assert mean(last, "disc_recall") > 0.5


def test_gdes_discriminator_gradient_stays_out_of_generator_embeddings():
    cfg, model = tiny_rtd()
    masked, attention_mask, labels = real_batches(1)[0]
    generator_embeddings = model.generator.word_embeddings.weight
    delta = model.discriminator.deberta.embeddings.word_embeddings.weight
    assert not delta.any()  # zero at init: the discriminator starts from the generator's embeddings
    parts = model.losses(masked, attention_mask, labels)
    rtd_to_generator, rtd_to_delta = torch.autograd.grad(parts["rtd_loss"], [generator_embeddings, delta],
                                                         retain_graph=True, allow_unused=True)
    assert rtd_to_generator is None
    assert rtd_to_delta is not None and rtd_to_delta.abs().sum() > 0
    gen_to_generator, gen_to_delta = torch.autograd.grad(parts["gen_loss"], [generator_embeddings, delta],
                                                         allow_unused=True)
    assert gen_to_generator is not None and gen_to_generator.abs().sum() > 0 and gen_to_delta is None
    # the values are shared: moving the generator's embeddings moves the discriminator's input
    with torch.no_grad():
        before = model.discriminator_embeddings(masked)
        generator_embeddings.add_(1.0)
        assert torch.allclose(model.discriminator_embeddings(masked), before + 1.0)


def test_without_gdes_the_discriminator_has_its_own_embeddings():
    _, model = tiny_rtd(gdes=False)
    assert model.discriminator_embeddings(torch.tensor([[0, 5, 2]])) is None
    assert model.discriminator.deberta.embeddings.word_embeddings.weight.abs().sum() > 0


def test_sampling_and_losses_are_seeded():
    _, model = tiny_rtd()
    batch = real_batches(1)[0]
    torch.manual_seed(5)
    first = model(*batch).metrics
    torch.manual_seed(5)
    second = model(*batch).metrics
    assert all(torch.equal(first[key], second[key]) for key in first)
    torch.manual_seed(6)  # the generator's samples follow the seed (the same metrics would not show it)
    third = model(*batch).metrics
    assert any(not torch.equal(first[key], third[key]) for key in first)


def test_discriminator_exports_to_hf_and_feeds_a_classifier(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg, model = tiny_rtd()
    train(model, steps=3)  # delta and generator embeddings both non-trivial
    model.eval()
    tokenizer_dir = tmp_path / "tok"
    tokenizer_dir.mkdir()
    (tokenizer_dir / "spm.model").write_bytes(sample_spm()[0].serialized_model_proto())
    (tokenizer_dir / "tokenizer_config.json").write_text("{}")
    save_hf(model, cfg, tmp_path / "hf", tokenizer_dir, generator=True)
    assert (tmp_path / "hf" / "spm.model").read_bytes() == (tokenizer_dir / "spm.model").read_bytes()
    assert not (tmp_path / "hf" / "sentencepiece.bpe.model").exists()

    input_ids, attention_mask = text_batch(3, 40)
    with torch.no_grad():
        ours = model.discriminator.deberta(input_ids, attention_mask, model.discriminator_embeddings(input_ids))
        hf_mlm, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"]
        hf_hidden = hf_mlm.eval().deberta(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        assert (hf_hidden - ours).abs().max().item() <= 1e-5
        hf_generator = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf" / "generator").eval()
        assert hf_generator.config.num_hidden_layers == 1
        assert (hf_generator(input_ids=input_ids, attention_mask=attention_mask).logits
                - model.generator.logits(input_ids, attention_mask)).abs().max().item() <= 1e-5

        classifier = classifier_from_pretrained(cfg, model.state_dict(), num_labels=3).eval()
        assert torch.equal(classifier.encoder(input_ids, attention_mask), ours)

    # back to a pretraining model: generator and RTD head exact, GDES sum to float rounding
    cfg_back, back = load_hf_for_pretraining(tmp_path / "hf")
    assert cfg_back.objective == "rtd" and cfg_back.generator_layers == 1
    original, loaded = model.state_dict(), back.state_dict()
    assert original.keys() == loaded.keys()
    for key in original:
        if key.startswith("discriminator.deberta.embeddings.word_embeddings"):
            embeddings = "deberta.embeddings.word_embeddings.weight"
            assert torch.allclose(loaded["generator." + embeddings] + loaded[key],
                                  original["generator." + embeddings] + original[key], atol=1e-6)
        else:
            assert torch.equal(original[key], loaded[key]), key
    # a discriminator alone (as published): the generator starts from its embeddings, delta 0
    shutil.rmtree(tmp_path / "hf" / "generator")
    _, fresh = load_hf_for_pretraining(tmp_path / "hf", objective="rtd")
    fresh.eval()
    assert torch.equal(fresh.generator.word_embeddings.weight, hf_mlm.deberta.embeddings.word_embeddings.weight)
    assert not fresh.discriminator.deberta.embeddings.word_embeddings.weight.any()
    assert fresh.cfg.generator_layers == 0 and len(fresh.generator.encoder.encoder.layer) == 1
    with torch.no_grad():
        hidden = fresh.discriminator.deberta(input_ids, attention_mask, fresh.discriminator_embeddings(input_ids))
    assert (hidden - ours).abs().max().item() <= 1e-5


def test_bf16_rtd_step_is_finite():
    _, model = tiny_rtd()
    model.to(torch.bfloat16)
    out = model(*real_batches(1, seq_len=96)[0])
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and all(torch.isfinite(v) for v in out.metrics.values())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
