"""Run the corpus pipeline: check inputs and options, run Beam, write stats.json, summarise."""
from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import dataclasses
import difflib
import functools
import gc
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import apache_beam as beam
from apache_beam.metrics import monitoring_infos
from apache_beam.options.pipeline_options import (GoogleCloudOptions, PipelineOptions, SetupOptions,
                                                  TestOptions)

from .config import CorpusConfig, step_store_paths
from .graph import INPUT_LABEL, build_pipeline, build_steps
from .output import fs, layout, lease, shards, stores
from .output.layout import (ARTIFACTS, COMMIT, IO_FILE, LEASE, REJECTED, REPORT, RUN_FILE, RUN_LOCK, RUN_STATE,
                            STAGING, TASK_FOLDER)
from .readers import spill
from .report.background import build as build_report
from .report.corpus_report import REPORT_FILES
from .report.sampling import left_out_warning
from .runners import forkserver, ledger, prefork
from .runners.options import (DASK_NAMES, LOCAL_NAMES, check_engine, check_relative_paths, cloud_error, make_runner,
                              pipeline_options)
from .steps.base import Step
from .util import faults, locks, sources
from .util.errors import UserError, contained, first_line, step_failure

LOG = logging.getLogger(__name__)


def corpus_files(folder: str) -> list[str]:
    """Files a run writes in a corpus folder (shards, rejected and removed records, stats, report),
    by the globs of their names: in a staging folder, all of which is the run's, the files a commit moves."""
    found = [fs.join(folder, name) for name in (*ARTIFACTS, RUN_FILE) if fs.exists(fs.join(folder, name))]
    found += [p for fmt in ("arrow", "json") for p in layout.shard_files(folder, fmt)]
    found += layout.record_files(folder)
    found += fs.match_optional(folder, REPORT, "*")
    return found


def previous_outputs(output: str) -> list[str]:
    """The files of the corpus a run left in ``output``, which a commit replaces: none where no
    stats.json or run.json is there (a folder of the user's: its ``my_web_crawl.json.gz`` or
    ``report/thesis.pdf`` only look like a corpus's files), and of the others only those by the
    names a run gives them (``layout.written_name``, the report's files), so that a file of the
    user's beside a corpus is never deleted with it."""
    if not any(fs.exists(fs.join(output, name)) for name in (ARTIFACTS[0], RUN_FILE)):
        return []
    report = {f"{REPORT}/{name}" for name in REPORT_FILES}
    return [path for path in corpus_files(output) if (name := fs.relative(path, output)) in (*ARTIFACTS, RUN_FILE)
            or name in report or layout.written_name(name)]


def foreign_file(output: str) -> str | None:
    """A file in ``output`` that no run wrote, where it holds no corpus (:func:`previous_outputs`
    finds none): anything but the staging folders and leases of runs. A run there is refused
    rather than written beside it: the corpus's shards and report would mix with the user's
    files, and a later ``--overwrite`` could not tell them apart by name."""
    def run_made(name: str) -> bool:  # or nothing of the user's: a hidden file (a desktop's .DS_Store, a
        base = name.rsplit("/", 1)[-1]  # repository's .gitkeep), a bucket console's "folder" object
        return name.startswith(STAGING) or name.startswith(LEASE) or not base or base.startswith(".")

    if not fs.is_local(output):
        return next((p for p in fs.match_optional(output, "**") if not run_made(fs.relative(p, output))), None)
    for folder, folders, names in os.walk(output):
        folders[:] = sorted(name for name in folders if not run_made(name))
        names = [name for name in names if not run_made(name)]
        if names:
            return os.path.join(folder, sorted(names)[0])
    return None


def commit(staging: str, final: str, stale: list[str]) -> None:
    """Replace the corpus in ``final`` by the complete one in ``staging``: first a marker in the
    staging folder lists every move and deletion, then they are done, then the staging folder goes.
    A process killed during the moves leaves the marker, and :func:`recover` finishes the job.
    Locally the new files (with the folders above them) and then the marker are on the disk before
    the first move, and the moves before the marker goes: a machine that crashes during or soon
    after the moves (the kernel writes files out up to 30 s after) finds the new corpus whole, not
    the old one deleted for files cut short."""
    staged = corpus_files(staging)
    plan = {"moves": [fs.relative(p, staging) for p in staged], "delete": [fs.relative(p, final) for p in stale]}
    faults.fault_point("POLYGLOT_FAULT", "commit", 0)
    fs.make_durable(staged)
    fs.write_json(fs.join(staging, COMMIT), plan, durable=True)
    _apply(staging, final, plan)


def _apply(staging: str, final: str, plan: dict[str, list[str]]) -> None:
    left = {rel for rel in plan["moves"] if fs.exists(fs.join(staging, rel))}  # a killed commit did the others
    replaced = set(plan["moves"])  # old files a new one replaces stay until then (and are not deleted after)
    fs.replace_tree([fs.join(staging, rel) for rel in plan["moves"] if rel in left], staging,
                    [fs.join(final, rel) for rel in plan["delete"] if rel not in replaced], final,
                    moved=[fs.join(final, rel) for rel in plan["moves"] if rel not in left])
    fs.remove_empty_folders(final, [*layout.PARTITION_FOLDERS, *layout.RECORD_FOLDERS, REPORT])


def staging_folders(final: str) -> list[str]:
    """The staging folders in ``final`` that hold a file, at any depth (a run killed before it wrote
    one at the top left only its shards)."""
    return sorted({fs.join(final, fs.relative(p, final.rstrip("/")).split("/", 1)[0])
                   for p in fs.match_optional(final, f"{STAGING}*", "**")})


def running(folder: str) -> bool:
    """Whether a run still writes staging folder ``folder``, as far as can be told: a local one
    whose lock a live process holds, one in a bucket whose lease is renewed (:func:`hold_staging`),
    or one with neither that holds no file at its top: a run writes its run state (DaskRunner) or
    its statistics there, and holds a lock or lease, from this version on; one killed before any of
    that cannot be told apart."""
    if fs.is_local(folder) and locks.has_lock_file(folder):
        return not locks.abandoned(folder)
    if not fs.is_local(folder) and (held := lease.live(folder)) is not None:
        return held
    return not fs.match_optional(folder, "*")


def named_process(host: object, pid: object) -> str:
    """How an error line names the process that holds an output or a staging folder."""
    return f"process {pid} on host {host}"


def lease_holder(info: dict[str, Any]) -> str:
    """:func:`named_process` of the run a lease names; "" where it names none (a version before)."""
    return named_process(info["host"], info["pid"]) if {"host", "pid"} <= info.keys() else ""


def holder(folder: str) -> str:
    """Who holds staging folder ``folder``, and what to do if that run is gone, for an error line:
    the host and process its lock (local) or lease (a bucket) names. Without its lock, a local folder
    with a file at its top is a killed run's (:func:`running`), which the next run removes or
    ``--resume`` continues; one without must be removed by hand."""
    if fs.is_local(folder):
        lock = os.path.join(folder, locks.LOCK_FILE)
        if (named := locks.owner(lock)) is None:
            return "remove that folder yourself if no run is writing it"
        top = [path for path in fs.match_optional(folder, "*") if os.path.basename(path) != locks.LOCK_FILE]
        return (f"held by {named_process(*named)}; if that process is gone, "
                f"{f'delete {lock}' if top else f'remove {folder}'} and run again")
    found = lease.read(lease.lease_path(folder)) or {}
    by = f"held by {named}; " if (named := lease_holder(found)) else ""
    return f"{by}a killed run's lease expires {lease.EXPIRES_S:.0f} s after its driver's last renewal"


def hold_staging(staging: str) -> locks.FolderLock | lease.Lease:
    """This process's hold on staging folder ``staging`` while the run lives, so that no other run
    takes it for one left behind: a lock (``util.locks``) on a local one, whose killed run's lock
    file, in a folder ``--resume`` continues, is replaced; a lease (``output.lease``) in a bucket."""
    if not fs.is_local(staging):
        try:
            return lease.Lease(lease.lease_path(staging))
        except lease.Held:  # (a resumed run's folder, held again since the check for other runs)
            raise UserError(f"{staging}: another run took this folder ({holder(staging)})") from None
    Path(staging).mkdir(parents=True, exist_ok=True)
    if locks.abandoned(staging):
        os.unlink(os.path.join(staging, locks.LOCK_FILE))
    return locks.FolderLock(staging)


def unfinished(final: str) -> list[tuple[str, dict[str, Any]]]:
    """The staging folders in ``final`` of runs that did not finish (no commit marker), each with
    its run state (empty for a run of a version that wrote none)."""
    found = []
    for folder in staging_folders(final):
        if not fs.exists(fs.join(folder, COMMIT)):
            state = fs.join(folder, RUN_STATE)
            try:
                found.append((folder, fs.read_json(state) if fs.exists(state) else {}))
            except UserError as exc:
                raise UserError(f"{exc}: it says where a killed run's tasks are; remove {folder} (and that "
                                f"run's task folder, below its --temp_location) and run again") from None
    return found


def recover(final: str, keep: str | None = None) -> list[str]:
    """What earlier runs left in ``final``: :func:`finish_replacements`, then :func:`remove_unfinished`,
    holding a local output meanwhile as a run does (:func:`take_output`; a killed run's lock file
    goes with it). Returns the folders handled."""
    with contextlib.ExitStack() as held:
        held.callback(take_output(final) if fs.is_local(final) else claim_output(final).release)
        return finish_replacements(final) + remove_unfinished(final, {keep} if keep else set())


def finish_replacements(final: str) -> list[str]:
    """Finish the replacements of the corpus in ``final`` that killed runs began: a staging folder
    with a commit marker (killed while replacing: its moves are finished, so the new corpus is
    complete), and the DaskRunner task folder its run state names, first (the staging folder's
    removal takes the state). Nothing else is touched, so a run refused afterwards loses no one's
    work. Returns the folders handled."""
    handled = []
    for folder in staging_folders(final):
        marker, state = fs.join(folder, COMMIT), fs.join(folder, RUN_STATE)
        if fs.exists(marker):
            if running(folder):  # the corpus is half replaced until that run is done: nothing to build on
                raise UserError(f"{final}: a run is replacing the corpus there now ({folder}); run again once it "
                                f"is done" + ("" if fs.is_local(folder) else
                                              f" (a killed run's lease expires {lease.EXPIRES_S:.0f} s after its "
                                              "driver's last renewal; this run then finishes the replacement)"))
            try:
                plan = fs.read_json(marker, ("moves", "delete"))
            except UserError as exc:
                raise UserError(f"{exc}: it lists the moves that replace the corpus in {final} with the one a killed "
                                f"run completed, so they cannot be finished; restore it, or remove {folder} and "
                                f"run again with --overwrite (the corpus there may be partly replaced)") from None
            with contextlib.suppress(UserError):  # a damaged run state: its task folder stays, the moves go on
                if fs.exists(state) and (tasks := fs.read_json(state).get("task_folder")):
                    fs.remove_folder(tasks)  # the run's finished tasks: its corpus is complete in the folder
            _apply(folder, final, plan)
            LOG.warning("%s: finished replacing the corpus with the one a killed run had completed", final)
            handled.append(folder)
    return handled


def remove_unfinished(final: str, keep: set[str]) -> list[str]:
    """Delete the staging folders in ``final`` of runs that did not finish (no commit marker), with
    their task folders, but those in ``keep`` (the run's own, the run being resumed) and those a
    run may still be writing; the corpus there is the previous one. Only once the run is sure to
    go ahead: a killed run's finished tasks are what ``--resume`` continues. Returns the folders removed."""
    handled = []
    for folder, state in unfinished(final):
        if folder in keep:
            continue
        if running(folder):
            LOG.warning("%s: left %s alone: a run may still be writing it (remove it yourself if none is)", final, folder)
            continue
        if state.get("task_folder"):
            fs.remove_folder(state["task_folder"])
        fs.remove_folder(folder)
        LOG.warning("%s: removed %s, left by a run that did not finish%s", final, folder,
                    " (`pipeline run --resume` continues such a run)" if state.get("task_folder") else "")
        handled.append(folder)
    if not fs.is_local(final):  # the leases of killed runs whose folders are gone
        left = set(staging_folders(final))
        fs.delete([lease.lease_path(folder) for folder in lease.expired(final) if folder not in left])
    return handled


def another_run(final: str, which: str, then: str = "") -> UserError:
    """The one error line of a run refused while another run writes output ``final``: ``which`` run
    (its staging folder, its process), ``then``: what to do if it is gone."""
    return UserError(f"output {final}: another run is writing it now ({which}); run again once it is done, or give "
                     f"another output" + (f" ({then})" if then else ""))


def take_output(final: str) -> Callable[[], None]:
    """This process's hold on local output folder ``final`` while the run lives, taken before it
    looks for other runs there (its lock file, :data:`RUN_LOCK`): of two runs that start at once,
    one goes on and the other is refused in one line (each found no other's staging folder, and
    the second to finish replaced the first one's corpus). Returns what lets it go: the lock
    released, and the folders made for it removed where nothing was written into them (a run refused
    or failed leaves no empty output folder)."""
    made = [folder for folder in (Path(final), *Path(final).parents) if not folder.exists()]
    Path(final).mkdir(parents=True, exist_ok=True)

    def release(lock: locks.FileLock | None = None) -> None:
        if lock is not None:
            lock.release()
        for folder in made:  # innermost first; one with something in it stops the removal
            try:
                folder.rmdir()
            except OSError:
                break

    try:
        lock = locks.FileLock(os.path.join(final, RUN_LOCK))
    except OSError as exc:
        release()
        raise UserError(f"output {final}: cannot lock {os.path.join(final, RUN_LOCK)}: {exc.strerror}") from None
    if not lock.held:
        named = locks.owner(lock.path, wait_s=1.0)  # (a run that took it this moment names itself next)
        raise another_run(final, named_process(*named) if named else "a run that starts now")
    return functools.partial(release, lock)


def claim_output(final: str) -> lease.Lease:
    """:func:`take_output` for an output in a bucket, where nothing locks: the lease ``<output>/.run.lock``
    (``output.lease``), written only where there is none or over an expired one by a write the
    store makes conditional, so that of two runs that start at once one goes on and the other is
    refused in one line. Its ``release`` lets it go; its ``check`` says before the commit whether
    it still holds."""
    try:
        return lease.Lease(fs.join(final, RUN_LOCK), what=f"output {final}")
    except lease.Held as held:
        raise another_run(final, lease_holder(held.info) or "a run that starts now",
                          f"a killed run's hold expires {lease.EXPIRES_S:.0f} s after its driver's last renewal") from None


def check_no_other_run(final: str, continued: str | None) -> None:
    """One error line while another run writes a staging folder in ``final`` (:func:`running`):
    two runs on one output would each replace the corpus, the second only the files it saw at its
    start. ``continued``: the folder of the run being resumed, which is this run's. Also one line
    for a killed run's damaged run state, before any work (:func:`unfinished`)."""
    live = [folder for folder, _ in unfinished(final) if folder != continued and running(folder)]
    if live:
        raise another_run(final, live[0], holder(live[0]))


def fingerprint(cfg: CorpusConfig, files: dict[str, int]) -> str:
    """What a resumed run must share with the run it continues: the config (steps and sections),
    the input files with their sizes, the files the steps read (models, cutoffs, URL lists: a file
    rewritten at its path since, its size and time, :func:`fs.versions`), this package's version,
    its code and its steps' (:func:`code_digest`) and the task outputs' format."""
    from importlib.metadata import version

    blob = json.dumps({"config": cfg.to_dict(), "inputs": files, "version": version("polyglot-corpus"),
                       "tasks": ledger.TASK_FORMAT, "code": code_digest(cfg),
                       "reads": {key: fs.versions(path) for key, path in step_store_paths(cfg).items()}},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def code_digest(cfg: CorpusConfig) -> str:
    """sha256 of this package's Python files and of the code the config's steps and their global
    composites come from (a plugin's module and the modules of its own it imports,
    ``util.sources.own_sources``; by module name: the same code at another path is the same; not
    an editor's hidden ``.#run.py``): a
    checkout pulled or fixed between a kill and ``--resume`` (an editable install keeps its version
    number) would mix the old code's finished tasks with the new code's."""
    import importlib

    package = Path(__file__).resolve().parent
    own = __name__.partition(".")[0]
    files = {f"{own}/{path.relative_to(package)}": path.read_bytes() for path in package.rglob("*.py")
             if path.is_file() and not any(part.startswith(".") for part in path.relative_to(package).parts)}
    for cls in cfg.active_step_classes():
        for name in {cls.__module__, *([cls.transform.partition(":")[0]] if cls.transform else [])}:
            if name.partition(".")[0] == own:
                continue
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 (a plugin's module: whatever it raises)
                raise UserError(f"step {cls.name}: cannot import {name}: {type(exc).__name__}: {exc}") from None
            files.update(sources.own_sources(name, skip=frozenset({own})))
    digest = hashlib.sha256()
    for name, data in sorted(files.items()):
        digest.update(f"{name}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def resumable(cfg: CorpusConfig, digest: str, resume: bool) -> str | None:
    """The staging folder of the unfinished run ``--resume`` continues, the most recently started
    (its run state says when), or None (none there: a fresh run). One error line if that run had
    another config or input (``digest``: this run's fingerprint), if the runner keeps no task
    outputs, or if of several unfinished runs one does not say when it started (a version before)."""
    if not resume:
        return None
    if cfg.runner not in DASK_NAMES:
        raise UserError(f"--resume needs --runner DaskRunner: the {cfg.runner} keeps no task outputs between runs "
                        "(a run without --resume starts afresh)")
    runs = [(folder, state) for folder, state in unfinished(cfg.output) if state.get("task_folder")]
    if not runs:  # (said once the run is sure to go ahead: --resume on a finished corpus is refused first)
        return None
    if len(runs) > 1 and not all("started" in state for _, state in runs):
        raise UserError(f"--resume: {len(runs)} unfinished runs in {cfg.output} ({', '.join(f for f, _ in runs)}), "
                        "not all of which say when they started; remove those not to continue and run again")
    try:
        folder, state = max(runs, key=lambda run: float(run[1].get("started", 0)))
    except (TypeError, ValueError):
        raise UserError(f"--resume: a run state in {cfg.output} says it started at a time that is no number "
                        f"({', '.join(str(state.get('started')) for _, state in runs)}); remove the runs not to "
                        "continue and run again") from None
    if running(folder):
        raise UserError(f"--resume: the run in {folder} is still going ({holder(folder)})")
    if state["fingerprint"] != digest:
        raise UserError(f"--resume: the unfinished run in {folder} had another config, input files, model or list "
                        "files (rewritten since), or version or code; run without --resume to start afresh (which "
                        "removes it)")
    return folder


def nothing_read(staging: str) -> str:
    """Why no record of a run's input could be read, every one rejected (the rejections' counts and
    one of them), or "" where one was read, a document or a record skipped or dropped at read
    (a run whose input holds no page to keep is a run of its own kind), or none was rejected. A
    file's ``warcinfo`` record is no page: WET files read as WARC (every page rejected, each file's
    warcinfo skipped) are a run that read nothing."""
    read = fs.read_json(fs.join(staging, "stats.json"), ("counters",))["counters"].get("read", {})
    rejected = {name.removeprefix("rejected_"): n for name, n in read.items() if name.startswith("rejected_")}
    if not rejected or any(n for name, n in read.items()
                           if name not in ("files", "skipped_warcinfo") and not name.startswith("rejected_")):
        return ""
    example: dict[str, Any] = {}
    for path in fs.match_optional(staging, REJECTED, "part-*"):
        with fs.open_read(path) as stream:
            if line := stream.readline():
                example = json.loads(line)
                break
    return (", ".join(f"{n} {reason}" for reason, n in sorted(rejected.items()))
            + (f" (one: {example['source']} at offset {example['offset']}: {example['detail']})" if example else ""))


def task_folder(options: PipelineOptions, run_id: str) -> str:
    """A DaskRunner run's task folder: below ``--temp_location``, else in this machine's temporary
    folder; a local one absolute, since the run state keeps it for a ``--resume`` from any folder."""
    temp = options.view_as(GoogleCloudOptions).temp_location or tempfile.gettempdir()
    return fs.join(os.path.abspath(temp) if fs.is_local(temp) else temp, f"{TASK_FOLDER}{run_id}")


def check_stores(cfg: CorpusConfig, options: PipelineOptions) -> None:
    """Every bucket the run reads or writes answers, exists and takes these credentials (the
    output's takes a write), before any work: one error line naming the path otherwise."""
    check_relative_paths([("output", cfg.output), *(("input", pattern) for pattern in cfg.input)], options)
    for pattern in cfg.input:
        stores.check(pattern, "input", options)
    stores.check(cfg.output, "output", options, write=True)


def prepare_steps(steps: list[Step], options: PipelineOptions) -> None:
    """Each step's files answer on their store, then the step checks them (models, tables)."""
    check_relative_paths([pair for step in steps for pair in step.store_paths().items()], options)
    for step in steps:
        for what, path in step.store_paths().items():
            stores.check(path, what, options)
    for step in steps:
        contained(f"step {step.name}: prepare()", step.prepare)
    check_languages(steps)


def check_languages(steps: list[Step]) -> None:
    """Every language a step's config names (``languages_named``) is one that the step setting
    ``lang`` before it can give (``lang_labels``): a value for a code it never gives, ``eng`` where
    lid.176 gives ``en``, would never apply, so it is one error line naming the key."""
    labels, setter = None, ""
    for step in steps:
        if "lang" in step.provides:
            labels, setter = step.lang_labels(), step.name
        if labels is None:
            continue
        for key, languages in step.languages_named().items():
            for lang in languages:
                if lang not in labels:
                    close = difflib.get_close_matches(str(lang), sorted(labels), n=3)
                    shown = sorted(labels)
                    hint = (f"did you mean {' or '.join(map(repr, close))}?" if close else
                            f"it gives {', '.join(shown[:8])}{', ...' if len(shown) > 8 else ''} ({len(shown)} in all)")
                    raise UserError(f"{step.name}.{key}: {lang!r} is not a language that step {setter} gives "
                                    f"(what is given for it would never apply); {hint}")


_BEAM_TEMP: spill.Scratch | None = None
"""This process's folder for Beam's temporary files (:func:`beam_temp`), made by its first run that needs one."""


@contextlib.contextmanager
def beam_temp(runner: str, options: PipelineOptions) -> Iterator[None]:
    """Beam's temporary files of a run on its portable runners (Portable, Flink, Spark, Prism) and
    Dataflow's go to one scratch folder of this process, removed when the process exits: otherwise
    each run leaves two or three folders in the temporary folder (``python_sdk_dependencies``'
    ``submission_environment_dependencies.txt``, the embedded job service's staging folder). Not
    removed at the run's end, because a Flink or Spark job server that Beam keeps for the
    process's later runs keeps its own folder in it (Beam removes that at exit, before this one:
    exit handlers run last-registered first). A killed process's folder is removed by the next run,
    as every scratch folder is. Beam's requirements cache stays where Beam puts it without this.
    The DirectRunner leaves nothing, and the DaskRunner's task folder must outlive the process."""
    global _BEAM_TEMP
    if runner in LOCAL_NAMES or runner in DASK_NAMES:
        yield
        return
    setup = options.view_as(SetupOptions)
    if setup.requirements_cache is None:
        setup.requirements_cache = os.path.join(tempfile.gettempdir(), "beam-requirements-cache")
    if _BEAM_TEMP is None:
        _BEAM_TEMP = spill.Scratch()
        atexit.register(_BEAM_TEMP.remove)
    before, tempfile.tempdir = tempfile.tempdir, _BEAM_TEMP.path
    try:
        yield
    finally:
        tempfile.tempdir = before


def transform_seconds(result: Any) -> dict[str, float]:
    """Seconds spent in each part of the graph, summed over the workers, as Beam's SDK workers
    measure it (``ptransform_execution_time``: the wall time a transform's start, process and
    finish held the bundle's thread, without the transforms it hands elements to, sampled every
    200 ms); by top-level label with a composite's named part (``Read/HashParagraphs``, ``Lid``).
    What the run's elapsed time holds beyond their sum divided by the workers is the runner's own
    work: setting up the stages and moving data between them. The DirectRunner (Beam's
    FnApiRunner) reports it to the driver; a result without it gives ``{}``."""
    infos = getattr(result, "monitoring_infos", None)
    if infos is None:
        return {}
    msecs: Counter[str] = Counter()
    for info in infos():
        if info.urn == monitoring_infos.TOTAL_MSECS_URN:
            top, _, rest = info.labels.get(monitoring_infos.PTRANSFORM_LABEL, "").partition("/")
            part = rest.split("/")[0]
            msecs[f"{top}/{part}" if part and "(" not in part else top] += monitoring_infos.extract_counter_value(info)
    return {label: round(ms / 1000, 1) for label, ms in sorted(msecs.items()) if ms >= 50}


def run_corpus(cfg: CorpusConfig, overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Run the whole pipeline; return the content of ``stats.json`` and ``run.json`` together.

    stats.json and sampling.json are written by the graph from counts that travel as data, so
    they are the same bytes on every runner; run.json holds what differs between runs (runner,
    elapsed time, Beam version, the DaskRunner's tasks run and reused). On the DaskRunner each run
    keeps a task ledger (``runners.ledger``); ``resume`` continues the unfinished run in the
    output, if any, running only its tasks that had not finished."""
    with contextlib.ExitStack() as held_until_done:
        return _run_corpus(cfg, overwrite, resume, held_until_done)


def _run_corpus(cfg: CorpusConfig, overwrite: bool, resume: bool, held_until_done: contextlib.ExitStack) -> dict[str, Any]:
    """:func:`run_corpus`, whose end releases what ``held_until_done`` holds (the staging folder)."""
    origin, own = cfg.own_beam_options
    try:  # the config's own flags first: an error about one of them names where it was written
        pipeline_options(cfg.runner, cfg.beam_options[:own])
    except UserError as exc:
        raise UserError(f"{origin}: beam_options: {exc}") from None
    options = pipeline_options(cfg.runner, cfg.beam_options)
    fs.configure(options)
    fs.check_folder(cfg.output, "output")  # not found out by the shards' writers at the end of the run
    fs.check_writable(cfg.output, "output")
    check_stores(cfg, options)
    files = fs.match_inputs(cfg.input)
    inside = [path for path in files if fs.below(path, cfg.output)]
    if inside:
        raise UserError(f"input {inside[0]} lies in the output folder {cfg.output} ({len(inside)} input files do): a "
                        "run would read its own corpus; give an input that leaves the output folder out")
    check_engine(options)
    spill.spare_bytes(0)  # POLYGLOT_SCRATCH_SPARE, where set, is a size
    twins, how = fs.same_bytes(files), "the same bytes"
    if not twins:
        twins, how = fs.same_content(files), "the same bytes once decompressed"
    if twins:  # exact dedup would remove every copy's paragraphs, near-dup stop at the first repeated record id
        raise UserError(f"input files {twins[0][0]} and {twins[0][1]} hold {how} ({len(twins)} such group"
                        f"{'s' if len(twins) > 1 else ''}): their records would be read twice; give each file once")
    steps = build_steps(cfg, len(files))
    forkserver.install(options, cfg.worker_modules())  # imports meanwhile (when `pipeline run` has not started it)
    prepare_steps(steps, options)
    template = options.view_as(GoogleCloudOptions).template_location
    build_only = bool(options.view_as(TestOptions).dry_run or template)  # Dataflow: build the job, run nothing
    digest = fingerprint(cfg, files)
    claim = None
    if not build_only:  # before the checks for other runs there: with them, at once
        if fs.is_local(cfg.output):
            held_until_done.callback(take_output(cfg.output))
        else:
            claim = claim_output(cfg.output)
            held_until_done.callback(claim.release)
    continued = resumable(cfg, digest, resume) if not build_only else None
    if not build_only:  # killed runs' unfinished staging folders wait until the run is sure to go ahead
        finish_replacements(cfg.output)
        check_no_other_run(cfg.output, continued)
    stale = [] if build_only else previous_outputs(cfg.output)
    if stale and not overwrite:
        raise UserError(f"output {cfg.output} already holds a corpus ({len(stale)} files); pass --overwrite to replace it")
    if not build_only and not stale and (foreign := foreign_file(cfg.output)):
        raise UserError(f"output {cfg.output}: the folder holds {foreign}, which pipeline run did not write, and no "
                        "corpus (no stats.json or run.json); give a new or empty folder")
    final, dask = cfg.output, cfg.runner in DASK_NAMES
    if resume and continued is None and not build_only:
        LOG.warning("%s: no unfinished run to resume; starting afresh", cfg.output)
    if not build_only:  # the run writes beside the old corpus, which is replaced only once the new one is complete
        staging = continued or fs.join(final, f"{STAGING}{uuid.uuid4().hex[:12]}")
        hold = hold_staging(staging)
        held_until_done.callback(hold.release)
        cfg = dataclasses.replace(cfg, output=staging)
        if dask:  # a resumed run keeps its task folder, wherever --temp_location or TMPDIR points now
            state = fs.read_json(fs.join(staging, RUN_STATE), ("task_folder",)) if continued else {
                "fingerprint": digest, "task_folder": task_folder(options, staging.rstrip("/").rsplit(STAGING, 1)[1]),
                "started": time.time()}
            if not continued:  # a resumed run's state is as it was: rewritten, a bucket lost it for a moment
                fs.write_json(fs.join(staging, RUN_STATE), state, compact=True, durable=True)  # (it finds the ledger)
            ledger.write_inputs(state["task_folder"], INPUT_LABEL, files)
            flags = [f"--dask_task_folder={state['task_folder']}", *([] if cfg.progress else ["--dask_progress_interval=0"])]
            cfg = dataclasses.replace(cfg, beam_options=[*cfg.beam_options, *flags])
            options = pipeline_options(cfg.runner, cfg.beam_options)
    stores.take_retries()  # S3 retries counted in this process so far belong to no run of ours, or an earlier one
    start = time.perf_counter()
    with beam_temp(cfg.runner, options):
        local = cfg.runner in LOCAL_NAMES and not build_only  # every worker on this machine
        held = pipeline = None
        collector = prefork.raise_gc_threshold()  # for the workers that run in this process (DirectRunner in_memory)
        try:
            try:  # in here: options Beam rejects leave no staging or task folder behind either
                pipeline = beam.Pipeline(runner=make_runner(options), options=options)
            except ValueError as exc:  # an unknown --runner (Beam's list lacks ours), or options Dataflow rejects
                ours = " DaskRunner runs on our Dask translation." if "Unexpected pipeline runner" in str(exc) else ""
                raise UserError(f"{exc}{ours}") from None
            except (ImportError, AttributeError, TypeError) as exc:  # a dotted runner name Beam cannot make
                raise UserError(f"runner {cfg.runner!r}: Beam cannot make it ({first_line(exc, typed=True)}); "
                                "a runner is a name Beam knows (DirectRunner, DataflowRunner, ...), DaskRunner, "
                                "or module.Class of a PipelineRunner") from None
            if not build_only:  # every check passed: what killed runs left unfinished goes
                remove_unfinished(final, {staging})
            held = spill.Scratch(hold_bytes=spill.hold_bytes()) if local else None
            scratch = held.path if held else ""
            why = spill.no_room(scratch) if scratch else ""
            if why:
                LOG.warning("the scratch folder %s %s, so nothing is kept there: tables move between stages as bytes "
                            "and, where a worker cannot hold what exact dedup's first pass read in its memory, the "
                            "second pass parses the file again; set TMPDIR to a folder on a disk with room",
                            scratch, why)
            build_pipeline(pipeline, cfg, list(files), steps, scratch)
            result = pipeline.run()
            if build_only:  # with --template_location the job and what it needs are staged, not run
                return {"built_only": template or "(--dry_run: not staged)"}
            result.wait_until_finish()  # the DirectRunner runs (and fails) inside run() already
        except BaseException as exc:
            if not build_only and dask and ledger.read_plan(state["task_folder"]) is not None:
                LOG.warning("the run's finished tasks are kept: `pipeline run --resume` with the same config and "
                            "input continues it; a run without --resume removes them")
            elif not build_only:  # the failed run's files; the previous corpus is untouched
                fs.remove_folder(cfg.output)
                if dask:
                    fs.remove_folder(state["task_folder"])
            error = cloud_error(exc, cfg.runner) if isinstance(exc, Exception) else None
            if error is not None:
                raise error from None
            if isinstance(exc, Exception) and (failure := step_failure(exc)):
                raise UserError(f"{failure}; the output is left as it was") from exc  # (its traceback: DEBUG_ENV)
            raise
        finally:  # Beam removes its own temporary folder in run(), not where the graph failed to build
            gc.set_threshold(*collector)
            if pipeline is not None:
                shutil.rmtree(pipeline.local_tempdir, ignore_errors=True)
            if held:
                held.remove()
    for path in fs.remove_temporaries(cfg.output, [layout.PARTITION_FOLDERS[0], *layout.RECORD_FOLDERS]):
        LOG.info("removed %s, left by a worker that was lost", path)
    if nothing := nothing_read(cfg.output):  # not a corpus to replace the previous one with
        fs.remove_folder(cfg.output)
        if dask:
            fs.remove_folder(state["task_folder"])
        raise UserError(f"no input record could be read: {nothing}; the output is left as it was")
    run = {"runner": cfg.runner, "elapsed_s": round(time.perf_counter() - start, 3), "beam_version": beam.__version__,
           "beam_options": cfg.beam_options, **({"tasks": result.tasks} if getattr(result, "tasks", None) else {}),
           **({"transform_s": seconds} if local and (seconds := transform_seconds(result)) else {}),
           **({"io": fs.read_json(io)} if fs.exists(io := fs.join(cfg.output, IO_FILE)) else {})}
    fs.write_json(fs.join(cfg.output, RUN_FILE), run)
    build_report(cfg.output)  # part of the output: replaced with the corpus, never apart from it
    for held in (claim, hold):
        if isinstance(held, lease.Lease):
            held.check()  # a run cut off for longer than its lease: another run may have taken its folder
    stale = previous_outputs(final)  # now: a corpus another run put there meanwhile is replaced whole
    if stale and not overwrite:
        fs.remove_folder(cfg.output)
        if dask:
            fs.remove_folder(state["task_folder"])
        raise UserError(f"output {final}: another run wrote a corpus there meanwhile ({len(stale)} files); this run's "
                        "is not put in its place without --overwrite")
    commit(cfg.output, final, stale)
    if dask:  # only now: killed before the commit, the run's finished tasks let --resume end it without redoing them
        fs.remove_folder(state["task_folder"])
    if warning := left_out_warning(fs.read_json(fs.join(final, "sampling.json"))):
        LOG.warning("%s", warning)
    with fs.open_read(fs.join(final, "stats.json")) as stream:
        return {**json.load(stream), **run}


def damage(path: str) -> list[str]:
    """What is wrong with the files of the finished corpus in ``path`` that a reader needs: its
    stats.json (missing, not JSON, not ours) and the Arrow and Parquet shards whose footer cannot be
    read. Reads each shard's footer: one or two small reads a shard (in a bucket, 16 at once). A file
    the store does not give (the network, a permission) is no answer: :class:`fs.ReadFailed`."""
    problems = []
    try:
        fs.read_json(fs.join(path, ARTIFACTS[0]), ("config", "counters"), what="corpus")
    except fs.ReadFailed:
        raise
    except UserError as exc:
        problems.append(str(exc))
    files = [p for p in layout.shard_files(path) if p.endswith((layout.FORMATS["arrow"], layout.FORMATS["parquet"]))]
    with concurrent.futures.ThreadPoolExecutor(1 if fs.is_local(path) else 16) as pool:  # a bucket: reads at once
        bad = [(shard, why) for shard, why in zip(files, pool.map(shards.unreadable, files)) if why]
    if bad:
        more = f", and {len(bad) - 1} more" if len(bad) > 1 else ""
        problems.append(f"{len(bad)} of the {len(files)} shards cannot be read: {bad[0][0]} ({bad[0][1]}){more}")
    return problems


def status(path: str) -> list[str]:
    """How far the runs in ``path`` are, from their files alone (``python -m pipeline status``):
    ``path`` is a corpus output (its finished corpus and the unfinished runs in it), a DaskRunner
    task folder, or a ``--temp_location`` holding task folders."""
    lines: list[str] = []
    if fs.exists(fs.join(path, RUN_FILE)):
        run = fs.read_json(fs.join(path, RUN_FILE), ("runner", "elapsed_s"))
        try:
            tasks = run.get("tasks", {})
            lines.append(f"{path}: a finished corpus ({run['runner']}, {run['elapsed_s']:.0f} s"
                         + (f", {tasks['run']} tasks run, {tasks['reused']} reused" if tasks else "") + ")")
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{fs.join(path, RUN_FILE)}: not as pipeline run writes it ({type(exc).__name__}: "
                            f"{exc})") from None
        gap = layout.missing_shards(path)
        if gap:
            lines.append(f"  incomplete: {gap}")
        lines += [f"  damaged: {problem}" for problem in damage(path)]
    folders = [(f"{folder} (unfinished run)", state["task_folder"]) for folder, state in unfinished(path)
               if state.get("task_folder")]
    lines += [f"{folder}: an unfinished run of a runner without a task ledger; "
              + ("a run may still be writing it" if running(folder) else "a new run removes it")
              for folder, state in unfinished(path) if not state.get("task_folder")]
    lines += [f"{folder}: " + ("a run is replacing the corpus with this finished one now" if running(folder) else
                               f"the replacement of the corpus by this finished run was cut short; the next "
                               f"`pipeline run` on {path} finishes it first")
              for folder in staging_folders(path) if fs.exists(fs.join(folder, COMMIT))]
    if fs.exists(fs.join(path, ledger.PLAN)):
        folders.append((path, path))
    folders += [(p.rsplit("/", 2)[0], p.rsplit("/", 1)[0])
                for p in fs.match_optional(path, f"{TASK_FOLDER}*", ledger.PLAN)]
    if not lines and not folders:
        raise UserError(f"{path}: no run found (neither a corpus, a run's staging folder, a task folder nor "
                        f"{TASK_FOLDER}* folders of a --temp_location)")
    for name, folder in folders:
        plan = ledger.read_plan(folder)
        if plan is None:
            lines.append(f"{name}: task folder {folder} is gone (the run had not started its tasks, or it was removed)")
            continue
        done, failed = ledger.finished(folder), ledger.failures(folder)
        rows = ledger.stage_rows(plan, done, failed, ledger.read_inputs(folder))
        total = sum(row["tasks"] for row in rows)
        lines.append(f"{name}: task folder {folder}, {len(done)}/{total} tasks done, {len(failed)} failed")
        for row in rows:
            state = "done" if not row["pending"] else "failed" if row["failed"] else "pending"
            lines.append(f"  [{state}] " + ledger.describe(row) + f", {row['seconds']:,.0f} task-seconds, "
                         f"shuffle {row['reads']:,} reads, {row['files']:,} files")
        for (stage, task), error in sorted(failed.items())[:5]:
            lines.append(f"  failed: {plan.stages[stage].name} task {task}: {error}")
    return lines
