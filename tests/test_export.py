"""`pretrain export` on a trained mDeBERTa-v3 checkpoint (ZeRO-2): HF directories for the discriminator and the
generator, run dir / checkpoints dir / step dir addressing, and one-line errors."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from test_trainer import ROOT, single_rank, trainer_for  # noqa: F401

from pretrain.__main__ import main
from pretrain.checkpoint import load_for_inference, resolve_path


def test_export_rtd_checkpoint(tmp_path: Path, single_rank: None, sample_tokenizer: Path, sample_tokens: Path,
                               sample_corpus: Path, capsys: pytest.CaptureFixture) -> None:
    from transformers import AutoModelForMaskedLM

    from pretrain.tokenizer import train_tokenizer

    trainer = trainer_for(tmp_path, sample_tokenizer, sample_tokens, model="mdeberta-tiny", steps=2,
                          deepspeed=str(ROOT / "configs/deepspeed/zero2.json"), intervals={"checkpoint": 1, "keep": 2})
    trainer.train()
    run = tmp_path / "run"
    assert resolve_path(str(run)) == (run / "checkpoints", "step-2")
    assert resolve_path(str(run / "checkpoints"), "step-1") == (run / "checkpoints", "step-1")
    assert resolve_path(str(run / "checkpoints" / "step-1")) == (run / "checkpoints", "step-1")
    assert main(["export", "--checkpoint", str(run), "--tag", "step-1", "--out", str(tmp_path / "hf")]) == 0
    disc = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"))
    gen = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf" / "generator"))
    assert type(disc).__name__ == type(gen).__name__ == "DebertaV2ForMaskedLM"
    assert (tmp_path / "hf" / "spm.model").is_file()
    _, model, _ = load_for_inference(str(run / "checkpoints" / "step-1"))
    ours = model.state_dict()
    name = next(k for k in ours if k.startswith("generator.") and k.endswith("word_embeddings.weight"))
    torch.testing.assert_close(gen.state_dict()["deberta.embeddings.word_embeddings.weight"], ours[name])
    # a run copied from another machine: its meta.json names a tokenizer dir that is not here. The
    # export wrote the weights over the previous export before it failed, and could not be given one
    exported = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir() if p.is_file()}
    meta = run / "checkpoints" / "step-2" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "tokenizer_dir": "/cluster/shared/tok"}))
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "hf")]) == 2
    assert "tokenizer dir /cluster/shared/tok (named by the checkpoint's meta.json): no such directory; pass " \
           "--tokenizer" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir() if p.is_file()} == exported
    # another tokenizer (given, or trained again into the run's folder): its files would not fit the model
    other = tmp_path / "other-tokenizer"
    train_tokenizer(sample_corpus, other, vocab_size=1000, sample_size=2_000, seed=1, character_coverage=0.98)
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "hf"), "--tokenizer", str(other)]) == 2
    assert re.search(rf"tokenizer {other} \(fingerprint \w{{12}}\) is not the one checkpoint \S+step-2 was trained "
                     r"with \(\w{12}\): pass --tokenizer with the run's tokenizer", capsys.readouterr().err)
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir() if p.is_file()} == exported
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "hf"), "--tokenizer", str(sample_tokenizer)]) == 0
    assert (tmp_path / "hf" / "spm.model").read_bytes() == exported["spm.model"]
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() != exported["model.safetensors"]  # step-2's now
    assert not list(tmp_path.glob(".hf*"))
    (tmp_path / "hflink").symlink_to(tmp_path / "hf")  # --out a link: the folder it names is replaced, the link kept
    assert main(["export", "--checkpoint", str(run), "--tag", "step-1", "--out", str(tmp_path / "hflink"),
                 "--tokenizer", str(sample_tokenizer)]) == 0
    assert (tmp_path / "hflink").is_symlink() and (tmp_path / "hf" / "model.safetensors").read_bytes() == \
        exported["model.safetensors"]  # step-1's again
    assert not list(tmp_path.glob(".hf*"))
    modes = {p.name: p.stat().st_mode for p in (tmp_path / "hf").iterdir() if p.is_file()}
    assert modes["model.safetensors"] == modes["config.json"], modes  # safetensors made it 0600
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "notes"), "--tokenizer", str(sample_tokenizer)]) == 2
    assert "the folder holds 'todo.txt', not written by this command" in capsys.readouterr().err
    tokenizer = tmp_path / "tokenizer"  # a tokenizer's files are an export's too: the folder was replaced by one
    shutil.copytree(sample_tokenizer, tokenizer)
    assert main(["export", "--checkpoint", str(run), "--out", str(tokenizer), "--tokenizer", str(sample_tokenizer)]) == 2
    assert f"--out {tokenizer}: the folder holds sentencepiece.bpe.model, special_tokens_map.json, spm.model ... and no " \
           "config.json: not an earlier export" in capsys.readouterr().err
    assert sorted(p.name for p in tokenizer.iterdir()) == sorted(p.name for p in sample_tokenizer.iterdir())
    assert main(["export", "--checkpoint", str(run / "checkpoints" / "step-1"), "--tag", "step-2",
                 "--out", str(tmp_path / "x")]) == 2
    assert "--tag step-2 names another one" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(run / "checkpoints"), "--tag", "step-7", "--out", str(tmp_path / "x")]) == 2
    assert "--checkpoint: no checkpoint 'step-7'" in capsys.readouterr().err
    [weights] = (run / "checkpoints" / "step-1").glob("*model_states.pt")
    weights.write_bytes(weights.read_bytes()[:200])
    assert main(["export", "--checkpoint", str(run), "--tag", "step-1", "--out", str(tmp_path / "y")]) == 2
    assert "step-1: cannot read its weights (RuntimeError" in capsys.readouterr().err


def test_export_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["export", "--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "hf")]) == 2
    assert "no such checkpoint, checkpoints or run directory" in capsys.readouterr().err
    (tmp_path / "checkpoints").mkdir()
    assert main(["export", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "hf")]) == 2
    assert "--checkpoint: no checkpoint in" in capsys.readouterr().err
    step = tmp_path / "checkpoints" / "step-2"
    step.mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-2")
    for text, message in (("{", "meta.json: not valid JSON"), ('{"step": 2}', "meta.json: lacks world_size, model_config")):
        (step / "meta.json").write_text(text)
        assert main(["export", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "hf")]) == 2
        assert message in capsys.readouterr().err
