"""Errors caused by the user's input or configuration: the CLI prints them as one line."""
from __future__ import annotations

PATH_ERRORS = (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)
"""What the operating system says of a path of the wrong kind (a file where a folder must be, or
the other way round) or one that may not be written: the user's paths, reported as one line."""


class UserError(Exception):
    """A mistake in a path, a file or a config value; the message names it."""


_MEANING = {FileExistsError: "a file where a folder is needed", NotADirectoryError: "a file where a folder is needed",
            IsADirectoryError: "a folder where a file is needed"}


def one_line(exc: Exception) -> str:
    """The ``error:`` line of a :class:`UserError` or of one of :data:`PATH_ERRORS` (naming its paths)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
        meaning = _MEANING.get(type(exc))
        return f"error: {paths}: {exc.strerror}" + (f" ({meaning})" if meaning else "")
    return f"error: {exc}"
