"""Word tokenizers per language, chosen as datatrove 0.10.1 chooses them (its
``assets/tokenizer_assignment.csv``), for the quality filters and FineWeb-2's MinHash.

Every tokenizer runs locally from its own PyPI package (the ``quality`` extra); none downloads
data at run time:

======================================  ==========================================================
en fr es de el bg ru tr ar              spaCy's rule-based tokenizer (``spacy.blank(lang)``)
sw                                      spaCy's Setswana (``tn``), datatrove's proxy for Swahili
vi                                      spaCy's Vietnamese (pyvi's CRF word segmenter)
zh                                      spaCy's Chinese with the jieba segmenter
th                                      PyThaiNLP, ``newmm-safe``
hi ur                                   Indic NLP Library's ``trivial_tokenize``
any other language spaCy has            ``spacy.blank(lang)`` (what datatrove assigns to most)
anything else (or a missing package)    **fallback**: spaCy's multi-language ``xx`` rules
                                        (datatrove's ``WhitespaceTokenizer``), counted
======================================  ==========================================================

Tokens are datatrove's: stripped, empty ones dropped. spaCy's rule-based tokenizer splits the
text on whitespace first and tokenizes each piece on its own, so for those languages a piece's
tokens are cached (per process): most words of a page have been seen before, and spaCy then
runs only on new pieces; the tokens are spaCy's own (``tests/test_quality_parity.py`` compares
them with datatrove's on every document). jieba's are cached per line, which it never looks past.
Segmenters that look across lines (pyvi's CRF, PyThaiNLP, Indic NLP) get the whole text.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
from itertools import chain
from typing import Any, Callable

SPACY_CODE = {"sw": "tn"}
"""Languages datatrove tokenizes with another language's spaCy rules (its ``tok_code``)."""
SPACY_CONFIG: dict[str, dict[str, Any]] = {"zh": {"nlp": {"tokenizer": {"segmenter": "jieba"}}}}
WHOLE_TEXT_SPACY = {"vi", "ja", "ko"}
"""spaCy languages whose tokenizer is a segmenter looking across spaces and lines (no cache)."""
PIECES: dict[str, Callable[[str], list[str]]] = {"spacy": str.split, "jieba": lambda text: text.split("\n")}
"""Per kind, the pieces a text is tokenized in one by one (tokens cached per piece): spaCy's rules
never look past a space, jieba never past a line break (its blocks are runs of Han characters,
letters and digits)."""
INDIC = {"hi", "ur"}
FALLBACK = "xx"
_CACHED: set[str] = set()
"""Languages whose tokenizer has been asked for (their caches are what ``forget_words`` empties)."""
CACHE_ENTRIES = 500_000
"""Pieces whose tokens are remembered per process (then the cache starts again)."""


def _strip(tokens: Any) -> list[str]:
    return [s for s in (t.strip() for t in tokens) if s]


@dataclasses.dataclass
class WordTokenizer:
    """One language's word tokenizer: ``words(text)`` as datatrove's ``word_tokenize``."""

    lang: str
    kind: str
    """spacy, jieba, spacy-whole, thai or indic."""
    code: str
    """The spaCy or Indic NLP language code it runs with."""
    fallback: str = ""
    """Why the fallback is used ('' when it is not)."""

    def __post_init__(self) -> None:
        self._cache: dict[str, list[str]] = {}
        self._run: Callable[[str], list[str]] | None = None

    def words(self, text: str) -> list[str]:
        if self._run is None:
            self._run = self._load()
        split = PIECES.get(self.kind)
        if split is None:
            return self._run(text)
        cache, pieces = self._cache, split(text)
        found = list(map(cache.get, pieces))  # a C loop: most pieces were seen before
        for i, tokens in enumerate(found if None in found else ()):
            if tokens is None:
                piece = pieces[i]
                tokens = cache.get(piece)  # earlier in this text, perhaps
                if tokens is None:
                    if len(cache) >= CACHE_ENTRIES:
                        cache.clear()
                    tokens = cache[piece] = self._run(piece)
                found[i] = tokens
        return list(chain.from_iterable(found))

    def _load(self) -> Callable[[str], list[str]]:
        if self.kind == "thai":
            from pythainlp.tokenize import word_tokenize

            return lambda text: _strip(word_tokenize(text, keep_whitespace=False, engine="newmm-safe"))
        if self.kind == "indic":
            from indicnlp.tokenize.indic_tokenize import trivial_tokenize

            return lambda text: _strip(trivial_tokenize(text, self.code))
        nlp = _spacy(self.code)
        if self.kind == "jieba":  # spaCy's Chinese tokenizer makes its tokens of jieba's words as they are:
            import logging

            import jieba  # call jieba without building a spaCy Doc (a third of the time)

            jieba.setLogLevel(logging.WARNING)  # not a line per worker about its dictionary
            return lambda text: _strip(jieba.cut(text, cut_all=False))
        if self.code == "vi":  # spaCy's Vietnamese tokenizer's pyvi words, with pyvi's features made faster
            _pyvi_model_in_memory()
            return functools.partial(_pyvi_words, nlp.tokenizer)
        tokenizer = nlp.tokenizer

        def run(text: str) -> list[str]:
            with nlp.memory_zone():  # the strings of this text leave spaCy's vocabulary afterwards
                try:
                    doc = tokenizer(text)
                except Exception:
                    if "IS_ALPHA" not in text:  # datatrove's one known string that breaks spaCy
                        raise
                    doc = tokenizer(text.replace("IS_ALPHA", ""))
                return _strip(token.text for token in doc)

        return run


_PYVI_LOCK = threading.Lock()


def _pyvi_model_in_memory() -> None:
    """pyvi's CRF, unpickled on import, writes its model to a temporary file (637 KB) that only its
    finalizer removes: never, in a process that ends by ``os._exit`` or a signal (an SDK worker, our
    CLI), so each such process left one in the temporary folder. Open the tagger now (crfsuite reads
    the whole file into memory) and remove the file."""
    from pyvi.ViTokenizer import ViTokenizer

    model = ViTokenizer.model
    with _PYVI_LOCK:  # two threads of one SDK worker may load at once: one opens, then the file goes
        if model.modelfile.name is not None:
            model.tagger_  # noqa: B018  (the property opens the file)
            model.modelfile.cleanup()


def _pyvi_features(words: list[str]) -> list[dict[str, Any]]:
    """pyvi's ``ViTokenizer.sent2features(words, False)`` as the CRF scores them: the same features,
    each word's, pair's and triple's computed once rather than up to three times, false flags left
    out (a feature of value 0 adds nothing to a label's score)."""
    from pyvi.ViTokenizer import ViTokenizer

    n = len(words)
    lower = [w.lower() for w in words]
    title = [w.istitle() for w in words]
    upper = [w.isupper() for w in words]
    pairs = [" ".join(words[i:i + 2]).lower() in ViTokenizer.bi_grams for i in range(n - 1)]
    triples = [" ".join(words[i:i + 3]).lower() in ViTokenizer.tri_grams for i in range(n - 2)]
    features = []
    for i, word in enumerate(words):  # a false flag is a feature of value 0, which adds nothing: left out
        f: dict[str, Any] = {"bias": 1.0, "word.lower()": lower[i]}
        flags = [("word.isupper()", upper[i]), ("word.istitle()", title[i]), ("word.isdigit()", word.isdigit())]
        if i > 0:
            f["-1:word.lower()"] = lower[i - 1]
            flags += [("-1:word.istitle()", title[i - 1]), ("-1:word.isupper()", upper[i - 1]),
                      ("-1:word.bi_gram()", pairs[i - 1])]
            if i > 1:
                flags.append(("-2:word.tri_gram()", triples[i - 2]))
        if i < n - 1:
            f["+1:word.lower()"] = lower[i + 1]
            flags += [("+1:word.istitle()", title[i + 1]), ("+1:word.isupper()", upper[i + 1]),
                      ("+1:word.bi_gram()", pairs[i])]
            if i < n - 2:
                flags.append(("+2:word.tri_gram()", triples[i]))
        f.update((name, True) for name, value in flags if value)
        features.append(f)
    return features


def _pyvi_words(tokenizer: Any, text: str) -> list[str]:
    """spaCy's ``VietnameseTokenizer.pyvi_tokenize`` (pyvi's CRF labels, then its rule for joining
    syllables), stripped; its features from :func:`_pyvi_features`."""
    import string

    from pyvi.ViTokenizer import ViTokenizer

    if not text or text.isspace():
        return _strip([text])
    segments = tokenizer.pyvi_sylabelize_with_ws(text)
    words, spaces = [], []
    for i, segment in enumerate(segments):
        if not segment.isspace():
            words.append(segment)
            spaces.append(segments[i - 1] if i and segments[i - 1].isspace() else "")
    labels = ViTokenizer.model.predict([_pyvi_features(words)])[0]
    tokens, token = [], words[0]
    for i in range(1, len(labels)):
        a, b = words[i - 1], words[i]
        if (labels[i] == "I_W" and b not in string.punctuation and a not in string.punctuation
                and not b[0].isdigit() and not a[0].isdigit() and not (b[0].istitle() and not a[0].istitle())):
            token += spaces[i] + b
        else:
            tokens.append(token)
            token = b
    tokens.append(token)
    return _strip(tokens)


@functools.cache
def _spacy(code: str) -> Any:
    import spacy

    config = SPACY_CONFIG.get(code)
    return spacy.blank(code, config=config) if config else spacy.blank(code)


@functools.cache
def tokenizer_for(lang: str) -> WordTokenizer:
    """The word tokenizer of language ``lang`` (an ISO 639-1 code, as lid.176 labels)."""
    _CACHED.add(lang)
    if lang == "th":
        return _checked(WordTokenizer(lang, "thai", "th"), "pythainlp")
    if lang in INDIC:
        return _checked(WordTokenizer(lang, "indic", lang), "indicnlp")
    code = SPACY_CODE.get(lang, lang)
    try:
        import spacy.util

        spacy.util.get_lang_class(code)
    except ImportError:
        return WordTokenizer(lang, "spacy", FALLBACK, fallback="spaCy is not installed")
    except Exception:  # spaCy's catalogue raises its own error for a language it does not have
        return WordTokenizer(lang, "spacy", FALLBACK, fallback=f"spaCy has no rules for {code!r}")
    kind = "jieba" if code == "zh" else "spacy-whole" if code in WHOLE_TEXT_SPACY else "spacy"
    tok = WordTokenizer(lang, kind, code)
    try:
        _spacy(code)
    except ImportError as exc:  # zh needs jieba, vi pyvi, ja sudachipy, ko mecab
        return WordTokenizer(lang, "spacy", FALLBACK, fallback=f"spaCy's {code!r} needs {exc.name or exc}")
    return tok


def _checked(tok: WordTokenizer, module: str) -> WordTokenizer:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return WordTokenizer(tok.lang, "spacy", FALLBACK, fallback=f"{module} is not installed")
    return tok


@functools.cache
def _spacy_sentences(code: str) -> Any:
    nlp = _spacy.__wrapped__(code)  # a pipeline of its own: the tokenizer's stays without pipes
    nlp.add_pipe("sentencizer")
    return nlp


def sentence_ends(text: str, lang: str) -> list[int]:
    """Where each sentence of ``text`` ends, as datatrove's ``span_tokenize`` finds them (spaCy's
    sentencizer; PyThaiNLP's or the Indic NLP Library's splitter, each sentence found in turn)."""
    tok = tokenizer_for(lang)
    if sentence_fallback(lang):
        tok = WordTokenizer(lang, "spacy", lang)
    if tok.kind in ("thai", "indic"):
        if tok.kind == "thai":
            from pythainlp.tokenize import sent_tokenize

            sents = _strip(sent_tokenize(text))
        else:
            from indicnlp.tokenize.sentence_tokenize import sentence_split

            sents = _strip(sentence_split(text, lang=tok.code))
        if len(sents) == 1:
            return [len(text)]
        ends, at = [], 0
        for sent in sents:
            found = text.find(sent, at)
            if found < 0:  # the splitter changed the text (Indic NLP spaces out "a.b.com"): no place
                continue  # to cut, the sentence joins the next one (datatrove raises ValueError here)
            at = found + len(sent)
            ends.append(at)
        return ends or [len(text)]
    nlp = _spacy_sentences(tok.code)
    nlp.max_length = len(text) + 10
    with nlp.memory_zone():
        return [sent.end_char for sent in nlp(text).sents]


@functools.cache
def sentence_fallback(lang: str) -> str:
    """Why ``lang``'s sentences come from spaCy's rules rather than datatrove's splitter ('' when
    they do not): the Indic NLP Library splits Urdu with urduhack, which needs TensorFlow."""
    import importlib.util

    if tokenizer_for(lang).kind == "indic" and lang == "ur" and importlib.util.find_spec("urduhack") is None:
        return "urduhack (TensorFlow) is not installed"
    return ""


def split_sentences(text: str, lang: str) -> list[str]:
    """``text`` cut at its sentence ends (the pieces cover it whole), as datatrove's ``split_into_sentences``."""
    ends = sentence_ends(text, lang)
    return [text[a:b] for a, b in zip([0] + ends[:-1], ends[:-1] + [len(text)])]


@functools.lru_cache(maxsize=4)
def split_words(text: str, lang: str) -> list[str]:
    """``text``'s words in language ``lang``; the last few are remembered, so filters running one
    after another on the same document tokenize it once (as datatrove's ``split_into_words``)."""
    return tokenizer_for(lang).words(text)


def forget_words() -> None:
    """Empty the per-process caches of tokens (loaded tokenizers stay): a benchmark's next round
    then sees its documents as a worker sees new ones."""
    split_words.cache_clear()
    for lang in _CACHED:
        tokenizer_for(lang)._cache.clear()
