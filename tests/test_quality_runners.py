"""The fineweb2 profile's steps give the same bytes on every runner: DirectRunner in one process
and with two workers, the DaskRunner on a LocalCluster, and the PortableRunner; stats.json counts
every filter per language, and the report's funnel shows each."""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from test_step_contract import digests

ROOT = Path(__file__).resolve().parents[1]
STEPS = "[dedup, lid, near_dedup, gopher_repetition, fineweb_quality, gopher_quality, ftfy, pii, symbol_lines]"
RUNS = {
    "direct1": ["--set", "beam_options=[]"],
    "direct2": ["--set", "beam_options=[--direct_num_workers=2,--direct_running_mode=multi_processing]"],
    "dask": ["--runner", "DaskRunner", "--set", "beam_options=[--dask_num_workers=2]"],
    "portable": ["--runner", "PortableRunner", "--set", "beam_options=[--job_endpoint=embed,--environment_type=LOOPBACK]"],
}

pytest.importorskip("spacy", reason="the quality extra (spaCy, ftfy, ...) is not installed")


def run(out: Path, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "run", "--no-progress", "--config",
                           "configs/corpus/fineweb2.yaml", "--output", str(out), "--set", f"steps={STEPS}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Callable[[str], Path]:
    """The output of a run in ``RUNS``, run once on first use."""
    root = tmp_path_factory.mktemp("fw2")

    @functools.cache
    def output(name: str) -> Path:
        result = run(root / name, RUNS[name])
        assert result.returncode == 0, f"{name}: {result.stderr[-3000:]}"
        return root / name
    return output


def test_every_filter_is_counted_per_language_and_in_the_funnel(outputs) -> None:
    out = outputs("direct1")
    counters = json.loads((out / "stats.json").read_text())["counters"]
    for step in ("gopher_repetition", "fineweb_quality", "gopher_quality"):
        drops = {k: v for k, v in counters[step].items() if k != "documents_out" and "/" not in k}
        assert drops, step
        for reason, n in drops.items():
            assert sum(v for k, v in counters[step].items() if k.startswith(f"{reason}/")) == n, (step, reason)
        assert len(list((out / "removed" / step).glob("part-*.jsonl"))) > 0
    assert counters["pii"]["changed"] > 0
    assert counters["near_dedup"]["near_duplicate"] > 0 and counters["near_dedup"]["clusters"] > 0  # scheme datatrove
    funnel = (out / "report" / "report.md").read_text(encoding="utf-8").split("## ")[1]
    for step in ("gopher_repetition", "fineweb_quality", "gopher_quality"):
        assert f"| after {step} | {counters[step]['documents_out']:,} |" in funnel


@pytest.mark.parametrize("name", [pytest.param("direct2", marks=pytest.mark.slow), "dask",
                                  pytest.param("portable", marks=pytest.mark.slow)])
def test_the_same_bytes_on_every_runner(outputs, name: str) -> None:
    assert digests(outputs(name)) == digests(outputs("direct1"))
