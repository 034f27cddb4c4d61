"""Pipeline steps: one module per step (the contract is in ``base``), plus the Beam-free maths
they use (``normalize``, ``minhash``, ``lm``).

:func:`registry` finds every :class:`~pipeline.steps.base.Step` subclass defined in a module of
this package: adding a step is adding its module, and naming it in a profile's ``steps:`` list.
A step outside this package is named by its module's dotted path (``mypackage.myfilter``, or
``mypackage.myfilter:MyFilter`` when the module defines several); every worker must be able to
import it, as with any Beam user code.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import pkgutil
from types import ModuleType

from ..util.errors import UserError
from .base import Step


def _steps_of(module: ModuleType) -> list[type[Step]]:
    return [obj for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, Step) and obj is not Step
            and obj.__module__ == module.__name__ and "name" in vars(obj)]


@functools.cache
def registry() -> dict[str, type[Step]]:
    """``{name: step class}`` of the steps defined in this package's modules."""
    found: dict[str, type[Step]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        for cls in _steps_of(importlib.import_module(f"{__name__}.{info.name}")):
            if cls.name in found:
                raise TypeError(f"two steps are named {cls.name!r}: {found[cls.name].__module__} and {cls.__module__}")
            found[cls.name] = cls
    return found


def closest(name: str, known: list[str]) -> str:
    """`` (did you mean X?)`` for the closest known name, or nothing."""
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def resolve(name: str) -> type[Step]:
    """The step class a ``steps:`` entry names: a registered name, or ``module[:Class]``."""
    known = registry()
    if name in known:
        return known[name]
    module_name, _, class_name = name.partition(":")
    if "." not in module_name and not class_name:
        raise UserError(f"unknown step {name!r}{closest(name, sorted(known))}; steps: {', '.join(sorted(known))}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 (missing, broken code, or code that raises as it is imported)
        raise UserError(f"step {name!r}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    candidates = [c for c in _steps_of(module) if not class_name or c.__name__ == class_name]
    if len(candidates) != 1:
        unnamed = isinstance(found := getattr(module, class_name, None), type) and issubclass(found, Step)
        what = (f"a Step subclass {class_name!r} that sets no `name` (its name in steps:)" if unnamed else
                f"no Step subclass {class_name!r}" if class_name else
                f"{len(candidates)} Step subclasses (name one: {name}:Class)")
        raise UserError(f"step {name!r}: module {module_name} has {what}")
    cls = candidates[0]
    if cls.name in known:
        raise UserError(f"step {name!r}: its name {cls.name!r} is a built-in step's; give it a name of its own")
    if not dataclasses.is_dataclass(getattr(cls, "Config", None)):
        raise UserError(f"step {name!r}: {cls.__name__}.Config must be a dataclass (the step's config section)")
    return cls
