"""Word tokenizers per language, chosen as datatrove 0.10.1 chooses them (its
``assets/tokenizer_assignment.csv``), for the quality filters and FineWeb-2's MinHash.

``TOKENIZERS`` holds the csv's choice for every lid.176 label whose tokenizer is not spaCy with the
label's own code: the row FineWeb-2 names (``code_1`` the label, default script and default
``code_1``; else ``code_3`` the label, default script), copied in (datatrove is only a dev
dependency). Every tokenizer runs locally from its own PyPI package (the ``quality`` extra); none
downloads data at run time:

=====================================  ===========================================================
csv's SpaCyTokenizer                   ``spacy.blank(tok_code)``: the label's own code, or a proxy
                                       (sw: ``tn``, jv su min ilo mg pam: ``ms``, nn: ``nb``, ...);
                                       vi with pyvi's segmenter; zh (and yue wuu) with jieba
IndicNLPTokenizer                      Indic NLP Library's ``trivial_tokenize`` with ``tok_code``
                                       (hi bn ta te ml mr gu kn pa or as si sa ne ur, and proxies)
ThaiTokenizer                          PyThaiNLP, ``newmm-safe``
WhitespaceTokenizer (dv ka xmf yi)     spaCy's multi-language ``xx`` rules (what its words are)
Stanza, Kiwi, Khmer, Lao, Burmese,     **fallback**: spaCy's ``xx`` rules, counted (Stanza
Tibetan; a label without a row that    downloads models at run time; the others' packages are not
spaCy lacks; a missing package         dependencies)
=====================================  ===========================================================

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

# Generated once from datatrove 0.10.1's assets/tokenizer_assignment.csv (the rule in the docstring above).
TOKENIZERS: dict[str, tuple[str, str]] = {
    "als": ("spacy", "sq"), "an": ("spacy", "es"), "arz": ("spacy", "ar"), "as": ("indic", "as"),
    "ast": ("spacy", "es"), "av": ("spacy", "xx"), "azb": ("spacy", "fa"), "ba": ("spacy", "tt"),
    "bar": ("spacy", "de"), "bcl": ("spacy", "tl"), "be": ("stanza", "be"), "bn": ("indic", "bn"),
    "bo": ("tibetan", ""), "bpy": ("indic", "bn"), "br": ("stanza", "cy"), "bs": ("spacy", "sr"),
    "bxr": ("stanza", "bxr"), "cbk": ("spacy", "xx"), "ce": ("spacy", "xx"), "ceb": ("spacy", "tl"),
    "ckb": ("indic", "ur"), "co": ("spacy", "es"), "cv": ("spacy", "xx"), "cy": ("stanza", "cy"),
    "diq": ("stanza", "kmr"), "dty": ("indic", "ne"), "dv": ("whitespace", "xx"), "eml": ("spacy", "xx"),
    "eo": ("spacy", "xx"), "frr": ("spacy", "en"), "fy": ("spacy", "en"), "gd": ("stanza", "gd"),
    "gl": ("stanza", "gl"), "gn": ("spacy", "xx"), "gom": ("stanza", "kmr"), "gu": ("indic", "gu"),
    "gv": ("stanza", "gv"), "hi": ("indic", "hi"), "hif": ("stanza", "kmr"), "ht": ("spacy", "xx"),
    "ia": ("spacy", "xx"), "ie": ("spacy", "xx"), "ilo": ("spacy", "ms"), "io": ("spacy", "xx"),
    "jbo": ("spacy", "xx"), "jv": ("spacy", "ms"), "ka": ("whitespace", "xx"), "kk": ("stanza", "kk"),
    "km": ("khmer", ""), "kn": ("indic", "kn"), "ko": ("kiwi", ""), "krc": ("stanza", "kk"),
    "ku": ("indic", "ur"), "kv": ("spacy", "xx"), "kw": ("stanza", "cy"), "lez": ("spacy", "xx"),
    "li": ("spacy", "nl"), "lmo": ("spacy", "lij"), "lo": ("lao", ""), "lrc": ("indic", "ur"),
    "mai": ("indic", "hi"), "mg": ("spacy", "ms"), "mhr": ("spacy", "xx"), "min": ("spacy", "ms"),
    "ml": ("indic", "ml"), "mn": ("stanza", "bxr"), "mr": ("indic", "mr"), "mrj": ("spacy", "xx"),
    "mt": ("stanza", "mt"), "mwl": ("spacy", "es"), "my": ("burmese", ""), "myv": ("stanza", "myv"),
    "mzn": ("indic", "ur"), "nah": ("spacy", "xx"), "nap": ("spacy", "it"), "nds": ("spacy", "nl"),
    "ne": ("indic", "ne"), "new": ("indic", "hi"), "nn": ("spacy", "nb"), "oc": ("spacy", "es"),
    "or": ("indic", "or"), "os": ("spacy", "xx"), "pa": ("indic", "pa"), "pam": ("spacy", "ms"),
    "pfl": ("spacy", "lb"), "pms": ("spacy", "lij"), "pnb": ("indic", "ur"), "ps": ("indic", "ur"),
    "qu": ("spacy", "xx"), "rm": ("spacy", "fr"), "rue": ("spacy", "ru"), "sa": ("indic", "sa"),
    "sah": ("spacy", "xx"), "sc": ("spacy", "es"), "scn": ("spacy", "it"), "sco": ("spacy", "en"),
    "sd": ("indic", "ur"), "sh": ("spacy", "sr"), "si": ("indic", "si"), "so": ("spacy", "xx"),
    "su": ("spacy", "ms"), "sw": ("spacy", "tn"), "ta": ("indic", "ta"), "te": ("indic", "te"),
    "tg": ("spacy", "xx"), "th": ("thai", "th"), "tk": ("spacy", "tr"), "tyv": ("spacy", "xx"),
    "ug": ("stanza", "ug"), "ur": ("indic", "ur"), "uz": ("spacy", "xx"), "vec": ("spacy", "lij"),
    "vep": ("spacy", "fi"), "vls": ("spacy", "nl"), "vo": ("spacy", "xx"), "wa": ("spacy", "fr"),
    "war": ("spacy", "tl"), "wuu": ("spacy", "zh"), "xal": ("stanza", "bxr"), "xmf": ("whitespace", "xx"),
    "yi": ("whitespace", "xx"), "yue": ("spacy", "zh"),
}
"""lid.176 label -> (kind, code) as datatrove's csv assigns it, for every label whose tokenizer is not
``spacy.blank(label)``: spacy (``tok_code``, ``xx`` included), indic (``tok_code``), thai, whitespace
(spaCy's ``xx``), or a tokenizer not available here (stanza with its ``tok_code``, kiwi, khmer, lao,
burmese, tibetan). A label not here (bh, no, tl have no row) uses spaCy with its own code."""
UNAVAILABLE = {"stanza": ("Stanza", "it downloads models at run time"),
               "kiwi": ("KiwiTokenizer (kiwipiepy)", "not a dependency"),
               "khmer": ("KhmerTokenizer (khmer-nltk)", "not a dependency"),
               "lao": ("LaoTokenizer (laonlp)", "not a dependency"),
               "burmese": ("BurmeseTokenizer (pyidaungsu)", "not a dependency"),
               "tibetan": ("TibetanTokenizer (botok)", "not a dependency")}
"""datatrove's tokenizers this project does not run: (what datatrove uses, why not); the fallback instead."""
SPACY_CONFIG: dict[str, dict[str, Any]] = {"zh": {"nlp": {"tokenizer": {"segmenter": "jieba"}}}}
SEGMENTERS = {"zh": ("jieba",), "vi": ("pyvi",), "ja": ("sudachipy", "sudachidict_core")}
"""The modules spaCy's tokenizer of these languages segments words with."""
WHOLE_TEXT_SPACY = {"vi", "ja", "ko"}
"""spaCy languages whose tokenizer is a segmenter looking across spaces and lines (no cache)."""
PIECES: dict[str, Callable[[str], list[str]]] = {"spacy": str.split, "whitespace": str.split,
                                                 "jieba": lambda text: text.split("\n")}
"""Per kind, the pieces a text is tokenized in one by one (tokens cached per piece): spaCy's rules
never look past a space, jieba never past a line break (its blocks are runs of Han characters,
letters and digits)."""
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
    """spacy, jieba, spacy-whole, thai, indic or whitespace (spaCy's ``xx``, datatrove's WhitespaceTokenizer)."""
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
    kind, code = TOKENIZERS.get(lang, ("spacy", lang))
    if kind == "thai":
        return _checked(WordTokenizer(lang, "thai", "th"), "pythainlp")
    if kind == "indic":
        return _checked(WordTokenizer(lang, "indic", code), "indicnlp")
    if kind in UNAVAILABLE:
        name, why = UNAVAILABLE[kind]
        proxy = f" ({code!r})" if code and code != lang else ""
        return WordTokenizer(lang, "spacy", FALLBACK, fallback=f"datatrove uses {name}{proxy} for {lang!r}; not available "
                                                               f"here ({why})")
    try:
        import spacy.util
    except ImportError:
        return WordTokenizer(lang, "spacy", FALLBACK, fallback="spaCy is not installed")
    try:
        spacy.util.get_lang_class(code)
    except Exception as exc:  # ImportError (E048) for a language spaCy does not have, or catalogue's own error
        import importlib.util

        if importlib.util.find_spec(f"spacy.lang.{code}") is None:
            return WordTokenizer(lang, "spacy", FALLBACK, fallback=f"spaCy has no rules for {code!r}")
        return WordTokenizer(lang, "spacy", FALLBACK, fallback=f"spaCy's {code!r} does not load: {exc}")
    if kind == "whitespace":  # datatrove's WhitespaceTokenizer: its words are spaCy's xx rules (not a fallback)
        return WordTokenizer(lang, "whitespace", code)
    kind = "jieba" if code == "zh" else "spacy-whole" if code in WHOLE_TEXT_SPACY else "spacy"
    tok = WordTokenizer(lang, kind, code)
    try:
        _spacy(code)
    except ImportError as exc:  # zh needs jieba, vi pyvi, ja sudachipy, ko mecab
        return WordTokenizer(lang, "spacy", FALLBACK, fallback=f"spaCy's {code!r} needs {exc.name or exc}")
    return tok


def tokenizer_modules(lang: str) -> tuple[str, ...]:
    """The modules the word tokenizer of ``lang`` runs with, as :func:`tokenizer_for` chooses it
    (without loading it: for stats.json's versions, which list the installed ones)."""
    import importlib.util

    kind, code = TOKENIZERS.get(lang, ("spacy", lang))
    own = {"thai": "pythainlp", "indic": "indicnlp"}.get(kind)
    if own:
        return (own,) if importlib.util.find_spec(own) is not None else ("spacy",)
    return ("spacy", *SEGMENTERS.get(code, ()))


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
    if tok.kind == "indic" and sentence_fallback(lang):
        tok = WordTokenizer(lang, "spacy", tok.code)  # spaCy's Urdu rules
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
    they do not): the Indic NLP Library splits Urdu (and the languages it stands for) with urduhack,
    which needs TensorFlow; datatrove's WhitespaceTokenizer splits with a regex (of the ``regex``
    package, not a dependency), here spaCy's ``xx`` sentencizer does. (A language whose words fall
    back splits with spaCy's ``xx`` too, counted as its tokenizer's fallback.)"""
    import importlib.util

    tok = tokenizer_for(lang)
    if tok.kind == "indic" and tok.code == "ur" and importlib.util.find_spec("urduhack") is None:
        return "urduhack (TensorFlow) is not installed"
    if tok.kind == "whitespace":
        return "datatrove splits WhitespaceTokenizer languages with a regex; spaCy's xx sentencizer here"
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
