"""YAML configs as strict dataclasses, shared by the pipeline, pretrain and xeval commands.

Every key must exist (a typo is an error naming the key and the file), every value is checked for
type and range. ``--set section.key=value`` overrides one value (the value is read as YAML).
Light on purpose (no Beam import), so the trainer can use it on machines without Beam.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, NoReturn

import yaml

from .errors import UserError, first_line


class _Loader(yaml.SafeLoader):
    """YAML as a config needs it: booleans are ``true`` and ``false`` only (YAML 1.2; in YAML 1.1
    ``no``, Norwegian's language code, is false), and a key given twice in one mapping is an error
    (not the last one winning)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # (`<<: *anchor`: its keys may be given again)
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is not a name", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
                                   for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


def load_yaml(text: str) -> Any:
    """``text`` read as YAML by :class:`_Loader`; a mapping key that is not a string (``1:``), a
    control character and nesting past Python's recursion limit are yaml.YAMLErrors too."""
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
        _check_keys(data)
    except yaml.reader.ReaderError as exc:  # a control character: PyYAML gives it no line
        character = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        raise yaml.YAMLError(f"{exc.reason}: {character} (line {text.count(chr(10), 0, exc.position) + 1})") from None
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    return data


def _check_keys(data: Any, where: str = "", inside: tuple[int, ...] = ()) -> None:
    if id(data) in inside:  # (an anchor within itself)
        raise yaml.YAMLError(f"{where or 'the config'} holds itself")
    if isinstance(data, dict):
        for key, value in data.items():
            if not isinstance(key, str):
                raise yaml.YAMLError(f"the key {key!r}{f' under {where}' if where else ''} is not a name")
            _check_keys(value, f"{where}.{key}" if where else key, (*inside, id(data)))
    elif isinstance(data, list):
        for value in data:
            _check_keys(value, where, (*inside, id(data)))


def yaml_error(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong, and where."""
    mark = getattr(exc, "problem_mark", None)
    problem = " ".join(filter(None, (getattr(exc, "context", None), getattr(exc, "problem", None)))) or str(exc)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else problem


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against a dataclass field's type hint, converting int -> float."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options[1:]:  # str | bool: a bool is a bool, not a string
            try:
                return _coerce(value, option, where)
            except UserError:
                pass
        return _coerce(value, options[0], where)
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, args[0], where) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if hint is float and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:  # (YAML 1.1 reads 1e-4, no dot, as a string)
            number = float(value)
        except ValueError:
            raise UserError(f"{where}: expected a number, got {value!r}") from None
        if not math.isfinite(number):  # a NaN passes every range check
            raise UserError(f"{where}: expected a finite number, got {value!r}")
        return number
    if hint is bool and not isinstance(value, bool) or hint is not bool and isinstance(value, bool):
        raise UserError(f"{where}: expected {hint.__name__}, got {value!r}")
    if not isinstance(value, hint):
        raise UserError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value

@dataclasses.dataclass(frozen=True)
class Source:
    """Where a config's values came from: a YAML file (or none), the ``--set`` strings applied on
    top and the keys the command's own options set, so that an error about a key names what the
    user wrote for it."""

    path: str | None
    given: dict[str, str] = dataclasses.field(default_factory=dict)
    """Dotted key -> what set it last: ``--set key=value``, or ``command line`` (an option)."""

    def __str__(self) -> str:
        where = self.path or "command line"
        sets = [given for given in self.given.values() if given.startswith("--set ")]
        return f"{where} with {' '.join(sets)}" if sets else where

    def _given(self, key: str) -> tuple[str | None, list[str]]:
        """What gave ``key`` or a section above it (None: the file), and what gave keys below it."""
        parts = key.split(".")
        above = next((self.given[k] for k in (".".join(parts[:end]) for end in range(len(parts), 0, -1))
                      if k in self.given), None)
        return above, [given for name, given in self.given.items() if name.startswith(key + ".")]

    def of(self, key: str) -> str:
        """What gave ``key``, a section above it or a key below it on the command line, else the file."""
        above, below = self._given(key)
        return above or (below[-1] if below else self.path or "command line")

    def within(self, section: str) -> str:
        """What gave the keys of ``section``: what gave it whole, else every ``--set`` below it and the file."""
        above, below = self._given(section)
        return above or " and ".join(dict.fromkeys([*below, self.path or "command line"]))


def _record(given: dict[str, str], key: str, what: str) -> None:
    """``key`` set by ``what``: it replaced whatever gave the keys below it."""
    for old in [k for k in given if k == key or k.startswith(key + ".")]:
        del given[old]
    given[key] = what


def source_of(source: Source | str, *keys: str) -> str:
    """Where the values of ``keys`` came from, for an error message: each place once, in order
    (``--set global_batch_size=7 and run.yaml`` where a check compares two keys)."""
    if not isinstance(source, Source):
        return str(source)
    return " and ".join(dict.fromkeys(source.of(key) for key in keys))


def build_dataclass(cls: type, data: Any, source: Source | str, prefix: str = "") -> Any:
    """``cls`` built from a mapping, recursing into nested dataclasses; unknown keys and wrong types
    are UserErrors. A section left empty (``lid:`` with nothing under it) has its defaults."""
    if data is None and prefix:
        data = {}
    if not isinstance(data, dict):
        section = prefix.rstrip(".")
        raise UserError(f"{source_of(source, section)}: {section or 'the config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        key = f"{prefix}{unknown[0]}"
        match = difflib.get_close_matches(unknown[0], sorted(known), n=1, cutoff=0.5)
        hint = f" (did you mean {prefix + match[0]!r}?)" if match else ""
        raise UserError(f"{source_of(source, key)}: unknown config key {key!r}{hint}; known under {prefix.rstrip('.') or 'top level'}: "
                        f"{', '.join(sorted(known))}")
    values = {}
    for name, value in data.items():
        hint, where = hints[name], f"{source_of(source, prefix + name)}: {prefix}{name}"
        if dataclasses.is_dataclass(hint):
            values[name] = build_dataclass(hint, value, source, f"{prefix}{name}.")
        else:
            values[name] = _coerce(value, hint, where)
    return cls(**values)

def override(cfg: Any, values: dict[str, Any], prefix: str) -> Any:
    """A copy of dataclass ``cfg`` with ``values`` set (checked as when read from a file); an
    unknown key is a UserError naming ``prefix + key`` and the closest known key."""
    if not isinstance(values, dict):
        raise UserError(f"{prefix.rstrip('.')}: expected a mapping, got {values!r}")
    hints = typing.get_type_hints(type(cfg))
    known = sorted(f.name for f in dataclasses.fields(cfg))
    for key in values:
        if key not in known:
            match = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
            raise UserError(f"unknown key {prefix + key!r}" + (f" (did you mean {prefix + match[0]!r}?)" if match else ""))
    return dataclasses.replace(cfg, **{k: _coerce(v, hints[k], prefix + k) for k, v in values.items()})

def choice_names(choices: tuple[Any, ...]) -> str:
    """Choices as a YAML user writes them (None is null)."""
    return ", ".join("null" if c is None else str(c) for c in choices)


def check_choices_and_ranges(cfg: Any, source: Source | str, choices: dict[str, tuple[str, ...]],
                             ranges: dict[str, tuple[Any, Any]]) -> None:
    """UserError naming the first dotted key whose value is not among its choices or out of its range."""
    for key, allowed in choices.items():
        value = _get(cfg, key)
        if value not in allowed:
            raise UserError(f"{source_of(source, key)}: {key} must be one of {choice_names(allowed)}, got {value!r}")
    for key, (low, high) in ranges.items():
        value = _get(cfg, key)
        if value is None:
            continue
        if (low is not None and value < low) or (high is not None and value > high):
            raise UserError(f"{source_of(source, key)}: {key}={value} is out of range [{low if low is not None else '-∞'}, "
                            f"{high if high is not None else '∞'}]")

def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg

def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        if data.get(part) is None:  # (a section left empty in the file)
            data[part] = {}
        data = data[part]
        if not isinstance(data, dict):
            raise UserError(f"--set {dotted}: {part} is not a section")
    data[leaf] = value

def read_yaml(path: str) -> dict[str, Any]:
    """A YAML config file's top-level mapping; a missing or malformed file is a UserError."""
    try:
        loaded = load_yaml(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"config {path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"config {path}: not valid YAML ({first_line(exc)})") from None
    except yaml.YAMLError as exc:
        raise UserError(f"config {path}: not valid YAML: {yaml_error(exc)}") from None
    if not isinstance(loaded or {}, dict):
        raise UserError(f"config {path}: expected a mapping at the top level")
    return loaded or {}

def merged_config_data(path: str | None, overrides: dict[str, Any] | None = None,
                       sets: list[str] | None = None) -> tuple[dict[str, Any], Source]:
    """The YAML file's mapping (if any) with ``--set key=value`` strings (values read as YAML) and
    direct overrides (a command's own options; None values ignored) applied at their dotted keys, and
    where its values came from. A key given both by ``--set`` and by an option is an error."""
    data: dict[str, Any] = read_yaml(path) if path else {}
    given: dict[str, str] = {}
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected key=value, e.g. section.key=value")
        try:
            value = load_yaml(raw)
        except yaml.YAMLError as exc:
            raise UserError(f"--set {item!r}: the value is not valid YAML: {yaml_error(exc)}") from None
        _set_dotted(data, key.strip(), value)
        _record(given, key.strip(), f"--set {item.strip()}")
    for key, value in (overrides or {}).items():
        if value is not None:
            clash = [k for k in given if k == key or k.startswith(key + ".") or key.startswith(k + ".")]
            if clash:  # which should win is a guess either way
                raise UserError(f"{key}: set by {given[clash[0]]} and by its command-line option; give one of them")
            _set_dotted(data, key, value)
            _record(given, key, "command line")
    return data, Source(path, given)

def describe(cls: type, prefix: str = "", choices_by_key: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """One line per config key of dataclass ``cls`` with its default, choices and attribute docstring (for --help)."""
    choices_by_key = choices_by_key or {}
    lines = []
    docs, hints = _field_docs(cls), typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.metadata.get("internal"):  # not a config key (built from others)
            continue
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            lines.extend(describe(hint, f"{prefix}{field.name}.", choices_by_key))
            continue
        if field.default is not dataclasses.MISSING:
            default = f"default {field.default!r}"
        elif field.default_factory is not dataclasses.MISSING:
            default = f"default {field.default_factory()!r}"
        else:
            default = "required"
        choices = choices_by_key.get(f"{prefix}{field.name}")
        doc = docs.get(field.name, "")
        if choices:
            doc = f"{doc} One of: {choice_names(choices)}.".strip()
        lines.append(f"  {prefix}{field.name} ({default}){': ' + doc if doc else ''}")
    return lines


def path_argument(value: str) -> str:
    """An argparse ``type`` for a path a command writes: one of blanks (``--out ' '``, ``--out ''``) names
    none, where it made a folder or file named by the blanks, or wrote into the current folder."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"{value!r} names no path")
    return value


class KeysHelpParser(argparse.ArgumentParser):
    """An argument parser whose ``epilog`` may be a function returning it, called only when the
    help is shown: the config keys' lines (:func:`describe`) read the config classes' sources,
    0.2-0.5 s that a command which is not asked for help should not wait for; and whose errors are
    one line. Its subparsers are of this class too."""

    epilog: str | Callable[[], str] | None

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        """A wrong or missing option: one ``error:`` line naming the command (exit status 2), not
        argparse's usage block above it."""
        self.exit(2, f"error: {self.prog}: {message} (`{self.prog} --help` lists the options)\n")


def _field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal after a field) of a dataclass."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[union-attr]
    return docs
