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
import importlib.util
import os
import site
import sys
import sysconfig
from importlib.machinery import ModuleSpec
from typing import Any


def own_sources(name: str, skip: frozenset[str] = frozenset()) -> dict[str, bytes]:
    """``{module name: its file's bytes}`` for module ``name`` and the modules of its own it uses
    (see above), keyed by name so that the same code at another path gives the same. Modules
    without a file (defined in a notebook or ``python -c``, namespace packages) give none;
    extension and bytecode-only modules give their file's bytes. Top-level names in ``skip`` (a
    package hashed already) are not followed."""
    first = _find(name)
    if first is None:
        return {}
    name = first.name or name  # (``__main__`` run by ``python -m acme.cli``: acme.cli)
    top = name.partition(".")[0]
    beside = ""  # a one-file plugin's folder, where not that of installed or standard modules
    if "." not in name and first.submodule_search_locations is None and first.origin and first.has_location:
        folder = os.path.dirname(os.path.abspath(first.origin))
        beside = "" if folder in _shared_folders() else folder
    sources: dict[str, bytes] = {}
    parts = name.split(".")
    todo, seen = [name, *(".".join(parts[:i]) for i in range(1, len(parts)))], set()
    while todo:
        module = todo.pop()
        head = module.partition(".")[0]
        if module in seen or head in skip:
            continue
        seen.add(module)
        if head != top and not (beside and _beside(head, _find(head), beside)):  # (found, not imported)
            continue
        spec = first if module == name else _find(module)
        if spec is None or (head != top and not _beside(module, spec, beside)):
            continue
        data = _read(spec)
        if data is not None:
            sources[module] = data
        source = _source(spec)
        if source is not None:
            todo.extend(imported(source, spec.name, spec.submodule_search_locations is not None))
    return sources


def imported(source: bytes | str, module: str, is_package: bool) -> list[str]:
    """The modules that ``source`` (of ``module``) may import: each ``import a.b`` gives ``a`` and
    ``a.b``; ``from .x import y`` gives the package, ``x`` and ``x.y`` (a name that is no module is
    dropped by the caller); ``importlib.import_module("a.b")`` with a literal name gives it too.
    Unparsable source gives none."""
    try:
        tree = ast.parse(source)
    except Exception:  # noqa: BLE001 (SyntaxError, ValueError; RecursionError, MemoryError on deep nesting)
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


def _beside(module: str, spec: ModuleSpec | None, folder: str) -> bool:
    """Whether ``module`` lies right beside a one-file plugin in ``folder``: a module there, a
    package there or in one (each of a namespace package's portions counted apart)."""
    if spec is None:
        return False
    root = os.path.join(folder, module.partition(".")[0])
    return any(place == root or place.startswith(root + os.sep)
               or ("." not in module and os.path.dirname(place) == folder) for place in _places(spec))


def places(module: str) -> list[str]:
    """Where ``module`` lies (its file, or a package's folders), found as the import would find it
    now; none where it cannot be found."""
    spec = _find(module)
    return [] if spec is None else _places(spec)


def _places(spec: ModuleSpec) -> list[str]:
    """Where a module lies: its file, or a package's folders."""
    if spec.origin and spec.has_location:
        return [os.path.abspath(spec.origin)]
    return [os.path.abspath(place) for place in _listed(spec.submodule_search_locations)]


def _listed(locations: Any) -> list[str]:
    """A package's folders as a list (a namespace package's, whose parent is not imported, too)."""
    if locations is None:
        return []
    try:
        return list(locations)
    except Exception:  # noqa: BLE001 (a _NamespacePath recalculates from its parent in sys.modules)
        return list(getattr(locations, "_path", []))


def _find(module: str) -> ModuleSpec | None:
    """Where ``module`` is loaded from, as the import system would find it now, without importing
    it or its parent packages (an imported one's own spec, read without loading a lazily loaded
    module; a script's ``__main__``: its file), or None where it cannot be found."""
    try:
        loaded = sys.modules.get(module)
        if loaded is not None:
            spec, file = _attribute(loaded, "__spec__"), _attribute(loaded, "__file__")
            if spec is None and file:
                spec = importlib.util.spec_from_file_location(module, file)
            return spec
        parent = module.rpartition(".")[0]
        if not parent or parent in sys.modules:  # nothing to import: every finder asked, as an import asks
            return importlib.util.find_spec(module)
        above = _find(parent)
        if above is None or above.submodule_search_locations is None:
            return None
        path = _listed(above.submodule_search_locations)
        for finder in sys.meta_path:
            try:
                spec = finder.find_spec(module, path, None)
            except Exception:  # noqa: BLE001 (a namespace package's: its _NamespacePath reads its parent in sys.modules)
                spec = None
            if spec is not None:
                return spec
        portions = [folder for place in path if os.path.isdir(folder := os.path.join(place, module.rpartition(".")[2]))]
        if not portions:
            return None
        namespace = ModuleSpec(module, None, is_package=True)  # (what the import would make of these folders)
        namespace.submodule_search_locations = portions
        return namespace
    except Exception:  # noqa: BLE001 (a finder's own errors: not findable)
        return None


def _attribute(module: Any, name: str) -> Any:
    """A module's attribute as it is set (a lazily loaded module is not loaded by reading it)."""
    try:
        return object.__getattribute__(module, name)
    except AttributeError:
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
    except Exception:  # noqa: BLE001 (OSError; a zip archive's ZipImportError)
        return None


def _source(spec: ModuleSpec) -> str | None:
    """The module's Python source, or None (an extension module, a loader that has none, a file
    that cannot be decoded)."""
    get_source = getattr(spec.loader, "get_source", None)
    if get_source is None:
        return None
    try:
        return get_source(spec.name)
    except Exception:  # noqa: BLE001 (ImportError, SyntaxError for a bad encoding line, UnicodeDecodeError)
        return None
