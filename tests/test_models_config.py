"""Model configs (strict YAML, named configs) and the FLOPs formula's ordering (tests/test_flops.py holds it against
torch's count)."""
from __future__ import annotations

import dataclasses

import pytest

from pipeline.util.errors import UserError
from pretrain.flops import encoder_flops_per_token, flops_per_token
from pretrain.models import load_model_config, model_config_from_dict
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
    assert deberta.objective == "rtd" and deberta.relative_span == 256 and deberta.max_sequence_length is None
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


def test_a_repeated_attention_type_is_refused():
    """HF counts each of c2p and p2c once in the attention's scale; a repeat here would count twice."""
    with pytest.raises(UserError, match="pos_att_type names a type twice"):
        load_model_config("mdeberta-tiny", sets=["pos_att_type=[c2p, c2p]"])


@pytest.mark.parametrize("key, value", [("embedding_size", 16), ("attention_head_size", 8), ("num_labels", 1)])
def test_hf_variants_we_do_not_build_are_one_line(key, value, tmp_path):
    """HF's factorized embeddings, heads narrower than hidden / heads, and a one-label (regression)
    classifier: each named with its file, not a size mismatch or a loss that is always 0."""
    import json

    from pretrain.models.hf import hf_config, load_hf

    config = {**hf_config(load_model_config("mdeberta-tiny", overrides={"vocab_size": 100, "objective": "mlm"}),
                          num_labels=2), key: value}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(UserError, match=rf"config.json: .*{key}.*"):
        load_hf(tmp_path)


def test_unknown_name_lists_the_names():
    with pytest.raises(UserError, match="xlmr-base"):
        load_model_config("xlmr-huge")


def test_set_overrides_apply():
    cfg = load_model_config("mdeberta-tiny", sets=["rtd_weight=10", "pos_att_type=[c2p]"])
    assert cfg.rtd_weight == 10.0 and cfg.pos_att_type == ["c2p"]


def test_flops_ordering():
    xlmr = load_model_config("xlmr-base")
    dense = dataclasses.replace(xlmr, sparse_mlm_head=False)
    deberta_mlm = dataclasses.replace(load_model_config("mdeberta-v3-base"), objective="mlm", vocab_size=250002)
    assert flops_per_token(dense, 512, 8) > flops_per_token(xlmr, 512, 8)
    assert flops_per_token(xlmr, 512, 8) > flops_per_token(xlmr, 128, 8)
    assert encoder_flops_per_token(deberta_mlm, 512, 8) > encoder_flops_per_token(xlmr, 512, 8)
    rtd = load_model_config("mdeberta-v3-base")
    assert flops_per_token(rtd, 512, 8) > flops_per_token(deberta_mlm, 512, 8)
    # XLM-R base at 512 with the sparse head: ~0.79 GFLOP per token (6 * 85M + attention + head)
    assert 0.7e9 < flops_per_token(xlmr, 512, 8) < 0.9e9
