"""The bundled sample and the reference texts that the tests and the benchmarks both build on:
where they lie, the sample's languages and their held-out split, CCNet's cached source, and the
documents made from them (held-out documents, near copies) with the perplexity sanity measure."""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "sample"
CACHE = Path(os.environ.get("POLYGLOT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "polyglot-corpus")
CCNET = CACHE / "reference" / "cc_net-1.0.0" / "cc_net"
"""CCNet's own source, fetched from its PyPI sdist by ``workflows/setup.sh``."""
SAMPLE_LANGS = ["ar", "de", "el", "en", "es", "fr", "hi", "ru", "tr", "vi", "zh"]
HELD_OUT = 0.2


def split_reference(lang: str) -> tuple[list[str], list[str]]:
    """The sample's reference text for ``lang``: (training lines, held-out lines, the last 20 %)."""
    lines = [line for line in (SAMPLE / "ref" / f"{lang}.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    cut = int(len(lines) * (1 - HELD_OUT))
    return lines[:cut], lines[cut:]


def held_out_docs(lang: str, min_chars: int = 300) -> list[str]:
    """Held-out reference lines grouped into documents of at least ``min_chars`` (the corpus' min_length)."""
    _, held = split_reference(lang)
    docs, current = [], []
    for line in held:
        current.append(line)
        if sum(map(len, current)) >= min_chars:
            docs.append("\n".join(current))
            current = []
    return docs


def shuffled(doc: str, lang: str, rng: random.Random) -> str:
    """The document with its words shuffled (characters for Chinese, written without spaces)."""
    sep = "" if lang in ("zh", "ja", "th") else " "
    words = list(doc) if not sep else doc.split(sep)
    rng.shuffle(words)
    return sep.join(words)


def load_lm(lms: Path, lang: str) -> tuple[Any, Any]:
    """``lang``'s SentencePiece and KenLM models in folder ``lms`` (as ``pipeline.steps.lm`` names them)."""
    import kenlm
    import sentencepiece as spm

    return (spm.SentencePieceProcessor(model_file=str(lms / f"{lang}.sp.model")),
            kenlm.Model(str(lms / f"{lang}.arpa.bin")))


def sanity_rates(lms: Path, lang: str, other_lang: str | None = None) -> tuple[float, float]:
    """Share of held-out documents scoring lower than (the same text shuffled, another language's text).

    The other language is the next one in SAMPLE_LANGS unless given."""
    from pipeline.steps.perplexity import document_perplexity

    sp, lm = load_lm(lms, lang)
    rng = random.Random(0)
    docs = held_out_docs(lang)
    other = held_out_docs(other_lang or SAMPLE_LANGS[(SAMPLE_LANGS.index(lang) + 1) % len(SAMPLE_LANGS)])
    shuffled_wins = other_wins = 0
    for i, doc in enumerate(docs):
        pp = document_perplexity(doc, sp, lm)
        shuffled_wins += pp < document_perplexity(shuffled(doc, lang, rng), sp, lm)
        other_wins += pp < document_perplexity(other[i % len(other)], sp, lm)
    return shuffled_wins / len(docs), other_wins / len(docs)


def near_copy(text: str) -> str:
    """Every paragraph changed for exact dedup (a space doubled: its hash covers whitespace) but not
    for MinHash (words split on it), and one word added: a near duplicate that exact dedup keeps."""
    lines = [line.replace(" ", "  ", 1) if " " in line else line + "." for line in text.split("\n")]
    return "\n".join(lines) + " copy"
