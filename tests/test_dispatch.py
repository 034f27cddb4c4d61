"""``python -m pretrain`` / ``python -m xeval``: command overview, unknown commands, the launcher's --local_rank."""
from __future__ import annotations

import os

import pytest

from pipeline.util.errors import DEBUG_ENV, UserError
from pretrain.__main__ import COMMANDS as PRETRAIN_COMMANDS
from pretrain.__main__ import main as pretrain_main
from xeval.__main__ import main as xeval_main


def test_overview_lists_every_command(capsys):
    assert pretrain_main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, (_, help_) in PRETRAIN_COMMANDS.items():
        assert name in out and help_ in out


def test_unknown_command_is_one_line(capsys):
    assert xeval_main(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown command 'nosuch'" in err


@pytest.mark.parametrize("argv", [["--local_rank=0", "tokenize", "--help"], ["--local-rank", "0", "tokenize", "--help"]])
def test_deepspeed_launcher_local_rank_before_the_command(argv, capsys, monkeypatch):
    """The DeepSpeed launcher passes --local_rank=N before the module's own arguments."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(SystemExit) as exit_:
        pretrain_main(argv)
    assert exit_.value.code == 0
    assert "usage: python -m pretrain tokenize" in capsys.readouterr().out
    assert os.environ["LOCAL_RANK"] == "0"


@pytest.mark.parametrize("raised, status, line", [
    (UserError("config x.yaml: seed must be an integer"), 2, "error: config x.yaml: seed must be an integer"),
    (IsADirectoryError(21, "Is a directory", "out/run"), 2, "error: out/run: Is a directory (a folder where a file is needed)"),
    (KeyboardInterrupt(), 130, "error: interrupted (Ctrl-C)"),
    (RuntimeError("KeyboardInterrupt [while running 'Lid']"), 130, "error: interrupted (Ctrl-C)"),
])
def test_a_commands_mistake_or_ctrl_c_is_one_line_and_its_status(raised, status, line, capsys, monkeypatch):
    """pretrain's (and xeval's: the same dispatch) commands end as the corpus pipeline's do: one line and 2 for a user's
    mistake (with POLYGLOT_DEBUG=1 the traceback before it), 130 for Ctrl-C; a bug keeps its traceback."""
    def fails(args):
        raise raised

    monkeypatch.setattr("pretrain.tokenizer.main", fails)
    assert pretrain_main(["tokenizer", "--corpus", "c", "--out", "o"]) == status
    assert capsys.readouterr().err == line + "\n"
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert pretrain_main(["tokenizer", "--corpus", "c", "--out", "o"]) == status
    err = capsys.readouterr().err
    assert err.endswith(line + "\n") and err.startswith("Traceback") == (status == 2)


def test_a_bug_keeps_its_traceback(monkeypatch):
    monkeypatch.setattr("pretrain.tokenizer.main", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        pretrain_main(["tokenizer", "--corpus", "c", "--out", "o"])


@pytest.mark.parametrize("module", ["pretrain.tokenizer", "pretrain.shards"])
def test_languages_and_buckets_given_twice_add_up(module):
    """``--languages de --languages fr`` kept only fr, silently (argparse's last value wins)."""
    import argparse
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    required = ["--corpus", "c", "--out", "o"] + (["--tokenizer", "t"] if module == "pretrain.shards" else [])
    args = parser.parse_args([*required, "--languages", "de", "--languages", "fr", "en", "--buckets", "head", "--buckets", "tail"])
    assert args.languages == ["de", "fr", "en"] and args.buckets == ["head", "tail"]
    assert parser.parse_args(required).languages == [] and parser.get_default("languages") == []
