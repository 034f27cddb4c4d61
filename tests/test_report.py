"""The corpus report: written by every run, rebuilt by `pipeline report` from stats.json and
sampling.json alone, on an older corpus too, and checked in headless Chromium."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, open_in_chromium

from pipeline.__main__ import main
from pipeline.steps.perplexity import write_cutoffs

PLOTS = ["funnel.png", "languages.png", "sampling.png", "perplexity.png", "near_dedup.png", "rejected.png"]
SCREENSHOTS = ROOT / "out" / "screenshots"  # kept for a person to look at (CI artifacts)


@pytest.fixture(scope="module")
def corpus(sample, sample_lms, tmp_path_factory) -> Path:
    """Two sample files, scored and bucketed, near-dup on with a low threshold so that clusters form."""
    root = tmp_path_factory.mktemp("report")
    inputs = root / "in"
    inputs.mkdir()
    for path in sorted((sample / "wet").glob("*.warc.wet.gz"))[:2]:
        shutil.copy(path, inputs / path.name)
    cutoffs = root / "cutoff.csv"
    write_cutoffs({lang: [60.0 + 6 * p for p in range(100)] for lang in ("de", "en", "fr", "ru", "zh", "ar")}, str(cutoffs))
    assert main(["run", "--no-progress", "--config", "configs/corpus/sample.yaml", "--input", str(inputs / "*.warc.wet.gz"),
                 "--output", str(root / "corpus"), "--set", "beam_options=[]", "--set", f"perplexity.models={sample_lms}",
                 "--set", f"perplexity.cutoffs={cutoffs}", "--set", "near_dedup.threshold=0.5"]) == 0
    return root / "corpus"


def test_every_run_writes_the_report(corpus):
    report = corpus / "report"
    assert sorted(p.name for p in report.iterdir()) == sorted([*PLOTS, "report.md", "report.html"])
    page = (report / "report.html").read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == len(PLOTS) and "http" not in page.split("<body>")[0]
    md = (report / "report.md").read_text(encoding="utf-8")
    for plot in PLOTS:
        assert f"]({plot})" in md and (report / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stats = json.loads((corpus / "stats.json").read_text())
    clusters = stats["counters"]["near_dedup_cluster_sizes"]
    assert clusters and sum(clusters.values()) == stats["counters"]["near_dedup"]["clusters"]
    assert sum(int(size) * n - n for size, n in clusters.items()) == stats["counters"]["near_dedup"]["near_duplicate"]
    ppl = stats["perplexity"]["languages"]
    assert ppl["de"]["cutoffs"] == {"head": 60.0 + 6 * 30, "tail": 60.0 + 6 * 60} and "cutoffs" not in ppl["vi"]
    assert sum(c for _, c in ppl["de"]["histogram"]) == stats["languages"]["de"]["documents"]
    # the tables a reader needs: every stage, per-language drops, the sampling at other alphas, the cutoffs
    assert "| after near-dup |" in md and "near_dedup: near_duplicate" in md and "q_i % (α=0.7)" in md
    assert re.search(r"\| de \| \d+ \| \d+ \| 240 \| 420 \|", md), md
    assert "| apache-beam |" in md


def test_pipeline_report_rebuilds_it_from_stats_and_sampling_alone(corpus, tmp_path, capsys):
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("stats.json", "sampling.json"):
        shutil.copy(corpus / name, alone / name)
    assert main(["report", str(alone)]) == 0
    assert "report.html" in capsys.readouterr().out
    for name in (*PLOTS, "report.md", "report.html"):
        assert (alone / "report" / name).read_bytes() == (corpus / "report" / name).read_bytes(), name


def test_the_report_process_or_the_driver_in_its_place(corpus, tmp_path, monkeypatch):
    """``pipeline run``'s report process (``report.background``) draws the report; where it has not
    imported matplotlib yet, is gone, does not answer within WAIT_S (stopped, with a request larger
    than a pipe holds), or cannot draw it, the driver draws it itself: the same bytes, or the same
    one-line error."""
    import select
    import signal
    import time

    from pipeline.report import background
    from pipeline.util.errors import UserError

    answers: list[bool] = []
    drawn = background._drawn
    monkeypatch.setattr(background, "_drawn", lambda process, request: answers.append(
        (files := drawn(process, request)) is not None) or files)

    def report_of(name: str, ready: bool = True, spoil=None, stats: dict | None = None) -> dict[str, bytes]:
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(corpus / "sampling.json", folder / "sampling.json")
        (folder / "stats.json").write_text(json.dumps(stats or json.loads((corpus / "stats.json").read_text())))
        background.start()
        if ready:  # matplotlib imported: "ready" written
            assert select.select([background._started.stdout], [], [], 60)[0]
        if spoil:
            spoil(background._started)
        started = time.monotonic()
        background.build(str(folder))
        assert time.monotonic() - started < background.WAIT_S + 10  # (a stopped process: WAIT_S, then the driver's)
        assert background._started is None
        return {p.name: p.read_bytes() for p in (folder / "report").iterdir()}

    expected = {p.name: p.read_bytes() for p in (corpus / "report").iterdir()}
    assert report_of("drawn") == expected and answers == [True]
    assert report_of("not-ready", ready=False) == expected and answers[-1] is False
    assert report_of("gone", spoil=lambda process: (process.kill(), process.wait())) == expected and answers[-1] is False
    large = {**json.loads((corpus / "stats.json").read_text()), "padding": "x" * 200_000}
    monkeypatch.setattr(background, "WAIT_S", 1.0)
    assert report_of("stopped", spoil=lambda process: process.send_signal(signal.SIGSTOP),
                     stats=large) == expected and answers[-1] is False
    bad = {**json.loads((corpus / "stats.json").read_text()), "languages": []}
    with pytest.raises(UserError, match=r"bad/stats.json or sampling.json: not as pipeline run writes them"):
        report_of("bad", stats=bad)
    assert answers[-1] is False and background._started is None
    monkeypatch.setattr(background.sys, "executable", None)  # no interpreter to start: the driver draws it
    asked = len(answers)
    assert report_of("no-interpreter", ready=False) == expected and len(answers) == asked


def test_an_older_corpus_and_a_folder_that_is_none(corpus, tmp_path, capsys):
    """stats.json from before the report (no histograms, per-language drops, cluster sizes, versions)."""
    old = tmp_path / "old"
    old.mkdir()
    stats = json.loads((corpus / "stats.json").read_text())
    for key in ("perplexity", "versions"):
        del stats[key]
    stats["counters"] = {step: {k: v for k, v in names.items() if "/" not in k}
                         for step, names in stats["counters"].items() if step != "near_dedup_cluster_sizes"}
    (old / "stats.json").write_text(json.dumps(stats))
    shutil.copy(corpus / "sampling.json", old / "sampling.json")
    assert main(["report", str(old), "--out", str(tmp_path / "out")]) == 0
    assert "No document was scored" in (tmp_path / "out" / "report.md").read_text()
    capsys.readouterr()
    assert main(["report", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stats.json: no such file" in err
    (old / "stats.json").write_text("{}")
    assert main(["report", str(old)]) == 2
    assert capsys.readouterr().err == f"error: {old / 'stats.json'}: not written by pipeline run (no 'counters')\n"
    (old / "stats.json").write_bytes(b"\x89PNG not json")
    assert main(["report", str(old)]) == 2
    assert "stats.json: not valid JSON" in capsys.readouterr().err
    (old / "stats.json").write_text(json.dumps({**stats, "languages": {"de": "edited by hand"}}))
    assert main(["report", str(old)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stats.json or sampling.json: not as pipeline run writes them (TypeError" in err


def test_the_report_in_a_browser(corpus):
    seen = open_in_chromium(corpus / "report" / "report.html", SCREENSHOTS / "corpus-report.png")
    assert seen["images"] == len(PLOTS) and seen["broken"] == 0, seen
    assert seen["tables"] >= 9 and not seen["errors"] and not seen["console_errors"], seen
    assert seen["screenshot"]
