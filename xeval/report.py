"""Re-render XNLI reports (report.md, report.html, accuracy.png, gap.png) from results.json files;
several runs are compared side by side, next to the published XLM-R and mDeBERTa-v3 rows.

Accuracy is the mean over seeds ± the sample standard deviation; the transfer gap of a language
is English accuracy minus its accuracy (XTREME's definition), the average gap is English minus
the mean of the other languages.
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from pipeline.errors import UserError

from .data import XNLI_LANGUAGES

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
    if not isinstance(results, dict) or results.get("schema") != "xeval.xnli/1":
        raise UserError(f"{file}: not an xeval results.json (schema xeval.xnli/1)")
    results["summary"] = summarize(results)
    return results


def _name(results: dict[str, Any], index: int) -> str:
    model = Path(results["model"].get("path", f"run {index + 1}")).name
    return f"{model} ({results['data']['name']})" if results["data"]["name"] != "XNLI" else model


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _rows(runs: list[dict[str, Any]], names: list[str], langs: list[str]) -> list[list[str]]:
    """The accuracy table: one row per run (mean ± std), then the published rows."""
    rows = []
    for name, run in zip(names, runs):
        s = run["summary"]
        cells = [f"{_pct(s['test'][lang]['mean'])} ± {_pct(s['test'][lang]['std'])}" if lang in s["test"] else "–"
                 for lang in langs]
        rows.append([f"{name} (ours, {len(run['seeds'])} seeds, test)", *cells,
                     f"{_pct(s['average']['mean'])} ± {_pct(s['average']['std'])}"])
    for row in json.loads(PUBLISHED.read_text(encoding="utf-8"))["rows"]:
        cells = [f"{row['accuracy'][lang]:.1f}" for lang in langs]
        rows.append([f"{row['name']}, {row['split']}", *cells, f"{sum(row['accuracy'][lang] for lang in langs) / len(langs):.1f}"])
    return rows


def _gap_rows(runs: list[dict[str, Any]], names: list[str], langs: list[str]) -> list[list[str]]:
    rows = []
    for name, run in zip(names, runs):
        gap = run["summary"].get("gap", {})
        rows.append([name, *[f"{100 * gap[lang]:.1f}" if lang in gap else "–" for lang in langs if lang != "en"],
                     f"{100 * run['summary'].get('average_gap', 0.0):.1f}"])
    for row in json.loads(PUBLISHED.read_text(encoding="utf-8"))["rows"]:
        acc = row["accuracy"]
        others = [lang for lang in langs if lang != "en"]
        rows.append([f"{row['name']}, {row['split']}", *[f"{acc['en'] - acc[lang]:.1f}" for lang in others],
                     f"{acc['en'] - sum(acc[lang] for lang in others) / max(1, len(others)):.1f}"])
    return rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _bar_chart(path: Path, labels: list[str], series: list[tuple[str, list[float], list[float] | None]],
               ylabel: str, title: str) -> None:
    """Grouped bars, one group per label and one bar per (name, values, error bars or None) series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(labels))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.7), 4))
    for i, (name, values, errors) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, yerr=errors, capsize=3, label=name)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _plots(runs: list[dict[str, Any]], names: list[str], langs: list[str], out: Path) -> list[str]:
    """accuracy.png (per-language bars, error bars = std over seeds) and gap.png (English minus language)."""
    nan = float("nan")
    accuracy = [(name, [100 * run["summary"]["test"].get(lang, {"mean": nan})["mean"] for lang in langs],
                 [100 * run["summary"]["test"].get(lang, {"std": 0.0})["std"] for lang in langs])
                for name, run in zip(names, runs)]
    _bar_chart(out / "accuracy.png", langs, accuracy, "test accuracy (%)", "Accuracy per language (mean ± std over seeds)")
    others = [lang for lang in langs if lang != "en"]
    gaps = [(name, [100 * run["summary"].get("gap", {}).get(lang, nan) for lang in others], None)
            for name, run in zip(names, runs)]
    _bar_chart(out / "gap.png", others, gaps, "English minus language (points)", "Cross-lingual transfer gap")
    return ["accuracy.png", "gap.png"]


def _notes(runs: list[dict[str, Any]], names: list[str]) -> list[str]:
    """One line per run: data (with its note), model, mode, selection, hyperparameters."""
    lines = []
    for name, run in zip(names, runs):
        data, cfg, sel = run["data"], run["config"], run["selection"]
        picked = ", ".join(f"seed {s['seed']}: epoch {s['selected']['epoch']} step {s['selected']['step']} "
                           f"(dev {_pct(s['selected']['score'])})" for s in run["seeds"])
        note = f" **{data['note']}**" if data.get("note") else ""
        files = [f for split in data["files"].values() for f in split]
        left_out = (f" Left out while reading: {sum(f['skipped_no_label'] for f in files)} unlabeled, "
                    f"{sum(f['malformed'] for f in files)} malformed.")
        lines.append(f"{name}: data {data['name']} ({data['root']}){note}; mode {run['mode']}, trained on "
                     f"{', '.join(data['train_languages'])}; model {run['model'].get('path')} "
                     f"(engine {run['model'].get('engine')}, {run['model'].get('class')}); selection on "
                     f"{sel['split']} {', '.join(sel['languages'])}: {picked}; lr {cfg['learning_rate']}, "
                     f"epochs {cfg['epochs']}, batch {cfg['batch_size']}, max length {cfg['max_length']}, "
                     f"warmup {cfg['warmup']}, seeds {', '.join(map(str, cfg['seeds']))}.{left_out}")
    return lines


def render(runs: list[dict[str, Any]], out: Path, names: list[str] | None = None) -> None:
    """Write report.md, report.html and the PNG plots for one or more runs into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    names = names or [_name(run, i) for i, run in enumerate(runs)]
    langs = [lang for lang in XNLI_LANGUAGES if any(lang in run["languages"] for run in runs)]
    header = ["model", *langs, "avg"]
    rows = _rows(runs, names, langs)
    gap_header = ["model", *[lang for lang in langs if lang != "en"], "avg gap"]
    gap_rows = _gap_rows(runs, names, langs) if "en" in langs else []
    plots = _plots(runs, names, langs, out)
    notes = _notes(runs, names)
    warnings = [f"{name}: {run['data']['note']}" for name, run in zip(names, runs) if run["data"].get("note")]
    published_note = ("Published rows: XLM-R base and large from the XLM-R paper (Conneau et al. 2020, Table 1, "
                      "cross-lingual transfer, **test** set); mDeBERTa-v3 base from its model card (**dev** set). "
                      "Averages of published rows are over the languages shown.")
    datasets = sorted({run["data"]["name"] for run in runs})
    title = f"{' / '.join(datasets)} cross-lingual transfer report" + ("" if datasets == ["XNLI"] else " (not XNLI)")
    md = [f"# {title}", ""]
    md += [f"> **{w}**" for w in warnings] + ([""] if warnings else [])
    md += ["## Test accuracy (%)", "", *_markdown_table(header, rows), "", published_note, ""]
    if gap_rows:
        md += ["## Transfer gap (English minus language, points)", "", *_markdown_table(gap_header, gap_rows), ""]
    md += ["## Plots", "", *[f"![{p}]({p})" for p in plots], "", "## Runs", "", *[f"- {n}" for n in notes], ""]
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")
    images = "".join(f'<figure><img alt="{p}" src="data:image/png;base64,'
                     f'{base64.b64encode((out / p).read_bytes()).decode()}"><figcaption>{p}</figcaption></figure>'
                     for p in plots)
    page = ["<!DOCTYPE html>", f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>',
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}td:first-child{text-align:left}"
            ".warn{background:#fee;border:1px solid #c00;padding:.5em}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            *[f'<p class="warn"><strong>{html.escape(w)}</strong></p>' for w in warnings],
            "<h2>Test accuracy (%)</h2>", _html_table(header, rows),
            f"<p>{html.escape(published_note.replace('**', ''))}</p>"]
    if gap_rows:
        page += ["<h2>Transfer gap (English minus language, points)</h2>", _html_table(gap_header, gap_rows)]
    page += ["<h2>Plots</h2>", images, "<h2>Runs</h2><ul>",
             *[f"<li>{html.escape(n.replace('**', ''))}</li>" for n in notes], "</ul></body></html>"]
    (out / "report.html").write_text("\n".join(page) + "\n", encoding="utf-8")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="results.json files (or the folders holding them)")
    parser.add_argument("--out", required=True, help="folder for report.md, report.html, accuracy.png, gap.png")
    parser.add_argument("--names", help="comma-separated run names for the tables (default: model folder names)")


def main(args: argparse.Namespace) -> int:
    runs = [load_results(path) for path in args.results]
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and len(names) != len(runs):
        raise UserError(f"--names has {len(names)} names for {len(runs)} results files")
    render(runs, Path(args.out), names)
    print(f"wrote {args.out}/report.md, report.html, accuracy.png, gap.png")
    return 0
