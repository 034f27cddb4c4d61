"""The step contract: a filter added as one module plus one config entry, and nothing else, runs on
the DirectRunner and the DaskRunner with the same bytes, and its drops reach stats.json, the
report's funnel and ``removed/<step>/``. Profiles that name steps wrongly are one error line."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

TOY_FILTER = '''
"""A toy filter: documents with fewer than `min_words` words leave the corpus."""
import dataclasses

from pipeline.steps.base import Drop, Step


@dataclasses.dataclass
class MinWordsConfig:
    min_words: int = 50
    """Fewest words a document keeps."""


class MinWords(Step):
    name = "min_words"
    Config = MinWordsConfig
    counters = ("too_few_words", "words")

    def __call__(self, doc):
        words = len(doc["text"].split())
        self.count("words", words)
        return Drop("too_few_words") if words < self.cfg.min_words else doc
'''


def run(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m pipeline run`` with the toy module importable by the driver and every worker."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugins"), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "pipeline", "run", "--no-progress", "--config",
                           str(tmp_path / "profile.yaml"), "--output", str(tmp_path / name), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "run.json"}


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """One new module (the filter) and one config entry (the sample profile with it in `steps`)."""
    root = tmp_path_factory.mktemp("toy")
    (root / "plugins").mkdir()
    (root / "plugins" / "toyfilter.py").write_text(TOY_FILTER, encoding="utf-8")
    profile = yaml.safe_load((ROOT / "configs/corpus/sample.yaml").read_text(encoding="utf-8"))
    profile["steps"] = ["dedup", "lid", "toyfilter:MinWords", "near_dedup", "perplexity"]
    profile["min_words"] = {"min_words": 120}
    profile["write"]["removed"] = True
    (root / "profile.yaml").write_text(yaml.safe_dump(profile), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def direct(toy) -> Path:
    """The profile's corpus from the DirectRunner at 2 workers: what each test below checks or compares with."""
    result = run(toy, "direct", "--set", "beam_options=[--direct_num_workers=2,--direct_running_mode=multi_processing]")
    assert result.returncode == 0, result.stderr[-3000:]
    return toy / "direct"


def test_a_filter_added_as_one_module_reaches_stats_report_and_removed(direct):
    out = direct
    stats = json.loads((out / "stats.json").read_text())
    counters = stats["counters"]["min_words"]
    dropped = counters["too_few_words"]
    assert 0 < dropped < stats["counters"]["lid"]["documents_out"] and counters["words"] > 0
    assert counters["documents_out"] == stats["counters"]["near_dedup"]["documents_in"]
    per_lang = {k.split("/")[1]: v for k, v in counters.items() if k.startswith("too_few_words/")}
    assert sum(per_lang.values()) == dropped and len(per_lang) > 5
    assert stats["config"]["steps"] == ["dedup", "lid", "min_words", "near_dedup", "perplexity"]
    assert stats["config"]["min_words"] == {"min_words": 120}
    removed = [json.loads(line) for p in sorted((out / "removed" / "min_words").glob("part-*.jsonl"))
               for line in p.read_text(encoding="utf-8").splitlines()]
    assert len(removed) == dropped and {r["reason"] for r in removed} == {"too_few_words"}
    assert all(len(r["text"].split()) < 120 and r["lang"] for r in removed)
    report = (out / "report" / "report.md").read_text(encoding="utf-8")
    funnel = report.split("## ")[1]  # the first section: the funnel
    assert f"| after min_words | {counters['documents_out']:,} | {dropped:,} |" in funnel
    assert "min_words: too_few_words" in funnel  # the per-language drops table's column


@pytest.mark.slow
def test_the_filter_gives_the_same_bytes_on_the_dask_runner(toy, direct):
    result = run(toy, "dask", "--runner", "DaskRunner", "--set", "beam_options=[--dask_num_workers=2]")
    assert result.returncode == 0, result.stderr[-3000:]
    assert digests(toy / "dask") == digests(direct) and len(digests(direct)) > 10


@pytest.mark.parametrize("sets, message", [
    (["steps=[dedup, lidd]"], "steps: unknown step 'lidd' (did you mean 'lid'?)"),
    (["steps=[dedup, lid, lid]"], "steps: 'lid' is named twice"),
    (["steps=[lid, dedup]"], "'dedup' works on the input files and must come first"),
    (["steps=[dedup, perplexity, lid]"], "'perplexity' needs 'lang', set by lid: put that step before it"),
    (["steps=[dedup, near_dedup, lid]"], "'near_dedup' needs 'lang', set by lid"),
    (["near_dedup.treshold=0.5"], "unknown config key 'near_dedup.treshold' (did you mean 'near_dedup.threshold'?)"),
    (["near_dedupe.threshold=0.5"], "unknown config key 'near_dedupe' (did you mean 'near_dedup'?)"),
    (["steps=[dedup, no.such.module]"], "step 'no.such.module': cannot import no.such.module"),
    (["steps=[dedup, pipeline.steps.base]"], "module pipeline.steps.base has 0 Step subclasses"),
])
def test_a_profile_naming_steps_wrongly_is_one_line(sets, message):
    from pipeline.config import load_config
    from pipeline.util.errors import UserError

    with pytest.raises(UserError) as error:
        load_config(str(ROOT / "configs/corpus/sample.yaml"), {"output": "/tmp/x"}, sets)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_section_of_a_step_not_in_steps_is_an_error_on_the_command_line_and_a_warning_in_a_file(tmp_path, caplog):
    """A section of a step missing from ``steps:`` was built, checked and never read: ``--set
    pii.remove_emails=false`` with the default steps, or a profile's ``pii:`` section without pii in
    its steps, removed no PII and said nothing. A key the command line sets there is one error line;
    sections a file keeps for steps switched off are one warning line; the shipped profiles have none."""
    from pipeline.config import load_config
    from pipeline.util.errors import UserError

    with pytest.raises(UserError) as error:
        load_config(str(ROOT / "configs/corpus/sample.yaml"), {"output": "/tmp/x"}, ["pii.remove_emails=false"])
    assert str(error.value).startswith("--set pii.remove_emails=false: pii.remove_emails is set, but step pii is not "
                                       "in steps") and str(error.value).endswith("add pii to steps")
    profile = tmp_path / "profile.yaml"
    profile.write_text("input: x.wet.gz\noutput: out\nsteps: [dedup, lid]\npii: {remove_emails: false}\n"
                       "symbol_lines: {replace_char: x}\n", encoding="utf-8")
    with pytest.raises(UserError, match="^--set pii.remove_ips=false: pii.remove_ips is set, but step pii"):
        load_config(str(profile), sets=["pii.remove_ips=false"])
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipeline.config"):
        load_config(str(profile))
        assert [r.getMessage() for r in caplog.records] == [
            f"{profile}: these steps are not in steps, so their sections are not used: pii, symbol_lines"]
        caplog.clear()
        assert load_config(str(profile), sets=["steps=[dedup, lid, pii, symbol_lines]"]).sections["pii"].remove_emails is False
        load_config(str(profile), sets=["steps=[dedup, lid]"])  # the command line switched them off: no warning
        assert not caplog.records
        for shipped in sorted((ROOT / "configs/corpus").glob("*.yaml")):
            load_config(str(shipped), {"input": ["x.wet.gz"], "output": "/tmp/x"})
        assert not caplog.records


GLOBAL_STEPS = '''
"""Global steps whose composites are built, and return their outputs, rightly and wrongly."""
import dataclasses

import apache_beam as beam

from pipeline.steps.base import Step


@dataclasses.dataclass
class Cfg:
    x: int = 0


class TakesStepAndRun(beam.PTransform):  # a global step's composite, not the one that reads the files
    def __init__(self, step, run):
        super().__init__()

    def expand(self, pcoll):
        return {"main": pcoll, "removed": pcoll | beam.Filter(lambda _: False)}


class ReadsRightly(beam.PTransform):
    def __init__(self, step, read, run):
        super().__init__()

    def expand(self, files):
        docs = files | beam.Map(lambda item: {"id": str(item[0]), "text": item[1], "lang": "en"})
        return {"main": docs, "rejected": files | "R" >> beam.Filter(lambda _: False),
                "removed": files | "D" >> beam.Filter(lambda _: False)}


class ReturnsItsInput(ReadsRightly):
    def expand(self, files):
        return files


class ReturnsNoRejected(ReadsRightly):
    def expand(self, files):
        return {key: value for key, value in super().expand(files).items() if key != "rejected"}


def step(class_name, reads):
    return type(class_name, (Step,), {"name": class_name.lower(), "Config": Cfg, "counters": ("x",),
                                      "transform": f"globalsteps:{class_name}", "reads_files": reads})
'''


@pytest.mark.parametrize("transform, reads, message", [
    ("ReadsRightly", True, None),
    ("TakesStepAndRun", False, None),
    ("TakesStepAndRun", True, "step takesstepandrun (globalsteps.TakesStepAndRun): its composite globalsteps:TakesStepAndRun, "
                              "built as TakesStepAndRun(step, read, run) failed: TypeError: "),
    ("ReadsRightly", False, "built as ReadsRightly(step, run) failed: TypeError: "),
    ("ReturnsItsInput", True, "step returnsitsinput (globalsteps.ReturnsItsInput): its composite globalsteps:ReturnsItsInput, "
                              "built as ReturnsItsInput(step, read, run), returned PCollection: it must return the outputs "
                              "main, rejected, removed"),
    ("ReturnsNoRejected", True, "returned dict: it must return the outputs main, rejected, removed"),
])
def test_a_global_steps_composite_built_or_returning_otherwise_than_the_contract_says_is_one_line(
        tmp_path, monkeypatch, transform, reads, message):
    """A step that ``reads_files`` gets ``Class(step, read, run)`` and must return ``main``,
    ``rejected`` and ``removed``; any other global step ``Class(step, run)``, returning ``main`` and
    ``removed``. A composite built or returning otherwise was a TypeError traceback from the graph;
    now one line naming the step's class."""
    import apache_beam as beam

    from pipeline.config import load_config
    from pipeline.graph import build_pipeline
    from pipeline.steps.base import RunInfo
    from pipeline.steps.lid import LanguageIdentifier, LidConfig
    from pipeline.util.errors import UserError

    (tmp_path / "globalsteps.py").write_text(GLOBAL_STEPS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import globalsteps

    cfg = load_config(None, {"input": ["x.wet.gz"], "output": str(tmp_path / "out")}, ["steps=[lid]"])
    steps = [globalsteps.step(transform, reads)(globalsteps.Cfg(), RunInfo())]
    steps = steps + [LanguageIdentifier(LidConfig(), RunInfo())] if reads else [LanguageIdentifier(LidConfig(), RunInfo()), *steps]
    if message is None:
        build_pipeline(beam.Pipeline(), cfg, ["x.wet.gz"], steps)
        return
    with pytest.raises(UserError) as error:
        build_pipeline(beam.Pipeline(), cfg, ["x.wet.gz"], steps)
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


@pytest.mark.parametrize("sets, message", [
    (["lid.thresholds.eng=0.3"], "lid.thresholds: 'eng' is not a language that step lid gives (what is given for "
                                 "it would never apply); did you mean 'en'?"),
    (["steps=[dedup, lid, gopher_quality, perplexity]", "gopher_quality.languages.zh_Hans.max_avg_word_length=5"],
     "gopher_quality.languages: 'zh_Hans' is not a language that step lid gives"),
    (["perplexity.languages=[de, deu]"], "perplexity.languages: 'deu' is not a language that step lid gives"),
    (["perplexity.languages=[]"], "perplexity.models: 'deu' is not a language that step lid gives"),
    (["lid.thresholds.unknown=0.3"], "lid.thresholds: 'unknown' is not a language that step lid gives"),
    (["lid.below_threshold=unknown", "lid.thresholds.unknown=0.3"], None),  # then LID does give it
    (["steps=[dedup, lid, fineweb_quality, perplexity]", "fineweb_quality.languages.no.line_punct_thr=0.1"], None),
])
def test_a_language_the_lid_model_never_gives_is_one_line(sample_lms, tmp_path, sets, message):
    """A per-language value, language list or language model named by a code LID's model never
    gives (not among lid.176's labels) would silently never apply: after the steps are prepared,
    one error line names the key."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.config import load_config
    from pipeline.graph import build_steps
    from pipeline.run import prepare_steps
    from pipeline.util.errors import UserError

    for name in ("de.sp.model", "de.arpa.bin"):  # German's models, also under an ISO 639-3 code
        for lang in ("de", "deu"):
            (tmp_path / name.replace("de", lang, 1)).symlink_to(sample_lms / name)
    cfg = load_config(str(ROOT / "configs/corpus/sample.yaml"), {"output": "/tmp/x"},
                      [f"perplexity.models={tmp_path}", "perplexity.languages=[de]", *sets])
    steps = build_steps(cfg, 1)
    if message is None:
        prepare_steps(steps, PipelineOptions([]))
        labels = next(step for step in steps if step.name == "lid").lang_labels()
        assert len(labels - {"unknown"}) == 176 and {"en", "de", "no"} <= labels
        return
    with pytest.raises(UserError) as error:
        prepare_steps(steps, PipelineOptions([]))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_near_dedup_before_lid_compares_across_languages():
    from pipeline.config import load_config

    cfg = load_config(str(ROOT / "configs/corpus/sample.yaml"), {"output": "/tmp/x"},
                      ["steps=[dedup, near_dedup, lid]", "near_dedup.scope=global"])
    assert [c.name for c in cfg.step_classes()] == ["dedup", "near_dedup", "lid"]


def test_every_built_in_step_declares_the_contract():
    from pipeline.steps import registry
    from pipeline.steps.base import Step

    steps = registry()
    assert {"dedup", "lid", "near_dedup", "perplexity"} <= set(steps)
    for name, cls in steps.items():
        assert cls.name == name and cls.counters and cls.Config() is not None
        assert (cls.transform is None) == (cls.__call__ is not Step.__call__), name  # global steps run as a composite
        for module in cls.worker_modules:  # the fork server skips a module it cannot import, silently
            assert importlib.util.find_spec(module) is not None, f"{name}: worker module {module!r} is not installed"


def test_a_step_takes_each_chunk_in_its_order_key_and_the_results_do_not_change():
    """ApplyStep sorts each chunk by the step's ``order_key`` (stable): LID sees real lines of 11
    languages grouped by script, and keeps the same documents with the same counts as in input order."""
    import apache_beam as beam

    from pipeline.steps.base import RunInfo
    from pipeline.steps.lid import LanguageIdentifier, LidConfig, script_block
    from pipeline.transforms.apply import ApplyStep

    lines = [line for path in sorted((ROOT / "tests/data/sample/ref").glob("*.txt"))
             for line in path.read_text(encoding="utf-8").splitlines()[:20] if len(line) > 40]
    docs = [{"id": str(i), "text": text} for i, text in enumerate(lines[::2] + lines[1::2])]  # scripts mixed

    class Seen(LanguageIdentifier):
        def apply_chunk(self, chunk):
            self.seen.extend(doc["id"] for doc in chunk)
            return super().apply_chunk(chunk)

    def apply(order) -> tuple[list, list, list[str]]:
        step = Seen(LidConfig(), RunInfo())
        step.order_key, step.seen, step.chunk_docs = order, [], 64
        fn = ApplyStep(step)
        fn.declared = True
        fn.setup()
        fn.start_bundle()
        out = [o for doc in docs for o in fn.process(doc)]
        finished = list(fn.finish_bundle())
        out += [w.value for w in finished if not isinstance(w, beam.pvalue.TaggedOutput)]
        [counts] = [w.value.value for w in finished if isinstance(w, beam.pvalue.TaggedOutput)]
        return sorted(out, key=lambda d: int(d["id"])), counts, step.seen

    ordered, ordered_counts, seen = apply(script_block)
    plain, plain_counts, seen_plain = apply(None)
    assert seen_plain == [d["id"] for d in docs] != seen
    for start in range(0, len(docs), 64):
        blocks = [script_block(docs[int(i)]) for i in seen[start:start + 64]]
        assert blocks == sorted(blocks)
    assert len({script_block(d) for d in docs}) >= 5
    assert ordered == plain and len(plain) > 100
    assert ordered_counts == plain_counts and dict(plain_counts)[("lid", "documents_out")] == len(plain)


BROKEN_STEPS = '''
"""Steps that break the contract, each in its own way."""
import dataclasses

from pipeline.steps.base import Drop, Step


@dataclasses.dataclass
class NoConfig:
    pass


class RaisesOnOne(Step):
    name = "raises_on_one"
    Config = NoConfig

    def __call__(self, doc):
        if doc["id"] == TARGET:
            raise ValueError("cannot handle this page")
        return doc


class GivesNone(Step):
    name = "gives_none"
    Config = NoConfig

    def __call__(self, doc):
        return None


class GivesOneTooFew(Step):
    name = "gives_one_too_few"
    Config = NoConfig

    def apply_chunk(self, docs):
        return docs[:-1]


class DropsUndeclared(Step):
    name = "drops_undeclared"
    Config = NoConfig

    def __call__(self, doc):
        return Drop("whatever")


@dataclasses.dataclass
class Where:
    where: str = "setup"


class RaisesIn(Step):
    """Raises in its __init__, prepare or setup, as its config says."""
    name = "raises_in"
    Config = Where

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.fail("__init__")

    def fail(self, where):
        if self.cfg.where == where:
            raise RuntimeError(f"no model here ({where})")

    def prepare(self):
        self.fail("prepare")

    def setup(self):
        self.fail("setup")


class GivesAGenerator(Step):
    """Not broken: one result per document, as a generator."""
    name = "gives_a_generator"
    Config = NoConfig

    def apply_chunk(self, docs):
        return (doc for doc in docs)


class NamedLikeLid(Step):
    name = "lid"
    Config = NoConfig


class NamedLikeTheWriter(Step):
    name = "write"
    Config = NoConfig


class Unnamed(Step):
    Config = NoConfig
'''


def test_the_runs_own_names_cover_its_graph_and_counters():
    """``RUN_NAMES`` (no plugin step may take one) holds every top-level label of the graph that is
    not a step's, in a step's snake_case, and the counter groups that are not a step's."""
    import apache_beam as beam

    import re

    from pipeline.config import RUN_LABELS, RUN_NAMES, _check_steps, load_config
    from pipeline.graph import build_pipeline, build_steps
    from pipeline.report.stats import IO_STEP
    from pipeline.steps.base import Step, graph_label
    from pipeline.steps.lid import LanguageIdentifier
    from pipeline.steps.near_dedup import CLUSTER_SIZES
    from pipeline.util.errors import UserError

    wet = str(sorted((ROOT / "tests/data/sample/wet").glob("*.warc.wet.gz"))[0])
    cfg = load_config(None, {"input": [wet], "output": "unused"}, ["steps=[dedup, lid, near_dedup]"])
    p = beam.Pipeline()
    build_pipeline(p, cfg, [wet], build_steps(cfg, 1))
    labels = {part.full_label for part in p.transforms_stack[0].parts if "/" not in part.full_label}
    assert labels - {graph_label(name) for name in cfg.steps} <= RUN_LABELS and {"Files", "AsTables"} <= labels
    assert {IO_STEP, CLUSTER_SIZES} <= RUN_NAMES
    for name, message in (("AS_TABLES", "has a name of the run's own"),  # Beam: a duplicate label, a traceback
                          ("LID", "'LID' is named twice ('lid' has its graph label, 'Lid')")):
        plugin = type("Plugin", (Step,), {"name": name, "Config": LanguageIdentifier.Config})
        with pytest.raises(UserError, match=re.escape(message)):
            _check_steps([LanguageIdentifier, plugin], {"lid": LanguageIdentifier.Config(), name: LanguageIdentifier.Config()}, "x")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_step_that_breaks_on_a_document_ends_the_run_in_one_line_naming_both(tmp_path, workers):
    """A step that raises on one document, gives what is not a document or a Drop, gives fewer
    results than documents, or drops for an undeclared reason: one line naming the step and the
    document (a 170-line traceback in the writer, a bare zip() error, or a silent count, before),
    in the driver's process and from worker processes; the output keeps what it held. So is a
    step whose setup, __init__ or prepare raises, or that takes a built-in's name or sets none."""
    from pipeline.readers.files import read_file
    from pipeline.config import ReadConfig

    wet = sorted((ROOT / "tests/data/sample/wet").glob("*.warc.wet.gz"))[0]
    target = [d["id"] for d in read_file(str(wet), ReadConfig()) if isinstance(d, dict)][100]
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "broken.py").write_text(BROKEN_STEPS.replace("TARGET", repr(target)), encoding="utf-8")
    (tmp_path / "profile.yaml").write_text(
        f"input: [{wet}]\nbeam_options: {'[]' if workers == 1 else '[--direct_num_workers=2, --direct_running_mode=multi_processing]'}\n",
        encoding="utf-8")
    cases = {"RaisesOnOne": f"step raises_on_one failed on document {target} of {wet}: ValueError: cannot handle this page",
             "GivesNone": "step gives_none gave None for document <urn:uuid:",
             "GivesOneTooFew": "step gives_one_too_few gave 255 results for 256 documents",
             "DropsUndeclared": "for 'whatever', which it does not declare in `counters`",
             "RaisesIn": "step raises_in: setup() failed on a worker: RuntimeError: no model here (setup)"}
    if workers == 1:  # the driver's side
        cases |= {"RaisesIn where=__init__": "step raises_in: building it failed: RuntimeError: no model here (__init__)",
                  "RaisesIn where=prepare": "step raises_in: prepare() failed: RuntimeError: no model here (prepare)",
                  "NamedLikeLid": "its name 'lid' is a built-in step's; give it a name of its own",
                  "Unnamed": "has a Step subclass 'Unnamed' that sets no `name`",
                  "NamedLikeTheWriter": "step 'write' (broken.NamedLikeTheWriter) has a name of the run's own"}
    assert run(tmp_path, "ok", "--set", "steps=[dedup, lid, 'broken:GivesAGenerator']").returncode == 0
    for case, message in cases.items():
        cls, _, where = case.partition(" where=")
        done = run(tmp_path, "out", "--set", f"steps=[dedup, lid, 'broken:{cls}']",
                   *(["--set", f"raises_in.where={where}"] if where else []))
        assert done.returncode == 2 and done.stderr.startswith("error: ") and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    os.environ["POLYGLOT_DEBUG"] = "1"  # what raised it, in the step's own code
    try:
        done = run(tmp_path, "out", "--set", "steps=[dedup, lid, 'broken:RaisesOnOne']")
    finally:
        del os.environ["POLYGLOT_DEBUG"]
    assert done.stderr.strip().splitlines()[-1].startswith("error: step raises_on_one failed on document")
    assert 'raise ValueError("cannot handle this page")' in done.stderr
