"""Errors caused by the user's input or configuration: the CLI prints them as one line."""
from __future__ import annotations

import errno
import os
import re
import sys
import traceback
from typing import Any, Callable, TypeVar

T = TypeVar("T")

PATH_ERRORS = (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)
"""What the operating system says of a path of the wrong kind (a file where a folder must be, or
the other way round) or one that may not be written: the user's paths, reported as one line."""
PATH_ERRNOS = (errno.ELOOP, errno.ENAMETOOLONG)
"""The same for a plain OSError: a symbolic link loop, a name too long (:func:`path_error`)."""


def path_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the operating system's word on a path the user gave (:data:`PATH_ERRORS`,
    :data:`PATH_ERRNOS`): one line, not a traceback."""
    return isinstance(exc, PATH_ERRORS) or (isinstance(exc, OSError) and exc.errno in PATH_ERRNOS
                                            and exc.filename is not None)


DEBUG_ENV = "POLYGLOT_DEBUG"
"""Set to 1: an error line comes with the traceback of what raised it (a step's own code, say), and
Beam's logs of a step's failure are kept."""


class UserError(Exception):
    """A mistake in a path, a file or a config value; the message names it."""


def contained(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, where what it raises but a UserError becomes one naming ``what`` (a step's own
    code, a plugin's say, run on the driver before any work)."""
    try:
        return fn(*args)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise UserError(f"{what} failed: {type(exc).__name__}: {exc}") from exc  # (its traceback: DEBUG_ENV)


_MEANING = {FileExistsError: "a file where a folder is needed", NotADirectoryError: "a file where a folder is needed",
            IsADirectoryError: "a folder where a file is needed"}


def one_line(exc: BaseException) -> str:
    """The ``error:`` line of a :class:`UserError` or of a :func:`path_error` (naming its paths)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
        meaning = _MEANING.get(type(exc))
        return f"error: {paths}: {exc.strerror}" + (f" ({meaning})" if meaning else "")
    return f"error: {exc}"


def first_line(exc: BaseException, limit: int = 200, typed: bool = False) -> str:
    """The first line of what ``exc`` says that is not blank, at most ``limit`` characters, after its
    type's name where ``typed`` (only the name where it says nothing): a library's error inside
    one of ours."""
    line = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:limit]
    name = type(exc).__name__
    return (f"{name}: {line}" if typed else line) if line else name


INTERRUPTED = "error: interrupted (Ctrl-C)"
"""The line a command ends with when the user stops it, with exit status :data:`INTERRUPTED_STATUS`
(a shell's for SIGINT), rather than a traceback."""
INTERRUPTED_STATUS = 130


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C (``KeyboardInterrupt``) or was raised for one: Beam's DoFn invoker
    raises a step's ``KeyboardInterrupt`` again as "RuntimeError: KeyboardInterrupt [while running ...]"."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt) or str(seen).startswith("KeyboardInterrupt [while running"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def exit_status(exc: BaseException, on_interrupt: str = INTERRUPTED) -> int:
    """What a command that raised ``exc`` exits with, its line written to stderr: 2 for a user's
    mistake (a :class:`UserError` or a :func:`path_error`; with :data:`DEBUG_ENV` set, the traceback
    of what raised it first), :data:`INTERRUPTED_STATUS` for a Ctrl-C (``on_interrupt``); anything
    else is a bug and is raised again, with its traceback."""
    if isinstance(exc, UserError) or path_error(exc):
        if os.environ.get(DEBUG_ENV) == "1":
            traceback.print_exception(exc)
        print(one_line(exc), file=sys.stderr)
        return 2
    if not interrupted(exc):
        raise exc
    print(on_interrupt, file=sys.stderr)
    return INTERRUPTED_STATUS


class StepFailed(Exception):
    """A step that raised on a document, or gave what a step may not: the message names the step
    and the document, and the run ends with it as its one line (:func:`step_failure`)."""


_STEP_FAILED = re.compile(r"StepFailed: (step .*?)(?: \[while running .*)?$", re.MULTILINE)


def step_failure(exc: BaseException) -> str | None:
    """The message of the :class:`StepFailed` that ended a run, wherever the runner put it: the
    exception itself or one it was raised from (a worker in the driver's process), or the text of
    the error a worker process sent back; None where there is none."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StepFailed):
            return str(seen).split(" [while running")[0]
        seen = seen.__cause__ or seen.__context__
    found = _STEP_FAILED.search(str(exc))
    return found.group(1) if found else None
