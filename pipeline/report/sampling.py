"""Per-language statistics and alpha-sampling weights (XLM-R: q_i ∝ p_i^α)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

UNITS = ("characters", "documents")
EXCLUDED = ("unknown",)


def check_alpha(alpha: float) -> str:
    """What is wrong with the sampling exponent ``alpha`` ("" if nothing): it is in (0, 1]."""
    return "" if 0 < alpha <= 1 else f"{alpha}: must be in (0, 1]"


def sampling_weights(sizes: Mapping[str, int], alpha: float) -> dict[str, dict[str, float]]:
    """p_i = n_i / Σn and q_i = p_i^α / Σ p_j^α for every language with n_i > 0.

    Sums run in language order: the same sizes give the same bits however they were gathered.
    """
    sizes = {lang: n for lang, n in sorted(sizes.items()) if n > 0}
    total = sum(sizes.values())
    if not total:
        return {}
    p = {lang: n / total for lang, n in sizes.items()}
    z = sum(v ** alpha for v in p.values())
    return {lang: {"n": sizes[lang], "p": p[lang], "q": p[lang] ** alpha / z} for lang in sorted(sizes)}


def sampling_report(languages: Mapping[str, Mapping[str, int]], alpha: float, unit: str) -> dict[str, Any]:
    """``sampling.json``: α, unit and n_i, p_i, q_i per language (``unknown`` left out)."""
    sizes = {lang: counts[unit] for lang, counts in languages.items() if lang not in EXCLUDED}
    return {"alpha": alpha, "unit": unit, "languages": sampling_weights(sizes, alpha)}


def left_out(corpus: Mapping[str, Mapping[str, Any]], buckets: Iterable[str]) -> dict[str, str]:
    """``{lang: why}`` for the languages of the corpus summary (``unknown`` aside) that have documents
    but none in ``buckets`` (``sampling.buckets``; empty: every bucket): they get no weight."""
    chosen = set(buckets)
    return {lang: f"its {entry['documents']} documents are in bucket {', '.join(sorted(entry['buckets']))}, "
                  f"none in sampling.buckets"
            for lang, entry in sorted(corpus.items())
            if chosen and lang not in EXCLUDED and entry["documents"] and not chosen & set(entry["buckets"])}


def left_out_warning(report: Mapping[str, Any]) -> str | None:
    """The warning line for sampling.json's ``left_out`` languages, or None when it has none."""
    langs = sorted(report.get("left_out") or ())
    if not langs:
        return None
    buckets = report.get("buckets")
    return (f"sampling.json gives no weight to {', '.join(langs)}: {'they have' if len(langs) > 1 else 'it has'} "
            f"documents, but none in sampling.buckets [{', '.join(buckets) if isinstance(buckets, list) else buckets}] "
            "(its left_out says where they are)")


FINEWEB2_REHYDRATION = ((1, 1), (2, 2), (3, 3), (5, 5), (100, 8), (1000, 1))
"""FineWeb-2's schedule, (smallest cluster size, copies): x1 for 1, x2 for 2, x3 for 3-4, x5 for
5-99, x8 for 100-999, x1 for 1000 and more (a cluster that large is spam, not popularity)."""


MAX_COPIES = 1000
"""The most copies a rehydration schedule may give a document (FineWeb-2's most is 8): more is no
weighting but a typo, and its tokens would not fit in memory."""


def check_rehydration(schedule: list[list[int]]) -> str | None:
    """What is wrong with a rehydration schedule (None when nothing is): [size, copies] pairs,
    sizes rising from 1, copies from 1 to :data:`MAX_COPIES`."""
    if not schedule:
        return None
    if any(len(pair) != 2 or not 1 <= pair[1] <= MAX_COPIES for pair in schedule):
        return f"expected [smallest cluster size, copies from 1 to {MAX_COPIES}] pairs, got {schedule!r}"
    sizes = [pair[0] for pair in schedule]
    if sizes[0] != 1 or sizes != sorted(set(sizes)):
        return f"cluster sizes must rise from 1 without repeats, got {sizes}"
    return None


def copies(cluster_size: int, schedule: Iterable[Iterable[int]]) -> int:
    """How many times a kept document of a near-duplicate cluster of ``cluster_size`` is repeated
    (the copies of the largest schedule size at most ``cluster_size``; 1 without a schedule)."""
    n = 1
    for size, times in schedule:
        if cluster_size < size:
            break
        n = times
    return n


def rehydrated(sizes: Mapping[tuple[str, int], tuple[int, int]], schedule: Iterable[Iterable[int]]
               ) -> dict[str, dict[str, int]]:
    """Per language, documents and characters before and after rehydration, from the
    ``(lang, cluster size) -> (documents, characters)`` sums."""
    schedule = [tuple(pair) for pair in schedule]
    out: dict[str, dict[str, int]] = {}
    for (lang, size), (documents, characters) in sorted(sizes.items()):
        entry = out.setdefault(lang, {"documents": 0, "characters": 0, "documents_rehydrated": 0,
                                      "characters_rehydrated": 0})
        times = copies(size, schedule)
        entry["documents"] += documents
        entry["characters"] += characters
        entry["documents_rehydrated"] += documents * times
        entry["characters_rehydrated"] += characters * times
    return out
