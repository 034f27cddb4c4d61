"""Flink and Spark clusters on 127.0.0.1 from the distributions workflows/setup.sh fetched, and
Beam's Python SDK worker pool: what the tests and bench_engines.py run Beam's FlinkRunner and
SparkRunner against, started the way each project's own scripts start them (Flink's
``BashJavaUtils`` computes a process's memory flags, as ``jobmanager.sh``/``taskmanager.sh`` do;
Spark's ``spark-class`` launches its master and worker). Every port is bound to 127.0.0.1.

    .venv/bin/python workflows/clusters.py flink [--slots 2] [--dir out/flink]   # until Ctrl-C
    .venv/bin/python workflows/clusters.py spark [--cores 2] [--dir out/spark]

prints the ``pipeline run`` flags that reach it.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

VENV = Path(sys.prefix)
FLINK_HOME = VENV / "flink"  # links made by workflows/setup.sh
SPARK_HOME = VENV / "spark"
JOB_SERVERS = VENV / "beam-job-servers"
# what Flink's config.yaml sets for Java 17 (env.java.opts.all): Kryo reaches into java.base
FLINK_JAVA_OPTS = [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
    "java.lang", "java.lang.reflect", "java.io", "java.net", "java.nio", "sun.nio.ch", "java.text", "java.time",
    "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "java.util.concurrent.locks")]
SMALL_JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
"""Every JVM here (Flink's JobManager and TaskManager, Spark's master, worker and executors, Beam's
job servers) compiles with C1 only and collects garbage in one thread: these clusters share one
small machine with the SDK workers, and for runs of a minute C2's compiler threads and G1's
parallel collectors cost more CPU than they save (a 1-core Spark run: executor 25.5 -> 12.1 CPU-s,
job server 24.0 -> 10.5, 52 -> 40 s). A long job on a cluster of its own wants the JVM's defaults."""
LOG4J = """rootLogger.level = INFO
rootLogger.appenderRef.file.ref = File
appender.file.name = File
appender.file.type = File
appender.file.fileName = ${sys:log.file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{HH:mm:ss,SSS} %-5p %c - %m%n
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing() -> str | None:
    """Why no cluster can be started here (one line), or None."""
    if not any((Path(d) / "java").exists() for d in os.environ.get("PATH", "").split(os.pathsep)):
        return "no java on PATH"
    for path in (FLINK_HOME / "lib", SPARK_HOME / "jars", JOB_SERVERS / "flink", JOB_SERVERS / "spark"):
        if not path.exists():
            return f"{path} missing (workflows/setup.sh fetches and builds it)"
    return None


def _wait(check, what: str, timeout: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start ({'a process exited' if dead else 'timed out'}); logs: {procs}")
        time.sleep(0.3)


def _json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


class _Processes:
    """Processes started in sessions of their own, stopped (SIGKILL to each group) by :meth:`stop`."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()  # the processes run in it: a relative path would not find itself
        self.procs: list[subprocess.Popen] = []
        self.root.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.root / f"{name}.out", "ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                cwd=self.root, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            self.kill(proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class FlinkCluster(_Processes):
    """A Flink session cluster: a JobManager and ``taskmanagers`` TaskManagers, each a JVM of its own,
    with ``slots`` slots each and a fixed-delay restart strategy (a job whose TaskManager dies is
    restarted on the slots that remain or come back)."""

    def __init__(self, root: Path, slots: int = 2, taskmanagers: int = 1, timeout: float = 120) -> None:
        super().__init__(root)
        self.rest_port = free_port()
        self.conf = self.root / "conf"
        self.conf.mkdir(exist_ok=True)
        (self.root / "tmp").mkdir(exist_ok=True)
        settings = {
            "jobmanager.rpc.address": "127.0.0.1", "jobmanager.bind-host": "127.0.0.1",
            "jobmanager.rpc.port": free_port(), "blob.server.port": free_port(),
            "rest.address": "127.0.0.1", "rest.bind-address": "127.0.0.1", "rest.port": self.rest_port,
            "taskmanager.host": "127.0.0.1", "taskmanager.bind-host": "127.0.0.1",
            "taskmanager.numberOfTaskSlots": slots, "parallelism.default": slots * taskmanagers,
            "jobmanager.memory.process.size": "1024m", "taskmanager.memory.process.size": "2048m",
            "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 5,
            "restart-strategy.fixed-delay.delay": "2 s",
            "heartbeat.timeout": 10000, "heartbeat.interval": 2000,  # a killed TaskManager is noticed in seconds
            # working folders (a TaskManager's holds the job's 150 MB of jars) under root, not left in /tmp
            "io.tmp.dirs": self.root / "tmp", "web.tmpdir": self.root / "tmp",
        }
        (self.conf / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
        (self.conf / "log4j.properties").write_text(LOG4J)
        self.jobmanager = self._java("jobmanager", "GET_JM_RESOURCE_PARAMS",
                                     "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint")
        self.taskmanagers = [self.start_taskmanager() for _ in range(taskmanagers)]
        self.wait_for_slots(slots * taskmanagers, timeout)

    @property
    def master(self) -> str:
        """``--flink_master``: the REST address."""
        return f"127.0.0.1:{self.rest_port}"

    def _java(self, name: str, resources: str, main: str) -> subprocess.Popen:
        classpath = f"{FLINK_HOME / 'lib'}/*"
        utils = subprocess.run(["java", "-cp", f"{classpath}:{FLINK_HOME / 'bin' / 'bash-java-utils.jar'}",
                                "org.apache.flink.runtime.util.bash.BashJavaUtils", resources, "--configDir", str(self.conf)],
                               capture_output=True, text=True, check=True)
        jvm, dynamic = [line.split(":", 1)[1].split() for line in utils.stdout.splitlines()
                        if line.startswith("BASH_JAVA_UTILS_EXEC_RESULT:")][-2:]
        n = len(self.procs)  # a TaskManager started again gets a log of its own
        return self.start(f"{name}-{n}", ["java", *jvm, *FLINK_JAVA_OPTS, *SMALL_JVM, f"-Dlog.file={self.root / f'{name}-{n}.log'}",
                                          f"-Dlog4j.configurationFile=file:{self.conf / 'log4j.properties'}",
                                          "-cp", classpath, main, "--configDir", str(self.conf), *dynamic])

    def start_taskmanager(self) -> subprocess.Popen:
        return self._java("taskmanager", "GET_TM_RESOURCE_PARAMS", "org.apache.flink.runtime.taskexecutor.TaskManagerRunner")

    def rest(self, path: str) -> dict:
        """GET from the JobManager's REST API (``overview``, ``jobs/overview``, ...)."""
        return _json(f"http://{self.master}/{path}")

    def overview(self) -> dict:
        return self.rest("overview")

    def wait_for_slots(self, slots: int, timeout: float = 120) -> None:
        _wait(lambda: self.overview()["slots-total"] >= slots, f"Flink with {slots} slots", timeout,
              [self.jobmanager])


class SparkCluster(_Processes):
    """A Spark standalone master and one worker with ``cores`` cores, started by ``spark-class``."""

    def __init__(self, root: Path, cores: int = 2, memory: str = "4g", timeout: float = 120) -> None:
        super().__init__(root)
        self.port, self.ui_port = free_port(), free_port()
        self.env = {"SPARK_HOME": str(SPARK_HOME.resolve()), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_LOG_DIR": str(self.root), "SPARK_WORKER_DIR": str(self.root / "work"), "SPARK_NO_DAEMONIZE": "1",
                    "SPARK_DAEMON_JAVA_OPTS": " ".join(SMALL_JVM)}
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        master = self.start("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                       "--port", str(self.port), "--webui-port", str(self.ui_port)], self.env)
        _wait(lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close() is None,
              "the Spark master", timeout, [master])
        self.worker = self.start("worker", [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                            "--cores", str(cores), "--memory", memory, "--webui-port", str(free_port()),
                                            self.master], self.env)
        _wait(lambda: _json(f"http://127.0.0.1:{self.ui_port}/json/")["aliveworkers"] >= 1, "the Spark worker",
              timeout, [master, self.worker])

    @property
    def master(self) -> str:
        """``--spark_master_url``."""
        return f"spark://127.0.0.1:{self.port}"

    def applications(self) -> list[dict]:
        return _json(f"http://127.0.0.1:{self.ui_port}/json/")["completedapps"]


class WorkerPool(_Processes):
    """Beam's Python SDK worker pool (``--environment_type EXTERNAL --environment_config``): it starts
    an SDK worker process per request, with this virtualenv's ``python``."""

    def __init__(self, root: Path, timeout: float = 60) -> None:
        super().__init__(root)
        self.port = free_port()
        self.pool = self.start("worker-pool", [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                                               f"--service_port={self.port}"],
                               {"PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"})
        _wait(lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close() is None,
              "Beam's worker pool", timeout, [self.pool])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def started(self) -> int:
        """How many SDK worker processes the pool has started so far (its log names each)."""
        return (self.root / "worker-pool.out").read_text(errors="replace").count("Starting worker with command")

    def workers(self) -> list[int]:
        """The SDK worker processes the pool has running now (their pids)."""
        import psutil

        found = []
        for proc in psutil.Process(self.pool.pid).children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and "SdkHarness" in " ".join(proc.cmdline()):
                    found.append(proc.pid)
            except psutil.Error:  # ended meanwhile
                pass
        return found


def flags(engine: str, cluster: FlinkCluster | SparkCluster, pool: WorkerPool, workers: int) -> list[str]:
    """``pipeline run`` flags for ``engine`` on ``cluster`` with ``workers`` SDK worker processes."""
    place = (["--flink_master", cluster.master, "--parallelism", str(workers)] if engine == "FlinkRunner"
             else ["--spark_master_url", cluster.master,  # the executors' JVM options come from the driver's
                   f"--job_server_jvm_property=-Dspark.executor.extraJavaOptions={' '.join(SMALL_JVM)}"])
    return ["--runner", engine, *place, *(f"--job_server_jvm_property={flag}" for flag in SMALL_JVM),
            "--environment_type", "EXTERNAL", "--environment_config", pool.address, "--sdk_worker_parallelism", str(workers)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=["flink", "spark"])
    parser.add_argument("--slots", "--cores", dest="slots", type=int, default=2, help="task slots (Flink) or cores (Spark)")
    parser.add_argument("--dir", default=None, help="configuration and logs (default out/<engine>)")
    args = parser.parse_args()
    if args.slots < 1:
        parser.error(f"--slots/--cores must be at least 1, got {args.slots}")
    if why := missing():
        parser.error(why)
    root = Path(args.dir or Path("out") / args.engine).resolve()
    cluster = FlinkCluster(root, slots=args.slots) if args.engine == "flink" else SparkCluster(root, cores=args.slots)
    pool = WorkerPool(root)
    runner = "FlinkRunner" if args.engine == "flink" else "SparkRunner"
    print(f"{args.engine} on 127.0.0.1, logs in {root}; run with:\n  .venv/bin/python -m pipeline run ... "
          f"{shlex.join(flags(runner, cluster, pool, args.slots))}\nCtrl-C stops it.", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        pool.stop()
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
