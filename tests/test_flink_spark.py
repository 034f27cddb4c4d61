"""Beam's own FlinkRunner and SparkRunner on real clusters that the tests start on 127.0.0.1
(workflows/clusters.py): a Flink session cluster (a JobManager and a TaskManager, each a JVM of its
own) and a Spark standalone master and worker, with the Python SDK workers started as processes of
their own by Beam's worker pool (EXTERNAL), two of them. The same graph writes the DirectRunner's
bytes on both; a TaskManager or an SDK worker killed mid-run changes nothing in the output."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from test_engines import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflows"))
import clusters  # noqa: E402

MISSING = clusters.missing()
pytestmark = [pytest.mark.timeout(900), pytest.mark.skipif(MISSING is not None, reason=f"Flink/Spark: {MISSING}")]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with clusters.WorkerPool(tmp_path_factory.mktemp("pool")) as started:
        yield started


class Watch(threading.Thread):
    """Samples the pool's SDK worker processes while a run goes on; ``act`` (once, on the worker
    ``pick`` names, when it names one) is the fault to inject."""

    def __init__(self, pool: clusters.WorkerPool, pick=None, act=None) -> None:
        super().__init__(daemon=True)
        self.pool, self.pick, self.act = pool, pick, act
        self.most, self.acted, self.done = 0, False, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            workers = self.pool.workers()
            self.most = max(self.most, len(workers))
            if self.act and not self.acted and (pid := self.pick(workers)) is not None:
                self.act(pid)
                self.acted = True
            time.sleep(0.3)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.join(timeout=10)


def at_work(pids: list[int]) -> list[int]:
    """The SDK workers of ``pids`` connected to the runner and at work: two TCP connections or more
    (control and data). One killed before it connects (3 s or more of imports, longer while the
    machine is busy) is waited for without end by Beam's Flink and Spark runners ("Still waiting for
    startup of environment"), so a worker's age says nothing: a kill at 4 or 8 s hung these tests
    when they ran after others."""
    import psutil

    busy = []
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:  # ended meanwhile
            continue
        if sum(c.status == psutil.CONN_ESTABLISHED for c in connections) >= 2:
            busy.append(pid)
    return busy


def test_flink_session_cluster_with_two_sdk_workers_writes_the_direct_runner_bytes(planted, pool, tmp_path):
    relative = Path(os.path.relpath(tmp_path / "flink"))  # as `bench_engines.py --work out/...` gives it
    with clusters.FlinkCluster(relative, slots=2) as flink, Watch(pool) as watch:
        digests = run(planted["config"], tmp_path / "out", *clusters.flags("FlinkRunner", flink, pool, workers=2))
        assert flink.overview()["jobs-finished"] == 1
    assert digests == planted["reference"]
    assert watch.most >= 2, f"at most {watch.most} SDK worker process(es) at a time"


def test_spark_standalone_cluster_with_two_sdk_workers_writes_the_direct_runner_bytes(planted, pool, tmp_path):
    """Also: the executor keeps its two SDK workers for the whole run (Beam's default starts a new
    one for every task: about 20 here, each importing the steps and loading their models)."""
    before = pool.started()
    with clusters.SparkCluster(Path(os.path.relpath(tmp_path / "spark")), cores=2) as spark, Watch(pool) as watch:
        digests = run(planted["config"], tmp_path / "out", *clusters.flags("SparkRunner", spark, pool, workers=2))
        [app] = spark.applications()
        assert app["state"] == "FINISHED" and app["cores"] == 2
    assert digests == planted["reference"]
    assert watch.most >= 2, f"at most {watch.most} SDK worker process(es) at a time"
    assert pool.started() - before == 2, f"{pool.started() - before} SDK workers started for one run"


@pytest.mark.slow
def test_flink_local_writes_the_direct_runner_bytes(planted, tmp_path):
    """``--flink_master [local]``: the job server runs Flink inside itself, the SDK worker in the driver."""
    assert run(planted["config"], tmp_path / "out", "--runner", "FlinkRunner", "--flink_master", "[local]",
               "--environment_type", "LOOPBACK") == planted["reference"]


def _busy(flink: clusters.FlinkCluster, workers: int = 2):
    """pick(): while a job runs and its ``workers`` SDK workers are all at work, one of them."""

    def pick(pids: list[int]) -> int | None:
        busy = at_work(pids)
        return busy[0] if len(busy) >= workers and flink.overview()["jobs-running"] == 1 else None

    return pick


def restarts(flink: clusters.FlinkCluster) -> int:
    """The failures the cluster's only job recovered from (Flink's exception history)."""
    [job] = flink.rest("jobs/overview")["jobs"]
    assert job["state"] == "FINISHED"
    return len(flink.rest(f"jobs/{job['jid']}/exceptions")["exceptionHistory"]["entries"])


@pytest.mark.slow
def test_flink_survives_a_killed_taskmanager(planted, tmp_path):
    """The only TaskManager SIGKILLed mid-run and a new one started (what a supervisor does): the
    restart strategy runs the job again on it, and the output is the undisturbed run's."""
    with clusters.FlinkCluster(tmp_path / "flink", slots=2) as flink, clusters.WorkerPool(tmp_path / "pool") as pool:
        def kill(_worker: int) -> None:
            flink.kill(flink.taskmanagers[0])
            flink.taskmanagers.append(flink.start_taskmanager())

        with Watch(pool, _busy(flink), kill) as watch:
            digests = run(planted["config"], tmp_path / "out", *clusters.flags("FlinkRunner", flink, pool, workers=2))
        assert watch.acted, "the job ended before the TaskManager could be killed"
        assert restarts(flink), "the job was not restarted"
    assert digests == planted["reference"]


@pytest.mark.slow
def test_flink_survives_a_killed_sdk_worker(planted, tmp_path):
    """One Python SDK worker process SIGKILLed mid-run: Flink fails the tasks it served, restarts
    them with a new SDK worker, and the output is the undisturbed run's."""
    with clusters.FlinkCluster(tmp_path / "flink", slots=2) as flink, clusters.WorkerPool(tmp_path / "pool") as pool:
        with Watch(pool, _busy(flink), lambda worker: os.kill(worker, signal.SIGKILL)) as watch:
            digests = run(planted["config"], tmp_path / "out", *clusters.flags("FlinkRunner", flink, pool, workers=2))
        assert watch.acted, "the job ended before an SDK worker could be killed"
        assert restarts(flink), "the job was not restarted"
    assert digests == planted["reference"]


@pytest.mark.slow
def test_spark_survives_a_killed_sdk_worker_when_workers_are_not_kept(planted, tmp_path):
    """With ``--environment_cache_millis=0`` (Beam's default: an SDK worker per task), one SDK worker
    SIGKILLed mid-task fails only that task; Spark retries it with a new SDK worker and the output is
    the undisturbed run's. (With the executor's SDK workers kept, our default, a dead one fails the
    tasks given to it until the job fails: README, "Spark".)"""
    def pick(pids: list[int]) -> int | None:
        return next(iter(at_work(pids)), None)

    with clusters.SparkCluster(tmp_path / "spark", cores=2) as spark, clusters.WorkerPool(tmp_path / "pool") as pool:
        with Watch(pool, pick, lambda worker: os.kill(worker, signal.SIGKILL)) as watch:
            digests = run(planted["config"], tmp_path / "out", *clusters.flags("SparkRunner", spark, pool, workers=2),
                          "--environment_cache_millis=0")
        assert watch.acted, "the job ended before an SDK worker could be killed"
    assert digests == planted["reference"]
