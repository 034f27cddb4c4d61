"""Shared fixtures: the bundled sample, CCNet's reference source, and real-format WARC writers."""
from __future__ import annotations

import base64
import dataclasses
import gzip
import hashlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflows"))  # what the tests share with the benchmarks (reference_data, quality_docs)
from reference_data import CCNET, SAMPLE, SAMPLE_LANGS, split_reference  # noqa: E402
# google-auth, looking for credentials for the GCS emulator's clients and Dataflow's dry run, would
# ask GCE's metadata server (169.254.169.254); read when google.auth is imported, in every process
os.environ.setdefault("NO_GCE_CHECK", "true")


@pytest.fixture(scope="session", autouse=True)
def beam_temp_folders_removed():
    """The ``beam-pipeline-temp*`` folders of the graphs tests build and never run, removed at the
    session's end: Beam makes one in ``Pipeline.__init__`` and removes it only in ``run()``. Only
    the folders this process made (``tempfile.mkdtemp`` noted), so another process's stay."""
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def noted(*args, **kwargs):
        path = mkdtemp(*args, **kwargs)
        if os.path.basename(path).startswith("beam-pipeline-temp"):
            made.append(path)
        return path

    tempfile.mkdtemp = noted
    yield
    tempfile.mkdtemp = mkdtemp
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


os.environ["POLYGLOT_SCRATCH_SPARE"] = "0"  # spills leave nothing spare: the disk's room, whatever the host's, in
# every process a test starts too (a nearly full disk gave none: spill.budget, and a warning in each run's stderr)


@pytest.fixture(autouse=True)
def scratch_on_a_roomy_disk(tmp_path_factory):
    """Scratch folders under test lie on a disk with room, whatever the host's: a ``/tmp`` on a
    tmpfs or a disk with less free than the spare (``spill.budget``: no spill) would make every
    test of spills and stashes see none. The folder must still exist (a gone one gives no room);
    the tests of memory and of a full disk set their own. (A MonkeyPatch of its own: the test's
    ``monkeypatch`` keeps its place among the test's fixtures.)"""
    from pipeline.readers import spill

    table = tmp_path_factory.getbasetemp() / "mounts"
    if not table.exists():
        table.write_text("/dev/vda / ext4 rw 0 0\n")
    backed, usage = spill.memory_backed, shutil.disk_usage

    def roomy(path):
        return usage(path)._replace(total=2**40, used=2**39, free=2**39)  # (OSError where it is gone)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spill, "memory_backed", lambda path, mounts=str(table): backed(path, mounts))
        patch.setattr(shutil, "disk_usage", roomy)
        yield


@pytest.fixture(scope="session")
def sample() -> Path:
    return SAMPLE


@pytest.fixture(scope="session")
def ccnet_normalizer() -> ModuleType:
    """CCNet's own ``text_normalizer.py`` (fetched by workflows/setup.sh from its PyPI sdist)."""
    path = CCNET / "text_normalizer.py"
    assert path.is_file(), f"{path} missing: run `make test` (workflows/setup.sh fetches it)"
    spec = importlib.util.spec_from_file_location("ccnet_text_normalizer", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"{what} did not start on 127.0.0.1:{port}"
            time.sleep(0.2)


@pytest.fixture
def gcs_emulator():
    """gcp-storage-emulator on 127.0.0.1 with bucket ``polyglot``, stopped at the end; yields
    (environment for subprocesses, the bucket). Beam's and our clients find it through
    STORAGE_EMULATOR_HOST, set in this process too while the fixture lives."""
    pytest.importorskip("gcp_storage_emulator", reason="gcp-storage-emulator is not installed (make test installs it)")
    from google.cloud import storage

    port = free_port()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "gcp-storage-emulator"), "start", "--host", "127.0.0.1",
                             "--port", str(port), "--in-memory", "--default-bucket", "polyglot"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
    try:
        wait_for_port(port, "gcp-storage-emulator")
        os.environ["STORAGE_EMULATOR_HOST"] = env["STORAGE_EMULATOR_HOST"]
        yield env, storage.Client.create_anonymous_client().bucket("polyglot")
    finally:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def fake_gcs():
    """fake-gcs-server (Go; ``make test`` builds it) on 127.0.0.1 with bucket ``polyglot``, in memory,
    stopped at the end: a GCS server that keeps GCS's preconditions (``ifGenerationMatch``), which
    gcp-storage-emulator ignores; it has no batch API, which Beam's deletes use. Yields the bucket;
    our clients find it through STORAGE_EMULATOR_HOST, set while the fixture lives."""
    binary = Path(sys.executable).parent.parent / "fake-gcs" / "fake-gcs-server"
    if not binary.exists():
        pytest.skip("fake-gcs-server is not built (make test builds it where Go is installed)")
    from google.cloud import storage

    port = free_port()
    proc = subprocess.Popen([str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend",
                             "memory", "-public-host", f"127.0.0.1:{port}", "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, "fake-gcs-server")
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        yield storage.Client.create_anonymous_client().create_bucket("polyglot")
    finally:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
        proc.kill()
        proc.wait(timeout=30)


@dataclasses.dataclass
class S3Server:
    endpoint: str
    client: object  # a boto3 S3 client of the server

    @property
    def flags(self) -> list[str]:
        """The Beam pipeline options a user passes to reach this server."""
        return [f"--s3_endpoint_url={self.endpoint}", "--s3_access_key_id=polyglot", "--s3_secret_access_key=polyglot",
                "--s3_region_name=us-east-1"]

    def require_credentials(self, required: bool) -> None:
        """Make moto check access keys (none is registered, so every request is refused) or not."""
        import requests

        requests.post(f"{self.endpoint}/moto-api/reset-auth", data=b"0" if required else b"inf", timeout=10)


@pytest.fixture
def s3_server():
    """moto's S3 server on 127.0.0.1 (in this process, its own thread) with bucket ``polyglot``, stopped at the end."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (make test installs it)")
    import boto3
    import requests
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    requests.post(f"{endpoint}/moto-api/reset", timeout=10)  # moto's state is per process: start empty
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="polyglot", aws_secret_access_key="polyglot",
                          region_name="us-east-1")
    client.create_bucket(Bucket="polyglot")
    try:
        yield S3Server(endpoint, client)
    finally:
        server.stop()


def shard_writes_die_after(monkeypatch, n: int) -> list[str]:
    """Make the shard sink raise "worker lost" after ``n`` shards (in this process's workers);
    returns the list of the paths written before that."""
    import pipeline.output.shards as sinks

    write_table, written = sinks.write_table, []

    def dies(table, path, fmt):
        if len(written) == n:
            raise RuntimeError("worker lost")
        written.append(path)
        write_table(table, path, fmt)

    monkeypatch.setattr(sinks, "write_table", dies)
    return written


def block_digest(body: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(body).digest()).decode()


def warc_record(body: bytes, *, rtype: str = "conversion", uri: str = "https://example.org/page",
                record_id: str = "<urn:uuid:00000000-0000-0000-0000-000000000001>",
                content_length: int | None = None, content_type: str = "text/plain",
                drop: tuple[str, ...] = (), digest: bool = True, title: str | None = "A page title",
                identified: str | None = None) -> bytes:
    """One WARC/1.0 record exactly as CommonCrawl writes it (headers, block, CRLF CRLF), uncompressed.
    A WET body starts with the page's title line, as CommonCrawl's do (``title=None``: ``body`` as is).
    ``identified``: its ``WARC-Identified-Payload-Type``."""
    if rtype == "conversion" and title is not None:
        body = title.encode() + b"\n" + body
    headers = {
        "WARC-Type": rtype,
        "WARC-Target-URI": uri,
        "WARC-Date": "2024-02-20T10:11:12Z",
        "WARC-Record-ID": record_id,
        "WARC-Refers-To": "<urn:uuid:00000000-0000-0000-0000-0000000000ff>",
        "WARC-Block-Digest": block_digest(body) if digest else None,
        "Content-Type": content_type,
        "WARC-Identified-Payload-Type": identified,
        "Content-Length": str(len(body) if content_length is None else content_length),
    }
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if v is not None and k not in drop)
    return b"WARC/1.0\r\n" + head.encode() + b"\r\n" + body + b"\r\n\r\n"


def kill_at_fault(proc: subprocess.Popen) -> None:
    """Once a ``pipeline run`` started with ``POLYGLOT_FAULT`` (and ``start_new_session``, its stderr
    piped) says it reached its fault point, SIGKILL its whole session (a driver killed there)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("fault point"):
            break
    else:
        pytest.fail(f"the run ended (rc {proc.wait()}) before its fault point")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def gz(record: bytes) -> bytes:
    """A gzip member of its own, as CommonCrawl compresses every record."""
    return gzip.compress(record, mtime=0)


sys.path.insert(0, str(Path(__file__).parent))
from pretrain_fixtures import sample_tokenizer, sample_tokens  # noqa: E402,F401  (session fixtures)

@pytest.fixture(scope="session")
def sample_lms(tmp_path_factory) -> Path:
    """SentencePiece + KenLM models for every sample language, trained on 80 % of its reference text."""
    from pipeline.steps.lm import train_lm

    out = tmp_path_factory.mktemp("lm")
    texts = tmp_path_factory.mktemp("lm-text")
    for lang in SAMPLE_LANGS:
        train, _ = split_reference(lang)
        (texts / f"{lang}.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
        train_lm(lang, [str(texts / f"{lang}.txt")], out, vocab_size=8000)
    return out


@pytest.fixture(scope="session")
def sample_corpus(tmp_path_factory) -> Path:
    """The pipeline's output on the whole bundled WET sample (dedup, LID, near-dup; no perplexity,
    so every document is in bucket 'all'), shared by the pretraining and evaluation tests."""
    from pipeline.__main__ import main

    out = tmp_path_factory.mktemp("sample-corpus") / "corpus"
    assert main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--output", str(out),
                 "--set", "beam_options=[]", "--set", "write.shard_size_mb=0.25"]) == 0
    return out


@pytest.fixture(scope="session")
def planted(sample, sample_corpus, sample_lms, tmp_path_factory) -> dict:
    """The planted corpus (``test_engines.planted_corpus``), its config (near-dup and perplexity
    buckets on) and the DirectRunner's bytes, shared by every engine's byte-identity test."""
    from test_engines import planted_corpus, run

    root = tmp_path_factory.mktemp("engines")
    inputs = planted_corpus(sample, sample_corpus, root / "in")
    cutoffs = root / "cutoff.csv"
    langs = sorted(p.name.split(".")[0] for p in sample_lms.glob("*.arpa.bin"))
    cutoffs.write_text(",".join(["", *langs]) + "\n" + "".join(
        ",".join([str(p), *(str(50 + 5 * p) for _ in langs)]) + "\n" for p in range(100)))
    config = ["--config", "configs/corpus/sample.yaml", "--input", str(inputs / "*.gz"),
              "--set", f"perplexity.models={sample_lms}", "--set", f"perplexity.cutoffs={cutoffs}",
              "--set", "write.shard_size_mb=0.25", "--set", "beam_options=[]"]
    reference = run(config, root / "direct", "--runner", "DirectRunner")
    return {"config": config, "reference": reference, "root": root}


CHECK_SCRIPT = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message || e.target.src || e.type)), true);
window.addEventListener("load", () => {
  const images = [...document.images];
  const out = document.createElement("pre");
  out.id = "__check";
  out.textContent = JSON.stringify({images: images.length, broken: images.filter(i => !i.complete || i.naturalWidth === 0).length,
    tables: document.querySelectorAll("table").length, errors: window.__errors});
  document.body.appendChild(out);
});
</script>"""


def open_in_chromium(page: Path, screenshot: Path) -> dict:
    """Open ``page`` in headless Chromium (Debian's ``chromium``): a full-page screenshot, and what
    the page saw once loaded: its images, how many did not load (naturalWidth 0), its tables, and
    the errors its window and the browser's console reported. Skips the test without Chromium."""
    import html
    import json as _json
    import re
    import shutil
    import tempfile

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("headless Chromium not installed (Debian: chromium; workflows/setup.sh installs it as root)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--hide-scrollbars",
             "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"]
    with tempfile.TemporaryDirectory() as profile:
        checked = page.with_name(f".checked-{page.name}")
        checked.write_text(page.read_text(encoding="utf-8").replace("</body>", CHECK_SCRIPT + "</body>"), encoding="utf-8")
        try:
            dom = subprocess.run([browser, *flags, f"--user-data-dir={profile}", "--dump-dom", checked.as_uri()],
                                 capture_output=True, text=True, timeout=120)
        finally:
            checked.unlink()
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        shot = subprocess.run([browser, *flags, f"--user-data-dir={profile}", "--window-size=1280,2400",
                               f"--screenshot={screenshot}", page.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="__check">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stderr[-3000:]
    result = _json.loads(html.unescape(found.group(1)))
    result["console_errors"] = [line for line in dom.stderr.splitlines() + shot.stderr.splitlines()
                                if "CONSOLE" in line and ("ERROR" in line or "Uncaught" in line)]
    result["screenshot"] = screenshot.is_file() and screenshot.stat().st_size > 1000
    return result
