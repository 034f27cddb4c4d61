"""The DirectRunner's scratch folder: the dedup's first pass keeps what it read on this machine's disk
for the second (``readers.spill``): the same results back, in order; nothing left behind; no spill
without room; and tables move between the write stages as files there (``transforms.write.stash``).
The run reads each file once and writes the bytes it writes when it reads every file twice and
moves every table as bytes."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_pipeline import inputs, run_cli  # noqa: F401  (the fixture: sample files and bad records)

from pipeline.readers import spill
from pipeline.util.errors import UserError
from pipeline.readers.files import read_file
from pipeline.config import ReadConfig
from pipeline.steps.base import Drop, Note, Rejected
from pipeline.util import locks
from pipeline.transforms import write

RESULTS = [{"id": "<urn:1>", "text": "a\nb", "title": None, "nlines": 2}, Drop("skipped_warcinfo"),
           Note("http_chunking_broken"), Rejected("x.warc.gz", 17, "not_utf8", "byte 3", "<urn:2>", "WARC/1.0"),
           *({"id": f"<urn:{i}>", "text": "é" * i, "length": i} for i in range(3, 600))]


def spilled(folder: Path, results=RESULTS, index: int = 4) -> list:
    return list(spill.keeping(str(folder), index, iter(results)))


def test_a_spill_gives_back_every_result_in_order_and_is_gone_once_taken(tmp_path):
    assert spilled(tmp_path) == RESULTS  # passed on unchanged while written
    assert [p.name for p in tmp_path.iterdir()] == ["000004.spill"]
    taken = spill.take(str(tmp_path), 4)
    assert list(tmp_path.iterdir()) == []  # deleted as it is opened: a retried bundle reads the file again
    assert list(taken) == RESULTS and [type(r) for r in RESULTS[:4]] == [dict, Drop, Note, Rejected]
    assert spill.take(str(tmp_path), 4) is None and spill.take(str(tmp_path), 5) is None


def test_the_real_reader_results_round_trip(sample, tmp_path):
    path = str(sorted((sample / "wet").glob("*.warc.wet.gz"))[0])
    read = list(read_file(path, ReadConfig()))
    assert spilled(tmp_path, read, 0) == read and list(spill.take(str(tmp_path), 0)) == read and len(read) > 100


def test_no_spill_without_a_folder_or_room_past_its_budget_or_when_the_disk_fills(tmp_path, monkeypatch):
    assert spilled(tmp_path / "gone") == RESULTS and list(tmp_path.iterdir()) == []  # no scratch folder
    monkeypatch.setenv(spill.SPARE_ENV, "")
    assert spill.no_room(str(tmp_path)) == ""
    monkeypatch.setattr(spill, "SPARE_BYTES", 2**62)  # no disk has that much free
    assert spilled(tmp_path) == RESULTS and list(tmp_path.iterdir()) == []
    assert spill.no_room(str(tmp_path)) == (f"is on a disk with 512.0 GiB free, under the {2**32:.1f} GiB a spill leaves "
                                           "spare (5 % of the disk, at least 1 GiB; POLYGLOT_SCRATCH_SPARE=<size> sets it)")
    monkeypatch.setattr(spill, "SPARE_BYTES", 0)
    monkeypatch.setenv(spill.SPARE_ENV, "16T")  # the spare the user set: more than the disk has free
    assert spilled(tmp_path) == RESULTS and list(tmp_path.iterdir()) == []
    for value, spare in (("0", 0), ("512M", 2**29), ("2g", 2**31), (" 7 ", 7)):
        monkeypatch.setenv(spill.SPARE_ENV, value)
        assert spill.spare_bytes(2**40) == spare
    for value in ("-1", "1.5G", "lots", "G", "5GB", "10 G", "1e9", "\u00b2", "\u0661\u0662G", "9" * 30):
        monkeypatch.setenv(spill.SPARE_ENV, value)
        with pytest.raises(UserError, match=f"^{spill.SPARE_ENV}={value!r}: a size in bytes"):
            spill.spare_bytes(2**40)
    monkeypatch.setenv(spill.SPARE_ENV, "0")
    monkeypatch.setattr(spill, "budget", lambda scratch: 1000)  # the first frame is past it
    assert spilled(tmp_path) == RESULTS and list(tmp_path.iterdir()) == []

    class Full:
        def __init__(self, path, mode):
            self.file = open(path, mode)

        def write(self, data):
            raise OSError(28, "No space left on device")

        def close(self):
            self.file.close()

    monkeypatch.setattr(spill, "budget", lambda scratch: 2**40)
    odd = [*RESULTS, {"id": "<urn:odd>", "text": "x", "weights": object()}]  # a value marshal cannot write
    assert spilled(tmp_path, odd) == odd and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(spill, "open", Full, raising=False)
    assert spilled(tmp_path) == RESULTS and list(tmp_path.iterdir()) == []


def test_no_spill_in_memory(tmp_path, monkeypatch):
    """A tmpfs (``/tmp`` on many machines) is memory the workers need: no spill there."""
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n/dev/vdb /tmp/disk ext4 rw 0 0\n"
                      "ramfs /mnt/with\\040space ramfs rw 0 0\n")
    backed = {path: spill.memory_backed(path, str(mounts)) for path in
              ("/tmp/x", "/tmp", "/tmp/disk/x", "/tmpx", "/mnt/with space/y", "/home/a")}
    assert backed == {"/tmp/x": True, "/tmp": True, "/tmp/disk/x": False, "/tmpx": False,
                      "/mnt/with space/y": True, "/home/a": False}
    assert spill.memory_backed("/tmp/x", str(tmp_path / "no-mounts")) is False
    monkeypatch.setattr(spill, "memory_backed", lambda path: True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert spilled(scratch) == RESULTS and list(scratch.iterdir()) == []


def test_a_reader_stopped_early_leaves_nothing(tmp_path):
    stream = spill.keeping(str(tmp_path), 0, iter(RESULTS))
    assert next(stream) == RESULTS[0] and len(list(tmp_path.iterdir())) == 1  # the temporary file
    stream.close()
    assert list(tmp_path.iterdir()) == []


def test_a_scratch_folder_that_holds_spills_in_memory_writes_none_until_it_is_out_of_room(tmp_path):
    """Where the process that made the scratch folder reads a file (in-process workers), its results
    are held in memory, given back in order by the same objects, once; past the folder's
    ``hold_bytes`` a file's results, those held so far included, go to its spill on the disk; taking
    a file gives room back; the folder's end lets go of what it held."""
    held = spill.Scratch(str(tmp_path), hold_bytes=sum(spill._held_bytes(r) for r in RESULTS) + 10)
    try:
        assert spilled(held.path, index=4) == RESULTS
        assert not list(Path(held.path).glob("*.spill"))
        assert spilled(held.path, RESULTS[:20], index=5) == RESULTS[:20]  # no room left: to the disk
        assert [p.name for p in Path(held.path).glob("*.spill")] == ["000005.spill"]
        taken = list(spill.take(held.path, 4))
        assert taken == RESULTS and all(a is b for a, b in zip(taken, RESULTS))
        assert spill.take(held.path, 4) is None  # taken once: a retried bundle reads the file again
        assert list(spill.take(held.path, 5)) == RESULTS[:20] and not list(Path(held.path).glob("*.spill"))
        assert spilled(held.path, index=6) == RESULTS and not list(Path(held.path).glob("*.spill"))  # room again
        stream = spill.keeping(held.path, 7, iter(RESULTS))
        next(stream)
        stream.close()  # a reader stopped early holds nothing
        assert spill.take(held.path, 7) is None
    finally:
        held.remove()
    assert spill.take(held.path, 6) is None  # let go of with the folder
    tiny = spill.Scratch(str(tmp_path), hold_bytes=100)  # not even the first result fits
    try:
        assert spilled(tiny.path, index=1) == RESULTS and len(list(Path(tiny.path).glob("*.spill"))) == 1
        assert list(spill.take(tiny.path, 1)) == RESULTS
    finally:
        tiny.remove()


def test_spills_are_held_only_in_the_process_that_made_the_scratch_folder(tmp_path):
    """A worker in another process (started, or forked without :func:`spill.hold_here`) finds no
    memory to hold them in: it writes the spill to the disk, where a worker of any process takes it."""
    held = spill.Scratch(str(tmp_path), hold_bytes=2**30)
    try:
        code = ("import sys; from pipeline.readers import spill; from pipeline.steps.base import Drop\n"
                "results = [{'id': 'a', 'text': 'x'}, Drop('too_short')]\n"
                "assert list(spill.keeping(sys.argv[1], 3, iter(results))) == results\n")
        subprocess.run([sys.executable, "-c", code, held.path], check=True, timeout=60)
        assert [p.name for p in Path(held.path).glob("*.spill")] == ["000003.spill"]
        assert list(spill.take(held.path, 3)) == [{"id": "a", "text": "x"}, Drop("too_short")]
    finally:
        held.remove()


def test_a_worker_told_to_hold_spills_keeps_those_it_reads_for_its_own_second_pass(tmp_path):
    """A worker that runs both passes of the files it reads (``hold_here``: the DirectRunner's forked
    workers) holds what it reads in its memory, up to its budget, and takes it back from there; past
    the budget a file goes to the disk, as in a worker that holds nothing."""
    held = spill.Scratch(str(tmp_path))
    try:
        code = ("import sys; from pathlib import Path; from pipeline.readers import spill\n"
                "results = [{'id': str(i), 'text': 'x' * 100} for i in range(20)]\n"
                "spill.hold_here(spill._held_bytes(results[0]) * 30)\n"
                "assert list(spill.keeping(sys.argv[1], 3, iter(results))) == results\n"
                "assert not list(Path(sys.argv[1]).glob('*.spill'))\n"
                "assert list(spill.keeping(sys.argv[1], 4, iter(results))) == results  # past the budget\n"
                "assert [p.name for p in Path(sys.argv[1]).glob('*.spill')] == ['000004.spill']\n"
                "taken = list(spill.take(sys.argv[1], 3))\n"
                "assert taken == results and taken[0] is results[0] and spill.take(sys.argv[1], 3) is None\n")
        subprocess.run([sys.executable, "-c", code, held.path], check=True, timeout=60)
        assert [p.name for p in Path(held.path).glob("*.spill")] == ["000004.spill"]  # for any worker to take
    finally:
        held.remove()


def test_hold_bytes_is_a_quarter_of_the_memory_available(tmp_path, monkeypatch):
    from pipeline.util import memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n")
    alone = str(tmp_path / "no-cgroup")  # (this machine's own cgroups left out)
    assert memory.available_bytes(str(meminfo), own=alone) == 20000000 * 1024
    assert memory.available_bytes(str(tmp_path / "absent"), own=alone) == 0
    monkeypatch.setattr(spill, "available_bytes", lambda: 4000)
    assert spill.hold_bytes() == 1000


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_the_memory_available_is_the_containers_not_the_hosts(version, tmp_path):
    """In a container, a Kubernetes pod or a Slurm job, /proc/meminfo shows the host's memory: a run
    held a quarter of a 512 GB host's in a 32 GB pod, and the kernel killed it. The tightest memory
    cgroup the process is in (its own or a parent's) lowers it: limit - usage + inactive cache."""
    from pipeline.util import memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable:   500000000 kB\n")  # ~477 GiB
    cgroups, own = tmp_path / "cgroup", tmp_path / "self-cgroup"
    limit, usage, inactive = memory.CGROUP_FILES[version]
    mount = cgroups if version == "v2" else cgroups / "memory"
    job, pod = mount / "kubepods" / "pod1", mount / "kubepods"
    for folder, (cap, used, cache) in ((job, ("max" if version == "v2" else str(2**63 - 4096), 10, 0)),
                                       (pod, (str(32 * 2**30), str(30 * 2**30), 2**30))):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / limit).write_text(f"{cap}\n")
        (folder / usage).write_text(f"{used}\n")
        (folder / "memory.stat").write_text(f"anon 5\n{inactive} {cache}\n")
    if version == "v2":
        (cgroups / "cgroup.controllers").write_text("cpu memory\n")
    own.write_text("0::/kubepods/pod1\n" if version == "v2" else "4:memory:/kubepods/pod1\n1:cpu:/\n")
    assert memory.available_bytes(str(meminfo), str(cgroups), str(own)) == 3 * 2**30
    (pod / "memory.stat").unlink()  # (a sandbox's kernel may not have it: the limit still counts)
    own.write_text("garbage\n" + own.read_text())
    assert memory.available_bytes(str(meminfo), str(cgroups), str(own)) == 2 * 2**30
    own.write_text("0::/elsewhere\n" if version == "v2" else "4:memory:/elsewhere\n")  # no limit on its way up
    assert memory.available_bytes(str(meminfo), str(cgroups), str(own)) == 500000000 * 1024


def test_a_spill_cut_short_is_not_taken_and_the_file_is_read_again(tmp_path):
    spilled(tmp_path)
    path = tmp_path / "000004.spill"
    data = path.read_bytes()
    for cut in (len(data) - 8, len(data) - 100, 5, 0):
        path.write_bytes(data[:cut])
        assert spill.take(str(tmp_path), 4) is None and not path.exists()
    path.write_bytes(data + b"x")  # bytes after the end mark: not what was written either
    assert spill.take(str(tmp_path), 4) is None
    path.write_bytes(data)
    assert list(spill.take(str(tmp_path), 4)) == RESULTS


def test_stashed_tables_come_back_from_one_file_or_from_bytes_without_room(tmp_path, monkeypatch):
    import pyarrow as pa

    tables = [pa.table({"id": [f"<urn:{i}>"], "text": ["é" * i]}) for i in (300, 0, 70_000)]
    parts = write.stash(tables, str(tmp_path))
    assert all(isinstance(p, str) for p in parts) and len({p.rpartition("@")[0] for p in parts}) == 1  # one file
    assert [write.unstash(p) for p in reversed(parts)] == tables[::-1]  # each from its own span, in any order
    assert write.stash([], str(tmp_path)) == []
    assert all(isinstance(p, bytes) for p in write.stash(tables, ""))  # no scratch folder (runners but Direct)
    assert [write.unstash(p) for p in write.stash(tables, "")] == tables
    monkeypatch.setattr(spill, "budget", lambda scratch: 2**40)
    assert isinstance(write.stash(tables[:1], str(tmp_path / "gone"))[0], bytes)  # a write that fails
    monkeypatch.setattr(spill, "budget", lambda scratch: sum(t.nbytes for t in tables) - 1)  # no room for them
    assert all(isinstance(p, bytes) for p in write.stash(tables, str(tmp_path)))
    assert [p.name for p in tmp_path.iterdir()] == [parts[0].rpartition("@")[0].rsplit("/", 1)[1]]


def test_the_scratch_folder_goes_to_a_disk_where_the_temporary_folder_is_memory(tmp_path, monkeypatch):
    memory, disk = tmp_path / "memory", tmp_path / "disk"
    for folder in (memory, disk, memory / "var"):
        folder.mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {memory} tmpfs rw 0 0\n")
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(memory))
    monkeypatch.setattr(spill, "DISK_TEMP", str(disk))
    assert spill.scratch_parent(str(mounts)) == str(disk)
    monkeypatch.setenv("TMPDIR", str(memory))  # set by the user: kept
    assert spill.scratch_parent(str(mounts)) == str(memory)
    monkeypatch.delenv("TMPDIR")
    for elsewhere in (memory / "var", tmp_path / "absent"):  # no disk folder to go to
        monkeypatch.setattr(spill, "DISK_TEMP", str(elsewhere))
        assert spill.scratch_parent(str(mounts)) == str(memory)
    monkeypatch.setattr(tempfile, "tempdir", str(disk))
    assert spill.scratch_parent(str(mounts)) == str(disk)


@pytest.mark.parametrize("shared", [False, True])
def test_a_scratch_folder_left_by_a_killed_run_is_removed_by_the_next(tmp_path, caplog, monkeypatch, shared):
    """Real processes: one makes a scratch folder and is SIGKILLed (the kernel frees its lock), one
    makes one and lives on; the next scratch folder made there removes the first only. Left alone:
    a folder without a lock file, one whose lock file is empty (being made), one whose lock file is
    a link or a FIFO (another user's trap: opening a FIFO would wait), a link to a folder, and, on a
    file system other machines share (``shared``), one whose lock names another host. On a local
    one, a free lock naming another host is a dead run's (a container restarted with another
    hostname on the same volume): removed."""
    monkeypatch.setattr(locks, "network_fs", lambda folder: shared)
    script = ("import sys, time\nfrom pipeline.readers.spill import Scratch\n"
              "print(Scratch(sys.argv[1]).path, flush=True)\ntime.sleep(120)\n")
    root = Path(__file__).resolve().parents[1]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=root)
             for _ in range(2)]
    try:
        killed, alive = (Path(proc.stdout.readline().strip()) for proc in procs)
        (killed / "000001.spill").write_bytes(b"what the killed run read")
        procs[0].kill()
        procs[0].wait()
        left = {name: tmp_path / f"{spill.SCRATCH_PREFIX}{name}" for name in ("bare", "making", "far", "link", "fifo")}
        for folder in left.values():
            folder.mkdir()
        (left["making"] / locks.LOCK_FILE).touch()
        (left["far"] / locks.LOCK_FILE).write_text("another-host 12\n")
        (left["link"] / locks.LOCK_FILE).symlink_to(killed / locks.LOCK_FILE)
        os.mkfifo(left["fifo"] / locks.LOCK_FILE)
        (tmp_path / f"{spill.SCRATCH_PREFIX}to-killed").symlink_to(killed)
        with caplog.at_level("INFO", logger=spill.__name__):
            mine = spill.Scratch(str(tmp_path))
        kept = [alive, *(folder for name, folder in left.items() if shared or name != "far"),
                tmp_path / f"{spill.SCRATCH_PREFIX}to-killed", Path(mine.path)]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)
        assert f"removed {killed}, the scratch folder of a run that was killed" in caplog.text
        assert spill.abandoned(str(tmp_path)) == []  # the living run's and this one's are held
        mine.remove()
        assert not Path(mine.path).exists()
    finally:
        procs[1].kill()
        procs[1].wait()
    assert spill.abandoned(str(tmp_path)) == [str(alive)]


def test_a_scratch_folder_where_nothing_locks_has_no_lock_file_and_one_that_cannot_be_made_is_one_line(tmp_path,
                                                                                                         monkeypatch):
    import errno
    import fcntl


    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)  # NFS without lockd, Lustre without flock
    made = spill.Scratch(str(tmp_path))
    assert list(Path(made.path).iterdir()) == []  # never taken for abandoned by another run
    made.remove()
    assert not Path(made.path).exists()
    with pytest.raises(UserError, match=f"cannot make the run's scratch folder in {tmp_path / 'absent'}: No such "
                                        "file or directory; set TMPDIR to a writable folder on a local disk"):
        spill.Scratch(str(tmp_path / "absent"))


def test_the_run_reads_each_file_once_and_writes_what_it_writes_reading_twice(inputs, tmp_path, monkeypatch,  # noqa: F811
                                                                              caplog):
    """In-process DirectRunner on two sample files and every kind of bad record: each input file is
    read once (by the first pass), its results held in memory for the second, and every table moves
    between the write stages as a file; with no memory to hold them in, the same through spills on
    the disk; with the scratch folder in memory (a tmpfs, said in a warning) and no memory to hold
    them in, each file is read twice and every table moves as bytes, and the same on a disk with no
    room to spill (said in a warning too). Shards, stats and rejected
    records are the same bytes, and the run's scratch folder is gone."""
    from pipeline.transforms import dedup

    reads: list[str] = []
    writers: list[str] = []  # the spills written to the disk
    kinds = tmp_path / "stashed.txt"  # a file: Beam pickles the Stash step's function, a copy of any list

    def counted(path, cfg):
        reads.append(path)
        return read_file(path, cfg)

    class Writer(spill._Writer):
        def __init__(self, final, budget):
            super().__init__(final, budget)
            writers.append(final)

    def recorded(tables, scratch, stash=write.stash):
        parts = stash(tables, scratch)
        with open(kinds, "a") as out:
            out.writelines(f"{type(part).__name__}\n" for part in parts)
        return parts

    monkeypatch.setattr(dedup, "read_file", counted)
    monkeypatch.setattr(write, "stash", recorded)
    monkeypatch.setattr(spill, "_Writer", Writer)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    outputs = {}
    for name in ("held", "spilled", "read twice", "disk full"):
        if name == "spilled":
            monkeypatch.setattr(spill, "hold_bytes", lambda: 0)
        if name == "read twice":
            monkeypatch.setattr(spill, "memory_backed", lambda path, mounts="": True)
        if name == "disk full":  # (CI's host, and ours once two clean clones had filled it)
            monkeypatch.setattr(spill, "memory_backed", lambda path, mounts="": False)
            monkeypatch.setattr(spill, "budget", lambda scratch: 0)
        twice = name in ("read twice", "disk full")
        caplog.clear()
        reads.clear()
        writers.clear()
        kinds.write_text("")
        out = tmp_path / name.replace(" ", "-")
        assert run_cli("--config", "configs/corpus/sample.yaml", "--input", str(inputs / "*.gz"), "--output", str(out),
                       "--set", "beam_options=[]", "--set", "steps=[dedup, lid]") == 0
        files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "run.json" and "report" not in p.parts)
        outputs[name] = {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
        readable = {p for p in reads if not p.endswith("dangling.warc.wet.gz")}
        assert len(reads) == len(set(reads)) * (2 if twice else 1) and len(readable) == 4, reads
        assert len(writers) == (0 if name == "held" else len(set(reads))), writers
        stashed = kinds.read_text().split()  # the Stash step's tables and SplitByShard's parts
        assert len(stashed) > 2 and set(stashed) == {"bytes" if twice else "str"}, stashed
        assert not list(tmp_path.glob("polyglot-scratch-*"))
        assert ("is in memory (a tmpfs), so nothing is kept there" in caplog.text) == (name == "read twice")
        assert ("a spill leaves spare (POLYGLOT_SCRATCH_SPARE)" in caplog.text) == (name == "disk full")
    assert outputs["held"] == outputs["spilled"] == outputs["read twice"] == outputs["disk full"]
    assert any(name.startswith("rejected/") for name in outputs["spilled"]) and len(outputs["spilled"]) > 5
