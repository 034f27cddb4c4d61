"""The command line: --help documents every option; user mistakes give one line, exit 2, no traceback."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pipeline.config import describe_corpus_config
from pipeline.util.errors import UserError

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_scratch_spare_that_is_no_size_is_one_line(tmp_path):
    """POLYGLOT_SCRATCH_SPARE is read in the workers too: a value that is no size ends the run before
    any work, in one line."""
    run = subprocess.run([sys.executable, "-m", "pipeline", "run", "--no-progress", "--config", "configs/corpus/sample.yaml",
                          "--input", "tests/data/sample/wet/sample-00000.warc.wet.gz", "--output", str(tmp_path / "out"),
                          "--set", "beam_options=[]", "--set", "steps=[dedup, lid]"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "POLYGLOT_SCRATCH_SPARE": "5GB"})
    assert run.returncode == 2 and run.stderr == ("error: POLYGLOT_SCRATCH_SPARE='5GB': a size in bytes, or with K, M, "
                                                  "G or T (e.g. 0, 512M, 20G)\n"), run.stderr
    assert not (tmp_path / "out").exists()


def test_help_documents_every_option():
    out = cli("run", "--help").stdout
    for flag in ("--config", "--input", "--output", "--runner", "--set", "--overwrite", "--no-progress"):
        assert flag in out
    for line in describe_corpus_config():
        key = line.split()[0]
        assert f"  {key} (default" in out, key


def test_config_keys_are_described_only_for_help(monkeypatch, capsys):
    """Describing the keys reads the config classes' sources (0.1-0.3 s); a run does not wait for it."""
    import pipeline.__main__ as cli_module

    calls = []
    monkeypatch.setattr(cli_module, "describe_corpus_config", lambda: calls.append(1) or ["  dedup.policy (default x)"])
    args, _ = cli_module.build_parser("run").parse_known_args(["run", "--config", "c.yaml"])
    assert args.config == "c.yaml" and not calls
    with pytest.raises(SystemExit):
        cli_module.main(["run", "--help"])
    assert calls == [1] and "  dedup.policy (default x)" in capsys.readouterr().out


def test_only_the_store_commands_import_beam_for_their_options():
    """Beam's S3 options import Beam (seconds): the top-level help and the commands that read no
    store go without, and a store command's parser takes them. Reading a config imports no pyarrow
    either (a third of a second before ``pipeline run`` can start its fork server)."""
    code = ("import sys; from pipeline.__main__ import build_parser\n"
            "for command in (None, 'train-lm', 'run'):\n"
            "    build_parser(command).parse_known_args(['train-lm', '--out', 'x'])\n"
            "from pipeline.config import load_config\n"
            "load_config('configs/corpus/sample.yaml', {'input': ['x.warc.wet.gz'], 'output': 'out'})\n"
            "print('apache_beam' in sys.modules, 'pyarrow' in sys.modules)\n"
            "args, _ = build_parser('report').parse_known_args(['report', 'c', '--s3_endpoint_url', 'http://h'])\n"
            "print(args.s3_endpoint_url)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "False", "http://h"], done.stderr


@pytest.mark.parametrize("args, message", [
    (["--config", "configs/corpus/sample.yaml", "--set", "dedup.polcy=keep_first"], "error: --set dedup.polcy=keep_first: unknown config key 'dedup.polcy'"),
    (["--config", "configs/corpus/sample.yaml", "--set", "lid.threshold=1.5"], "error: --set lid.threshold=1.5: lid.threshold=1.5 is out of range"),
    (["--config", "configs/corpus/sample.yaml", "--set", "dedup.policy=keep_last"], "error: --set dedup.policy=keep_last: dedup.policy must be one of"),
    (["--config", "configs/corpus/nope.yaml"], "config configs/corpus/nope.yaml: no such file"),
    (["--input", "/nonexistent/*.warc.wet.gz", "--output", "/tmp/x"], "matches no file"),
    (["--config", "configs/corpus/sample.yaml", "--direct_num_wrkers=2"], "unknown option or argument '--direct_num_wrkers=2'"),
    (["--config", "configs/corpus/sample.yaml", "--set", "lid.model=/nonexistent/lid.bin", "--output", "/tmp/polyglot-cli-test"],
     "lid.model /nonexistent/lid.bin: no such file"),
    (["--config", "configs/corpus/sample.yaml", "--runner", "DirectRunnr", "--output", "/tmp/polyglot-cli-test"],
     "Unexpected pipeline runner: DirectRunnr"),
    (["--config", "configs/corpus/sample.yaml", "--set", "lid.model=configs/corpus/sample.yaml"], "not a fastText model"),
])
def test_user_mistakes_are_one_line(args, message):
    result = cli("run", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("error:")]) == 1


@pytest.mark.parametrize("command, message", [
    ([sys.executable, "-m", "pipeline", "run", "--config"],
     "error: python -m pipeline run: argument --config: expected one argument "
     "(`python -m pipeline run --help` lists the options)"),
    ([sys.executable, "-m", "pipeline"], "error: python -m pipeline: the following arguments are required: command"),
    ([sys.executable, "-m", "pipeline", "train-lm", "--seed", "x"],
     "error: python -m pipeline train-lm: argument --seed: invalid int value: 'x'"),
    ([sys.executable, "-m", "pretrain", "tokenizer", "--alpha", "abc"],
     "error: python -m pretrain tokenizer: argument --alpha: invalid float value: 'abc'"),
    ([sys.executable, "-m", "xeval", "xnli", "--seeds", "a,b"], "error: python -m xeval xnli: argument --seeds:"),
])
def test_a_wrong_option_is_one_line_not_the_usage(command, message):
    """argparse printed its usage block (5-18 lines) above its error line."""
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


STALL_STEP = '''
import dataclasses
import sys
import time

from pipeline.steps.base import Step


class Stall(Step):
    """Says it runs, then waits: a run to stop with Ctrl-C."""
    name = "stall"
    Config = dataclasses.make_dataclass("StallConfig", [("seconds", float, 120.0)])
    counters = ()

    def __call__(self, doc):
        print("stalled", file=sys.stderr, flush=True)
        time.sleep(self.cfg.seconds)
        return doc
'''


@pytest.mark.parametrize("options", ["[]", "[--direct_num_workers=1, --direct_running_mode=multi_processing]",
                                     "[--direct_num_workers=2, --direct_running_mode=multi_processing]"])
def test_ctrl_c_is_one_line(sample, tmp_path, options):
    """Ctrl-C (SIGINT to the terminal's process group) printed a traceback from the driver and from
    every SDK worker (and from the fork server, still importing), or, in the driver's own worker
    (``[]``: in_memory), Beam's "RuntimeError: KeyboardInterrupt [while running ...]": 30-140 lines.
    Now one line, status 130, and the previous corpus untouched."""
    import os
    import signal

    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "stall.py").write_text(STALL_STEP, encoding="utf-8")
    wet = str(sorted((sample / "wet").glob("*.warc.wet.gz"))[0])
    out = tmp_path / "out"
    common = [sys.executable, "-m", "pipeline", "run", "--no-progress", "--input", wet, "--output", str(out), "--set",
              f"beam_options={options}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugins"), str(ROOT)])}
    assert subprocess.run([*common, "--set", "steps=[lid]"], cwd=ROOT, env=env, capture_output=True, timeout=300).returncode == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = subprocess.Popen([*common, "--overwrite", "--set", "steps=[lid, 'stall:Stall']"], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (not a shell's background job's)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == "stalled\n"
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]  # every process that holds its stderr gone
        assert proc.returncode == 130, rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rest.startswith("error: interrupted (Ctrl-C); the next run on its output") and rest.count("\n") == 1, rest
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and "_staging-" not in str(p)
            and p.name != ".run.lock"} == before


@pytest.mark.parametrize("args, message", [
    (["train-lm", "--lang", "de", "--text", "/nonexistent/ref.txt", "--out", "/tmp/polyglot-lm"],
     "reference text /nonexistent/ref.txt: no such file"),
    (["train-lm", "--lang", "de,fr", "--text", "README.md", "--out", "/tmp/polyglot-lm"], "one per language"),
    (["train-lm", "--out", "/tmp/polyglot-lm"], "needs --lang and --text, or --config"),
    (["train-lm", "--config", "configs/corpus/sample.yaml", "--out", "/tmp/polyglot-lm"], "unknown key"),
    (["train-lm", "--lang", "de,de", "--text", "README.md", "--text", "README.md", "--out", "/tmp/polyglot-lm"],
     "--lang: de given twice"),
    (["train-lm", "--lang", "de,fr", "--text", "README.md", "--text", "/nonexistent/fr.txt", "--out", "/tmp/polyglot-lm"],
     "reference text /nonexistent/fr.txt: no such file"),  # before de is trained
    (["train-lm", "--lang", "de", "--text", "README.md", "--seed", "-1", "--out", "/tmp/polyglot-lm"],
     "seed -1: SentencePiece takes 0 to 2^32-1"),
    (["train-lm", "--lang", "de", "--text", "README.md", "--vocab-size", "10000000000", "--out", "/tmp/polyglot-lm"],
     "and below 2^31"),
    (["train-lm", "--config", "configs/lm/sample.yaml", "--lang", "de", "--text", "README.md", "--out", "/tmp/polyglot-lm"],
     "by --config or by --lang and --text, not both"),
    (["cutoffs", "--corpus", "/nonexistent/corpus", "--out", "/tmp/polyglot-cutoff.csv"], "no shards"),
    (["run", "--config", "configs/corpus/sample.yaml", "--set", "perplexity.models=/nonexistent/lm"],
     "perplexity.models /nonexistent/lm: no such directory"),
    (["run", "--config", "configs/corpus/sample.yaml", "--set", "perplexity.head=70"], "perplexity: head (70) must not exceed tail"),
])
def test_lm_commands_user_mistakes(args, message):
    result = cli(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_train_lm_reads_every_text_before_it_trains(tmp_path):
    """A later language's text empty or not UTF-8 past its first line: de was trained (minutes, with
    the 11-language config; its models replaced under --overwrite) before fr's text failed."""
    empty, latin1 = tmp_path / "empty.txt", tmp_path / "latin1.txt"
    empty.write_text("\n \n")
    latin1.write_bytes("bonjour\nça va\n".encode("latin-1"))
    for text, message in ((empty, f"error: fr: the reference text has no non-empty line ({empty})"),
                          (latin1, f"error: reference text {latin1}: line 2 is not UTF-8 (byte 0)")):
        done = cli("train-lm", "--lang", "de,fr", "--text", "README.md", "--text", str(text), "--out", str(tmp_path / "lm"))
        assert done.returncode == 2 and done.stderr == message + "\n", done.stderr
        assert not (tmp_path / "lm").exists()


def test_an_input_that_is_a_pipe_is_one_line(tmp_path):
    """A named pipe given as input (here one nothing writes into) blocked the run for ever, silent;
    a run may read an input twice, which a pipe cannot give."""
    import os

    os.mkfifo(tmp_path / "in.warc.wet.gz")
    done = cli("run", "--input", str(tmp_path / "*.gz"), "--output", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stderr == (
        f"error: input {tmp_path / 'in.warc.wet.gz'}: a named pipe, not a file: a run may read an input more than once "
        "(exact dedup's two passes, a retried bundle); write it to a file and give that\n"), done.stderr
    assert not (tmp_path / "out").exists()


def test_a_symbolic_link_loop_is_one_line(tmp_path):
    """A path that is a loop of symbolic links (or too long a name): the OSError's traceback, where a
    folder or a file of the wrong kind was one line."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for tool, args in (("pipeline", ["run", "--config"]), ("pretrain", ["train", "--config"]),
                       ("xeval", ["report", "--out", str(tmp_path / "r")])):
        done = subprocess.run([sys.executable, "-m", tool, *args, str(tmp_path / "a")], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.endswith(f"{tmp_path / 'a'}: Too many levels of symbolic links\n"), \
            done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    done = cli("run", "--config", "x" * 300 + ".yaml")
    assert done.returncode == 2 and done.stderr == f"error: {'x' * 300}.yaml: File name too long\n", done.stderr


def test_paths_of_the_wrong_kind_are_one_line_and_lose_nothing(tmp_path):
    """A folder where a file is written, a file where a folder is needed, a folder of other files:
    one line, exit 2, and what was there is still there."""
    from pipeline.output import fs
    from pipeline.util.errors import UserError, one_line

    assert one_line(NotADirectoryError(20, "Not a directory", "a/b")) == (
        "error: a/b: Not a directory (a file where a folder is needed)")  # what the commands print for the rest
    folder, afile = tmp_path / "models", tmp_path / "afile"
    folder.mkdir()
    (folder / "de.arpa.bin").write_bytes(b"keep")
    afile.write_bytes(b"keep")
    for path, message in ((f"{folder}/", "a folder; a file name is needed"), (str(folder), "a folder; a file name"),
                          (f"{afile}/sub/c.csv", f"{afile} is a file, not a folder")):
        with pytest.raises(UserError, match=message):
            fs.write_atomic(path, lambda stream: stream.write(b"x"))
    with pytest.raises(UserError, match=f"output {afile}/sub: {afile} is a file"):
        fs.check_folder(f"{afile}/sub", "output")
    with pytest.raises(UserError, match=f"^tokenizer {folder}: a folder, not a file$"):  # said: no such file
        fs.read_json(folder, what="tokenizer")
    with pytest.raises(UserError, match="holds 'de.arpa.bin', not written by this command"):
        fs.check_folder(str(folder), "--out", ("spm.model",))
    fs.check_folder(str(folder), "--out", ("spm.model", "de.arpa.bin"))
    fs.check_folder(str(tmp_path / "new" / "folder"), "--out", ())
    assert sorted(p.name for p in folder.iterdir()) == ["de.arpa.bin"] and afile.read_bytes() == b"keep"
    (tmp_path / "ref.yaml").write_text("vocab_size: lots\nlanguages: {de: ref.txt}\n")
    for args, message in (
            (["run", "--config", "configs/corpus/sample.yaml", "--output", f"{afile}/corpus"], f"{afile} is a file, not a folder"),
            (["run", "--config", "configs/corpus/sample.yaml", "--set", "steps=[dedup]"], "writing the corpus needs 'lang'"),
            (["train-lm", "--lang", "de", "--text", "tests/data/sample/ref/de.txt", "--out", str(afile)],
             f"--out {afile}: {afile} is a file, not a folder"),
            (["train-lm", "--lang", "de", "--text", str(folder), "--out", str(tmp_path / "lm")], "a folder, not a file"),
            (["train-lm", "--lang", "de", "--text", "README.md", "--out", str(tmp_path / "lm"), "--kenlm-bin", str(folder)],
             "no lmplz and build_binary there"),
            (["train-lm", "--config", str(tmp_path / "ref.yaml"), "--out", str(tmp_path / "lm")], "vocab_size must be an integer"),
            (["cutoffs", "--corpus", str(tmp_path), "--out", str(tmp_path / "c.csv"), "--sample", "0"], "--sample 0: must be"),
            (["cutoffs", "--corpus", str(tmp_path), "--out", f"{folder}/"], f"--out {folder}/: a folder; a file name is needed"),
            (["cutoffs", "--corpus", str(tmp_path), "--out", ""], "argument --out: '' names no path")):
        result = cli(*args)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
    assert sorted(p.name for p in folder.iterdir()) == ["de.arpa.bin"] and afile.read_bytes() == b"keep"
    assert not (tmp_path / "lm").exists()  # a train-lm that failed left no folder


def test_train_lm_help_documents_every_option():
    out = cli("train-lm", "--help").stdout
    for flag in ("--lang", "--text", "--config", "--out", "--vocab-size", "--order", "--memory", "--seed", "--threads",
                 "--kenlm-bin", "--overwrite"):
        assert flag in out


def test_train_lm_options_win_over_its_config(tmp_path):
    """An option given on the command line wins over the config file, even where it is the default;
    the config file over the defaults, whose SentencePiece threads are 1 (the same models anywhere)."""
    from pipeline.__main__ import LM_DEFAULTS, build_parser, check_lm_options, lm_plan

    (tmp_path / "ref.txt").write_text("Guten Tag\n")
    (tmp_path / "lm.yaml").write_text("order: 3\nseed: 7\nlanguages: {de: ref.txt}\n")
    args, _ = build_parser("train-lm").parse_known_args(
        ["train-lm", "--config", str(tmp_path / "lm.yaml"), "--out", "x", "--order", "5"])
    assert lm_plan(args) == {"de": [str(tmp_path / "ref.txt")]}
    check_lm_options(args)
    assert (args.order, args.seed, args.vocab_size, args.threads) == (5, 7, LM_DEFAULTS["vocab_size"], 1)
    (tmp_path / "lm.yaml").write_text("seed: -5\nlanguages: {de: ref.txt}\n")
    args, _ = build_parser("train-lm").parse_known_args(["train-lm", "--config", str(tmp_path / "lm.yaml"), "--out", "x"])
    lm_plan(args)
    with pytest.raises(UserError, match="seed -5: SentencePiece takes 0 to 2"):  # a config's value is checked too
        check_lm_options(args)


@pytest.mark.parametrize("command", [["run"], ["train-lm", "--out", "/tmp/polyglot-lm"]])
def test_malformed_yaml_config_is_one_line(command, tmp_path):
    (tmp_path / "bad.yaml").write_text("input: [a\n  b: :\n")
    result = cli(*command, "--config", str(tmp_path / "bad.yaml"))
    assert result.returncode == 2 and "not valid YAML" in result.stderr and "Traceback" not in result.stderr


def test_float_written_without_a_dot_is_a_number(tmp_path):
    """PyYAML reads ``1e-4`` as a string (YAML 1.1); float keys accept it, a non-number stays an error."""
    from pipeline.util.configfile import build_dataclass, merged_config_data
    from pipeline.config import SamplingConfig
    from pipeline.util.errors import UserError

    cfg = build_dataclass(SamplingConfig, *merged_config_data(None, sets=["alpha=3e-1"]))
    assert cfg.alpha == 0.3
    with pytest.raises(UserError, match="^--set alpha=x: alpha: expected a number, got 'x'"):
        build_dataclass(SamplingConfig, *merged_config_data(None, sets=["alpha=x"]))


def test_a_mistake_names_where_the_value_was_written(tmp_path):
    """A bad value given by ``--set`` is reported as that ``--set``; one from the file names the file,
    even when ``--set`` changed other keys; a check across keys names both."""
    from pipeline.config import load_config
    from pipeline.util.errors import UserError
    from pretrain.models.config import load_model_config

    config = tmp_path / "c.yaml"
    config.write_text("input: x.wet.gz\noutput: out\nsteps: [dedup, lid]\ndedup: {policy: keep_last}\n")
    with pytest.raises(UserError, match=f"^{re.escape(str(config))}: dedup.policy must be one of"):
        load_config(str(config), sets=["lid.threshold=0.3"])
    with pytest.raises(UserError, match="^--set dedup=first: dedup must be a mapping"):
        load_config(str(config), sets=["dedup=first"])
    with pytest.raises(UserError, match="^--set steps=\\[lid, lid\\]: steps: 'lid' is named twice"):
        load_config(str(config), sets=["dedup.policy=keep_first", "steps=[lid, lid]"])
    with pytest.raises(UserError, match=r"^--set hidden_size=31 and \S+xlmr-tiny.yaml: hidden_size \(31\) must be a multiple"):
        load_model_config("xlmr-tiny", sets=["hidden_size=31"])
    # what set a key last is named: a later --set of its section, or a command-line option
    with pytest.raises(UserError, match=r"^--set lid=\{threshold: 7\}: lid.threshold=7.0 is out of range"):
        load_config(str(config), sets=["dedup.policy=keep_first", "lid.threshold=0.5", "lid={threshold: 7}"])
    with pytest.raises(UserError, match="^command line: steps: 'lid' is named twice"):
        load_config(str(config), {"steps": ["lid", "lid"]}, sets=["dedup.policy=keep_first"])
    # a key given by both (--output and --set output=): the option won, which the README said --set would
    with pytest.raises(UserError, match=r"^output: set by --set output=b and by its command-line option; give one"):
        load_config(str(config), {"output": "a"}, sets=["output=b"])
    with pytest.raises(UserError, match=r"^\S+xlmr-tiny.yaml and --set num_attention_heads=3: hidden_size"):
        load_model_config("xlmr-tiny", sets=["num_attention_heads=3", "pad_token_id=1"])
    # a step section's own check names the file that wrote the section and the --set under it, not
    # a --set of another key
    config.write_text("input: x.wet.gz\noutput: out\nsteps: [dedup, lid]\nlid: {thresholds: {de: 2}}\n")
    with pytest.raises(UserError, match=f"^{re.escape(str(config))}: lid: thresholds.de=2"):
        load_config(str(config), sets=["beam_options=[]"])
    with pytest.raises(UserError, match=f"^--set lid.model=m.bin and {re.escape(str(config))}: lid: thresholds.de=2"):
        load_config(str(config), sets=["lid.model=m.bin"])
    with pytest.raises(UserError, match=r"^--set lid=\{thresholds: \{de: 3\}\}: lid: thresholds.de=3"):
        load_config(str(config), sets=["lid={thresholds: {de: 3}}"])
    from xeval.xnli import load_config as load_xnli_config  # xeval's: options that clash name the command line

    xnli = tmp_path / "xnli.yaml"
    xnli.write_text("languages: [en, fr, de]\nselection_languages: [en]\n")
    with pytest.raises(UserError, match=r"^command line: selection_languages \['en'\] must be among languages \(fr\)"):
        load_xnli_config(str(xnli), {"selection_languages": ["en"], "languages": ["fr"]}, [])
    with pytest.raises(UserError, match=f"^{re.escape(str(xnli))} and command line: selection_languages"):
        load_xnli_config(str(xnli), {"languages": ["fr"]}, [])
    # the run config's checks that need the world size: global_batch_size given by --set, the batch in the file
    from pretrain.trainer import batch_layout, run_config_and_source

    run = tmp_path / "run.yaml"
    run.write_text("tokens: t\ntokenizer: k\noutput: o\nloader: {batch_size: 8}\n")
    cfg, source = run_config_and_source(str(run), ["global_batch_size=12"])
    with pytest.raises(UserError, match=f"^--set global_batch_size=12 and {re.escape(str(run))}: global_batch_size 12 "):
        batch_layout(cfg, 1, source)


def test_values_no_range_check_could_see_and_yaml_that_reads_wrong_are_one_line(tmp_path):
    """A NaN passed every range check (`x < low` is false), an infinite shard size crashed the
    writer; the quality filters' thresholds had no ranges, per language neither; YAML 1.1 read the
    key ``no`` (Norwegian) as false, let a key given twice win silently, and took ``1:`` as a key."""
    from pipeline.config import load_config
    from pipeline.util.errors import UserError

    config = tmp_path / "c.yaml"
    config.write_text("input: x.wet.gz\noutput: out\nsteps: [dedup, lid, gopher_repetition, fineweb_quality]\n")
    for sets, message in [
        (["lid.threshold=.nan"], "lid.threshold: expected a finite number, got nan"),
        (["write.shard_size_mb=.inf"], "write.shard_size_mb: expected a finite number, got inf"),
        (["lid.thresholds={de: .nan}"], "lid.thresholds.de: expected a finite number, got nan"),
        (["gopher_repetition.dup_line_frac=-1"], "gopher_repetition.dup_line_frac=-1.0 is out of range [0.0, 1.0]"),
        (["fineweb_quality.line_punct_thr=7"], "fineweb_quality.line_punct_thr=7.0 is out of range [0.0, 1.0]"),
        (["gopher_repetition.languages.fr.dup_para_frac=2"],
         "gopher_repetition: languages.fr: dup_para_frac=2.0 is out of range [0.0, 1.0]"),
        (["gopher_repetition.top_n_grams=[[2, 3]]"], "and 0 <= fraction <= 1, got [2.0, 3.0]"),
        (["gopher_repetition.languages.fr.languages.de.dup_line_frac=0.1"],
         "languages.fr.languages: per-language values do not nest"),
        (["write.removed=no"], "write.removed: expected bool, got 'no'"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)):
            load_config(str(config), sets=sets)
    with pytest.raises(UserError, match=re.escape("--set near_dedup.bogus.x=1: unknown config key 'near_dedup.bogus'")):
        load_config(str(config), sets=["near_dedup.bogus.x=1"])  # (was blamed on the file)
    config.write_text("input: x.wet.gz\noutput: out\nsteps: [dedup, lid]\nlid:\nread:\n")  # sections left empty: defaults
    assert load_config(str(config), sets=["lid.threshold=0.3"]).sections["lid"].threshold == 0.3
    config.write_text("input: x.wet.gz\noutput: out\nsteps: [dedup, lid, gopher_repetition, fineweb_quality]\n")
    config.write_text("input: x.wet.gz\noutput: out\nsteps: [dedup, lid, gopher_quality]\ngopher_quality:\n  languages:\n"
                      "    de: &g {max_doc_words: 5000, min_doc_words: 10}\n    nl: {<<: *g, max_doc_words: 1000}\n")
    merged = load_config(str(config)).sections["gopher_quality"].for_language("nl")  # YAML merge keys, overridden
    assert (merged.max_doc_words, merged.min_doc_words) == (1000, 10)
    config.write_text("input: x.wet.gz\noutput: out\nsteps: [dedup, lid, gopher_repetition, fineweb_quality]\n")
    norwegian = load_config(str(config), sets=["lid.thresholds={no: 0.9}", "gopher_repetition.languages={no: {dup_line_frac: 0.2}}"])
    assert norwegian.sections["lid"].thresholds == {"no": 0.9}
    assert norwegian.sections["gopher_repetition"].for_language("no").dup_line_frac == 0.2
    for text, message in [
        ("lid:\n  threshold: 0.5\n  threshold: 0.7\n", "the key 'threshold' is given twice (line 5, column 3)"),
        ("1: foo\n", "the key 1 is not a name"),
        ("lid: {thresholds: {2: 0.5}}\n", "the key 2 under lid.thresholds is not a name"),
        ("steps: [dedup, lid\nlid: {}\n", "expected ',' or ']', but got ':' (line 4, column 4)"),
        ("? [a]\n: 1\n", "the key ['a'] is not a name"),
        ("a: &x [*x]\n", "a holds itself"),
    ]:
        config.write_text("input: x.wet.gz\noutput: out\n" + text)
        with pytest.raises(UserError, match=f"^config {re.escape(str(config))}: not valid YAML: .*{re.escape(message)}"):
            load_config(str(config))


def test_sampled_buckets_need_a_step_that_sets_them(tmp_path):
    """``sampling.buckets: [head, middle]`` with no perplexity cutoffs (every document in bucket all)
    gave a sampling.json that weighed no language, silently; now one line when the config loads."""
    from pipeline.config import load_config
    from pipeline.util.errors import UserError

    base = {"input": ["x.wet.gz"], "output": "out"}
    with pytest.raises(UserError, match=re.escape("sampling.buckets ['head', 'middle']: no step here sorts documents "
                                                  "into head, middle and tail")):
        load_config(None, base, ["sampling.buckets=[head, middle]"])
    with pytest.raises(UserError, match="so every document is in bucket all"):  # models but no cutoffs: all
        load_config(None, base, ["steps=[dedup, lid, perplexity]", "perplexity.models=lm", "sampling.buckets=[head]"])
    assert load_config(None, base, ["sampling.buckets=[head, all]"]).sampling.buckets == ["head", "all"]
    cutoffs = tmp_path / "cutoff.csv"
    cutoffs.write_text(",de\n" + "".join(f"{p},{p + 1}\n" for p in range(100)))
    assert load_config(None, base, ["steps=[dedup, lid, perplexity]", "perplexity.models=lm",
                                    f"perplexity.cutoffs={cutoffs}", "sampling.buckets=[head]"]).sampling.buckets == ["head"]


def test_train_lm_and_report_mistakes_are_one_line_and_lose_nothing(tmp_path):
    """What ``train-lm`` passed on unchecked (a language code that is a path or has a space, an order
    KenLM is not built for, lmplz's memory syntax, a config's languages that are not lists of files)
    gave a traceback, a C++ message naming a deleted temporary file, or models the perplexity step
    never finds; a report written over a folder of the user's own replaced their files."""
    (tmp_path / "de.txt").write_text("Ein Satz.\n", encoding="utf-8")
    configs = {"empty": "languages:\n  de:\n", "number": "languages: {de: 5}\n", "none": "vocab_size: 1000\n",
               "path": "languages: {de/x: de.txt}\n", "mapping": "languages: {de: [{a: b}]}\n"}
    for name, text in configs.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "report.md").write_text("mine")
    (notes / "todo.txt").write_text("mine")
    lm = ["train-lm", "--text", str(tmp_path / "de.txt"), "--out", str(tmp_path / "lm")]
    for args, message in (
            ([*lm, "--lang", "de/x"], "--lang: 'de/x' is not a language code (letters, digits, _ and -"),
            ([*lm, "--lang", "de fr"], "--lang: 'de fr' is not a language code"),
            ([*lm, "--lang", "de", "--order", "7"], "order 7: KenLM here takes 2 to 6"),
            ([*lm, "--lang", "de", "--order", "1"], "order 1: KenLM here takes 2 to 6"),
            ([*lm, "--lang", "de", "--memory", "lots"], "memory 'lots': a number and a unit as lmplz -S takes it"),
            ([*lm, "--lang", "de", "--vocab-size", "100"], "vocab_size 100: at least"),
            (["train-lm", "--config", str(tmp_path / "empty.yaml"), "--out", str(tmp_path / "lm")],
             "languages.de must be a text file or a list of them, not None"),
            (["train-lm", "--config", str(tmp_path / "number.yaml"), "--out", str(tmp_path / "lm")],
             "languages.de must be a text file or a list of them, not 5"),
            (["train-lm", "--config", str(tmp_path / "mapping.yaml"), "--out", str(tmp_path / "lm")],
             "languages.de must be a text file or a list of them"),
            (["train-lm", "--config", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "lm")],
             "languages must map a language code to text files"),
            (["train-lm", "--config", str(tmp_path / "path.yaml"), "--out", str(tmp_path / "lm")],
             "languages.de/x: 'de/x' is not a language code"),
            (["report", str(tmp_path), "--out", str(notes)], f"--out {notes}: the folder holds 'todo.txt', not written"),
    ):
        result = cli(*args)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
    xeval = subprocess.run([sys.executable, "-m", "xeval", "report", str(tmp_path / "results.json"), "--out", str(notes)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert xeval.returncode == 2 and f"--out {notes}: the folder holds 'todo.txt'" in xeval.stderr, xeval.stderr
    assert not (tmp_path / "lm").exists() and sorted(p.name for p in notes.iterdir()) == ["report.md", "todo.txt"]
    assert (notes / "report.md").read_text() == "mine"
    half = tmp_path / "half"  # a model of the user's without its pair: a pair trained now replaced it silently
    half.mkdir()
    (half / "de.sp.model").write_text("mine")
    (half / "fr.arpa.bin").write_text("mine")
    result = cli("train-lm", "--lang", "de", "--text", str(tmp_path / "de.txt"), "--out", str(half))
    assert result.returncode == 2 and result.stderr == (f"error: --out {half}: de.sp.model without de.arpa.bin there; "
                                                        "--overwrite replaces it with a pair trained now (or move it away)\n")
    result = cli("train-lm", "--lang", "de", "--lang", "fr", "--text", str(tmp_path / "de.txt"), "--text",  # (a second
                 str(tmp_path / "de.txt"), "--out", str(half))  # --lang replaced the first, and fr took both texts)
    assert result.returncode == 2 and result.stderr.startswith(f"error: --out {half}: de.sp.model without de.arpa.bin, "
                                                               "fr.arpa.bin without fr.sp.model there; --overwrite replaces them")
    assert sorted(p.name for p in half.iterdir()) == ["de.sp.model", "fr.arpa.bin"]
    assert {p.read_text() for p in half.iterdir()} == {"mine"}


def test_a_runner_beam_cannot_make_and_yaml_past_what_pyyaml_says_are_one_line(tmp_path):
    """A dotted runner name Beam cannot import or build ended in a traceback; ``directrunner`` (Beam
    reads runner names in any case) ran without this package's FnApiRunner set-up; a control
    character or deep nesting in YAML gave two lines or a traceback."""
    from pipeline.config import canonical_runner, load_config
    from pipeline.util.configfile import load_yaml
    from pipeline.util.errors import UserError
    import yaml

    assert [canonical_runner(name) for name in ("directrunner", "Direct", " DASKRUNNER", "dask", "PrismRunner",
                                                 "my.mod.Runner")] == [
        "DirectRunner", "DirectRunner", "DaskRunner", "DaskRunner", "PrismRunner", "my.mod.Runner"]
    config = tmp_path / "c.yaml"
    config.write_text("input: x.wet.gz\noutput: out\nsteps: [lid]\n")
    assert load_config(str(config), sets=["runner=directrunner"]).runner == "DirectRunner"
    for text, message in (("a: 1\nb: \x07\n", "special characters are not allowed: #x0007 (line 2)"),
                          ("a: " + "[" * 2000 + "]" * 2000 + "\n", "nested too deeply")):
        with pytest.raises(yaml.YAMLError, match=re.escape(message)):
            load_yaml(text)
    with pytest.raises(UserError, match=re.escape("--set 'a=\\x01': the value is not valid YAML: special characters")):
        load_config(str(config), sets=["a=\x01"])
    wet = str(sorted((ROOT / "tests" / "data" / "sample" / "wet").glob("*.gz"))[0])
    result = cli("run", "--config", str(config), "--input", wet, "--output", str(tmp_path / "a"), "--set",
                 "runner=nowhere.Runner")
    assert result.returncode == 2 and "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: runner 'nowhere.Runner': Beam cannot make it (ModuleNotFoundError: ")


def test_an_output_of_blanks_is_an_error_not_a_folder_named_by_them(tmp_path):
    """``--output ' '`` ran, writing the corpus into a folder named ' ' in the current one;
    ``--output ''`` said to pass --output, which the user had."""
    from pipeline.config import load_config
    from pipeline.util.errors import UserError

    config = tmp_path / "c.yaml"
    config.write_text("input: x.wet.gz\nsteps: [lid]\n")
    for output, given in (("", "command line"), (" ", "command line")):
        with pytest.raises(UserError, match=re.escape(f"{given}: output {output!r} names no folder")):
            load_config(str(config), overrides={"output": output})
    with pytest.raises(UserError, match=re.escape("--set output='\t': output '\\t' names no folder")):
        load_config(str(config), sets=["output='\t'"])
    blanks = tmp_path / "blanks.yaml"
    blanks.write_text("input: x.wet.gz\noutput: '  '\nsteps: [lid]\n")
    with pytest.raises(UserError, match=re.escape(f"{blanks}: output '  ' names no folder")):
        load_config(str(blanks))
    with pytest.raises(UserError, match=re.escape(f"{config}: no output: set output in the config or pass --output")):
        load_config(str(config))
    wet = str(sorted((ROOT / "tests" / "data" / "sample" / "wet").glob("*.gz"))[0])
    result = subprocess.run([sys.executable, "-m", "pipeline", "run", "--config", str(config), "--input", wet,
                             "--output", " "], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr == "error: command line: output ' ' names no folder\n"
    assert not (tmp_path / " ").exists()


@pytest.mark.parametrize("argv", [
    ["pipeline", "train-lm", "--corpus", "c", "--out", " "], ["pipeline", "cutoffs", "--corpus", "c", "--out", ""],
    ["pipeline", "report", "c", "--out", "  "], ["pretrain", "tokenizer", "--corpus", "c", "--out", " "],
    ["pretrain", "tokenize", "--corpus", "c", "--tokenizer", "t", "--out", ""],
    ["pretrain", "export", "--checkpoint", "c", "--out", " "], ["pretrain", "train", "--output", "\t"],
    ["xeval", "report", "--runs", "r", "--out", " "], ["xeval", "xnli", "--model", "m", "--data", "d", "--out", ""]])
def test_every_commands_output_of_blanks_is_one_error_before_any_work(tmp_path, capsys, monkeypatch, argv):
    """``pretrain tokenizer --out ' '`` trained the tokenizer and wrote it into a folder named ' '
    in the current one; ``--out ''`` wrote into the current folder itself."""
    import importlib

    main = importlib.import_module(f"{argv[0]}.__main__").main
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(argv[1:])
    flag = "--output" if "--output" in argv else "--out"
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1, err
    assert f"argument {flag}: {argv[-1]!r} names no path" in err and not os.listdir(tmp_path)


def test_a_training_runs_output_of_blanks_from_its_config_is_one_error(tmp_path):
    from pretrain.trainer import load_run_config

    with pytest.raises(UserError, match=re.escape("--set output=' ': output ' ' names no path")):
        load_run_config(str(ROOT / "configs/pretrain/tiny-cpu.yaml"), sets=["output=' '"])
