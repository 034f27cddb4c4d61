"""The corpus pipeline's configuration: a YAML file plus command-line overrides, checked strictly
(see ``util.configfile``).

A profile names its steps in order (``steps:``); each step has a config section of its own, under
its name, typed by the step's ``Config`` dataclass (``pipeline.steps``). ``read``, ``write`` and
``sampling`` are the run's own sections.
"""
from __future__ import annotations

import dataclasses
import logging
import types
from typing import Any

from .output import fs
from .output.layout import FORMATS, SCHEMAS
from .report.sampling import UNITS, check_rehydration
from .runners.prefork import LOCAL_NAMES
from .steps import closest, registry, resolve
from .steps.base import RunInfo, Step, graph_label
from .steps.perplexity import BUCKETS
from .util.configfile import Source, build_dataclass, check_choices_and_ranges, describe, merged_config_data, source_of
from .util.errors import UserError, contained

DEFAULT_STEPS = ["dedup", "lid", "near_dedup", "perplexity"]
LOG = logging.getLogger(__name__)


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
class WriteConfig:
    format: str = "arrow"
    """arrow (Arrow IPC file, zstd), parquet (zstd), or json (CCNet's layout: <lang>_<bucket>_NNNN.json.gz, a JSON document a line)."""
    schema: str = "polyglot"
    """polyglot (our columns), or ccnet (CCNet's fields: raw_content, language, language_score, title, source_domain, cc_segment, line_ids, ...)."""
    shard_size_mb: float = 256.0
    """Target uncompressed text size of a shard (at most 1024: Arrow's string columns hold 2 GiB); the shard count per partition follows from it."""
    removed: bool = False
    """Write every document a step removes, with the reason, to removed/<step>/ (near_dedup adds duplicate_of)."""


@dataclasses.dataclass
class SamplingConfig:
    alpha: float = 0.3
    """Sampling exponent: q_i ∝ p_i^alpha (XLM-R: 0.3)."""
    unit: str = "characters"
    """characters or documents: what n_i counts."""
    buckets: list[str] = dataclasses.field(default_factory=list)
    """Count n_i over these buckets only, e.g. [head, middle] (default, empty: every bucket). all is the bucket of the documents no step sorted into head, middle or tail (no perplexity cutoffs or model for their language), so [all] alone is not every bucket."""
    rehydration: list[list[int]] = dataclasses.field(default_factory=list)
    """[[smallest minhash_cluster_size, copies], ...]: n_i counts each kept document that many times (FineWeb-2's: [[1, 1], [2, 2], [3, 3], [5, 5], [100, 8], [1000, 1]]; empty: off)."""


@dataclasses.dataclass
class CorpusConfig:
    input: list[str] = dataclasses.field(default_factory=list)
    """Globs of WET/WARC files (local, ~ and file:// too; gs://, s3://)."""
    output: str = ""
    """Output directory (local, ~ and file:// too; gs://, s3://): shards, rejected/, removed/, stats.json, sampling.json."""
    runner: str = "DirectRunner"
    """Beam runner: DirectRunner (on Beam's FnApiRunner, no Prism download), DaskRunner, PortableRunner, PrismRunner, DataflowRunner, FlinkRunner, SparkRunner (in any case, ``Runner`` optional, as Beam reads it), or module.Class of a PipelineRunner."""
    progress: bool = True
    """Print a line per input file as it is read (local runs)."""
    steps: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_STEPS))
    """The steps, in the order they run (each configured in the section of its name). Built in: {steps}; or a module path (my.module[:Class])."""
    read: ReadConfig = dataclasses.field(default_factory=ReadConfig)
    write: WriteConfig = dataclasses.field(default_factory=WriteConfig)
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    beam_options: list[str] = dataclasses.field(default_factory=list)
    """Extra Beam pipeline options, e.g. [--direct_num_workers=2]."""
    sections: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"internal": True})
    """Each step's config, by step name (built by :func:`load_config`; a step without one has its defaults)."""
    own_beam_options: tuple[str, int] = dataclasses.field(default=("", 0), metadata={"internal": True})
    """Where the config's own ``beam_options`` came from (the YAML file or its ``--set``) and how many
    of them lead the list, before the command line's Beam flags: for an error about one of them."""

    def step_classes(self) -> list[type[Step]]:
        """The classes of ``steps``, in order."""
        return [resolve(name) for name in self.steps]

    def section(self, name: str) -> Any:
        """Step ``name``'s config."""
        return self.sections[name]

    def active_step_classes(self) -> list[type[Step]]:
        """The classes of the steps that run (``Step.active`` on their sections), in order."""
        return [cls for cls in self.step_classes() if cls.active(self.section(cls.name))]

    def worker_modules(self) -> list[str]:
        """The third-party modules the running steps import in the workers (``Step.worker_modules``)."""
        return [module for cls in self.active_step_classes() for module in cls.worker_modules]

    def to_dict(self) -> dict[str, Any]:
        """The config as stats.json records it: the steps in order, their sections and the run's."""
        classes = self.step_classes()
        return {"steps": [cls.name for cls in classes],
                **{name: vars(getattr(self, name)) for name in RUN_SECTIONS},
                **{cls.name: vars(self.sections[cls.name]) for cls in classes}}


RUN_SECTIONS = ("read", "write", "sampling")
TOP_LEVEL = tuple(f.name for f in dataclasses.fields(CorpusConfig) if not f.metadata.get("internal"))
RUN_NAMES = frozenset({*TOP_LEVEL, "io", "near_dedup_cluster_sizes", "files", "distribute", "as_tables",
                       "write_corpus", "rejected_as_dicts", "write_rejected", "write_stats", "flatten_counts",
                       "sum_counts"})
"""Names a plugin step may not take: the run's config keys and sections, its counter groups besides
the steps' (the store's ``io``, near-dup's cluster sizes) and its graph labels (a step's label is its
name in CamelCase: a step ``write`` would share the writer's section and counters, ``io`` hide its
counts in run.json, ``as_tables`` clash with the graph's own transform)."""
RUN_LABELS = frozenset(map(graph_label, RUN_NAMES))
"""The graph labels of :data:`RUN_NAMES`, which a step's name may not have either (``AS_TABLES``)."""
CHOICES = {
    "read.format": ("auto", "wet", "warc"),
    "write.format": tuple(FORMATS),
    "write.schema": SCHEMAS,
    "sampling.unit": UNITS,
}
RANGES = {
    "read.min_length": (0, None),
    "write.shard_size_mb": (1e-6, 1024),  # a shard's text past 2 GiB overflows Arrow's string offsets
    "sampling.alpha": (1e-6, 1.0),
}


def _prefixed(table: dict[str, Any], name: str) -> dict[str, Any]:
    return {f"{name}.{key}": value for key, value in table.items()}


def _check_section(name: str, section: Any, source: Source) -> None:
    """A step section's choices, ranges (``Config.choices`` / ``Config.ranges``) and ``validate()``."""
    config_cls = type(section)
    check_choices_and_ranges(types.SimpleNamespace(**{name: section}), source,
                             _prefixed(getattr(config_cls, "choices", {}), name),
                             _prefixed(getattr(config_cls, "ranges", {}), name))
    if hasattr(section, "validate"):
        try:
            section.validate()
        except UserError as exc:
            raise UserError(f"{source.within(name)}: {name}: {exc}") from None


def _makers(field: str) -> str:
    """The steps that set document field ``field``, for a message."""
    return " or ".join(sorted(c.name for c in registry().values() if field in c.provides)) or "no step"


def _check_steps(classes: list[type[Step]], sections: dict[str, Any], source: Source) -> None:
    """No step twice, a step on the input files first, every field a step needs set before it, and
    ``lang`` set for the writer (the shards are per language)."""
    where = source_of(source, "steps")
    provided: set[str] = set()
    seen: dict[str, str] = {}  # graph label: step name
    for i, cls in enumerate(classes):
        label = graph_label(cls.name)
        if label in seen:
            twin = f" ({seen[label]!r} has its graph label, {label!r})" if seen[label] != cls.name else ""
            raise UserError(f"{where}: steps: {cls.name!r} is named twice{twin}")
        if label in RUN_LABELS:
            raise UserError(f"{where}: steps: step {cls.name!r} ({cls.__module__}.{cls.__name__}) has a name of the "
                            "run's own (a config section, counter group or part of the graph); give it a name of its own")
        seen[label] = cls.name
        if not cls.active(sections[cls.name]) and (why := cls.inactive_error(sections[cls.name])):
            raise UserError(f"{where}: steps: {why}")
        if cls.reads_files and i:
            raise UserError(f"{where}: steps: {cls.name!r} works on the input files and must come first")
        missing = [f for f in cls.requires(sections[cls.name]) if f not in provided]
        if missing:
            raise UserError(f"{where}: steps: {cls.name!r} needs {missing[0]!r}, set by {_makers(missing[0])}: "
                            f"put that step before it")
        provided.update(cls.provides)
    if "lang" not in provided:
        raise UserError(f"{where}: steps: writing the corpus needs 'lang' (the shards are per language), "
                        f"set by {_makers('lang')}: add that step")


def _check_unused_sections(cfg: CorpusConfig, source: Source) -> None:
    """A section of a step not in ``steps:`` is built and checked, but nothing reads it: a key the
    command line sets there is an error (what it asks would silently not happen); sections the
    config file keeps for steps its own ``steps:`` leaves out are one warning line (none where the
    command line chose the steps: it switched those off)."""
    unused = sorted(set(cfg.sections) - {cls.name for cls in cfg.step_classes()})
    for name in unused:
        given = [key for key in source.given if key == name or key.startswith(name + ".")]
        if given:
            raise UserError(f"{source.of(given[0])}: {given[0]} is set, but step {name} is not in steps "
                            f"([{', '.join(cfg.steps)}]), so nothing would read it: add {name} to steps")
    if unused and "steps" not in source.given:
        LOG.warning("%s: %s not in steps, so %s not used: %s", source.path,
                    "these steps are" if len(unused) > 1 else "this step is",
                    "their sections are" if len(unused) > 1 else "its section is", ", ".join(unused))


def _validate(cfg: CorpusConfig, source: Source) -> None:
    check_choices_and_ranges(cfg, source, CHOICES, RANGES)
    problem = check_rehydration(cfg.sampling.rehydration)
    if problem:
        raise UserError(f"{source_of(source, 'sampling.rehydration')}: sampling.rehydration: {problem}")
    for value in cfg.sampling.buckets:
        if value not in (*BUCKETS, "all"):
            raise UserError(f"{source_of(source, 'sampling.buckets')}: sampling.buckets holds {value!r}; buckets are {', '.join(BUCKETS)}, all")
    if cfg.sampling.buckets and "all" not in cfg.sampling.buckets and not _sets_buckets(cfg):
        raise UserError(f"{source_of(source, 'sampling.buckets')}: sampling.buckets {cfg.sampling.buckets}: no step "
                        "here sorts documents into head, middle and tail (perplexity does, given perplexity.cutoffs), "
                        "so every document is in bucket all and sampling.json would weigh no language; add all to "
                        "the list, or leave sampling.buckets out")
    for name, section in cfg.sections.items():
        _check_section(name, section, source)


def _sets_buckets(cfg: CorpusConfig) -> bool:
    """Whether a step of the run gives documents buckets other than all: perplexity with cutoffs, or a
    plugin step that provides ``bucket``."""
    return any("bucket" in cls.provides and (cls.name != "perplexity" or cfg.sections[cls.name].cutoffs)
               for cls in cfg.active_step_classes())


PATH_OPTIONS = ("--temp_location",)
"""Beam options that name a folder, made plain paths (:func:`plain_paths`) with the config's own."""


def plain_paths(cfg: CorpusConfig) -> None:
    """Every path of the config as the file systems take it (``fs.plain_path``): the inputs, the
    output, ``--temp_location`` and the files the steps read (``Step.store_paths``)."""
    cfg.input = [fs.plain_path(pattern) for pattern in cfg.input]
    cfg.output = fs.plain_path(cfg.output)
    options: list[str] = []
    for option in cfg.beam_options:
        name, sep, value = str(option).partition("=")
        if options and options[-1] in PATH_OPTIONS:  # the value of "--temp_location VALUE"
            option = fs.plain_path(option)
        elif sep and name in PATH_OPTIONS:
            option = f"{name}={fs.plain_path(value)}"
        options.append(option)
    cfg.beam_options = options
    for key in step_store_paths(cfg):
        step, _, name = key.partition(".")
        section = cfg.section(step)
        if isinstance(getattr(section, name, None), str):
            setattr(section, name, fs.plain_path(getattr(section, name)))


def step_store_paths(cfg: CorpusConfig) -> dict[str, str]:
    """``{config key: path}`` of the files the config's steps read (``Step.store_paths``)."""
    return {key: path for cls in cfg.active_step_classes()
            for key, path in contained(f"step {cls.name}: building it", cls, cfg.section(cls.name), RunInfo())
            .store_paths().items()}


SPECIAL_RUNNERS = (*LOCAL_NAMES, "DaskRunner")
"""The runners this package treats apart from the rest (its FnApiRunner set-up, its Dask
translation), spelled as it compares them."""


def canonical_runner(name: str) -> str:
    """``name`` spelled as :data:`SPECIAL_RUNNERS` spells it where Beam would take it for one of them
    (Beam reads a runner's name in any case, ``Runner`` optional: ``directrunner``, ``direct``);
    any other name as it is."""
    wanted = name.strip().lower()
    return next((known for known in SPECIAL_RUNNERS if wanted in (known.lower(), known.lower().removesuffix("runner"))),
                name)


def load_config(path: str | None, overrides: dict[str, Any] | None = None,
                sets: list[str] | None = None, beam_flags: list[str] | None = None) -> CorpusConfig:
    """Read the YAML config (if any), apply ``--set key=value`` strings and direct overrides, and
    add ``beam_flags`` (the command line's Beam options) to ``beam_options``."""
    data, source = merged_config_data(path, overrides, sets)
    cfg = build_dataclass(CorpusConfig, {k: v for k, v in data.items() if k in TOP_LEVEL}, source)
    cfg.runner = canonical_runner(cfg.runner)  # (before anything compares it with a name)
    cfg.own_beam_options = (source_of(source, "beam_options"), len(cfg.beam_options))
    cfg.beam_options = [*cfg.beam_options, *(beam_flags or [])]
    try:
        classes = cfg.step_classes()
    except UserError as exc:
        raise UserError(f"{source_of(source, 'steps')}: steps: {exc}") from None
    known = {**registry(), **{cls.name: cls for cls in classes}}
    for key in sorted(set(data) - set(TOP_LEVEL)):
        if key not in known:
            raise UserError(f"{source_of(source, key)}: unknown config key {key!r}{closest(key, [*TOP_LEVEL, *known])} "
                            f"(top level: {', '.join(TOP_LEVEL)}; step sections: {', '.join(sorted(known))})")
        cfg.sections[key] = build_dataclass(known[key].Config, data[key], source, f"{key}.")
    for cls in classes:
        cfg.sections.setdefault(cls.name, cls.Config())
    _check_steps(classes, cfg.sections, source)
    _check_unused_sections(cfg, source)
    _validate(cfg, source)
    if not cfg.input:
        raise UserError(f"{source}: no input: set input in the config or pass --input")
    if not cfg.output.strip():  # (blanks would make a folder named by them, in the current one)
        given = cfg.output or (isinstance(source, Source) and "output" in source.given)  # blanks, or '' given
        raise UserError(f"{source_of(source, 'output')}: output {cfg.output!r} names no folder" if given
                        else f"{source}: no output: set output in the config or pass --output")
    plain_paths(cfg)
    return cfg


def describe_corpus_config() -> list[str]:
    """The corpus config keys for ``pipeline run --help``: the run's, then each built-in step's section."""
    lines = [line.replace("{steps}", ", ".join(sorted(registry()))) for line in describe(CorpusConfig, "", CHOICES)]
    for name, cls in sorted(registry().items()):
        lines.extend(describe(cls.Config, f"{name}.", _prefixed(getattr(cls.Config, "choices", {}), name)))
    return lines
