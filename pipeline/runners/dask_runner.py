"""Beam's DaskRunner, with the translations our graph needs and Beam's version lacks.

Beam 2.77's ``apache_beam.runners.dask`` runs Create, ParDo, GroupByKey and Flatten as dask.bag
operations, but: every output of a multi-output ParDo gets all of its elements (tags are not
routed), what a DoFn emits in ``finish_bundle`` is lost (BatchElements, our chunked steps), only
the last transform's bag is computed (other sinks never run), a side input is computed again
inside every task that reads it, metrics are not reported, and building its dask.bag graph takes
minutes on ours. This runner keeps Beam's options and overrides and translates the graph into a
plain dask task graph, each PCollection a list of partitions:

- ParDos are fused as Beam's runners fuse them: a chain of ParDos (up to a shuffle or a side
  input) is one task per partition, a bundle, in which each element goes through the DoFns one
  after another through Beam's own ``DoFnRunner`` (nothing between them is held, and a partition's
  whole chain runs on one worker: the scheduler balances tasks of equal size); ``setup()`` runs
  once per worker process (DoFn instances are pooled, as Beam's workers do), and outputs,
  ``finish_bundle``'s included, are routed by tag;
- a side input is one task that gathers its PCollection, passed to every bundle that reads it;
- what a stage writes for another stage goes to files, as Spark's and Beam's batch runners
  materialize between stages: one file per partition under the run's shuffle folder, pickled.
  A GroupByKey's input is split by a hash of the pickled key (the same on every worker, unlike
  ``hash()`` of a str; an int key by its value modulo the partitions) into one piece per output
  partition, and the stage that reads it starts by reading its own piece of every file and
  grouping them. Dask holds and moves only the files' names and offsets (:class:`Pieces`): a
  worker holds the partition it works on, never another worker's output or a stage's output
  waiting for its reader, so its memory does not grow with the corpus. The folder is
  ``--temp_location`` (required for a running cluster: every worker must reach it, as gs://,
  s3:// or a shared filesystem), else a temporary folder on this machine for the LocalCluster;
  it is deleted when the run ends;
- a Flatten is its inputs' partitions side by side (Reshuffle too); each Create element is a
  partition of its own (up to 1024);
- every PCollection nothing reads is a sink: all of them are computed in one graph.

Only batch pipelines in the global window (ours). Counts travel as data (``counting``), so the
missing metrics cost nothing. Without ``--dask_client_address`` / ``--dask_scheduler_file`` the
runner starts a ``LocalCluster`` on 127.0.0.1 for the run and stops it at the end.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import itertools
import logging
import operator
import os
import pickle
import tempfile
import threading
import time
import uuid
from collections import Counter
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor, PTransformOverride
from apache_beam.runners.common import DoFnRunner, Receiver
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.dask.overrides import _Create, _Flatten, _GroupByKeyOnly, _Reshuffle, dask_overrides
from apache_beam.runners.runner import PipelineResult, PipelineState
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from ..output import fs
from . import forkserver, ledger, prefork
from ..util import faults
from ..util.errors import UserError

LOG = logging.getLogger(__name__)
MAX_CREATE_PARTITIONS = 1024
TASKS_PER_THREAD = 4
"""Default partitions: this many per worker thread of the cluster, whatever the number of input
files, so that a shuffle has partitions x partitions pieces at most (see BENCHMARKS.md)."""


class LocalDaskOptions(PipelineOptions):
    """The LocalCluster this runner starts when no scheduler is named."""

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        parser.add_argument("--dask_num_workers", type=int, default=None,
                            help="worker processes of the LocalCluster started for the run when no "
                                 "--dask_client_address or --dask_scheduler_file is given (default: one per core)")
        parser.add_argument("--dask_task_folder", default=None,
                            help="keep the stages' files and a marker per finished task here (local, gs://, s3://; "
                                 "every worker must reach it), after the run too: a run started again on the same "
                                 "folder runs only the tasks without a marker (`pipeline run` sets it, and removes it "
                                 "once the corpus is in place)")
        parser.add_argument("--dask_progress_interval", type=float, default=30.0,
                            help="seconds between per-stage progress lines (0: none)")


def check_options(options: PipelineOptions) -> None:
    """One line for a Dask option that would fail later: no workers, negative partitions, a missing
    scheduler file, a running cluster without a shared ``--temp_location``, a local one that cannot
    be written."""
    workers = options.view_as(LocalDaskOptions).dask_num_workers
    if workers is not None and workers < 1:
        raise UserError(f"--dask_num_workers={workers}: a LocalCluster needs at least 1 worker")
    dask = options.view_as(beam_dask.DaskOptions)
    if dask.npartitions is not None and dask.npartitions < 0:  # (it ran every stage as one partition)
        raise UserError(f"--dask_npartitions={dask.npartitions}: the input's partitions, 1 or more (0 or none: "
                        f"{TASKS_PER_THREAD} per worker thread)")
    if dask.scheduler_file and not os.path.isfile(dask.scheduler_file):  # distributed would wait for it to appear
        raise UserError(f"--dask_scheduler_file {dask.scheduler_file}: no such file "
                        "(`dask scheduler --scheduler-file` writes it)")
    temp = options.view_as(GoogleCloudOptions).temp_location
    if (dask.address or dask.scheduler_file) and not temp:
        raise UserError("--runner DaskRunner on a running cluster needs --temp_location: a folder every worker "
                        "can read and write (gs://, s3:// or a shared filesystem), for the shuffle's files")
    if temp and fs.is_local(temp):  # a bucket is checked with the other locations (check_buckets)
        if os.path.exists(temp) and not os.path.isdir(temp):
            raise UserError(f"--temp_location {temp}: not a folder")
        try:
            os.makedirs(temp, exist_ok=True)
            tempfile.TemporaryFile(dir=temp).close()
        except OSError as exc:
            raise UserError(f"--temp_location {temp}: cannot write a file there ({exc.strerror})") from None


# --------------------------------------------------------------------------- worker side

class _Fanout(Receiver):
    """One output tag of a fused ParDo: each element goes on to the ParDos of the stage that read
    it, as it is emitted (nothing between them is held), and into the slots of the stage's result
    that something outside the stage reads."""

    def __init__(self, targets: list[DoFnRunner], outs: list[list[Any]]) -> None:
        self.targets, self.outs = targets, outs

    def receive(self, windowed_value: WindowedValue) -> None:
        for target in self.targets:
            target.process(windowed_value)
        for out in self.outs:
            out.append(windowed_value.value)


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


Wiring = dict[Any, tuple[list[int], list[int]]]
"""Per output tag of a fused ParDo: the stage's ParDos that read it (indexes), and its slots in
the stage's result (read outside the stage)."""


IO: Counter[str] = Counter()
"""This process's shuffle traffic: ``reads`` (pieces read), ``files`` and ``bytes`` written."""


class Pieces(NamedTuple):
    """A partition written to the shuffle folder: its file, and where each piece of it starts
    (and the last ends). An empty piece is no bytes."""

    path: str
    offsets: list[int]

    def read(self, j: int = 0) -> list[Any]:
        """Piece ``j``: only its bytes are read."""
        start, end = self.offsets[j], self.offsets[j + 1]
        if start == end:
            return []
        IO["reads"] += 1
        with fs.open_read(self.path) as stream:
            stream.seek(start)
            return pickle.loads(stream.read(end - start))


def write_pieces(parts: list[list[Any]], path: str) -> Pieces:
    """``parts`` into the file ``path``, pickled one by one. Written under a temporary name and
    renamed (:func:`fs.write_atomic`): a task redone after its worker was lost writes it again.
    No file when every part is empty (nothing reads it; and Beam's S3 upload of no bytes fails:
    a multipart upload with no part is malformed)."""
    if not any(parts):
        return Pieces(path, [0] * (len(parts) + 1))
    offsets = [0]

    def write(stream: Any) -> None:
        for part in parts:
            blob = pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL) if part else b""
            stream.write(blob)
            offsets.append(offsets[-1] + len(blob))

    fs.write_atomic(path, write)
    IO.update(files=1, bytes=offsets[-1])
    return Pieces(path, offsets)


def load(part: list[Any] | Pieces) -> list[Any]:
    """A partition's elements: a Create's or a group's as they are, a stage output from its file."""
    return part.read() if isinstance(part, Pieces) else part


class Mark(NamedTuple):
    """Where a stage task records that it finished (:mod:`ledger`): the task folder, the stage's
    index and first label, the task's partition, and the attempt (driver invocation) running it."""

    folder: str
    stage: int
    label: str
    task: int
    attempt: str


_IO_SEEN: Counter[str] = Counter()


def _io_since_last() -> Counter[str]:
    """Shuffle traffic since the last marked task of this process: with one thread per worker, a
    task's own and that of the unmarked tasks it waited for (its group's reads)."""
    delta = IO - _IO_SEEN
    _IO_SEEN.update(delta)
    return delta


Slot = tuple[str, int | None]
"""Where a stage writes an output that is read outside it, in a task: the partition's file, and
for a GroupByKey's input how many pieces to split it into (None: one piece, as it is)."""


def run_stage(mark: Mark | None, items: list[Any] | Pieces, stage: bytes, slots: list[Slot],
              *side_values: list[Any]) -> list[Pieces]:
    """One partition through a fused stage as one bundle (:func:`run_bundle`); returns each slot's
    file, written here as Beam's fused stages end in their shuffle write: for a GroupByKey's input,
    split by key (:func:`split_by_key`). With ``mark``, recorded in the task ledger: a marker once
    the files it wrote are complete and on the disk (elements in and out, seconds, shuffle traffic),
    a failure marker with the error's last line if it raised."""
    if mark is None:
        return _write_slots(run_bundle(load(items), stage, len(slots), side_values), slots)
    faults.fault_point("POLYGLOT_FAULT", f"task:{mark.label}", mark.task)
    start = time.perf_counter()
    try:
        with fs.written_files() as written:  # its stage files and its sinks' (shards, records)
            elements = load(items)
            out = run_bundle(elements, stage, len(slots), side_values)
            outputs = _write_slots(out, slots)
        fs.make_durable(written)
    except Exception as exc:
        ledger.record_failure(mark.folder, mark.stage, mark.task, exc)
        raise
    io = _io_since_last()
    ledger.record(mark.folder, mark.stage, mark.task, {
        "attempt": mark.attempt, "seconds": round(time.perf_counter() - start, 3), "in": len(elements),
        "out": sum(map(len, out)), "reads": io["reads"], "files": io["files"], "bytes": io["bytes"],
        "outputs": [[o.path, o.offsets] for o in outputs]})
    return outputs


def _write_slots(out: list[list[Any]], slots: list[Slot]) -> list[Pieces]:
    return [split_by_key(values, path, n) if n else write_pieces([values], path) for values, (path, n) in zip(out, slots)]


def run_bundle(elements: list[Any], stage: bytes, n_slots: int, side_values: tuple[list[Any], ...]) -> list[list[Any]]:
    """``elements`` through a fused stage as one bundle, element by element, as Beam's SDK workers
    run a fused stage. ``stage`` is the pickled ``[(key, ParDo payload, wiring)]`` in graph order,
    the first reading ``elements`` (and the side inputs), each later one reading outputs of earlier
    ones. Returns what each of the ``n_slots`` slots (outputs read outside the stage) received."""
    pardos: list[tuple[str, bytes, Wiring]] = pickle.loads(stage)
    out: list[list[Any]] = [[] for _ in range(n_slots)]
    fns: list[beam.DoFn] = []
    runners: list[DoFnRunner] = []
    for index, (key, payload, wiring) in reversed(list(enumerate(pardos))):  # readers are built first
        fn, (args, kwargs, windowing, tags, views) = _take_dofn(key, payload)
        sides = [SideInputMap(view, options, [GlobalWindows.windowed_value(v) for v in values])
                 for (view, options), values in zip(views, side_values)] if index == 0 else []
        receivers = {tag: _Fanout([runners[len(pardos) - 1 - reader] for reader in wiring[tag][0]],
                                  [out[slot] for slot in wiring[tag][1]]) for tag in tags}
        fns.append(fn)
        runners.append(DoFnRunner(fn, args, kwargs, sides, windowing, receivers, step_name=key))
    fns.reverse()
    runners.reverse()
    for runner in runners:
        runner.start()
    for item in elements:
        runners[0].process(GlobalWindows.windowed_value(item))
    for runner in runners:  # in graph order: what a finish_bundle emits reaches readers not yet finished
        runner.finish()
    for (key, _, _), fn in zip(pardos, fns):  # only after a bundle that succeeded: a failed one may have left state behind
        _give_back(key, fn)
    return out


def stable_partition(key: Any, n: int) -> int:
    """The same on every worker process (``hash()`` of a str is not, without PYTHONHASHSEED).

    An int key goes to ``key % n``: the dense indexes our graph groups by (input files, dedup
    partitions) then fill every partition evenly, where a hash put two of 8 files in one partition
    and none in another, and one of 2 workers read 5 of the 8 (measured: 14.1 s busy against 9.6 s).
    """
    if type(key) is int:
        return key % n
    buffer = io.BytesIO()
    keys = pickle.Pickler(buffer, protocol=4)
    keys.fast = True  # no memo: equal keys, equal bytes, whichever of their parts are one object ((w, w) and (w, copy))
    keys.dump(key)
    return int.from_bytes(hashlib.blake2b(buffer.getvalue(), digest_size=8).digest(), "little") % n


def split_by_key(items: list[tuple[Any, Any]] | Pieces, path: str, n: int) -> Pieces:
    """The shuffle's write side: ``items`` into the file ``path`` as ``n`` pieces, piece ``j`` for
    output partition ``j`` of the GroupByKey."""
    parts: list[list[tuple[Any, Any]]] = [[] for _ in range(n)]
    for item in load(items):
        parts[stable_partition(item[0], n)].append(item)
    return write_pieces(parts, path)


def group_part(j: int, splits: list[Pieces]) -> list[tuple[Any, list[Any]]]:
    """Output partition ``j`` of a GroupByKey: its piece of every input partition's file, grouped."""
    groups: dict[Any, list[Any]] = {}
    for split in splits:
        for key, value in split.read(j):
            groups.setdefault(key, []).append(value)
    return list(groups.items())


def everything(parts: list[list[Any] | Pieces]) -> list[Any]:
    return [item for part in parts for item in load(part)]


def literal(payload: bytes) -> Any:
    return pickle.loads(payload)


# --------------------------------------------------------------------------- translation

class _GroupByKeyOverride(PTransformOverride):
    """GroupByKey as one leaf (Beam's Dask override adds window steps a batch job does not need)."""

    def matches(self, applied: AppliedPTransform) -> bool:
        return applied.transform.__class__ == beam.GroupByKey

    def get_replacement_transform_for_applied_ptransform(self, applied: AppliedPTransform) -> beam.PTransform:
        return _GroupByKeyOnly()


class _ReshuffleOverride(PTransformOverride):
    """A Reshuffle, Beam's or a subclass of it (``transforms.placement.Distribute``), passes its input
    through (Beam's Dask override takes Beam's own class only)."""

    def matches(self, applied: AppliedPTransform) -> bool:
        return isinstance(applied.transform, beam.Reshuffle)

    def get_replacement_transform_for_applied_ptransform(self, applied: AppliedPTransform) -> beam.PTransform:
        return _Reshuffle()


@dataclasses.dataclass
class _Stage:
    """ParDos fused into one task per partition (:func:`run_stage`): the first reads ``inputs``
    (and the side inputs ``sides``), the others read outputs of the stage. ``slots`` are the
    outputs read outside the stage: ``(name, files, pieces)``, the path of their files without
    the partition, and for a GroupByKey's input how many pieces (see :data:`Slot`)."""

    name: str
    index: int
    folder: str
    inputs: list[Any]
    sides: list[Any]
    labels: list[str] = dataclasses.field(default_factory=list)
    pardos: list[tuple[str, bytes, Wiring]] = dataclasses.field(default_factory=list)
    slots: list[tuple[str, str, int | None]] = dataclasses.field(default_factory=list)

    def slot(self, index: int, tag: Any, pieces: int | None) -> list[tuple[str, int]]:
        """The keys of a new slot of ParDo ``index``'s output ``tag``. Its files are named by the
        stage's place, the ParDo's, the tag and the pieces, not by the order in which the
        translation met them: a resumed run finds them under the same names."""
        self.pardos[index][2][tag][1].append(len(self.slots))
        name = f"{self.name}[{len(self.slots)}]"
        files = fs.join(self.folder, f"s{self.index:03d}-p{index:02d}-{tag}-{pieces or 0}")
        self.slots.append((name, files, pieces))
        return [(name, i) for i in range(len(self.inputs))]

    @property
    def key(self) -> str:
        """Its tasks' name: the first ParDo and how many follow it (``A+2``: a key names a
        worker's spill file, so all of ``A+B+C`` would be too long)."""
        return f"{self.labels[0]}+{len(self.labels) - 1}-{self.name.rsplit('-', 1)[1]}"

    def tasks(self, folder: str, attempt: str, done: dict[tuple[int, int], dict[str, Any]]) -> dict[Any, Any]:
        """Its tasks, one per slot and partition, marked in the ledger in ``folder``; a task
        ``done`` already is its recorded files."""
        key = self.key
        payload = pickle.dumps(self.pardos)
        graph: dict[Any, Any] = {}
        for i, input_key in enumerate(self.inputs):
            slots = [(f"{files}-{i}", pieces) for _, files, pieces in self.slots]
            recorded = dict(map(tuple, done[self.index, i]["outputs"])) if (self.index, i) in done else None
            if recorded is not None and all(path in recorded for path, _ in slots):
                graph[(key, i)] = (literal, pickle.dumps([Pieces(path, recorded[path]) for path, _ in slots]))
            else:
                mark = Mark(folder, self.index, self.labels[0], i, attempt)
                graph[(key, i)] = (run_stage, mark, input_key, payload, slots, *self.sides)
            for slot, (name, _, _) in enumerate(self.slots):
                graph[(name, i)] = (operator.getitem, (key, i), slot)
            if not self.slots:  # nothing outside reads it: a small task that runs it
                graph[(f"{key}/sink", i)] = (len, (key, i))
        return graph


class _Translate(PipelineVisitor):
    """Beam leaf transforms -> a dask task graph: each PCollection is ``npartitions`` keys
    ``(name, i)``, each holding a list of elements.

    ParDos are fused as Beam's runners fuse them: a ParDo whose main input is an output of a
    stage joins that stage, unless it reads side inputs (which may depend on the stage itself);
    an output becomes keys of its own only when something outside the stage reads it, already
    split for a GroupByKey that reads it. A stage that is the only reader of a GroupByKey's output
    groups its partition itself (the shuffle's read side). A Flatten is its inputs' partitions,
    side by side.
    """

    def __init__(self, create_partitions: int | None, shuffle_dir: str) -> None:
        self.graph: dict[Any, Any] = {}
        self.parts: dict[beam.PCollection, tuple[str, int]] = {}
        self.fused: dict[beam.PCollection, tuple[_Stage, int, Any]] = {}  # output -> (stage, ParDo, tag)
        self.stages: list[_Stage] = []
        self.flattened: dict[beam.PCollection, list[beam.PCollection]] = {}
        self.grouped: dict[beam.PCollection, tuple[str, list[Any]]] = {}  # a GroupByKey's output: its tasks
        self.readers: Counter[beam.PCollection] = Counter()
        self.splits: dict[tuple[beam.PCollection, int], list[Any]] = {}
        self.create_partitions = create_partitions
        self.shuffle_dir = shuffle_dir
        self.shuffle_partitions = 1  # a GroupByKey's output partitions: at most the widest Create's
        self.shuffles = 0  # GroupByKeys
        self.creates: dict[str, tuple[str, list[list[int]]]] = {}  # a Create: its label, partitions' [start, end)
        self.ids = itertools.count()

    def count_readers(self) -> PipelineVisitor:
        """A visitor that counts the readers of each PCollection, into ``readers``: to run first."""
        readers = self.readers

        class Count(PipelineVisitor):
            def visit_transform(self, node: AppliedPTransform) -> None:
                readers.update([*node.main_inputs.values(), *(si.pvalue for si in node.side_inputs)])

        return Count()

    def _name(self, node: AppliedPTransform, what: str = "") -> str:
        return f"{node.full_label}{what}-{next(self.ids)}"

    def _files(self) -> str:
        """A new path in the shuffle folder, for one output's files (one per partition)."""
        return fs.join(self.shuffle_dir, f"split-{next(self.ids)}")

    def _keys(self, pc: beam.PCollection) -> list[Any]:
        if pc in self.flattened:
            return [key for part in self.flattened[pc] for key in self._keys(part)]
        if pc in self.grouped and pc not in self.parts:
            name, tasks = self.grouped[pc]
            self.graph.update(((name, j), task) for j, task in enumerate(tasks))
            self.parts[pc] = (name, len(tasks))
        elif pc not in self.parts:  # a stage's output, read outside the stage: it gets a slot
            stage, index, tag = self.fused[pc]
            self.parts[pc] = (stage.slot(index, tag, None)[0][0], len(stage.inputs))
        name, n = self.parts[pc]
        return [(name, i) for i in range(n)]

    def _count(self, pc: beam.PCollection) -> int:
        """How many partitions ``pc`` has (without giving a stage's output a slot)."""
        if pc in self.flattened:
            return sum(self._count(part) for part in self.flattened[pc])
        if pc in self.grouped:
            return len(self.grouped[pc][1])
        return self.parts[pc][1] if pc in self.parts else len(self.fused[pc][0].inputs)

    def _split(self, pc: beam.PCollection, n: int, node: AppliedPTransform) -> list[Any]:
        """Keys of ``pc``'s partitions split into ``n`` pieces each (:func:`split_by_key`)."""
        if pc in self.flattened:
            return [key for part in self.flattened[pc] for key in self._split(part, n, node)]
        if (pc, n) not in self.splits:
            if pc in self.fused and pc not in self.parts:
                stage, index, tag = self.fused[pc]
                self.splits[pc, n] = stage.slot(index, tag, n)
            else:
                files = self._files()
                split = self._name(node, "/split")
                for i, key in enumerate(self._keys(pc)):
                    self.graph[(split, i)] = (split_by_key, key, f"{files}-{i}", n)
                self.splits[pc, n] = [(split, i) for i in range(len(self._keys(pc)))]
        return self.splits[pc, n]

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform, graph = node.transform, self.graph
        inputs = [pc for pc in node.main_inputs.values() if any(pc in known for known in (self.parts, self.fused,
                                                                                          self.flattened, self.grouped))]
        name = self._name(node)
        if isinstance(transform, _Create):
            values = list(transform.values)
            n = max(1, min(len(values), self.create_partitions or MAX_CREATE_PARTITIONS))
            self.shuffle_partitions = max(self.shuffle_partitions, n)
            spans = [[i * len(values) // n, (i + 1) * len(values) // n] for i in range(n)]
            for i, (start, end) in enumerate(spans):
                graph[(name, i)] = (literal, pickle.dumps(values[start:end]))
            self.creates[name] = (node.full_label, spans)
            self.parts[node.outputs[None]] = (name, n)
        elif isinstance(transform, beam.ParDo):
            self._pardo(node, name, inputs[0])
        elif isinstance(transform, _GroupByKeyOnly):
            n = min(self._count(inputs[0]), self.shuffle_partitions)
            self.shuffles += 1
            splits = self._split(inputs[0], n, node)
            # the split files' names in one task, which each group task reads: 2n dependencies
            # rather than n x n, which grew the scheduler's and every worker's state with the corpus
            self.graph[(f"{name}/files", 0)] = (list, splits)
            self.grouped[node.outputs[None]] = (name, [(group_part, j, (f"{name}/files", 0)) for j in range(n)])
        elif isinstance(transform, (_Flatten, _Reshuffle)) and inputs:
            # by producer, not in Beam's order of inputs, which is not the same in every process: a
            # resumed run's tasks must read the same partitions as the run it continues
            self.flattened[node.outputs[None]] = sorted(inputs, key=lambda pc: (pc.producer.full_label, str(pc.tag)))
        elif isinstance(transform, _Flatten):  # of nothing
            graph[(name, 0)] = (literal, pickle.dumps([]))
            self.parts[node.outputs[None]] = (name, 1)
        else:
            raise NotImplementedError(f"DaskRunner: no translation for {node.full_label} ({type(transform).__name__})")

    def _pardo(self, node: AppliedPTransform, name: str, main: beam.PCollection) -> None:
        transform = node.transform
        tags = (None, *sorted(tag for tag in node.outputs if tag is not None))
        views = [(type(si), si._view_options()) for si in node.side_inputs]
        payload = pickler.dumps((pickler.dumps(transform.fn),
                                 (list(transform.args), dict(transform.kwargs), main.windowing, tags, views)))
        if main in self.fused and not node.side_inputs:
            stage, index, tag = self.fused[main]
            stage.pardos[index][2][tag][0].append(len(stage.pardos))
        else:
            sides = []
            for si in node.side_inputs:
                side = self._name(node, "/side")
                self.graph[(side, 0)] = (everything, self._keys(si.pvalue))
                sides.append((side, 0))
            inline = main in self.grouped and main not in self.parts and self.readers[main] == 1
            stage = _Stage(name, len(self.stages), self.shuffle_dir, self.grouped[main][1] if inline else self._keys(main), sides)
            self.stages.append(stage)
        for tag in tags:
            self.fused[node.outputs[tag]] = (stage, len(stage.pardos), tag)
        stage.labels.append(node.full_label)
        stage.pardos.append((hashlib.sha1(payload).hexdigest(), payload, {tag: ([], []) for tag in tags}))

    def plan(self) -> ledger.Plan:
        """The stages for the ledger: labels, tasks, and the input elements a Create's reader covers."""
        stages = []
        for stage in self.stages:
            keys = [key if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) else None
                    for key in stage.inputs]
            read = [(self.creates[key[0]][0], self.creates[key[0]][1][key[1]]) for key in keys if key and key[0] in self.creates]
            whole = len(read) == len(keys) and len({label for label, _ in read}) == 1
            stages.append(ledger.StagePlan(stage.labels, len(stage.inputs), read[0][0] if whole else None,
                                           [span for _, span in read] if whole else None))
        return ledger.Plan(self.create_partitions, stages)

    def sinks(self, folder: str, attempt: str, done: dict[tuple[int, int], dict[str, Any]]) -> list[Any]:
        """Adds the stages' tasks (see :meth:`_Stage.tasks`); returns the keys that run the graph:
        a small task per partition of every stage whose outputs nothing outside it reads and of
        every other unread PCollection."""
        found = []
        for stage in self.stages:
            tasks = stage.tasks(folder, attempt, done)
            self.graph.update(tasks)
            found += [key for key in tasks if key[0].endswith("/sink")]
        for pc, (name, n) in self.parts.items():
            if not self.readers[pc] and pc not in self.fused:
                for i in range(n):
                    self.graph[(f"{name}/sink", i)] = (len, (name, i))
                    found.append((f"{name}/sink", i))
        return found


# --------------------------------------------------------------------------- runner

class DaskRunnerResult(PipelineResult):
    """The futures of one run; the client (and a LocalCluster we started) close when it ends. The
    task folder is deleted when it was the run's own (no ``--dask_task_folder``): a named folder
    stays, for a resumed run or whoever named it (``pipeline run`` removes it once the corpus is in
    place: a driver killed after the run but before that resumes without running a task again).

    ``tasks`` counts the stage tasks: ``total``, ``reused`` (finished by an earlier driver on the
    same folder, not run again) and, once finished, ``run`` (those this driver ran), with the
    input's ``partitions``, the GroupByKeys (``shuffles``), and the files the stages wrote for one
    another (``files``, ``bytes``: the task folder's size at the end) and the pieces they read
    (``reads``), by the tasks this driver ran.

    A task whose worker died each time it ran it, tasks the scheduler dropped (it ended, or the
    connection to it failed), or a scheduler left without a worker for :func:`worker_wait`'s
    seconds, end the run with one line (:class:`UserError`) naming them."""

    def __init__(self, client: Any, cluster: Any, shuffle_dir: str, keep: bool) -> None:
        super().__init__(PipelineState.RUNNING)
        self.client, self.cluster, self.shuffle_dir, self.keep = client, cluster, shuffle_dir, keep
        self.address: str = client.scheduler.address
        self.futures: list[Any] = []
        self.attempt = uuid.uuid4().hex[:12]
        self.tasks: dict[str, int] = {}
        self.stages: dict[str, str] = {}  # a stage's task name -> its name in the ledger
        self.progress: ledger.Progress | None = None
        self.interval = 30.0
        self.worker_wait = 30.0  # (:func:`worker_wait`)
        self.workerless_since: float | None = None

    def wait_until_finish(self, duration: int | None = None) -> str:
        from distributed import KilledWorker, wait
        from distributed.client import FutureCancelledError, FuturesCancelledError

        deadline = None if duration is None else time.monotonic() + duration / 1000
        tick = self.interval if self.progress and self.interval > 0 else None
        next_tick = None if tick is None else time.monotonic() + tick
        look = min(5.0, self.worker_wait / 3)  # how often the scheduler is asked whether it has a worker
        next_look = time.monotonic() + look
        try:
            pending = list(self.futures)
            while pending:  # a worker's error is raised here, on the client, as soon as it comes
                until = min(t for t in (deadline, next_tick, next_look) if t is not None)
                try:
                    wait(pending, timeout=max(0.0, until - time.monotonic()), return_when="FIRST_COMPLETED")
                except TimeoutError:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise
                if time.monotonic() >= next_look:  # (also while tasks end: a worker back since is seen)
                    self._check_workers()
                    next_look = time.monotonic() + look
                for future in pending:
                    if future.status == "error":
                        future.result()
                pending = [future for future in pending if not future.done()]
                if next_tick is not None and time.monotonic() >= next_tick:
                    self.progress.update()
                    next_tick = time.monotonic() + tick
            for future in self.futures:
                future.result()
            self._count()
            self._state = PipelineState.DONE
        except KilledWorker as exc:  # (where its finished tasks are kept for --resume: run.py's warning says)
            raise UserError(self._killed(exc)) from exc  # (its traceback: DEBUG_ENV)
        except (FutureCancelledError, FuturesCancelledError) as exc:
            reasons = [exc.reason] if isinstance(exc, FutureCancelledError) else [g.reason for g in exc.error_groups]
            raise UserError(f"the Dask scheduler at {self.address} dropped the run's tasks ({', '.join(reasons)}): "
                            "it ended or was restarted, or the connection to it failed") from exc
        finally:
            if self._state != PipelineState.DONE:
                self._state = PipelineState.FAILED
                self.client.cancel(self.futures)
                with contextlib.suppress(Exception):  # cancelled futures raise here: the run's error is the one to show
                    wait(self.futures, timeout=10, return_when="ALL_COMPLETED")
            self.close()
        return self._state

    def _check_workers(self) -> None:
        """One line once the scheduler has had no worker for :func:`worker_wait`'s seconds: every one
        it had ended (a remote cluster's, or a LocalCluster's nannies too), and its tasks would wait
        for ever for one to join."""
        if self.client.scheduler_info(n_workers=1)["workers"]:
            self.workerless_since = None
            return
        now = time.monotonic()
        self.workerless_since = self.workerless_since or now
        if now - self.workerless_since >= self.worker_wait:
            if self.cluster is not None:
                raise UserError(f"the run's Dask LocalCluster lost every worker and none came back within "
                                f"{self.worker_wait:g} s")
            raise UserError(f"the Dask scheduler at {self.address} lost every worker and none joined within "
                            f"{self.worker_wait:g} s (start `dask worker {self.address}` on the machines that run the "
                            "tasks; --dask_connection_timeout waits longer)")

    def _killed(self, exc: Any) -> str:
        """What a ``KilledWorker`` means, worded as the DirectRunner words a lost SDK worker."""
        key = exc.task
        stage = self.stages.get(key[0]) if isinstance(key, tuple) and len(key) == 2 else None
        task = f"task {key[1]} of stage {stage}" if stage else f"Dask task {key}"
        more = ("fewer --dask_num_workers give each a larger share of this machine's" if self.cluster is not None
                else "fewer workers per machine or a larger memory limit (`dask worker --nworkers`, `--memory-limit`)")
        return (f"{task}: its worker ended before it was done, on each of the {exc.allowed_failures + 1} workers that "
                f"ran it (it may have run out of memory: {more})")

    def _count(self) -> None:
        entries = ledger.finished(self.shuffle_dir).values()
        ran = [e for e in entries if e["attempt"] == self.attempt]
        self.tasks.update(run=len(ran), **{key: sum(e[key] for e in ran) for key in ("reads", "files", "bytes")})

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        if not self.keep:
            fs.remove_folder(self.shuffle_dir)

    def cancel(self) -> str:
        self.client.cancel(self.futures)
        self._state = PipelineState.CANCELLED
        self.close()
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
            prefork.raise_gc_threshold()  # the steps' documents: collections rarer

    return StoreOptions(options.get_all_options(drop_default=True))


def local_cluster(workers: int) -> Any:
    """A LocalCluster of worker processes (one thread each) listening on 127.0.0.1 only, no dashboard.

    Its workers are forked from the fork server (``prefork.start_fork_server``), which has Beam,
    distributed, the pipeline and the steps' worker modules imported, rather than spawned as new
    interpreters that import them again (so is a worker the nanny starts in place of a lost one).
    The nanny's ``pre-spawn-environ`` (glibc's trim threshold, one BLAS thread) and hash seed must
    be in a process's environment when it starts, so they go into this one's before the fork server
    starts, as the nanny would put them there before spawning. The workers keep no statistical profile (it is for a dashboard, which this cluster has
    not got, and its call trees grew by a fifth of a worker's memory at 8x the benchmark corpus) and
    shorter developer logs (each entry holds a task, and a stage's task holds its pickled DoFns).
    """
    import dask
    from dask.distributed import LocalCluster

    environ = {name: str(value) for name, value in dask.config.get("distributed.nanny.pre-spawn-environ").items()}
    os.environ.update({"PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "6640"), **environ})
    forked = prefork.start_fork_server([*forkserver.preloaded(), "distributed", __name__])
    # for the process's life, not the cluster's start: a nanny reads it again to replace a lost worker
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver" if forked else "spawn"})
    with dask.config.set({"distributed.worker.profile.enabled": False, "distributed.admin.low-level-log-length": 100}):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                            host="127.0.0.1", dashboard_address=None, silence_logs=logging.ERROR)


def client_options(options: PipelineOptions) -> dict[str, Any]:
    """Beam's Dask options for ``distributed.Client`` (those the user set), and the scheduler they
    name under ``address`` or ``scheduler_file``, if any."""
    dask_options = options.view_as(beam_dask.DaskOptions).get_all_options(drop_default=True, current_only=True)
    beam_dask.DaskOptions._extract_bag_kwargs(dask_options)  # partition options: Create's, not the client's
    return dask_options


def local_workers(options: PipelineOptions) -> int | None:
    """The worker processes of the LocalCluster :func:`connect` starts for these options on this
    machine; None where they name a running scheduler (its workers are anywhere)."""
    named = client_options(options)
    if named.get("address") or named.get("scheduler_file"):
        return None
    return options.view_as(LocalDaskOptions).dask_num_workers or os.cpu_count() or 1


def worker_wait(options: PipelineOptions) -> float:
    """Seconds a run waits for a worker where a scheduler has none (at the start, or after losing
    every one): ``--dask_connection_timeout``, else Dask's connect timeout; at least 1."""
    import dask
    from dask.utils import parse_timedelta

    given = client_options(options).get("timeout")  # Beam's option: an int, else Dask's default
    return max(1, given if isinstance(given, int) else parse_timedelta(dask.config.get("distributed.comm.timeouts.connect")))


def connect(options: PipelineOptions) -> tuple[Any, Any]:
    """``(client, cluster)``: to the scheduler the options name, once it has a worker (within the
    connection timeout: tasks on a scheduler without workers wait for ever), or to a new LocalCluster."""
    from dask.distributed import Client

    logging.getLogger("distributed").setLevel(logging.WARNING)  # importing it set INFO: cluster start/stop lines
    # a LocalCluster's scheduler (in this process) logs every task a lost worker held, dozens of lines,
    # and a client closed while it reconnects to a lost scheduler logs a traceback: the run's error says it
    for name in ("distributed.scheduler", "distributed.client"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    dask_options, workers = client_options(options), local_workers(options)
    if workers is not None:
        cluster = local_cluster(workers)
        return Client(cluster, **dask_options), cluster
    where = dask_options.get("address") or dask_options.get("scheduler_file")
    try:
        client = Client(**dask_options)
    except (OSError, ValueError) as exc:  # distributed raises OSError on a timeout or refused connection
        raise UserError(f"cannot reach the Dask scheduler at {where}: {exc}") from None
    timeout = worker_wait(options)
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        address = client.scheduler.address
        client.close()
        raise UserError(f"the Dask scheduler at {address} has no workers: none joined within {timeout:g} s "
                        f"(start `dask worker {address}` on the machines that run the tasks; "
                        "--dask_connection_timeout waits longer)") from None
    return client, None


def shuffle_folder(options: PipelineOptions) -> tuple[str, bool]:
    """The folder of one run's stage files and task ledger, and whether it is named (kept after a
    failure, resumed): ``--dask_task_folder``; else a new folder below ``--temp_location``, else
    (a LocalCluster's workers share this machine's disk) in the system's temporary folder."""
    named = options.view_as(LocalDaskOptions).dask_task_folder
    if named:
        return named, True
    temp = options.view_as(GoogleCloudOptions).temp_location
    if temp:
        return fs.join(temp, f"dask-shuffle-{uuid.uuid4().hex[:12]}"), False
    return tempfile.mkdtemp(prefix="polyglot-dask-shuffle-"), False


def partitions(options: PipelineOptions, client: Any, recorded: ledger.Plan | None) -> int:
    """The input's partitions: a resumed run's, else ``--dask_npartitions``, else
    :data:`TASKS_PER_THREAD` per worker thread of the cluster (at most :data:`MAX_CREATE_PARTITIONS`)."""
    if recorded is not None:
        return recorded.partitions
    given = options.view_as(beam_dask.DaskOptions).npartitions
    if given:
        return given
    threads = sum(client.nthreads().values()) or 1
    return min(MAX_CREATE_PARTITIONS, TASKS_PER_THREAD * threads)


def translate(pipeline: beam.Pipeline, options: PipelineOptions, shuffle_dir: str, n_partitions: int) -> _Translate:
    """The pipeline translated (``graph``, ``plan()``, ``sinks()``), shuffling through ``shuffle_dir``."""
    bag_options = options.view_as(beam_dask.DaskOptions)
    if bag_options.partition_size:
        raise UserError("--dask_partition_size is not supported here: use --dask_npartitions")
    pipeline.replace_all([_GroupByKeyOverride(), _ReshuffleOverride(), *dask_overrides()])
    translation = _Translate(n_partitions, shuffle_dir)
    pipeline.visit(translation.count_readers())
    pipeline.visit(translation)
    return translation


class DaskRunner(beam_dask.DaskRunner):
    """``--runner DaskRunner``: the same graph on a dask.distributed cluster (see the module doc).

    On a task folder with a ledger (``--dask_task_folder`` of a run that did not finish), the
    tasks with a marker are not run again; a graph of other stages or task counts is refused."""

    def run_pipeline(self, pipeline: beam.Pipeline, options: PipelineOptions) -> DaskRunnerResult:
        client, cluster = connect(options)
        folder, keep = shuffle_folder(options)
        result = DaskRunnerResult(client, cluster, folder, keep)
        result.worker_wait = worker_wait(options)
        try:
            recorded = ledger.read_plan(folder) if keep else None
            translation = translate(pipeline, options, folder, partitions(options, client, recorded))
            plan = translation.plan()
            if recorded is not None and recorded.shape() != plan.shape():
                raise UserError(f"{folder}: the unfinished run there has other stages (another config, input or "
                                "version); run without --resume to start afresh")
            done = ledger.finished(folder) if recorded is not None else {}
            sinks = translation.sinks(folder, result.attempt, done)
            ledger.write_plan(folder, plan)
            result.stages = {stage.key: planned.name for stage, planned in zip(translation.stages, plan.stages)}
            result.tasks = {"total": sum(stage.tasks for stage in plan.stages), "reused": len(done),
                            "partitions": plan.partitions, "shuffles": translation.shuffles}
            result.interval = options.view_as(LocalDaskOptions).dask_progress_interval
            result.progress = ledger.Progress(folder, plan, done)
            if done:
                LOG.warning("resuming %s: %d of %d tasks finished before, not run again", folder, len(done),
                            result.tasks["total"])
            client.register_plugin(store_options_plugin(options))
            result.futures = list(client.get(translation.graph, sinks, sync=False))
        except BaseException:
            result.close()
            raise
        return result
