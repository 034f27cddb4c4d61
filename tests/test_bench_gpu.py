"""workflows/bench_gpu.py cannot rot: its code path runs here on the CPU with a tiny model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_trainer import LAUNCH_ENV

SCRIPT = Path(__file__).parents[1] / "workflows" / "bench_gpu.py"
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}  # not the in-process trainer tests' world


def test_without_cuda_it_says_so_and_measures_nothing():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, env=CLEAN_ENV)
    assert run.returncode == 0 and run.stdout.count("\n") == 1 and "no CUDA device" in run.stdout, run


@pytest.mark.slow
def test_the_same_code_runs_on_the_cpu(tmp_path, sample_tokenizer, sample_tokens):
    results = tmp_path / "results.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--models", "xlmr-tiny", "mdeberta-tiny",
                          "--seq-len", "64", "--batch", "2", "--steps", "3", "--warmup", "1", "--precision", "fp32",
                          "--tokenizer", str(sample_tokenizer), "--tokens", str(sample_tokens), "--json", str(results)],
                         capture_output=True, text=True, timeout=600, env=CLEAN_ENV)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(results.read_text())
    assert [r["model"] for r in rows] == ["xlmr-tiny", "mdeberta-tiny"]
    for row in rows:
        assert row["ours"]["tokens_per_s"] > 0 and row["hf"]["tokens_per_s"] > 0 and row["flops_per_token"] > 0
        assert row["ours"]["mfu"] is None and row["ratio_tokens_per_s"] > 0  # no peak FLOP/s on a CPU
    assert "ours/HF" in run.stdout


@pytest.mark.parametrize("args, message", [
    (["--models", "nosuchmodel"], "model config 'nosuchmodel': no such file or name"),
    (["--tokenizer", "/nonexistent", "--tokens", "/nonexistent"], "--tokens /nonexistent: no meta.json"),
    (["--tokenizer", "/nonexistent"], "--tokenizer and --tokens go together"),
    (["--steps", "3", "--warmup", "5"], "--steps (3) must exceed --warmup (5)"),
])
def test_a_wrong_option_is_one_usage_error(args, message):
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", *args], capture_output=True, text=True,
                         timeout=120, env=CLEAN_ENV)
    assert run.returncode == 2 and message in run.stderr.splitlines()[-1] and "Traceback" not in run.stderr, run.stderr
