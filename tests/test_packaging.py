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
    modules = {m.relative_to(ROOT).as_posix() for m in (ROOT / "pipeline").rglob("*.py")}
    assert len(modules) > 40 and modules <= names, sorted(modules - names)[:5]  # the subpackages too
    for dep in ("apache-beam", "pyarrow", "fasttext-numpy2", "fastwarc", "resiliparse"):
        assert f"Requires-Dist: {dep}" in pkg_info
    assert not any(n.startswith("tests/data/sample") for n in names)


def test_workers_do_not_install_the_training_stack(sdist):
    _, pkg_info = sdist
    requires = [line for line in pkg_info.splitlines() if line.startswith("Requires-Dist:")]
    for dep in ("torch", "deepspeed"):
        [line] = [r for r in requires if r.split()[1].startswith(dep)]
        assert 'extra == "train"' in line


PACKAGES = ["pipeline", "pretrain", "xeval"]
LAYERS = {"pipeline": 0, "pretrain": 1, "xeval": 2}  # a package imports only from its own layer or lower


def module_imports() -> dict[str, set[str]]:
    """Every module of our packages -> what it imports from them (``package.module`` or
    ``package.module.name``), wherever in its code the import is."""
    import ast

    root = Path(__file__).parents[1]
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            is_package = path.name == "__init__.py"
            found = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    prefix = ".".join(base[:len(base) - node.level + 1]) if node.level else ""
                    target = ".".join(p for p in (prefix, node.module or "") if p)
                    found.update(f"{target}.{a.name}" for a in node.names)  # a module, or a name in one
                elif isinstance(node, ast.Import):
                    found.update(a.name for a in node.names)
            graph[name] = {m for m in found if m.split(".")[0] in PACKAGES}
    return graph


def test_imports_run_one_way_without_circles():
    """xeval -> pretrain -> pipeline, and no module reaches itself through others."""
    graph = module_imports()
    for module, targets in graph.items():
        for target in targets:
            assert LAYERS[target.split(".")[0]] <= LAYERS[module.split(".")[0]], f"{module} imports {target}"
    known = set(graph)

    def resolve(target: str) -> str | None:
        while target and target not in known:  # pretrain.models.rtd.ReplacedTokenDetection -> pretrain.models.rtd
            target = target.rpartition(".")[0]
        return target or None

    for start in graph:
        seen, stack = set(), [resolve(t) for t in graph[start]]
        while stack:
            module = stack.pop()
            if module is None or module in seen or module == start.rpartition(".")[0]:
                continue
            assert module != start, f"{start} imports itself through {sorted(seen)}"
            seen.add(module)
            stack.extend(resolve(t) for t in graph[module])
