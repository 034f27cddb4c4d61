"""200 randomly corrupted copies of the bundled WET and WARC files through `pipeline run`: every run
exits 0 without a traceback, and every record the reader met is accounted for, stage by stage:
kept, dropped with a reason, or rejected (and then listed in rejected/)."""
from __future__ import annotations

import io
import json
import random
from pathlib import Path

from conftest import SAMPLE

from pipeline.__main__ import main
from pipeline.readers.warc import iter_gzip_members

COPIES, RUNS = 200, 4
RECORDS = 24  # gzip members (records) of each base file


def base_files() -> dict[str, bytes]:
    """The first records of a sample WET and of a sample WARC file, as real gzip members."""
    bases = {}
    for kind, path in (("wet", SAMPLE / "wet" / "sample-00000.warc.wet.gz"), ("warc", SAMPLE / "warc" / "sample-00000.warc.gz")):
        data = path.read_bytes()
        members = list(iter_gzip_members(io.BytesIO(data)))[:RECORDS]
        bases[kind] = data[:members[-1].offset + members[-1].length]
    return bases


def corrupt(data: bytes, rng: random.Random) -> bytes:
    """One to three of: flipped bytes, a cut tail, a chunk cut out of the middle, garbage inserted,
    a chunk repeated."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["flip", "truncate", "cut", "garbage", "repeat"])
        at = rng.randrange(len(out))
        if kind == "flip":
            for i in rng.sample(range(len(out)), k=min(len(out), rng.randint(1, 40))):
                out[i] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del out[at:]
        elif kind == "cut":
            del out[at:at + rng.randint(1, 5000)]
        elif kind == "garbage":
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
        else:
            out[at:at] = out[at:at + rng.randint(1, 3000)]
        if not out:
            out = bytearray(data[:rng.randint(1, 100)])
    return bytes(out)


def check_accounting(out: Path) -> None:
    stats = json.loads((out / "stats.json").read_text())
    c = stats["counters"]
    read, dedup, lid = c["read"], c.get("dedup", {}), c.get("lid", {})
    rejected = sum(v for k, v in read.items() if k.startswith("rejected_"))
    listed = sum(1 for p in (out / "rejected").glob("part-*.jsonl") for _ in p.open()) if (out / "rejected").is_dir() else 0
    assert listed == rejected, (listed, rejected)
    documents = read.get("documents", 0)
    assert dedup.get("documents_in", 0) == documents
    dropped_by_dedup = dedup.get("all_paragraphs_duplicated", 0) + dedup.get("too_short", 0)
    assert dedup.get("documents_out", 0) == documents - dropped_by_dedup
    assert lid.get("documents_out", 0) == dedup.get("documents_out", 0) - lid.get("below_threshold", 0)
    near = c.get("near_dedup", {"documents_in": lid.get("documents_out", 0), "documents_out": lid.get("documents_out", 0)})
    assert near["documents_in"] == lid.get("documents_out", 0)
    assert near["documents_out"] == near["documents_in"] - near.get("near_duplicate", 0)
    written = c.get("write", {}).get("documents", 0)
    assert written == near["documents_out"] == sum(v["documents"] for v in stats["languages"].values())


def test_corrupted_inputs_are_all_accounted_for(tmp_path, capfd):
    rng = random.Random(20261124)
    bases = base_files()
    per_run = COPIES // RUNS
    seen = {"rejected": 0, "documents": 0}
    for run in range(RUNS):
        folder = tmp_path / f"in{run}"
        folder.mkdir()
        members = 0  # every gzip member (a record, or a corrupt stretch) must come out as something
        for i in range(per_run):
            kind = "wet" if i % 2 == 0 else "warc"
            name = f"copy{run:02d}{i:03d}.warc.wet.gz" if kind == "wet" else f"copy{run:02d}{i:03d}.warc.gz"
            data = corrupt(bases[kind], rng)
            (folder / name).write_bytes(data)
            members += sum(1 for _ in iter_gzip_members(io.BytesIO(data)))
        out = tmp_path / f"out{run}"
        assert main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--input", str(folder / "*"),
                     "--output", str(out), "--set", "beam_options=[]"]) == 0
        captured = capfd.readouterr()
        assert "Traceback" not in captured.err + captured.out, captured.err[-3000:]
        check_accounting(out)
        read = json.loads((out / "stats.json").read_text())["counters"]["read"]
        met = sum(v for k, v in read.items() if k == "documents" or k == "too_short" or k.startswith(("skipped_", "rejected_")))
        assert met >= members, (met, members)
        seen["rejected"] += sum(v for k, v in read.items() if k.startswith("rejected_"))
        seen["documents"] += read.get("documents", 0)
    assert seen["rejected"] > COPIES and seen["documents"] > COPIES * RECORDS // 4  # the corruption bit, and text survived
