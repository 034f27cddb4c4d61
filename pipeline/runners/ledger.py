"""The DaskRunner's task ledger: what a run has done, in files that outlive its driver.

```
<folder>/plan.json                     the run's stages: labels, tasks, the input elements each task
                                       of a stage reading the input covers, the partition count
<folder>/tasks/s<SSS>-<TTTTT>.json     a task that finished: its output files and piece offsets,
                                       elements in and out, seconds, shuffle reads and files, the
                                       attempt (driver invocation) that ran it
<folder>/tasks/s<SSS>-<TTTTT>.failed   a task that raised: the error's last line
<folder>/inputs.json                   the Create that lists the input files, and the files with
                                       their sizes (``pipeline run`` writes it)
<folder>/out-*                         the stages' files (the shuffle)
```

A marker is written (atomically) only after every output file of its task is complete, and
locally only once those files and then the marker are on the disk (``fsync``: a machine that
crashes, not only a killed process, leaves no marker of a task whose files were cut short), so a
driver started again on the same folder runs only the tasks without one (``pipeline run
--resume``), and ``python -m pipeline status`` reads how far a run is from these files alone.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Iterable

from ..output import fs
from ..util.errors import UserError

TASK_FORMAT = 2
"""The layout of finished tasks' outputs. One more when a change would make reusing an earlier
version's finished tasks wrong: 2, ``dask_runner.stable_partition`` without pickle's memo (a key's
partition moved). A run's fingerprint holds it, so ``--resume`` refuses an older run's tasks."""
PLAN = "plan.json"
INPUTS = "inputs.json"
TASKS = "tasks"
DONE, FAILED = ".json", ".failed"


@dataclasses.dataclass
class StagePlan:
    """One fused stage: its ParDos' labels, its task count, and for a stage that reads a Create,
    that Create's label and the ``[start, end)`` elements of it each task reads (else None)."""

    labels: list[str]
    tasks: int
    source: str | None = None
    covers: list[list[int]] | None = None

    @property
    def name(self) -> str:
        return self.labels[0] + (f" (+{len(self.labels) - 1})" if len(self.labels) > 1 else "")


@dataclasses.dataclass
class Plan:
    partitions: int
    stages: list[StagePlan]

    def shape(self) -> list[tuple[tuple[str, ...], int]]:
        """What must be equal for a resumed run to reuse this one's tasks."""
        return [(tuple(s.labels), s.tasks) for s in self.stages]


def write_plan(folder: str, plan: Plan) -> None:
    fs.write_json(fs.join(folder, PLAN), dataclasses.asdict(plan), compact=True, durable=True)


def read_plan(folder: str) -> Plan | None:
    path = fs.join(folder, PLAN)
    if not fs.exists(path):
        return None
    raw = fs.read_json(path, ("partitions", "stages"))
    try:
        return Plan(raw["partitions"], [StagePlan(**stage) for stage in raw["stages"]])
    except TypeError as exc:
        raise UserError(f"{path}: not as pipeline run writes it ({exc})") from None


def marker(folder: str, stage: int, task: int, suffix: str = DONE) -> str:
    return fs.join(folder, TASKS, f"s{stage:03d}-{task:05d}{suffix}")


def _index(path: str) -> tuple[int, int]:
    name = path.rsplit("/", 1)[-1].split(".", 1)[0]
    stage, task = name[1:].split("-")
    return int(stage), int(task)


def record(folder: str, stage: int, task: int, entry: dict[str, Any]) -> None:
    """Task ``task`` of stage ``stage`` finished with ``entry`` (outputs, counts, attempt): its
    marker, on the disk before its name (a machine that crashes leaves no marker cut short; the
    task's own files are made durable before, ``dask_runner.run_stage``)."""
    fs.write_json(marker(folder, stage, task), entry, compact=True, durable=True)


def record_failure(folder: str, stage: int, task: int, error: BaseException) -> None:
    line = f"{type(error).__name__}: {error}".strip().splitlines()[-1][:500]
    data = line.encode()
    fs.write_atomic(marker(folder, stage, task, FAILED), lambda stream: stream.write(data))


def finished(folder: str, known: Iterable[str] = ()) -> dict[tuple[int, int], dict[str, Any]]:
    """The markers of finished tasks not in ``known`` (paths), read: ``{(stage, task): entry}``."""
    seen = set(known)
    return {_index(p): {**fs.read_json(p), "path": p}
            for p in fs.match_optional(folder, TASKS, f"*{DONE}") if p not in seen}


def failures(folder: str) -> dict[tuple[int, int], str]:
    """The last error of each task that has not finished since: one that failed in a driver's attempt
    and finished in a resumed one is done, its old marker no failure."""
    found = {}
    done = {_index(path) for path in fs.match_optional(folder, TASKS, f"*{DONE}")}
    for path in fs.match_optional(folder, TASKS, f"*{FAILED}"):
        if _index(path) in done:
            continue
        with fs.open_read(path) as stream:
            found[_index(path)] = stream.read().decode(errors="replace")
    return found


def write_inputs(folder: str, create: str, files: dict[str, int]) -> None:
    """The Create ``create`` lists the input ``files`` (path: size), in this order."""
    fs.write_json(fs.join(folder, INPUTS), {"create": create, "files": list(files.items())}, compact=True, durable=True)


def read_inputs(folder: str) -> tuple[str, list[int]] | None:
    """The Create that lists the input files, and their sizes (-1: unknown); None if not written."""
    path = fs.join(folder, INPUTS)
    if not fs.exists(path):
        return None
    raw = fs.read_json(path, ("create", "files"))
    return raw["create"], [size for _, size in raw["files"]]


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def stage_rows(plan: Plan, done: dict[tuple[int, int], dict[str, Any]], failed: dict[tuple[int, int], str],
               inputs: tuple[str, list[int]] | None) -> list[dict[str, Any]]:
    """Per stage: tasks done, failed and pending, elements in and out, task seconds, shuffle reads
    and files, and (for a stage reading the input files' Create, :func:`read_inputs`) the input
    files and bytes its done tasks covered."""
    rows = []
    for index, stage in enumerate(plan.stages):
        entries = [entry for (s, _), entry in done.items() if s == index]
        row = {"stage": stage.name, "tasks": stage.tasks, "done": len(entries),
               "failed": sum(1 for (s, _) in failed if s == index),
               **{key: sum(e.get(key, 0) for e in entries) for key in ("in", "out", "seconds", "reads", "files", "bytes")}}
        row["pending"] = stage.tasks - row["done"]
        if inputs is not None and stage.covers is not None and stage.source == inputs[0]:
            sizes = inputs[1]
            spans = [stage.covers[t] for (s, t) in done if s == index]
            row["input_files"] = sum(end - start for start, end in spans)
            row["input_files_total"] = len(sizes)
            row["input_bytes"] = sum(max(size, 0) for start, end in spans for size in sizes[start:end])
            row["input_bytes_total"] = sum(max(size, 0) for size in sizes)
        rows.append(row)
    return rows


def describe(row: dict[str, Any], elapsed: float | None = None, pace: dict[str, Any] | None = None) -> str:
    """One log line for a stage row; with ``elapsed`` seconds and ``pace`` (the row of the tasks
    run in them; default ``row``), the rates and the time left at that pace."""
    parts = [f"{row['stage']}: {row['done']}/{row['tasks']} tasks"]
    if row["failed"]:
        parts.append(f"{row['failed']} failed")
    if "input_files" in row:
        parts.append(f"{row['input_files']}/{row['input_files_total']} input files "
                     f"({_mb(row['input_bytes'])} of {_mb(row['input_bytes_total'])})")
    parts.append(f"{row['in']:,} elements in, {row['out']:,} out")
    pace = row if pace is None else pace
    if elapsed and pace["done"]:
        parts.append(f"{pace['out'] / elapsed:,.0f} out/s")
        if "input_bytes" in pace:
            parts.append(f"{pace['input_bytes'] / 2**20 / elapsed:,.2f} MB/s")
        if row["pending"]:
            parts.append(f"about {_duration(elapsed / pace['done'] * row['pending'])} left")
    return ", ".join(parts)


class Progress:
    """Per-stage progress lines from the ledger, printed by the driver while it waits: a line for
    each stage that moved since the last one (plain lines, fit for a log file). Rates count only
    the tasks this driver ran (a resumed run's reused tasks are in the totals, not in the pace)."""

    def __init__(self, folder: str, plan: Plan, reused: dict[tuple[int, int], dict[str, Any]]) -> None:
        self.folder, self.plan, self.start = folder, plan, time.monotonic()
        self.reused = set(reused)
        self.done = dict(reused)
        self.inputs = read_inputs(folder)
        self.shown: dict[int, int] = {}

    def update(self) -> None:
        self.done.update(finished(self.folder, (entry["path"] for entry in self.done.values())))
        elapsed = time.monotonic() - self.start
        ran = {key: entry for key, entry in self.done.items() if key not in self.reused}
        rows = zip(stage_rows(self.plan, self.done, {}, self.inputs), stage_rows(self.plan, ran, {}, self.inputs))
        for index, (row, pace) in enumerate(rows):
            if pace["done"] == 0 or self.shown.get(index) == row["done"]:
                continue
            self.shown[index] = row["done"]
            print(f"[progress {_duration(elapsed)}] " + describe(row, elapsed, pace), file=sys.stderr, flush=True)
