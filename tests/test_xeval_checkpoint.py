"""xeval on our own models: a training run's checkpoint (load_for_inference) gives the same results as
its `pretrain export` directory; an exported mDeBERTa-v3 predicts as HF's DeBERTa-v2 classifier does."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "xnli"
ARGS = ["--languages", "en,fr,hi", "--seeds", "5", "--epochs", "2", "--batch-size", "8", "--lr", "2e-3", "--warmup", "0",
        "--max-length", "64", "--device", "cpu", "--engine", "ours"]


def xeval(*argv: str) -> int:
    from xeval.__main__ import main
    return main(list(argv))


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.mark.slow
def test_checkpoint_and_its_export_give_the_same_results(tmp_path: Path, sample_tokenizer: Path,  # noqa: F811
                                                          sample_tokens: Path, monkeypatch) -> None:  # noqa: F811
    from pretrain.export import export
    from pretrain.trainer import Trainer, load_run_config

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ.get("MASTER_PORT") or _free_port()}.items():
        monkeypatch.setenv(key, value)
    config = {"model": "xlmr-tiny", "tokens": str(sample_tokens), "tokenizer": str(sample_tokenizer),
              "output": str(tmp_path / "run"), "deepspeed": str(ROOT / "configs/deepspeed/zero1.json"), "steps": 4,
              "seed": 0, "progress": False, "tensorboard": False, "export_hf": False, "validation_batches": 1,
              "loader": {"seq_len": 64, "batch_size": 4}, "optimizer": {"lr": 0.002, "torch_adam": True},
              "schedule": {"warmup_steps": 1, "decay": "linear"},
              "intervals": {"log": 1, "validate": 0, "checkpoint": 4, "keep": 1}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    Trainer(load_run_config(str(tmp_path / "run.yaml")), str(tmp_path / "run.yaml")).train()
    export(str(tmp_path / "run"), None, str(tmp_path / "hf"))
    for name, model in (("ckpt", tmp_path / "run"), ("hf", tmp_path / "hf")):
        assert xeval("xnli", "--model", str(model), "--data", str(FIXTURES), "--out", str(tmp_path / f"out-{name}"),
                     *ARGS) == 0  # not tmp_path / "hf", the model's own folder
    ckpt, hf = (json.loads((tmp_path / f"out-{n}" / "results.json").read_text()) for n in ("ckpt", "hf"))
    assert ckpt["model"]["kind"] == "checkpoint" and hf["model"]["kind"] == "hf"
    assert ckpt["model"]["checkpoint"]["tag"] == "step-4" and len(ckpt["model"]["weights_sha256"]) == 64
    assert ckpt["seeds"] == hf["seeds"]


def test_mdeberta_export_predicts_as_hf(tmp_path: Path, sample_tokenizer: Path) -> None:  # noqa: F811
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from pretrain.models import build_pretraining_model, load_model_config
    from pretrain.models.hf import save_hf
    from pretrain.tokenizer import Tokenizer
    from xeval.data import load_split

    cfg = load_model_config("mdeberta-tiny", {"vocab_size": Tokenizer.load(sample_tokenizer).vocab_size})
    torch.manual_seed(0)
    exported = save_hf(build_pretraining_model(cfg), cfg, tmp_path / "mdeberta", tokenizer_dir=sample_tokenizer)
    out = tmp_path / "out"
    assert xeval("xnli", "--model", str(exported), "--data", str(FIXTURES), "--out", str(out), "--save-models", *ARGS) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["arch"] == "deberta-v3"
    model_dir = out / "models" / "seed-5"
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    test, _ = load_split(FIXTURES, "test", ("en", "fr", "hi"))
    for lang, nli in test.items():
        matrix = [[0] * 3 for _ in range(3)]
        for premise, hypothesis, gold in zip(nli.premises, nli.hypotheses, nli.labels):
            with torch.no_grad():
                logits = model(**tokenizer(premise, hypothesis, truncation=True, max_length=64, return_tensors="pt")).logits
            matrix[gold][int(logits.argmax(-1))] += 1
        assert matrix == results["seeds"][0]["test"][lang]["confusion"], lang


def test_every_seed_uses_the_checkpoint_resolved_first(tmp_path: Path, sample_tokenizer: Path,  # noqa: F811
                                                       monkeypatch) -> None:
    """A run folder is resolved to one checkpoint before the first seed: a pretraining that moves
    `latest` meanwhile changes no seed's weights, and results.json names the checkpoint and its digest."""
    import pretrain.checkpoint
    from pretrain.models import build_pretraining_model, load_model_config
    from pretrain.tokenizer import Tokenizer
    from xeval import finetune as finetuning

    cfg = load_model_config("xlmr-tiny", {"vocab_size": Tokenizer.load(sample_tokenizer).vocab_size})
    checkpoints, models = tmp_path / "run" / "checkpoints", {}
    for step in (1, 2):
        torch.manual_seed(step)
        models[f"step-{step}"] = build_pretraining_model(cfg)
        tag_dir = checkpoints / f"step-{step}"
        tag_dir.mkdir(parents=True)
        for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt", "trainer_state_rank0.pt"):
            (tag_dir / name).write_bytes(b"")
        (tag_dir / "meta.json").write_text(json.dumps({"step": step, "world_size": 1, "model_config": {},
                                                       "tokenizer_dir": str(sample_tokenizer), "tokenizer_fingerprint": ""}))
    (checkpoints / "latest").write_text("step-1")
    read = []

    def load_for_inference(path: str, tag: str | None = None, flag: str = "--checkpoint", tokenizer: str | None = None):
        directory, tag = pretrain.checkpoint.resolve_path(path, tag, flag)  # as the real one resolves it
        read.append(tag)
        return cfg, models[tag], str(sample_tokenizer)

    finetune = finetuning.finetune

    def pretraining_saves_meanwhile(*args, **kwargs):
        (checkpoints / "latest").write_text("step-2")
        return finetune(*args, **kwargs)

    monkeypatch.setattr(pretrain.checkpoint, "load_for_inference", load_for_inference)
    monkeypatch.setattr(finetuning, "finetune", pretraining_saves_meanwhile)
    out = tmp_path / "out"
    assert xeval("xnli", "--model", str(tmp_path / "run"), "--data", str(FIXTURES), "--out", str(out), *ARGS,
                 "--languages", "en", "--seeds", "1,2", "--epochs", "1") == 0
    assert read == ["step-1"]  # read once, before the first seed moved `latest`
    from xeval.model import state_digest
    results = json.loads((out / "results.json").read_text())
    assert [s["seed"] for s in results["seeds"]] == [1, 2]
    digest = state_digest(models["step-1"].state_dict())
    assert digest != state_digest(models["step-2"].state_dict())
    assert results["model"]["checkpoint"] == {"dir": str((checkpoints / "step-1").resolve()), "tag": "step-1", "step": 1}
    assert results["model"]["weights_sha256"] == digest and results["model"]["path"] == str((tmp_path / "run").resolve())
    assert f"(ours; checkpoint step-1 (step 1); weights sha256 {digest[:12]})" in (out / "report.md").read_text()
