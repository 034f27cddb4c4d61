"""The newcomer's documents name what exists: every repository path in README.md and docs/*.md is
there (also as the command of a longer code span), and every ``from module import name`` they
show resolves (the names read from the module's source; only its packages' ``__init__`` run).
BENCHMARKS.md is a dated log and names what existed then."""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"`((?:pipeline|pretrain|xeval|workflows|configs|tests|docs)/[A-Za-z0-9_./*-]*)(?: [^`]*)?`")
IMPORT = re.compile(r"\bfrom ((?:pipeline|pretrain|xeval)(?:\.\w+)*) import (\w+(?:, *\w+)*)")


def test_the_documents_paths_exist():
    missing = [f"{doc.name}: {path}" for doc in DOCS for path in PATH.findall(doc.read_text(encoding="utf-8"))
               if not any(ROOT.glob(path.rstrip("/")))]
    assert not missing, "\n".join(missing)


def defined_names(module: str) -> set[str]:
    """Top-level names a module's source defines or imports (its submodules too, for a package)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"no module {module}"
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names = {alias.asname or alias.name.split(".")[0] for node in tree.body
             if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    for folder in spec.submodule_search_locations or []:
        names.update(p.stem for p in Path(folder).glob("*.py"))
        names.update(p.name for p in Path(folder).iterdir() if (p / "__init__.py").exists())
    return names


def test_the_documents_imports_exist():
    shown = [found for doc in DOCS for found in IMPORT.findall(doc.read_text(encoding="utf-8"))]
    assert shown  # the pattern still finds the examples README.md shows
    missing = [f"from {module} import {name}" for module, names in shown
               for name in (n.strip() for n in names.split(",")) if name and name not in defined_names(module)]
    assert not missing, "\n".join(missing)
