"""Per-language statistics and alpha-sampling weights (XLM-R: q_i ∝ p_i^α)."""
from __future__ import annotations

from typing import Any, Mapping

UNITS = ("characters", "documents")
EXCLUDED = ("unknown",)


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
