"""Model configs (strict YAML, named configs) and the FLOPs-per-token formula checked against the
parameter counts of built models."""
from __future__ import annotations

import dataclasses

import pytest

from pipeline.errors import UserError
from pretrain.flops import encoder_flops_per_token, flops_per_token, mlm_head_flops_per_token
from pretrain.models import build_pretraining_model, load_model_config, model_config_from_dict
from pretrain.models.config import MODELS_DIR
from test_models_support import one_thread  # noqa: F401  (autouse)

NAMES = ["xlmr-base", "xlmr-large", "mdeberta-v3-base", "xlmr-tiny", "mdeberta-tiny"]


@pytest.mark.parametrize("name", NAMES)
def test_named_configs_load(name):
    cfg = load_model_config(name)
    assert cfg.pad_token_id == 1 and cfg.hidden_size % cfg.num_attention_heads == 0
    assert load_model_config(str(MODELS_DIR / f"{name}.yaml")) == cfg
    assert model_config_from_dict(cfg.to_dict(), "checkpoint") == cfg


def test_published_shapes():
    base, large, deberta = (load_model_config(n) for n in ("xlmr-base", "xlmr-large", "mdeberta-v3-base"))
    assert (base.num_hidden_layers, base.hidden_size, base.vocab_size, base.max_sequence_length) == (12, 768, 250002, 512)
    assert (large.num_hidden_layers, large.hidden_size, large.intermediate_size) == (24, 1024, 4096)
    assert deberta.objective == "rtd" and deberta.relative_span == 256 and deberta.max_sequence_length == 512
    assert deberta.generator_config().num_hidden_layers == 6 and deberta.generator_config().objective == "mlm"


@pytest.mark.parametrize("overrides, message", [
    ({"hiden_size": 64}, "unknown config key 'hiden_size'"),
    ({"hidden_size": "big"}, "hidden_size: expected int"),
    ({"arch": "bert"}, "arch must be one of xlmr, deberta-v3"),
    ({"objective": "rtd"}, "objective rtd needs arch deberta-v3"),
    ({"num_attention_heads": 3}, "must be a multiple of num_attention_heads"),
    ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob=1.5 is out of range"),
])
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(UserError, match=message):
        load_model_config("xlmr-tiny", overrides=overrides)


def test_unknown_name_lists_the_names():
    with pytest.raises(UserError, match="xlmr-base"):
        load_model_config("xlmr-huge")


def test_set_overrides_apply():
    cfg = load_model_config("mdeberta-tiny", sets=["rtd_weight=10", "pos_att_type=[c2p]"])
    assert cfg.rtd_weight == 10.0 and cfg.pos_att_type == ["c2p"]


def encoder_matrix_parameters(model) -> int:
    """Parameters of the 2-D weights inside encoder layers (what 6 * N_nonemb counts)."""
    return sum(p.numel() for name, p in model.named_parameters() if ".encoder.layer." in name and p.ndim == 2)


@pytest.mark.parametrize("name", ["xlmr-tiny", "mdeberta-tiny"])
def test_flops_weight_terms_match_built_models(name):
    cfg = dataclasses.replace(load_model_config(name), vocab_size=1000)
    model = build_pretraining_model(cfg)
    seq_len = 128
    if cfg.objective == "rtd":
        generator, discriminator = cfg.generator_config(), cfg
        expected_weights = 6 * encoder_matrix_parameters(model)
        extra = (12 * 128 * (generator.num_hidden_layers * generator.hidden_size
                             + discriminator.num_hidden_layers * discriminator.hidden_size)
                 + mlm_head_flops_per_token(generator, 0.15) + 6 * (cfg.hidden_size ** 2 + cfg.hidden_size))
        relative = 2 * cfg.relative_span
        d = cfg.hidden_size
        extra += (generator.num_hidden_layers + cfg.num_hidden_layers) * 2 * (
            12 * d * relative + 12 * relative * d * d / seq_len)
    else:
        expected_weights = 6 * encoder_matrix_parameters(model)
        extra = 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len + mlm_head_flops_per_token(cfg, 0.15)
        head = model.lm_head.dense.weight.numel() + model.word_embeddings.weight.numel()
        assert mlm_head_flops_per_token(cfg, 1.0) == 6 * head
    assert flops_per_token(cfg, seq_len) == pytest.approx(expected_weights + extra, rel=1e-12)


def test_flops_ordering():
    xlmr = load_model_config("xlmr-base")
    dense = dataclasses.replace(xlmr, sparse_mlm_head=False)
    deberta_mlm = dataclasses.replace(load_model_config("mdeberta-v3-base"), objective="mlm", vocab_size=250002)
    assert flops_per_token(dense, 512) > flops_per_token(xlmr, 512)
    assert flops_per_token(xlmr, 512) > flops_per_token(xlmr, 128)
    assert encoder_flops_per_token(deberta_mlm, 512) > encoder_flops_per_token(xlmr, 512)
    rtd = load_model_config("mdeberta-v3-base")
    assert flops_per_token(rtd, 512) > flops_per_token(deberta_mlm, 512)
    # XLM-R base at 512 with the sparse head: ~0.79 GFLOP per token (6 * 85M + attention + head)
    assert 0.7e9 < flops_per_token(xlmr, 512) < 0.9e9
