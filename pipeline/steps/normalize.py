"""CCNet's text normalization and paragraph hashing.

Two normalizations, both behaving exactly as ``cc_net/text_normalizer.py`` so that CCNet's
published SentencePiece/KenLM models and dedup hashes give CCNet's numbers:

* :func:`normalize` (perplexity): strip, lowercase, strip accents (NFD, drop combining marks;
  like CCNet the NFD form is kept even when nothing was dropped), every Unicode digit -> ``0``,
  CCNet's Unicode punctuation replaced by ASCII, control characters (U+0000-U+001F,
  U+007F-U+009F, newlines included) deleted without a space.
* :func:`normalize_for_dedup` (exact dedup): strip, lowercase, digits -> ``0``, CCNet's Unicode
  punctuation and control characters removed; accents are kept.

:func:`normalize` uses one ``str.translate`` table rather than CCNet's regexes and per-character
loop (same result, 4-20x faster); :func:`normalize_for_dedup` two regex substitutions, which scan
in C and touch only the characters they change (2x faster than a translate table on real text).
"""
from __future__ import annotations

import functools
import hashlib
import re
import sys
import unicodedata

# CCNet's table (cc_net/text_normalizer.py: UNICODE_PUNCT), including its quirk that the
# full-width digit one maps to '"' (unreachable in practice: digits become "0" first).
UNICODE_PUNCT: dict[str, str] = {
    "，": ",", "。": ".", "、": ",", "„": '"', "”": '"', "“": '"', "«": '"', "»": '"',
    "１": '"', "」": '"', "「": '"', "《": '"', "》": '"', "´": "'", "∶": ":", "：": ":",
    "？": "?", "！": "!", "（": "(", "）": ")", "；": ";", "–": "-", "—": " - ", "．": ". ",
    "～": "~", "’": "'", "…": "...", "━": "-", "〈": "<", "〉": ">", "【": "[", "】": "]",
    "％": "%", "►": "-",
}
CONTROL_CHARS: tuple[int, ...] = tuple(range(0, 32)) + tuple(range(127, 160))


@functools.cache
def _categories() -> dict[str, tuple[int, ...]]:
    """Code points of the Unicode categories the normalizers act on: Nd (what ``re``'s ``\\d``
    matches) and Mn (combining marks, which CCNet's strip_accents drops after NFD)."""
    found: dict[str, list[int]] = {"Nd": [], "Mn": []}
    for c in range(sys.maxunicode + 1):
        category = unicodedata.category(chr(c))
        if category in found:
            found[category].append(c)
    return {k: tuple(v) for k, v in found.items()}


@functools.cache
def _perplexity_table() -> dict[int, str | None]:
    """After NFD: combining marks deleted, digits -> 0, punctuation replaced, control chars deleted."""
    table: dict[int, str | None] = {c: None for c in _categories()["Mn"]}
    table.update({c: "0" for c in _categories()["Nd"]})
    # CCNet replaces punctuation after digits, so its "１" entry never fires: digits win.
    table.update({ord(k): v for k, v in UNICODE_PUNCT.items() if ord(k) not in table})
    table.update({c: None for c in CONTROL_CHARS})
    return table


# Dedup: CCNet's punctuation (less the full-width one, a digit) and control characters go; then
# every Nd digit (what ``\d`` matches in a str pattern) becomes 0. The two sets are disjoint.
_DEDUP_PUNCT = "".join(re.escape(k) for k in UNICODE_PUNCT if not k.isdecimal())
_DEDUP_REMOVED = re.compile(f"[{_DEDUP_PUNCT}" + "".join(re.escape(chr(c)) for c in CONTROL_CHARS) + "]")
_DEDUP_REMOVED_BUT_NEWLINE = re.compile(f"[{_DEDUP_PUNCT}" + "".join(
    re.escape(chr(c)) for c in CONTROL_CHARS if chr(c) != "\n") + "]")
_DIGIT = re.compile(r"\d")


def normalize(text: str) -> str:
    """CCNet's ``normalize(line)`` with its defaults (accent, case, numbers, punct=1).

    CCNet's steps (lower, NFD and drop Mn, digits, punctuation, control characters) as one NFD and
    one ``str.translate``: none of the later steps' characters is a combining mark or comes out of
    NFD, so the order does not change the result (tested against CCNet on every code point).
    """
    text = text.strip()
    if not text:
        return text
    return unicodedata.normalize("NFD", text.lower()).translate(_perplexity_table())


def normalize_for_dedup(line: str) -> str:
    """CCNet's ``normalize_for_dedup``: the key exact paragraph dedup compares."""
    line = line.strip()
    if not line:
        return line
    return _DIGIT.sub("0", _DEDUP_REMOVED.sub("", line.lower()))


def paragraph_hash(line: str) -> int:
    """First 8 bytes of SHA-1 of the dedup-normalized line, read as CCNet does (uint64, little endian)."""
    digest = hashlib.sha1(normalize_for_dedup(line).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little")


def paragraph_hashes(text: str, stripped: bool = False) -> bytes:
    """:func:`paragraph_hash` of every line of ``text``, packed: 8 bytes (little-endian uint64) a line.

    Normalizes the whole text at once (the regexes and ``lower`` run once per document, not per
    line): each line is stripped first, as :func:`normalize_for_dedup` does, and then no step
    looks across a newline (``lower``'s final-sigma rule treats a newline as the end of a word).
    ``stripped``: every line of ``text`` is stripped already (a document as the reader gives it),
    so that step is left out.
    """
    if not stripped:
        text = "\n".join(line.strip() for line in text.split("\n"))
    normalized = _DIGIT.sub("0", _DEDUP_REMOVED_BUT_NEWLINE.sub("", text.lower()))
    return b"".join([hashlib.sha1(line).digest()[:8] for line in normalized.encode("utf-8").split(b"\n")])
