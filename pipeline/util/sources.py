"""The code a module runs that is its author's own: the module, the packages above it, and, followed
through the imports written in their source (at any depth: an import inside a function too, and
``importlib.import_module("literal.name")``), the modules of its own top-level package, or, for a
module of one file, the modules and packages beside it. The resume fingerprint hashes a plugin
step's (``pipeline.run.code_digest``): a helper fixed between a kill and ``--resume`` changes the
step as much as its own module does. Modules are found without being imported (a plugin's lazy
imports stay lazy); installed and standard modules are not followed, nor a module imported by a
name computed at run time (``importlib.import_module(f"acme.{lang}")``)."""
from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import os
import site
import sys
import sysconfig
from importlib.machinery import ModuleSpec


def own_sources(name: str, skip: frozenset[str] = frozenset()) -> dict[str, bytes]:
    """``{module name: its file's bytes}`` for module ``name`` and the modules of its own it uses
    (see above), keyed by name so that the same code at another path gives the same. Modules
    without a file (defined in a notebook or ``python -c``, namespace packages) give none;
    extension and bytecode-only modules give their file's bytes. Top-level names in ``skip`` (a
    package hashed already) are not followed."""
    first = _find(name)
    if first is None:
        return {}
    top = name.partition(".")[0]
    beside = None if "." in name or first.submodule_search_locations is not None else _folder_of(first)
    sources: dict[str, bytes] = {}
    parts = name.split(".")
    todo, seen = [name, *(".".join(parts[:i]) for i in range(1, len(parts)))], set()
    while todo:
        module = todo.pop()
        if module in seen or module.partition(".")[0] in skip:
            continue
        seen.add(module)
        if not _own(module, top, beside):
            continue
        spec = first if module == name else _find(module)
        if spec is None:
            continue
        data = _read(spec)
        if data is not None:
            sources[module] = data
        source = _source(spec, module)
        if source is not None:
            todo.extend(imported(source, module, spec.submodule_search_locations is not None))
    return sources


def imported(source: bytes | str, module: str, is_package: bool) -> list[str]:
    """The modules that ``source`` (of ``module``) may import: each ``import a.b`` gives ``a`` and
    ``a.b``; ``from .x import y`` gives the package, ``x`` and ``x.y`` (a name that is no module is
    dropped by the caller); ``importlib.import_module("a.b")`` with a literal name gives it too.
    Unparsable source gives none."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    package = module if is_package else module.rpartition(".")[0]
    names: list[str] = []

    def with_parents(dotted: str) -> None:
        parts = dotted.split(".")
        names.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                with_parents(alias.name)
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            except (ImportError, ValueError):  # a relative import beyond the top-level package
                continue
            with_parents(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            with_parents(node.args[0].value)
    return names


def _own(module: str, top: str, beside: str | None) -> bool:
    """Whether ``module`` is the author's own: of the top-level package ``top``, or, for a plugin of
    one file in folder ``beside`` (None for a package's), a module or package right beside it there
    (not where installed or standard modules are)."""
    first = module.partition(".")[0]
    if first == top:
        return True
    if beside is None or beside in _shared_folders():
        return False
    spec = _find(first)  # (a top-level name: found, not imported)
    return spec is not None and _folder_of(spec) == beside


def _find(module: str) -> ModuleSpec | None:
    """Where ``module`` is loaded from, without importing it or its parent packages (an imported
    one's own spec; a script's ``__main__``: its file), or None where it cannot be found."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        spec = getattr(loaded, "__spec__", None)
        if spec is None and getattr(loaded, "__file__", None):
            spec = importlib.util.spec_from_file_location(module, loaded.__file__)
        return spec
    parent, _, last = module.rpartition(".")
    try:
        if not parent:
            return importlib.util.find_spec(module)  # a top-level name: finders only, nothing imported
        above = _find(parent)
        if above is None or above.submodule_search_locations is None:
            return None
        return importlib.machinery.PathFinder.find_spec(module, list(above.submodule_search_locations))
    except Exception:  # noqa: BLE001 (a finder's own errors: not findable)
        return None


def _folder_of(spec: ModuleSpec) -> str | None:
    """The folder a module of one file lies in, or the folder above a package's."""
    if spec.submodule_search_locations is not None:
        places = list(spec.submodule_search_locations)
        return os.path.dirname(os.path.abspath(places[0])) if places else None
    if spec.origin and spec.has_location:
        return os.path.dirname(os.path.abspath(spec.origin))
    return None


@functools.lru_cache(maxsize=1)
def _shared_folders() -> frozenset[str]:
    """The folders of installed and standard modules."""
    paths = [*getattr(site, "getsitepackages", list)(), getattr(site, "getusersitepackages", str)(),
             *(path for key, path in sysconfig.get_paths().items() if key in ("stdlib", "platstdlib", "purelib", "platlib"))]
    return frozenset(os.path.abspath(path) for path in paths if path)


def _read(spec: ModuleSpec) -> bytes | None:
    """The bytes of the module's file (through its loader: a zip archive's too), or None."""
    get_data = getattr(spec.loader, "get_data", None)
    if not (spec.origin and spec.has_location and get_data):
        return None
    try:
        return get_data(spec.origin)
    except OSError:
        return None


def _source(spec: ModuleSpec, module: str) -> str | None:
    """The module's Python source, or None (an extension module, a loader that has none, a file
    that cannot be decoded)."""
    get_source = getattr(spec.loader, "get_source", None)
    if get_source is None:
        return None
    try:
        return get_source(module)
    except Exception:  # noqa: BLE001 (ImportError, SyntaxError for a bad encoding line, UnicodeDecodeError)
        return None
