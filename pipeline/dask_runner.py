"""Beam's DaskRunner, with the translations our graph needs and Beam's version lacks.

Beam 2.77's ``apache_beam.runners.dask`` runs Create, ParDo, GroupByKey and Flatten as dask.bag
operations, but: every output of a multi-output ParDo gets all of its elements (tags are not
routed), what a DoFn emits in ``finish_bundle`` is lost (BatchElements, our chunked steps), only
the last transform's bag is computed (other sinks never run), a side input is computed again
inside every task that reads it, metrics are not reported, and building its dask.bag graph takes
minutes on ours. This runner keeps Beam's options and overrides and translates the graph into a
plain dask task graph, each PCollection a list of partitions:

- a ParDo runs its DoFn once per partition (a bundle) through Beam's own ``DoFnRunner``, with
  ``setup()`` once per worker process (DoFn instances are pooled, as Beam's workers do), and its
  outputs, ``finish_bundle``'s included, are routed by tag;
- a side input is one task that gathers its PCollection, passed to every bundle that reads it;
- GroupByKey splits each input partition by a hash of the pickled key (the same on every worker,
  unlike ``hash()`` of a str; an int key by its value modulo the partitions) and groups each
  output partition; Flatten and Reshuffle only
  rename partitions; each Create element is a partition of its own (up to 1024);
- every PCollection nothing reads is a sink: all of them are computed in one graph.

Only batch pipelines in the global window (ours). Counts travel as data (``counting``), so the
missing metrics cost nothing. Without ``--dask_client_address`` / ``--dask_scheduler_file`` the
runner starts a ``LocalCluster`` on 127.0.0.1 for the run and stops it at the end.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import os
import pickle
import threading
from typing import Any

import apache_beam as beam
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor, PTransformOverride
from apache_beam.runners.common import DoFnRunner, Receiver
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.dask.overrides import _Create, _Flatten, _GroupByKeyOnly, _Reshuffle, dask_overrides
from apache_beam.runners.runner import PipelineResult, PipelineState
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from . import local_runner
from .errors import UserError

MAX_CREATE_PARTITIONS = 1024


class LocalDaskOptions(PipelineOptions):
    """The LocalCluster this runner starts when no scheduler is named."""

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        parser.add_argument("--dask_num_workers", type=int, default=None,
                            help="worker processes of the LocalCluster started for the run when no "
                                 "--dask_client_address or --dask_scheduler_file is given (default: one per core)")


# --------------------------------------------------------------------------- worker side

class _Collect(Receiver):
    """Receives one output tag's windowed values into a shared list as ``(tag, value)``."""

    def __init__(self, tag: str | None, out: list[tuple[str | None, Any]]) -> None:
        self.tag, self.out = tag, out

    def receive(self, windowed_value: WindowedValue) -> None:
        self.out.append((self.tag, windowed_value.value))


_POOL: dict[str, list[beam.DoFn]] = {}
_SPECS: dict[str, tuple[Any, ...]] = {}
_POOL_LOCK = threading.Lock()


def _take_dofn(key: str, payload: bytes) -> tuple[beam.DoFn, tuple[Any, ...]]:
    """A set-up instance of the pickled ParDo's DoFn (a pooled one of this worker, or a new one),
    and the rest of the ParDo: ``(args, kwargs, windowing, tags, views)``."""
    with _POOL_LOCK:
        idle, spec = _POOL.get(key), _SPECS.get(key)
        if idle and spec:
            return idle.pop(), spec
    fn_payload, spec = pickler.loads(payload)
    fn = pickler.loads(fn_payload)
    fn.setup()
    with _POOL_LOCK:
        _SPECS[key] = spec
    return fn, spec


def _give_back(key: str, fn: beam.DoFn) -> None:
    with _POOL_LOCK:
        _POOL.setdefault(key, []).append(fn)


def run_bundle(items: list[Any], key: str, payload: bytes, *side_values: list[Any]) -> list[Any]:
    """One partition through a ParDo as one bundle: ``(tag, value)`` pairs, every output's."""
    fn, (args, kwargs, windowing, tags, views) = _take_dofn(key, payload)
    out: list[tuple[str | None, Any]] = []
    side_inputs = [SideInputMap(view, options, [GlobalWindows.windowed_value(v) for v in values])
                   for (view, options), values in zip(views, side_values)]
    runner = DoFnRunner(fn, args, kwargs, side_inputs, windowing, {tag: _Collect(tag, out) for tag in tags},
                        step_name=key)
    runner.start()
    for item in items:
        runner.process(GlobalWindows.windowed_value(item))
    runner.finish()
    _give_back(key, fn)  # only after a bundle that succeeded: a failed one may have left state behind
    return out


def select(pairs: list[tuple[str | None, Any]], tag: str | None) -> list[Any]:
    return [value for t, value in pairs if t == tag]


def stable_partition(key: Any, n: int) -> int:
    """The same on every worker process (``hash()`` of a str is not, without PYTHONHASHSEED).

    An int key goes to ``key % n``: the dense indexes our graph groups by (input files, dedup
    partitions) then fill every partition evenly, where a hash put two of 8 files in one partition
    and none in another, and one of 2 workers read 5 of the 8 (measured: 14.1 s busy against 9.6 s).
    """
    if type(key) is int:
        return key % n
    digest = hashlib.blake2b(pickle.dumps(key, protocol=4), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n


def split_by_key(items: list[tuple[Any, Any]], n: int) -> list[list[tuple[Any, Any]]]:
    parts: list[list[tuple[Any, Any]]] = [[] for _ in range(n)]
    for item in items:
        parts[stable_partition(item[0], n)].append(item)
    return parts


def group_part(j: int, splits: list[list[list[tuple[Any, Any]]]]) -> list[tuple[Any, list[Any]]]:
    """Output partition ``j`` of a GroupByKey: its pairs from every input partition, grouped."""
    groups: dict[Any, list[Any]] = {}
    for split in splits:
        for key, value in split[j]:
            groups.setdefault(key, []).append(value)
    return list(groups.items())


def everything(parts: list[list[Any]]) -> list[Any]:
    return [item for part in parts for item in part]


def literal(payload: bytes) -> Any:
    return pickle.loads(payload)


# --------------------------------------------------------------------------- translation

class _GroupByKeyOverride(PTransformOverride):
    """GroupByKey as one leaf (Beam's Dask override adds window steps a batch job does not need)."""

    def matches(self, applied: AppliedPTransform) -> bool:
        return applied.transform.__class__ == beam.GroupByKey

    def get_replacement_transform_for_applied_ptransform(self, applied: AppliedPTransform) -> beam.PTransform:
        return _GroupByKeyOnly()


class _Translate(PipelineVisitor):
    """Beam leaf transforms -> a dask task graph: each PCollection is ``npartitions`` keys
    ``(name, i)``, each holding a list of elements."""

    def __init__(self, create_partitions: int | None) -> None:
        self.graph: dict[Any, Any] = {}
        self.parts: dict[beam.PCollection, tuple[str, int]] = {}
        self.read: set[beam.PCollection] = set()
        self.create_partitions = create_partitions
        self.shuffle_partitions = 1  # a GroupByKey's output partitions: at most the widest Create's
        self.ids = itertools.count()

    def _name(self, node: AppliedPTransform, what: str = "") -> str:
        return f"{node.full_label}{what}-{next(self.ids)}"

    def _keys(self, pc: beam.PCollection) -> list[tuple[str, int]]:
        name, n = self.parts[pc]
        return [(name, i) for i in range(n)]

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform, graph = node.transform, self.graph
        inputs = [pc for pc in node.main_inputs.values() if pc in self.parts]  # not PBegin
        self.read.update(node.main_inputs.values())
        self.read.update(si.pvalue for si in node.side_inputs)
        name = self._name(node)
        if isinstance(transform, _Create):
            values = list(transform.values)
            n = max(1, min(len(values), self.create_partitions or MAX_CREATE_PARTITIONS))
            self.shuffle_partitions = max(self.shuffle_partitions, n)
            for i in range(n):
                graph[(name, i)] = (literal, pickle.dumps(values[i * len(values) // n:(i + 1) * len(values) // n]))
            self.parts[node.outputs[None]] = (name, n)
        elif isinstance(transform, beam.ParDo):
            self._pardo(node, name, inputs[0])
        elif isinstance(transform, _GroupByKeyOnly):
            keys = self._keys(inputs[0])
            n = min(len(keys), self.shuffle_partitions)
            split = self._name(node, "/split")
            for i, key in enumerate(keys):
                graph[(split, i)] = (split_by_key, key, n)
            for j in range(n):
                graph[(name, j)] = (group_part, j, [(split, i) for i in range(len(keys))])
            self.parts[node.outputs[None]] = (name, n)
        elif isinstance(transform, (_Flatten, _Reshuffle)):
            keys = [key for pc in inputs for key in self._keys(pc)]
            if not keys:
                graph[(name, 0)] = (literal, pickle.dumps([]))
            for i, key in enumerate(keys):
                graph[(name, i)] = key  # an alias: no copy
            self.parts[node.outputs[None]] = (name, max(1, len(keys)))
        else:
            raise NotImplementedError(f"DaskRunner: no translation for {node.full_label} ({type(transform).__name__})")

    def _pardo(self, node: AppliedPTransform, name: str, main: beam.PCollection) -> None:
        transform, graph = node.transform, self.graph
        tags = (None, *sorted(tag for tag in node.outputs if tag is not None))
        views = [(type(si), si._view_options()) for si in node.side_inputs]
        windowing = main.windowing
        payload = pickler.dumps((pickler.dumps(transform.fn),
                                 (list(transform.args), dict(transform.kwargs), windowing, tags, views)))
        key = hashlib.sha1(payload).hexdigest()
        sides = []
        for si in node.side_inputs:
            side = self._name(node, "/side")
            graph[(side, 0)] = (everything, self._keys(si.pvalue))
            sides.append((side, 0))
        keys = self._keys(main)
        for i, input_key in enumerate(keys):
            graph[(name, i)] = (run_bundle, input_key, key, payload, *sides)
        for tag in tags:
            out = self._name(node, f"[{tag}]")
            for i in range(len(keys)):
                graph[(out, i)] = (select, (name, i), tag)
            self.parts[node.outputs[tag]] = (out, len(keys))

    def sinks(self) -> list[Any]:
        """One small task per partition of a PCollection nothing reads: computing them runs the graph."""
        found = []
        for pc, (name, n) in self.parts.items():
            if pc not in self.read:
                for i in range(n):
                    self.graph[(f"{name}/sink", i)] = (len, (name, i))
                    found.append((f"{name}/sink", i))
        return found


# --------------------------------------------------------------------------- runner

class DaskRunnerResult(PipelineResult):
    """The futures of one run; the client (and a LocalCluster we started) close when it ends."""

    def __init__(self, client: Any, cluster: Any, futures: list[Any]) -> None:
        super().__init__(PipelineState.RUNNING)
        self.client, self.cluster, self.futures = client, cluster, futures

    def wait_until_finish(self, duration: int | None = None) -> str:
        from dask.distributed import wait

        try:
            for future in self.futures:  # result() raises a worker's error here, on the client
                future.result(timeout=None if duration is None else duration / 1000)
            self._state = PipelineState.DONE
        except BaseException:
            self._state = PipelineState.FAILED
            raise
        finally:
            if self._state != PipelineState.DONE:
                self.client.cancel(self.futures)
                wait(self.futures, timeout=10, return_when="ALL_COMPLETED")
            self.close()
        return self._state

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def cancel(self) -> str:
        self.client.cancel(self.futures)
        self.close()
        self._state = PipelineState.CANCELLED
        return self._state

    def metrics(self) -> Any:
        raise NotImplementedError("DaskRunner reports no metrics: counts are in stats.json")


def store_options_plugin(options: PipelineOptions) -> Any:
    """A worker plugin: every worker, and any that joins later, opens s3:// and gs:// paths with
    the run's options (Beam's own SDK workers get them from the provision info). Built here so
    that distributed is imported only when the DaskRunner runs; the client cloudpickles it."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class StoreOptions(WorkerPlugin):
        name = "polyglot-store-options"

        def __init__(self, flags: dict[str, Any]) -> None:
            self.flags = flags

        def setup(self, worker: Any) -> None:
            from apache_beam.io.filesystems import FileSystems

            FileSystems.set_options(PipelineOptions.from_dictionary(self.flags))

    return StoreOptions(options.get_all_options(drop_default=True))


def local_cluster(workers: int | None) -> Any:
    """A LocalCluster of worker processes (one thread each) listening on 127.0.0.1 only, no dashboard.

    Its workers are forked from the fork server (``local_runner.start_fork_server``), which has
    Beam, distributed and the pipeline imported, rather than spawned as new interpreters that import
    them again. The nanny's ``pre-spawn-environ`` (glibc's trim threshold, one BLAS thread) and
    hash seed must be in a process's environment when it starts, so they go into this one's before
    the fork server starts, as the nanny would put them there before spawning.
    """
    import dask
    from dask.distributed import LocalCluster

    environ = {name: str(value) for name, value in dask.config.get("distributed.nanny.pre-spawn-environ").items()}
    os.environ.update({"PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "6640"), **environ})
    forked = local_runner.start_fork_server([*local_runner.WORKER_MODULES, "distributed", __name__])
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver" if forked else "spawn"}):
        return LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1, processes=True,
                            host="127.0.0.1", dashboard_address=None, silence_logs=logging.ERROR)


def connect(options: PipelineOptions) -> tuple[Any, Any]:
    """``(client, cluster)``: to the scheduler the options name, or to a new LocalCluster."""
    from dask.distributed import Client

    logging.getLogger("distributed").setLevel(logging.WARNING)  # importing it set INFO: cluster start/stop lines
    dask_options = options.view_as(beam_dask.DaskOptions).get_all_options(drop_default=True, current_only=True)
    beam_dask.DaskOptions._extract_bag_kwargs(dask_options)  # partition options: Create's, not the client's
    where = dask_options.get("address") or dask_options.get("scheduler_file")
    if not where:
        cluster = local_cluster(options.view_as(LocalDaskOptions).dask_num_workers)
        return Client(cluster, **dask_options), cluster
    try:
        return Client(**dask_options), None
    except (OSError, ValueError) as exc:  # distributed raises OSError on a timeout or refused connection
        raise UserError(f"cannot reach the Dask scheduler at {where}: {exc}") from None


class DaskRunner(beam_dask.DaskRunner):
    """``--runner DaskRunner``: the same graph on a dask.distributed cluster (see the module doc)."""

    def run_pipeline(self, pipeline: beam.Pipeline, options: PipelineOptions) -> DaskRunnerResult:
        bag_options = options.view_as(beam_dask.DaskOptions)
        if bag_options.partition_size:
            raise UserError("--dask_partition_size is not supported here: use --dask_npartitions")
        pipeline.replace_all([_GroupByKeyOverride(), *dask_overrides()])
        translate = _Translate(bag_options.npartitions)
        pipeline.visit(translate)
        sinks = translate.sinks()
        client, cluster = connect(options)
        try:
            client.register_plugin(store_options_plugin(options))
            futures = client.get(translate.graph, sinks, sync=False)
        except BaseException:
            client.close()
            if cluster is not None:
                cluster.close()
            raise
        return DaskRunnerResult(client, cluster, list(futures))
