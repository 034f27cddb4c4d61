"""Beam's FnApiRunner (DirectRunner, PortableRunner with ``--job_endpoint embed``), with each
worker's stage input sent in pieces, so that a worker's memory does not grow with the corpus, and
its SDK worker processes forked from a warm fork server rather than started cold.

Beam 2.77's FnApiRunner sends an SDK worker its whole share of a stage's input as one gRPC
message: the chunks the stage before wrote are concatenated before the first byte is sent, and
after a GroupByKey every key of the share is encoded into one blob (``GroupingBuffer.partition``).
The worker holds that message (gRPC's copy, protobuf's and the ``bytes``) until the bundle ends.
Measured on the scaling benchmark at 8x: one 205 MB message per worker for one stage, worker RSS
1.9 GB against 0.6 GB at 1x. The SDK worker itself reads a stage's input message by message,
through a queue of at most 5 messages, so pieces of a few MB keep what it holds bounded.

Seven overrides (the last of six methods), installed by :func:`install`:

- ``GroupingBuffer.partition`` (global window only, which is all a batch pipeline has) encodes
  the keys in the same order to the same workers, as Beam does, but cuts each worker's stream
  after the element that takes it past :data:`PIECE_BYTES`;
- a GroupByKey annotated :data:`~pipeline.transforms.placement.BY_FILE` (its keys input file
  indexes) gives key ``i`` to worker ``i % n`` (``partition``, with ``BundleContextManager.get_buffer``
  noting the annotation on the GroupByKey's buffer), and ``BundleManager.process_bundle`` sends
  that share to that worker (Beam deals keys in the order they reached the runner, and shares to
  workers by a counter over every bundle of the run). Exact dedup's two passes over a file then
  run in the same forked worker, which holds what the first read in its memory for the second
  (``readers.spill.hold_here``, up to its share of ``spill.hold_bytes``) rather than writing it to
  the disk for whichever worker came next;
- ``BundleManager._send_input_to_worker`` lets the output stream flush after every piece
  (Beam writes all of them and flushes once at the end);
- with ``--direct_running_mode multi_processing``, local_job_service's ``subprocess.Popen`` of
  fn_runner's worker command (``python -m apache_beam.runners.worker.sdk_worker_main``) forks the
  worker from multiprocessing's fork server instead, which imported Beam and the pipeline's
  modules once while the driver built the graph. A new interpreter per worker spent about 1.5 s of
  CPU importing them, in every run; on 2 cores that was 1 s of a 12 s benchmark run. Other
  commands (``--environment_type PROCESS``) still start as processes;
- ``BundleManager.process_bundle`` runs no bundle for a worker whose share of a stage's input
  holds no element and that has no timer to fire. Beam sends every worker a bundle of every
  stage, empty or not, and each costs the worker the stage's bundle processor (the descriptor
  fetched, the DoFns unpickled and set up), a bundle and its metrics, while the driver waits. In
  the full chain of the floor benchmark at 2 workers, 26 of 74 bundles were empty and 10 of 37
  stages got nothing at all (near-dup's rounds after the graph converged, the rejected records'
  write); such a stage took 29-52 ms, now 1.5-4 ms. Beam's model leaves bundling to the runner,
  so a DoFn may not count on a bundle without elements; and the runner already hands the
  consumers of an output nobody wrote (a side input among them) an empty buffer;
- ``WorkerHandlerManager.close_all`` tells every SDK worker that the work is done before it
  waits for the first to exit. Beam tells one worker, waits for its process to end (23 ms
  here), then the next: at the end of every run, 46 ms at 2 workers, now 23;
- an SDK worker process that ends with an error before the run is done (killed for memory, say,
  or one that could not start) fails the run with :class:`WorkerLost`, one line
  (``SubprocessSdkWorkerHandler.start_worker`` notes the worker's handler,
  ``SubprocessSdkWorker.run`` sees its end, ``FnApiRunner.run_stages`` raises it). Beam only
  raises in the thread that waited for the process: where its runner waited for that worker's
  answers or data, it waited for ever. The threads that read the worker's control and data
  streams (``ControlConnection._read``, ``_GrpcDataChannel.set_inputs``) end quietly where the
  stream broke with the worker, and closing its data channel (``_GrpcDataChannel.close``) no longer
  raises the loss again: Beam printed each of those as an error with a traceback above the one line.
  A worker that ends with an error after every stage is done (in a DoFn's teardown, say) is a
  warning: the outputs are whole. Ctrl-C (SIGINT to the terminal's process group) ends a forked
  worker at once, quietly, and the driver takes that end as its own interruption (``pipeline run``
  says it in one line); the fork server ignores it.

The elements are unchanged: the message boundaries move, bundles with nothing to do are not run,
and a ``BY_FILE`` key goes to the worker its value names rather than to the one Beam's order of
arrival names (no output depends on which worker ran what), so outputs stay byte-identical
(tested in ``tests/test_forkserver.py`` and by the engine tests).

What is still left of a worker's growth is memory glibc keeps after it was freed (its adaptive
mmap threshold rises to the largest block freed, and later large blocks come from the heap);
``--worker_mmap_threshold_mb`` fixes the threshold for the worker processes, trading CPU for a
flat memory curve.
"""
from __future__ import annotations

import ctypes
import gc
import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator, Mapping

import grpc
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability import local_job_service
from apache_beam.runners.portability.fn_api_runner import execution, fn_runner, translations, worker_handlers
from apache_beam.runners.worker import data_plane
from apache_beam.transforms.window import GlobalWindow, GlobalWindows
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming

from ..readers import spill
from ..transforms.placement import BY_FILE
from ..util.errors import DEBUG_ENV, UserError
from .prefork import FORKSERVER, WORKER_MODULES, raise_gc_threshold, start_fork_server

LOG = logging.getLogger(__name__)
PIECE_BYTES = 4 << 20  # at most about this much of a stage's input (plus one element) per message

_BEAM_PARTITION: Callable[[Any, int], list[list[bytes]]] = execution.GroupingBuffer.partition


class _Share(list):
    """One worker's share of a :data:`~pipeline.transforms.placement.BY_FILE` GroupByKey's output
    (encoded pieces): ``worker`` is the index of the worker it goes to."""

    worker: int


def _partition_in_pieces(self: execution.GroupingBuffer, n: int) -> list[list[bytes]]:
    """``GroupingBuffer.partition``: every worker's keys as encoded pieces of about PIECE_BYTES; a
    :data:`~pipeline.transforms.placement.BY_FILE` GroupByKey's int key ``i`` in the share of worker
    ``i % n`` (:class:`_Share`), any other key as Beam deals them."""
    if self._grouped_output or not self._windowing.is_default():
        return _BEAM_PARTITION(self, n)
    in_global_window = GlobalWindows.windowed_value(
        None, timestamp=GlobalWindow().max_timestamp(),
        pane_info=PaneInfo(is_first=True, is_last=True, timing=PaneInfoTiming.ON_TIME, index=0,
                           nonspeculative_index=0)).with_value
    coder, key_coder = self._post_grouped_coder.get_impl(), self._key_coder.get_impl()
    by_file = getattr(self, "by_file", False)
    pieces: list[list[bytes]] = [_Share() if by_file else [] for _ in range(n)]
    streams = [create_OutputStream() for _ in range(n)]
    for i, (encoded_key, values) in enumerate(self._table.items()):
        key = key_coder.decode(encoded_key)
        index = _file_index(key) if by_file else None
        worker = index % n if index is not None else i % n
        stream = streams[worker]
        coder.encode_to_stream(in_global_window((key, values)), stream, True)
        if stream.size() >= PIECE_BYTES:
            pieces[worker].append(stream.get())
            streams[worker] = create_OutputStream()
    for worker, stream in enumerate(streams):
        if stream.size() or not pieces[worker]:
            pieces[worker].append(stream.get())
        if by_file:
            pieces[worker].worker = worker
    self._grouped_output = pieces
    self._table.clear()
    return pieces


_PRIMITIVES = FastPrimitivesCoder()


def _file_index(key: Any) -> int | None:
    """The file index a ``BY_FILE`` key holds: an int where the key was typed so, or the bytes of a
    key typed ``Any`` (``--no_pipeline_type_check`` infers no type), which are the SDK's
    ``FastPrimitivesCoder`` encoding, opaque to the runner; None for any other key."""
    if isinstance(key, bytes):
        try:
            key = _PRIMITIVES.decode(key)
        except Exception:  # noqa: BLE001 (not an encoded value: Beam deals it)
            return None
    return key if type(key) is int and key >= 0 else None


_BEAM_GET_BUFFER = execution.BundleContextManager.get_buffer


def _get_buffer_noting_placement(self: execution.BundleContextManager, buffer_id: bytes,
                                 transform_id: str) -> Any:
    """``BundleContextManager.get_buffer``, a GroupByKey's buffer marked ``by_file`` where the
    GroupByKey is annotated :data:`~pipeline.transforms.placement.BY_FILE`."""
    buffer = _BEAM_GET_BUFFER(self, buffer_id, transform_id)
    if isinstance(buffer, execution.GroupingBuffer) and not hasattr(buffer, "by_file"):
        kind, name = translations.split_buffer_id(buffer_id)
        transform = self.execution_context.pipeline_components.transforms.get(name) if kind == "group" else None
        buffer.by_file = transform is not None and BY_FILE in transform.annotations
    return buffer


class _OnWorker:
    """A stage's bundle context for one part of its input, with one worker: the one the part is for."""

    def __init__(self, context: execution.BundleContextManager, worker: int) -> None:
        self._context, self.worker_handlers = context, [context.worker_handlers[worker]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def _send_in_pieces(self: fn_runner.BundleManager, process_bundle_id: str, read_transform_id: str,
                    byte_streams: Iterable[bytes] | None) -> None:
    """``BundleManager._send_input_to_worker``, one message per piece of PIECE_BYTES or more."""
    assert self._worker_handler is not None
    data_out = self._worker_handler.data_conn.output_stream(process_bundle_id, read_transform_id)
    for byte_stream in byte_streams or []:
        data_out.write(byte_stream)
        if data_out.size() >= PIECE_BYTES:
            data_out.flush()
    data_out.close()


_BEAM_PROCESS_BUNDLE = fn_runner.BundleManager.process_bundle


def _holds_nothing(chunks: Iterable[bytes]) -> bool:
    """Whether a share of a stage's input (encoded chunks, or a runner buffer of them) is empty."""
    return not any(chunks)


def _process_bundle_unless_empty(self: fn_runner.BundleManager, inputs: Mapping[str, Iterable[bytes]],
                                 expected_outputs: Any, fired_timers: Mapping[Any, Any],
                                 *args: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
    """``BundleManager.process_bundle``, or, for a share with no element and no timer to fire,
    an empty result without a bundle; a :class:`_Share` on the worker it is for."""
    if not fired_timers and all(map(_holds_nothing, inputs.values())):
        return beam_fn_api_pb2.InstructionResponse(process_bundle=beam_fn_api_pb2.ProcessBundleResponse()), []
    placed = {share.worker for share in inputs.values() if isinstance(share, _Share)}
    if len(placed) == 1 and len(self.bundle_context_manager.worker_handlers) > 1:  # (a manager per part: its own)
        self.bundle_context_manager = _OnWorker(self.bundle_context_manager, placed.pop())
    return _BEAM_PROCESS_BUNDLE(self, inputs, expected_outputs, fired_timers, *args, **kwargs)


_BEAM_CLOSE_ALL = worker_handlers.WorkerHandlerManager.close_all


def _close_all_at_once(self: worker_handlers.WorkerHandlerManager) -> None:
    """``WorkerHandlerManager.close_all``, every worker's control stream ended first, so that the
    workers exit together (Beam's ``ControlConnection.close`` then ends a stream already ended:
    its second end mark is never read)."""
    for handlers in self._cached_handlers.values():
        for handler in set(handlers):
            connection = getattr(handler, "control_conn", None)
            if (isinstance(connection, worker_handlers.ControlConnection)
                    and connection._state == worker_handlers.BeamFnControlServicer.STARTED_STATE):
                connection.push(worker_handlers.BeamFnControlServicer._DONE_MARKER)
    _BEAM_CLOSE_ALL(self)


class WorkerLost(UserError):
    """An SDK worker process ended before the run was done: the run fails with this, not a hang;
    ``interrupted``: by SIGINT (Ctrl-C)."""

    def __init__(self, message: str, interrupted: bool = False) -> None:
        super().__init__(message)
        self.interrupted = interrupted


_BEAM_START_WORKER = worker_handlers.SubprocessSdkWorkerHandler.start_worker
_BEAM_RUN_WORKER = local_job_service.SubprocessSdkWorker.run
_started: dict[str, Any] = {}  # worker id -> its SubprocessSdkWorkerHandler, while its process runs
_lost: list[WorkerLost] = []  # the workers lost in this process's run, in the order their ends were seen


def _start_worker_noted(self: worker_handlers.SubprocessSdkWorkerHandler) -> None:
    """``SubprocessSdkWorkerHandler.start_worker``, the handler noted for :func:`_run_worker_watched`."""
    _started[self.worker_id] = self
    _BEAM_START_WORKER(self)


def _run_worker_watched(self: local_job_service.SubprocessSdkWorker) -> None:
    """``SubprocessSdkWorker.run`` (start the worker process, wait for it to end), where an end with
    an error fails what the runner waits for from that worker (:func:`_lose`)."""
    handler = _started.get(self._worker_id)
    try:
        _BEAM_RUN_WORKER(self)
    except RuntimeError as exc:  # Beam's "Worker subprocess exited with return code N"
        if handler is None:
            raise
        found = re.search(r"return code (-?\d+)", str(exc))
        code = int(found.group(1)) if found else None
        _lost.append(WorkerLost(f"SDK worker {self._worker_id} ended before the run was done: " + _ending(code),
                                interrupted=code in (-signal.SIGINT, 128 + signal.SIGINT)))
        _lose(handler, _lost[-1])
    finally:
        _started.pop(self._worker_id, None)


def _ending(code: int | None) -> str:
    """How a worker process ended, from its return code (a shell gives 128 + N for signal N)."""
    signal_number = -code if code is not None and code < 0 else (code - 128 if code and code > 128 else None)
    if signal_number is None:
        return f"exit code {code}" if code is not None else "an error"
    try:
        name = signal.Signals(signal_number).name
    except ValueError:
        name = f"signal {signal_number}"
    hint = " (the system may have run out of memory: fewer workers, or --worker_mmap_threshold_mb, use less)" \
        if signal_number == signal.SIGKILL else ""
    return f"killed by {name}{hint}"


def _lose(handler: worker_handlers.GrpcWorkerHandler, error: WorkerLost) -> None:
    """Make every wait of the runner on ``handler``'s worker end with ``error``: the instructions sent to
    it (their futures), those sent from now on, and its data (the data channel checks for an error
    every second while it waits). The end of the control stream still goes out when the worker is
    closed: without it, the runner's gRPC thread serving that stream waited for ever, and held the
    failed run's state (its side inputs among it) for as long as the process lived."""
    connection = handler.control_conn

    def push(request: Any) -> Any:
        if request is worker_handlers.BeamFnControlServicer._DONE_MARKER:
            connection._push_queue.put(request)  # ends the runner's side of the stream (its gRPC thread)
            return None
        future = worker_handlers.ControlFuture(request.instruction_id)
        future.abort(error)
        return future

    connection.push = push
    handler.data_conn._exception = error
    for future in list(connection._futures_by_id.values()):
        future.abort(error)


_BEAM_CONTROL_READ = worker_handlers.ControlConnection._read
_BEAM_SET_INPUTS = data_plane._GrpcDataChannel.set_inputs
_BEAM_DATA_CLOSE = data_plane._GrpcDataChannel.close
LOSS_SEEN_S = 5.0
"""How long a worker's broken stream waits for a worker process's end to be seen (:data:`_lost`)."""


def _loss_seen() -> bool:
    """Whether a worker process's end is seen within :data:`LOSS_SEEN_S` (a broken stream and the
    process's end are seen by different threads, in either order)."""
    deadline = time.monotonic() + LOSS_SEEN_S
    while not _lost and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(_lost)


def _read_until_lost(self: worker_handlers.ControlConnection) -> None:
    """``ControlConnection._read`` (a worker's answers, in a thread of their own), ending quietly where
    its stream broke because a worker process ended: the run says that once (:class:`WorkerLost`);
    Beam's thread printed the stream's ``grpc.RpcError`` and a traceback above it."""
    try:
        _BEAM_CONTROL_READ(self)
    except grpc.RpcError:
        if not _loss_seen():
            raise


def _until_lost(elements: Iterable[Any]) -> Iterator[Any]:
    """A worker's data stream, ended where it broke because a worker process ended (as
    :func:`_read_until_lost`; Beam's reader logged the error with a traceback and printed another)."""
    try:
        yield from elements
    except grpc.RpcError:
        if not _loss_seen():
            raise


def _close_after_loss(self: data_plane._GrpcDataChannel) -> None:
    """``_GrpcDataChannel.close``, which raises the channel's error: where that is a lost worker's
    (:func:`_lose`), the run says it once, not again as an error closing the channel. A method of
    the class, not of one channel set where the loss is seen: the runner may be closing that
    channel already, as it closes every worker after the first was lost."""
    try:
        _BEAM_DATA_CLOSE(self)
    except WorkerLost:
        self._closed = True


def _set_inputs_until_lost(self: data_plane._GrpcDataChannel, elements_iterator: Iterable[Any]) -> None:
    """``_GrpcDataChannel.set_inputs`` of a worker's data stream, read through :func:`_until_lost`."""
    _BEAM_SET_INPUTS(self, _until_lost(elements_iterator))


_BEAM_RUN_STAGES = fn_runner.FnApiRunner.run_stages


def _run_stages_or_say_lost(self: fn_runner.FnApiRunner, *args: Any, **kwargs: Any) -> Any:
    """``FnApiRunner.run_stages``; where it fails after an SDK worker was lost, the failure is
    :class:`WorkerLost` (Beam's own, where it saw the loss first, is its data channel's "Channel
    closed prematurely" and a traceback), or ``KeyboardInterrupt`` for a worker that Ctrl-C ended.
    Its end waited for every worker's process: a loss is noted by then. A worker that ended with an error once every stage was done is a warning: the
    run's outputs are whole."""
    _lost.clear()
    try:
        result = _BEAM_RUN_STAGES(self, *args, **kwargs)
    except Exception:
        if _lost and _lost[0].interrupted:  # Ctrl-C, seen by a worker first: the driver's own interruption
            raise KeyboardInterrupt from None
        if _lost:
            raise _lost[0] from None
        raise
    for lost in _lost:  # after every stage was done: as it shut down (a DoFn's teardown, say)
        LOG.warning("%s", str(lost).replace("before the run was done", "with an error as the run ended"))
    return result


WORKER_COMMAND = f"{sys.executable} -m apache_beam.runners.worker.sdk_worker_main"  # fn_runner's, multi_processing
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_fork_workers = False  # set by install(): this run's SDK workers are forked from the fork server
_worker_hold_bytes = 0  # set by install(): what each forked worker may hold for exact dedup's second pass
_step_modules: list[str] = []  # every install()'s steps' worker_modules, for a fork server started later


def _quit_on_interrupt(signum: int, frame: Any) -> None:
    """Ctrl-C in an SDK worker (the terminal interrupts the whole process group): the process ends at
    once, in the middle of a step's document too, without the traceback of each of its threads; the
    driver says it once (:func:`_run_stages_or_say_lost`)."""
    os._exit(128 + signum)


def _run_worker(env: dict[str, str], hold_bytes: int = 0) -> None:
    """An SDK worker forked from the fork server: what ``python -m ...sdk_worker_main`` runs. It holds
    what exact dedup's first pass reads in its memory, up to ``hold_bytes``, for the second pass of
    the same file, which runs here too (:data:`~pipeline.transforms.placement.BY_FILE`)."""
    spill.hold_here(hold_bytes)
    from apache_beam.runners.worker import sdk_worker_main

    signal.signal(signal.SIGINT, _quit_on_interrupt)
    gc.freeze()  # what the fork server imported stays out of this worker's collections (and its pages shared)
    multiprocessing.current_process().daemon = False  # it may start processes (Beam's use_subprocess), as one Beam starts may
    raise_gc_threshold()  # the steps' documents: collections rarer
    os.environ.clear()
    os.environ.update(env)
    threshold = env.get(MMAP_THRESHOLD_ENV)
    if threshold is not None:  # glibc read its environment when the fork server started, maybe without it
        getattr(ctypes.CDLL(None), "mallopt", lambda *_: 0)(M_MMAP_THRESHOLD, int(threshold))
    if os.environ.get(DEBUG_ENV) != "1":
        sys.stderr = _WithoutStepFailures(sys.stderr)
    sdk_worker_main.main(sys.argv)


class _WithoutStepFailures:
    """A worker's standard error without the traceback Beam prints there when a step failed: the run
    ends with that failure as one line (``util.errors.StepFailed``)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.dropped = stream, False

    def write(self, text: str) -> int:
        dropped, self.dropped = self.dropped, "StepFailed: step " in text
        if self.dropped or dropped and text == "\n":  # (print's line end comes as a write of its own)
            return len(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class ForkedWorker:
    """What Beam's ``SubprocessSdkWorker`` uses of ``subprocess.Popen``, for an SDK worker forked
    from the fork server, whose Beam and pipeline modules are imported already, instead of a new
    interpreter that imports them again (about 1.5 s of CPU per worker and run)."""

    def __init__(self, env: dict[str, str], hold_bytes: int = 0) -> None:
        # daemon here (the driver ends what is left of it when it exits), not in the worker (_run_worker)
        self.process = FORKSERVER.Process(target=_run_worker, args=(env, hold_bytes), name="sdk_worker", daemon=True)
        self.process.start()

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self) -> int | None:
        self.process.join()
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()


def _popen(args: Any, **kwargs: Any) -> Any:
    """``subprocess.Popen`` as local_job_service calls it: fn_runner's own worker command is forked."""
    if _fork_workers and args == WORKER_COMMAND and kwargs.get("shell") and set(kwargs) <= {"shell", "env"}:
        return ForkedWorker(kwargs.get("env") or dict(os.environ), _worker_hold_bytes)
    return subprocess.Popen(args, **kwargs)


class WorkerMemoryOptions(PipelineOptions):
    """How the worker processes this run starts allocate memory."""

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        parser.add_argument("--worker_mmap_threshold_mb", type=int, default=None,
                            help="glibc's MALLOC_MMAP_THRESHOLD_ for the worker processes this run starts "
                                 "(DirectRunner multi_processing, a Dask LocalCluster): allocations of this many "
                                 "MB or more get memory of their own, and freed memory goes back to the system at "
                                 "once, so a worker's memory stays flat as the corpus grows, at some CPU cost "
                                 "(BENCHMARKS.md: 4 gave 20-25 %% less worker memory at 8x, 5-16 %% more time). "
                                 "Default: glibc's adaptive threshold")


MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
_threshold_set: tuple[str | None, str] | None = None
"""(the variable before, the value put) where :func:`_set_worker_mmap_threshold` put one."""


def _set_worker_mmap_threshold(threshold_mb: int | None) -> None:
    """``MALLOC_MMAP_THRESHOLD_`` for the worker processes started from now on: ``threshold_mb``, or
    with None, as it was before an earlier run of this process set it (unless changed since)."""
    global _threshold_set
    if threshold_mb is not None:
        if threshold_mb < 0:
            raise UserError(f"--worker_mmap_threshold_mb={threshold_mb}: expected 0 or more MB")
        before = _threshold_set[0] if _threshold_set else os.environ.get(MMAP_THRESHOLD_ENV)
        _threshold_set = (before, str(threshold_mb << 20))
        os.environ[MMAP_THRESHOLD_ENV] = _threshold_set[1]
    elif _threshold_set is not None:
        (before, put), _threshold_set = _threshold_set, None
        if os.environ.get(MMAP_THRESHOLD_ENV) == put:
            if before is None:
                del os.environ[MMAP_THRESHOLD_ENV]
            else:
                os.environ[MMAP_THRESHOLD_ENV] = before


def install(options: PipelineOptions, modules: Iterable[str] = ()) -> None:
    """Put the overrides in place (idempotent); every FnApiRunner of this process uses them. With
    ``--worker_mmap_threshold_mb``, the worker processes started from now on get that threshold
    (the driver, already running, keeps its own); without it, what the environment had before. The fork server imports ``modules`` (the steps'
    ``worker_modules``) besides Beam's worker and the graph: the first call starts it, unless
    ``pipeline run`` did (``prefork.start_for_run``).

    Workers are forked only where multiprocessing can prepare them without running the driver's
    script again (``prefork.main_is_guarded``); otherwise each starts as Beam starts it. The fork
    server lives as long as the driver process, so later runs of that process fork at once."""
    execution.GroupingBuffer.partition = _partition_in_pieces
    execution.BundleContextManager.get_buffer = _get_buffer_noting_placement
    fn_runner.BundleManager._send_input_to_worker = _send_in_pieces
    fn_runner.BundleManager.process_bundle = _process_bundle_unless_empty
    worker_handlers.WorkerHandlerManager.close_all = _close_all_at_once
    worker_handlers.SubprocessSdkWorkerHandler.start_worker = _start_worker_noted
    local_job_service.SubprocessSdkWorker.run = _run_worker_watched
    worker_handlers.ControlConnection._read = _read_until_lost
    data_plane._GrpcDataChannel.set_inputs = _set_inputs_until_lost
    data_plane._GrpcDataChannel.close = _close_after_loss
    fn_runner.FnApiRunner.run_stages = _run_stages_or_say_lost
    local_job_service.subprocess = SimpleNamespace(Popen=_popen)
    global _fork_workers, _step_modules, _worker_hold_bytes
    _step_modules = list(dict.fromkeys([*_step_modules, *modules]))  # a later call without them keeps them
    direct = options.view_as(DirectOptions)
    multi_processing = direct.direct_running_mode == "multi_processing"
    _fork_workers = multi_processing and start_fork_server(preloaded())  # it imports meanwhile
    workers = direct.direct_num_workers or os.cpu_count() or 1  # (0: Beam's one per core)
    _worker_hold_bytes = spill.hold_bytes() // workers if _fork_workers else 0
    # after the start: glibc reads the variable once, as a process starts, and the fork server serves every later run
    _set_worker_mmap_threshold(options.view_as(WorkerMemoryOptions).worker_mmap_threshold_mb)


def preloaded() -> list[str]:
    """What a fork server imports before forking workers: Beam's worker, the graph, and the
    worker modules of the steps :func:`install` was given."""
    return [*WORKER_MODULES, *_step_modules]
