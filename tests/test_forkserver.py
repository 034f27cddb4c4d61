"""The FnApiRunner overrides (pipeline/runners/forkserver.py): stage inputs in pieces, the same bytes.

Run on Beam's own GroupingBuffer and in-memory data channel: the pieces must concatenate to
exactly what Beam's unpatched code sends each worker, and each message must stay near
PIECE_BYTES. That whole runs write the same files with the overrides is checked by the engine
tests (DirectRunner 1 and 2 workers, PortableRunner, against one reference).
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.portability import common_urns
from apache_beam.runners.portability.fn_api_runner import execution, fn_runner, worker_handlers
from apache_beam.runners.worker.data_plane import InMemoryDataChannel
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import core
from apache_beam.transforms.window import GlobalWindows

from conftest import ROOT
from pipeline.runners import forkserver, prefork
from pipeline.runners.options import direct_pipeline, make_runner, pipeline_options
from pipeline.transforms import placement
from pipeline.util.errors import UserError

PIECE = 10_000  # bytes: small, so a few hundred kB of input makes many pieces


def grouping_buffer(pairs: list[tuple[str, bytes]]) -> execution.GroupingBuffer:
    element = coders.TupleCoder([coders.StrUtf8Coder(), coders.BytesCoder()])
    grouped = coders.TupleCoder([coders.StrUtf8Coder(), coders.IterableCoder(coders.BytesCoder())])
    pre = coders.WindowedValueCoder(element)
    buffer = execution.GroupingBuffer(pre, coders.WindowedValueCoder(grouped), core.Windowing(GlobalWindows()))
    impl = pre.get_impl()
    buffer.append(b"".join(impl.encode_nested(GlobalWindows.windowed_value(pair)) for pair in pairs))
    return buffer


def pairs(n: int) -> list[tuple[str, bytes]]:
    """``n`` values over n // 3 keys, some larger than a piece."""
    return [(f"key-{i % (n // 3)}", bytes([i % 251]) * (PIECE * 2 if i % 97 == 0 else 200 + i % 50)) for i in range(n)]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_grouped_pieces_are_beams_bytes_cut_between_elements(monkeypatch, workers):
    monkeypatch.setattr(forkserver, "PIECE_BYTES", PIECE)
    data = pairs(3000)
    beams = forkserver._BEAM_PARTITION(grouping_buffer(data), workers)
    ours = forkserver._partition_in_pieces(grouping_buffer(data), workers)
    assert len(ours) == workers
    post = grouping_buffer([])._post_grouped_coder.get_impl()
    largest = max(len(v) for _, v in data) * 3 + 1000  # one key's values, encoded, at most
    for beam_share, pieces in zip(beams, ours):
        assert b"".join(pieces) == b"".join(beam_share)  # same elements, same order, same worker
        assert len(pieces) > 5
        for piece in pieces:
            assert len(piece) < PIECE + largest
            stream = create_InputStream(piece)
            while stream.size() > 0:  # every piece decodes on its own: cut between elements
                post.decode_from_stream(stream, True)


def test_an_empty_group_still_gives_every_worker_one_piece(monkeypatch):
    monkeypatch.setattr(forkserver, "PIECE_BYTES", PIECE)
    assert forkserver._partition_in_pieces(grouping_buffer([]), 2) == forkserver._BEAM_PARTITION(grouping_buffer([]), 2)


def test_each_piece_is_a_message_of_its_own(monkeypatch):
    monkeypatch.setattr(forkserver, "PIECE_BYTES", PIECE)
    channel = InMemoryDataChannel()
    manager = SimpleNamespace(_worker_handler=SimpleNamespace(data_conn=channel))
    chunks = [bytes([i]) * (3000 + 500 * i) for i in range(20)]
    forkserver._send_in_pieces(manager, "bundle-1", "read", chunks)
    messages = [m.data for m in channel.inverse()._inputs]
    assert b"".join(messages) == b"".join(chunks)
    assert len(messages) > 5
    assert max(len(m) for m in messages) < PIECE + max(len(c) for c in chunks)


def test_every_local_run_uses_the_overrides(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    make_runner(pipeline_options("DirectRunner", []))
    assert execution.GroupingBuffer.partition is forkserver._partition_in_pieces
    assert fn_runner.BundleManager._send_input_to_worker is forkserver._send_in_pieces
    assert fn_runner.BundleManager.process_bundle is forkserver._process_bundle_unless_empty
    assert worker_handlers.WorkerHandlerManager.close_all is forkserver._close_all_at_once
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ  # glibc's own adaptive threshold unless asked


def test_worker_mmap_threshold_reaches_the_workers_environment(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    make_runner(pipeline_options("DirectRunner", ["--worker_mmap_threshold_mb=4"]))
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(4 << 20)  # what worker processes started now inherit
    with pytest.raises(UserError, match="--worker_mmap_threshold_mb=-1"):
        make_runner(pipeline_options("DirectRunner", ["--worker_mmap_threshold_mb=-1"]))
    make_runner(pipeline_options("DirectRunner", []))
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ  # a later run without the flag: glibc's own again


def test_a_run_without_the_threshold_flag_puts_back_what_the_environment_had(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # the user's own
    make_runner(pipeline_options("DirectRunner", ["--worker_mmap_threshold_mb=4"]))
    make_runner(pipeline_options("DirectRunner", ["--worker_mmap_threshold_mb=8"]))
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(8 << 20)
    make_runner(pipeline_options("DirectRunner", []))
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == "131072"


def test_a_later_install_without_step_modules_keeps_those_for_the_fork_server():
    forkserver.install(pipeline_options("DirectRunner", []), ["fasttext"])  # as run_corpus does, then make_runner
    make_runner(pipeline_options("DirectRunner", []))
    assert "fasttext" in forkserver.preloaded()


class Bundles(beam.DoFn):
    """Leaves a file in ``folder`` per bundle it starts, named by its label."""

    def __init__(self, folder: str, label: str) -> None:
        self.folder, self.label = folder, label

    def start_bundle(self) -> None:
        with open(os.path.join(self.folder, f"{self.label}.{os.getpid()}.{id(self)}.{os.urandom(4).hex()}"), "w"):
            pass

    def process(self, element: object, seen: list | None = None) -> list:
        return [(element, seen)]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_with_no_input_gets_no_bundle(tmp_path, workers):
    """Beam gives every worker a bundle of every stage; here only a worker with elements gets one:
    one element -> one bundle at any worker count, none -> none; the consumers of the outputs a
    stage did not write (a side input among them) still see them, empty."""
    with direct_pipeline(f"--direct_num_workers={workers}") as p:
        one = p | "One" >> beam.Create([("a", 1)]) | "Spread" >> beam.Reshuffle()
        none = one | "Drop" >> beam.Filter(lambda _: False) | "Group" >> beam.GroupByKey()
        ones = one | "OfOne" >> beam.ParDo(Bundles(str(tmp_path), "one"), beam.pvalue.AsList(none))
        nones = none | "OfNone" >> beam.ParDo(Bundles(str(tmp_path), "none"))
        assert_that(ones, equal_to([(("a", 1), [])]), label="One")
        assert_that(nones | "Count" >> beam.combiners.Count.Globally(), equal_to([0]), label="None")
    assert sorted(name.split(".")[0] for name in os.listdir(tmp_path)) == ["one"]


def parent_command(_: int) -> str:
    """The command line of the process that started this one (in an SDK worker: its parent)."""
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as stream:
        return stream.read().replace(b"\0", b" ").decode()


@pytest.mark.skipif(not os.path.exists("/proc/self/cmdline"), reason="needs /proc to see a worker's parent")
def test_multi_processing_workers_are_forked_from_the_fork_server():
    with direct_pipeline("--direct_num_workers=2", "--direct_running_mode=multi_processing") as p:
        parents = p | beam.Create(range(8)) | beam.Reshuffle() | beam.Map(parent_command)
        assert_that(parents | beam.Distinct(), equal_to([mock.ANY]))  # the workers share one parent ...
        assert_that(parents | "Forked" >> beam.Map(lambda cmd: "multiprocessing.forkserver" in cmd),
                    equal_to([True] * 8), label="FromTheForkServer")  # ... the fork server, not a shell
        frozen = parents | "Frozen" >> beam.Map(lambda _: gc.get_freeze_count() > 0)
        assert_that(frozen, equal_to([True] * 8), label="Frozen")  # the fork server's objects out of its collections
        collected = parents | "Threshold" >> beam.Map(lambda _: gc.get_threshold()[0] >= prefork.GC_THRESHOLD)
        assert_that(collected, equal_to([True] * 8), label="Threshold")  # and collections rarer
        pools = parents | "ArrowPool" >> beam.Map(lambda _: __import__("pyarrow").default_memory_pool().backend_name)
        pool = os.environ.get("ARROW_DEFAULT_MEMORY_POOL", "(not set)")  # "system" as `import pipeline` set it, or the user's
        assert_that(pools, equal_to([pool] * 8), label="System")
        holding = parents | "Hold" >> beam.Map(
            lambda _: __import__("pipeline.readers.spill").readers.spill._held_here > 0)
        assert_that(holding, equal_to([True] * 8), label="HoldSpills")  # each file's two passes run here


def with_pid(item: tuple[int, Any]) -> tuple[int, int]:
    return item[0], os.getpid()


def where_each_ran(placed: list[tuple[int, int, int]]) -> None:
    """(file, pid of its first stage, pid of its second): both the same, files split by parity."""
    assert all(first == second for _, first, second in placed), placed
    by_parity = {(index % 2, pid) for index, pid, _ in placed}
    assert len(by_parity) == 2 and len({pid for _, pid in by_parity}) == 2, placed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("typed", [True, False])
def test_a_files_two_stages_run_on_the_worker_its_index_names(typed):
    """The stages that read a BY_FILE GroupByKey run key i on worker i % n: file i's stage after
    Distribute and its stage after a later join by file (behind a barrier every file's first stage
    must pass) run in one process, the files split between the workers by parity; also where the
    join's inputs are typed Any (as with --no_pipeline_type_check), whose keys reach the runner as
    encoded bytes. Beam deals keys to workers in the order they reached the runner, and a stage's
    shares to its workers by a counter over every bundle of the run."""
    with direct_pipeline("--direct_num_workers=2", "--direct_running_mode=multi_processing") as p:
        files = (p | beam.Create([(i, f"file-{i}") for i in range(16)], reshuffle=False)
                 | "Distribute" >> placement.Distribute())
        first = files | "First" >> beam.Map(with_pid).with_output_types(tuple[int, int] if typed else Any)
        everyone = beam.pvalue.AsSingleton(first | beam.combiners.Count.Globally())
        later = files | "AfterAll" >> beam.Map(lambda item, _: item, everyone).with_output_types(
            tuple[int, str] if typed else Any)
        with placement.by_file(p):
            joined = {"first": first, "path": later} | "JoinByFile" >> beam.CoGroupByKey()
        placed = joined | "Second" >> beam.Map(lambda kv: (kv[0], kv[1]["first"][0], os.getpid()))
        assert_that(placed | beam.combiners.ToList(), lambda lists: where_each_ran(lists[0]))


def test_the_graphs_joins_by_file_are_placed_and_keyed_by_an_int():
    """In the corpus graph the GroupByKeys of Distribute and of the dedup pass's join by file are
    annotated BY_FILE, no other is, and their keys reach the runner as ints (a key typed Any is
    pickled, and the runner sees bytes it cannot place)."""
    from pipeline.config import load_config
    from pipeline.graph import build_pipeline, build_steps

    cfg = load_config("configs/corpus/sample.yaml", {"input": ["x.wet.gz"], "output": "/tmp/unused", "runner": None},
                      ["steps=[dedup, lid, near_dedup]"])
    p = beam.Pipeline()
    build_pipeline(p, cfg, ["x.wet.gz"], build_steps(cfg, 1))
    proto = p.to_runner_api()
    components = proto.components
    placed = {t.unique_name: t for t in components.transforms.values()
              if t.spec.urn == common_urns.primitives.GROUP_BY_KEY.urn and placement.BY_FILE in t.annotations}
    assert sorted(placed) == ["Distribute/ByFile", "Read/JoinByFile/CoGroupByKeyImpl/GroupByKey"]
    for transform in placed.values():
        [pcoll] = transform.inputs.values()
        pair = components.coders[components.pcollections[pcoll].coder_id]
        key_coder = components.coders[pair.component_coder_ids[0]]
        assert key_coder.spec.urn == common_urns.coders.VARINT.urn, transform.unique_name


@pytest.mark.parametrize("env, pool", [({}, "system"), ({"ARROW_DEFAULT_MEMORY_POOL": ""}, "system"),
                                       ({"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}, "mimalloc")])
def test_importing_the_package_makes_glibc_arrows_pool_unless_the_user_chose(env, pool):
    script = "import pipeline, pyarrow; print(pyarrow.default_memory_pool().backend_name)"
    environ = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"} | env
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=environ)
    assert done.stdout.split() == [pool], done.stderr


def test_the_collector_threshold_is_raised_never_lowered():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert prefork.raise_gc_threshold() == (700, 10, 10)
        assert gc.get_threshold() == (prefork.GC_THRESHOLD, 10, 10)
        gc.set_threshold(prefork.GC_THRESHOLD * 2, 5, 5)
        prefork.raise_gc_threshold()
        assert gc.get_threshold() == (prefork.GC_THRESHOLD * 2, 5, 5)
    finally:
        gc.set_threshold(*before)


def test_other_commands_still_start_as_processes():
    process = forkserver._popen("exit 3", shell=True)
    assert isinstance(process, subprocess.Popen) and process.wait(timeout=30) == 3


def test_every_worker_is_told_the_work_is_done_before_the_first_is_waited_for(monkeypatch):
    """close_all ends the control stream of every started worker, then Beam closes them one by one
    (each close waits for its worker to exit): the workers exit together."""
    done = worker_handlers.BeamFnControlServicer._DONE_MARKER
    started = [worker_handlers.ControlConnection() for _ in range(3)]
    for connection in started:
        connection._state = worker_handlers.BeamFnControlServicer.STARTED_STATE
    unstarted = worker_handlers.ControlConnection()  # a worker that never connected: Beam leaves it alone too

    class Handler:  # what close_all uses of a worker handler (hashable, as Beam's are)
        def __init__(self, control_conn: object = None) -> None:
            self.control_conn = control_conn

    manager = SimpleNamespace(_cached_handlers={"env": [Handler(c) for c in (*started, unstarted)],
                                                "embedded": [Handler()]})
    queued = []
    monkeypatch.setattr(forkserver, "_BEAM_CLOSE_ALL", lambda self: queued.append(
        [c._push_queue.qsize() for c in (*started, unstarted)]))
    forkserver._close_all_at_once(manager)
    assert queued == [[1, 1, 1, 0]] and all(c.get_req() is done for c in started)


def test_a_forked_worker_reports_its_exit_like_a_process(monkeypatch):
    monkeypatch.setattr(forkserver, "_fork_workers", True)
    worker = forkserver._popen(forkserver.WORKER_COMMAND, shell=True, env={"PATH": os.environ["PATH"]})
    assert isinstance(worker, forkserver.ForkedWorker)
    assert worker.wait() == 1 and worker.poll() == worker.returncode == 1  # no control address: the harness fails


@pytest.mark.parametrize(("spec", "source", "guarded"), [
    ("pipeline.__main__", None, True),  # python -m pipeline: multiprocessing does not import it again
    (None, None, True),  # python -c
    (None, 'import sys\n\nif __name__ == "__main__":\n    sys.exit(0)\n', True),
    (None, "import sys\nsys.exit(0)\n", False),  # a script that would run again in every worker
    ("tool", "run()\n", False),  # python -m tool, unguarded
    (None, 'import sys\nsys.path.insert(0, ".")\nROOT = 1\n\nif __name__ == "__main__":\n    run()\n', True),
    (None, 'print("working")\nrun()\n\nif __name__ == "__main__":\n    other()\n', False),  # guards something else
    (None, 'for part in parts:\n    run(part)\n\nif __name__ == "__main__":\n    other()\n', False),
    (None, 'try:\n    import fast\nexcept ImportError:\n    fast = None\n\nif __name__ == "__main__":\n    run()\n', True),
    (None, "def broken(:\n", False),
])
def test_only_a_guarded_main_lets_workers_fork(tmp_path, spec, source, guarded):
    main = ModuleType("__main__")
    main.__spec__ = SimpleNamespace(name=spec) if spec else None
    if source is not None:
        main.__file__ = str(tmp_path / "main.py")
        (tmp_path / "main.py").write_text(source)
    assert prefork.main_is_guarded(main) is guarded


@pytest.mark.parametrize("runner, flags, forks", [
    ("DirectRunner", ["--direct_num_workers=2", "--direct_running_mode=multi_processing"], True),
    ("DirectRunner", ["--direct_running_mode", "multi_processing"], True),
    ("DirectRunner", ["--direct_running_mode=multi_threading"], False),
    ("DirectRunner", [], False),  # Beam's default: in_memory
    ("DaskRunner", ["--direct_running_mode=multi_processing"], False),
    ("DirectRunner", ["--runner=PortableRunner", "--direct_running_mode=multi_processing"], False),
])
def test_the_flags_say_whether_a_run_forks_its_workers(runner, flags, forks):
    assert prefork.forks_workers(runner, flags) is forks


def test_pipeline_run_starts_the_fork_server_before_importing_beam():
    """``pipeline run`` starts the fork server, with its steps' worker modules, right after reading
    the config, so that it imports Beam while the driver does (a new process: the fork server is
    one per process, and Beam must not be imported yet)."""
    script = """
import sys
from pipeline.runners import prefork
def start(modules):
    sys.exit(f"{'apache_beam' in sys.modules} {' '.join(modules)}")
prefork.start_fork_server = start
from pipeline.__main__ import main
main(["run", "--config", "configs/corpus/sample.yaml", "--input", "tests/data/sample/wet/*.gz", "--output", "unused",
      "--set", "steps=[dedup, lid]", "--set", "beam_options=[--direct_num_workers=2, --direct_running_mode=multi_processing]"])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.stderr.split() == ["False", *prefork.WORKER_MODULES, "fasttext"]


def test_a_bundle_ends_without_waiting_for_the_state_sampler():
    """The graph module (which the driver and the DirectRunner's forked workers import) sets Beam's state sampler to
    STATE_SAMPLING_MS: stopping a sampler waits for at most that period of its thread's sleep (with
    Beam's 200 ms, a sampler stopped 0.3 s in sleeps periods of about 64 ms by then, 200 ms from 1 s on)."""
    import time

    from apache_beam.runners.worker import statesampler
    from apache_beam.utils.counters import CounterFactory

    from pipeline import graph

    sampler = statesampler.StateSampler("test", CounterFactory())
    assert sampler.sampling_period_ms == graph.STATE_SAMPLING_MS == 10
    sampler.start()
    time.sleep(0.3)  # the period grows 1.2x a sample from 1 ms: 10 ms after 13 samples
    began = time.perf_counter()
    sampler.stop()
    assert time.perf_counter() - began < 0.05


class KillOwnProcess(beam.DoFn):
    """Ends the SDK worker it runs in as the kernel's out-of-memory killer would (never the test's process)."""

    def __init__(self, test_pid: int) -> None:
        self.test_pid = test_pid

    def process(self, element: int) -> list[int]:
        if os.getpid() != self.test_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        return [element]


def serving_control_streams() -> int:
    """Threads of this process in the runner's side of a worker's control stream."""
    return sum(any(frame.name == "Control" and "worker_handlers" in frame.filename
                   for frame in traceback.extract_stack(top)) for top in sys._current_frames().values())


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_run_fails_the_run_with_one_line_rather_than_a_hang(capfd, caplog):
    """Beam's runner waited for a killed worker's answers for ever (its thread that waited for the
    process raised, and nothing read that). Nor do Beam's threads that read the worker's streams,
    nor its closing of the worker, add their errors and tracebacks to the one line. The lost
    worker's control stream is ended all the same: no thread is left serving it."""
    serving = serving_control_streams()
    with pytest.raises(forkserver.WorkerLost, match=r"ended before the run was done: killed by SIGKILL \(.*memory"):
        with direct_pipeline("--direct_num_workers=2", "--direct_running_mode=multi_processing") as p:
            _ = p | beam.Create(range(8)) | beam.Reshuffle() | beam.ParDo(KillOwnProcess(os.getpid()))
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
    assert "Traceback" not in capfd.readouterr().err
    deadline = time.monotonic() + 10
    while serving_control_streams() > serving and time.monotonic() < deadline:
        time.sleep(0.1)
    assert serving_control_streams() <= serving


class ExitInTeardown(beam.DoFn):
    """Ends the SDK worker it runs in with exit code 3 as the worker shuts down (never the test's process)."""

    def __init__(self, test_pid: int) -> None:
        self.test_pid = test_pid

    def process(self, element: int) -> list[int]:
        return [element]

    def teardown(self) -> None:
        if os.getpid() != self.test_pid:
            os._exit(3)


@pytest.mark.timeout(300)
def test_a_worker_that_fails_once_the_work_is_done_is_a_warning(caplog):
    with direct_pipeline("--direct_num_workers=2", "--direct_running_mode=multi_processing") as p:
        _ = p | beam.Create(range(8)) | beam.Reshuffle() | beam.ParDo(ExitInTeardown(os.getpid()))
    said = [record.getMessage() for record in caplog.records if record.name == "pipeline.runners.forkserver"]
    assert said and all(message.endswith("ended with an error as the run ended: exit code 3") for message in said)


def square(x: int) -> int:
    return x * x


@pytest.mark.timeout(300)
def test_a_forked_worker_may_start_processes_of_its_own():
    """Beam's ``use_subprocess`` runs a transform in a process pool of the worker's; a daemonic
    process may not start one (multiprocessing's rule), as a worker Beam starts itself is not."""
    with direct_pipeline("--direct_num_workers=2", "--direct_running_mode=multi_processing") as p:
        good, _ = (p | beam.Create([1, 2, 3]) | beam.Reshuffle()
                   | beam.Map(square).with_exception_handling(use_subprocess=True))
        assert_that(good, equal_to([1, 4, 9]))


@pytest.mark.timeout(300)
def test_a_worker_that_cannot_start_fails_the_run_with_one_line_rather_than_a_hang(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "not a number")  # the forked worker's int() of it raises
    with pytest.raises(forkserver.WorkerLost, match="ended before the run was done: exit code 1"):
        with direct_pipeline("--direct_num_workers=2", "--direct_running_mode=multi_processing") as p:
            _ = p | beam.Create(range(8)) | beam.Reshuffle() | beam.Map(lambda x: x)


@pytest.mark.parametrize(("code", "said"), [
    (1, "exit code 1"), (-9, "killed by SIGKILL (the system may have run out of memory"),
    (137, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (None, "an error"),
])
def test_a_lost_workers_end_is_said_from_its_return_code(code, said):
    assert forkserver._ending(code).startswith(said)


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs /proc to read the fork server's environment")
def test_the_fork_server_starts_without_a_runs_mmap_threshold():
    """glibc reads MALLOC_MMAP_THRESHOLD_ once, as a process starts: a fork server started with one
    run's threshold gave it to every later run's workers, the flag or not."""
    script = ("import multiprocessing.forkserver as f\n"
              "from pipeline.runners import forkserver\n"
              "from pipeline.runners.options import pipeline_options\n"
              "forkserver.install(pipeline_options('DirectRunner', ['--direct_running_mode=multi_processing',"
              " '--worker_mmap_threshold_mb=4']))\n"
              "print(f._forkserver._forkserver_pid, flush=True)\ninput()\n")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        with open(f"/proc/{pid}/environ", "rb") as stream:
            assert b"MALLOC_MMAP_THRESHOLD_=" not in stream.read()
    finally:
        proc.communicate("\n", timeout=60)
