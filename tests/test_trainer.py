"""The DeepSpeed trainer on CPU (gloo, fp32, torch's AdamW): ZeRO 1/2/3 for XLM-R and mDeBERTa-v3 on the
sample's tokens, config errors, exact resume after SIGKILL (also during a save), export of ZeRO-3 weights."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from pipeline.util.errors import UserError
from pretrain.checkpoint import LATEST, META, RANK_STATE, load_for_inference
from pretrain.metrics import mfu, read_metrics
from pretrain.trainer import (RunConfig, ScheduleConfig, Trainer, batch_layout, deepspeed_config, load_run_config,
                              lr_factor)

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SHM_OP = "deepspeed_shm_comm_op built successfully"  # DeepSpeed's line when it loads the op


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        base[key] = merge(base.get(key, {}), value) if isinstance(value, dict) else value
    return base


def write_config(path: Path, tokenizer: Path, tokens: Path, **extra: Any) -> Path:
    """A run YAML for a tiny model on the sample tokens; ``extra`` merges into it (nested dicts too)."""
    data = {
        "model": "xlmr-tiny", "tokens": str(tokens), "tokenizer": str(tokenizer), "output": str(path.parent / "run"),
        "deepspeed": str(ROOT / "configs/deepspeed/zero1.json"), "steps": 8, "seed": 0, "progress": False,
        "tensorboard": False, "export_hf": False, "validation_batches": 2,
        "loader": {"seq_len": 64, "batch_size": 4},
        "optimizer": {"lr": 0.002, "torch_adam": True},
        "schedule": {"warmup_steps": 2, "decay": "linear"},
        "intervals": {"log": 1, "validate": 0, "checkpoint": 4, "keep": 2},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(merge(data, extra)), encoding="utf-8")
    return path


def free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.fixture(scope="module")
def single_rank() -> None:
    """In-process training: a world of one (the process group stays up for the rest of the session)."""
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ.get("MASTER_PORT") or free_port()})


def trainer_for(tmp_path: Path, tokenizer: Path, tokens: Path, **extra: Any) -> Trainer:
    path = write_config(tmp_path / "run.yaml", tokenizer, tokens, **extra)
    return Trainer(load_run_config(str(path)), str(path))


# --- config ----------------------------------------------------------------------------------------------

def test_unknown_key_and_bad_values_name_the_key(tmp_path: Path) -> None:
    path = write_config(tmp_path / "run.yaml", tmp_path, tmp_path, optimizer={"lr": 0.001, "momentum": 0.9})
    with pytest.raises(UserError, match="unknown config key 'optimizer.momentum'"):
        load_run_config(str(path))
    path = write_config(tmp_path / "run.yaml", tmp_path, tmp_path, schedule={"decay": "exponential"})
    with pytest.raises(UserError, match="schedule.decay must be one of linear, cosine, constant"):
        load_run_config(str(path))
    path = write_config(tmp_path / "run.yaml", tmp_path, tmp_path, loader={"masking": "random"})
    with pytest.raises(UserError, match="loader.masking"):
        load_run_config(str(path))
    with pytest.raises(UserError, match="^--set loader.mask_prob=0: loader.mask_prob=0 masks nothing"):  # it trained
        load_run_config(str(path), ["loader.masking=token", "loader.mask_prob=0"])  # a model on no prediction at all


def test_seeds_out_of_range_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``seed`` past torch's range was a traceback from torch.manual_seed after DeepSpeed had started;
    ``loader.seed`` is taken modulo 2^32, so 2^32 trained as seed 0 did."""
    from pretrain.__main__ import main

    path = write_config(tmp_path / "run.yaml", tmp_path, tmp_path)
    cfg = load_run_config(str(path), [f"seed={2**32 - 1}", f"loader.seed={2**32 - 1}"])
    assert cfg.seed == cfg.loader.seed == 2**32 - 1
    for key in ("seed", "loader.seed"):
        for value in (-1, 2**32, 2**64):
            assert main(["train", "--config", str(path), "--set", f"{key}={value}"]) == 2
            err = capsys.readouterr().err
            assert err == f"error: --set {key}={value}: {key}={value} is out of range [0, {2**32 - 1}]\n"


def test_batch_sizes_must_divide() -> None:
    cfg = RunConfig(global_batch_size=64)
    cfg.loader.batch_size = 8
    assert batch_layout(cfg, 4, "run.yaml") == (2, 64)
    with pytest.raises(UserError, match="global_batch_size 64 is not divisible by loader.batch_size 8 x world size 3"):
        batch_layout(cfg, 3, "run.yaml")
    cfg.grad_accum = 4
    with pytest.raises(UserError, match="set one of global_batch_size, grad_accum"):
        batch_layout(cfg, 4, "run.yaml")
    cfg.global_batch_size = None
    assert batch_layout(cfg, 3, "run.yaml") == (4, 96)


def test_deepspeed_config_from_json_and_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = RunConfig(deepspeed=str(ROOT / "configs/deepspeed/zero3.json"), global_batch_size=32)
    cfg.loader.batch_size = 4
    ds = deepspeed_config(cfg, 2, "run.yaml")
    assert ds["zero_optimization"]["stage"] == 3
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (32, 4, 4)
    assert ds["bf16"] == {"enabled": False, "check_grad_overflow": False} and ds["optimizer"]["params"]["torch_adam"] is True  # CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    ds = deepspeed_config(cfg, 2, "run.yaml")
    assert ds["bf16"] == {"enabled": True, "check_grad_overflow": False} and ds["optimizer"]["params"]["torch_adam"] is False
    cfg.precision = "fp32"
    assert deepspeed_config(cfg, 2, "run.yaml")["bf16"]["enabled"] is False
    clash = tmp_path / "ds.json"
    clash.write_text('{"zero_optimization": {"stage": 2}, "train_batch_size": 16}')
    cfg.deepspeed = str(clash)
    with pytest.raises(UserError, match="'train_batch_size' is set from the run config"):
        deepspeed_config(cfg, 2, "run.yaml")
    typo = tmp_path / "typo.json"
    typo.write_text('{"zero_optimisation": {"stage": 2}, "wall_clock_breakdown": false}')
    cfg.deepspeed = str(typo)
    with pytest.raises(UserError, match=r"typo.json: unknown key 'zero_optimisation' \(did you mean 'zero_optimization'\?\)"):
        deepspeed_config(cfg, 2, "run.yaml")
    typo.write_text('{"zero_optimization": 2}')
    with pytest.raises(UserError, match=r"typo.json: zero_optimization must be an object \(\{\"stage\": 1, \.\.\.\}\), got 2$"):
        deepspeed_config(cfg, 2, "run.yaml")
    for text in ('["zero_optimization"]', "{'stage': 2}"):
        typo.write_text(text)
        with pytest.raises(UserError, match="typo.json: not"):
            deepspeed_config(cfg, 2, "run.yaml")


@pytest.mark.parametrize("stage, accumulated_in", [(1, None), (2, "fp32"), (3, "fp32")])
def test_bf16_micro_batches_are_summed_in_fp32(stage: int, accumulated_in: str | None, tmp_path: Path) -> None:
    """In bf16, DeepSpeed sums the micro batches' gradients in bf16 (8 bits of mantissa) unless told
    otherwise; ZeRO-2/3 are told fp32 (a JSON's own data_types wins). ZeRO-1 stays: DeepSpeed does it
    there with its BF16_Optimizer, whose checkpoints its zero_to_fp32 cannot merge for an export.
    (A bf16 run on CPU, 4 steps of 2 micro batches at each stage: resumed from step 2 with the same
    losses, and exported; 2026-12-01.)"""
    cfg = RunConfig(deepspeed=str(ROOT / f"configs/deepspeed/zero{stage}.json"), grad_accum=2, precision="bf16")
    assert deepspeed_config(cfg, 1, "run.yaml").get("data_types", {}).get("grad_accum_dtype") == accumulated_in
    own = tmp_path / "ds.json"
    own.write_text(json.dumps({"zero_optimization": {"stage": stage}, "data_types": {"grad_accum_dtype": "bf16"}}))
    cfg.deepspeed = str(own)
    assert deepspeed_config(cfg, 1, "run.yaml")["data_types"] == {"grad_accum_dtype": "bf16"}
    cfg.deepspeed, cfg.precision = str(ROOT / f"configs/deepspeed/zero{stage}.json"), "fp32"
    assert "data_types" not in deepspeed_config(cfg, 1, "run.yaml")


def test_lr_schedule() -> None:
    linear = ScheduleConfig(warmup_steps=4, decay="linear", min_lr_ratio=0.1)
    assert [lr_factor(s, linear, 14) for s in (0, 3)] == [0.25, 1.0]
    assert lr_factor(9, linear, 14) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(14, linear, 14) == pytest.approx(0.1)
    cosine = ScheduleConfig(warmup_steps=0, decay="cosine")
    assert [lr_factor(s, cosine, 10) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])


def test_mfu() -> None:
    assert mfu(6e9, 1e5, 312e12, 2) == pytest.approx(6e14 / 624e12)
    assert mfu(6e9, 1e5, None, 1) is None


def test_help_lists_every_config_key() -> None:
    out = subprocess.run([sys.executable, "-m", "pretrain", "train", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    for key in ("optimizer.torch_adam", "schedule.min_lr_ratio", "intervals.keep", "loader.seq_len", "global_batch_size",
                "activation_checkpointing", "peak_flops", "--resume"):
        assert key in out


# --- training in this process --------------------------------------------------------------------------

ZERO_MATRIX = [(stage, model) for stage in (1, 2, 3) for model in ("xlmr-tiny", "mdeberta-tiny")]
DEFAULT_RUN = {(1, "xlmr-tiny"), (2, "mdeberta-tiny"), (3, "xlmr-tiny"), (3, "mdeberta-tiny")}


@pytest.mark.parametrize("stage,model", [pytest.param(*case, marks=() if case in DEFAULT_RUN else pytest.mark.slow)
                                         for case in ZERO_MATRIX])
def test_zero_stages_train(stage: int, model: str, tmp_path: Path, single_rank: None, sample_tokenizer: Path,
                           sample_tokens: Path) -> None:
    trainer = trainer_for(tmp_path, sample_tokenizer, sample_tokens, model=model, steps=10,
                          deepspeed=str(ROOT / f"configs/deepspeed/zero{stage}.json"))
    trainer.train()
    losses = [r["loss"] for _, r in sorted(read_metrics(tmp_path / "run" / "metrics.jsonl").items())]
    assert len(losses) == 10
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05, losses
    assert (tmp_path / "run" / "checkpoints" / LATEST).read_text() == "step-10"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["xlmr-tiny", "mdeberta-tiny"])
def test_compiled_model_trains_like_the_eager_one(model: str, tmp_path: Path, single_rank: None,
                                                  sample_tokenizer: Path, sample_tokens: Path) -> None:
    """``compile: true`` (DeepSpeed's engine.compile, torch.compile with inductor) on CPU: the same
    losses as eager to float tolerance (dropout off, so both compute the same function). RTD samples
    its replacements from an RNG stream that compiled code draws differently, so there only the
    first step's generator loss, computed before any sampling, must agree."""
    config = yaml.safe_load((ROOT / "configs" / "models" / f"{model}.yaml").read_text(encoding="utf-8"))
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    losses = {}
    for compiled in (False, True):
        run = tmp_path / str(compiled)
        trainer = trainer_for(run, sample_tokenizer, sample_tokens, model=str(tmp_path / "model.yaml"), steps=3,
                              compile=compiled, output=str(run / "run"), loader={"seq_len": 64, "batch_size": 2})
        trainer.train()
        records = [r for _, r in sorted(read_metrics(run / "run" / "metrics.jsonl").items())]
        losses[compiled] = [r["loss"] for r in records] if model == "xlmr-tiny" else [records[0]["gen_loss"]]
        assert trainer.engine.is_compiled == compiled and len(records) == 3
    assert losses[True] == pytest.approx(losses[False], rel=1e-4, abs=1e-4)


def test_metrics_count_real_tokens_and_validate_per_language(tmp_path: Path, single_rank: None, sample_tokenizer: Path,
                                                             sample_tokens: Path) -> None:
    trainer = trainer_for(tmp_path, sample_tokenizer, sample_tokens, loader={"cross_document": False, "seq_len": 512, "languages": ["de", "en"]},
                          validation_batches=1, peak_flops=1e12)
    seen: list[dict[str, torch.Tensor]] = []
    record = trainer._train_step(seen.append(b) or b for b in trainer.loader)
    real = int(seen[0]["attention_mask"].sum())
    assert real < seen[0]["attention_mask"].numel()  # one document per row: padding present
    assert record["tokens_per_s"] * record["step_time"] == pytest.approx(real)
    assert record["mfu"] == pytest.approx(trainer.flops_per_token * record["tokens_per_s"] / 1e12)
    assert {"loss", "mlm_loss", "lr", "grad_norm", "rss_gb"} <= set(record)
    valid = trainer.validate()
    assert {k for k in valid if k.endswith("/ppl")} == {"valid/de/ppl", "valid/en/ppl"}
    assert all(1.0 < v for k, v in valid.items() if k.endswith("/ppl"))


def test_tokens_without_held_out_documents_are_said(tmp_path: Path, single_rank: None, sample_tokenizer: Path,
                                                         sample_corpus: Path, capsys: pytest.CaptureFixture) -> None:
    """Tokens written with ``--valid-fraction 0`` hold no validation split: the run says so at its
    start, where its validation loss was silently missing from every record."""
    from pretrain.shards import tokenize_corpus

    tokenize_corpus(sample_corpus, sample_tokenizer, tmp_path / "tokens", languages=["de", "en"], valid_fraction=0)
    capsys.readouterr()
    trainer = trainer_for(tmp_path, sample_tokenizer, tmp_path / "tokens", validation_batches=1)
    assert (f"warning: tokens {tmp_path / 'tokens'}: no held-out tokens for de, en (written with `pretrain tokenize "
            "--valid-fraction 0`): no validation loss for them") in capsys.readouterr().err.splitlines()
    assert trainer.validate() == {}
    trainer_for(tmp_path, sample_tokenizer, tmp_path / "tokens", validation_batches=0)  # no validation asked for
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("model", ["xlmr-tiny", "mdeberta-tiny"])
def test_accumulated_micro_batches_weigh_every_predicted_position_alike(model: str, tmp_path: Path, single_rank: None,
                                                                       sample_tokenizer: Path, sample_tokens: Path) -> None:
    """Two micro batches of one step, one with a single predicted position and padding: the step's
    loss and gradient are every predicted position's (and, for RTD, every real token's) over the
    step's own count, as fairseq and HF's Trainer normalize, not the mean of the micro batches'
    means, which weighs that single position as much as all the other micro batch's together."""
    from pretrain.models import build_pretraining_model
    from pretrain.tokenizer import PAD_ID

    config = yaml.safe_load((ROOT / "configs" / "models" / f"{model}.yaml").read_text(encoding="utf-8"))
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    trainer = trainer_for(tmp_path, sample_tokenizer, sample_tokens, model=str(tmp_path / "model.yaml"), grad_accum=2,
                          loader={"seq_len": 64, "batch_size": 2})
    first, second = next(trainer.loader), next(trainer.loader)
    keep = tuple(second["labels"][0].ne(-100).nonzero()[0])
    labels = torch.full_like(second["labels"], -100)
    labels[0][keep] = second["labels"][0][keep]
    second["labels"] = labels
    second["input_ids"][1, 16:] = PAD_ID  # its second row padded after 16 tokens: the real tokens differ too
    second["attention_mask"][1, 16:] = 0
    reference = build_pretraining_model(trainer.model_cfg)
    reference.load_state_dict(trainer.engine.module.state_dict())

    torch.manual_seed(7)  # RTD samples its replacements: the same draws in both
    record = trainer._train_step(iter([first, second]))
    torch.manual_seed(7)
    batches = [(batch["input_ids"], batch["attention_mask"], batch["labels"]) for batch in (first, second)]
    rtd = model != "xlmr-tiny"
    parts = [reference.losses(*batch) if rtd else {"gen_loss": reference(*batch).loss} for batch in batches]
    predicted = [int(labels.ne(-100).sum()) for _, _, labels in batches]
    real = [int(mask.sum()) for _, mask, _ in batches]
    weight = reference.cfg.rtd_weight if rtd else 0.0
    loss = sum(part["gen_loss"] * n for part, n in zip(parts, predicted)) / sum(predicted)
    if rtd:
        loss = loss + weight * sum(part["rtd_loss"] * n for part, n in zip(parts, real)) / sum(real)
    mean_of_means = sum(float(part["gen_loss"]) + weight * float(part.get("rtd_loss", 0.0)) for part in parts) / 2
    assert record["loss"] == pytest.approx(float(loss), rel=1e-5)
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in reference.parameters() if p.grad is not None))
    assert record["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    assert mean_of_means != pytest.approx(float(loss), rel=1e-4)  # the case tells the two apart


def test_a_checkpoint_inside_a_log_interval_is_no_training_time(tmp_path: Path, single_rank: None,
                                                              sample_tokenizer: Path, sample_tokens: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint at step 2 of a 4-step log interval (one that took 2 s) was counted in the
    record's step_time and tokens/s: a quarter of it per step, a throughput several times too low."""
    trainer = trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=4,
                          intervals={"log": 4, "validate": 0, "checkpoint": 2, "keep": 2})
    real = trainer.save
    monkeypatch.setattr(trainer, "save", lambda: time.sleep(2.0) or real())
    trainer.train()
    record = read_metrics(tmp_path / "run" / "metrics.jsonl")[4]
    assert record["step_time"] < 0.3, record  # (a step of the tiny model: ~0.03 s; with the save: ~0.5 s)


def test_zero3_export_matches_the_engine_and_hf(tmp_path: Path, single_rank: None, sample_tokenizer: Path,
                                                sample_tokens: Path) -> None:
    import deepspeed
    from transformers import AutoModelForMaskedLM

    from pretrain.export import export

    trainer = trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=3,
                          deepspeed=str(ROOT / "configs/deepspeed/zero3.json"))
    trainer.train()
    module = trainer.engine.module
    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        engine_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    cfg, model, tokenizer_dir = load_for_inference(str(tmp_path / "run"))
    assert tokenizer_dir == str(sample_tokenizer.resolve())
    state = model.state_dict()
    assert set(state) == set(engine_state)
    assert all(torch.equal(state[k], engine_state[k]) for k in state)
    export(str(tmp_path / "run" / "checkpoints" / "step-3"), None, str(tmp_path / "hf"))
    hf = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
    batch = next(iter(trainer.loader))
    with torch.no_grad():
        ours = model.logits(batch["input_ids"], batch["attention_mask"])
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_a_universal_resume_wraps_the_seeds_it_offsets(tmp_path: Path, single_rank: None, sample_tokenizer: Path,
                                                      sample_tokens: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a universal checkpoint the seeds restart offset by the step: from the top of their range
    that passed 2^32 - 1, which the loader's config check and numpy's RNG refuse; they wrap around."""
    trainer = trainer_for(tmp_path, sample_tokenizer, sample_tokens, seed=2**32 - 1, loader={"seed": 2**32 - 1})
    monkeypatch.setattr(trainer.checkpoints, "load", lambda *args, **kwargs: ({"step": 4, "world_size": 2}, None))
    monkeypatch.setattr(trainer.checkpoints, "resolve", lambda tag: tag)
    monkeypatch.setattr(trainer.checkpoints, "point_latest", lambda tag: None)
    trainer.resume("step-4")
    assert trainer.loader.cfg.seed == 3 and trainer.loader.valid_seed == 2**32 - 1
    assert torch.initial_seed() == 3


def test_a_rank_state_whose_loader_seed_is_damaged_is_one_line(tmp_path: Path, single_rank: None, sample_tokenizer: Path,
                                                              sample_tokens: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader state is taken on its own seed only where that is a seed (a universal resume's): a
    damaged one is refused in one line, not trained on until the loader's RNG fails."""
    trainer = trainer_for(tmp_path, sample_tokenizer, sample_tokens)
    state = {k: v for k, v in trainer.loader.state_dict().items() if k != "seed"}
    monkeypatch.setattr(trainer.checkpoints, "load", lambda *args, **kwargs: ({"step": 4, "world_size": 1},
                                                                              {"loader": state, "rng": {}}))
    monkeypatch.setattr(trainer.checkpoints, "resolve", lambda tag: tag)
    with pytest.raises(UserError, match="loader state: seed was None, now 0; the data order cannot be resumed"):
        trainer.resume("step-4")


def test_resume_refuses_another_model_or_tokenizer(tmp_path: Path, single_rank: None, sample_tokenizer: Path,
                                                   sample_tokens: Path, sample_corpus: Path) -> None:
    from pretrain.tokenizer import train_tokenizer

    with pytest.raises(UserError, match="no checkpoint"):
        trainer_for(tmp_path, sample_tokenizer, sample_tokens).resume(None)
    trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=2).train()
    deeper = tmp_path / "deeper.yaml"
    data = yaml.safe_load((ROOT / "configs/models/xlmr-tiny.yaml").read_text())
    data["num_hidden_layers"] = 3
    deeper.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match=r"another model config \(model_config differs: num_hidden_layers"):
        trainer_for(tmp_path, sample_tokenizer, sample_tokens, model=str(deeper)).resume(None)
    other = tmp_path / "other-tokenizer"
    train_tokenizer(sample_corpus, other, vocab_size=1000, sample_size=2_000, seed=1,
                    character_coverage=0.98)
    with pytest.raises(UserError, match="were written with tokenizer"):
        trainer_for(tmp_path, other, sample_tokens)
    # what the checkpoint carries: a new learning rate was silently the old one (DeepSpeed restores the
    # optimizer's settings with its state) while the next checkpoint recorded the new one
    with pytest.raises(UserError, match=r"written with another optimizer \(lr: checkpoint 0\.\d+, now 0\.5\): the "
                                        r"checkpoint carries it"):
        trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=4, optimizer={"lr": 0.5}).resume(None)
    with pytest.raises(UserError, match="another loader"):
        trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=4, loader={"mask_prob": 0.2}).resume(None)
    with pytest.raises(UserError, match=r"another grad_accum \(checkpoint None, now 2\)"):  # a larger global batch
        trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=4, grad_accum=2).resume(None)
    latest = tmp_path / "run" / "checkpoints" / "latest"
    named = latest.read_text()
    latest.write_text("")
    with pytest.raises(UserError, match=r"checkpoints/latest is empty, it names no checkpoint; give one by name \(found: step-2\)"):
        trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=4).resume(None)
    latest.write_text(named)
    with pytest.raises(UserError, match="checkpoint step-2 is at step 2, past --steps 1: nothing to train"):
        trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=1).resume(None)
    resumed = trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=4, schedule={"decay": "constant"},
                          intervals={"log": 1})
    resumed.resume(None)  # what is computed from the config each step may change
    assert resumed.step == 2


def test_an_rtd_checkpoint_from_before_deberta_s_head_is_not_resumed(tmp_path: Path, single_rank: None,
                                                                    sample_tokenizer: Path, sample_tokens: Path) -> None:
    """The RTD head became DeBERTa's own under the same parameter names: an older checkpoint's
    trained head would feed another function, a loss spike with no word. Its meta.json has no
    ``rtd_head``: --resume refuses it in one line."""
    trainer_for(tmp_path, sample_tokenizer, sample_tokens, model="mdeberta-tiny", steps=2).train()
    meta_path = tmp_path / "run" / "checkpoints" / "step-2" / META
    meta = json.loads(meta_path.read_text())
    assert meta["rtd_head"] == "deberta"
    del meta["rtd_head"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"written for another RTD head \(one older than DeBERTa's"):
        trainer_for(tmp_path, sample_tokenizer, sample_tokens, model="mdeberta-tiny", steps=4).resume(None)


def test_a_truncated_checkpoint_names_itself_and_the_way_out(tmp_path: Path, single_rank: None, sample_tokenizer: Path,
                                                           sample_tokens: Path) -> None:
    trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=4, intervals={"checkpoint": 2, "keep": 2}).train()
    [optim] = (tmp_path / "run" / "checkpoints" / "step-4").glob("*optim_states.pt")
    optim.write_bytes(optim.read_bytes()[: optim.stat().st_size // 2])
    with pytest.raises(UserError, match=r"checkpoint .*step-4 cannot be loaded, a file of it is truncated or corrupt "
                                        r"\(.*\); resume an earlier one with --resume step-2$"):
        trainer_for(tmp_path, sample_tokenizer, sample_tokens, steps=6).resume(None)


def test_a_run_dir_is_a_folder_of_its_own(tmp_path: Path, sample_tokenizer: Path, sample_tokens: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    """--output given the token shards, the tokenizer (or a folder in them), a corpus or an HF export:
    the run wrote its checkpoints among their files, and tokenize or tokenizer then refused their
    own folder."""
    from pretrain.__main__ import main

    config = write_config(tmp_path / "run.yaml", sample_tokenizer, sample_tokens)
    export = tmp_path / "hf"
    export.mkdir()
    (export / "config.json").write_text('{"model_type": "xlm-roberta"}')
    for out, message in ((sample_tokens, "the tokens folder the run reads"),
                         (sample_tokens / "lang=de", "the tokens folder the run reads"),
                         (sample_tokenizer, "the tokenizer folder the run reads"),
                         (export, "the folder holds config.json, an HF model (pretrain export)")):
        assert main(["train", "--config", str(config), "--output", str(out)]) == 2
        assert capsys.readouterr().err.startswith(f"error: command line: output {out}: {message}")
    assert sorted(p.name for p in export.iterdir()) == ["config.json"]
    from pretrain.trainer import check_run_dir, load_run_config

    mine = tmp_path / "mine"  # a user's own config.json or meta.json in a run folder is not another command's
    mine.mkdir()
    for name in ("config.json", "meta.json"):
        (mine / name).write_text('{"lr": 0.001}')
    check_run_dir(load_run_config(str(config), [f"output={mine}"]), str(config))


def test_a_new_run_never_overwrites_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Starting without --resume in a run dir that has checkpoints is refused before anything is loaded."""
    from pretrain.__main__ import main

    config = write_config(tmp_path / "run.yaml", tmp_path / "tok", tmp_path / "tokens")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step-4")
    assert main(["train", "--config", str(config)]) == 2
    assert "already holds checkpoints (latest: step-4): pass --resume" in capsys.readouterr().err


def test_a_run_that_fails_before_recording_anything_leaves_no_run_dir(tmp_path: Path, single_rank: None,
                                                                       sample_tokenizer: Path, sample_tokens: Path,
                                                                       capsys: pytest.CaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad token shards fail the first batch: the run dir it made (an empty metrics.jsonl, TensorBoard's
    header) goes, also when a launcher's SIGTERM ends the run; one the user made stays, and so does a
    run dir with a logged step or a checkpoint."""
    from pretrain.__main__ import main
    from pretrain.trainer import _remove_if_nothing_recorded

    tokens = tmp_path / "tokens"
    shutil.copytree(sample_tokens, tokens)
    for path in tokens.glob("lang=*/*/*/train.tokens.npy"):
        np.save(path, np.full_like(np.load(path), 99999))
    config = write_config(tmp_path / "run.yaml", sample_tokenizer, tokens, tensorboard=True)
    assert main(["train", "--config", str(config)]) == 2
    assert "outside the vocabulary" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    (tmp_path / "run").mkdir()
    assert main(["train", "--config", str(config)]) == 2
    assert (tmp_path / "run").is_dir()
    shutil.rmtree(tmp_path / "run")

    def terminated(trainer: Trainer) -> None:  # the launcher ends this rank when another failed
        trainer.run_dir.mkdir(parents=True)
        (trainer.run_dir / "metrics.jsonl").touch()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)

    monkeypatch.setattr(Trainer, "train", terminated)
    config = write_config(tmp_path / "run.yaml", sample_tokenizer, sample_tokens)
    with pytest.raises(SystemExit) as ended:
        main(["train", "--config", str(config)])
    assert ended.value.code == 128 + signal.SIGTERM and not (tmp_path / "run").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    for leave in ("metrics.jsonl", "checkpoints/step-4"):
        run = tmp_path / leave.replace("/", "-")
        (run / leave).parent.mkdir(parents=True)
        (run / leave).write_text('{"step": 1}\n')
        _remove_if_nothing_recorded(run)
        assert (run / leave).exists()


# --- subprocesses: SIGKILL and resume, the launcher --------------------------------------------------------

def train_process(config: Path, *args: str, fault: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV and k != "PRETRAIN_FAULT"}
    if fault:
        env["PRETRAIN_FAULT"] = fault
    return subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--config", str(config), *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_at_fault(proc: subprocess.Popen, point: str) -> None:
    """Wait for the fault hook's line on stderr, then SIGKILL the process."""
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith(f"fault point {point}"):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return
    proc.wait()
    raise AssertionError(f"exited {proc.returncode} before the fault point:\n{''.join(lines[-30:])}")


def finish(proc: subprocess.Popen) -> str:
    """Wait for a training process that must succeed; its stdout."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


def test_exact_resume_after_sigkill(tmp_path: Path, sample_tokenizer: Path, sample_tokens: Path) -> None:
    extra = {"steps": 6, "intervals": {"checkpoint": 2, "validate": 3, "keep": 2}, "loader": {"languages": ["de", "en"]}}
    straight = write_config(tmp_path / "a" / "run.yaml", sample_tokenizer, sample_tokens, **extra)
    resumed = write_config(tmp_path / "b" / "run.yaml", sample_tokenizer, sample_tokens, **extra)
    first = train_process(straight)
    kill_at_fault(train_process(resumed, fault="after_save@2"), "after_save")
    assert SHM_OP not in finish(first)  # one rank: DeepSpeed's shared-memory all-reduce is not compiled
    checkpoints = tmp_path / "b" / "run" / "checkpoints"
    assert (checkpoints / LATEST).read_text() == "step-2"
    # killed while saving step 4: DeepSpeed's files are there, `latest` still names step 2
    kill_at_fault(train_process(resumed, "--resume", fault="mid_save@4"), "mid_save")
    assert (checkpoints / LATEST).read_text() == "step-2"
    assert list((checkpoints / "step-4").glob("*optim_states.pt")) and not (checkpoints / "step-4" / META).exists()
    finish(train_process(resumed, "--resume"))
    a = read_metrics(tmp_path / "a" / "run" / "metrics.jsonl")
    b = read_metrics(tmp_path / "b" / "run" / "metrics.jsonl")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    lines = {run: [(r["step"], "loss" in r) for r in map(json.loads, (tmp_path / run / "run" / "metrics.jsonl").open())]
             for run in "ab"}
    assert lines["b"] == lines["a"]  # steps 3 and 4, logged before the kill and replayed, are written once
    for step in range(1, 7):
        assert b[step]["loss"] == a[step]["loss"], (step, a[step]["loss"], b[step]["loss"])
        assert b[step]["grad_norm"] == a[step]["grad_norm"] and b[step]["lr"] == a[step]["lr"]
    valid = {k: v for k, v in a[6].items() if k.startswith("valid/")}
    assert set(valid) == {"valid/de/loss", "valid/de/ppl", "valid/en/loss", "valid/en/ppl"}
    assert all(b[6][k] == v for k, v in valid.items())
    kept = sorted(p.name for p in checkpoints.iterdir() if p.is_dir())
    assert kept == ["step-4", "step-6"] and (checkpoints / LATEST).read_text() == "step-6"
    assert (checkpoints / "step-6" / RANK_STATE.format(rank=0)).is_file()


@pytest.mark.slow
def test_two_ranks_with_the_deepspeed_launcher(tmp_path: Path, sample_tokenizer: Path, sample_tokens: Path) -> None:
    config = write_config(tmp_path / "run.yaml", sample_tokenizer, sample_tokens, steps=4, global_batch_size=16,
                          deepspeed=str(ROOT / "configs/deepspeed/zero2.json"), intervals={"checkpoint": 4},
                          export_hf=True)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    launcher = Path(sys.executable).with_name("deepspeed")
    proc = subprocess.run([str(launcher), "--num_nodes", "1", "--num_accelerators", "2", "--master_port", free_port(), "--no_local_rank",
                           "--module", "pretrain", "train", "--config", str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert SHM_OP in proc.stdout  # two ranks on CPU: DeepSpeed's shared-memory all-reduce is built and used
    step = tmp_path / "run" / "checkpoints" / "step-4"
    assert len(list(step.glob("*optim_states.pt"))) == 2
    assert {p.name for p in step.glob("trainer_state_rank*.pt")} == {"trainer_state_rank0.pt", "trainer_state_rank1.pt"}
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(records) == [1, 2, 3, 4]
    assert (tmp_path / "run" / "hf" / "model.safetensors").is_file()
    # the same run continued on one rank: refused for exact resume, done through a universal checkpoint
    one_rank = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", str(config), "--resume"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
    assert one_rank.returncode == 2 and "written by 2 ranks, this run has 1" in one_rank.stderr
    finish(train_process(config, "--resume", "--universal", "--steps", "6"))
    assert (step.parent / "step-4-universal").is_dir() and (step.parent / LATEST).read_text() == "step-6"
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(records) == [1, 2, 3, 4, 5, 6] and records[5]["loss"] < records[1]["loss"]
    # then resumed exactly on the rank count it now has: its loader goes on with the seed the universal
    # resume restarted it on (it was refused: "seed was 4, now 0")
    finish(train_process(config, "--resume", "--steps", "8"))
    assert sorted(read_metrics(tmp_path / "run" / "metrics.jsonl")) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_metrics_logger_writes_jsonl_and_tensorboard(tmp_path: Path) -> None:
    from pretrain.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=True, progress=True, total=3, initial=0)
    for step in (1, 2):
        logger.log(step, {"loss": 3.0 - step, "mfu": None, "grad_norm": float("nan")})
        logger.advance()
    logger.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[2] == {"step": 2, "loss": 1.0, "mfu": None, "grad_norm": None}
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    MetricsLogger(tmp_path / "other", enabled=False, tensorboard=True, progress=True, total=3, initial=0).log(1, {})
    assert not (tmp_path / "other").exists()


def tensorboard_steps(folder: Path) -> list[tuple[int, float]]:
    """(step, loss) of every ``loss`` scalar in a TensorBoard folder, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder)).Reload()
    return [(e.step, e.value) for e in events.Scalars("loss")] if "loss" in events.Tags()["scalars"] else []


def test_metrics_survive_a_diverged_loss_a_kill_and_a_fresh_restart(tmp_path: Path) -> None:
    """A NaN loss (a diverged bf16 run) with the progress bar on; TensorBoard's events on disk at a
    checkpoint (a kill after it lost the steps still buffered); a fresh start (no checkpoint to
    resume) drops a killed run's TensorBoard steps as it drops its metrics.jsonl lines; a file cut
    short or hand-edited is read up to its cut, or refused in one line."""
    from pretrain.metrics import MetricsLogger, keep_until

    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=True, progress=True, total=9, initial=0)
    for step in (1, 2, 3):
        logger.log(step, {"loss": float("nan") if step == 3 else 10.0 + step, "lr": 0.1})
    logger.flush()
    assert tensorboard_steps(tmp_path / "tensorboard") == [(1, 11.0), (2, 12.0)]  # (NaN is not a point)
    # killed: not closed; a fresh start writes steps 1 and 2 again
    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=True, progress=False, total=9, initial=0)
    for step in (1, 2):
        logger.log(step, {"loss": float(step)})
    logger.close()
    assert tensorboard_steps(tmp_path / "tensorboard") == [(1, 1.0), (2, 2.0)]
    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path)[2]["loss"] == 2.0
    path.write_text(path.read_text() + '{"step": 3, "lo')
    assert sorted(read_metrics(path)) == [1, 2]
    path.write_text('[1, 2]\n{"step": 1}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl: line 1 is not a metrics record"):
        read_metrics(path)
    keep_until(path, 5)
    assert path.read_text() == '{"step": 1}\n'


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H100 NVL", 835e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                        ("NVIDIA H200", 989e12), ("Tesla T4", None)])
def test_peak_flops_by_gpu_name(name: str, peak: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from pretrain.metrics import default_peak_flops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    assert default_peak_flops() == peak


def test_launchers_and_gpus_the_trainer_cannot_see_here(monkeypatch, tmp_path):
    """What a GPU cluster brings, emulated on CPU: an MPI launcher or srun sets no RANK (every process
    trained alone as rank 0); a V100's bf16 is emulated (`precision: auto` took it); each rank's CUDA
    random state is its device's (all devices' were saved and restored by index); a universal
    conversion outlived the checkpoint it came from (a rewritten step-N resumed the old one); a
    universal resume kept grad_accum and so changed the global batch with the rank count."""
    import deepspeed.comm as dist

    from pretrain import checkpoint, trainer

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "AZUREML_EXPERIMENT_ID", "SM_TRAINING_ENV", *trainer.MPI_WORLD_SIZE):
        monkeypatch.setenv(var, "")  # (recorded, so that the test's end puts back what was there)
        monkeypatch.delenv(var)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(UserError, match="OMPI_COMM_WORLD_SIZE=2: started by an MPI launcher or srun, which set no RANK"):
        trainer._single_process_env()
    assert "RANK" not in os.environ
    monkeypatch.setenv("SM_TRAINING_ENV", "{}")  # SageMaker: DeepSpeed reads Open MPI's variables, no mpi4py needed
    trainer._single_process_env()
    assert "RANK" not in os.environ
    monkeypatch.delenv("SM_TRAINING_ENV")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")  # one process: a world of one, as without a launcher
    trainer._single_process_env()
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert not trainer.use_bf16("auto") and trainer.use_bf16("bf16")

    restored = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: "device 1's state")
    monkeypatch.setattr(torch.cuda, "set_rng_state", restored.append)
    state = checkpoint.rng_state()
    assert state["cuda"] == "device 1's state"
    checkpoint.set_rng_state(state)
    checkpoint.set_rng_state({**state, "cuda": ["device 0's", "device 1's"]})  # as checkpoints before kept it
    checkpoint.set_rng_state({**state, "cuda": ["device 0's"]})  # another layout of GPUs: nothing to restore
    assert restored == ["device 1's state", "device 1's"]

    class Engine:
        def __init__(self, weights: str = "") -> None:
            self.weights, self.loaded = weights, None

        def save_checkpoint(self, directory: str, tag: str, client_state: dict, save_latest: bool) -> None:
            (Path(directory) / tag).mkdir(parents=True, exist_ok=True)
            (Path(directory) / tag / "mp_rank_00_model_states.pt").write_text(self.weights)

        def load_checkpoint(self, directory: str, tag: str) -> tuple[str, dict]:
            self.loaded = (Path(directory) / tag / "mp_rank_00_model_states.pt").read_text()
            return str(Path(directory) / tag), {}

    def convert(tag_dir: Path, out: Path) -> None:
        out.mkdir()
        (out / "mp_rank_00_model_states.pt").write_text((tag_dir / "mp_rank_00_model_states.pt").read_text())

    monkeypatch.setattr(dist, "barrier", lambda *args, **kwargs: None)
    monkeypatch.setattr(checkpoint, "convert_to_universal", convert)
    monkeypatch.setattr(checkpoint, "missing_files", lambda tag_dir, world_size: [])
    meta = {"step": 4, "world_size": 2, "model_config": {}, "tokenizer_dir": "t", "tokenizer_fingerprint": "f",
            "run_config": {}, "global_batch": 8}
    manager = checkpoint.CheckpointManager(tmp_path, keep=1, rank=0, world_size=1)
    manager.save(Engine("first step-4"), 4, meta, {})
    manager.load(engine := Engine(), "step-4", meta, universal=True)
    assert engine.loaded == "first step-4" and (tmp_path / "step-4-universal").is_dir()
    manager.save(Engine("step-4 trained again"), 4, meta, {})  # resumed from an earlier step, then past 4 again
    manager.load(engine := Engine(), "step-4", meta, universal=True)
    assert engine.loaded == "step-4 trained again"
    manager.save(Engine("step-8"), 8, {**meta, "step": 8}, {})  # keep=1: step-4 and its conversion go
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "step-8"]
    with pytest.raises(UserError, match="trained with a global batch of 8 sequences, this run's is 16 on 1 ranks"):
        manager.load(Engine(), "step-8", {**meta, "global_batch": 16}, universal=True)  # grad_accum kept, ranks not
    before = {**meta, "step": 12, "run_config": {"global_batch_size": None, "grad_accum": 2, "loader": {"batch_size": 4}}}
    del before["global_batch"]  # a checkpoint of before meta.json recorded it: 4 x 2 x 2 ranks
    manager.save(Engine(), 12, before, {})
    with pytest.raises(UserError, match="trained with a global batch of 16 sequences, this run's is 32"):
        manager.load(Engine(), "step-12", {**before, "global_batch": 32}, universal=True)
