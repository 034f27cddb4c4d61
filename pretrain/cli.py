"""A command line of lazily imported subcommands, shared by ``python -m pretrain`` and ``python -m xeval``.

Each subcommand lives in its own module, which defines ``add_arguments(parser)`` and
``main(args) -> int``. Only the chosen command's module is imported, so ``--help`` and light
commands do not pay for importing torch or DeepSpeed. A :class:`~pipeline.util.errors.UserError`,
or a path of the wrong kind (:func:`~pipeline.util.errors.path_error`), becomes one ``error:`` line
and exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from pipeline.util.configfile import KeysHelpParser
from pipeline.util.errors import exit_status

Commands = dict[str, tuple[str, str]]
"""command name -> (module path, one-line help)."""


def _overview(prog: str, doc: str, commands: Commands) -> str:
    width = max(len(name) for name in commands)
    lines = [f"usage: {prog} <command> [options]", "", doc.strip(), "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in commands.items()]
    lines += ["", f"`{prog} <command> --help` lists every option of a command."]
    return "\n".join(lines)


def _without_leading_local_rank(argv: list[str]) -> list[str]:
    """Drop the ``--local_rank=N`` the DeepSpeed launcher puts before the command (without
    ``--no_local_rank``); the rank is in the environment (LOCAL_RANK) either way."""
    argv = list(argv)
    while argv and argv[0].replace("-", "_").startswith("__local_rank"):
        flag = argv.pop(0)
        value = flag.partition("=")[2] if "=" in flag else (argv.pop(0) if argv else "")
        os.environ.setdefault("LOCAL_RANK", value)
    return argv


def dispatch(prog: str, doc: str, commands: Commands, argv: list[str] | None = None) -> int:
    """Parse ``argv`` for the named subcommand and run it."""
    argv = _without_leading_local_rank(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_overview(prog, doc, commands))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"error: unknown command {name!r}; commands: {', '.join(commands)}", file=sys.stderr)
        return 2
    module_path, help_ = commands[name]
    module = importlib.import_module(module_path)
    parser = KeysHelpParser(prog=f"{prog} {name}", description=(module.__doc__ or help_).strip(),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.main(args) or 0)
    except BaseException as exc:
        return exit_status(exc)
