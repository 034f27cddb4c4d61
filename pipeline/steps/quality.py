"""Quality filters as FineWeb-2 applies them, per language: Gopher repetition, Gopher quality and
FineWeb quality (and C4's, which FineWeb-2 leaves out), with datatrove 0.10.1's semantics, order of
checks and drop reasons
(``tests/test_quality_parity.py`` runs datatrove's own classes beside them).

Each section's keys are the datatrove class's arguments; ``languages:`` overrides any of them per
language (FineWeb-2's ``configs/<lang>_<script>.yml`` values are in ``configs/corpus/fineweb2.yaml``).
A language without an entry uses the section's own values and is counted
(``default_values/<lang>``). A ratio's threshold of 0 or null turns that check off, as in datatrove.

Where datatrove would divide by zero (a document without words, with its minimum word count
turned off) these steps decide without raising: no words means no hashes, ellipses or alphabetic
words to count.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from itertools import compress
from typing import Any, Callable, ClassVar, Iterable

import numpy as np

from ..util.configfile import check_choices_and_ranges, override
from ..util.errors import UserError
from .base import Document, Drop, RunInfo, Step, StepResult
from .minhash import powers
from .punctuation import PUNCTUATION_SET, TERMINAL_PUNCTUATION
from .words import sentence_fallback, split_sentences, split_words, tokenizer_for

GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
"""Gopher's English stop words (datatrove's default)."""
MAX_N = 20
"""The longest n-gram a repetition check may name (its drop reason is declared)."""


@dataclasses.dataclass
class PerLanguage:
    """A config with per-language overrides of its own keys."""

    languages: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Per-language values, {lang: {key: value}} (lid.176 codes), over this section's own."""
    ranges: ClassVar[dict[str, tuple[Any, Any]]] = {}
    """The keys' ranges, checked for the section's values (``config._check_section``) and for each language's."""

    def for_language(self, lang: str) -> Any:
        """This config with ``languages[lang]`` applied (a UserError names an unknown key)."""
        values = self.languages.get(lang)
        if values is None:
            return self
        if isinstance(values, dict) and "languages" in values:
            raise UserError(f"languages.{lang}.languages: per-language values do not nest")
        return override(dataclasses.replace(self, languages={}), values, f"languages.{lang}.")

    def validate(self) -> None:
        self.check_values()  # the section's own values first: a mistake there is not a language's
        for lang in self.languages:
            language = self.for_language(lang)
            check_choices_and_ranges(language, f"languages.{lang}", {}, self.ranges)
            try:
                language.check_values()
            except UserError as exc:
                raise UserError(f"languages.{lang}.{exc}") from None

    def check_values(self) -> None:
        """Checks of one language's values (UserError)."""


def _check_ngrams(name: str, pairs: list[list[float]]) -> None:
    for pair in pairs:
        if len(pair) != 2 or not float(pair[0]).is_integer() or not 1 <= pair[0] <= MAX_N or not 0 <= pair[1] <= 1:
            raise UserError(f"{name}: expected [n, fraction] pairs with 1 <= n <= {MAX_N} and 0 <= fraction <= 1, "
                            f"got {pair!r}")


class LanguageFilter(Step):
    """A per-document filter whose values and word tokenizer depend on the document's language."""

    counters: ClassVar[tuple[str, ...]] = ("default_values", "tokenizer_fallback")

    def __init__(self, cfg: PerLanguage, run: RunInfo = RunInfo()) -> None:
        super().__init__(cfg, run)
        self._params: dict[str, Any] = {}

    @classmethod
    def requires(cls, cfg: Any) -> tuple[str, ...]:
        return ("lang",)

    @classmethod
    def splits_words(cls, cfg: Any) -> bool:
        return True

    def languages_named(self) -> dict[str, Iterable[str]]:
        return {"languages": self.cfg.languages}

    def params(self, lang: str) -> Any:
        """The values for ``lang`` (its own, or the section's, counted)."""
        params = self._params.get(lang)
        if params is None:
            params = self._params[lang] = self.prepared(self.cfg.for_language(lang))
        if lang not in self.cfg.languages:
            self.count(f"default_values/{lang}")
        return params

    def prepared(self, params: Any) -> Any:
        """Derived values kept with a language's params (sets built once)."""
        return params

    def words(self, text: str, lang: str) -> list[str]:
        if tokenizer_for(lang).fallback:
            self.count(f"tokenizer_fallback/{lang}")
        return split_words(text, lang)

    def __call__(self, doc: Document) -> StepResult:
        lang = doc.get("lang") or "unknown"
        reason = self.check(doc.get("text") or "", lang, self.params(lang))
        return Drop(reason) if reason else doc

    def check(self, text: str, lang: str, p: Any) -> str | None:
        """The drop reason of ``text``, or None to keep it."""
        raise NotImplementedError


def duplicates(items: list[str]) -> tuple[int, int]:
    """How many items repeat an earlier one, and their characters (datatrove's ``find_duplicates``)."""
    counts = Counter(items)
    if len(counts) == len(items):
        return 0, 0
    return len(items) - len(counts), sum(len(item) * (n - 1) for item, n in counts.items() if n > 1)


def _sorted_runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, same)``: the positions of ``keys`` in sorted order, and whether each sorted key
    after the first equals the one before it (what ``np.unique`` does, without its overhead)."""
    order = np.argsort(keys)
    ordered = keys[order]
    return order, ordered[1:] == ordered[:-1]


class Ngrams:
    """The n-grams of a word list joined with ``sep``, as slices of the joined text, found equal by
    64-bit polynomial hashes of their code points in numpy (the hash of ``minhash``); where a hash
    decides a count, the strings themselves are compared, so a collision changes nothing."""

    MIX = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, words: list[str], sep: str, lengths: np.ndarray | None = None) -> None:
        """``lengths``: the words' lengths, if already counted."""
        self.n_words, self.text = len(words), sep.join(words)
        if lengths is None:
            lengths = np.fromiter(map(len, words), np.int64, len(words))
        self.lengths = lengths
        self.starts = np.zeros(len(words), np.int64)
        np.cumsum(lengths[:-1] + len(sep), out=self.starts[1:])
        self.ends = self.starts + lengths
        x = np.frombuffer(self.text.encode("utf-32-le", "surrogatepass"), np.uint32).astype(np.uint64) + np.uint64(1)
        up, self.down = powers(1 << max(21, (len(x) + 1).bit_length()))
        self.prefix = np.zeros(len(x) + 1, np.uint64)
        np.cumsum(x * up[:len(x)], out=self.prefix[1:])
        self.distinct_from = self.n_words + 1
        """The smallest n found with every n-gram distinct: then every longer n-gram is distinct too,
        where the joined texts tell word tuples apart (``sep`` in no word; never with ``sep`` "":
        ``["alpha", "bravoc"]`` and ``["alphabravo", "c"]`` join to one text)."""
        self.shortcut = bool(sep) and not any(sep in word for word in words)

    def keys(self, n: int) -> np.ndarray:
        """A key per n-gram (its hash, mixed with its length)."""
        a, b = self.starts[:self.n_words - n + 1], self.ends[n - 1:]
        return (self.prefix[b] - self.prefix[a]) * self.down[a] + (b - a).astype(np.uint64) * self.MIX

    def gram(self, i: int, n: int) -> str:
        return self.text[self.starts[i]:self.ends[i + n - 1]]

    def top(self, n: int) -> int:
        """Characters of the most frequent n-gram times its count; of equals, the one seen first
        (``Counter.most_common``'s choice). Needs at least ``n`` words."""
        if n >= self.distinct_from:  # every n-gram once: the first is the most frequent
            return len(self.gram(0, n))
        keys = self.keys(n)
        order, same = _sorted_runs(keys)
        if not same.any():
            self.distinct_from = n if self.shortcut else self.distinct_from
            return len(self.gram(0, n))
        starts = np.flatnonzero(np.concatenate(([True], ~same)))
        counts = np.diff(starts, append=len(keys))
        count = int(counts.max())
        best = int(np.minimum.reduceat(order, starts)[counts == count].min())  # seen first, of the most frequent
        gram = self.gram(best, n)
        if any(self.gram(int(i), n) != gram for i in np.flatnonzero(keys == keys[best])):  # a collision
            gram, count = Counter(self.gram(i, n) for i in range(len(keys))).most_common(1)[0]
        return len(gram) * count

    def repeated(self, n: int) -> int:
        """Characters in n-grams that repeat an earlier one, an n-gram found again skipping the next
        n words (Gopher's duplicate n-gram fraction with ``sep`` "", as datatrove counts it).

        Only n-grams that occur twice or more can be found again, so the walk visits just those (in
        order, minus the skipped): the same sum as datatrove's walk over every position."""
        if self.n_words < n or n >= self.distinct_from:
            return 0
        order, same = _sorted_runs(self.keys(n))
        if not same.any():
            self.distinct_from = n if self.shortcut else self.distinct_from
            return 0
        twice = np.zeros(len(order), bool)  # in sorted order: a key equal to its neighbour's
        twice[1:] = same
        twice[:-1] |= same
        seen: set[str] = set()
        repeated, free = 0, 0
        for i in np.sort(order[twice]).tolist():
            if i < free:
                continue
            gram = self.gram(i, n)
            if gram in seen:
                repeated += len(gram)
                free = i + n
            else:
                seen.add(gram)
        return repeated


@dataclasses.dataclass
class GopherRepetitionConfig(PerLanguage):
    dup_line_frac: float | None = 0.3
    """Drop above this fraction of lines that repeat an earlier line."""
    dup_para_frac: float | None = 0.3
    """Drop above this fraction of paragraphs (blank-line separated) that repeat an earlier one."""
    dup_line_char_frac: float | None = 0.2
    """Drop above this fraction of characters in repeated lines."""
    dup_para_char_frac: float | None = 0.2
    """Drop above this fraction of characters in repeated paragraphs."""
    top_n_grams: list[list[float]] = dataclasses.field(default_factory=lambda: [[2, 0.2], [3, 0.18], [4, 0.16]])
    """[n, fraction]: drop when the most frequent n-gram covers more than this fraction of characters."""
    dup_n_grams: list[list[float]] = dataclasses.field(
        default_factory=lambda: [[5, 0.15], [6, 0.14], [7, 0.13], [8, 0.12], [9, 0.11], [10, 0.10]])
    """[n, fraction]: drop when repeated n-grams cover more than this fraction of characters."""

    ranges = {key: (0.0, 1.0) for key in ("dup_line_frac", "dup_para_frac", "dup_line_char_frac", "dup_para_char_frac")}

    def check_values(self) -> None:
        _check_ngrams("top_n_grams", self.top_n_grams)
        _check_ngrams("dup_n_grams", self.dup_n_grams)


PARAGRAPHS = re.compile(r"\n{2,}")
LINES = re.compile("\n+")


class GopherRepetition(LanguageFilter):
    """Gopher's repetition filter (Rae et al. 2021, table A1), as datatrove's ``GopherRepetitionFilter``."""

    name = "gopher_repetition"
    Config = GopherRepetitionConfig
    counters = (*LanguageFilter.counters, "empty", "dup_para_frac", "dup_para_char_frac", "dup_line_frac",
                "dup_line_char_frac", *(f"top_{n}_gram" for n in range(1, MAX_N + 1)),
                *(f"duplicated_{n}_n_grams" for n in range(1, MAX_N + 1)))

    def check(self, text: str, lang: str, p: GopherRepetitionConfig) -> str | None:
        if not text:
            return "empty"
        size = len(text)
        if p.dup_para_frac or p.dup_para_char_frac:
            paragraphs = PARAGRAPHS.split(text.strip())
            n_dup, dup_chars = duplicates(paragraphs)
            if p.dup_para_frac and n_dup / len(paragraphs) > p.dup_para_frac:
                return "dup_para_frac"
            if p.dup_para_char_frac and dup_chars / size > p.dup_para_char_frac:
                return "dup_para_char_frac"
        if p.dup_line_frac or p.dup_line_char_frac:
            lines = LINES.split(text)
            n_dup, dup_chars = duplicates(lines)
            if p.dup_line_frac and n_dup / len(lines) > p.dup_line_frac:
                return "dup_line_frac"
            if p.dup_line_char_frac and dup_chars / size > p.dup_line_char_frac:
                return "dup_line_char_frac"
        words = self.words(text, lang)
        if p.top_n_grams and words:
            spaced = Ngrams(words, " ")
            for n, frac in p.top_n_grams:
                if len(words) >= n and spaced.top(int(n)) / size > frac:
                    return f"top_{int(n)}_gram"
        if p.dup_n_grams and words:
            joined = Ngrams(words, "", spaced.lengths if p.top_n_grams else None)
            for n, frac in p.dup_n_grams:
                if joined.repeated(int(n)) / size > frac:
                    return f"duplicated_{int(n)}_n_grams"
        return None


@dataclasses.dataclass
class GopherQualityConfig(PerLanguage):
    min_doc_words: int | None = 50
    """Drop below this many non-symbol words."""
    max_doc_words: int | None = 100000
    """Drop above this many non-symbol words."""
    min_avg_word_length: float | None = 3
    """Drop below this mean length of non-symbol words."""
    max_avg_word_length: float | None = 10
    """Drop above this mean length of non-symbol words."""
    max_symbol_word_ratio: float | None = 0.1
    """Drop above this many '#', or '...' and '…', per word."""
    max_bullet_lines_ratio: float | None = 0.9
    """Drop above this fraction of lines starting with a bullet ('•' or '-')."""
    max_ellipsis_lines_ratio: float | None = 0.3
    """Drop above this fraction of lines ending with an ellipsis."""
    max_non_alpha_words_ratio: float | None = 0.8
    """Drop below this fraction of words with an alphabetic character (datatrove's name)."""
    min_stop_words: int | None = 2
    """Drop with fewer of ``stop_words`` present."""
    stop_words: list[str] = dataclasses.field(default_factory=lambda: list(GOPHER_STOP_WORDS))
    """The language's stop words."""
    ranges = {"min_doc_words": (0, None), "max_doc_words": (0, None), "min_avg_word_length": (0.0, None),
              "max_avg_word_length": (0.0, None), "max_symbol_word_ratio": (0.0, None),
              "max_bullet_lines_ratio": (0.0, 1.0), "max_ellipsis_lines_ratio": (0.0, 1.0),
              "max_non_alpha_words_ratio": (0.0, 1.0), "min_stop_words": (0, None)}


def _memo(known: dict[str, bool], words: list[str], test: Callable[[str], bool]) -> list[bool]:
    """``test`` of each word, remembered per word (up to a million words, then forgotten)."""
    if len(known) > 1_000_000:
        known.clear()
    values = list(map(known.get, words))  # a C loop: most words were seen before
    if None in values:
        for i, value in enumerate(values):
            if value is None:
                values[i] = known[words[i]] = test(words[i])
    return values


@dataclasses.dataclass(frozen=True)
class _Quality:
    p: GopherQualityConfig
    stop_words: frozenset[str]


BULLETS = ("•", "-")
ELLIPSES = ("...", "…")


class GopherQuality(LanguageFilter):
    """Gopher's quality rules (Rae et al. 2021), as datatrove's ``GopherQualityFilter``."""

    name = "gopher_quality"
    Config = GopherQualityConfig
    counters = (*LanguageFilter.counters, "gopher_short_doc", "gopher_long_doc", "gopher_below_avg_threshold",
                "gopher_above_avg_threshold", "gopher_too_many_hashes", "gopher_too_many_ellipsis",
                "gopher_too_many_bullets", "gopher_too_many_end_ellipsis", "gopher_below_alpha_threshold",
                "gopher_enough_stop_words")

    def __init__(self, cfg: GopherQualityConfig, run: RunInfo = RunInfo()) -> None:
        super().__init__(cfg, run)
        self._alpha: dict[str, bool] = {}
        self._symbols: dict[str, bool] = {}

    def prepared(self, params: GopherQualityConfig) -> _Quality:
        return _Quality(params, frozenset(params.stop_words))

    def _has_alpha(self, words: list[str]) -> list[bool]:
        return _memo(self._alpha, words, lambda w: any(c.isalpha() for c in w))

    def _not_symbol(self, words: list[str]) -> list[bool]:
        return _memo(self._symbols, words, lambda w: not PUNCTUATION_SET.issuperset(w))

    def check(self, text: str, lang: str, q: _Quality) -> str | None:
        p = q.p
        words = self.words(text, lang)
        n_words = len(words)
        lengths = [len(w) for w in compress(words, self._not_symbol(words))]
        if p.min_doc_words and len(lengths) < p.min_doc_words:
            return "gopher_short_doc"
        if p.max_doc_words and len(lengths) > p.max_doc_words:
            return "gopher_long_doc"
        mean = sum(lengths) / len(lengths) if lengths else float("nan")  # numpy's mean of no values
        if p.min_avg_word_length and mean < p.min_avg_word_length:
            return "gopher_below_avg_threshold"
        if p.max_avg_word_length and mean > p.max_avg_word_length:
            return "gopher_above_avg_threshold"
        per_word = max(n_words, 1)
        if p.max_symbol_word_ratio and text.count("#") / per_word > p.max_symbol_word_ratio:
            return "gopher_too_many_hashes"
        if p.max_symbol_word_ratio and (text.count("...") + text.count("…")) / per_word > p.max_symbol_word_ratio:
            return "gopher_too_many_ellipsis"
        lines = text.splitlines() or [""]
        if (p.max_bullet_lines_ratio
                and sum(line.lstrip().startswith(BULLETS) for line in lines) / len(lines) > p.max_bullet_lines_ratio):
            return "gopher_too_many_bullets"
        if (p.max_ellipsis_lines_ratio
                and sum(line.rstrip().endswith(ELLIPSES) for line in lines) / len(lines) > p.max_ellipsis_lines_ratio):
            return "gopher_too_many_end_ellipsis"
        if p.max_non_alpha_words_ratio and n_words and sum(self._has_alpha(words)) / n_words < p.max_non_alpha_words_ratio:
            return "gopher_below_alpha_threshold"
        if p.min_stop_words and len(q.stop_words.intersection(words)) < p.min_stop_words:
            return "gopher_enough_stop_words"
        return None


@dataclasses.dataclass
class FineWebQualityConfig(PerLanguage):
    line_punct_thr: float = 0.12
    """Drop below this fraction of lines ending with terminal punctuation."""
    line_punct_exclude_zero: bool = False
    """Keep documents where no line ends with terminal punctuation."""
    stop_chars: list[str] | None = None
    """What counts as terminal punctuation (null: datatrove's set of every script's)."""
    short_line_thr: float = 0.67
    """Drop above this fraction of short lines (FineWeb-2: 999, off)."""
    short_line_length: int = 30
    """A short line has at most this many characters."""
    char_duplicates_ratio: float = 0.01
    """Drop above this fraction of characters in repeated lines (FineWeb-2: 0.1)."""
    new_line_ratio: float = 0.3
    """Drop above this many line breaks per word."""
    ranges = {"line_punct_thr": (0.0, 1.0), "short_line_thr": (0.0, None), "short_line_length": (0, None),
              "char_duplicates_ratio": (0.0, 1.0), "new_line_ratio": (0.0, None)}


class FineWebQuality(LanguageFilter):
    """FineWeb's own heuristics, as datatrove's ``FineWebQualityFilter``."""

    name = "fineweb_quality"
    Config = FineWebQualityConfig
    counters = (*LanguageFilter.counters, "empty", "line_punct_ratio", "short_line_ratio", "char_dup_ratio", "list_ratio")

    def prepared(self, params: FineWebQualityConfig) -> FineWebQualityConfig:
        stop = tuple(TERMINAL_PUNCTUATION) if params.stop_chars is None else tuple(params.stop_chars)
        return dataclasses.replace(params, stop_chars=stop)  # type: ignore[arg-type]  # str.endswith takes a tuple

    def check(self, text: str, lang: str, p: FineWebQualityConfig) -> str | None:
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            return "empty"
        ratio = sum(line.endswith(p.stop_chars) for line in lines) / len(lines)  # type: ignore[arg-type]
        if ratio < p.line_punct_thr and not (ratio == 0 and p.line_punct_exclude_zero):
            return "line_punct_ratio"
        if sum(len(line) <= p.short_line_length for line in lines) / len(lines) > p.short_line_thr:
            return "short_line_ratio"
        if duplicates(lines)[1] / (len(text) - text.count("\n")) > p.char_duplicates_ratio:
            return "char_dup_ratio"
        words = self.words(text, lang)
        if words and text.count("\n") / len(words) > p.new_line_ratio:
            return "list_ratio"
        return None


@dataclasses.dataclass
class C4QualityConfig(PerLanguage):
    split_paragraph: bool = True
    """Work on lines (C4); false: on the language's sentences."""
    remove_citations: bool = True
    """Remove Wikipedia-style citations ([1], [edit], [citation needed])."""
    filter_no_terminal_punct: bool = True
    """Remove lines not ending in . ? ! " ' (or ending in ...)."""
    min_num_sentences: int = 5
    """Drop documents with fewer sentences in their kept lines (-1: off)."""
    min_words_per_line: int = 3
    """Remove lines with fewer words (split at whitespace; -1: off)."""
    max_word_length: int = 1000
    """Remove lines with a longer word (-1: off)."""
    ranges = {"min_num_sentences": (-1, None), "min_words_per_line": (-1, None), "max_word_length": (-1, None)}
    filter_lorem_ipsum: bool = True
    """Drop documents with "lorem ipsum"."""
    filter_javascript: bool = True
    """Remove lines mentioning javascript."""
    filter_curly_bracket: bool = True
    """Drop documents with a "{" in a kept line."""
    filter_policy: bool = True
    """Remove lines about terms of use, privacy or cookie policies."""


CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


class C4Quality(LanguageFilter):
    """C4's rules (Raffel et al. 2020), as datatrove's ``C4QualityFilter``: removes lines, keeps the
    rest of the document, or drops it. Off in FineWeb-2 (it found them harmful), here for users
    who want them."""

    name = "c4_quality"
    Config = C4QualityConfig
    counters = (*LanguageFilter.counters, "sentence_fallback", "lorem_ipsum", "curly_bracket", "too_few_sentences",
                "lines_too_long_word",
                "lines_no_terminal_punct", "lines_too_few_words", "lines_javascript", "lines_policy", "lines_kept")

    def __call__(self, doc: Document) -> StepResult:
        lang = doc.get("lang") or "unknown"
        p = self.params(lang)
        text = doc.get("text") or ""
        if sentence_fallback(lang):
            self.count(f"sentence_fallback/{lang}")
        lines = text.splitlines() if p.split_paragraph else split_sentences(text, lang)
        kept, sentences = [], 0
        for line in lines:
            line = line.strip()
            words = line.split()
            if p.max_word_length != -1 and any(len(word) > p.max_word_length for word in words):
                self.count("lines_too_long_word")
                continue
            if p.remove_citations:
                line = CITATION.sub("", line)
            if p.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
                self.count("lines_no_terminal_punct")
                continue
            if len(words) < p.min_words_per_line:
                self.count("lines_too_few_words")
                continue
            lower = line.lower()
            if p.filter_lorem_ipsum and "lorem ipsum" in lower:
                return Drop("lorem_ipsum")
            if p.filter_javascript and "javascript" in lower:
                self.count("lines_javascript")
                continue
            if p.filter_curly_bracket and "{" in line:
                return Drop("curly_bracket")
            if p.filter_policy and any(phrase in lower for phrase in POLICY):
                self.count("lines_policy")
                continue
            if p.min_num_sentences != -1:
                sentences += len(split_sentences(line, lang)) if p.split_paragraph else 1
            kept.append(line)
            self.count("lines_kept")
        if sentences < p.min_num_sentences:
            return Drop("too_few_sentences")
        return {**doc, "text": ("\n" if p.split_paragraph else " ").join(kept).strip()}
