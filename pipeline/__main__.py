"""``python -m pipeline <command>``: the corpus pipeline's command line."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from .config import describe, load_config
from .errors import UserError

RUN_EPILOG = """\
config keys (YAML file, or --set KEY=VALUE):
{keys}

Any other --flag is passed to Beam as a pipeline option, for example
  --direct_num_workers=2 --direct_running_mode=multi_processing      (local, 2 processes)
  --project=P --region=R --temp_location=gs://B/tmp --extra_package=dist/polyglot_corpus-0.1.0.tar.gz
                                                                       (with --runner DataflowRunner)
Unknown flags are an error.
"""


def _summary(report: dict[str, Any], output: str) -> str:
    counters = report["counters"]
    lines = [f"corpus written to {output}  ({report['elapsed_s']:.1f} s, {report['input_files']} input files)"]
    read = counters.get("read", {})
    docs = read.get("documents", 0)
    lines.append(f"  read {docs} documents ({docs / max(report['elapsed_s'], 1e-9):.0f} documents/s), "
                 f"rejected {sum(v for k, v in read.items() if k.startswith('rejected_'))}")
    for step in ("dedup", "lid", "write"):
        if step in counters:
            lines.append(f"  {step}: " + ", ".join(f"{k}={v}" for k, v in counters[step].items()))
    langs = report["languages"]
    lines.append(f"  {len(langs)} languages: " + ", ".join(f"{lang}={v['documents']}" for lang, v in langs.items()))
    lines.append(f"  shards: {output}/lang=*/bucket=*/  stats: {output}/stats.json  "
                 f"sampling: {output}/sampling.json  rejected: {output}/rejected/")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace, beam_flags: list[str]) -> int:
    from .run import run_corpus

    cfg = load_config(args.config, {"input": args.input, "output": args.output, "runner": args.runner}, args.set)
    cfg.beam_options = [*cfg.beam_options, *beam_flags]
    if args.no_progress:
        cfg.progress = False
    report = run_corpus(cfg, overwrite=args.overwrite)
    print(_summary(report, cfg.output))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="run the corpus pipeline (read -> exact dedup -> language ID -> shards)",
        description="Run the CCNet-style corpus pipeline on WET/WARC files with Apache Beam.",
        epilog=RUN_EPILOG.format(keys="\n".join(describe())), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", help="YAML config (see configs/corpus/); keys listed below")
    run.add_argument("--input", action="append", help="glob of WET/WARC files, local or gs:// s3:// (repeatable; "
                     "replaces the config's input)")
    run.add_argument("--output", help="output directory (replaces the config's output)")
    run.add_argument("--runner", help="Beam runner (default DirectRunner): DirectRunner, PrismRunner, "
                     "DataflowRunner, FlinkRunner, SparkRunner")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override one config key, e.g. --set dedup.policy=keep_first (value read as YAML)")
    run.add_argument("--overwrite", action="store_true", help="replace the corpus an earlier run left in --output")
    run.add_argument("--no-progress", action="store_true", help="no per-file progress lines")
    return parser


def _quiet_beam_import_warning(record: logging.LogRecord) -> bool:
    """Beam warns on import that the optional GCP client libraries are missing: not our user's concern."""
    return not str(record.msg).startswith("apitools not found")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_quiet_beam_import_warning)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        return cmd_run(args, extra)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
