"""Re-render XNLI reports (report.md, report.html, accuracy.png, gap.png) from results.json files;
several runs are compared side by side, next to the published XLM-R and mDeBERTa-v3 rows.

Accuracy is the mean over seeds ± the sample standard deviation; the transfer gap of a language
is English accuracy minus its accuracy (XTREME's definition), the average gap is English minus
the mean of the other languages.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from pipeline.output import fs
from pipeline.util.configfile import path_argument
from pipeline.util.errors import UserError
from pipeline.report.html import Section, Table, png, pyplot, write_report

from .data import XNLI_LANGUAGES, XNLI_TEST_PAIRS

PUBLISHED = Path(__file__).with_name("published.json")


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per-language test accuracy mean/std over seeds, their average, and the gaps to English."""
    langs = results["languages"]
    per_lang = {}
    for lang in langs:
        mean, std = mean_std([seed["test"][lang]["accuracy"] for seed in results["seeds"]])
        per_lang[lang] = {"mean": mean, "std": std, "n_seeds": len(results["seeds"])}
    averages = [sum(seed["test"][lang]["accuracy"] for lang in langs) / len(langs) for seed in results["seeds"]]
    avg_mean, avg_std = mean_std(averages)
    summary: dict[str, Any] = {"test": per_lang, "average": {"mean": avg_mean, "std": avg_std}}
    if "en" in per_lang:
        others = [lang for lang in langs if lang != "en"]
        summary["gap"] = {lang: per_lang["en"]["mean"] - per_lang[lang]["mean"] for lang in others}
        summary["average_gap"] = (per_lang["en"]["mean"] - sum(per_lang[lang]["mean"] for lang in others) / len(others)
                                  if others else 0.0)
    return summary


RESULTS_KEYS = ("mode", "labels", "languages", "seeds", "model", "data", "config", "selection")
"""What a report reads of a results.json besides its schema."""


def load_results(path: str) -> dict[str, Any]:
    file = Path(path)
    if file.is_dir():
        file = file / "results.json"
    try:
        results = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{file}: no such file") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{file}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{file}: not UTF-8 text, so not a results.json ({exc.reason} at byte {exc.start})") from None
    if not isinstance(results, dict) or results.get("schema") != "xeval.xnli/1":
        raise UserError(f"{file}: not an xeval results.json (schema xeval.xnli/1)")
    missing = [key for key in RESULTS_KEYS if key not in results]
    if missing:
        raise UserError(f"{file}: not as xeval writes it (no {missing[0]!r})")
    try:
        results["summary"] = summarize(results)
        why_not_comparable(results), chance_warnings("", results), runs_section([results], [""])  # what a report reads
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # edited by hand, or cut short
        raise UserError(f"{file}: not as xeval writes it ({type(exc).__name__}: {exc})") from None
    return results


CHANCE = 1 / 3  # three balanced classes
CONSTANT_SHARE = 0.95  # a seed whose predictions are this much one label predicts (nearly) a constant


def default_names(runs: list[dict[str, Any]]) -> list[str]:
    """Each run's name in the tables: its model folder's name, with as many parent folders as tell the
    runs apart (``xlmr/hf`` and ``mdeberta/hf``, as ``pretrain export`` names them), its dataset's
    where not XNLI, and ``run N`` after a name that is still another run's."""
    parts = [Path(run["model"].get("path", f"run {i + 1}")).parts for i, run in enumerate(runs)]
    depth = 1
    while len({p[-depth:] for p in parts}) < len(set(parts)) and depth < max(map(len, parts)):
        depth += 1
    names = ["/".join(p[-depth:]) + (f" ({run['data']['name']})" if run["data"]["name"] != "XNLI" else "")
             for p, run in zip(parts, runs)]
    return [f"{name} (run {i + 1})" if names.count(name) > 1 else name for i, name in enumerate(names)]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def setting_of(run: dict[str, Any]) -> str:
    return "translate-train-all" if run["mode"] == "translate-train-all" else "zero-shot"


def why_not_comparable(run: dict[str, Any]) -> str:
    """Why a run's average cannot stand beside the published test averages ("" if it can)."""
    reasons = []
    if run["data"]["name"] != "XNLI":
        reasons.append(f"data set {run['data']['name']}, not XNLI")
    if setting_of(run) != "zero-shot":
        reasons.append(f"setting {setting_of(run)}")
    missing = [lang for lang in XNLI_LANGUAGES if lang not in run["languages"]]
    if missing:
        reasons.append(f"{len(run['languages'])} languages, missing {', '.join(missing)}")
    if run["selection"]["languages"] != ["en"]:
        reasons.append(f"checkpoints selected on {', '.join(run['selection']['languages'])} dev, not English dev alone")
    if run["model"].get("head") == "kept":
        reasons.append("fine-tuned from the model folder's trained classifier head, not a fresh one")
    if run["config"].get("max_train_examples"):
        reasons.append(f"trained on the first {run['config']['max_train_examples']} examples per language only")
    sizes = {lang: scores["n"] for seed in run["seeds"] for lang, scores in seed["test"].items()}
    short = [f"{lang} {n}" for lang, n in sizes.items() if n != XNLI_TEST_PAIRS]
    if short:
        reasons.append(f"test sets not of XNLI's {XNLI_TEST_PAIRS:,} pairs a language ({', '.join(short)})")
    malformed = sum(log["malformed"] for split in ("dev", "test") for log in run["data"]["files"][split])
    if malformed:
        reasons.append(f"{malformed} malformed dev/test lines left out")
    malformed = sum(log["malformed"] for log in run["data"]["files"]["train"])
    if malformed:
        reasons.append(f"{malformed} malformed training lines left out")
    return "; ".join(reasons)


def predicted_shares(seed: dict[str, Any]) -> list[float]:
    """Share of each label among a seed's test predictions over every language (confusion columns)."""
    totals = [0, 0, 0]
    for scores in seed["test"].values():
        for row in scores["confusion"]:
            totals = [t + c for t, c in zip(totals, row)]
    n = sum(totals) or 1
    return [t / n for t in totals]


def chance_warnings(name: str, run: dict[str, Any]) -> list[str]:
    """A run that learned nothing says so: (nearly) constant predictions, or accuracy within noise of chance."""
    warnings = []
    constant = [seed["seed"] for seed in run["seeds"] if max(predicted_shares(seed)) >= CONSTANT_SHARE]
    if constant:
        warnings.append(f"{name}: seeds {', '.join(map(str, constant))} predict (nearly) one label for every "
                        "example: the model learned nothing usable")
    n = sum(scores["n"] for seed in run["seeds"] for scores in seed["test"].values())
    accuracy = run["summary"]["average"]["mean"]
    noise = 2 * math.sqrt(CHANCE * (1 - CHANCE) / max(n, 1))
    if abs(accuracy - CHANCE) <= noise:
        warnings.append(f"{name}: accuracy {_pct(accuracy)} % is within noise of chance ({_pct(CHANCE)} % ± "
                        f"{_pct(noise)} over {n} test predictions)")
    return warnings


def _our_row(name: str, run: dict[str, Any], langs: list[str]) -> list[str]:
    s, spread = run["summary"], len(run["seeds"]) > 1  # one seed has no spread to show (its 0 is no measure)

    def cell(stats: dict[str, float]) -> str:
        return f"{_pct(stats['mean'])} ± {_pct(stats['std']) if spread else '–'}"

    cells = [cell(s["test"][lang]) if lang in s["test"] else "–" for lang in langs]
    return [f"{name} (ours, {len(run['seeds'])} seeds, test)", *cells, cell(s["average"])]


def _published_row(row: dict[str, Any], langs: list[str]) -> list[str]:
    return [f"{row['name']}, {row['split']}", *[f"{row['accuracy'][lang]:.1f}" for lang in langs],
            f"{sum(row['accuracy'][lang] for lang in langs) / len(langs):.1f}"]


def _gap_row(name: str, per_lang: dict[str, float], langs: list[str]) -> list[str]:
    others = [lang for lang in langs if lang != "en"]
    gaps = [per_lang["en"] - per_lang[lang] for lang in others]
    return [name, *[f"{g:.1f}" for g in gaps], f"{sum(gaps) / max(1, len(gaps)):.1f}"]


def published_rows() -> list[dict[str, Any]]:
    return json.loads(PUBLISHED.read_text(encoding="utf-8"))["rows"]


def accuracy_sections(runs: list[dict[str, Any]], names: list[str]) -> list[Section]:
    """Our rows beside the published ones only where comparable (XNLI test, zero-shot, the 15
    languages); every other run in a table of its own, averaged over its own languages."""
    langs = list(XNLI_LANGUAGES)
    published = [row for row in published_rows() if row["split"] == "test" and row["setting"] == "zero-shot"]
    comparable = [(n, r) for n, r in zip(names, runs) if not why_not_comparable(r)]
    others = [(n, r) for n, r in zip(names, runs) if why_not_comparable(r)]
    header = ["model", *langs, "avg (15)"]
    rows = [_our_row(n, r, langs) for n, r in comparable] + [_published_row(row, langs) for row in published]
    gap_rows = [_gap_row(n, {lang: 100 * r["summary"]["test"][lang]["mean"] for lang in langs}, langs) for n, r in comparable]
    gap_rows += [_gap_row(row["name"], row["accuracy"], langs) for row in published]
    sections = [Section("Test accuracy (%): our runs beside the published results", paragraphs=[
        "XNLI test set, zero-shot cross-lingual transfer (fine-tuned on English), averages over the same 15 "
        "languages. Our rows: checkpoint selected on English dev; cells are the mean ± sample standard deviation "
        "(n − 1) over seeds, – for one seed. Published rows: checkpoint selection as their sources state it "
        "(column selection of the published rows below: stated in none of the sources checked)."],
        tables=[Table(header, rows), Table(["model", *[lang for lang in langs if lang != "en"], "avg gap"], gap_rows,
                                           "Transfer gap: English minus language (points)")])]
    if others:
        other_langs = [lang for lang in langs if any(lang in r["languages"] for _, r in others)]
        rows = [[*_our_row(n, r, other_langs), why_not_comparable(r)] for n, r in others]
        sections.append(Section("Runs not comparable with the published results", paragraphs=[
            "These runs differ from the published rows in data set, setting, languages, checkpoint selection, "
            "training data or starting head: their averages are over "
            "their own languages and are never shown beside, or averaged with, the published ones."],
            tables=[Table(["model", *other_langs, "avg (own languages)", "why not comparable"], rows)]))
    sections.append(Section("Published rows", tables=[Table(
        ["row", "source", "split", "setting", "selection", "average", "note"],
        [[row["name"], row["source"], row["split"], f"{row['setting']} ({row['setting_detail']})", row["selection"],
          f"{row['average']:.1f}", row.get("note", "")] for row in published_rows()])]))
    return sections


def _bar_chart(labels: list[str], series: list[tuple[str, list[float], list[float] | None]], ylabel: str, title: str,
               chance: float | None = None) -> bytes:
    """Grouped bars, one group per label and one bar per (name, values, error bars or None) series."""
    import numpy as np

    plt = pyplot()
    x = np.arange(len(labels))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.7), 4))
    for i, (name, values, errors) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, yerr=errors, capsize=3, label=name)
    ax.axhline(0, color="black", linewidth=0.5)
    if chance is not None:
        ax.axhline(chance, color="#c0392b", linestyle="--", linewidth=1, label=f"chance ({chance:.1f} %)")
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return png(fig)


def _plots(runs: list[dict[str, Any]], names: list[str], langs: list[str]) -> list[tuple[str, bytes]]:
    """accuracy.png (per-language bars, error bars = std over seeds, a chance line) and gap.png."""
    nan = float("nan")
    accuracy = [(name, [100 * run["summary"]["test"].get(lang, {"mean": nan})["mean"] for lang in langs],
                 [100 * run["summary"]["test"].get(lang, {"std": 0.0})["std"] for lang in langs])
                for name, run in zip(names, runs)]
    others = [lang for lang in langs if lang != "en"]
    gaps = [(name, [100 * run["summary"].get("gap", {}).get(lang, nan) for lang in others], None)
            for name, run in zip(names, runs)]
    return [("accuracy.png", _bar_chart(langs, accuracy, "test accuracy (%)", "Accuracy per language (mean ± std over seeds)",
                                        chance=100 * CHANCE)),
            ("gap.png", _bar_chart(others, gaps, "English minus language (points)", "Cross-lingual transfer gap"))]


def _model_of(model: dict[str, Any]) -> str:
    """The model folder, its engine, the checkpoint a training run's folder was resolved to, the weights'
    digest, and a classifier head kept from the folder."""
    checkpoint, digest = model.get("checkpoint"), model.get("weights_sha256")
    parts = [str(model.get("engine"))]
    if checkpoint:
        parts.append(f"checkpoint {checkpoint['tag']} (step {checkpoint['step']})")
    if digest:
        parts.append(f"weights sha256 {digest[:12]}")
    if model.get("head") == "kept":
        parts.append("its classifier head kept")
    return f"{model.get('path')} ({'; '.join(parts)})"


def _train_examples(data: dict[str, Any]) -> str:
    """The training languages, with the pairs trained on (after --max-train-examples) where recorded."""
    used = data.get("train_examples")  # results.json of before it was recorded: the languages alone
    return ", ".join(f"{lang} ({used[lang]:,} pairs)" if used else lang for lang in data["train_languages"])


def runs_section(runs: list[dict[str, Any]], names: list[str]) -> Section:
    """What each of our rows is: data, split, seeds, selection and checkpoints, languages, predictions."""
    rows, predictions = [], []
    for name, run in zip(names, runs):
        data, cfg, sel = run["data"], run["config"], run["selection"]
        picked = "; ".join(f"seed {s['seed']}: epoch {s['selected']['epoch']} step {s['selected']['step']} "
                           f"(dev {_pct(s['selected']['score'])})" for s in run["seeds"])
        missing = [lang for lang in XNLI_LANGUAGES if lang not in run["languages"]]
        files = [f for split in data["files"].values() for f in split]
        rows.append([name, f"{data['name']} ({data['root']})" + (f": {data['note']}" if data.get("note") else ""),
                     f"train {_train_examples(data)}; test", setting_of(run),
                     ", ".join(map(str, cfg["seeds"])),
                     f"{sel['split']} {', '.join(sel['languages'])}, highest mean accuracy; {picked}",
                     "all 15" if not missing else f"{len(run['languages'])}, missing {', '.join(missing)}",
                     f"{_model_of(run['model'])}; lr {cfg['learning_rate']}, "
                     f"{cfg['epochs']} epochs, batch {cfg['batch_size']}, max length {cfg['max_length']}; left out while "
                     f"reading: {sum(f['skipped_no_label'] for f in files)} unlabeled, {sum(f['malformed'] for f in files)} malformed"])
        for seed in run["seeds"]:
            shares = predicted_shares(seed)
            predictions.append([name, str(seed["seed"]), *[_pct(v) for v in shares],
                                _pct(sum(t["accuracy"] for t in seed["test"].values()) / len(seed["test"]))])
    return Section("Runs", tables=[
        Table(["run", "data", "splits", "setting", "seeds", "selection (checkpoint per seed)", "languages", "model, training"],
              rows),
        Table(["run", "seed", *[f"% predicted {label}" for label in run["labels"]], "test accuracy (avg)"], predictions,
              "Predicted labels on the test sets (all languages): a model that learned nothing predicts one label")])


def render(runs: list[dict[str, Any]], out: Path, names: list[str] | None = None) -> None:
    """Write report.md, report.html and the PNG plots for one or more runs into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    names = names or default_names(runs)
    langs = [lang for lang in XNLI_LANGUAGES if any(lang in run["languages"] for run in runs)]
    warnings = [f"{name}: {run['data']['note']}" for name, run in zip(names, runs) if run["data"].get("note")]
    warnings += [w for name, run in zip(names, runs) for w in chance_warnings(name, run)]
    datasets = sorted({run["data"]["name"] for run in runs})
    title = f"{' / '.join(datasets)} cross-lingual transfer report" + ("" if datasets == ["XNLI"] else " (not XNLI)")
    sections = [Section("Warnings", warnings=warnings)] if warnings else []
    sections += [*accuracy_sections(runs, names), Section("Plots", plots=_plots(runs, names, langs)), runs_section(runs, names)]
    write_report(str(out), title, sections)


REPORT_FILES = ("report.md", "report.html", "accuracy.png", "gap.png")
"""What :func:`render` writes: ``xeval report --out`` takes a folder holding no other file."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="results.json files (or the folders holding them)")
    parser.add_argument("--out", required=True, type=path_argument, help=f"folder for {', '.join(REPORT_FILES)}")
    parser.add_argument("--names", help="comma-separated run names for the tables (default: model folder names)")


def main(args: argparse.Namespace) -> int:
    fs.check_folder(args.out, "--out", REPORT_FILES)
    runs = [load_results(path) for path in args.results]
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and len(names) != len(runs):
        raise UserError(f"--names has {len(names)} names for {len(runs)} results files")
    if names is not None and len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise UserError(f"--names gives {twice!r} twice: each run needs a name of its own in the tables")
    render(runs, Path(args.out), names)
    print(f"wrote {args.out}/{', '.join(REPORT_FILES)}")
    return 0
