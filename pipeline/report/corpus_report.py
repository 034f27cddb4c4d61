"""The corpus report: ``report/`` beside the shards, built from ``stats.json`` and ``sampling.json``
alone, so it works on a corpus in a bucket and on an older corpus too (``python -m pipeline report
CORPUS [--out DIR]``), and is the same bytes for the same input and config (nothing from run.json).

Sections, each a plot and a table: the funnel (documents after every stage, every counter by step
and reason, drops per language), documents and characters per language, alpha-sampling (p_i and
q_i for the configured α and for 0.7 / 0.3 / 0), perplexity histograms with the head/tail cutoffs
and bucket shares, near-duplicate cluster sizes, rejected and skipped records, and the config and
versions that produced the corpus.
"""
from __future__ import annotations

import json
import math
from typing import Any

from ..output import fs
from ..output.layout import REPORT
from ..steps.near_dedup import CLUSTER_SIZES, NearDedup
from ..util.errors import UserError
from .html import Section, Table, png, pyplot, render_report, write_files
from .sampling import left_out_warning, sampling_weights

ALPHAS = (0.7, 0.3, 0.0)  # XLM-R's paper compares these (α = 0: every language the same share)
BUCKET_ORDER = ("head", "middle", "tail", "all")


STATS_KEYS = ("counters", "languages", "config", "input_files")
STAGE_LABELS = {"dedup": "after exact dedup", "lid": "after language ID", NearDedup.name: "after near-dup",
                "perplexity": "after perplexity filters"}
LEGACY_STEPS = ["dedup", "lid", NearDedup.name, "perplexity"]
"""The order of a stats.json written before profiles listed their steps (near-dup after lid)."""
LEGACY_NAMES = {"neardup": NearDedup.name, "neardup_cluster_sizes": CLUSTER_SIZES}
SAMPLING_KEYS = ("alpha", "unit", "languages")


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _percent(share: float) -> str:
    """A share (0..1) as a percentage of two decimals; one too small to show so is "<0.01", not 0.00."""
    return "<0.01" if 0 < share < 0.00005 else f"{100 * share:.2f}"


def _stages(stats: dict[str, Any]) -> list[tuple[str, int]]:
    """(stage, documents after it) in graph order, from the counters."""
    c = stats["counters"]
    read = c.get("read", {})
    records = read.get("documents", 0) + read.get("too_short", 0) + sum(
        v for k, v in read.items() if k.startswith(("skipped_", "rejected_")))
    stages = [("records read", records), ("documents parsed", read.get("documents", 0))]
    for step in stats["config"].get("steps", LEGACY_STEPS):
        if step in c:
            stages.append((STAGE_LABELS.get(step, f"after {step}"), c[step].get("documents_out", 0)))
    stages.append(("written", c.get("write", {}).get("documents", 0)))
    return stages


def _short(value: float, _: Any = None) -> str:
    """Axis labels: 200, 5k, 2M."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:g}{suffix}"
    return f"{value:g}"


def _log_axis(ax: Any, bars: bool = False) -> None:
    """A log x axis with 1-2-5 ticks labelled plainly (no overlapping minor labels); bars start at 1."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_xscale("log")
    if bars:
        ax.set_xlim(left=1)
    low, high = ax.get_xlim()
    subs = (1.0, 2.0, 5.0) if math.log10(high / low) <= 3 else (1.0,)  # fewer labels over many decades
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(_short))
    ax.xaxis.set_minor_locator(NullLocator())


def _hbar(labels: list[str], series: list[tuple[str, list[float]]], xlabel: str, title: str,
          log: bool = False) -> bytes:
    """Horizontal grouped bars, one row per label (readable with many languages)."""
    plt = pyplot()
    height = max(2.5, 0.28 * len(labels) * max(1, len(series) * 0.6) + 1.2)
    fig, ax = plt.subplots(figsize=(8, height))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series):
        ax.barh([y + (i - (len(series) - 1) / 2) * width for y in range(len(labels))], values, width, label=name)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    if log:
        _log_axis(ax, bars=True)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    if len(series) > 1:  # below the plot, where it covers no bar
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.7 / height - 0.02),
                  ncol=min(len(series), 2), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return png(fig)


def _panels(labels: list[str], series: list[tuple[str, list[float]]], title: str) -> bytes:
    """One log-scale panel of horizontal bars per series, side by side, languages on the shared axis."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(series), figsize=(4 * len(series), max(2.5, 0.28 * len(labels) + 1.2)), sharey=True)
    for ax, (name, values) in zip(axes, series):
        ax.barh(range(len(labels)), values, 0.7, color="#4c72b0")
        _log_axis(ax, bars=True)
        ax.set_xlabel(name)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels)
    axes[0].invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    return png(fig)


def _empty_plot(title: str, message: str) -> bytes:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 1.8))
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.4, message, ha="center", va="center", fontsize=11)
    return png(fig)


def funnel_section(stats: dict[str, Any]) -> Section:
    stages = _stages(stats)
    rows = [[name, _n(n), _n(stages[i - 1][1] - n) if i else ""] for i, (name, n) in enumerate(stages)]
    counters = [[step, name, _n(v)] for step, names in sorted(stats["counters"].items()) if step != CLUSTER_SIZES
                for name, v in sorted(names.items()) if "/" not in name]
    per_lang: dict[str, dict[str, int]] = {}
    for step, names in stats["counters"].items():
        for name, v in names.items():
            if "/" in name:
                reason, lang = name.rsplit("/", 1)
                per_lang.setdefault(lang, {})[f"{step}: {reason}"] = v
    reasons = sorted({r for counts in per_lang.values() for r in counts})
    languages = stats["languages"]
    lang_rows = [[lang, _n(languages.get(lang, {}).get("documents", 0)), *[_n(per_lang.get(lang, {}).get(r, 0)) for r in reasons]]
                 for lang in sorted(set(per_lang) | set(languages))]
    return Section("Funnel: documents after each stage", paragraphs=[
        "Records read counts every record of the input (documents, skipped records such as warcinfo, rejected "
        "records); each later stage's documents are those it passed on."],
        plots=[("funnel.png", _hbar([s for s, _ in stages], [("documents", [n for _, n in stages])], "documents",
                                    "Documents after each stage"))],
        tables=[Table(["stage", "documents", "removed by the stage"], rows),
                Table(["step", "counter", "count"], counters, "Every counter, by step"),
                Table(["language", "kept", *reasons], lang_rows, "Per language: kept documents and drops (the language "
                                                                 "LID predicted, or the document's language)")])


def languages_section(stats: dict[str, Any]) -> Section:
    langs = stats["languages"]
    names = sorted(langs, key=lambda lang: -langs[lang]["characters"])
    total = sum(v["characters"] for v in langs.values()) or 1
    rows = [[lang, _n(langs[lang]["documents"]), _n(langs[lang]["characters"]), _percent(langs[lang]["characters"] / total)]
            for lang in names]
    plot = _panels(names, [("documents", [langs[lang]["documents"] for lang in names]),
                           ("characters", [langs[lang]["characters"] for lang in names])],
                   "Documents and characters per language (log scale)") if names else \
        _empty_plot("Documents and characters per language", "the corpus is empty")
    return Section("Languages", paragraphs=["Tokens are not counted by the pipeline (see pretrain tokenize's meta.json)."],
                   plots=[("languages.png", plot)],
                   tables=[Table(["language", "documents", "characters", "% of characters"], rows)])


def sampling_section(sampling: dict[str, Any]) -> Section:
    langs = sampling["languages"]
    alpha = sampling["alpha"]
    sizes = {lang: v["n"] for lang, v in langs.items()}
    alphas = [alpha] + [a for a in ALPHAS if a != alpha]
    weights = {a: sampling_weights(sizes, a) if a > 0 else {lang: {"q": 1 / len(sizes)} for lang in sizes}
               for a in alphas}
    names = sorted(langs, key=lambda lang: -langs[lang]["p"])
    series = [("p_i (corpus share)", [100 * langs[lang]["p"] for lang in names])]
    series += [(f"q_i, α = {a:g}" + (" (configured)" if a == alpha else ""), [100 * weights[a][lang]["q"] for lang in names])
               for a in alphas]
    rows = [[lang, _n(langs[lang]["n"]), _percent(langs[lang]["p"]),
             *[_percent(weights[a][lang]["q"]) for a in alphas]] for lang in names]
    plot = _hbar(names, series, "share of the training mix (%)", f"Alpha-sampling over {sampling['unit']}") if names else \
        _empty_plot("Alpha-sampling", "no language to sample")
    buckets = sampling.get("buckets", "all")
    tables = [Table(["language", "n_i", "p_i %", *[f"q_i % (α={a:g})" for a in alphas]], rows)]
    paragraphs = [
        f"q_i ∝ p_i^α over n_i = {sampling['unit']} per language (buckets: {buckets if isinstance(buckets, str) else ', '.join(buckets)}); "
        f"α = {alpha:g} is configured (XLM-R: 0.3). Smaller α raises low-resource languages; α = 0 samples every language equally."]
    rehydration = sampling.get("rehydration")
    if rehydration:
        schedule = ", ".join(f"x{times} from {size}" for size, times in rehydration["schedule"])
        paragraphs.append(f"Rehydrated (FineWeb-2): a kept document counts as many times as its near-duplicate cluster's "
                          f"size says ({schedule}); n_i above counts the copies.")
        tables.append(Table(["language", "documents", "documents rehydrated", "characters", "characters rehydrated"],
                            [[lang, _n(row["documents"]), _n(row["documents_rehydrated"]), _n(row["characters"]),
                              _n(row["characters_rehydrated"])] for lang, row in rehydration["languages"].items()]))
    warning = left_out_warning(sampling)
    return Section("Alpha-sampling", warnings=[warning] if warning else [], paragraphs=paragraphs,
                   plots=[("sampling.png", plot)], tables=tables)


def _median(histogram: list[list[int]], base: float) -> float:
    total = sum(c for _, c in histogram)
    seen = 0
    for b, c in histogram:
        seen += c
        if seen * 2 >= total:
            return base ** (b + 0.5)
    return float("nan")


def perplexity_section(stats: dict[str, Any]) -> Section:
    report = stats.get("perplexity") or {}
    langs = report.get("languages", {})
    heading = "Perplexity and buckets"
    if not langs:
        return Section(heading, paragraphs=["No document was scored (perplexity.models not set): every document is in bucket all."],
                       plots=[("perplexity.png", _empty_plot("Perplexity per language", "no perplexity scores"))])
    base = report["bin_base"]
    chosen = stats.get("config", {}).get("perplexity", {})
    head_p, tail_p = f"p{chosen.get('head', 30)}", f"p{chosen.get('tail', 60)}"
    plt = pyplot()
    names = sorted(langs)
    cols = min(4, len(names))
    rows_n = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.2 * cols, 2.4 * rows_n), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_axis_off()
    table = []
    for ax, lang in zip(axes.flat, names):
        histogram, cutoffs = langs[lang]["histogram"], langs[lang].get("cutoffs")
        coarse: dict[int, int] = {}
        for b, c in histogram:  # 10 % wide bins for the plot
            coarse[b // 10] = coarse.get(b // 10, 0) + c
        edges = [base ** (10 * k) for k in sorted(coarse)]
        ax.bar(edges, [coarse[k] for k in sorted(coarse)], width=[e * (base ** 10 - 1) for e in edges], align="edge",
               color="#4c72b0")
        _log_axis(ax)
        for name, color in (("head", "#2a9d3f"), ("tail", "#c0392b")):
            if cutoffs:
                ax.axvline(cutoffs[name], color=color, linestyle="--", linewidth=1.2,
                           label=f"{head_p if name == 'head' else tail_p} {cutoffs[name]:g}")
        buckets = stats["languages"].get(lang, {}).get("buckets", {})
        total = sum(b["documents"] for b in buckets.values()) or 1
        shares = {k: 100 * buckets.get(k, {}).get("documents", 0) / total for k in BUCKET_ORDER}
        ax.set_title(f"{lang}: n={sum(c for _, c in histogram)}", fontsize=9)
        ax.set_xlabel("perplexity (log)", fontsize=8)
        ax.tick_params(labelsize=7)
        if cutoffs:
            ax.legend(fontsize=6)
        table.append([lang, _n(sum(c for _, c in histogram)), f"{_median(histogram, base):.0f}",
                      f"{cutoffs['head']:g}" if cutoffs else "–", f"{cutoffs['tail']:g}" if cutoffs else "–",
                      *[f"{shares[k]:.1f}" for k in BUCKET_ORDER]])
    fig.suptitle(f"Perplexity per language, with the head ({head_p}) and tail ({tail_p}) cutoffs")
    fig.tight_layout()
    return Section(heading, paragraphs=[
        "Histograms of the scored documents the corpus kept (not those perplexity.drop_buckets or max_perplexity "
        f"dropped: the funnel counts them), 10 % wide bins on a log axis; a document is head below the {head_p} "
        f"cutoff, middle below {tail_p}, tail from there; languages without cutoffs are all."],
        plots=[("perplexity.png", png(fig))],
        tables=[Table(["language", "scored", "median", "head below", "tail from", *[f"% {k}" for k in BUCKET_ORDER]], table)])


def neardup_section(stats: dict[str, Any]) -> Section:
    counters = stats["counters"]
    heading = "Near-duplicates"
    if NearDedup.name not in counters:
        return Section(heading, paragraphs=["Near-dup was off for this corpus."],
                       plots=[("near_dedup.png", _empty_plot("Near-duplicate clusters", "near-dup was off"))])
    sizes = sorted((int(k), v) for k, v in counters.get(CLUSTER_SIZES, {}).items())
    near = counters[NearDedup.name]
    removed = near.get("near_duplicate", 0)
    if sizes:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.bar([str(s) for s, _ in sizes], [v for _, v in sizes], color="#8172b2")
        ax.set_xlabel("documents in the cluster")
        ax.set_ylabel("clusters")
        ax.set_title("Near-duplicate clusters by size (one document of each kept)")
        fig.tight_layout()
        plot = png(fig)
    else:
        plot = _empty_plot("Near-duplicate clusters", "no near-duplicate cluster found")
    return Section(heading, paragraphs=[
        f"{_n(near.get('documents_in', 0))} documents compared (MinHash LSH), {_n(removed)} removed as near-duplicates of "
        f"a kept document, in {_n(sum(v for _, v in sizes))} clusters of two or more."],
        plots=[("near_dedup.png", plot)],
        tables=[Table(["cluster size", "clusters", "documents removed"], [[str(s), _n(v), _n(v * (s - 1))] for s, v in sizes])])


def rejected_section(stats: dict[str, Any]) -> Section:
    read = stats["counters"].get("read", {})
    reasons = sorted(((k, v) for k, v in read.items() if k.startswith(("rejected_", "skipped_"))), key=lambda kv: -kv[1])
    rejected = sum(v for k, v in reasons if k.startswith("rejected_"))
    plot = (_hbar([k for k, _ in reasons], [("records", [v for _, v in reasons])], "records (log scale)",
                  "Rejected and skipped records by reason", log=True) if reasons
            else _empty_plot("Rejected and skipped records", "none"))
    return Section("Rejected and skipped records", paragraphs=[
        f"{_n(rejected)} records rejected (bad input: listed one by one in rejected/, with file and offset; "
        f"rejected_unreadable_file counts input files that could not be read); skipped records are normal records "
        "that are not text (warcinfo, non-HTML responses)."],
        warnings=[f"{_n(rejected)} records of the input were rejected"] if rejected else [],
        plots=[("rejected.png", plot)], tables=[Table(["reason", "records"], [[k, _n(v)] for k, v in reasons])])


def _flat(prefix: str, value: Any) -> list[list[str]]:
    if isinstance(value, dict):
        return [row for k, v in sorted(value.items()) for row in _flat(f"{prefix}.{k}" if prefix else k, v)]
    return [[prefix, json.dumps(value, ensure_ascii=False)]]


def config_section(stats: dict[str, Any]) -> Section:
    tables = [Table(["key", "value"], _flat("", stats["config"]), "Config")]
    if stats.get("versions"):
        tables.append(Table(["package", "version"], [[k, v] for k, v in sorted(stats["versions"].items())],
                            "Versions (of the worker that wrote stats.json)"))
    return Section("Config and versions", paragraphs=[f"{stats['input_files']} input files."], tables=tables)


REPORT_FILES = ("report.md", "report.html", "funnel.png", "languages.png", "sampling.png", "perplexity.png",
                "near_dedup.png", "rejected.png")
"""Every file :func:`build` writes: ``report --out`` takes a folder holding no other."""


def inputs(corpus: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``stats.json`` and ``sampling.json`` of the corpus in folder ``corpus``: what a report is drawn from."""
    return (fs.read_json(fs.join(corpus, "stats.json"), STATS_KEYS),
            fs.read_json(fs.join(corpus, "sampling.json"), SAMPLING_KEYS))


def render(stats: dict[str, Any], sampling: dict[str, Any], source: str = "stats.json") -> list[tuple[str, bytes]]:
    """The report's files (``html.render_report``) from :func:`inputs`; ``source`` names the
    stats file in the error for one that is not as ``pipeline run`` writes it."""
    try:
        stats = {**stats, "counters": {LEGACY_NAMES.get(step, step): names for step, names in stats["counters"].items()}}
        kept = sum(v["documents"] for v in stats["languages"].values())
        intro = [f"{kept:,} documents in {len(stats['languages'])} languages from {stats['input_files']} input files "
                 "(stats.json and sampling.json beside this folder; run.json has the runner and the time taken)."]
        sections = [funnel_section(stats), languages_section(stats), sampling_section(sampling),
                    perplexity_section(stats), neardup_section(stats), rejected_section(stats), config_section(stats)]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a file edited by hand, or not ours
        raise UserError(f"{source} or sampling.json: not as pipeline run writes them "
                        f"({type(exc).__name__}: {exc})") from None
    return render_report("Corpus report", sections, intro)


def build(corpus: str, out: str | None = None) -> list[str]:
    """Write the report of the corpus in folder ``corpus`` (local or a bucket) to ``out``
    (default ``<corpus>/report``); returns the written paths."""
    return write_files(out or fs.join(corpus, REPORT), render(*inputs(corpus), source=fs.join(corpus, "stats.json")))
