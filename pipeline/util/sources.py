"""The code a module runs that is its author's own: the module and, followed through the import
statements written in their source (at any depth, an import inside a function too), the modules of
its own package, or of its own folder for a module of one file, that it imports. The resume
fingerprint hashes a plugin step's (``pipeline.run.code_digest``): a helper fixed between a kill and
``--resume`` changes the step as much as its own module does. A module imported by a name computed
at run time (``importlib.import_module(f"acme.{lang}")``) is not followed."""
from __future__ import annotations

import ast
import importlib.util
import os
import sys
import sysconfig
from importlib.machinery import ModuleSpec


def own_sources(name: str) -> dict[str, bytes]:
    """``{module name: its file's bytes}`` for module ``name`` (imported) and the modules of its own
    it imports, keyed by name so that the same code at another path gives the same. Modules
    without a file (defined in a notebook or ``python -c``, namespace packages) give none, their
    imports are still followed. Extension and bytecode-only modules give their file's bytes."""
    first = _spec(name)
    if first is None:
        return {}
    roots = _roots(name, first)
    sources: dict[str, bytes] = {}
    todo, seen = [name], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module == name:
            spec: ModuleSpec | None = first
        elif _under(_spec(module.partition(".")[0]), roots):  # (a top-level name elsewhere is not imported to look)
            spec = _spec(module)
            if not _under(spec, roots):
                continue
        else:
            continue
        assert spec is not None
        data = _read(spec)
        if data is not None:
            sources[module] = data
        source = _source(spec, module)
        if source is not None:
            todo.extend(imported(source, module, spec.submodule_search_locations is not None))
    return sources


def imported(source: bytes | str, module: str, is_package: bool) -> list[str]:
    """The modules that ``source`` (of ``module``) may import, in order: each ``import a.b`` gives
    ``a`` and ``a.b``; ``from .x import y`` gives the package, ``x`` and ``x.y`` (a name that is no
    module is dropped by the caller). Unparsable source gives none."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    package = module if is_package else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                names.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            except (ImportError, ValueError):  # a relative import beyond the top-level package
                continue
            parts = base.split(".")
            names.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _spec(module: str) -> ModuleSpec | None:
    """Where ``module`` is loaded from (finding it imports its parent packages), or None where it
    cannot be found; for a module imported without a spec (a script's ``__main__``) its file."""
    try:
        spec = importlib.util.find_spec(module)
    except Exception:  # noqa: BLE001 (no such module, a parent that is no package or fails to import)
        spec = None
    loaded = sys.modules.get(module)
    if spec is None and getattr(loaded, "__file__", None):
        spec = importlib.util.spec_from_file_location(module, loaded.__file__)
    return spec


def _roots(name: str, spec: ModuleSpec) -> list[str]:
    """The folders whose modules are ``name``'s own: its top-level package's, or, for a module of one
    file, its folder, unless that folder is where installed or standard modules are (then only it)."""
    top = _spec(name.partition(".")[0]) if "." in name else spec
    if top is not None and top.submodule_search_locations is not None:
        return [os.path.realpath(folder) for folder in top.submodule_search_locations]
    if spec.origin is None or not spec.has_location:
        return []
    folder = os.path.dirname(os.path.realpath(spec.origin))
    shared = {os.path.realpath(path) for key, path in sysconfig.get_paths().items()
              if key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return [] if folder in shared else [folder]


def _under(spec: ModuleSpec | None, roots: list[str]) -> bool:
    """Whether ``spec``'s module lies in one of ``roots`` (a folder or below it)."""
    if spec is None:
        return False
    places = [spec.origin] if spec.has_location and spec.origin else list(spec.submodule_search_locations or [])
    return any(os.path.realpath(place) == root or os.path.realpath(place).startswith(root + os.sep)
               for place in places for root in roots)


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
    """The module's Python source, or None (an extension module, no loader that has it)."""
    get_source = getattr(spec.loader, "get_source", None)
    if get_source is None:
        return None
    try:
        return get_source(module)
    except (ImportError, OSError):
        return None
