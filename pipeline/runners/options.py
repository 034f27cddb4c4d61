"""Which engine runs the graph, and one clear line for an engine the options cannot reach.

The graph is the same on every engine (``beam_pipeline``); here only the runner is chosen:
``DirectRunner`` runs on Beam's FnApiRunner (never the Prism download; with stage inputs sent in
pieces, ``forkserver``), ``DaskRunner`` on our
Dask translation (``dask_runner``), ``PrismRunner`` on the Prism binary set-up built with Go, anything
else as Beam resolves it (PortableRunner, Flink, Spark, Dataflow).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import apache_beam as beam
from apache_beam.options.pipeline_options import (GoogleCloudOptions, PipelineOptions, PipelineOptionsT, PortableOptions,
                                                  _BeamArgumentParser)
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner.fn_runner import ExtendedProvisionInfo, FnApiRunner
from apache_beam.runners.portability.portable_runner import JobServiceHandle
from apache_beam.runners.runner import PipelineRunner

from . import forkserver
from ..util.errors import UserError, first_line
from .prefork import LOCAL_NAMES

DASK_NAMES = ("DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner")
JAR_RUNNERS = {"FlinkRunner": ("--flink_job_server_jar", "--flink_master"),
               "SparkRunner": ("--spark_job_server_jar", "--spark_master_url")}
# Beam's job servers as workflows/setup.sh assembles them (java/): Beam 2.62's, for Flink 1.19 and Spark 3
JOB_SERVERS = Path(sys.prefix) / "beam-job-servers"
BUILT_FLINK_VERSION = "1.19"
# Beam's Prism runner as workflows/setup.sh builds it with Go, at the installed Beam's version
PRISM = Path(sys.prefix) / "beam-prism" / "prism"
SPARK_ENVIRONMENT_CACHE_MS = 60_000
"""How long a Spark executor keeps its SDK worker after a task (``--environment_cache_millis``)."""


def _all_option_classes(cls: type = PipelineOptions) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_option_classes(sub))
    return found


class _FlagParser(_BeamArgumentParser):
    """Beam's option parser, whose complaints (a value of the wrong type) are one error line."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


class Options(PipelineOptions):
    """Beam's options whose views are built once per class. Beam asks the pipeline's options for a
    view (a new argparse parser over every flag) twice per applied transform and again per type
    check: ~650 parses, 0.3 s of building our graph. Views share ``_all_options`` either way, so a
    kept view reads and writes what a new one would."""

    def view_as(self, cls: type[PipelineOptionsT]) -> PipelineOptionsT:
        views = self.__dict__.setdefault("_views", {})
        if cls not in views:
            views[cls] = super().view_as(cls)
        return views[cls]


def unknown_beam_flags(flags: list[str]) -> list[str]:
    """Flags no registered Beam PipelineOptions class knows (Beam would only log and drop them).
    The DaskRunner's options register when its module is imported, which imports Dask (about a
    second): only done when the run names that runner or a flag is unknown without them."""
    def unknown() -> list[str]:
        parser = _FlagParser(allow_abbrev=False)
        for cls in _all_option_classes():
            cls._add_argparse_args(parser)
        return parser.parse_known_args(flags)[1]

    left = unknown()
    if left or any(flag.split("=", 1)[1] in DASK_NAMES for flag in flags if flag.startswith("--runner=")):
        from . import dask_runner  # noqa: F401  registers Beam's DaskOptions and ours

        left = unknown()
    return left


def engine_defaults(runner: str, flags: list[str]) -> list[str]:
    """The flags ``runner`` needs beside the user's: for FlinkRunner and SparkRunner the job server
    JAR set-up built (unless a JAR or a running job server is given), the Flink version it is built
    for, and Flink's streaming translation. Beam's portable Flink runner translates a batch pipeline
    with Flink's DataSet API, whose plan optimizer does not finish on the corpus graph (10 minutes at
    100 % CPU in ``SingleInputNode.accept`` without a task started); its streaming translation runs
    the same bounded graph to the end (the watermark reaches the end of time when the input is read)
    and writes the same bytes (tested).

    SparkRunner also keeps each executor's SDK worker between tasks for
    :data:`SPARK_ENVIRONMENT_CACHE_MS`. Beam's default (0) closes it after every task, so each of a
    run's ~20 tasks started a new Python process that imported the steps and loaded their models
    again: half a 1-core run's time (97 s against 45 s on 4 bench files, 23 SDK workers against 1).

    PrismRunner gets the Prism binary set-up built (:data:`PRISM`; Beam would download one from
    GitHub), Prism's warnings only (its default, info, logs every job's progress), and a Prism
    server of its own: Beam keeps one per process, made with the options of the first run that
    asked, and Beam's own DirectRunner asks first (with no location) wherever a Beam pipeline
    ran on it before in the same process."""
    given = {flag.split("=", 1)[0] for flag in flags}
    if runner == "PrismRunner":
        location = [f"--prism_location={PRISM}"] if "--prism_location" not in given and PRISM.exists() else []
        return [*flags, *location, *([] if "--prism_log_level" in given else ["--prism_log_level=warn"]),
                "--experiments=disable_prism_server_singleton"]
    if runner not in JAR_RUNNERS:
        return flags
    jar_flag = JAR_RUNNERS[runner][0]
    extra = []
    if jar_flag not in given and "--job_endpoint" not in given:
        engine = runner.removesuffix("Runner").lower()
        built = JOB_SERVERS / engine / f"{engine}-job-server.jar"
        if built.exists():
            extra.append(f"{jar_flag}={built}")
            if runner == "FlinkRunner" and "--flink_version" not in given:
                extra.append(f"--flink_version={BUILT_FLINK_VERSION}")
    if runner == "FlinkRunner" and "--streaming" not in given:
        extra.append("--streaming")
    if runner == "SparkRunner" and "--environment_cache_millis" not in given:
        extra.append(f"--environment_cache_millis={SPARK_ENVIRONMENT_CACHE_MS}")
    return [*flags, *extra]


def pipeline_options(runner: str, flags: list[str]) -> PipelineOptions:
    """Beam's options for ``--runner`` and the extra flags; unknown flags are an error."""
    flags = [f"--runner={runner}", *engine_defaults(runner, flags)]
    unknown = unknown_beam_flags(flags)
    if unknown:
        raise UserError(f"unknown option or argument {unknown[0]!r} (neither ours nor a Beam pipeline option; see --help)")
    return Options(flags)


def check_buckets(options: PipelineOptions) -> None:
    """The buckets of the temp, staging and template locations (Dataflow's; the DaskRunner's
    shuffle) exist and take writes (Beam finds out only when it stages, after minutes of retries)."""
    from ..output import stores

    cloud = options.view_as(GoogleCloudOptions)
    for flag, path in (("--temp_location", cloud.temp_location), ("--staging_location", cloud.staging_location),
                       ("--template_location", cloud.template_location)):
        if path:
            stores.check(path, flag, options, write=True)


def check_reachable(address: str, what: str, timeout: float = 10.0) -> None:
    """A TCP connection to ``host:port`` opens within ``timeout`` seconds, or one error line."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise UserError(f"{what} {address}: expected HOST:PORT")
    try:
        socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout).close()
    except OSError as exc:
        raise UserError(f"{what} {address} cannot be reached: {exc}") from None


def cloud_error(exc: Exception, runner: str) -> UserError | None:
    """One line for what a cloud client raised (credentials, network, a missing bucket): the
    Google clients' errors come from ``google.*`` modules; None for anything else."""
    if not type(exc).__module__.startswith("google."):
        return None
    return UserError(f"{runner}: {first_line(exc, 400, typed=True)}")


def make_runner(options: PipelineOptions) -> PipelineRunner | None:
    """Our runner for DirectRunner and DaskRunner; None: Beam picks it from the options.

    DirectRunner first tries Prism, which it downloads from GitHub: network access at run time,
    and on a machine with network a different engine than the one configured and tested here.
    ``--runner PrismRunner`` asks for Prism (the binary set-up built: ``engine_defaults``). Every
    FnApiRunner of this process (ours, and the
    one behind ``PortableRunner --job_endpoint embed``) sends stage inputs in pieces (``forkserver``).
    """
    forkserver.install(options)
    all_options = options.get_all_options()
    if all_options["runner"] in DASK_NAMES:
        from .dask_runner import DaskRunner

        return DaskRunner()
    if all_options["runner"] not in LOCAL_NAMES:
        return None
    # as DirectRunner builds it: the options travel to the SDK workers in the provision info
    info = beam_provision_api_pb2.ProvisionInfo(pipeline_options=JobServiceHandle.encode_pipeline_options(all_options))
    return FnApiRunner(provision_info=ExtendedProvisionInfo(info))


def direct_pipeline(*flags: str) -> beam.Pipeline:
    """A graph of one's own on the DirectRunner as ``pipeline run`` runs it (:func:`make_runner`), for
    tests and benchmarks: ``beam.Pipeline("DirectRunner")`` would first try Prism, downloading it
    from GitHub (and leaving a ``beam-temp*`` folder in the temp folder when that fails)."""
    runner = next((flag for flag in flags if flag.split("=", 1)[0] == "--runner"), None)
    if runner:
        raise UserError(f"direct_pipeline runs on the DirectRunner; {runner!r} asks for another")
    options = pipeline_options("DirectRunner", list(flags))
    return beam.Pipeline(runner=make_runner(options), options=options)


def check_engine(options: PipelineOptions) -> None:
    """One line for what Beam would only find out with a traceback or a hang: a bad Dask worker
    count or scheduler file, a portable runner with no job service or one that does not answer,
    a Flink/Spark job server that cannot start or a cluster that does not answer."""
    runner = options.get_all_options()["runner"]
    if runner in DASK_NAMES:
        from .dask_runner import check_options

        check_options(options)
    if runner in (*DASK_NAMES, "DataflowRunner"):
        check_buckets(options)
    portable = options.view_as(PortableOptions)
    endpoint = portable.job_endpoint
    if not str(portable.environment_cache_millis).isdigit():  # Beam takes any string; the job server fails on it
        raise UserError(f"--environment_cache_millis: expected milliseconds (a whole number, 0 or more), "
                        f"got {portable.environment_cache_millis!r}")
    if runner == "PortableRunner" and not endpoint:
        raise UserError("--runner PortableRunner needs --job_endpoint: the address of a running job service "
                        "(a Flink or Spark job server, host:8099), or 'embed' for Beam's own in this process")
    if endpoint and endpoint != "embed":
        check_reachable(endpoint, "--job_endpoint (the job service)")
    if runner in JAR_RUNNERS and not endpoint:
        check_job_server(runner, options)
    if runner == "PrismRunner" and not endpoint:
        check_prism(options)


def check_relative_paths(paths: list[tuple[str, str]], options: PipelineOptions) -> None:
    """One line for a relative local path when the SDK workers do not run in this process's folder
    (Flink's and Spark's executors, Dataflow, an EXTERNAL, PROCESS or DOCKER environment): each
    would resolve it in its own, read nothing there and write the corpus somewhere else."""
    runner = options.get_all_options()["runner"]
    environment = options.view_as(PortableOptions).environment_type or ""
    if runner not in (*JAR_RUNNERS, "DataflowRunner") and environment.upper() not in ("EXTERNAL", "PROCESS", "DOCKER"):
        return
    for what, path in paths:
        if "://" not in path and not os.path.isabs(path):
            raise UserError(f"{what} {path}: a relative path, which each SDK worker of --runner {runner} would resolve "
                            f"in its own working folder: give it as {os.path.abspath(path)}")


def check_prism(options: PipelineOptions) -> None:
    """One line where Beam would download Prism (no ``--prism_location``, or an http(s) one) or
    fail on a binary that is not there."""
    from apache_beam.options.pipeline_options import PrismRunnerOptions

    location = options.view_as(PrismRunnerOptions).prism_location
    if not location or location.startswith(("http://", "https://")):
        raise UserError(f"--runner PrismRunner: Beam would download Prism from {location or 'GitHub'}: run "
                        f"workflows/setup.sh (it builds Prism with Go into {PRISM}) or pass --prism_location=PATH "
                        f"to a prism binary (`go install github.com/apache/beam/sdks/v2/go/cmd/prism@v<Beam version>`)")
    if "://" not in location and not os.path.isfile(location):
        raise UserError(f"--prism_location {location}: no such file")
    if "://" not in location and not location.endswith(".zip"):  # a binary that cannot run: Beam's traceback otherwise
        try:
            subprocess.run([location, "--help"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UserError(f"--prism_location {location}: cannot run it as a program "
                            f"({getattr(exc, 'strerror', None) or exc})") from None


def check_job_server(runner: str, options: PipelineOptions) -> None:
    """One line for a Flink/Spark job server that cannot start or reach its cluster: no Java, no
    JAR (or one that would be downloaded), a JAR built for another Flink version, a master that
    does not answer."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, JobServerOptions, SparkRunnerOptions
    from apache_beam.runners.portability.flink_runner import MAGIC_HOST_NAMES, FlinkJarJobServer
    from apache_beam.runners.portability.spark_runner import SparkJarJobServer
    from apache_beam.utils.subprocess_server import JavaJarServer

    jar_flag, master_flag = JAR_RUNNERS[runner]
    java = options.view_as(JobServerOptions).job_server_java_launcher
    if not shutil.which(java):
        raise UserError(f"--runner {runner} starts Beam's job server with Java, and {java!r} is not on PATH: "
                        f"install a JDK (11 or later; apt-get install openjdk-17-jre-headless) or pass --job_endpoint "
                        f"HOST:PORT of a running job server")
    server = FlinkJarJobServer(options) if runner == "FlinkRunner" else SparkJarJobServer(options)
    try:
        jar = server.path_to_jar()
    except ValueError as exc:  # a --*_job_server_jar that is neither a file nor a URL
        raise UserError(first_line(exc)) from None
    if not (os.path.exists(jar) or os.path.exists(os.path.join(JavaJarServer.JAR_CACHE, os.path.basename(jar)))):
        raise UserError(f"--runner {runner} starts its job server from {os.path.basename(jar)}, which is not in "
                        f"{JavaJarServer.JAR_CACHE} and would be downloaded from {jar}: run workflows/setup.sh (it "
                        f"builds Beam's job servers with Maven into {JOB_SERVERS}), pass {jar_flag}=PATH to a "
                        f"downloaded copy, or --job_endpoint=HOST:PORT of a running job server (and {master_flag} "
                        f"for the cluster)")
    if runner == "FlinkRunner":
        flink = options.view_as(FlinkRunnerOptions)
        if Path(jar).resolve().parent.parent == JOB_SERVERS.resolve() and flink.flink_version != BUILT_FLINK_VERSION:
            raise UserError(f"--flink_version {flink.flink_version}: the job server set-up built ({jar}) is Beam's for "
                            f"Flink {BUILT_FLINK_VERSION}; for a Flink {flink.flink_version} cluster pass "
                            f"--flink_job_server_jar=beam-runners-flink-{flink.flink_version}-job-server-<version>.jar")
        if flink.flink_master not in MAGIC_HOST_NAMES:
            address = flink.flink_master.split("://", 1)[-1].rstrip("/")
            check_reachable(address if ":" in address else f"{address}:8081", "--flink_master (Flink's REST endpoint)")
    else:
        master = options.view_as(SparkRunnerOptions).spark_master_url
        if master.startswith("spark://"):
            check_reachable(master.removeprefix("spark://"), "--spark_master_url (the Spark master)")
