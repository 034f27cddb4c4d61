"""Model configuration: one dataclass for both encoder families, read from ``configs/models/<name>.yaml``.

Field names follow HF transformers' config names where the two agree, so conversion to and from
``config.json`` is mostly a copy.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline.util.configfile import Source, build_dataclass, check_choices_and_ranges, merged_config_data, source_of
from pipeline.util.errors import UserError

MODELS_DIR = Path(__file__).resolve().parents[2] / "configs" / "models"
ARCHS = ("xlmr", "deberta-v3")
OBJECTIVES = ("mlm", "rtd")
POS_ATT_TYPES = ("c2p", "p2c")


@dataclasses.dataclass
class ModelConfig:
    arch: str = "xlmr"
    """xlmr (RoBERTa encoder, learned absolute positions) or deberta-v3 (disentangled attention)."""
    objective: str = "mlm"
    """mlm (masked language model) or rtd (DeBERTa-v3 replaced-token detection; deberta-v3 only)."""
    vocab_size: int = 250002
    """Vocabulary size V (= the tokenizer's; `<mask>` is V-1). The trainer overrides it from the tokenizer."""
    hidden_size: int = 768
    """Model width d."""
    num_hidden_layers: int = 12
    """Encoder layers L (for rtd: the discriminator's)."""
    num_attention_heads: int = 12
    """Attention heads (hidden_size must be a multiple)."""
    intermediate_size: int = 3072
    """Feed-forward width."""
    max_position_embeddings: int = 514
    """xlmr: position table size (max sequence = this - pad_token_id - 1); deberta-v3: max sequence length."""
    layer_norm_eps: float = 1e-5
    """LayerNorm epsilon (XLM-R 1e-5, DeBERTa 1e-7)."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings, attention output and feed-forward output."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on attention probabilities."""
    initializer_range: float = 0.02
    """Standard deviation of the normal weight init."""
    pad_token_id: int = 1
    """Padding id (contract: 1 for both families)."""
    sparse_mlm_head: bool = True
    """Compute MLM logits only at predicted positions (labels != -100); false: logits everywhere."""
    classifier_dropout: float | None = None
    """Dropout before the classification head (None: hidden_dropout_prob); deberta: the pooler's too."""
    position_buckets: int = 256
    """deberta-v3: log-bucketed relative positions; 2*position_buckets relative embeddings."""
    max_relative_positions: int = -1
    """deberta-v3: largest relative distance told apart (-1: max_position_embeddings)."""
    pos_att_type: list[str] = dataclasses.field(default_factory=lambda: ["p2c", "c2p"])
    """deberta-v3: disentangled terms, any of c2p (content->position), p2c (position->content)."""
    generator_layers: int = 0
    """rtd: generator depth (0: half of num_hidden_layers, as DeBERTa-v3); same width as the discriminator."""
    rtd_weight: float = 50.0
    """rtd: loss = gen_loss + rtd_weight * rtd_loss (DeBERTa-v3: 50)."""
    gdes: bool = True
    """rtd: gradient-disentangled embedding sharing (discriminator embeddings = sg(generator's) + delta)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def relative_span(self) -> int:
        """deberta-v3: half the number of relative embeddings (HF's pos_ebd_size)."""
        if self.position_buckets > 0:
            return self.position_buckets
        return self.max_relative_positions if self.max_relative_positions > 0 else self.max_position_embeddings

    @property
    def max_sequence_length(self) -> int | None:
        """Longest input the model accepts: XLM-R's absolute positions (less the ids RoBERTa's
        family skips); None for deberta-v3, which has relative positions only (log-bucketed past
        ``relative_span``), as HF's DebertaV2 with ``position_biased_input`` false takes any length."""
        if self.arch == "xlmr":
            return self.max_position_embeddings - self.pad_token_id - 1
        return None

    def generator_config(self) -> "ModelConfig":
        """The RTD generator's config: same width, ``generator_layers`` deep, trained with MLM."""
        layers = self.generator_layers or max(1, self.num_hidden_layers // 2)
        return dataclasses.replace(self, objective="mlm", num_hidden_layers=layers)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


RANGES = {
    "vocab_size": (8, None),
    "hidden_size": (1, None),
    "num_hidden_layers": (1, None),
    "num_attention_heads": (1, None),
    "intermediate_size": (1, None),
    "max_position_embeddings": (2, None),
    "layer_norm_eps": (0.0, 1.0),
    "hidden_dropout_prob": (0.0, 1.0),
    "attention_probs_dropout_prob": (0.0, 1.0),
    "initializer_range": (0.0, None),
    "classifier_dropout": (0.0, 1.0),
    "generator_layers": (0, None),
    "rtd_weight": (0.0, None),
}


def validate_model_config(cfg: ModelConfig, source: Source | str) -> ModelConfig:
    """``cfg`` itself, or a UserError naming the first bad key."""
    check_choices_and_ranges(cfg, source, {"arch": ARCHS, "objective": OBJECTIVES}, RANGES)
    if cfg.hidden_size % cfg.num_attention_heads:
        raise UserError(f"{source_of(source, 'hidden_size', 'num_attention_heads')}: hidden_size ({cfg.hidden_size}) "
                        f"must be a multiple of num_attention_heads ({cfg.num_attention_heads})")
    if cfg.objective == "rtd" and cfg.arch != "deberta-v3":
        raise UserError(f"{source_of(source, 'objective', 'arch')}: objective rtd needs arch deberta-v3, got {cfg.arch}")
    if not 0 <= cfg.pad_token_id < cfg.vocab_size:
        raise UserError(f"{source_of(source, 'pad_token_id')}: pad_token_id={cfg.pad_token_id} is "
                        f"outside the vocabulary ({cfg.vocab_size})")
    bad = [t for t in cfg.pos_att_type if t not in POS_ATT_TYPES]
    if cfg.arch == "deberta-v3" and not cfg.pos_att_type:
        raise UserError(f"{source_of(source, 'pos_att_type', 'arch')}: pos_att_type must name at least one of "
                        f"{', '.join(POS_ATT_TYPES)}")
    if bad:
        raise UserError(f"{source_of(source, 'pos_att_type')}: pos_att_type holds {bad[0]!r}; allowed: {', '.join(POS_ATT_TYPES)}")
    if len(set(cfg.pos_att_type)) < len(cfg.pos_att_type):  # a repeat would count twice in the attention's scale
        raise UserError(f"{source_of(source, 'pos_att_type')}: pos_att_type names a type twice: {cfg.pos_att_type}")
    return cfg


def model_config_path(name_or_path: str) -> Path:
    """A config name (``configs/models/<name>.yaml``) or a YAML path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return path
    candidate = MODELS_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        names = sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))
        raise UserError(f"model config {name_or_path!r}: no such file or name (names: {', '.join(names)})")
    return candidate


def load_model_config(name_or_path: str, overrides: dict[str, Any] | None = None,
                      sets: list[str] | None = None) -> ModelConfig:
    """Read a model config by name or path, with direct overrides and ``--set key=value`` strings."""
    path = model_config_path(name_or_path)
    data, source = merged_config_data(str(path), overrides, sets)
    return validate_model_config(build_dataclass(ModelConfig, data, source), source)


def model_config_from_dict(data: dict[str, Any], source: str) -> ModelConfig:
    """A ModelConfig from a plain mapping (e.g. a checkpoint's client state), checked like a YAML file."""
    return validate_model_config(build_dataclass(ModelConfig, data, source), source)
