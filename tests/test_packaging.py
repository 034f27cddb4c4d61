"""The sdist Dataflow workers install (--extra_package) builds and carries every pipeline module."""
from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sdist_contains_the_pipeline(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    [sdist] = tmp_path.glob("polyglot_corpus-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {Path(n).relative_to(Path(n).parts[0]).as_posix() for n in tar.getnames() if len(Path(n).parts) > 1}
        pkg_info = tar.extractfile(next(n for n in tar.getnames() if n.endswith("/PKG-INFO"))).read().decode()
    for module in (ROOT / "pipeline").glob("*.py"):
        assert f"pipeline/{module.name}" in names
    for dep in ("apache-beam", "pyarrow", "fasttext-numpy2", "fastwarc", "resiliparse"):
        assert f"Requires-Dist: {dep}" in pkg_info
    assert not any(n.startswith("tests/data/sample") for n in names)
