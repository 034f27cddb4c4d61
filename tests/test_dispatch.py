"""``python -m pretrain`` / ``python -m xeval``: command overview, unknown commands, the launcher's --local_rank."""
from __future__ import annotations

import os

import pytest

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
