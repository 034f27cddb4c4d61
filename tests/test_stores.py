"""Object stores on real servers started by the tests on 127.0.0.1: moto's S3 server and
gcp-storage-emulator. A run from a bucket to a bucket (inputs, LID model, LM folder, cutoff.csv
all in the bucket) writes what a local run of the same files writes; a run that fails leaves the
previous corpus; a store that refuses is one line before any work; big objects stream; the
DaskRunner shuffles through a bucket given as ``--temp_location``."""
from __future__ import annotations

import base64
import io
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import free_port, gz, kill_at_fault, shard_writes_die_after, warc_record

from pipeline.__main__ import main
from pipeline.steps.lid import default_model_path
from pipeline.steps.perplexity import write_cutoffs

pytestmark = pytest.mark.timeout(600)


class Bucket:
    """The same few operations on an S3 bucket (boto3) and a GCS bucket (google-cloud-storage)."""

    def __init__(self, scheme: str, handle, flags: list[str]) -> None:
        self.scheme, self.handle, self.flags = scheme, handle, flags

    def url(self, key: str) -> str:
        return f"{self.scheme}://polyglot/{key}"

    def put(self, key: str, data: bytes) -> None:
        if self.scheme == "s3":
            self.handle.put_object(Bucket="polyglot", Key=key, Body=data)
        else:
            self.handle.blob(key).upload_from_string(data)

    def get(self, key: str) -> bytes:
        if self.scheme == "s3":
            return self.handle.get_object(Bucket="polyglot", Key=key)["Body"].read()
        return self.handle.blob(key).download_as_bytes()

    def keys(self, prefix: str) -> list[str]:
        if self.scheme == "s3":
            pages = self.handle.get_paginator("list_objects_v2").paginate(Bucket="polyglot", Prefix=prefix)
            return sorted(o["Key"] for page in pages for o in page.get("Contents", []))
        return sorted(b.name for b in self.handle.list_blobs(prefix=prefix))

    def digests(self, prefix: str) -> dict[str, bytes]:
        return {k[len(prefix):]: self.get(k) for k in self.keys(prefix) if not k.endswith("run.json")}


@pytest.fixture(params=["s3", pytest.param("gs", marks=pytest.mark.slow)])
def bucket(request) -> Bucket:
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        return Bucket("s3", server.client, server.flags)
    _, gcs = request.getfixturevalue("gcs_emulator")
    return Bucket("gs", gcs, [])


def fill(bucket: Bucket, files: list[Path], lms: Path, cutoffs: Path) -> None:
    """The inputs and every model the run needs, in the bucket."""
    for f in files:
        bucket.put(f"crawl/{f.name}", f.read_bytes())
    bucket.put("models/lid.176.ftz", Path(default_model_path()).read_bytes())
    for f in sorted(lms.iterdir()):
        bucket.put(f"models/lm/{f.name}", f.read_bytes())
    bucket.put("models/cutoff.csv", cutoffs.read_bytes())


def rows_without_source(read) -> dict[str, list[dict]]:
    """Every shard's rows, ``source`` (which names the input path) left out."""
    out = {}
    for name, data in read:
        table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        out[name] = table.drop_columns(["source"]).to_pylist()
    return out


@pytest.fixture(scope="module")
def local_reference(sample, sample_lms, tmp_path_factory):
    """A local run of two sample files scored and bucketed: (files, lms, cutoffs, output folder)."""
    root = tmp_path_factory.mktemp("stores-local")
    files = sorted((sample / "wet").glob("*.warc.wet.gz"))[:2]
    cutoffs = root / "cutoff.csv"
    write_cutoffs({lang: [50.0 + 20 * p for p in range(101)] for lang in ("de", "en", "fr", "ru", "zh")}, str(cutoffs))
    out = root / "corpus"
    assert main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--set", "beam_options=[]",
                 "--input", str(files[0]), "--input", str(files[1]), "--output", str(out),
                 "--set", f"lid.model={default_model_path()}", "--set", f"perplexity.models={sample_lms}",
                 "--set", f"perplexity.cutoffs={cutoffs}"]) == 0
    return files, sample_lms, cutoffs, out


def written(root: Path) -> dict[str, bytes]:
    """Every file a local run wrote below ``root`` but run.json, by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != "run.json"}


def without_model_paths(stats: bytes) -> dict:
    """stats.json less the config's model paths (which name the bucket or the local folder)."""
    data = json.loads(stats)
    for section, key in (("lid", "model"), ("perplexity", "models"), ("perplexity", "cutoffs")):
        assert data["config"][section].pop(key)
    return data


def store_run(bucket: Bucket, *extra: str) -> int:
    return main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--set", "beam_options=[]",
                 "--input", bucket.url("crawl/*.gz"), "--output", bucket.url("corpus"),
                 "--set", f"lid.model={bucket.url('models/lid.176.ftz')}", "--set", f"perplexity.models={bucket.url('models/lm')}",
                 "--set", f"perplexity.cutoffs={bucket.url('models/cutoff.csv')}", *bucket.flags, *extra])


def test_a_run_from_bucket_to_bucket_writes_what_a_local_run_writes(bucket, local_reference, capsys):
    files, lms, cutoffs, local = local_reference
    fill(bucket, files, lms, cutoffs)
    assert store_run(bucket) == 0
    stored = bucket.digests("corpus/")
    local_files = written(local)
    assert sorted(stored) == sorted(local_files)  # the same files, no staging folder or probe left behind
    assert stored["sampling.json"] == local_files["sampling.json"]
    assert without_model_paths(stored["stats.json"]) == without_model_paths(local_files["stats.json"])
    shards = sorted(k for k in stored if k.startswith("lang="))
    assert any("bucket=head" in k for k in shards) and any("bucket=tail" in k for k in shards)
    assert rows_without_source((k, stored[k]) for k in shards) == rows_without_source((k, local_files[k]) for k in shards)
    for plot in ("funnel", "languages", "sampling", "perplexity", "near_dedup", "rejected"):  # the corpus report
        assert stored[f"report/{plot}.png"] == local_files[f"report/{plot}.png"]
    assert main(["report", bucket.url("corpus"), "--out", bucket.url("rebuilt"), *bucket.flags]) == 0
    assert bucket.get("rebuilt/report.html") == stored["report/report.html"]
    # the pipeline reads its own bucket output too: cutoffs computed from the stored corpus
    assert main(["cutoffs", "--corpus", bucket.url("corpus"), "--out", bucket.url("derived/cutoff.csv"), *bucket.flags]) == 0
    assert bucket.get("derived/cutoff.csv").startswith(b",ar,de,el,en,")
    capsys.readouterr()  # and status reads each shard's footer from the bucket: whole
    assert main(["status", bucket.url("corpus"), *bucket.flags]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"{bucket.url('corpus')}: a finished corpus ("), out


@pytest.mark.slow  # make test keeps the local case (test_pipeline.py)
def test_a_failed_run_on_a_bucket_leaves_the_previous_corpus(bucket, local_reference, monkeypatch):
    files, lms, cutoffs, _ = local_reference
    fill(bucket, files[:1], lms, cutoffs)
    assert store_run(bucket, "--set", "write.shard_size_mb=0.05") == 0
    before = bucket.digests("corpus/")
    written = shard_writes_die_after(monkeypatch, 3)
    with pytest.raises(Exception, match="worker lost"):
        store_run(bucket, "--set", "write.shard_size_mb=0.05", "--overwrite", "--set", "dedup.policy=keep_first")
    assert len(written) == 3 and all("/corpus/_staging-" in p for p in written)
    assert bucket.digests("corpus/") == before
    assert not [k for k in bucket.keys("corpus/") if "_staging-" in k or "_probe-" in k]


def test_a_run_on_a_bucket_is_refused_by_a_live_runs_staging_folder_and_removes_a_killed_ones(s3_server, local_reference,
                                                                                              capsys):
    """Nothing locks in a bucket: a run holds its staging folder with a lease its driver renews
    (``output.lease``). Another run on the output is refused while a folder's lease is renewed,
    and removes one whose lease has expired (its driver was killed), with the lease."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.output import fs, lease

    files, lms, cutoffs, _ = local_reference
    bucket = Bucket("s3", s3_server.client, s3_server.flags)
    fill(bucket, files[:1], lms, cutoffs)
    fs.configure(PipelineOptions(s3_server.flags))
    theirs = "corpus/_staging-0123456789ab/"  # a run near its end: statistics at the top, a shard below
    bucket.put(f"{theirs}stats.json", b"{}")
    bucket.put(f"{theirs}lang=en/bucket=all/part-00000.arrow", b"arrow")
    held = lease.Lease(lease.lease_path(bucket.url(theirs)), renew_s=0.2)
    try:
        first = json.loads(bucket.get("corpus/_lease-0123456789ab.json"))["renewed"]
        assert store_run(bucket) == 2
        err = capsys.readouterr().err
        assert f"another run is writing it now ({bucket.url(theirs).rstrip('/')})" in err
        assert f"held by process {os.getpid()} on host {socket.gethostname()}; a killed run's lease expires" in err
        assert bucket.keys(theirs) == [f"{theirs}lang=en/bucket=all/part-00000.arrow", f"{theirs}stats.json"]
        assert json.loads(bucket.get("corpus/_lease-0123456789ab.json"))["renewed"] > first  # renewed meanwhile
    finally:
        held.release()
    time.sleep(0.5)
    assert not bucket.keys("corpus/_lease-")  # released: deleted, and no renewal after that
    bucket.put("corpus/_lease-0123456789ab.json", json.dumps({"renewed": time.time() - lease.EXPIRES_S - 1}).encode())
    bucket.put("corpus/_lease-000000000000.json", json.dumps({"renewed": time.time() - lease.EXPIRES_S - 1}).encode())
    assert store_run(bucket, "--overwrite") == 0  # its driver killed: no longer renewed
    assert not [k for k in bucket.keys("corpus/") if k.startswith("corpus/_")]


def test_a_run_that_lost_its_lease_does_not_replace_the_corpus(s3_server, local_reference, monkeypatch, capsys):
    """A lease gone, another run's, or not renewed for half its life is lost for good, and the run
    fails before its commit: another run may have removed its folder meanwhile. A run killed while
    replacing the corpus, whose lease still holds, stops the next run in one line (the corpus is
    half replaced until the replacement is finished)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.output import fs, lease
    from pipeline.util.errors import UserError

    files, lms, cutoffs, _ = local_reference
    bucket = Bucket("s3", s3_server.client, s3_server.flags)
    fs.configure(PipelineOptions(s3_server.flags))
    for taken in (None, b'{"host": "h", "pid": 1, "token": "theirs", "renewed": 1.0}'):
        held = lease.Lease(bucket.url("leases/_lease-0123456789ab.json"), renew_s=0.1)
        if taken:
            bucket.put("leases/_lease-0123456789ab.json", taken)
        else:
            s3_server.client.delete_object(Bucket="polyglot", Key="leases/_lease-0123456789ab.json")
        time.sleep(0.5)
        with pytest.raises(UserError, match="lost its hold on its staging folder .another run removed or took it"):
            held.check()
        held.release()  # (another run's lease is not deleted)
        assert bucket.keys("leases/") == (["leases/_lease-0123456789ab.json"] if taken else [])
    held = lease.Lease(bucket.url("leases/_lease-0123456789ab.json"), renew_s=0.1)
    open_read = fs.open_read
    monkeypatch.setattr(lease.fs, "open_read", lambda path: (_ for _ in ()).throw(OSError("503 Slow Down")))
    time.sleep(2.0)  # reads that fail, retries included (a store that throttles): no renewal, but not lost
    monkeypatch.setattr(lease.fs, "open_read", open_read)
    stalled = held.renewed
    time.sleep(2.0)
    assert not held.lost and held.renewed > stalled
    held.check()
    held.release()
    fill(bucket, files[:1], lms, cutoffs)
    assert store_run(bucket) == 0
    before = bucket.digests("corpus/")
    capsys.readouterr()
    monkeypatch.setattr(lease, "EXPIRES_S", 1e-6)  # the driver cut off for longer than its lease
    assert store_run(bucket, "--overwrite", "--set", "dedup.policy=keep_first") == 2
    assert f"this run lost its hold on output {bucket.url('corpus')} (not renewed for" in error_line(capsys)
    assert {k: v for k, v in bucket.digests("corpus/").items() if not k.startswith(("_", "."))} == before
    monkeypatch.undo()  # its leases, not renewed for half their life, are left to expire (no other run can
    assert bucket.keys("corpus/.run.lock")  # have taken them and be deleted with them)
    bucket.put("corpus/.run.lock", json.dumps({"renewed": time.time() - lease.EXPIRES_S}).encode())
    replacing = "corpus/_staging-0000000000aa/"  # a run killed while it replaced the corpus, moments ago
    bucket.put(f"{replacing}_COMMIT.json", json.dumps({"moves": [], "delete": []}).encode())
    bucket.put("corpus/_lease-0000000000aa.json", json.dumps({"renewed": time.time()}).encode())
    assert store_run(bucket, "--overwrite") == 2
    assert "a run is replacing the corpus there now" in error_line(capsys)
    for key in bucket.keys("corpus/_lease-"):  # this one's driver and the failed run's, gone for as long as a lease lives
        bucket.put(key, json.dumps({"renewed": time.time() - lease.EXPIRES_S}).encode())
    assert store_run(bucket, "--overwrite") == 0  # the replacement finished, the killed runs' folders and leases gone
    assert not [k for k in bucket.keys("corpus/") if k.startswith("corpus/_")]


@pytest.fixture(params=["s3", "gs"])
def conditional_bucket(request):
    """A bucket on a server that keeps writes' conditions: moto's S3, fake-gcs-server."""
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        return Bucket("s3", server.client, server.flags)
    return Bucket("gs", request.getfixturevalue("fake_gcs"), [])


def test_a_write_conditional_on_the_objects_version_is_refused_once_it_moved_on(conditional_bucket):
    """``stores.put_if``: S3's If-None-Match / If-Match, GCS's ifGenerationMatch; and a lease taken
    over from a killed run by such a write, of two takers only one."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.output import fs, lease, stores

    bucket = conditional_bucket
    fs.configure(PipelineOptions(bucket.flags))
    first = stores.put_if(bucket.url("claim"), b"first", None)
    assert first and stores.put_if(bucket.url("claim"), b"again", None) is None  # create only: there is one
    assert stores.read_versioned(bucket.url("claim")) == (b"first", first)
    second = stores.put_if(bucket.url("claim"), b"second", first)
    assert second and second != first
    assert stores.put_if(bucket.url("claim"), b"late", first) is None  # a taker that read the old version loses
    assert bucket.get("claim") == b"second"
    assert stores.read_versioned(bucket.url("none")) is None and stores.put_if(bucket.url("none"), b"x", first) is None
    stale = json.dumps({"host": "gone", "pid": 1, "token": "theirs", "renewed": time.time() - lease.EXPIRES_S - 1})
    bucket.put("out/.run.lock", stale.encode())
    _, version = stores.read_versioned(bucket.url("out/.run.lock"))
    taken = lease.Lease(bucket.url("out/.run.lock"), renew_s=0.1)  # takes it over from the killed run
    try:
        assert stores.put_if(bucket.url("out/.run.lock"), stale.encode(), version) is None  # a second taker: too late
        with pytest.raises(lease.Held):
            lease.Lease(bucket.url("out/.run.lock"))
        time.sleep(0.5)
        assert not taken.lost and json.loads(bucket.get("out/.run.lock"))["token"] == taken.token  # renewed over its own
    finally:
        taken.release()  # (on fake-gcs-server a warning: Beam's delete takes GCS's batch API, which it lacks)


def test_a_lease_is_written_only_where_none_lives(s3_server, gcs_emulator, monkeypatch):
    """A run refused by a live lease leaves it as it was, even on a store that ignores the writes'
    conditions (gcp-storage-emulator: the refused run's create-only write replaced it, then its
    release deleted it, and the live run failed at its commit); an object there that is no lease
    (a local run's lock file copied up with its folder) is one line, not a hold for good; a store's
    error while taking a lease is one line and leaves no lease."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from botocore.exceptions import ClientError

    from pipeline.output import fs, lease, stores
    from pipeline.util.errors import UserError

    s3 = Bucket("s3", s3_server.client, s3_server.flags)
    for bucket in (s3, Bucket("gs", gcs_emulator[1], [])):
        fs.configure(PipelineOptions(bucket.flags))
        live = lease.Lease(bucket.url("out/.run.lock"), renew_s=60)
        before = bucket.get("out/.run.lock")
        with pytest.raises(lease.Held) as held:
            lease.Lease(bucket.url("out/.run.lock"))
        assert held.value.info["token"] == live.token and bucket.get("out/.run.lock") == before
        live.release()
        assert not bucket.keys("out/")
    bucket = s3
    fs.configure(PipelineOptions(bucket.flags))
    bucket.put("out/.run.lock", f"{socket.gethostname()} 12345\n".encode())
    with pytest.raises(UserError, match=r"out/\.run\.lock: not a lease that `pipeline run` wrote; delete it if no run"):
        lease.Lease(bucket.url("out/.run.lock"))
    bucket.handle.delete_object(Bucket="polyglot", Key="out/.run.lock")
    put_if = stores.put_if

    def slow_down(path: str, data: bytes, version: str | None) -> str | None:
        put_if(path, data, version)  # written, then the answer lost
        raise ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                           "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")

    monkeypatch.setattr(stores, "put_if", slow_down)
    with pytest.raises(UserError, match=r"out/\.run\.lock: cannot take this lease for output \(SlowDown: Please"):
        lease.Lease(bucket.url("out/.run.lock"), what="output")
    assert not bucket.keys("out/")


def test_two_runs_that_start_at_once_on_a_bucket_output_do_not_both_go_on(s3_server, local_reference, capsys):
    """A run holds an output in a bucket with the lease ``.run.lock``, taken by a create-only write
    (``run.claim_output``): of two runs that start at once, the second is refused in one line even
    though neither has a staging folder yet; a killed run's claim, once expired, is taken over, and
    the run leaves none."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.output import fs, lease

    files, lms, cutoffs, _ = local_reference
    bucket = Bucket("s3", s3_server.client, s3_server.flags)
    fill(bucket, files[:1], lms, cutoffs)
    fs.configure(PipelineOptions(s3_server.flags))
    claim = lease.Lease(bucket.url("corpus/.run.lock"), what="output", renew_s=0.2)
    try:
        with pytest.raises(lease.Held):
            lease.Lease(bucket.url("corpus/.run.lock"))
        assert store_run(bucket) == 2
        assert (f"another run is writing it now (process {os.getpid()} on host {socket.gethostname()}); run again once "
                "it is done, or give another output (a killed run's hold expires") in error_line(capsys)
        assert bucket.keys("corpus/") == ["corpus/.run.lock"]
    finally:
        claim.release()
    bucket.put("corpus/.run.lock", json.dumps({"host": "gone", "pid": 1, "token": "theirs",
                                               "renewed": time.time() - lease.EXPIRES_S - 1}).encode())
    assert store_run(bucket) == 0  # a killed run's claim: taken over
    assert not bucket.keys("corpus/.run.lock") and not bucket.keys("corpus/_")


def test_a_delete_in_a_gcs_bucket_takes_its_path_as_a_path(gcs_emulator):
    """Beam's GCS delete matches each path as a glob: ``out[1]/f`` matched ``out1/f`` and not itself."""
    from pipeline.output import fs

    _, gcs = gcs_emulator
    bucket = Bucket("gs", gcs, [])
    for key in ("out[1]/f", "out1/f"):
        bucket.put(key, b"x")
    fs.delete([bucket.url("out[1]/f")])
    assert bucket.keys("out") == ["out1/f"]


def test_a_file_replaced_in_a_bucket_is_never_missing(bucket, monkeypatch):
    """A bucket's rename is a copy: the old object was deleted before it, so a reader found no file
    at the name meanwhile, and a kill in between left none (shards, the report, the commit's moves).
    The copy replaces the old object at once; the name holds a file at every step of the rename."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.output import fs

    fs.configure(PipelineOptions(bucket.flags))
    bucket.put("corpus/stats.json", b"old")
    filesystems, seen = fs.beam_filesystems(), []
    for name in ("delete", "rename"):
        def step(paths, *rest, real=getattr(filesystems, name)):
            real(paths, *rest)
            seen.append("corpus/stats.json" in bucket.keys("corpus/"))
        monkeypatch.setattr(filesystems, name, step)
    fs.write_atomic(bucket.url("corpus/stats.json"), lambda stream: stream.write(b"new"))
    assert bucket.get("corpus/stats.json") == b"new" and bucket.keys("corpus/") == ["corpus/stats.json"]
    assert seen and all(seen), seen


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_a_store_that_refuses_is_one_line_before_any_work(s3_server, gcs_emulator, sample, capsys):
    wet = str(sorted((sample / "wet").glob("*.warc.wet.gz"))[0])
    s3_server.client.put_object(Bucket="polyglot", Key="crawl/a.warc.wet.gz", Body=Path(wet).read_bytes())
    for name in ("a", "b"):  # one file under two names, in each store (the stores' checksums compare them)
        s3_server.client.put_object(Bucket="polyglot", Key=f"twice/{name}.warc.wet.gz", Body=Path(wet).read_bytes())
        gcs_emulator[1].blob(f"twice/{name}.warc.wet.gz").upload_from_filename(wet)
    flags = s3_server.flags
    cases = [
        *[(["--input", f"{store}://polyglot/twice/*.gz", "--output", f"{store}://polyglot/corpus", *extra],
           f"error: input files {store}://polyglot/twice/a.warc.wet.gz and {store}://polyglot/twice/b.warc.wet.gz "
           "hold the same bytes") for store, extra in (("s3", flags), ("gs", []))],
        (["--input", "s3://polyglot/crawl/*.gz", "--output", "s3://no-such-bucket/corpus", *flags],
         "error: output s3://no-such-bucket/corpus: bucket s3://no-such-bucket does not exist"),
        (["--input", "s3://missing-bucket/crawl/*.gz", "--output", "s3://polyglot/corpus", *flags],
         "error: input s3://missing-bucket/crawl/*.gz: bucket s3://missing-bucket does not exist"),
        (["--input", "s3://polyglot/crawl/*.gz", "--output", "s3://polyglot/corpus", "--set", "lid.model=s3://nobucket/lid.bin", *flags],
         "error: lid.model s3://nobucket/lid.bin: bucket s3://nobucket does not exist"),
        (["--input", "s3://polyglot/crawl/*.gz", "--output", "s3://polyglot/corpus",
          f"--s3_endpoint_url=http://127.0.0.1:{free_port()}", *flags[1:]],
         "error: input s3://polyglot/crawl/*.gz: the S3 endpoint cannot be reached"),
        (["--input", "gs://polyglot/crawl/*.gz", "--output", "gs://polyglot/corpus"],
         "error: input 'gs://polyglot/crawl/*.gz' matches no file"),
        (["--input", wet, "--output", "gs://nope-bucket/corpus"],
         "error: output gs://nope-bucket/corpus: bucket gs://nope-bucket does not exist"),
    ]
    for args, expected in cases:
        start = time.monotonic()
        assert main(["run", "--no-progress", "--set", "beam_options=[]", *args]) == 2
        assert error_line(capsys).startswith(expected)
        assert time.monotonic() - start < 60
    s3_server.require_credentials(True)
    try:
        assert main(["run", "--no-progress", "--input", "s3://polyglot/crawl/*.gz", "--output", "s3://polyglot/corpus",
                     *flags]) == 2
        assert error_line(capsys).startswith("error: input s3://polyglot/crawl/*.gz: access denied (Forbidden: check the credentials")
    finally:
        s3_server.require_credentials(False)
    assert s3_server.client.list_objects_v2(Bucket="polyglot", Prefix="corpus").get("KeyCount") == 0


STREAM_CHILD = """
import sys, tracemalloc
from apache_beam.options.pipeline_options import PipelineOptions
from pipeline.output import fs, stores
from pipeline.readers.files import read_file
from pipeline.config import ReadConfig
options = PipelineOptions(sys.argv[2:])
fs.configure(options)
stores.check(sys.argv[1], "input", options)  # as the driver does
tracemalloc.start()
kinds = [type(r).__name__ for r in read_file(sys.argv[1], ReadConfig())]
print(len(kinds), sorted(set(kinds)), tracemalloc.get_traced_memory()[1])
"""


def test_a_wet_file_bigger_than_the_read_buffer_streams_from_the_store(bucket):
    """A ~100 MB object (six read buffers of Beam's store clients) is read with a peak of Python
    memory far below its size: records stream through, nothing downloads the whole object.
    Measured in a child process, since the S3 server runs in this one."""
    rng = random.Random(0)
    data = io.BytesIO()
    for i in range(1000):
        body = "\n".join(base64.b64encode(rng.randbytes(3000)).decode() for _ in range(32)).encode()
        data.write(gz(warc_record(body, record_id=f"<urn:uuid:{i:032d}>", uri=f"https://example.org/{i}")))
    size = data.tell()
    bucket.put("big/big.warc.wet.gz", data.getvalue())
    del data
    proc = subprocess.run([sys.executable, "-c", STREAM_CHILD, bucket.url("big/big.warc.wet.gz"), *bucket.flags],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    records, peak = int(proc.stdout.split()[0]), int(proc.stdout.split()[-1])
    assert records == 1000 and "'dict'" in proc.stdout and "Rejected" not in proc.stdout, proc.stdout
    assert peak < 0.65 * size, (peak, size)


def test_models_are_copied_once_per_worker_and_checked(s3_server, tmp_path, monkeypatch):
    import shutil

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.output import fs
    from pipeline.util.errors import UserError

    model = Path(default_model_path()).read_bytes()
    s3_server.client.put_object(Bucket="polyglot", Key="models/lid.176.ftz", Body=model)
    fs.configure(PipelineOptions(s3_server.flags))
    copy = fs.local_copy("s3://polyglot/models/lid.176.ftz", tmp_path)
    assert copy.read_bytes() == model
    assert fs.local_copy("s3://polyglot/models/lid.176.ftz", tmp_path) == copy  # reused, not copied again
    copy.write_bytes(model[: len(model) // 2])  # a copy cut short by an earlier worker: made again
    assert fs.local_copy("s3://polyglot/models/lid.176.ftz", tmp_path).read_bytes() == model
    retrained = bytes(reversed(model))  # replaced in place by one of the same size: copied again, the old copy gone
    s3_server.client.put_object(Bucket="polyglot", Key="models/lid.176.ftz", Body=retrained)
    assert (fresh := fs.local_copy("s3://polyglot/models/lid.176.ftz", tmp_path)).read_bytes() == retrained
    assert list(tmp_path.iterdir()) == [fresh]
    with pytest.raises(UserError, match="models/nope.ftz: no such object"):
        fs.local_copy("s3://polyglot/models/nope.ftz", tmp_path)
    fresh.unlink()
    copyfileobj = shutil.copyfileobj
    monkeypatch.setattr(shutil, "copyfileobj", lambda src, dst, n: dst.write(src.read(1000)))
    with pytest.raises(UserError, match=rf"copied 1000 of its {len(model)} bytes"):
        fs.local_copy("s3://polyglot/models/lid.176.ftz", tmp_path)
    assert not list(tmp_path.iterdir())  # the short copy was not left for the next worker

    def cut(src, dst, n):
        dst.write(src.read(1000))
        raise ConnectionResetError("the connection broke")

    monkeypatch.setattr(shutil, "copyfileobj", cut)
    with pytest.raises(ConnectionResetError):
        fs.local_copy("s3://polyglot/models/lid.176.ftz", tmp_path)
    monkeypatch.setattr(shutil, "copyfileobj", copyfileobj)
    assert not list(tmp_path.iterdir())  # nor the part a broken connection left


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path):
    from pipeline.output import fs

    def fail(stream):
        stream.write(b"half")
        raise ValueError("the writer failed")

    with pytest.raises(ValueError, match="the writer failed"):
        fs.write_atomic(str(tmp_path / "report.md"), fail)
    assert not list(tmp_path.iterdir())


def test_tokenizer_and_token_shards_from_a_corpus_in_a_bucket(s3_server, sample_corpus, sample_tokenizer, sample_tokens,
                                                              tmp_path):
    """`pretrain tokenizer` and `pretrain tokenize` read a corpus from S3 (Beam's S3 flags; two
    tokenize worker processes) and write what they write from the same corpus on disk."""
    from pretrain_fixtures import SAMPLE_VOCAB

    from pretrain.__main__ import main as pretrain

    for f in sorted(p for p in sample_corpus.rglob("*") if p.is_file()):
        s3_server.client.put_object(Bucket="polyglot", Key=f"corpus/{f.relative_to(sample_corpus)}", Body=f.read_bytes())
    corpus = "s3://polyglot/corpus"
    assert pretrain(["tokenizer", "--corpus", corpus, "--out", str(tmp_path / "tok"), "--vocab-size", str(SAMPLE_VOCAB),
                     "--sample-size", "20000", "--seed", "0", *s3_server.flags]) == 0
    ours, local = (json.loads((d / "tokenizer_meta.json").read_text()) for d in (tmp_path / "tok", sample_tokenizer))
    assert ours.pop("corpus") == corpus and local.pop("corpus") == str(sample_corpus)
    assert ours.pop("weights_from").startswith(f"{corpus}/sampling.json") and local.pop("weights_from")
    assert ours == local  # the same sample drawn, the same model (fingerprint), the same weights
    assert pretrain(["tokenize", "--corpus", corpus, "--tokenizer", str(sample_tokenizer), "--out", str(tmp_path / "tokens"),
                     "--valid-fraction", "0.02", "--workers", "2", "--no-progress", *s3_server.flags]) == 0
    arrays = sorted(p.relative_to(sample_tokens) for p in sample_tokens.rglob("*.npy"))
    assert arrays and arrays == sorted(p.relative_to(tmp_path / "tokens") for p in (tmp_path / "tokens").rglob("*.npy"))
    assert all((tmp_path / "tokens" / a).read_bytes() == (sample_tokens / a).read_bytes() for a in arrays)
    assert pretrain(["tokenize", "--corpus", "s3://no-such-bucket/corpus", "--tokenizer", str(sample_tokenizer),
                     "--out", str(tmp_path / "none"), *s3_server.flags]) == 2


@pytest.mark.slow
def test_the_dask_runner_shuffles_through_a_bucket(s3_server, local_reference, tmp_path):
    """With ``--temp_location`` in a bucket, the DaskRunner's stages hand each other objects there,
    each reader reading only its piece's byte range; the corpus is the local run's, and the run's
    shuffle folder is gone at the end."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.output import fs
    from pipeline.runners.dask_runner import group_part, split_by_key

    fs.configure(PipelineOptions(s3_server.flags))
    split = split_by_key([(k, k * 10) for k in range(6)], "s3://polyglot/unit/split-0", 3)
    assert [group_part(j, [split]) for j in range(3)] == [[(0, [0]), (3, [30])], [(1, [10]), (4, [40])], [(2, [20]), (5, [50])]]
    files, lms, cutoffs, local = local_reference
    out = tmp_path / "corpus"
    assert main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--set", "beam_options=[]",
                 "--input", str(files[0]), "--input", str(files[1]), "--output", str(out),
                 "--set", f"lid.model={default_model_path()}", "--set", f"perplexity.models={lms}",
                 "--set", f"perplexity.cutoffs={cutoffs}", "--runner", "DaskRunner", "--dask_num_workers=2",
                 "--temp_location", "s3://polyglot/tmp", *s3_server.flags]) == 0
    assert written(out) == written(local)
    pages = s3_server.client.get_paginator("list_objects_v2").paginate(Bucket="polyglot", Prefix="tmp/")
    assert [o["Key"] for page in pages for o in page.get("Contents", [])] == []


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of moto's S3 server that answers as S3 does under load:
    every ``slow_every``-th request gets ``503 SlowDown`` (nothing reaches the server), and every
    ``cut_every``-th object GET gets its headers and half its body, then the connection closes.
    The faults are by request number, so a run meets the same share of them every time."""

    SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 b"<Message>Please reduce your request rate.</Message></Error>")
    HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}

    def __init__(self, upstream: str, slow_every: int = 10, cut_every: int = 7) -> None:
        import http.client
        import itertools
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        target = urlsplit(upstream)
        numbers, gets, lock = itertools.count(1), itertools.count(1), threading.Lock()
        self.faults = {"slow_down": 0, "cut": 0, "requests": 0}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # a line per request otherwise
                pass

            def body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b""):  # trailers
                        pass
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def relay(self) -> None:
                body = self.body()
                with lock:
                    n = next(numbers)
                    proxy.faults["requests"] += 1
                    cut = self.command == "GET" and "?" not in self.path and next(gets) % cut_every == 0
                if n % slow_every == 0:
                    with lock:
                        proxy.faults["slow_down"] += 1
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(FaultProxy.SLOW_DOWN)))
                    self.end_headers()
                    if self.command != "HEAD":  # a HEAD answer has no body (S3 then gives no error code)
                        self.wfile.write(FaultProxy.SLOW_DOWN)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in FaultProxy.HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                conn.close()
                self.send_response(response.status)
                for key, value in response.getheaders():  # a HEAD's Content-Length is the object's: kept
                    if key.lower() not in FaultProxy.HOP and (key.lower() != "content-length" or self.command == "HEAD"):
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if cut and response.status in (200, 206) and len(payload) > 1:
                    with lock:
                        proxy.faults["cut"] += 1
                    self.wfile.write(payload[: len(payload) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("engine", [
    pytest.param(["--direct_num_workers=2", "--direct_running_mode=multi_processing"], id="direct"),
    # ~3 min: the shuffle's and the task ledger's small objects, every one through the proxy
    pytest.param(["--runner", "DaskRunner", "--dask_num_workers=2", "--temp_location", "s3://polyglot/tmp"], id="dask",
                 marks=pytest.mark.slow)])
def test_a_throttling_store_is_retried_to_the_same_bytes(s3_server, local_reference, engine):
    """Every 10th request answered 503 SlowDown and every 7th object GET cut mid-body, for the
    inputs, the models, the output and the DaskRunner's shuffle: the run writes what a local run
    writes, stats.json included, and run.json counts the retries (``io``)."""
    files, lms, cutoffs, local = local_reference
    bucket = Bucket("s3", s3_server.client, s3_server.flags)
    fill(bucket, files, lms, cutoffs)
    proxy = FaultProxy(s3_server.endpoint)
    try:
        flags = [f if not f.startswith("--s3_endpoint_url=") else f"--s3_endpoint_url={proxy.endpoint}" for f in s3_server.flags]
        assert store_run(Bucket("s3", s3_server.client, flags), *engine) == 0
    finally:
        proxy.stop()
    assert proxy.faults["slow_down"] >= 10 and proxy.faults["cut"] >= 3, proxy.faults
    stored = bucket.digests("corpus/")
    local_files = written(local)
    assert sorted(stored) == sorted(local_files)
    assert stored["sampling.json"] == local_files["sampling.json"]
    assert without_model_paths(stored["stats.json"]) == without_model_paths(local_files["stats.json"])
    run = json.loads(bucket.get("corpus/run.json"))
    assert 0 < run["io"]["s3_retries"] <= proxy.faults["slow_down"]  # the workers' (not the driver's listing and commit)
    shards = sorted(k for k in stored if k.startswith("lang="))
    assert rows_without_source((k, stored[k]) for k in shards) == rows_without_source((k, local_files[k]) for k in shards)
    assert not bucket.keys("tmp/")


def test_a_killed_copiers_partial_model_copy_is_removed_and_a_live_ones_kept(s3_server, tmp_path, monkeypatch):
    """A worker killed while copying a model left its partial copy, named ``<key>-<version>-lid.176.part-<hex>``
    (``with_suffix``), which no cleanup matched: a model's size per kill. Now ``<copy>.part-<hex>``,
    removed by a later copy once no one has written to it for an hour."""
    import os
    import shutil
    import time

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.output import fs

    model = Path(default_model_path()).read_bytes()
    s3_server.client.put_object(Bucket="polyglot", Key="models/lid.176.ftz", Body=model)
    fs.configure(PipelineOptions(s3_server.flags))
    named: list[str] = []
    copyfileobj = shutil.copyfileobj

    def watched(src, dst, n):
        named.append(dst.name)
        copyfileobj(src, dst, n)

    monkeypatch.setattr(shutil, "copyfileobj", watched)
    copy = fs.local_copy("s3://polyglot/models/lid.176.ftz", tmp_path)
    assert Path(named[0]).name.startswith(f"{copy.name}.part-")
    key = copy.name.split("-", 1)[0]
    stale, older, live = (tmp_path / f"{copy.name}.part-0ld", tmp_path / f"{key}-0123456789ab-lid.176.ftz.part-0ld",
                          tmp_path / f"{copy.name}.part-11ve")
    for partial in (stale, older, live):
        partial.write_bytes(model[:1000])
    for partial in (stale, older):
        os.utime(partial, (time.time() - 2 * 3600, time.time() - 2 * 3600))
    assert fs.local_copy("s3://polyglot/models/lid.176.ftz", tmp_path) == copy
    assert sorted(tmp_path.iterdir()) == sorted([copy, live])


def test_a_resumed_run_on_a_bucket_never_leaves_its_run_state_missing(s3_server, sample, tmp_path):
    """Every ``--resume`` on a bucket wrote the run state again, as a delete then a copy: in the gap
    a second ``--resume`` found no state and started afresh beside the first, and a kill there lost
    the run. A resumed run leaves it as it is, and a run state or marker on a bucket is one upload
    (no temporary object, no delete): in a versioned bucket, the state has one version, and the
    only delete of it is the staging folder's removal at the end."""
    import os

    from pipeline.output import lease
    from pipeline.output.layout import RUN_STATE, STAGING

    client = s3_server.client
    client.create_bucket(Bucket="versioned")
    client.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    wet = str(sorted((sample / "wet").glob("*.warc.wet.gz"))[0])
    command = ["run", "--no-progress", "--input", wet, "--set", "beam_options=[]", "--set", "steps=[dedup, lid]",
               "--runner", "DaskRunner", "--dask_num_workers", "1", "--output", "s3://versioned/corpus",
               "--temp_location", str(tmp_path / "tmp"), *s3_server.flags]
    env = {**os.environ, "POLYGLOT_FAULT": "commit@0", "TMPDIR": str(tmp_path)}
    killed = subprocess.Popen([sys.executable, "-m", "pipeline", *command], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kill_at_fault(killed)
    [held] = [o["Key"] for o in client.list_objects_v2(Bucket="versioned", Prefix="corpus/_lease-")["Contents"]]
    for key in (held, "corpus/.run.lock"):  # its driver killed: as if 120 s had passed
        client.put_object(Bucket="versioned", Key=key, Body=json.dumps({"renewed": time.time() - lease.EXPIRES_S - 1}).encode())
    assert main([*command, "--resume"]) == 0
    listed = client.list_object_versions(Bucket="versioned", Prefix=f"corpus/{STAGING}")
    state = [v for v in listed.get("Versions", []) if v["Key"].endswith(RUN_STATE)]
    deleted = [m for m in listed.get("DeleteMarkers", []) if m["Key"].endswith(RUN_STATE)]
    assert len(state) == 1 and len(deleted) == 1, (state, deleted)
    assert not [v for v in listed.get("Versions", []) if f"{RUN_STATE}.tmp-" in v["Key"] or "_COMMIT.json.tmp-" in v["Key"]]
    assert not list((tmp_path / "tmp").glob("polyglot-run-*"))
