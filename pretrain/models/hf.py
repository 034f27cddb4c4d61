"""HF transformers format: read ``XLMRobertaForMaskedLM`` / ``DebertaV2ForMaskedLM`` and
``*ForSequenceClassification`` directories (config.json + model.safetensors or pytorch_model.bin) into
our modules, and write ours back (config.json + model.safetensors + tokenizer files).

Our parameter names are HF's, except the MLM head: ours is ``lm_head.{dense,layer_norm,bias}`` for
both families; HF's DeBERTa names it ``lm_predictions.lm_head.{dense,LayerNorm,bias}`` (or, legacy,
``cls.predictions.transform.*``). The decoder is tied to the word embeddings and not written.

An RTD model (generator + discriminator) is written as the discriminator, the model users fine-tune,
like the published mDeBERTa-v3 checkpoints: ``DebertaV2ForMaskedLM`` whose word embeddings are the
GDES sum (generator's + delta), whose ``lm_predictions`` head is the generator's MLM head and whose
RTD head is kept under ``mask_predictions.*`` (HF ignores those keys). Its MLM logits are therefore
not meant as predictions (the head was trained on generator features); ``generator=True`` also
writes the generator to ``<out>/generator/`` as a working ``DebertaV2ForMaskedLM``.

``load_hf_for_pretraining`` turns such a directory (ours, or a published xlm-roberta-* /
mdeberta-v3-base) back into a pretraining model to continue training: for RTD the discriminator's
embeddings E_d become GDES's generator table plus delta (delta = E_d - E_g, zero when there is no
``generator/``: the generator then starts from E_d, its layers freshly initialised).
"""
from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.util.errors import UserError, first_line

from .config import OBJECTIVES, ModelConfig, validate_model_config
from .modeling import Classifier, MaskedLM, build_classifier, build_pretraining_model, encoder_state_dict

TOKENIZER_FILES = ("spm.model", "sentencepiece.bpe.model", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "tokenizer_meta.json")
"""Files copied from a tokenizer dir into an exported model dir, where they exist."""
MODEL_TYPES = {"xlmr": "xlm-roberta", "deberta-v3": "deberta-v2"}
HF_PREFIX = {"xlmr": "XLMRoberta", "deberta-v3": "DebertaV2"}
DEBERTA_HEAD = "lm_predictions.lm_head."
DEBERTA_LEGACY_HEAD = "cls.predictions."
RTD_HEAD = "mask_predictions."
EMBEDDINGS = "deberta.embeddings.word_embeddings.weight"
IGNORED_ON_LOAD = ("roberta.pooler.", "lm_head.decoder.", "cls.predictions.decoder.", "mask_predictions.",
                   "embeddings.position_ids", "embeddings.token_type_ids")
"""HF keys that are tied, buffers, or heads we do not use (pooler of XLM-R, DeBERTa's RTD head)."""


def hf_config(cfg: ModelConfig, num_labels: int | None = None, labels: list[str] | None = None) -> dict[str, Any]:
    """config.json content for ``cfg`` (MaskedLM, or SequenceClassification when ``num_labels`` is given)."""
    kind = "ForMaskedLM" if num_labels is None else "ForSequenceClassification"
    data: dict[str, Any] = {
        "architectures": [HF_PREFIX[cfg.arch] + kind], "model_type": MODEL_TYPES[cfg.arch],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads, "intermediate_size": cfg.intermediate_size,
        "hidden_act": "gelu", "hidden_dropout_prob": cfg.hidden_dropout_prob,
        "attention_probs_dropout_prob": cfg.attention_probs_dropout_prob,
        "max_position_embeddings": cfg.max_position_embeddings, "initializer_range": cfg.initializer_range,
        "layer_norm_eps": cfg.layer_norm_eps, "pad_token_id": cfg.pad_token_id, "bos_token_id": 0, "eos_token_id": 2,
        "tie_word_embeddings": True,
    }
    if cfg.arch == "xlmr":
        data.update(type_vocab_size=1, position_embedding_type="absolute", classifier_dropout=cfg.classifier_dropout)
    else:
        data.update(type_vocab_size=0, relative_attention=True, position_biased_input=False,
                    position_buckets=cfg.position_buckets, max_relative_positions=cfg.max_relative_positions,
                    pos_att_type=list(cfg.pos_att_type), share_att_key=True, norm_rel_ebd="layer_norm",
                    legacy=False, pooler_hidden_size=cfg.hidden_size, pooler_dropout=0.0, pooler_hidden_act="gelu",
                    cls_dropout=cfg.classifier_dropout)
    if num_labels is not None:
        names = labels or [f"LABEL_{i}" for i in range(num_labels)]
        data["id2label"] = {str(i): name for i, name in enumerate(names)}
        data["label2id"] = {name: i for i, name in enumerate(names)}
    return data


def config_from_hf(data: dict[str, Any], source: str) -> ModelConfig:
    """Our ModelConfig for an HF config.json mapping; a variant we do not implement is a UserError."""
    model_type = data.get("model_type")
    arch = {v: k for k, v in MODEL_TYPES.items()}.get(model_type)
    if arch is None:
        raise UserError(f"{source}: model_type {model_type!r} is not supported (xlm-roberta, deberta-v2)")
    if data.get("hidden_act", "gelu") != "gelu":
        raise UserError(f"{source}: hidden_act {data['hidden_act']!r} is not supported (gelu)")
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "layer_norm_eps", "hidden_dropout_prob", "attention_probs_dropout_prob",
              "initializer_range", "pad_token_id")
    values: dict[str, Any] = {key: data[key] for key in fields if data.get(key) is not None}
    hidden, heads = values.get("hidden_size"), values.get("num_attention_heads")
    for key, want in (("embedding_size", hidden), ("attention_head_size", hidden // heads if hidden and heads else None)):
        if data.get(key) is not None and data[key] != want:  # HF's factorized embeddings / narrower heads
            raise UserError(f"{source}: {key}={data[key]!r} is not supported (only {want!r}, from hidden_size "
                            f"{hidden} and num_attention_heads {heads})")
    values["classifier_dropout"] = data.get("classifier_dropout" if arch == "xlmr" else "cls_dropout")
    if arch == "deberta-v3":
        _check_deberta_variant(data, source)
        pos_att_type = data.get("pos_att_type") or []
        if isinstance(pos_att_type, str):
            pos_att_type = [part.strip() for part in pos_att_type.lower().split("|")]
        values.update(position_buckets=data.get("position_buckets", -1),
                      max_relative_positions=data.get("max_relative_positions", -1), pos_att_type=pos_att_type)
    elif data.get("type_vocab_size", 1) != 1:
        raise UserError(f"{source}: type_vocab_size {data['type_vocab_size']} is not supported (1)")
    for key in ("layer_norm_eps", "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range",
                "classifier_dropout"):
        if isinstance(values.get(key), int):
            values[key] = float(values[key])
    return validate_model_config(ModelConfig(arch=arch, objective="mlm", **values), source)


def _check_deberta_variant(data: dict[str, Any], source: str) -> None:
    """The DeBERTa-v2 options of the v3 models are the only ones implemented."""
    expected = {"relative_attention": True, "position_biased_input": False, "share_att_key": True,
                "type_vocab_size": 0, "conv_kernel_size": 0, "norm_rel_ebd": "layer_norm",
                "pooler_hidden_act": "gelu", "pooler_dropout": 0}
    defaults = {"relative_attention": False, "position_biased_input": True, "share_att_key": False,
                "type_vocab_size": 0, "conv_kernel_size": 0, "norm_rel_ebd": "none", "pooler_hidden_act": "gelu",
                "pooler_dropout": 0}
    for key, want in expected.items():
        got = data.get(key, defaults[key])
        if got != want:
            raise UserError(f"{source}: {key}={got!r} is not supported (DeBERTa-v3 layout: {want!r})")
    if data.get("pooler_hidden_size", data.get("hidden_size")) != data.get("hidden_size"):
        raise UserError(f"{source}: pooler_hidden_size must equal hidden_size")


def to_hf_state_dict(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A MaskedLM's or Classifier's state dict under HF's names (the DeBERTa MLM head renamed)."""
    if cfg.arch == "xlmr":
        return dict(state)
    renamed = {}
    for key, value in state.items():
        if key.startswith("lm_head."):
            key = DEBERTA_HEAD + key[len("lm_head."):].replace("layer_norm.", "LayerNorm.")
        renamed[key] = value
    return renamed


def _from_hf_keys(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed = {}
    for key, value in state.items():
        if any(part in key for part in IGNORED_ON_LOAD):
            continue
        if cfg.arch == "deberta-v3":
            if "embeddings.position_embeddings" in key:  # unused without position_biased_input (HF skips it too)
                continue
            if key.startswith(DEBERTA_HEAD):
                key = "lm_head." + key[len(DEBERTA_HEAD):].replace("LayerNorm.", "layer_norm.")
            elif key.startswith(DEBERTA_LEGACY_HEAD):
                key = "lm_head." + key[len(DEBERTA_LEGACY_HEAD):].replace("transform.", "").replace(
                    "LayerNorm.", "layer_norm.")
        renamed[key] = value
    return renamed


def _read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    safetensors_path, bin_path = model_dir / "model.safetensors", model_dir / "pytorch_model.bin"
    if safetensors_path.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(safetensors_path))
        except (SafetensorError, OSError) as exc:
            raise UserError(f"{safetensors_path}: not a readable safetensors file ({exc})") from None
    if bin_path.is_file():
        try:
            return torch.load(bin_path, map_location="cpu", weights_only=True)
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as exc:
            raise UserError(f"{bin_path}: not a readable PyTorch weights file ({first_line(exc)})") from None
    raise UserError(f"{model_dir}: no model.safetensors or pytorch_model.bin")


def _read_config(model_dir: Path) -> dict[str, Any]:
    config_path = model_dir / "config.json"
    try:
        return json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{config_path}: no such file (not an HF model directory)") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{config_path}: not valid JSON ({exc})") from None


def load_hf(model_dir: str | Path) -> tuple[ModelConfig, nn.Module]:
    """(config, model) from an HF ``*ForMaskedLM`` (-> MaskedLM) or ``*ForSequenceClassification``
    (-> Classifier) directory; weights that do not fit are a UserError naming them."""
    cfg, model, _ = _load_hf(Path(model_dir))
    return cfg, model


def _load_hf(model_dir: Path) -> tuple[ModelConfig, nn.Module, dict[str, torch.Tensor]]:
    """load_hf's (config, model) and the DeBERTa RTD head's weights (``mask_predictions.*``) where present."""
    config_path = model_dir / "config.json"
    data = _read_config(model_dir)
    cfg = config_from_hf(data, str(config_path))
    architecture = (data.get("architectures") or [""])[0]
    model: nn.Module
    if architecture.endswith("ForSequenceClassification"):
        model = build_classifier(cfg, int(data.get("num_labels") or len(data.get("id2label") or {}) or 2),
                                 str(config_path))
    elif architecture.endswith("ForMaskedLM") or not architecture:
        model = MaskedLM(cfg)
    else:
        raise UserError(f"{config_path}: architecture {architecture} is not supported "
                        "(*ForMaskedLM, *ForSequenceClassification)")
    weights = _read_weights(model_dir)
    missing, unexpected = model.load_state_dict(_from_hf_keys(cfg, weights), strict=False)
    if missing or unexpected:
        raise UserError(f"{model_dir}: weights do not fit {architecture or 'the model'}: "
                        f"missing {missing[:4]}, unexpected {unexpected[:4]}")
    return cfg, model, {key: value for key, value in weights.items() if key.startswith(RTD_HEAD)}


def load_hf_for_pretraining(model_dir: str | Path, objective: str | None = None) -> tuple[ModelConfig, nn.Module]:
    """(config, pretraining model) from an HF MaskedLM directory, to continue pretraining.

    ``objective``: mlm or rtd (deberta-v2 only; default: rtd where ``<dir>/generator`` exists, else mlm).
    For rtd the discriminator is the directory's encoder (and ``mask_predictions.*`` head where present),
    the generator comes from ``<dir>/generator`` or, without one, starts from the discriminator's
    embeddings and MLM head with fresh layers (half the depth) drawn from torch's RNG."""
    model_dir = Path(model_dir)
    generator_dir = model_dir / "generator"
    if objective is None:
        objective = "rtd" if generator_dir.is_dir() else "mlm"
    if objective not in OBJECTIVES:
        raise UserError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    cfg, mlm, rtd_head = _load_hf(model_dir)
    if not isinstance(mlm, MaskedLM):
        raise UserError(f"{model_dir}: a sequence classifier, not a masked LM to pretrain")
    if objective == "mlm":
        return cfg, mlm
    if cfg.arch != "deberta-v3":
        raise UserError(f"{model_dir}: objective rtd needs a deberta-v2 model, got {MODEL_TYPES[cfg.arch]}")
    generator_cfg, generator = (load_hf(generator_dir) if generator_dir.is_dir() else (None, None))
    layers = generator_cfg.num_hidden_layers if generator_cfg else 0
    cfg = validate_model_config(dataclasses.replace(cfg, objective="rtd", generator_layers=layers), str(model_dir))
    model = build_pretraining_model(cfg)
    mlm_state = mlm.state_dict()
    generator_state = model.generator.state_dict() if generator is None else generator.state_dict()
    if generator is None:
        generator_state.update({key: value for key, value in mlm_state.items()
                                if key.startswith("lm_head.") or key == EMBEDDINGS})
    model.generator.load_state_dict(generator_state)
    disc_state = model.discriminator.state_dict()
    disc_state.update({key: value for key, value in mlm_state.items() if key.startswith("deberta.")})
    disc_state.update(rtd_head)
    if cfg.gdes:
        disc_state[EMBEDDINGS] = mlm_state[EMBEDDINGS] - generator_state[EMBEDDINGS]
    model.discriminator.load_state_dict(disc_state)
    return cfg, model


def _write(out_dir: Path, config: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {key: value.detach().to("cpu").contiguous().clone() for key, value in state.items()}
    config["dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    shutil.copymode(out_dir / "config.json", out_dir / "model.safetensors")  # safetensors made it 0600


def copy_tokenizer_files(tokenizer_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Copy the tokenizer files that exist (names in TOKENIZER_FILES); the names copied."""
    tokenizer_dir, out_dir = Path(tokenizer_dir), Path(out_dir)
    if not tokenizer_dir.is_dir():
        raise UserError(f"tokenizer dir {tokenizer_dir}: no such directory")
    copied = [name for name in TOKENIZER_FILES if (tokenizer_dir / name).is_file()]
    if not copied:
        raise UserError(f"tokenizer dir {tokenizer_dir}: holds none of {', '.join(TOKENIZER_FILES)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in copied:
        shutil.copyfile(tokenizer_dir / name, out_dir / name)
    return copied


def save_hf(model: nn.Module, cfg: ModelConfig, out_dir: str | Path, tokenizer_dir: str | Path | None = None, *,
            labels: list[str] | None = None, generator: bool = False) -> Path:
    """Write ``model`` (MaskedLM, Classifier or RTD pretraining model) as an HF model directory
    loadable by ``AutoModelForMaskedLM`` / ``AutoModelForSequenceClassification``; the directory.

    ``labels``: class names of a classifier (config id2label); ``generator``: for RTD, also write the
    generator to ``<out_dir>/generator``."""
    out_dir = Path(out_dir)
    state = model.state_dict()
    if isinstance(model, Classifier):
        _write(out_dir, hf_config(cfg, model.num_labels, labels), state)
    elif isinstance(model, MaskedLM):
        _write(out_dir, hf_config(cfg), to_hf_state_dict(cfg, state))
    elif cfg.objective == "rtd":
        disc = encoder_state_dict(cfg, state)
        disc.update({key.removeprefix("generator."): value for key, value in state.items()
                     if key.startswith("generator.lm_head.")})
        disc.update({key.removeprefix("discriminator."): value for key, value in state.items()
                     if key.startswith("discriminator.mask_predictions.")})
        _write(out_dir, hf_config(cfg), to_hf_state_dict(cfg, disc))
        if generator:
            gen_cfg = cfg.generator_config()
            gen = {key.removeprefix("generator."): value for key, value in state.items() if key.startswith("generator.")}
            _write(out_dir / "generator", hf_config(gen_cfg), to_hf_state_dict(gen_cfg, gen))
    else:
        raise UserError(f"save_hf: cannot export a {type(model).__name__}")
    if tokenizer_dir is not None:
        copy_tokenizer_files(tokenizer_dir, out_dir)
    return out_dir
