"""The sdist Dataflow workers install (--extra_package) builds, carries every pipeline module, and
keeps the training stack (torch, DeepSpeed) in the `train` extra so workers do not install it."""
from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> tuple[set[str], str]:
    """(file names inside the sdist, its PKG-INFO text)."""
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    [path] = out.glob("polyglot_corpus-*.tar.gz")
    with tarfile.open(path) as tar:
        names = {Path(n).relative_to(Path(n).parts[0]).as_posix() for n in tar.getnames() if len(Path(n).parts) > 1}
        pkg_info = tar.extractfile(next(n for n in tar.getnames() if n.endswith("/PKG-INFO"))).read().decode()
    return names, pkg_info


def test_sdist_contains_the_pipeline(sdist):
    names, pkg_info = sdist
    for module in (ROOT / "pipeline").glob("*.py"):
        assert f"pipeline/{module.name}" in names
    for dep in ("apache-beam", "pyarrow", "fasttext-numpy2", "fastwarc", "resiliparse"):
        assert f"Requires-Dist: {dep}" in pkg_info
    assert not any(n.startswith("tests/data/sample") for n in names)


def test_workers_do_not_install_the_training_stack(sdist):
    _, pkg_info = sdist
    requires = [line for line in pkg_info.splitlines() if line.startswith("Requires-Dist:")]
    for dep in ("torch", "deepspeed"):
        [line] = [r for r in requires if r.split()[1].startswith(dep)]
        assert 'extra == "train"' in line
