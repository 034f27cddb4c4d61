"""The Beam graph, built from the profile's ordered ``steps:`` list.

read (with exact dedup when ``dedup`` is the first step) -> each step in order -> Arrow tables ->
sharded corpus + stats.json + sampling.json; ``rejected/`` and, with ``write.removed``,
``removed/<step>/`` beside it. A per-document step runs in :class:`ApplyStep`; a global step
(``Step.transform``) is its own composite. Counts travel as data into stats.json
(``transforms.counting``). The graph needs only what every runner has: ParDo, GroupByKey,
Flatten, side inputs, and combines whose inputs are small.
"""
from __future__ import annotations

import importlib
import inspect
import weakref
from typing import Any

import apache_beam as beam
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import userstate

from .config import CorpusConfig, ReadConfig
from .output.layout import REJECTED, removed_folder
from .report.stats import write_artifacts
from .steps.base import Rejected, RunInfo, Step, graph_label
from .steps.perplexity import PerplexityScorer
from .transforms.apply import REMOVED, ApplyStep
from .transforms.counting import MAIN, Counted, total_counts
from .transforms.dedup import ReadAndDedup
from .transforms.placement import Distribute
from .transforms.write import NO_STATS, AsTables, WriteCorpus, WriteRecords
from .util.errors import UserError, contained


INPUT_LABEL = "Files"  # the Create of the input files (their index and path)


def _cache_dofn_specs() -> None:
    """Beam's ``userstate.get_dofn_specs`` (the state and timer parameters of every method of a
    DoFn, found by ``inspect.signature`` over each of its ~30 methods), once per DoFn instance.
    Beam asks it about six times per ParDo while the graph is built and turned into its proto,
    and again in every worker per stage: 0.3-0.4 s of the driver's serial time per run (of
    0.6 s for building the graph and its proto), before any worker starts. A DoFn's methods do
    not change once it is made, so the answer does not either."""
    if hasattr(userstate.get_dofn_specs, "uncached"):
        return
    beams = userstate.get_dofn_specs
    specs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_dofn_specs(dofn: beam.DoFn) -> tuple[set, set]:
        try:
            return specs[dofn]
        except KeyError:
            found = specs[dofn] = beams(dofn)
            return found
        except TypeError:  # not weakly referable
            return beams(dofn)

    get_dofn_specs.uncached = beams  # type: ignore[attr-defined]
    userstate.get_dofn_specs = get_dofn_specs


STATE_SAMPLING_MS = 10
"""The period of the state sampler of the bundles that workers which import this module run (Beam's
200 ms, ``statesampler.DEFAULT_SAMPLING_PERIOD_MS``)."""


def _shorten_state_sampling() -> None:
    """Every bundle's end waits for its state sampler's thread, which sleeps a sampling period
    between samples (``StateSampler.stop`` joins it; from 2 ms the period grows by 1.2x a sample up
    to 200 ms): a bundle of a second or more ends up to 200 ms after its work did, and a stage ends
    when its last worker's bundle does. In a 2-worker run of the floor benchmark both workers'
    bundles of each of the three long stages ended on the same sampler tick. A 20 ms period took
    that run from 6.20 s to 6.02 s, and 10 ms a 1-worker run from 11.21 s to 10.98 s (medians of 5
    and 3 runs, alternated). The sampler only measures the time each transform takes
    (``run.json``'s ``transform_s``), at 100 samples a second now."""
    init = statesampler.StateSampler.__init__
    if list(inspect.signature(init).parameters)[-1] == "sampling_period_ms" and len(init.__defaults__ or ()) == 1:
        init.__defaults__ = (STATE_SAMPLING_MS,)  # (Beam 2.77's only default; a later Beam's signature is left alone)


_cache_dofn_specs()  # here: the driver builds the graph with this module, and every worker imports it
_shorten_state_sampling()


def run_info(cfg: CorpusConfig, n_files: int, scratch: str = "") -> RunInfo:
    return RunInfo(n_files, cfg.write.removed, cfg.progress, scratch)


def build_steps(cfg: CorpusConfig, n_files: int) -> list[Step]:
    """The active steps of the config, in order (not yet prepared: see ``Step.prepare``)."""
    run = run_info(cfg, n_files)
    return [contained(f"step {cls.name}: building it", cls, cfg.section(cls.name), run)
            for cls in cfg.active_step_classes()]


def composite(step: Step, *args: Any) -> beam.PTransform:
    """The Beam composite of a global step (``Step.transform``, ``"module:Class"``)."""
    assert step.transform is not None
    module, _, name = step.transform.partition(":")
    return getattr(importlib.import_module(module), name)(step, *args)


def apply_global_step(pcoll: beam.PCollection, label: str, step: Step, run: RunInfo,
                      read: ReadConfig | None = None) -> dict[str, beam.PCollection]:
    """``pcoll`` through a global step's composite, built as the step contract says (``Class(step,
    run)``, or ``Class(step, read, run)`` for the step that ``reads_files``); its outputs by tag
    (``main``, ``removed``, and ``rejected`` from the one that reads the files). A composite that
    cannot be built so, fails as it is applied, or lacks an output is one line naming the step's class."""
    args, params = ((run,), "step, run") if read is None else ((read, run), "step, read, run")
    tags = (MAIN, REMOVED) if read is None else (MAIN, REJECTED, REMOVED)
    cls = type(step)
    what = (f"step {step.name} ({cls.__module__}.{cls.__qualname__}): its composite {step.transform}, "
            f"built as {str(step.transform).rpartition(':')[2]}({params})")
    result = contained(what, lambda: pcoll | label >> composite(step, *args))
    try:
        outputs = {tag: result[tag] for tag in tags}
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        outputs = {}
    if len(outputs) < len(tags) or not all(isinstance(output, beam.PCollection) for output in outputs.values()):
        raise UserError(f"{what}, returned {type(result).__name__}: it must return the outputs "
                        f"{', '.join(tags)} (a dict of PCollections, or a ParDo's tagged outputs)")
    return outputs


def bucket_cutoffs(steps: list[Step]) -> dict[str, dict[str, float]]:
    """Per language, the head and tail perplexities the perplexity step's buckets use (for stats.json)."""
    for step in steps:
        if isinstance(step, PerplexityScorer) and step.cutoffs:
            head, tail = step.cfg.head, step.cfg.tail
            return {lang: {"head": values[head], "tail": values[tail]} for lang, values in step.cutoffs.items()}
    return {}


def build_pipeline(p: beam.Pipeline, cfg: CorpusConfig, files: list[str], steps: list[Step],
                   scratch: str = "") -> None:
    """Add the whole corpus graph for ``files`` to pipeline ``p``, running ``steps`` (from
    :func:`build_steps`, prepared) in order; ``scratch``: see ``RunInfo.scratch``."""
    run = run_info(cfg, len(files), scratch)
    # Distribute spreads the files over the workers; Create's own reshuffle would be a second stage before it
    indexed = (p | INPUT_LABEL >> beam.Create(list(enumerate(files)), reshuffle=False)
               | "Distribute" >> Distribute())
    first = steps[0] if steps and steps[0].reads_files else None
    read = (apply_global_step(indexed, "Read", first, run, cfg.read) if first
            else indexed | "Read" >> ReadAndDedup(None, cfg.read, run))
    docs, removed = read[MAIN], {first.name: read[REMOVED]} if first else {}
    for step in steps[1:] if first else steps:
        label = graph_label(step.name)
        if step.transform:
            result = apply_global_step(docs, label, step, run)
        elif cfg.write.removed:
            result = docs | label >> Counted(ApplyStep(step), outputs=(REMOVED,))
        else:  # no removed output to carry: one output fewer in every fused stage
            docs = docs | label >> Counted(ApplyStep(step))
            continue
        docs, removed[step.name] = result[MAIN], result[REMOVED]
    if cfg.write.removed:
        for name, records in removed.items():
            _ = records | f"WriteRemoved/{name}" >> WriteRecords(cfg.output, removed_folder(name))
    written = docs | "AsTables" >> AsTables() | "WriteCorpus" >> WriteCorpus(cfg.output, cfg.write, scratch)
    _ = (read[REJECTED] | "RejectedAsDicts" >> beam.Map(Rejected.to_dict)
         | "WriteRejected" >> WriteRecords(cfg.output, REJECTED))
    counters = total_counts(p)  # last: every counting step is in the graph by now
    corpus = beam.pvalue.AsSingleton(written["stats"], default_value=NO_STATS)
    _ = counters | "WriteStats" >> beam.Map(write_artifacts, corpus, cfg, len(files), bucket_cutoffs(steps))
