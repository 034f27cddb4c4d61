"""Errors caused by the user's input or configuration: the CLI prints them as one line."""


class UserError(Exception):
    """A mistake in a path, a file or a config value; the message names it."""
