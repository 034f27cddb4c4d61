"""``python -m pipeline <command>``: the corpus pipeline's command line."""
from __future__ import annotations

import argparse
import atexit
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from .config import DEFAULT_STEPS, describe_corpus_config, load_config
from .util.configfile import KeysHelpParser, path_argument, read_yaml
from .util.errors import DEBUG_ENV, INTERRUPTED, StepFailed, UserError, exit_status
from .output.layout import shard_pattern
from .report import background
from .runners import lean_import, prefork

RUN_EPILOG = """\
config keys (YAML file, or --set KEY=VALUE):
{keys}

Any other --flag is passed to Beam as a pipeline option, for example
  --direct_num_workers=2 --direct_running_mode=multi_processing      (local, 2 processes)
  --dask_num_workers=4, or --dask_client_address=tcp://HOST:8786 --temp_location=gs://B/tmp
                          (with --runner DaskRunner; the stages' files go below --temp_location)
  --worker_mmap_threshold_mb=4          (worker processes return freed memory at once: flat memory, some CPU)
  --job_endpoint=embed --environment_type=LOOPBACK                     (with --runner PortableRunner)
  --project=P --region=R --temp_location=gs://B/tmp --extra_package=dist/polyglot_corpus-0.1.0.tar.gz
                                                                       (with --runner DataflowRunner)
Unknown flags are an error.
"""


def _summary(report: dict[str, Any], output: str, fmt: str) -> str:
    counters = report["counters"]
    lines = [f"corpus written to {output}  ({report['elapsed_s']:.1f} s, {report['input_files']} input files)"]
    read = counters.get("read", {})
    docs = read.get("documents", 0)
    lines.append(f"  read {docs} documents ({docs / max(report['elapsed_s'], 1e-9):.0f} documents/s), "
                 f"rejected {sum(v for k, v in read.items() if k.startswith('rejected_'))}")
    if parts := report.get("transform_s"):  # where the runner reports it (the DirectRunner)
        lines.append("  time in the graph's parts (seconds, all workers): "
                     + ", ".join(f"{label} {s:.1f}" for label, s in sorted(parts.items(), key=lambda kv: -kv[1])))
    for step in (*report["config"]["steps"], "write"):
        if step in counters:
            lines.append(f"  {step}: " + ", ".join(f"{k}={v}" for k, v in counters[step].items()))
    langs = report["languages"]
    lines.append(f"  {len(langs)} languages (documents): " + ", ".join(f"{lang}={v['documents']}" for lang, v in langs.items()))
    buckets: dict[str, int] = {}
    for v in langs.values():
        for bucket, counts in v["buckets"].items():
            buckets[bucket] = buckets.get(bucket, 0) + counts["documents"]
    lines.append("  buckets (documents): " + ", ".join(f"{b}={n}" for b, n in sorted(buckets.items())))
    lines.append(f"  shards: {shard_pattern(output, fmt)}  stats: {output}/stats.json  "
                 f"sampling: {output}/sampling.json"
                 + (f"  rejected: {output}/rejected/" if any(k.startswith("rejected_") for k in read) else "")
                 + (f"  removed: {output}/removed/" if report["config"]["write"]["removed"] else ""))
    lines.append(f"  report: {output}/report/report.html")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace, beam_flags: list[str]) -> int:
    cfg = load_config(args.config, {"input": args.input, "output": args.output, "runner": args.runner}, args.set,
                      beam_flags)
    lean = cfg.runner in prefork.LOCAL_NAMES and lean_import.wanted(
        [cfg.input, cfg.output, cfg.beam_options, cfg.to_dict()], [cls.__module__ for cls in cfg.step_classes()])
    if lean:  # no URL in the config: Beam's cloud clients are left out of its import
        lean_import.install()
    prefork.start_for_run(cfg.runner, cfg.beam_options, cfg.worker_modules(), lean)  # imports while the driver does
    background.start()  # the report's process: matplotlib imported on idle cycles
    try:
        from .run import run_corpus  # imports Beam

        if args.no_progress:
            cfg.progress = False
        report = run_corpus(cfg, overwrite=args.overwrite, resume=args.resume)
    finally:
        background.stop()
    if "built_only" in report:
        print(f"job built, not run: {report['built_only']}")
        return 0
    print(_summary(report, cfg.output, cfg.write.format))
    return 0


def cmd_status(args: argparse.Namespace, extra: list[str]) -> int:
    from .output import fs, stores
    from .run import status

    if extra:
        raise UserError(f"unknown option or argument {extra[0]!r}")
    args.path = fs.plain_path(args.path)
    stores.open_stores(args, {"OUTPUT_OR_TEMP": args.path})
    print("\n".join(status(args.path.rstrip("/") or "/")))
    return 0


def cmd_report(args: argparse.Namespace, extra: list[str]) -> int:
    from .output import fs, stores
    from .output.layout import REPORT
    from .report.corpus_report import REPORT_FILES, build

    if extra:
        raise UserError(f"unknown option or argument {extra[0]!r}")
    args.corpus, args.out = fs.plain_path(args.corpus), args.out and fs.plain_path(args.out)
    out = args.out or f"{args.corpus.rstrip('/')}/{REPORT}"
    fs.check_folder(out, "--out", REPORT_FILES)  # the report replaces its own files, and no one else's
    stores.open_stores(args, {"CORPUS": args.corpus}, {"--out": out})
    written = build(args.corpus, out)
    print(f"corpus report: {next(p for p in written if p.endswith('report.html'))} (and report.md, {len(written) - 2} plots)")
    return 0


def cmd_train_lm(args: argparse.Namespace, extra: list[str]) -> int:
    from .steps.lm import check_reference, kenlm_bin_dir, train_lm

    if extra:
        raise UserError(f"unknown option or argument {extra[0]!r}")
    from .output import fs

    plan = lm_plan(args)
    check_lm_options(args)
    bin_dir = kenlm_bin_dir(args.kenlm_bin)
    fs.check_folder(args.out, "--out")
    out = Path(args.out)
    there = {lang: [name for name in (f"{lang}.sp.model", f"{lang}.arpa.bin") if (out / name).exists()] for lang in plan}
    kept = {lang for lang in plan if not args.overwrite and len(there[lang]) == 2}
    half = [f"{names[0]} without {lang}.{'arpa.bin' if names[0].endswith('.sp.model') else 'sp.model'}"
            for lang, names in there.items() if len(names) == 1 and not args.overwrite]
    if half:  # someone's file (CCNet's model, say) that a pair trained now would replace
        raise UserError(f"--out {out}: {', '.join(half)} there; --overwrite replaces "
                        f"{'them' if len(half) > 1 else 'it'} with a pair trained now (or move it away)")
    for lang in [lang for lang in plan if lang not in kept]:  # every text read before the first minutes of training
        check_reference(lang, plan[lang])
    for lang, texts in plan.items():
        if lang in kept:
            print(f"{lang}: {out}/{lang}.sp.model and {lang}.arpa.bin exist, skipped (--overwrite to retrain)")
            continue
        report = train_lm(lang, texts, out, vocab_size=args.vocab_size, order=args.order, memory=args.memory,
                          seed=args.seed, threads=args.threads, bin_dir=bin_dir)
        print(report.describe(), flush=True)
    return 0


def lm_plan(args: argparse.Namespace) -> dict[str, list[str]]:
    """Language -> reference text files, from --lang/--text or the --config file, each file checked
    to be there before any language is trained; the settings (``LM_DEFAULTS``' keys) set on ``args``:
    an option given wins over the config file, which wins over the default."""
    data = read_yaml(args.config) if args.config else {}
    unknown = sorted(set(data) - {"languages", *LM_DEFAULTS})
    if unknown:
        raise UserError(f"config {args.config}: unknown key {unknown[0]!r} (known: languages, {', '.join(LM_DEFAULTS)})")
    for key, default in LM_DEFAULTS.items():
        if key in data and (isinstance(data[key], bool) or not isinstance(data[key], type(default))):
            kind = "a string such as 20% or 4G" if key == "memory" else "an integer"
            raise UserError(f"config {args.config}: {key} must be {kind}, not {data[key]!r}")
        if getattr(args, key) is None:
            setattr(args, key, data.get(key, default))
    if args.config and (args.lang or args.text):
        raise UserError("give the languages by --config or by --lang and --text, not both")
    plan = _config_plan(args.config, data) if args.config else _options_plan(args)
    for path in (path for texts in plan.values() for path in texts):
        if not Path(path).is_file():
            raise UserError(f"reference text {path}: " + ("a folder, not a file" if Path(path).is_dir() else "no such file"))
    return plan


def _config_plan(config: str, data: dict) -> dict[str, list[str]]:
    """Language -> text files of a train-lm config file's ``languages`` (relative to the file)."""
    languages = data.get("languages") or {}
    if not isinstance(languages, dict) or not languages:
        raise UserError(f"config {config}: languages must map a language code to text files "
                        f"(languages: {{de: [de.txt]}}), not {languages!r}")
    base = Path(config).parent
    plan = {}
    for lang, files in languages.items():
        files = [files] if isinstance(files, str) else files
        if not isinstance(files, list) or not files or not all(isinstance(f, str) and f for f in files):
            raise UserError(f"config {config}: languages.{lang} must be a text file or a list of them, "
                            f"not {languages[lang]!r}")
        plan[check_lang(str(lang), f"config {config}: languages.{lang}")] = [
            f if f.startswith("/") else str(base / f) for f in files]
    return plan


def _options_plan(args: argparse.Namespace) -> dict[str, list[str]]:
    """Language -> text files of ``--lang`` and ``--text``."""
    if not args.lang or not args.text:
        raise UserError("train-lm needs --lang and --text, or --config")
    langs = [check_lang(lang.strip(), "--lang") for given in args.lang for lang in given.split(",") if lang.strip()]
    twice = next((lang for lang in langs if langs.count(lang) > 1), None)
    if twice:
        raise UserError(f"--lang: {twice} given twice (several texts of one language: --lang {twice} "
                        f"--text a.txt --text b.txt)")
    if len(langs) == 1:
        return {langs[0]: args.text}
    if len(args.text) != len(langs):
        raise UserError(f"--lang names {len(langs)} languages but {len(args.text)} --text files were given (one per language)")
    return {lang: [text] for lang, text in zip(langs, args.text)}


def check_lang(lang: str, where: str) -> str:
    """A language code as the models' file names and the perplexity step take it (``de``, ``zh_Hans``)."""
    if not LANG_CODE.fullmatch(lang):
        raise UserError(f"{where}: {lang!r} is not a language code (letters, digits, _ and -; e.g. de, zh_Hans): "
                        f"it names the files <code>.sp.model and <code>.arpa.bin")
    return lang


def check_lm_options(args: argparse.Namespace) -> None:
    """The KenLM order and sort memory, and the vocabulary size, before any training."""
    if not 2 <= args.order <= KENLM_MAX_ORDER:
        raise UserError(f"order {args.order}: KenLM here takes 2 to {KENLM_MAX_ORDER} (CCNet: 5)")
    if not MEMORY.fullmatch(str(args.memory)):
        raise UserError(f"memory {args.memory!r}: a number and a unit as lmplz -S takes it, e.g. 20% or 4G")
    if not MIN_VOCAB <= args.vocab_size < 2**31:
        raise UserError(f"vocab_size {args.vocab_size}: at least {MIN_VOCAB} (byte fallback's 256 pieces, "
                        f"SentencePiece's own and the text's characters; CCNet: 65536) and below 2^31")
    if not 0 <= args.seed < 2**32:
        raise UserError(f"seed {args.seed}: SentencePiece takes 0 to 2^32-1")
    if args.threads < 1:
        raise UserError(f"threads {args.threads}: at least 1")


def cmd_cutoffs(args: argparse.Namespace, extra: list[str]) -> int:
    from .output import fs, stores
    from .steps.perplexity import PERCENTILES, compute_cutoffs, not_a_cutoff_table, write_cutoffs

    if extra:
        raise UserError(f"unknown option or argument {extra[0]!r}")
    if args.sample < 1:
        raise UserError(f"--sample {args.sample}: must be at least 1 (documents per language)")
    fs.check_file(args.out, "--out")  # before the corpus is read
    stores.open_stores(args, {"--corpus": args.corpus}, {"--out": args.out})
    if fs.exists(args.out) and (why := not_a_cutoff_table(args.out)):  # (a corpus's stats.json was replaced)
        raise UserError(f"--out {args.out}: the file there is {why}; give a new path, or remove it first")
    cutoffs, used = compute_cutoffs(args.corpus, args.sample, args.seed)
    write_cutoffs(cutoffs, args.out)
    print(f"cutoffs for {len(cutoffs)} languages written to {args.out}")
    for lang in sorted(cutoffs):
        c = cutoffs[lang]
        print(f"  {lang}: {used[lang]} documents, p30={c[30]:g} p60={c[60]:g} (p0 {c[0]:g}, p50 {c[50]:g}, p99 {c[99]:g})")
    few = [lang for lang in sorted(used) if used[lang] < PERCENTILES]
    capped = [lang for lang in few if used[lang] == args.sample]
    if few:
        print(f"warning: cutoffs of {', '.join(f'{lang} ({used[lang]})' for lang in few)} from fewer than {PERCENTILES} "
              f"documents: too few to tell {PERCENTILES} percentiles apart"
              + (f" (--sample {args.sample} drew no more{'' if capped == few else ' for ' + ', '.join(capped)})"
                 if capped else ""), file=sys.stderr)
    return 0


LM_DEFAULTS = {"vocab_size": 65536, "order": 5, "memory": "20%", "seed": 0, "threads": 1}
LANG_CODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
KENLM_MAX_ORDER = 6
"""The largest order workflows/setup.sh builds lmplz and build_binary for (``-DKENLM_MAX_ORDER``),
and the kenlm wheel's scorer takes."""
MEMORY = re.compile(r"\d+(\.\d+)?[%bKMGTPEZY]?")
MIN_VOCAB = 260
"""Byte fallback's 256 pieces, <unk>, <s>, </s> and a character (the text's own characters may need more)."""


STORE_COMMANDS = ("status", "cutoffs", "report")
"""The commands that read stores themselves, so take Beam's S3 options (``--s3_endpoint_url``, ...)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line. Beam's S3 options go on ``command``'s parser alone, if it is one of
    :data:`STORE_COMMANDS`: they import Beam (seconds), which the other commands, the top-level
    help and ``run`` (it imports Beam after its fork server starts) do not wait for."""
    parser = KeysHelpParser(prog="python -m pipeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help=f"run the corpus pipeline: read -> the config's steps (default: {', '.join(DEFAULT_STEPS)}) -> shards",
        description="Run the CCNet-style corpus pipeline on WET/WARC files with Apache Beam.",
        epilog=lambda: RUN_EPILOG.format(keys="\n".join(describe_corpus_config())),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", help="YAML config (see configs/corpus/); keys listed below")
    run.add_argument("--input", action="append", help="glob of WET/WARC files, local or gs:// s3:// (repeatable; "
                     "replaces the config's input)")
    run.add_argument("--output", help="output directory (replaces the config's output)")
    run.add_argument("--runner", help="Beam runner (default DirectRunner): DirectRunner (run on Beam's FnApiRunner, "
                     "never downloading Prism), DaskRunner, PortableRunner, PrismRunner, DataflowRunner, "
                     "FlinkRunner, SparkRunner (see README: Running on a cluster)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override one config key, e.g. --set dedup.policy=keep_first (value read as YAML)")
    run.add_argument("--overwrite", action="store_true", help="replace the corpus an earlier run left in --output")
    run.add_argument("--no-progress", action="store_true", help="no per-file and per-stage progress lines")
    run.add_argument("--resume", action="store_true",
                     help="DaskRunner: continue the unfinished run in --output (same config and input), running "
                          "only its tasks that had not finished (without it, an unfinished run is removed)")
    st = sub.add_parser(
        "status", help="how far a run is: stages and tasks done, failed or pending, input covered (from its files)",
        description="Read a run's state from its files alone: a corpus output (its finished corpus, whether "
                    "shards are missing or cannot be opened, and any unfinished run in it), a DaskRunner task "
                    "folder, or a --temp_location holding task folders.")
    st.add_argument("path", metavar="OUTPUT_OR_TEMP", help="corpus output, task folder or --temp_location")

    lm = sub.add_parser(
        "train-lm", help="train <lang>.sp.model + <lang>.arpa.bin (SentencePiece + KenLM 5-gram) from reference text",
        description="Train CCNet-style language models: text normalized as the scorer does, a SentencePiece "
                    "unigram model, `lmplz -o 5` over its pieces, `build_binary`. Several languages in one call.")
    lm.add_argument("--lang", action="append", help="language code, or a comma-separated list, or repeated (then one "
                    "--text per language, in order)")
    lm.add_argument("--text", action="append", help="reference text file, one paragraph per line (repeatable)")
    lm.add_argument("--config", help="YAML with `languages: {de: [files...], ...}` and optionally vocab_size, order, "
                    "memory, seed, threads (see configs/lm/); relative paths are relative to the config file; "
                    "an option given here wins over it")
    lm.add_argument("--out", required=True, type=path_argument,
                    help="output directory for <lang>.sp.model and <lang>.arpa.bin")
    lm.add_argument("--vocab-size", dest="vocab_size", type=int,
                    help="SentencePiece vocabulary (default and CCNet's: 65536); capped to what a small text allows, "
                         "and said so")
    lm.add_argument("--order", type=int, help="n-gram order (default 5)")
    lm.add_argument("--memory", help="lmplz sort memory, e.g. 20%% or 4G (default 20%%)")
    lm.add_argument("--seed", type=int, help="SentencePiece sampling seed (default 0)")
    lm.add_argument("--threads", type=int, help="SentencePiece training threads (default 1: its models then are the same "
                    "bytes on every machine; with more they follow the count)")
    lm.add_argument("--kenlm-bin", dest="kenlm_bin", help="directory with lmplz and build_binary (default: the "
                    "ones workflows/setup.sh built)")
    lm.add_argument("--overwrite", action="store_true", help="retrain languages whose models already exist (or replace a model "
                    "there without its pair)")

    cut = sub.add_parser(
        "cutoffs", help="perplexity percentiles 0-99 per language (CCNet's cutoff.csv) from a scored corpus",
        description="Compute CCNet-layout cutoff.csv (rows: percentile 0..99, columns: languages) from the "
                    "perplexity column of a pipeline output scored with perplexity.models.")
    cut.add_argument("--corpus", required=True, help="pipeline output directory (local, gs://, s3://)")
    cut.add_argument("--out", required=True, type=path_argument, help="cutoff.csv to write")
    cut.add_argument("--sample", type=int, default=100_000, help="at most this many documents per language (default 100000)")
    cut.add_argument("--seed", type=int, default=0, help="sampling seed")
    rep = sub.add_parser(
        "report", help="rebuild the corpus report (report.html, report.md, plots) from stats.json and sampling.json",
        description="Write the corpus report of a pipeline output from its stats.json and sampling.json alone: "
                    "the funnel, languages, alpha-sampling, perplexity, near-duplicates, rejected records, config.")
    rep.add_argument("corpus", metavar="CORPUS", help="pipeline output directory (local, gs://, s3://)")
    rep.add_argument("--out", type=path_argument, help="folder for the report (default CORPUS/report)")
    if command in STORE_COMMANDS:
        from .output import stores

        stores.add_arguments(sub.choices[command])
    return parser


def _quiet_beam(record: logging.LogRecord) -> bool:
    """Hide the local Beam workers' start-up warnings relayed by the job service (errors still show),
    the warnings Beam logs when it starts and stops a job server (Prism, Flink's, Spark's), and
    Beam's logs of a step's failure or of a Ctrl-C in a step, which the run ends with as one line
    (``StepFailed``, ``KeyboardInterrupt``)."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 (a call with the wrong arguments: logging reports it)
        return True
    if os.environ.get(DEBUG_ENV) != "1" and (
            record.exc_info and isinstance(record.exc_info[1], (StepFailed, KeyboardInterrupt))
            or "StepFailed: step " in message or message.startswith("KeyboardInterrupt [while running")):
        return False
    if record.name == "apache_beam.utils.subprocess_server":
        return not message.startswith(("Really starting service", "Really destroying service"))
    return not (record.name == "apache_beam.runners.portability.local_job_service" and record.levelno < logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    root = logging.getLogger()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in root.handlers:
        handler.addFilter(_quiet_beam)
    argv = sys.argv[1:] if argv is None else argv
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(command)
    args, extra = parser.parse_known_args(argv)
    commands = {"run": cmd_run, "status": cmd_status, "train-lm": cmd_train_lm, "cutoffs": cmd_cutoffs, "report": cmd_report}
    try:
        return commands[args.command](args, extra)
    except BaseException as exc:
        return exit_status(exc, f"{INTERRUPTED}; the next run on its output finishes or removes what this "
                                "one left there (`pipeline status` shows it)")


if __name__ == "__main__":
    code = main()
    # Once main() returned, nothing is left to write: the exit handlers run (multiprocessing's,
    # logging's), then the process ends without the interpreter's teardown, which frees Beam's
    # modules and the graph object by object (about a second after every corpus run).
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)
