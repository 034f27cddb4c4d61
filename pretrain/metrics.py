"""Training metrics: a JSONL file, TensorBoard scalars and a progress bar (rank 0), throughput and MFU."""
from __future__ import annotations

import json
import math
import os
import resource
from pathlib import Path
from typing import Any

import torch

from pipeline.util.errors import UserError

PEAK_FLOPS = {"h100 pcie": 756e12, "h100 nvl": 835e12, "h200 nvl": 835e12, "a100": 312e12, "h100": 989e12,
              "h200": 989e12}
"""Dense bf16 peak FLOP/s per GPU by name fragment, the first that the name holds (NVIDIA data sheets,
without sparsity: the PCIe and NVL cards run below the SXM parts' 989e12)."""


def default_peak_flops() -> float | None:
    """Peak bf16 FLOP/s of this process's GPU by its name (:data:`PEAK_FLOPS`); None on CPU or an unknown GPU."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name().lower()
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float | None, world_size: int) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the peak of all ``world_size`` devices."""
    if not peak_flops:
        return None
    return flops_per_token * tokens_per_s / (peak_flops * world_size)


def memory_gb() -> dict[str, float]:
    """Peak accelerator memory allocated (GPU) or the process's peak resident set size (CPU), in GiB."""
    if torch.cuda.is_available():
        return {"mem_gb": torch.cuda.max_memory_allocated() / 2**30}
    return {"rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def keep_until(path: Path, step: int) -> None:
    """Drop the records of steps after ``step`` from a metrics.jsonl, and a line cut short: a run
    resumed from the checkpoint of ``step`` replays the later steps and writes them again."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the last line of a writer that was killed
            continue
        if isinstance(record, dict) and record.get("step", 0) <= step:  # (a line that is no record goes too)
            kept.append(line + "\n")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


class MetricsLogger:
    """Writes records to ``<run>/metrics.jsonl`` (appending across resumes, after dropping the records of
    the steps a resume replays) and TensorBoard ``<run>/tensorboard``,
    and drives a tqdm bar; on ranks other than 0 every method does nothing."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, progress: bool, total: int, initial: int) -> None:
        self.enabled = enabled
        self.file = None
        self.writer = None
        self.bar = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        keep_until(run_dir / "metrics.jsonl", initial)
        self.file = (run_dir / "metrics.jsonl").open("a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # the steps after ``initial`` of an earlier (killed) run are dropped, from the first one on a fresh start
            self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=initial + 1)
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def log(self, step: int, record: dict[str, Any]) -> None:
        """Append ``record`` (numbers; None for missing) for ``step``."""
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        assert self.file is not None
        self.file.write(json.dumps({"step": step, **clean}, sort_keys=True) + "\n")
        self.file.flush()
        if self.writer is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)) and value is not None:
                    self.writer.add_scalar(key, value, step)
        if self.bar is not None and "loss" in record:  # (a diverged run's NaN shows as nan)
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record.get('lr', 0):.2e}")

    def flush(self) -> None:
        """TensorBoard's buffered events to disk (at a checkpoint: a run killed after it and resumed
        from it writes only the later steps again)."""
        if self.writer is not None:
            self.writer.flush()

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        for handle in (self.file, self.writer, self.bar):
            if handle is not None:
                handle.close()


def read_metrics(path: Path) -> dict[int, dict[str, Any]]:
    """The records of a metrics.jsonl by step, merged with the step's other records (training and
    validation lines)."""
    records: dict[int, dict[str, Any]] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the last line of a writer that was killed, or is writing it now
                break
            raise UserError(f"{path}: line {number} is not JSON") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise UserError(f"{path}: line {number} is not a metrics record (an object with a step)")
        records.setdefault(record["step"], {}).update(record)
    return records
