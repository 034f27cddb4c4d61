"""Zero-shot cross-lingual XNLI: fine-tune on English NLI (or every language's training file with
--translate-train-all), choose the checkpoint on the selection languages' dev sets (default:
English dev), test every language, for several seeds; write results.json, report.md, report.html
and plots under --out.

--model takes an HF model directory (config.json, weights, tokenizer files; e.g. from `python -m
pretrain export`) or one of our training runs / checkpoints. --data is a folder holding the real
files (found anywhere below it): XNLI-1.0 xnli.dev.tsv + xnli.test.tsv, XNLI-MT-1.0
multinli/multinli.train.<lang>.tsv or MultiNLI multinli_1.0_train.jsonl, or HF `datasets` xnli
saved per language (<lang>/train|validation|test as save_to_disk dirs or Parquet files).
Multi-GPU / multi-node: start it under the DeepSpeed launcher (`deepspeed --num_gpus N --no_local_rank
--module xeval xnli ...`, or with a hostfile) or torchrun (RANK/WORLD_SIZE set); each rank trains on its
share of every batch and evaluates its share of every set (counts are summed).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.util.configfile import (KeysHelpParser, build_dataclass, check_choices_and_ranges, describe,
                                      merged_config_data, path_argument, source_of)
from pipeline.output import fs
from pipeline.util.errors import UserError

from .data import LABELS, XNLI_LANGUAGES, MissingData, ReadLog, discover, load_split
from .config import ENGINES, TrainConfig
from . import report

SCHEMA = "xeval.xnli/1"
OUT_FILES = ("results.json", "results.json.tmp", "models", "models.tmp", *report.REPORT_FILES)
"""What a run writes in ``--out``: a folder holding any other file is refused before the run."""
DEVICES = ("auto", "cpu", "cuda")


@dataclasses.dataclass
class XnliConfig(TrainConfig):
    """The evaluation: fine-tuning hyperparameters (TrainConfig) plus languages, seeds, data and model options."""

    languages: list[str] = dataclasses.field(default_factory=lambda: list(XNLI_LANGUAGES))
    """Test languages (XNLI codes); every one needs dev and test data."""
    selection_languages: list[str] = dataclasses.field(default_factory=lambda: ["en"])
    """Checkpoint selection: mean dev accuracy over these languages (zero-shot protocol: en)."""
    seeds: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 3])
    """One fine-tuning run per seed (head init, data order, dropout); the report gives mean ± std."""
    translate_train_all: bool = False
    """Train on every test language's training file found (XNLI-MT multinli.train.<lang>.tsv / HF <lang>/train)."""
    max_train_examples: int = 0
    """Use only the first N training examples per language (0: all); for quick runs."""
    skip_malformed: bool = False
    """Skip malformed lines (counted, first locations in results.json) instead of stopping at the first."""
    engine: str = "auto"
    """Model code: ours (pretrain.models), hf (transformers AutoModelForSequenceClassification), auto."""
    save_models: bool = False
    """Write each seed's selected fine-tuned model (HF format) to <out>/models/seed-<s>."""
    dataset_name: str = "XNLI"
    """Name of the evaluation data, printed in the report (e.g. 'NLI smoke set')."""
    data_note: str = ""
    """A note printed at the top of the report, e.g. 'smoke set, not XNLI: not comparable to published numbers'."""


CHOICES = {"engine": ENGINES, "device": DEVICES}
RANGES = {"learning_rate": (0.0, None), "epochs": (1, None), "batch_size": (1, None), "eval_batch_size": (1, None),
          "max_length": (8, None), "warmup": (0.0, None), "weight_decay": (0.0, None), "max_grad_norm": (0.0, None),
          "eval_every": (0, None), "max_train_examples": (0, None)}


def load_config(path: str | None, overrides: dict[str, Any], sets: list[str]) -> XnliConfig:
    data, source = merged_config_data(path, overrides, sets)
    cfg = build_dataclass(XnliConfig, data, source)
    check_choices_and_ranges(cfg, source, CHOICES, RANGES)
    unknown = [lang for lang in cfg.languages if lang not in XNLI_LANGUAGES]
    if unknown or not cfg.languages:
        raise UserError(f"{source_of(source, 'languages')}: languages {unknown or '[]'} are not XNLI languages ({' '.join(XNLI_LANGUAGES)})")
    cfg.languages = [lang for lang in XNLI_LANGUAGES if lang in cfg.languages]
    outside = [lang for lang in cfg.selection_languages if lang not in cfg.languages]
    if outside or not cfg.selection_languages:
        raise UserError(f"{source_of(source, 'selection_languages', 'languages')}: selection_languages {outside or '[]'} "
                        f"must be among languages ({' '.join(cfg.languages)})")
    if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds) or not all(0 <= seed < 2**32 for seed in cfg.seeds):
        raise UserError(f"{source_of(source, 'seeds')}: seeds must be a non-empty list of distinct integers from 0 "
                        f"to 2^32-1, got {cfg.seeds}")
    return cfg


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _seeds(value: str) -> list[int]:
    try:
        return [int(v) for v in _csv(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, e.g. 1,2,3; got {value!r}") from None


def add_arguments(parser: KeysHelpParser) -> None:
    parser.add_argument("--model", required=True, help="HF model dir (config.json + weights + tokenizer) or our run/checkpoint dir")
    parser.add_argument("--data", required=True, help="folder with the XNLI / XNLI-MT / MultiNLI / HF datasets files")
    parser.add_argument("--out", required=True, type=path_argument,
                        help="report folder (results.json, report.md, report.html, *.png)")
    parser.add_argument("--config", help="YAML config (configs/xnli/*.yaml); options below override it")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--languages", type=_csv, help="comma-separated test languages, or 'all' (default: the 15 XNLI languages)")
    parser.add_argument("--select", type=_csv, dest="selection_languages", help="selection languages (dev), default en")
    parser.add_argument("--seeds", type=_seeds, help="comma-separated seeds (default 1,2,3)")
    parser.add_argument("--lr", type=float, dest="learning_rate", help="peak learning rate (default 2e-5)")
    parser.add_argument("--epochs", type=int, help="epochs (default 3)")
    parser.add_argument("--batch-size", type=int, help="global batch size (default 32)")
    parser.add_argument("--max-length", type=int, help="max tokens per pair (default 128)")
    parser.add_argument("--warmup", type=float, help="warmup fraction (<1) or steps (default 0.1)")
    parser.add_argument("--translate-train-all", action="store_const", const=True, help="train on every language's training file")
    parser.add_argument("--max-train-examples", type=int, help="first N training examples per language (0: all)")
    parser.add_argument("--skip-malformed", action="store_const", const=True, help="skip and count malformed lines")
    parser.add_argument("--engine", choices=ENGINES, help="model code (default auto)")
    parser.add_argument("--device", choices=DEVICES, help="device (default auto)")
    parser.add_argument("--save-models", action="store_const", const=True, help="save each seed's selected model")
    parser.add_argument("--dataset-name", help="name of the data in the report (default XNLI)")
    parser.add_argument("--data-note", help="note at the top of the report, e.g. 'smoke set, not XNLI'")
    parser.epilog = _keys_help


def _keys_help() -> str:
    """The config keys of ``--help``, with the fine-tuning keys' own descriptions."""
    documented = {line.split(" (", 1)[0]: line for line in describe(TrainConfig, "", CHOICES)}
    lines = [documented.get(line.split(" (", 1)[0], line) for line in describe(XnliConfig, "", CHOICES)]
    return "config keys (YAML or --set):\n" + "\n".join(lines)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    keys = [f.name for f in dataclasses.fields(XnliConfig)]
    out = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if out.get("languages") == ["all"]:
        out["languages"] = list(XNLI_LANGUAGES)
    return out


def _device(choice: str) -> str:
    import torch

    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device available")
    index = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(index)
    return f"cuda:{index}"


def _train_languages(root: Path, cfg: XnliConfig) -> list[str]:
    """en, plus (translate-train-all) every test language with a training file."""
    if not cfg.translate_train_all:
        return ["en"]
    found = []
    for lang in cfg.languages:
        try:
            discover(root, "train", lang)
            found.append(lang)
        except MissingData:  # tested, not trained on (results.json lists the training languages); any other
            continue         # error (two files for a language, say) is the user's to settle
    if "en" not in found:  # English is trained on whether or not it is tested
        discover(root, "train", "en")
        found.insert(0, "en")
    return found


def _cut(nli: Any, limit: int) -> Any:
    if limit and len(nli) > limit:
        nli.premises, nli.hypotheses, nli.labels = nli.premises[:limit], nli.hypotheses[:limit], nli.labels[:limit]
    return nli


def run(model: str, data: str, out: str, cfg: XnliConfig, log: Any = print) -> dict[str, Any] | None:
    """The whole evaluation; returns the results (rank 0) after writing them and the reports."""
    import torch
    import transformers

    from .finetune import Encoded, encode, finetune, init_distributed, scores, confusion, seed_everything
    from .model import load_pretrained

    fs.check_folder(out, "--out", OUT_FILES)  # before hours of fine-tuning, not after them
    root = Path(data)
    device = _device(cfg.device)
    dist = init_distributed(device)
    if dist.world > 1 and cfg.batch_size % dist.world:
        raise UserError(f"batch_size {cfg.batch_size} is not a multiple of the {dist.world} ranks")
    if dist.rank:
        log = lambda *_: None  # noqa: E731 - only rank 0 talks
    train_langs = _train_languages(root, cfg)
    eval_langs = cfg.languages
    train_sets, train_logs = load_split(root, "train", tuple(train_langs), cfg.skip_malformed)
    dev_sets, dev_logs = load_split(root, "dev", tuple(eval_langs), cfg.skip_malformed)
    test_sets, test_logs = load_split(root, "test", tuple(eval_langs), cfg.skip_malformed)
    for nli in train_sets.values():
        _cut(nli, cfg.max_train_examples)
    tcfg = dataclasses.replace(cfg, device=device)
    out_dir = Path(out)
    seeds_out: list[dict[str, Any]] = []
    tokens: dict[str, dict[str, Encoded]] = {}
    model_info: dict[str, Any] = {}
    started = time.time()
    staged = out_dir / "models.tmp"  # the seeds' models, until this run's results.json is written
    if dist.rank == 0:
        shutil.rmtree(staged, ignore_errors=True)
    pretrained = load_pretrained(model, cfg.engine)  # once: every seed starts from the same checkpoint
    tokenizer = pretrained.tokenizer
    for seed in cfg.seeds:
        seed_everything(seed)
        classifier = pretrained.build()
        if classifier.max_length is not None and cfg.max_length > classifier.max_length:
            raise UserError(f"max_length {cfg.max_length}: the model {model} takes at most {classifier.max_length} tokens")
        model_info = classifier.info
        if not tokens:
            segments = model_info["engine"] == "hf"  # (our models take no segment ids: XLM-R and mDeBERTa have none)
            train = [encode(tokenizer, train_sets[lang], cfg.max_length, segments) for lang in train_langs]
            tokens["train"] = {"all": Encoded.joined(train)}
            tokens["dev"] = {lang: encode(tokenizer, dev_sets[lang], cfg.max_length, segments) for lang in eval_langs}
            tokens["test"] = {lang: encode(tokenizer, test_sets[lang], cfg.max_length, segments) for lang in eval_langs}
            log(f"data: train {len(tokens['train']['all'].labels)} pairs ({', '.join(train_langs)}), "
                f"dev/test {len(eval_langs)} languages")
        pad_id = tokenizer.pad_token_id
        fit = finetune(classifier, tokens["train"]["all"], tokens["dev"], cfg.selection_languages, pad_id, tcfg, seed, dist, log)
        result = {"seed": seed, **fit,
                  "dev": {lang: scores(confusion(classifier, tokens["dev"][lang], pad_id, tcfg, dist)) for lang in eval_langs},
                  "test": {lang: scores(confusion(classifier, tokens["test"][lang], pad_id, tcfg, dist)) for lang in eval_langs}}
        log(f"seed {seed}: selected epoch {fit['selected']['epoch']} step {fit['selected']['step']}; test "
            + " ".join(f"{lang} {result['test'][lang]['accuracy']:.4f}" for lang in eval_langs))
        if cfg.save_models and dist.rank == 0:
            classifier.save(classifier.module, staged / f"seed-{seed}")
        seeds_out.append(result)
    if dist.rank:
        return None
    results = {
        "schema": SCHEMA,
        "task": "xnli",
        "mode": "translate-train-all" if cfg.translate_train_all else "zero-shot cross-lingual transfer",
        "labels": list(LABELS),
        "languages": eval_langs,
        "selection": {"split": "dev", "languages": cfg.selection_languages,
                      "rule": "highest mean dev accuracy over the selection languages among the evaluation points "
                              "(end of each epoch, and every eval_every steps); earliest on ties; test evaluated once, "
                              "on the selected weights"},
        "config": dataclasses.asdict(cfg),
        "model": model_info,
        "data": {"root": str(root.resolve()), "name": cfg.dataset_name, "note": cfg.data_note,
                 "train_languages": train_langs,
                 "train_examples": {lang: len(train_sets[lang]) for lang in train_langs},  # after the cut
                 "files": {"train": _logs(train_logs), "dev": _logs(dev_logs), "test": _logs(test_logs)}},
        "environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "device": device.split(":")[0], "world_size": dist.world},
        "seeds": seeds_out,
    }
    results["summary"] = report.summarize(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(out_dir / "results.json")
    shutil.rmtree(out_dir / "models", ignore_errors=True)  # a previous run's: they went with its results.json
    if cfg.save_models:
        staged.replace(out_dir / "models")
    report.render([results], out_dir)
    log(f"wrote {out_dir}/results.json, report.md, report.html ({time.time() - started:.0f} s)")
    return results


def _logs(logs: list[ReadLog]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(log) for log in logs]


def main(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, _overrides(args), args.set)
    run(args.model, args.data, args.out, cfg, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    return 0
