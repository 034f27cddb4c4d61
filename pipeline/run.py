"""Run the corpus pipeline: check inputs and options, run Beam, write stats.json, summarise."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, TestOptions

from .config import CorpusConfig
from .graph import build_pipeline, build_steps
from .output import fs, layout, stores
from .output.layout import ARTIFACTS, COMMIT, REPORT, RUN_FILE, STAGING
from .output.shards import write_json
from .report.corpus_report import build as build_report
from .runners.options import check_engine, cloud_error, make_runner, pipeline_options
from .steps.base import Step
from .util import faults
from .util.errors import UserError

LOG = logging.getLogger(__name__)


def previous_outputs(output: str) -> list[str]:
    """Files a run wrote to ``output`` (shards, rejected and removed records, stats, report); the same
    below a staging folder."""
    found = [fs.join(output, name) for name in (*ARTIFACTS, RUN_FILE) if fs.exists(fs.join(output, name))]
    found += [p for fmt in ("arrow", "json") for p in fs.match_optional(layout.shard_pattern(output, fmt))]
    found += layout.record_files(output)
    found += fs.match_optional(fs.join(output, REPORT, "*"))
    return found


def commit(staging: str, final: str, stale: list[str]) -> None:
    """Replace the corpus in ``final`` by the complete one in ``staging``: first a marker in the
    staging folder lists every move and deletion, then they are done, then the staging folder goes.
    A process killed during the moves leaves the marker, and :func:`recover` finishes the job."""
    plan = {"moves": [fs.relative(p, staging) for p in previous_outputs(staging)],
            "delete": [fs.relative(p, final) for p in stale]}
    faults.fault_point("POLYGLOT_FAULT", "commit", 0)
    write_json(plan, fs.join(staging, COMMIT))
    _apply(staging, final, plan)


def _apply(staging: str, final: str, plan: dict[str, list[str]]) -> None:
    moves = [fs.join(staging, rel) for rel in plan["moves"]]
    replaced = set(plan["moves"])  # old files a new one replaces stay until then (and are not deleted after)
    fs.replace_tree([p for p in moves if fs.exists(p)], staging,
                    [fs.join(final, rel) for rel in plan["delete"] if rel not in replaced], final)
    fs.remove_empty_folders(final, [*layout.PARTITION_FOLDERS, *layout.RECORD_FOLDERS, REPORT])


def recover(final: str) -> list[str]:
    """What an earlier run left in ``final``: a staging folder with a commit marker (killed while
    replacing: its moves are finished, so the new corpus is complete) or without one (killed or
    failed before: deleted, the corpus there is the previous one). Returns the folders handled."""
    handled = []
    for folder in sorted({p.rstrip("/").rsplit("/", 1)[0] for p in fs.match_optional(fs.join(final, f"{STAGING}*", "*"))}):
        marker = fs.join(folder, COMMIT)
        if fs.exists(marker):
            with fs.open_read(marker) as stream:
                _apply(folder, final, json.load(stream))
            LOG.warning("%s: finished replacing the corpus with the one a killed run had completed", final)
        else:
            fs.remove_folder(folder)
            LOG.warning("%s: removed %s, left by a run that did not finish", final, folder)
        handled.append(folder)
    return handled


def check_stores(cfg: CorpusConfig, options: PipelineOptions) -> None:
    """Every bucket the run reads or writes answers, exists and takes these credentials (the
    output's takes a write), before any work: one error line naming the path otherwise."""
    for pattern in cfg.input:
        stores.check(pattern, "input", options)
    stores.check(cfg.output, "output", options, write=True)


def prepare_steps(steps: list[Step], options: PipelineOptions) -> None:
    """Each step's files answer on their store, then the step checks them (models, tables)."""
    for step in steps:
        for what, path in step.store_paths().items():
            stores.check(path, what, options)
    for step in steps:
        step.prepare()


def run_corpus(cfg: CorpusConfig, overwrite: bool = False) -> dict[str, Any]:
    """Run the whole pipeline; return the content of ``stats.json`` and ``run.json`` together.

    stats.json and sampling.json are written by the graph from counts that travel as data, so
    they are the same bytes on every runner; run.json holds what differs between runs (runner,
    elapsed time, Beam version)."""
    options = pipeline_options(cfg.runner, cfg.beam_options)
    fs.configure(options)
    check_stores(cfg, options)
    files = fs.match_inputs(cfg.input)
    check_engine(options)
    steps = build_steps(cfg, len(files))
    prepare_steps(steps, options)
    template = options.view_as(GoogleCloudOptions).template_location
    build_only = bool(options.view_as(TestOptions).dry_run or template)  # Dataflow: build the job, run nothing
    if not build_only:
        recover(cfg.output)
    stale = [] if build_only else previous_outputs(cfg.output)
    if stale and not overwrite:
        raise UserError(f"output {cfg.output} already holds a corpus ({len(stale)} files); pass --overwrite to replace it")
    final = cfg.output
    if not build_only:  # the run writes beside the old corpus, which is replaced only once the new one is complete
        cfg = dataclasses.replace(cfg, output=fs.join(final, f"{STAGING}{uuid.uuid4().hex[:12]}"))
    start = time.perf_counter()
    try:
        pipeline = beam.Pipeline(runner=make_runner(options), options=options)
    except ValueError as exc:  # an unknown --runner (Beam's list lacks ours), or options Dataflow rejects
        ours = " DaskRunner runs on our Dask translation." if "Unexpected pipeline runner" in str(exc) else ""
        raise UserError(f"{exc}{ours}") from None
    build_pipeline(pipeline, cfg, files, steps)
    try:
        result = pipeline.run()
        if build_only:  # with --template_location the job and what it needs are staged, not run
            return {"built_only": template or "(--dry_run: not staged)"}
        result.wait_until_finish()  # the DirectRunner runs (and fails) inside run() already
    except BaseException as exc:
        if not build_only:
            fs.remove_folder(cfg.output)  # the failed run's files; the previous corpus is untouched
        error = cloud_error(exc, cfg.runner) if isinstance(exc, Exception) else None
        if error is not None:
            raise error from None
        raise
    folders = [cfg.output, fs.join(cfg.output, layout.PARTITION_FOLDERS[0]), *layout.record_folders(cfg.output)]
    for path in fs.remove_temporaries(folders):
        LOG.info("removed %s, left by a worker that was lost", path)
    run = {"runner": cfg.runner, "elapsed_s": round(time.perf_counter() - start, 3), "beam_version": beam.__version__,
           "beam_options": cfg.beam_options}
    write_json(run, fs.join(cfg.output, RUN_FILE))
    build_report(cfg.output)  # part of the output: replaced with the corpus, never apart from it
    commit(cfg.output, final, stale)
    with fs.open_read(fs.join(final, "stats.json")) as stream:
        return {**json.load(stream), **run}
