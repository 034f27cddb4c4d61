"""Resuming a DaskRunner run whose driver was killed (SIGKILL, with its LocalCluster): the tasks a
marker says finished are not run again, and the corpus is byte-identical to an undisturbed run's.
The kill points are the runner's fault points (``POLYGLOT_FAULT=task:<stage>@<task>``: the worker
that starts that task stops there), so each test kills at the same place every time; the other
worker goes on meanwhile, as a real run would."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import kill_at_fault
from test_engines import output_digests, planted_corpus

from pipeline.__main__ import main
from pipeline.output.layout import RUN_FILE, RUN_STATE, STAGING

pytestmark = pytest.mark.timeout(900)

READ_AGAIN = "Read/JoinByFile/CoGroupByKeyImpl/Tag[0]"  # the second read of the input: the first stage is done
MID_SHUFFLE = "Read/FindDuplicates/ParDo(FindDuplicates)/ParDo(FindDuplicates)"  # reads its piece of every hash partition's file
NEAR_DUP_ROUND = "NearDedup/Components/LargeStar3/Link/ParDo(_Star)"
WRITE = "WriteCorpus/WriteShard/ParDo(WriteShard)/ParDo(WriteShard)"


@pytest.fixture(scope="module")
def job(sample, sample_corpus, sample_lms, tmp_path_factory) -> dict:
    """The planted corpus (both dedup stages cross files), near-dup and perplexity on, and the
    bytes of an undisturbed DaskRunner run of it."""
    root = tmp_path_factory.mktemp("resume")
    inputs = planted_corpus(sample, sample_corpus, root / "in")
    config = ["--config", "configs/corpus/sample.yaml", "--input", str(inputs / "*.gz"),
              "--set", f"perplexity.models={sample_lms}", "--set", "write.shard_size_mb=0.25",
              "--set", "beam_options=[]", "--runner", "DaskRunner", "--dask_num_workers", "2"]
    assert main(["run", "--no-progress", *config, "--output", str(root / "reference")]) == 0
    return {"config": config, "reference": output_digests(root / "reference")}


def run_cli(config: list[str], out: Path, temp: Path, *extra: str, fault: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "POLYGLOT_FAULT": fault} if fault else {
        k: v for k, v in os.environ.items() if k != "POLYGLOT_FAULT"}
    # what a killed run cannot remove (multiprocessing's pymp-* folders, Dask's scratch) stays in the test's folder
    env["TMPDIR"] = str(out.parent / "system-temp")
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--no-progress", *config, "--output", str(out),
                             "--temp_location", str(temp), *extra], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _group(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return None


def kill_at(config: list[str], out: Path, temp: Path, fault: str, *extra: str) -> int:
    """Runs until a worker reaches ``fault`` (``task:<stage>@<task>``, or the driver's ``commit@0``), then SIGKILLs the driver and every process of its
    session (its LocalCluster's scheduler, nannies and workers). Returns the finished tasks' markers."""
    proc = run_cli(config, out, temp, *extra, fault=fault)
    deadline = time.monotonic() + 300
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("fault point"):
            break
        assert time.monotonic() < deadline, "the fault point was not reached"
    else:
        pytest.fail(f"the run ended (rc {proc.wait()}) without reaching {fault}: {''.join(seen[-30:])}")
    time.sleep(1.0)  # the other worker finishes what it was doing: some markers written after the fault point
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while alive := [p for p in psutil.process_iter(["pid"]) if _group(p) == proc.pid and p.status() != psutil.STATUS_ZOMBIE]:
        assert time.monotonic() < deadline, f"processes survived: {alive}"
        time.sleep(0.2)
    [folder] = temp.glob("polyglot-run-*")
    return len(list((folder / "tasks").glob("*.json")))


def resume_to_end(job: dict, out: Path, temp: Path, reused: int, via: Path | None = None) -> None:
    """``--resume`` to the end (with ``--temp_location`` ``via`` where given: the run's task folder is
    still the one in ``temp``), the undisturbed run's bytes, every finished task reused."""
    proc = run_cli(job["config"], out, via or temp, "--resume")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert output_digests(out) == job["reference"]
    tasks = json.loads((out / RUN_FILE).read_text())["tasks"]
    assert tasks["reused"] == reused > 0
    assert tasks["run"] + tasks["reused"] == tasks["total"]  # a reused task run again would count twice
    assert not list(temp.glob("polyglot-run-*")) and not list(out.glob(f"{STAGING}*"))
    assert via is None or not via.exists() or not list(via.glob("polyglot-run-*"))


def test_killed_driver_resumes_three_times_with_the_same_bytes(job, tmp_path):
    """Killed after the first read, during a near-dup round and during the write, each time resumed:
    each resume reuses every task finished before it, and the end is the undisturbed run's bytes."""
    out, temp = tmp_path / "out", tmp_path / "tmp"
    first = kill_at(job["config"], out, temp, f"task:{READ_AGAIN}@1")
    [staging] = out.glob(f"{STAGING}*")
    state = json.loads((staging / RUN_STATE).read_text())
    assert Path(state["task_folder"]).parent == temp
    second = kill_at(job["config"], out, temp, f"task:{NEAR_DUP_ROUND}@0", "--resume")
    assert second > first
    third = kill_at(job["config"], out, temp, f"task:{WRITE}@2", "--resume")
    assert third > second
    resume_to_end(job, out, temp, third, via=tmp_path / "elsewhere")  # another TMPDIR after a reboot, say


def test_a_driver_killed_after_the_run_but_before_the_commit_resumes_without_running_a_task(job, tmp_path):
    """The task folder outlives the run until the corpus is in place: resumed, nothing runs again."""
    out, temp = tmp_path / "out", tmp_path / "tmp"
    done = kill_at(job["config"], out, temp, "commit@0")
    proc = run_cli(job["config"], out, temp, "--resume")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert output_digests(out) == job["reference"]
    tasks = json.loads((out / RUN_FILE).read_text())["tasks"]
    assert tasks["reused"] == tasks["total"] == done and tasks["run"] == 0
    assert not list(temp.glob("polyglot-run-*"))


def test_options_beam_refuses_leave_no_staging_or_task_folder(job, tmp_path, capsys):
    out, temp = tmp_path / "out", tmp_path / "tmp"
    assert main(["run", "--no-progress", *job["config"], "--output", str(out), "--temp_location", str(temp),
                 "--type_check_additional=nonsense"]) == 2
    assert "nonsense" in capsys.readouterr().err
    assert not list(out.glob(f"{STAGING}*")) and not list(temp.glob("polyglot-run-*"))


@pytest.mark.slow
@pytest.mark.parametrize("point", [f"{READ_AGAIN}@0", f"{MID_SHUFFLE}@1", f"{NEAR_DUP_ROUND}@1", f"{WRITE}@0"])
def test_killed_driver_resumes_from_each_point(job, tmp_path, point):
    out, temp = tmp_path / "out", tmp_path / "tmp"
    resume_to_end(job, out, temp, kill_at(job["config"], out, temp, f"task:{point}"))


def test_status_and_resume_mistakes(job, tmp_path, capsys):
    """`pipeline status` on an unfinished run, the output and the temp folder; --resume with another
    config, or on the DirectRunner, is one line; a run without --resume removes the unfinished one."""
    out, temp = tmp_path / "out", tmp_path / "tmp"
    done = kill_at(job["config"], out, temp, f"task:{READ_AGAIN}@0")
    capsys.readouterr()
    for path in (out, temp, next(temp.glob("polyglot-run-*"))):
        assert main(["status", str(path)]) == 0
        text = capsys.readouterr().out
        assert f"{done}/" in text and "tasks done" in text, text
        assert "[done] Read/HashParagraphs: 6/6 tasks, 6/6 input files" in text, text
        assert "[pending] WriteCorpus/WriteShard" in text
    changed = [*job["config"], "--set", "lid.threshold=0.6"]
    assert main(["run", *changed, "--output", str(out), "--temp_location", str(temp), "--resume"]) == 2
    assert "had another config, input files, model or list files (rewritten since), or version or code; run without --resume" \
        in capsys.readouterr().err
    direct = [*job["config"][:-4], "--resume"]
    assert main(["run", *direct, "--output", str(out)]) == 2
    assert "--resume needs --runner DaskRunner" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "nothing")]) == 2
    assert "no run found" in capsys.readouterr().err
    assert main(["run", "--no-progress", *job["config"], "--output", str(out), "--temp_location", str(temp)]) == 0
    assert output_digests(out) == job["reference"]
    assert not list(temp.glob("polyglot-run-*"))
    assert json.loads((out / RUN_FILE).read_text())["tasks"]["reused"] == 0


def test_a_relative_temp_location_resumes_from_another_folder(sample, tmp_path):
    """``--temp_location tmp`` was kept as ``tmp/polyglot-run-...`` in the run state: a ``--resume``
    started in another folder looked for the tasks there, redid every one, and left the folder."""
    wet = str(sorted((sample / "wet").glob("*.warc.wet.gz"))[0])
    config = ["--input", wet, "--set", "beam_options=[]", "--set", "steps=[dedup, lid]", "--runner", "DaskRunner",
              "--dask_num_workers", "1"]
    out, first, second = tmp_path / "out", tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    root = str(Path(__file__).resolve().parents[1])  # this checkout's package, from any folder
    env = {**os.environ, "TMPDIR": str(tmp_path / "system-temp"),
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    os.makedirs(env["TMPDIR"])
    command = [sys.executable, "-m", "pipeline", "run", "--no-progress", *config, "--output", str(out),
               "--temp_location", "tmp"]
    killed = subprocess.Popen(command, cwd=first, env={**env, "POLYGLOT_FAULT": "commit@0"}, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kill_at_fault(killed)
    [staging] = out.glob(f"{STAGING}*")
    assert json.loads((staging / RUN_STATE).read_text())["task_folder"].startswith(str(first / "tmp") + "/")
    resumed = subprocess.run([*command, "--resume"], cwd=second, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    tasks = json.loads((out / RUN_FILE).read_text())["tasks"]
    assert tasks["run"] == 0 and tasks["reused"] == tasks["total"] > 0
    assert not list((first / "tmp").glob("polyglot-run-*")) and not list(second.glob("tmp/polyglot-run-*"))


def test_a_run_killed_during_its_moves_leaves_no_task_folder_once_the_next_run_finishes_them(sample, tmp_path):
    """Killed during its commit's moves, a run's staging folder (with its run state, which names the
    task folder) was removed by the next run as it finished the moves, but its task folder stayed."""
    wet = str(sorted((sample / "wet").glob("*.warc.wet.gz"))[0])
    config = ["--input", wet, "--set", "beam_options=[]", "--set", "steps=[dedup, lid]", "--runner", "DaskRunner",
              "--dask_num_workers", "1"]
    out, temp = tmp_path / "out", tmp_path / "tmp"
    proc = run_cli(config, out, temp, fault="replace@2")
    kill_at_fault(proc)
    [staging] = out.glob(f"{STAGING}*")
    assert [Path(json.loads((staging / RUN_STATE).read_text())["task_folder"])] == list(temp.glob("polyglot-run-*"))
    again = run_cli(config, out, temp, "--overwrite")
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    assert not list(temp.glob("polyglot-run-*")) and not list(out.glob(f"{STAGING}*"))
    assert json.loads((out / "stats.json").read_text())["counters"]


def test_resume_continues_the_most_recently_started_of_several_unfinished_runs(sample, tmp_path, capsys):
    """Of several unfinished runs ``--resume`` took the last by name, i.e. by the random id of its
    staging folder, not the one started last. A run state says when its run started; where one of
    several does not (a version before), which is meant cannot be told: one line naming them."""
    wet = str(sorted((sample / "wet").glob("*.warc.wet.gz"))[0])
    config = ["--input", wet, "--set", "beam_options=[]", "--set", "steps=[dedup, lid]", "--runner", "DaskRunner",
              "--dask_num_workers", "1"]
    out, temp = tmp_path / "out", tmp_path / "tmp"
    kill_at_fault(run_cli(config, out, temp, fault="commit@0"))
    [latest] = out.glob(f"{STAGING}*")
    state = json.loads((latest / RUN_STATE).read_text())
    assert time.time() - 600 < state["started"] <= time.time()
    older = out / f"{STAGING}ffffffffffff"  # an earlier run killed too, whose id sorts last
    older.mkdir()
    undated = {key: value for key, value in state.items() if key != "started"}
    (older / RUN_STATE).write_text(json.dumps({**undated, "task_folder": str(temp / "gone")}))
    assert main(["run", "--no-progress", *config, "--output", str(out), "--temp_location", str(temp), "--resume"]) == 2
    err = capsys.readouterr().err
    assert (f"--resume: 2 unfinished runs in {out} ({latest}, {older}), not all of which say when they started; "
            "remove those not to continue and run again") in err and len(err.splitlines()) == 1, err
    (older / RUN_STATE).write_text(json.dumps({**state, "task_folder": str(temp / "gone"), "started": 1.0}))
    assert main(["run", "--no-progress", *config, "--output", str(out), "--temp_location", str(temp), "--resume"]) == 0
    tasks = json.loads((out / RUN_FILE).read_text())["tasks"]
    assert tasks["run"] == 0 and tasks["reused"] == tasks["total"] > 0
    assert not list(out.glob(f"{STAGING}*")) and not list(temp.glob("polyglot-run-*"))


def test_a_start_time_that_is_no_number_is_one_line(tmp_path):
    """A damaged run state whose start time is no number: one line, not a traceback from the
    comparison that picks the most recently started run."""
    from pipeline.config import load_config
    from pipeline.run import resumable
    from pipeline.util.errors import UserError

    out = tmp_path / "out"
    for name, started in (("a", 1.0), ("b", None)):
        (out / f"{STAGING}{name}").mkdir(parents=True)
        (out / f"{STAGING}{name}" / RUN_STATE).write_text(json.dumps(
            {"fingerprint": "f", "task_folder": str(tmp_path / name), "started": started}))
    cfg = load_config("configs/corpus/sample.yaml", {"output": str(out), "runner": "DaskRunner"}, [])
    with pytest.raises(UserError, match=r"says it started at a time that is no number \(1.0, None\)"):
        resumable(cfg, "f", True)


def test_a_tasks_files_and_then_its_marker_are_on_the_disk_before_the_marker_is_named(sample, tmp_path):
    """On a machine that crashes (not a killed process), a task's marker could outlive its files'
    bytes, still in the page cache: a resumed run would reuse a task whose files were cut short, or
    read a marker of no bytes. Traced (strace, every process): before each marker is renamed into
    place, every file its task wrote (its stage files and the shards its sink wrote) and its folder
    were fsynced after the file's rename, and the marker's bytes too."""
    import re
    import shutil

    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace not installed (Debian: strace)")
    trace = tmp_path / "trace"
    done = subprocess.run([strace, "-f", "--seccomp-bpf", "-y", "-qq", "-e", "trace=fsync,/^rename", "-o", str(trace),
                           sys.executable, "-m", "pipeline", "run", "--no-progress", "--input",
                           str(sample / "wet" / "sample-00000.warc.wet.gz"), "--set",
                           "beam_options=[]", "--set", "steps=[dedup, lid]", "--runner", "DaskRunner",
                           "--dask_num_workers", "1", "--output", str(tmp_path / "out"),
                           "--temp_location", str(tmp_path / "temp")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "ptrace" in done.stderr:
        pytest.skip(f"strace cannot trace here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    events = []  # (thread, kind, path): fsync of a file or folder, rename to a path
    for line in trace.read_text().splitlines():
        if found := re.match(r'(\d+) +fsync\(\d+<([^>]*)>', line):  # (also "<unfinished ...>": threads at once)
            events.append((found[1], "fsync", found[2]))
        elif found := re.match(r'(\d+) +rename(?:at2?)?\((?:\w+(?:<[^>]*>)?, )?"([^"]*)", (?:\w+(?:<[^>]*>)?, )?"([^"]*)"', line):
            events.append((found[1], "rename", found[3]))  # (rename on x86_64, renameat(2) elsewhere)
            events.append((found[1], "from", found[2]))
    markers = [i for i, (_, kind, path) in enumerate(events) if kind == "rename" and re.search(r"/tasks/s\d+-\d+\.json$", path)]
    assert len(markers) >= 4, done.stderr[-3000:]
    shards = 0
    for m in markers:
        thread = events[m][0]
        previous = max([i for i in markers if i < m and events[i][0] == thread], default=-1)
        source = events[m + 1][2]
        assert any(e == (thread, "fsync", source) for e in events[previous + 1:m]), events[m]  # the marker's bytes
        written = [(i, path) for i, (t, kind, path) in enumerate(events[:m]) if i > previous and t == thread
                   and kind == "rename"]
        for i, path in written:  # (synced by any thread: several files by a few threads at once)
            synced = {p for _, kind, p in events[i + 1:m] if kind == "fsync"}
            assert path in synced and os.path.dirname(path) in synced, (path, events[m][2])  # its bytes, its name
        shards += sum("lang=" in path for _, path in written)
    assert shards >= 1  # a sink's files are the task's too
