"""The same graph on every engine, with the same bytes: DirectRunner, DaskRunner on clusters the
tests start (a LocalCluster; a `dask scheduler` and `dask worker` processes, one of them killed
mid-run) and Beam's portable job API (LOOPBACK; EXTERNAL SDK worker processes). Plus one clear
line for every engine mistake."""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindows
from conftest import ROOT, free_port, gz, wait_for_port, warc_record
from reference_data import near_copy

from pipeline.__main__ import main
from pipeline.output.layout import RUN_FILE
from pipeline.output.shards import read_shard
from pipeline.runners.options import direct_pipeline
from pipeline.util.errors import UserError

PY = Path(sys.executable)
COMPARED = ("stats.json", "sampling.json")
BUILT = pytest.mark.skipif(not (PY.parent.parent / "beam-job-servers").exists(),
                           reason="Beam's job servers not built (workflows/setup.sh needs java and mvn)")
PRISM_BUILT = pytest.mark.skipif(not (PY.parent.parent / "beam-prism" / "prism").exists(),
                                 reason="Beam's Prism runner not built (workflows/setup.sh needs go)")
pytestmark = pytest.mark.timeout(600)


def output_digests(out: Path) -> dict[str, str]:
    """sha1 of every file a run wrote but run.json (which names the runner and the time)."""
    return {str(p.relative_to(out)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != RUN_FILE}


def run(config: list[str], out: Path, *engine: str) -> dict[str, str]:
    assert main(["run", "--no-progress", *config, "--output", str(out), *engine]) == 0
    digests = output_digests(out)
    assert set(COMPARED) <= set(digests) and any(k.startswith("lang=") for k in digests)
    return digests


def planted_corpus(sample: Path, corpus: Path, out: Path) -> Path:
    """The bundled sample plus two WET files of planted duplicates of documents the pipeline kept
    from it (``corpus``): copied whole (every paragraph an exact duplicate across files) and with a
    few characters changed in every paragraph (:func:`near_copy`),
    so that both dedup stages cross files, and so workers."""
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted((sample / "wet").glob("*.warc.wet.gz")):
        shutil.copy(f, out / f.name)
    kept = [row for p in sorted(corpus.glob("lang=*/bucket=*/part-*.arrow")) for row in read_shard(str(p)).to_pylist()]
    long = [row["text"] for row in kept if len(row["text"]) > 1500]
    for n, (name, change) in enumerate((("planted-exact", False), ("planted-near", True))):
        records = []
        for i, text in enumerate(long[n::7][:30]):
            if change:
                text = near_copy(text)
            records.append(gz(warc_record(text.encode("utf-8"), uri=f"https://planted.example/{name}/{i}",
                                          record_id=f"<urn:uuid:{n:04d}{i:04d}-0000-0000-0000-000000000000>")))
        (out / f"{name}.warc.wet.gz").write_bytes(b"".join(records))
    return out


def test_planted_duplicates_cross_files(planted):
    import json

    stats = json.loads((planted["root"] / "direct" / "stats.json").read_text())
    counters = stats["counters"]
    assert counters["dedup"]["all_paragraphs_duplicated"] >= 254 + 2 * 30  # the sample's, the copies and originals
    assert counters["near_dedup"]["near_duplicate"] >= 25
    assert set(counters["perplexity"]) >= {"documents_out"}
    buckets = {b for lang in stats["languages"].values() for b in lang["buckets"]}
    assert {"head", "middle", "tail"} <= buckets


def test_dask_local_cluster_writes_the_direct_runner_bytes(planted, tmp_path):
    assert run(planted["config"], tmp_path, "--runner", "DaskRunner", "--dask_num_workers", "2") == planted["reference"]


def test_portable_loopback_writes_the_direct_runner_bytes(planted, tmp_path):
    assert run(planted["config"], tmp_path, "--runner", "PortableRunner", "--job_endpoint", "embed",
               "--environment_type", "LOOPBACK") == planted["reference"]


def test_a_portable_run_leaves_nothing_in_the_temporary_folder(sample, tmp_path):
    """Beam's portable runners leave two or three folders in the temporary folder per run (the SDK's
    dependency list, the embedded job service's staging folder): a run keeps them in a folder of its
    process, removed at exit. Beam's requirements cache, a cache meant to last, stays."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run([str(PY), "-m", "pipeline", "run", "--no-progress", "--input", str(sample / "wet" / "*.gz"),
                           "--output", str(tmp_path / "out"), "--runner", "PortableRunner", "--job_endpoint=embed",
                           "--environment_type=LOOPBACK"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(temp)})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "stats.json").is_file()
    assert sorted(p.name for p in temp.iterdir()) == ["beam-requirements-cache"]


@PRISM_BUILT
def test_prism_writes_the_direct_runner_bytes(planted, tmp_path, monkeypatch):
    """Beam's Prism runner, the binary set-up built (HOME moved: no cached or downloaded copy).
    Beam keeps one Prism server per process, made by the first run that asked: here one with no
    location, as Beam's own DirectRunner leaves it (the full suite failed so)."""
    from apache_beam.runners.portability.job_server import StopOnExitJobServer
    from apache_beam.runners.portability.prism_runner import PrismJobServer, PrismRunner

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    stale = PrismRunner.shared_handle.acquire(lambda: StopOnExitJobServer(PrismJobServer(PipelineOptions([]))))
    assert run(planted["config"], tmp_path / "out", "--runner", "PrismRunner") == planted["reference"]
    del stale


def test_a_graph_of_ones_own_on_the_direct_runner_never_asks_for_prism(monkeypatch, tmp_path):
    """``direct_pipeline`` (tests' and benchmarks' own graphs) runs as ``pipeline run`` does. Beam's
    own DirectRunner first asks for a Prism job server, which downloads Prism from GitHub and
    leaves a ``beam-temp*`` folder behind when that fails: the second graph shows that this test
    sees the ask (and leaves Beam's temporary folders in the test's own)."""
    from apache_beam.runners.portability.prism_runner import PrismRunner

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    asked = []

    def refuse(self, options):
        asked.append(options)
        raise RuntimeError("no Prism here")

    monkeypatch.setattr(PrismRunner, "default_job_server", refuse)
    for label, make in (("ours", direct_pipeline), ("Beam's", lambda: beam.Pipeline("DirectRunner"))):
        with make() as p:
            assert_that(p | beam.Create([1, 2]) | beam.Map(lambda x: 2 * x), equal_to([2, 4]))
        assert len(asked) == (label == "Beam's"), f"{label} DirectRunner: {len(asked)} Prism job server(s) asked for"
    with pytest.raises(UserError, match="direct_pipeline runs on the DirectRunner; '--runner=PrismRunner' asks"):
        direct_pipeline("--runner=PrismRunner")


class DaskCluster:
    """`dask scheduler` and `dask worker` processes (no nanny: a killed worker stays dead) on 127.0.0.1."""

    def __init__(self, root: Path, workers: int) -> None:
        self.file = root / "scheduler.json"
        env = {**os.environ, "PATH": f"{PY.parent}{os.pathsep}{os.environ['PATH']}"}
        self.procs = [subprocess.Popen([str(PY.parent / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                                        "--no-dashboard", "--scheduler-file", str(self.file)],
                                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        for _ in range(workers):
            self.procs.append(subprocess.Popen(
                [str(PY.parent / "dask"), "worker", "--scheduler-file", str(self.file), "--nthreads", "1",
                 "--no-nanny", "--host", "127.0.0.1", "--no-dashboard"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from dask.distributed import Client

        deadline = time.monotonic() + 60
        while not self.file.exists():
            assert time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.2)
        self.client = Client(scheduler_file=str(self.file), timeout=30)
        if workers:
            self.client.wait_for_workers(workers, timeout=60)

    def stop(self) -> None:
        self.client.close()
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=30)


def test_dask_cluster_survives_a_killed_worker_with_the_same_bytes(planted, tmp_path):
    """A worker SIGKILLed while it reads a file: the scheduler redoes its work on the other worker,
    and the output is byte-identical to an undisturbed run (sinks are idempotent, leftovers removed)."""
    cluster = DaskCluster(tmp_path, workers=2)
    pids = cluster.client.run(os.getpid)
    killed: list[int] = []

    def kill_a_reader() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for address, keys in cluster.client.processing().items():
                if any("JoinByFile" in str(key) for key in keys):  # the stage that reads files to the end
                    os.kill(pids[address], signal.SIGKILL)
                    killed.append(pids[address])
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_reader)
    try:
        killer.start()
        digests = run(planted["config"], tmp_path / "out", "--runner", "DaskRunner",
                      "--dask_scheduler_file", str(tmp_path / "scheduler.json"), "--temp_location", str(tmp_path / "tmp"))
        killer.join()
        assert killed, "no worker was reading when the job ran"
        assert len(cluster.client.scheduler_info()["workers"]) == 1
        assert digests == planted["reference"]
    finally:
        cluster.stop()


def test_a_task_that_kills_every_worker_running_it_is_one_line(tmp_path, caplog):
    """A task whose worker dies each time it runs it (out of memory, say): after Dask's attempts,
    one line naming the task and its stage and the likely cause, the task folder kept (`pipeline
    run` says that `--resume` continues it); not the scheduler's logs of every task the lost workers held."""
    from pipeline.runners import ledger
    from pipeline.runners.dask_runner import DaskRunner

    tasks = tmp_path / "tasks"
    options = PipelineOptions(["--dask_num_workers=1", "--dask_npartitions=1", f"--dask_task_folder={tasks}"])
    p = beam.Pipeline(runner=DaskRunner(), options=options)
    _ = p | beam.Create([0]) | "Die" >> beam.Map(lambda x: os.kill(os.getpid(), signal.SIGKILL))
    result = p.run()
    with pytest.raises(UserError) as failed:
        result.wait_until_finish()
    assert str(failed.value) == (
        "task 0 of stage Die: its worker ended before it was done, on each of the 4 workers that ran it (it may have "
        "run out of memory: fewer --dask_num_workers give each a larger share of this machine's)")
    assert ledger.read_plan(str(tasks)) is not None
    assert not [r for r in caplog.records if r.name.startswith("distributed.scheduler")]


def test_a_task_that_failed_and_then_finished_is_no_failure(tmp_path):
    """`pipeline status` showed a task's error from an earlier driver's attempt after the resumed
    run had finished the task."""
    from pipeline.runners import ledger

    (tmp_path / ledger.TASKS).mkdir()
    ledger.record_failure(str(tmp_path), 0, 0, OSError("connection reset"))
    ledger.record_failure(str(tmp_path), 0, 1, OSError("disk full"))
    ledger.record(str(tmp_path), 0, 0, {"attempt": "b"})
    assert ledger.failures(str(tmp_path)) == {(0, 1): "OSError: disk full"}


def waiting_task(cluster: DaskCluster, tmp_path: Path, connection_timeout: int) -> beam.runners.runner.PipelineResult:
    """A DaskRunner run on ``cluster`` of one task that sleeps two minutes, once that task runs."""
    from pipeline.runners.dask_runner import DaskRunner

    options = PipelineOptions(["--dask_scheduler_file", str(cluster.file), f"--dask_connection_timeout={connection_timeout}",
                               f"--temp_location={tmp_path / 'tmp'}", f"--dask_task_folder={tmp_path / 'tasks'}"])
    p = beam.Pipeline(runner=DaskRunner(), options=options)
    _ = p | beam.Create([0]) | "Wait" >> beam.Map(lambda x: time.sleep(120))
    result = p.run()
    deadline = time.monotonic() + 60
    while not any("Wait" in str(key) for keys in cluster.client.processing().values() for key in keys):
        assert time.monotonic() < deadline, "the task did not start"
        time.sleep(0.1)
    return result


def test_a_scheduler_lost_mid_run_is_one_line(tmp_path, caplog):
    """The scheduler killed while a task runs: one line naming it, not Dask's cancelled futures, nor
    the traceback of the client's reconnection, cancelled when the run closes it."""
    cluster = DaskCluster(tmp_path, workers=1)
    try:
        result = waiting_task(cluster, tmp_path, connection_timeout=5)
        address = cluster.client.scheduler.address
        cluster.procs[0].kill()
        with pytest.raises(UserError) as failed:
            result.wait_until_finish()
        assert str(failed.value) == (
            f"the Dask scheduler at {address} dropped the run's tasks (scheduler-connection-lost): it ended or was "
            "restarted, or the connection to it failed")
        assert not [r for r in caplog.records if r.name.startswith("distributed") and r.levelno >= logging.ERROR]
    finally:
        cluster.stop()


def test_a_scheduler_that_lost_every_worker_is_one_line_within_the_timeout(tmp_path):
    """The only worker killed while a task runs: the scheduler would hold the task for a worker for
    ever; after --dask_connection_timeout without one, one line naming the scheduler instead."""
    cluster = DaskCluster(tmp_path, workers=1)
    try:
        result = waiting_task(cluster, tmp_path, connection_timeout=3)
        address = cluster.client.scheduler.address
        cluster.procs[1].kill()
        start = time.monotonic()
        with pytest.raises(UserError) as failed:
            result.wait_until_finish(duration=60_000)  # (bounded: before, it waited for ever)
        assert str(failed.value) == (
            f"the Dask scheduler at {address} lost every worker and none joined within 3 s (start `dask worker "
            f"{address}` on the machines that run the tasks; --dask_connection_timeout waits longer)")
        assert 3 <= time.monotonic() - start < 30
        assert not cluster.client.processing() or not any(cluster.client.processing().values())
    finally:
        cluster.stop()


def test_a_worker_back_within_the_timeout_is_seen_while_tasks_end(monkeypatch):
    """The scheduler without a worker for a moment (a nanny restarting it), then tasks ending every
    2 s for ten minutes, then a moment again: the run goes on. It failed at once the second time
    (the first moment's start was forgotten only when no task ended for 5 s). A simulated clock."""
    from types import SimpleNamespace

    import distributed

    from pipeline.runners import dask_runner

    clock = [0.0]
    monkeypatch.setattr(dask_runner, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    class Task:
        def __init__(self, end: float) -> None:
            self.end, self.status = end, "pending"

        def done(self) -> bool:
            return clock[0] >= self.end

        def result(self) -> None:
            return None

    def wait(pending, timeout, return_when):
        first = min(task.end for task in pending if not task.done())
        if first - clock[0] > timeout:
            clock[0] += timeout
            raise TimeoutError
        clock[0] = max(clock[0], first)

    class Client:
        scheduler = SimpleNamespace(address="tcp://127.0.0.1:1")

        def scheduler_info(self, n_workers):
            return {"workers": {} if clock[0] < 6 or 600 <= clock[0] < 610 else {"w": {}}}

        def cancel(self, futures):
            pass

        def close(self):
            pass

    monkeypatch.setattr(distributed, "wait", wait)
    result = dask_runner.DaskRunnerResult(Client(), None, "unused", keep=True)
    result.futures = [Task(8 + 2 * i) for i in range(296)] + [Task(612 + 2 * i) for i in range(50)]
    monkeypatch.setattr(result, "_count", lambda: None)
    assert result.wait_until_finish() == "DONE" and clock[0] == 710


class _EvenOdd(beam.DoFn):
    """Evens to the main output, odds to ``odd``; how many it saw to ``seen`` from finish_bundle."""

    def start_bundle(self) -> None:
        self.seen = 0

    def process(self, x: int):
        self.seen += 1
        yield x if x % 2 == 0 else beam.pvalue.TaggedOutput("odd", x)

    def finish_bundle(self):
        yield beam.pvalue.TaggedOutput("seen", GlobalWindows.windowed_value(self.seen))


def test_dask_translation_routes_tags_keeps_finish_bundle_outputs_and_side_inputs():
    """What Beam's own DaskRunner gets wrong, on a small graph: every output gets only its tag's
    elements, finish_bundle's outputs arrive, side inputs and combines are right, all sinks run."""
    from pipeline.runners.dask_runner import DaskRunner

    options = PipelineOptions(["--dask_num_workers=1", "--dask_npartitions=3"])
    with beam.Pipeline(runner=DaskRunner(), options=options) as p:
        nums = p | beam.Create(range(10))
        split = nums | beam.ParDo(_EvenOdd()).with_outputs("odd", "seen", main="even")
        total = nums | "Total" >> beam.CombineGlobally(sum)
        shifted = split.even | beam.Map(lambda x, t: x + t, beam.pvalue.AsSingleton(total))
        grouped = (split.odd | beam.Map(lambda x: (x % 3, x)) | beam.GroupByKey()
                   | beam.MapTuple(lambda k, v: (k, sorted(v))))
        assert_that(shifted, equal_to([45, 47, 49, 51, 53]), label="even")
        assert_that(grouped, equal_to([(0, [3, 9]), (1, [1, 7]), (2, [5])]), label="odd")
        assert_that(split.seen | "Seen" >> beam.CombineGlobally(sum), equal_to([10]), label="seen")
        assert_that((split.even, split.odd) | beam.Flatten() | "Count" >> beam.combiners.Count.Globally(),
                    equal_to([10]), label="flatten")


_LOG: list[tuple[str, int]] = []


class _Log(beam.DoFn):
    def __init__(self, name: str) -> None:
        self.name = name

    def process(self, x: int, side: int = 0):
        _LOG.append((self.name, x + side))
        yield x


def test_dask_translation_fuses_pardo_chains_and_streams_elements_through_them(tmp_path):
    """A ParDo reading another's output runs in the same task, element by element (nothing held
    between them); one reading a side input starts a stage of its own; an output read outside its
    stage (here by a combine's shuffle) is still delivered. Run in-process by dask's sync scheduler."""
    from dask.local import get_sync

    from pipeline.runners.dask_runner import run_stage, translate

    options = PipelineOptions(["--dask_npartitions=2"])
    p = beam.Pipeline(options=options)
    shutil.rmtree(p.local_tempdir)  # Beam's, removed by run(): this graph is translated, not run
    a = p | "Nums" >> beam.Create(range(4)) | "A" >> beam.ParDo(_Log("a"))
    b = a | "B" >> beam.ParDo(_Log("b"))
    total = a | "Total" >> beam.CombineGlobally(sum)
    _ = b | "C" >> beam.ParDo(_Log("c"), beam.pvalue.AsSingleton(total))
    translation = translate(p, options, str(tmp_path), 2)
    sinks, graph = translation.sinks(str(tmp_path), "test", {}), translation.graph
    stages = sorted(key[0].rsplit("-", 1)[0] for key, task in graph.items() if isinstance(task, tuple) and task[0] is run_stage)
    assert [stage for stage in stages if stage[0] in "ABC"] == ["A+2", "A+2", "C+0", "C+0"]  # A, B, the combine's first step
    files = [task for key, task in graph.items() if key[0].endswith("/files")]  # the combine's shuffle: its split files
    assert len(files) == 1 and len(files[0][1]) == 2  # in one task that each group task reads (2n edges, not n x n)
    _LOG.clear()
    get_sync(graph, sinks)
    pairs = [entry for entry in _LOG if entry[0] != "c"]
    assert pairs == [(name, x) for x in [x for name, x in pairs[::2]] for name in "ab"]  # a0 b0 a1 b1 ...
    assert sorted(x for name, x in pairs[::2]) == [0, 1, 2, 3]
    assert sorted(x for name, x in _LOG if name == "c") == [6, 7, 8, 9]


def test_dask_groups_dense_int_keys_evenly_and_other_keys_stably(tmp_path):
    from pipeline.runners.dask_runner import group_part, split_by_key, stable_partition

    files = [(i, f"file-{i}") for i in range(8)]  # JoinByFile's keys: every partition gets one file
    for n, sizes in ((8, [1] * 8), (3, [3, 3, 2])):
        split = split_by_key(files, str(tmp_path / f"split-{n}"), n)
        assert [len(group_part(j, [split])) for j in range(n)] == sizes
    assert [stable_partition(-1, 8), stable_partition(9, 8)] == [7, 1]
    shards = [("en", "head", i) for i in range(64)]  # other keys: a hash of the pickled key, fixed across processes
    assert stable_partition(("en", "head", 3), 4) == 0
    assert sorted({stable_partition(key, 4) for key in shards}) == [0, 1, 2, 3]
    word, same = "w" * 3, "".join(["w"] * 3)  # equal strings, two objects: pickle's memo wrote (word, word) apart
    assert all(stable_partition((word, word), n) == stable_partition((word, same), n) for n in range(2, 64))


def test_dask_shuffle_reads_only_its_own_piece_of_each_file(tmp_path):
    """A GroupByKey's output partition reads its byte range of every input partition's file (a
    worker never holds another's whole split); pieces with no pairs are no bytes."""
    from pipeline.runners.dask_runner import group_part, split_by_key

    splits = [split_by_key([(key, (i, key)) for key in (0, 1, 3)], str(tmp_path / f"split-{i}"), 4) for i in range(2)]
    assert [offsets[3] - offsets[2] for _, offsets in splits] == [0, 0]  # no key of partition 2
    for path, offsets in splits:  # spoil every piece but partition 3's
        data = bytearray(Path(path).read_bytes())
        data[:offsets[3]] = b"\0" * offsets[3]
        Path(path).write_bytes(bytes(data))
    assert group_part(3, splits) == [(3, [(0, 3), (1, 3)])]
    assert group_part(2, splits) == []
    with pytest.raises(pickle.UnpicklingError):
        group_part(0, splits)
    empty = split_by_key([], str(tmp_path / "split-empty"), 4)  # nothing to write: no file (S3 refuses an empty upload)
    assert empty.offsets == [0] * 5 and not Path(empty.path).exists() and group_part(2, [empty]) == []


def test_the_runner_names_resolve_to_our_runners():
    from pipeline.runners.dask_runner import DaskRunner
    from pipeline.runners.options import make_runner, pipeline_options

    for name in ("DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner"):
        assert isinstance(make_runner(pipeline_options(name, [])), DaskRunner)
    assert type(make_runner(pipeline_options("DirectRunner", []))).__name__ == "FnApiRunner"
    assert make_runner(pipeline_options("PortableRunner", ["--job_endpoint=embed"])) is None


def test_spark_keeps_its_sdk_workers_between_tasks_unless_told_otherwise():
    """SparkRunner gets ``--environment_cache_millis`` (Beam's 0 starts an SDK worker per task);
    a value the user gives wins, and no other runner gets one."""
    from apache_beam.options.pipeline_options import PortableOptions

    from pipeline.runners.options import SPARK_ENVIRONMENT_CACHE_MS, engine_defaults

    def cache(runner: str, flags: list[str]) -> int:
        return int(PortableOptions(engine_defaults(runner, flags)).environment_cache_millis)

    assert cache("SparkRunner", []) == SPARK_ENVIRONMENT_CACHE_MS > 0
    assert cache("SparkRunner", ["--environment_cache_millis=0"]) == 0
    assert cache("FlinkRunner", []) == cache("DirectRunner", []) == 0


def test_prism_gets_the_built_binary_and_warnings_only_unless_told_otherwise(monkeypatch, tmp_path):
    from apache_beam.options.pipeline_options import PrismRunnerOptions

    from pipeline.runners import options

    def prism(flags: list[str]) -> tuple[str | None, str]:
        view = PrismRunnerOptions(options.engine_defaults("PrismRunner", flags))
        return view.prism_location, view.prism_log_level

    built = tmp_path / "prism"
    built.touch()
    monkeypatch.setattr(options, "PRISM", built)
    assert prism([]) == (str(built), "warn")
    assert prism(["--prism_location=/my/prism", "--prism_log_level=debug"]) == ("/my/prism", "debug")
    monkeypatch.setattr(options, "PRISM", tmp_path / "none")
    assert prism([]) == (None, "warn")  # check_prism then refuses the run, rather than Beam downloading
    assert "--prism_location" not in " ".join(options.engine_defaults("FlinkRunner", []))


def test_options_import_dask_only_for_its_runner_or_flags():
    """Checking a DirectRunner run's flags does not import Dask (about a second of every run);
    the DaskRunner's own flags are still known, and still checked, with any runner."""
    script = """
import sys
from pipeline.runners.options import pipeline_options
from pipeline.util.errors import UserError
pipeline_options("DirectRunner", ["--direct_num_workers=2"])
print("distributed" in sys.modules)
pipeline_options("DirectRunner", ["--dask_client_address=127.0.0.1:1"])
print("distributed" in sys.modules)
try:
    pipeline_options("DirectRunner", ["--dask_num_workers=two"])
except UserError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[:2] == ["False", "True"]
    assert "--dask_num_workers" in out[2] and "two" in out[2]


def test_options_keep_one_view_per_class():
    """Our options build each view once (Beam asks for ~650 while the graph is built, each a new
    argparse parse); a kept view reads and writes the values every other view and the job's
    options see."""
    from apache_beam.options.pipeline_options import DebugOptions, DirectOptions, TypeOptions
    from pipeline.runners.options import pipeline_options

    options = pipeline_options("DirectRunner", ["--direct_num_workers=2"])
    assert options.view_as(TypeOptions) is options.view_as(TypeOptions)
    options.view_as(DebugOptions).add_experiment("kept_view")
    options.view_as(DirectOptions).direct_num_workers = 3
    assert "kept_view" in options.view_as(DebugOptions).experiments
    assert options.get_all_options()["direct_num_workers"] == 3
    assert pickle.loads(pickle.dumps(options)).view_as(DirectOptions).direct_num_workers == 3


def test_dofn_specs_are_found_once_per_dofn_and_are_beams():
    """The graph module caches Beam's DoFn introspection per instance: Beam's own answer, state
    and timers included, asked once however often Beam asks."""
    from apache_beam.transforms import userstate
    from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
    from apache_beam.transforms.timeutil import TimeDomain

    import pipeline.graph  # noqa: F401  installs the cache

    class Stateful(beam.DoFn):
        BAG, TIMER = BagStateSpec("bag", beam.coders.VarIntCoder()), TimerSpec("t", TimeDomain.WATERMARK)

        def process(self, kv, bag=beam.DoFn.StateParam(BAG), timer=beam.DoFn.TimerParam(TIMER)):
            yield kv

        @on_timer(TIMER)
        def fire(self):
            yield 0

    beams = userstate.get_dofn_specs.uncached
    calls = []
    stateful, plain = Stateful(), beam.Map(str).fn
    for dofn in (stateful, plain):
        expected = beams(dofn)
        assert userstate.get_dofn_specs(dofn) == expected
        assert userstate.get_dofn_specs(dofn) is userstate.get_dofn_specs(dofn)  # Beam's makes new sets each time
        assert beams(dofn) is not beams(dofn)
        calls.append(userstate.is_stateful_dofn(dofn))
    assert calls == [True, False]
    assert {spec.name for spec in userstate.get_dofn_specs(stateful)[0]} == {"bag"}
    userstate.validate_stateful_dofn(stateful)  # Beam's own check of a stateful DoFn, on the cached specs


def test_near_dedup_imports_neither_datasketch_nor_scipy():
    """Building the near-dup graph and what its workers derive (the band layout, the permutations)
    import neither datasketch nor scipy under it (0.6-0.75 s in every process that ran near-dup)."""
    script = """
import shutil
import sys
import apache_beam as beam
from pipeline.config import load_config
from pipeline.graph import build_pipeline, build_steps
from pipeline.steps import minhash
cfg = load_config("configs/corpus/sample.yaml", {"input": ["x.wet.gz"], "output": "/tmp/unused", "runner": None},
                  ["steps=[dedup, lid, near_dedup]"])
steps = build_steps(cfg, 1)
p = beam.Pipeline()
shutil.rmtree(p.local_tempdir)  # Beam's, removed by run(): this graph is built, not run
build_pipeline(p, cfg, ["x.wet.gz"], steps)
near = cfg.section("near_dedup")
print(near.band_rows(), minhash.permutations(near.num_perm, near.seed)[0].shape)
print(sorted(m for m in ("datasketch", "scipy") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.splitlines()[-2:] == ["(9, 13) (128, 1)", "[]"]


def test_local_cluster_workers_have_the_steps_worker_modules_imported():
    """A run's steps' ``worker_modules`` are imported once, by the fork server the LocalCluster's
    workers are forked from, as for the DirectRunner's SDK workers (a new process: the fork server
    is one per driver process); a worker the nanny starts in place of a lost one too (it was
    spawned as a new interpreter: the method was set only while the cluster started)."""
    script = """
import os, signal, sys, time
from dask.distributed import Client
from pipeline.runners import forkserver
from pipeline.runners.dask_runner import local_cluster
from pipeline.runners.options import pipeline_options
forkserver.install(pipeline_options("DaskRunner", []), ["fasttext", "kenlm"])
assert "kenlm" not in sys.modules
cluster = local_cluster(1)

driver = os.getpid()  # a spawned worker's parent (its nanny runs here); a forked one's is the fork server
with Client(cluster) as client:
    for _ in range(2):
        [(pid, modules, parent)] = client.run(
            lambda: (os.getpid(), [m for m in ("fasttext", "kenlm") if m in sys.modules], os.getppid())).values()
        print(modules, parent != driver)
        lost = set(client.scheduler_info()["workers"])
        os.kill(pid, signal.SIGKILL)  # then the nanny's replacement
        deadline = time.monotonic() + 60
        while set(client.scheduler_info()["workers"]) in (lost, set()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
cluster.close()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-2:] == ["['fasttext', 'kenlm'] True"] * 2


def test_local_cluster_listens_on_loopback_only():
    psutil = pytest.importorskip("psutil")
    import dask
    from dask.distributed import Client

    from pipeline.runners.dask_runner import local_cluster

    me = psutil.Process()
    before = {c.laddr for p in [me, *me.children(recursive=True)]  # and what earlier tests left (Prism's server)
              for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    cluster = local_cluster(2)
    try:
        procs = [me, *me.children(recursive=True)]
        listening = [c.laddr for p in procs for c in p.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr not in before]
        assert len(listening) >= 3  # the scheduler and two workers at least
        assert {addr.ip for addr in listening} == {"127.0.0.1"}, listening
        workers = [p for p in procs if p.pid in {w.pid for w in cluster.workers.values() if hasattr(w, "pid")}]
        parents = {" ".join(p.parent().cmdline()) for p in workers}  # forked, Beam and the pipeline imported once
        assert len(workers) == 2 and len(parents) == 1 and "multiprocessing.forkserver" in parents.pop()
        with Client(cluster) as client:  # no profile for a dashboard it has not got
            assert set(client.run(lambda: dask.config.get("distributed.worker.profile.enabled")).values()) == {False}
    finally:
        cluster.close()


@pytest.mark.parametrize("engine, expected", [
    (["--runner", "PortableRunner"], "--runner PortableRunner needs --job_endpoint"),
    (["--runner", "FlinkRunner", "--flink_job_server_jar", "/no/such.jar"], "/no/such.jar"),
    (["--runner", "SparkRunner", "--spark_job_server_jar", "https://example.invalid/spark-job-server.jar"],
     "would be downloaded from https://example.invalid/spark-job-server.jar: run workflows/setup.sh"),
    (["--runner", "FlinkRunner", "--flink_version", "1.18"], "--flink_version: invalid choice: '1.18'"),
    (["--runner", "SparkRunner", "--environment_cache_millis=a minute"],
     "--environment_cache_millis: expected milliseconds (a whole number, 0 or more), got 'a minute'"),
    (["--runner", "FlinkRunner", "--job_server_java_launcher", "no-such-java"], "'no-such-java' is not on PATH"),
    pytest.param(["--runner", "FlinkRunner", "--flink_version", "2.0"], "the job server set-up built", marks=BUILT),
    pytest.param(["--runner", "FlinkRunner", "--flink_master", f"127.0.0.1:{free_port()}"],
                 "--flink_master (Flink's REST endpoint) 127.0.0.1:", marks=BUILT),
    pytest.param(["--runner", "SparkRunner", "--spark_master_url", f"spark://127.0.0.1:{free_port()}"],
                 "--spark_master_url (the Spark master) 127.0.0.1:", marks=BUILT),
    (["--runner", "PrismRunner", "--prism_location=/no/such/prism"], "--prism_location /no/such/prism: no such file"),
    (["--runner", "PrismRunner", "--prism_location=/etc/hostname"], "--prism_location /etc/hostname: cannot run it as a program"),
    (["--runner", "PrismRunner", "--prism_location=https://example.invalid/prism.zip"],
     "Beam would download Prism from https://example.invalid/prism.zip: run workflows/setup.sh"),
    (["--runner", "PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
      "--environment_config=127.0.0.1:1", "--set", "lid.model=lid.176.ftz"],
     "lid.model lid.176.ftz: a relative path, which each SDK worker of --runner PortableRunner would resolve in its own"),
    (["--runner", "FlinkRunner", "--output", "out/relative"], "output out/relative: a relative path, which each SDK worker"),
    (["--runner", "DaskRunner", "--dask_frobnicate=1"], "unknown option or argument '--dask_frobnicate=1'"),
    pytest.param(["--runner", "DaskRunner", "--dask_num_workers=abc"], "--dask_num_workers: invalid int value: 'abc'", marks=pytest.mark.slow),
    pytest.param(["--runner", "DaskRunner", "--dask_num_workers=0"], "--dask_num_workers=0: a LocalCluster needs at least 1", marks=pytest.mark.slow),
    (["--runner", "DaskRunner", "--dask_npartitions=-2"], "--dask_npartitions=-2: the input's partitions, 1 or more"),
    pytest.param(["--runner", "DaskRunner", "--dask_scheduler_file=/no/such.json"], "/no/such.json: no such file", marks=pytest.mark.slow),
    (["--runner", "DaskRunner", "--dask_client_address=tcp://127.0.0.1:1"], "needs --temp_location: a folder every"),
    pytest.param(["--runner", "DaskRunner", "--temp_location=/etc/passwd"], "--temp_location /etc/passwd: not a folder", marks=pytest.mark.slow),
    pytest.param(["--runner", "DaskRunner", "--temp_location=/proc/polyglot"], "--temp_location /proc/polyglot: cannot write a file there", marks=pytest.mark.slow),
    pytest.param(["--runner", "PortableRunner", "--job_endpoint=nohost"], "--job_endpoint (the job service) nohost: expected HOST:PORT", marks=pytest.mark.slow),
    (["--runner", "PortableRunner", f"--job_endpoint=127.0.0.1:{free_port()}"], "cannot be reached"),
    # a Beam flag the config gave is named as its --set (or its file); one the command line gave, as itself
    (["--set", "beam_options=[--direct_num_workers=x]"],
     "error: --set beam_options=[--direct_num_workers=x]: beam_options: argument --direct_num_workers: invalid int"),
    (["--direct_running_mode=bogus", "--set", "beam_options=[--direct_running_mode=in_memory]"],
     "error: argument --direct_running_mode: invalid choice: 'bogus'"),
])
def test_engine_mistakes_are_one_line(sample, tmp_path, engine, expected, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no cached job server JAR
    proc = subprocess.run([str(PY), "-m", "pipeline", "run", "--input", str(sample / "wet" / "*.gz"),
                           "--output", str(tmp_path / "out"), *engine],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_unreachable_scheduler_is_one_line_within_the_timeout(sample, tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    proc = subprocess.run([str(PY), "-m", "pipeline", "run", "--input", str(sample / "wet" / "*.gz"),
                           "--output", str(tmp_path / "out"), "--runner", "DaskRunner",
                           "--dask_client_address", address, "--dask_connection_timeout", "3",
                           "--temp_location", str(tmp_path / "tmp")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"cannot reach the Dask scheduler at {address}" in proc.stderr
    assert time.monotonic() - start < 30


def test_a_scheduler_without_workers_is_one_line_within_the_timeout(sample, tmp_path):
    """Tasks sent to a scheduler no worker joined would wait for ever: one line naming it instead,
    once --dask_connection_timeout has passed, before any work."""
    cluster = DaskCluster(tmp_path, workers=0)
    try:
        start = time.monotonic()
        proc = subprocess.run([str(PY), "-m", "pipeline", "run", "--input", str(sample / "wet" / "*.gz"),
                               "--output", str(tmp_path / "out"), "--runner", "DaskRunner",
                               "--dask_scheduler_file", str(cluster.file), "--dask_connection_timeout", "3",
                               "--temp_location", str(tmp_path / "tmp")],
                              capture_output=True, text=True, timeout=120)
        address = cluster.client.scheduler.address
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (f"error: the Dask scheduler at {address} has no workers: none joined within 3 s (start "
                               f"`dask worker {address}` on the machines that run the tasks; --dask_connection_timeout "
                               "waits longer)\n")
        assert time.monotonic() - start < 60
        assert not (tmp_path / "out").exists() and not list((tmp_path / "tmp").iterdir())
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.parametrize("engine", [
    ["--runner", "DirectRunner", "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"],
    ["--runner", "DaskRunner", "--dask_num_workers", "3"],
])
def test_more_workers_write_the_same_bytes(planted, tmp_path, engine):
    assert run(planted["config"], tmp_path, *engine) == planted["reference"]


@pytest.mark.slow
def test_portable_external_sdk_worker_process_writes_the_same_bytes(planted, tmp_path):
    """Beam's worker pool starts the SDK workers as processes of their own (the way Flink and Spark
    job servers reach Python); the embedded job service uses one of them per job."""
    port = free_port()
    env = {**os.environ, "PATH": f"{PY.parent}{os.pathsep}{os.environ['PATH']}"}  # the pool starts `python`
    pool = subprocess.Popen([str(PY), "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, "Beam's worker pool", timeout=60)  # it imports Beam first: slow on a busy machine
        digests = run(planted["config"], tmp_path, "--runner", "PortableRunner", "--job_endpoint", "embed",
                      "--environment_type", "EXTERNAL", "--environment_config", f"127.0.0.1:{port}",
                      "--sdk_worker_parallelism", "2")
        assert digests == planted["reference"]
    finally:
        pool.kill()
        pool.wait(timeout=30)


@pytest.mark.slow
def test_bundled_sample_is_the_same_on_dask_and_portable(sample, tmp_path):
    config = ["--config", "configs/corpus/sample.yaml", "--set", "beam_options=[]"]
    reference = run(config, tmp_path / "direct", "--runner", "DirectRunner")
    assert run(config, tmp_path / "dask", "--runner", "DaskRunner", "--dask_num_workers", "2") == reference
    assert run(config, tmp_path / "portable", "--runner", "PortableRunner", "--job_endpoint", "embed",
               "--environment_type", "LOOPBACK") == reference


def test_dataflow_job_is_built_offline_with_our_package_and_options(sample, gcs_emulator, tmp_path):
    """workflows/dataflow.sh --dry-run: Beam's DataflowRunner stages the sdist and the job's files on
    a real GCS server (the emulator) and writes the job as a template; nothing is submitted."""
    import json

    from pipeline.steps.lid import default_model_path

    env, bucket = gcs_emulator
    bucket.blob("models/lid.176.bin").upload_from_filename(default_model_path())
    for f in sorted((sample / "wet").glob("*.warc.wet.gz")):
        bucket.blob(f"crawl-data/CC-MAIN-2024-10/segments/s/wet/{f.name}").upload_from_filename(str(f))
    missing = subprocess.run([str(PY), "-m", "pipeline", "run", "--input", str(sample / "wet" / "*.gz"),
                              "--output", "gs://polyglot/corpus", "--runner", "DataflowRunner", "--project", "polyglot-test",
                              "--region", "us-central1", "--temp_location", "gs://polyglot/tmp",
                              "--staging_location", "gs://no-such-bucket/staging", "--dry_run=true"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2
    assert "error: --staging_location gs://no-such-bucket/staging: bucket gs://no-such-bucket does not exist" in missing.stderr
    env.update(PROJECT="polyglot-test", BUCKET="polyglot", SCORE="0", MACHINE_TYPE="n2-highmem-4", MAX_WORKERS="7",
               DISK_GB="50", PY=str(PY))
    proc = subprocess.run(["bash", "workflows/dataflow.sh", "--dry-run"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "job written to gs://polyglot/templates/polyglot-corpus-cc-main-2024-10.json (not run)" in proc.stdout
    job = json.loads(bucket.blob("templates/polyglot-corpus-cc-main-2024-10.json").download_as_bytes())
    assert job["name"] == "polyglot-corpus-cc-main-2024-10" and job["type"] == "JOB_TYPE_BATCH"
    environment = job["environment"]
    [pool] = environment["workerPools"]
    assert pool["machineType"] == "n2-highmem-4" and pool["diskSizeGb"] == 50
    assert pool["autoscalingSettings"]["maxNumWorkers"] == 7
    staged = {p["name"]: p["location"] for p in pool["packages"]}
    assert "polyglot_corpus-0.1.0.tar.gz" in staged
    assert all(loc.startswith("storage.googleapis.com/polyglot/staging/") for loc in staged.values())
    assert environment["tempStoragePrefix"].startswith("storage.googleapis.com/polyglot/tmp/")
    options = environment["sdkPipelineOptions"]["options"]
    assert options["runner"] == "DataflowRunner" and options["project"] == "polyglot-test"
    assert options["extra_packages"] == ["dist/polyglot_corpus-0.1.0.tar.gz"]
    sdist = [b for b in bucket.client.list_blobs("polyglot", prefix="staging/") if b.name.endswith(".tar.gz")]
    assert sdist and sdist[0].size > 10_000
    assert not list(bucket.client.list_blobs("polyglot", prefix="corpus/"))  # nothing ran


def test_pipeline_run_as_a_user_runs_it_writes_the_direct_runner_bytes(planted, tmp_path):
    """``python -m pipeline run`` in a process of its own, 2 workers forked from its fork server: Beam
    imported there without its cloud clients (no URL in the config: ``runners.lean_import``) in the
    driver and the fork server, and the report drawn by its report process (``report.background``)."""
    out = tmp_path / "out"
    proc = subprocess.run([str(PY), "-m", "pipeline", "run", "--no-progress", *planted["config"], "--output", str(out),
                           "--set", "beam_options=[--direct_num_workers=2, --direct_running_mode=multi_processing]"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert output_digests(out) == planted["reference"]
