"""stats.json and sampling.json from the run's sums: per-language totals, perplexity histograms and
deciles, the alpha-sampling weights, the counters of every step, the config and versions."""
from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable

import pyarrow as pa

from ..output import fs
from ..output.layout import IO_FILE
from ..output.shards import cluster_sums, partition_sums
from .sampling import left_out, rehydrated, sampling_report

if TYPE_CHECKING:
    from ..config import CorpusConfig

Counts = dict[str, dict[str, int]]
IO_STEP = "io"
"""Counts of the stores' weather (S3 retries): they go to run.json, not stats.json, so that a run
that met throttling writes the same stats.json, shards and sampling.json as one that did not."""
"""``{step: {name: n}}``, both levels sorted: what stats.json's ``counters`` holds."""
DECILE_BIN = 1.01  # perplexity histogram bins grow by 1 %: deciles exact to 1 %, and deterministic
Totals = dict[tuple[str, str], tuple[int, int, int]]
Bins = Counter[tuple[str, int]]
Clusters = dict[tuple[str, str, int], tuple[int, int]]
"""``(lang, bucket, minhash_cluster_size) -> (documents, characters)``: what rehydration repeats."""
Stats = tuple[Totals, Bins, Clusters]


def perplexity_bins(table: pa.Table) -> Bins:
    """``{(lang, bin): documents}`` of the scored documents of a table."""
    langs, perplexities = table.column("lang").to_pylist(), table.column("perplexity").to_pylist()
    return Counter((lang, int(math.floor(math.log(max(pp, 1e-3), DECILE_BIN))))
                   for lang, pp in zip(langs, perplexities) if pp is not None)


def table_stats(table: pa.Table) -> Stats:
    """One table's ``(totals, bins, clusters)``: per ``(lang, bucket)`` the (documents, characters,
    UTF-8 bytes) of its rows, the perplexity histogram, and documents and characters per cluster size."""
    return dict(partition_sums(table)), perplexity_bins(table), dict(cluster_sums(table))


def perplexity_deciles(bins: Bins) -> dict[str, list[float]]:
    """Per language, the deciles of its histogram (languages without scores are left out)."""
    by_lang: dict[str, list[tuple[int, int]]] = {}
    for (lang, b), count in bins.items():
        by_lang.setdefault(lang, []).append((b, count))
    return {lang: deciles(lang_bins) for lang, lang_bins in sorted(by_lang.items())}


def deciles(bins: Iterable[tuple[int, int]]) -> list[float]:
    """Deciles (0, 10, ..., 100th percentile) of one language's perplexity histogram."""
    ordered = sorted(bins)
    total = sum(count for _, count in ordered)
    result, seen, it = [], 0, iter(ordered)
    b, count = next(it)
    for decile in range(11):
        target = decile * (total - 1) / 10
        while seen + count <= target:
            seen += count
            b, count = next(it)
        result.append(round(DECILE_BIN ** (b + 0.5), 1))
    return result


def sum_columns(values: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    """Column sums of rows such as ``(documents, characters, bytes)``."""
    return tuple(map(sum, zip(*values)))


def corpus_summary(totals: Totals, quantiles: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per language: documents, characters, the same per bucket, and perplexity deciles."""
    summary: dict[str, dict[str, Any]] = {}
    for (lang, bucket), (documents, characters, _) in sorted(totals.items()):
        entry = summary.setdefault(lang, {"documents": 0, "characters": 0, "buckets": {}})
        entry["documents"] += documents
        entry["characters"] += characters
        entry["buckets"][bucket] = {"documents": documents, "characters": characters}
    for lang, values in quantiles.items():
        summary[lang]["perplexity_deciles"] = values
    return summary


def perplexity_report(bins: Bins, bucket_cutoffs: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per scored language: its perplexity histogram (``[bin, documents]``, bin b holding
    perplexities in [1.01^b, 1.01^(b+1))) and the head/tail cutoffs its buckets used."""
    report: dict[str, Any] = {}
    for (lang, b), count in sorted(bins.items()):
        report.setdefault(lang, {"histogram": []})["histogram"].append([b, count])
    for lang, entry in report.items():
        if lang in bucket_cutoffs:
            entry["cutoffs"] = bucket_cutoffs[lang]
    return {"bin_base": DECILE_BIN, "languages": report} if report else {}


DISTRIBUTIONS = ("polyglot-corpus", "apache-beam", "pyarrow", "fastwarc", "resiliparse", "warcio", "fasttext-numpy2",
                 "kenlm", "sentencepiece", "datasketch", "numpy", "xxhash", "regex")
"""The distributions every run's stats.json names (where installed), besides those of its steps."""


MODULE_DISTRIBUTIONS = {"fasttext": "fasttext-numpy2", "kenlm": "kenlm", "sentencepiece": "sentencepiece",
                        "ftfy": "ftfy", "ahocorasick": "pyahocorasick", "tldextract": "tldextract", "spacy": "spacy",
                        "jieba": "jieba", "pyvi": "pyvi", "pythainlp": "pythainlp", "indicnlp": "indic-nlp-library",
                        "sudachipy": "sudachipy", "sudachidict_core": "sudachidict-core", "datasketch": "datasketch"}
"""The distribution of each module the built-in steps import (``packages_distributions`` takes 0.2 s)."""


def step_modules(cfg: CorpusConfig, counters: Counts, languages: Iterable[str]) -> set[str]:
    """The modules the run's steps decide with: their ``worker_modules``, and where a step splits
    words, the word tokenizers of the languages it saw: those of the corpus (``languages``) and
    those its counters and the later steps' name (``reason/<lang>``: documents dropped from then on)."""
    from ..steps.words import tokenizer_modules

    modules = set(cfg.worker_modules())
    classes = cfg.active_step_classes()
    first = next((i for i, cls in enumerate(classes) if cls.splits_words(cfg.section(cls.name))), None)
    if first is not None:
        seen = {*languages, *(name.split("/", 1)[1] for cls in classes[first:]
                              for name in counters.get(cls.name, {}) if "/" in name)}
        modules.update(module for lang in seen for module in tokenizer_modules(lang))
    return modules


def versions(modules: Iterable[str] = ()) -> dict[str, str]:
    """Python's and the installed versions of what shapes the corpus, as the worker writing
    stats.json has them: :data:`DISTRIBUTIONS` and those of ``modules`` (:func:`step_modules`)."""
    import platform
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    names = set(DISTRIBUTIONS)
    unknown = {module.partition(".")[0] for module in modules} - set(MODULE_DISTRIBUTIONS)
    names.update(MODULE_DISTRIBUTIONS[module.partition(".")[0]] for module in modules
                 if module.partition(".")[0] in MODULE_DISTRIBUTIONS)
    if unknown:  # (a plugin's: every installed distribution's files read, 0.2 s)
        by_module = packages_distributions()
        names.update(name for module in unknown for name in by_module.get(module, ()))
    found = {"python": platform.python_version()}
    for name in sorted(names):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def write_artifacts(counters: Counts, corpus: Stats, cfg: CorpusConfig, n_files: int,
                    bucket_cutoffs: dict[str, dict[str, float]]) -> None:
    """``sampling.json`` (weights over the configured buckets, rehydrated when
    ``sampling.rehydration`` is set, the languages those buckets leave out, and the corpus summary) and ``stats.json`` (counters of every
    step, per-language totals, perplexity histograms and cutoffs, the config). ``bucket_cutoffs``:
    per language, the head and tail perplexities its buckets used. Both depend only on the input
    and config: what differs per run (runner, time, the store's retries) goes to run.json; the
    retries wait for it in the staging folder's :data:`~pipeline.output.layout.IO_FILE`."""
    totals, bins, clusters = corpus
    summary = corpus_summary(totals, perplexity_deciles(bins))
    counted = {(lang, size): (0, 0) for (lang, bucket, size) in clusters}
    for (lang, bucket, size), sums in clusters.items():
        if not cfg.sampling.buckets or bucket in cfg.sampling.buckets:
            counted[(lang, size)] = sum_columns([counted[(lang, size)], sums])
    schedule = cfg.sampling.rehydration
    languages = rehydrated(counted, schedule)
    suffix = "_rehydrated" if schedule else ""
    report = sampling_report({lang: {unit: row[unit + suffix] for unit in ("documents", "characters")}
                              for lang, row in languages.items()}, cfg.sampling.alpha, cfg.sampling.unit)
    report["buckets"] = cfg.sampling.buckets or "all"
    if unweighed := left_out(summary, cfg.sampling.buckets):  # (the key only then: other runs' bytes unchanged)
        report["left_out"] = unweighed
    if schedule:
        report["rehydration"] = {"schedule": schedule, "languages": languages}
    report["corpus"] = summary
    fs.write_json(fs.join(cfg.output, "sampling.json"), report)
    if io := counters.get(IO_STEP):  # how the store behaved differs per run: run.json takes it (run.py)
        fs.write_json(fs.join(cfg.output, IO_FILE), io)
    fs.write_json(fs.join(cfg.output, "stats.json"), {
        "input_files": n_files,
        "counters": {step: counts for step, counts in counters.items() if step != IO_STEP},
        "languages": summary,
        "perplexity": perplexity_report(bins, bucket_cutoffs),
        "config": cfg.to_dict(),
        "versions": versions(step_modules(cfg, counters, summary)),
    })


