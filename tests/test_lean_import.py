"""``pipeline run`` imports Beam without the cloud clients a run with no URL in its config never
uses (``pipeline.runners.lean_import``)."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT

from pipeline.runners import lean_import


def test_beam_imports_without_them_and_they_import_after_it():
    """Beam's own import skips each module of LEFT_OUT without a word (each is inside a ``try`` of the
    installed Beam), local paths work, and once Beam is imported they import as usual."""
    code = """
import sys
from pipeline.runners import lean_import
lean_import.install()
import apache_beam
from apache_beam.io.filesystems import FileSystems
print(sorted(m for m in (*lean_import.LEFT_OUT, "google.cloud.storage", "boto3") if m in sys.modules))
print(FileSystems.exists(sys.argv[1]))
import apache_beam.io.aws.s3filesystem, apache_beam.io.gcp.gcsfilesystem, google.cloud.dataflow
print(type(FileSystems.get_filesystem("s3://a/b")).__name__, type(FileSystems.get_filesystem("gs://a/b")).__name__)
"""
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "README.md")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "True", "S3FileSystem GCSFileSystem"]
    assert done.stderr == ""


OURS = ["pipeline.steps.dedup", "pipeline.steps.lid"]


@pytest.mark.parametrize("main, config, steps, lean", [
    ("pipeline.__main__", [["in/*.gz"], "out", [], {"lid": {"model": "/m/lid.bin"}}], OURS, True),
    ("pipeline.__main__", [["s3://bucket/in/*.gz"], "out", [], {}], OURS, False),
    ("pipeline.__main__", [["in/*.gz"], "out", [], {"lid": {"model": "gs://b/lid.bin"}}], OURS, False),
    ("pipeline.__main__", [["in/*.gz"], "out", ["--s3_endpoint_url=http://127.0.0.1:9000"], {}], OURS, False),
    ("pipeline.__main__", [["in/*.gz"], "out", [], {}], [*OURS, "my_steps.filters"], False),  # a plugin step
    ("pytest", [["in/*.gz"], "out", [], {}], OURS, False),  # a process that runs more than one run
])
def test_left_out_only_by_the_cli_for_our_steps_and_no_url(monkeypatch, main, config, steps, lean):
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(__spec__=SimpleNamespace(name=main)))
    assert lean_import.wanted(config, steps) is lean
