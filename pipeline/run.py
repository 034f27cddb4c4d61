"""Run the corpus pipeline: check inputs and options, run Beam, write stats.json, summarise."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner.fn_runner import ExtendedProvisionInfo, FnApiRunner
from apache_beam.runners.portability.portable_runner import JobServiceHandle
from apache_beam.runners.runner import PipelineRunner

from . import fs, sinks
from .beam_pipeline import ARTIFACTS, NEAR_DUPLICATES, REJECTED, build_pipeline
from .config import CorpusConfig
from .errors import UserError
from .lid import check_model
from .perplexity import check_models, read_cutoffs

LOG = logging.getLogger(__name__)


def _all_option_classes(cls: type = PipelineOptions) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_option_classes(sub))
    return found


def unknown_beam_flags(flags: list[str]) -> list[str]:
    """Flags no registered Beam PipelineOptions class knows (Beam would only log and drop them)."""
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in _all_option_classes():
        cls._add_argparse_args(parser)
    return parser.parse_known_args(flags)[1]


def local_runner(options: PipelineOptions) -> PipelineRunner | None:
    """For ``DirectRunner``: Beam's FnApiRunner, which DirectRunner runs batch pipelines on.

    DirectRunner first tries Prism, which it downloads from GitHub: network access at run time,
    and on a machine with network a different engine than the one configured and tested here
    (without network: half a second lost on the failed download). ``--runner PrismRunner`` still
    asks for Prism. Other runners: None (Beam picks the runner from the options).
    """
    all_options = options.get_all_options()
    if all_options["runner"] not in ("DirectRunner", "SwitchingDirectRunner"):
        return None
    # as DirectRunner builds it: the options travel to the SDK workers in the provision info
    info = beam_provision_api_pb2.ProvisionInfo(pipeline_options=JobServiceHandle.encode_pipeline_options(all_options))
    return FnApiRunner(provision_info=ExtendedProvisionInfo(info))


def pipeline_options(cfg: CorpusConfig) -> PipelineOptions:
    flags = [f"--runner={cfg.runner}", *cfg.beam_options]
    unknown = unknown_beam_flags(flags)
    if unknown:
        raise UserError(f"unknown option or argument {unknown[0]!r} (neither ours nor a Beam pipeline option; see --help)")
    return PipelineOptions(flags)


def previous_outputs(output: str) -> list[str]:
    """Files an earlier run wrote to ``output`` (shards, rejected records, stats)."""
    found = [fs.join(output, name) for name in ARTIFACTS if fs.exists(fs.join(output, name))]
    found += fs.match_optional(fs.join(output, "lang=*", "bucket=*", "part-*"))
    found += fs.match_optional(fs.join(output, REJECTED, "part-*"))
    found += fs.match_optional(fs.join(output, NEAR_DUPLICATES, "part-*"))
    return found


def collect_counters(result: Any) -> dict[str, dict[str, int]]:
    counters: dict[str, dict[str, int]] = {}
    for metric in result.metrics().query()["counters"]:
        value = metric.committed if metric.committed is not None else metric.attempted
        counters.setdefault(metric.key.metric.namespace, {})[metric.key.metric.name] = int(value)
    return {step: dict(sorted(names.items())) for step, names in sorted(counters.items())}


def run_corpus(cfg: CorpusConfig, overwrite: bool = False) -> dict[str, Any]:
    """Run the whole pipeline and return the content of ``stats.json``."""
    files = fs.match_inputs(cfg.input)
    options = pipeline_options(cfg)
    check_model(cfg.lid.model)
    languages = check_models(cfg.perplexity.models, cfg.perplexity.languages) if cfg.perplexity.models else []
    cutoffs = read_cutoffs(cfg.perplexity.cutoffs) if cfg.perplexity.cutoffs else None
    if cutoffs is not None:
        uncovered = sorted(set(languages) - set(cutoffs))
        if uncovered:
            LOG.warning("%s has no cutoffs for %s: their documents get bucket 'all'", cfg.perplexity.cutoffs,
                        ", ".join(uncovered))
    stale = previous_outputs(cfg.output)
    if stale:
        if not overwrite:
            raise UserError(f"output {cfg.output} already holds a corpus ({len(stale)} files); pass --overwrite to replace it")
        fs.delete(stale)
        if fs.is_local(cfg.output):  # and the partition folders they leave empty
            for folder in sorted(Path(cfg.output).glob("lang=*/bucket=*")) + sorted(Path(cfg.output).glob("lang=*")):
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
    start = time.perf_counter()
    try:
        pipeline = beam.Pipeline(runner=local_runner(options), options=options)
    except ValueError as exc:  # Beam's message for an unknown --runner lists the valid ones
        raise UserError(str(exc)) from None
    build_pipeline(pipeline, cfg, files, languages, cutoffs)
    result = pipeline.run()
    result.wait_until_finish()
    elapsed = time.perf_counter() - start
    with fs.open_read(fs.join(cfg.output, "sampling.json")) as stream:
        sampling = json.load(stream)
    report = {
        "input_files": len(files),
        "counters": collect_counters(result),
        "languages": sampling["corpus"],
        "config": {name: vars(getattr(cfg, name)) for name in ("read", "dedup", "lid", "near_dedup", "perplexity", "write", "sampling")},
    }
    sinks.write_json(report, fs.join(cfg.output, "stats.json"))
    report["elapsed_s"] = elapsed
    return report
