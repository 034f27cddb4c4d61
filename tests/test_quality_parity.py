"""FineWeb-2's quality layer against datatrove's own classes (datatrove==0.10.1, the dev extra).

Datatrove's filters are built exactly as ``fineweb-2-pipeline.py`` builds them, from FineWeb-2's
per-language files copied verbatim into ``tests/data/fineweb2/`` (English: FineWeb's values,
datatrove's defaults). Ours come from ``configs/corpus/fineweb2.yaml``. For every XNLI language,
every sample page and every planted document (each check swept across its threshold) must get
the same keep/drop decision and the same reason from each filter, and the same text from ftfy,
PII and symbol-line removal. A wrong number in the profile, or a semantic difference, fails here.
"""
from __future__ import annotations

import contextlib

import pytest

from pipeline.config import load_config
from pipeline.steps.base import Drop
from pipeline.steps.formatters import Ftfy, Pii, SymbolLines
from pipeline.steps.quality import FineWebQuality, GopherQuality, GopherRepetition
from pipeline.steps.words import tokenizer_for

from quality_docs import (FW2_FILES, boundary_docs, PII_AND_MOJIBAKE, TESTS, XNLI, planted, reference_filters, restart_pii_turn,
                          sample_pages)

datatrove = pytest.importorskip("datatrove", reason="datatrove (the dev extra) is not installed")
from datatrove.data import Document  # noqa: E402
from datatrove.pipeline.formatters import FTFYFormatter, PIIFormatter, SymbolLinesFormatter  # noqa: E402
from datatrove.utils.word_tokenizers import load_word_tokenizer  # noqa: E402

# make test: a language of each script and word tokenizer (Latin with spaCy, Cyrillic, Arabic and Urdu,
# Vietnamese with pyvi, Thai, Chinese with jieba, Hindi); make test-slow: every XNLI language.
FAST = {"en", "ru", "ar", "ur", "vi", "th", "zh", "hi"}
LANGS = [lang if lang in FAST else pytest.param(lang, marks=pytest.mark.slow) for lang in XNLI]

PROFILE = TESTS.parent / "configs" / "corpus" / "fineweb2.yaml"
FILTERS = (GopherRepetition, FineWebQuality, GopherQuality)


def reference_reason(flt, text: str) -> str | None:
    result = flt.filter(Document(text=text, id="x"))
    return None if result is True else result[1]


def our_reason(step, text: str, lang: str) -> str | None:
    result = step({"text": text, "lang": lang})
    return result.reason if isinstance(result, Drop) else None


@pytest.fixture(scope="module")
def profile():
    return load_config(str(PROFILE))


@pytest.fixture(scope="module")
def pages() -> list[str]:
    return sample_pages()


def check_filters(lang: str, profile, texts: list[str], step: int) -> None:
    ours = [cls(profile.section(cls.name)) for cls in FILTERS]
    theirs = reference_filters(lang)
    docs = texts + planted(lang, ours[2].params(lang).p.stop_words, step) + boundary_docs(lang)
    mismatches, dropped = [], set()
    for text in docs:
        for flt, ref in zip(ours, theirs):
            expected, got = reference_reason(ref, text), our_reason(flt, text, lang)
            dropped.add(got)
            if got != expected:
                mismatches.append((flt.name, expected, got, text[:80]))
    assert not mismatches, f"{len(mismatches)} decisions differ, first: {mismatches[:3]}"
    assert len(dropped - {None}) >= 6, f"the planted documents reach too few checks in {lang}: {sorted(dropped - {None})}"


@pytest.mark.parametrize("lang", LANGS)
def test_filters_decide_as_datatrove(lang: str, profile, pages: list[str]) -> None:
    """Every third step of each sweep, a ninth of the sample's pages (make test-slow: all of both)."""
    check_filters(lang, profile, [page for page in pages if page.strip()][::9], step=3)


@pytest.mark.slow
@pytest.mark.parametrize("lang", XNLI)
def test_filters_decide_as_datatrove_everywhere(lang: str, profile, pages: list[str]) -> None:
    check_filters(lang, profile, pages, step=1)


@pytest.mark.parametrize("lang", LANGS)
def test_words_are_datatrove_words(lang: str, pages: list[str]) -> None:
    """The word tokenizer (with its per-piece cache for spaCy's rule-based languages) gives
    datatrove's tokens, and no XNLI language falls back."""
    assert not tokenizer_for(lang).fallback, tokenizer_for(lang).fallback
    reference = load_word_tokenizer(FW2_FILES.get(lang, "eng"))  # FineWeb-2 names languages so (datatrove reads
    # a bare "hi" or "zh" as another script's row of its tokenizer table)
    texts = [page for page in pages[::7] if page.strip()] + planted(lang, [], step=10)
    for text in texts:
        assert tokenizer_for(lang).words(text) == reference.word_tokenize(text), text[:80]


def test_formatters_write_datatrove_text(profile, pages: list[str]) -> None:
    texts = pages + PII_AND_MOJIBAKE * 3
    pairs = [(Ftfy(profile.section("ftfy")), FTFYFormatter()), (Pii(profile.section("pii")), PIIFormatter()),
             (SymbolLines(profile.section("symbol_lines")), SymbolLinesFormatter(symbols_to_remove=["|"], replace_char="\n"))]
    for step, formatter in pairs:
        changed = 0
        for text in texts:
            restart_pii_turn(formatter)
            expected = formatter.format(text)
            result = step({"text": text, "lang": "en"})
            assert result["text"] == expected, (step.name, text[:80])
            changed += expected != text
        assert changed, f"{step.name} changed nothing: the inputs do not exercise it"


URLS = ["https://www.blocked.org/page", "https://www.blocked.example.com/page", "http://sub.other.co.uk/a", "https://good.org/casino-night",
        "https://good.org/Casino", "https://good.org/free-bonus-win", "https://good.org/free-x", "https://x.org/pornhub1",
        "https://exact.net/path?q=1", "https://exact.net/path?q=2", "http://192.168.0.1/admin", "https://a.b.c.d.e.fr/x",
        "https://shop.blocked.example.com/", "https://news.example.org/sports/2024/01/01/story.html"]


def test_url_filter_decides_as_datatrove(tmp_path, pages: list[str]) -> None:
    from datatrove.pipeline.filters import URLFilter
    from tldextract import TLDExtract

    from pipeline.steps.url_filter import UrlFilter, UrlFilterConfig

    lists = {"domains": ["# blocked", "blocked.org", "shop.blocked.example.com", "sub.other.co.uk"], "urls": ["https://exact.net/path?q=1"],
             "banned_words": ["casino"], "banned_subwords": ["pornhub"], "soft_banned_words": ["free", "bonus", "win"]}
    for name, lines in lists.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    step = UrlFilter(UrlFilterConfig(**{name: str(tmp_path / name) for name in lists}))
    step.prepare()
    theirs = URLFilter(extra_domains=lists["domains"], extra_urls=lists["urls"], banned_words=lists["banned_words"],
                       banned_subwords=lists["banned_subwords"], soft_banned_words=lists["soft_banned_words"],
                       use_integrated_lists=False)
    theirs.tldextractor = TLDExtract(suffix_list_urls=(), cache_dir=None)  # offline, as ours
    reasons = set()
    for url in URLS + [f"https://{w}.com/{w}" for w in " ".join(pages[:200]).split()[:300]]:
        result = theirs.filter(Document(text="x", id="x", metadata={"url": url}))
        expected = None if result is True else result[1]
        assert step.check(url) == expected, url
        reasons.add(expected)
    assert reasons >= {None, "domain", "subdomain", "url", "hard_blacklisted", "soft_blacklisted", "blacklisted_subword"}


def test_url_list_files_are_read_as_datatrove_reads_them(tmp_path) -> None:
    """Datatrove's URLFilter reading the same files (as it reads its own lists, a line each): a
    ``#`` makes a comment only as a line's first character, so an indented ``  # roulette night`` is
    the word ``roulettenight``; lines end at ``\\n``, ``\\r\\n`` and ``\\r`` only (a form feed or
    U+2028 is inside an entry). The case of a URL's words counts for banned words in both (the lists
    are lowercased, the URL's words are not); banned sub-words are matched in the lowercased URL."""
    from datatrove.pipeline.filters import URLFilter
    from tldextract import TLDExtract

    from pipeline.steps.url_filter import UrlFilter, UrlFilterConfig

    lists = {"domains": "# a comment\n  # indented.example\nblocked.org\r\nalso.net\rthird.org\n\tfourth.org \n"
                        "fifth.org\x0csixth.org\nseventh.org\u2028eighth.org\n",
             "urls": "  #https://exact.net/p\nhttps://exact.net/q\r\n",
             "banned_words": "# casino\n  # roulette night\npoker\r\nslots\x85bingo\n",
             "banned_subwords": " #porn\nxxx\n", "soft_banned_words": "\t#free\nbonus\rwin\n"}
    for name, text in lists.items():
        (tmp_path / name).write_bytes(text.encode("utf-8"))
    step = UrlFilter(UrlFilterConfig(**{name: str(tmp_path / name) for name in lists}))
    step.prepare()
    with contextlib.ExitStack() as stack:
        files = {name: stack.enter_context(open(tmp_path / name, encoding="utf-8")) for name in lists}
        theirs = URLFilter(extra_domains=files["domains"], extra_urls=files["urls"], banned_words=files["banned_words"],
                           banned_subwords=files["banned_subwords"], soft_banned_words=files["soft_banned_words"],
                           use_integrated_lists=False)
    theirs.tldextractor = TLDExtract(suffix_list_urls=(), cache_dir=None)  # offline, as ours
    assert step.lists["banned_words"] == theirs.banned_words == {"roulettenight", "poker", "slotsbingo"}
    assert step.lists["soft_banned_words"] == theirs.soft_banned_words == {"free", "bonus", "win"}
    assert step.lists["banned_subwords"] == theirs.banned_subwords == {"porn", "xxx"}
    assert step.lists["urls"] == theirs.block_listed_url
    assert step.lists["domains"] >= theirs.block_listed_domains  # (ours adds IDNA forms, none here)
    urls = ["https://blocked.org/", "https://also.net/", "https://third.org/", "https://www.fourth.org/", "https://fifth.org/",
            "https://sixth.org/", "https://eighth.org/", "https://indented.example/", "https://exact.net/p", "https://exact.net/q",
            "https://x.org/casino", "https://x.org/roulettenight", "https://x.org/roulette-night", "https://x.org/poker",
            "https://x.org/POKER", "https://x.org/slots", "https://x.org/bingo", "https://x.org/slotsbingo",
            "https://x.org/pornstar", "https://x.org/PORNSTAR", "https://x.org/free-bonus", "https://x.org/FREE-bonus",
            "https://x.org/bonus-win"]
    decisions = {}
    for url in urls:
        result = theirs.filter(Document(text="x", id="x", metadata={"url": url}))
        decisions[url] = None if result is True else result[1]
        assert step.check(url) == decisions[url], url
    assert decisions["https://x.org/roulettenight"] == "hard_blacklisted" and decisions["https://x.org/POKER"] is None
    assert decisions["https://x.org/PORNSTAR"] == "blacklisted_subword" and decisions["https://x.org/free-bonus"] == "soft_blacklisted"
    assert decisions["https://third.org/"] == "domain" and decisions["https://sixth.org/"] is None


def test_repeated_ngrams_count_as_datatrove_counts_them() -> None:
    """Random word lists from a tiny vocabulary whose words join ambiguously ("ab"+"c" = "a"+"bc",
    and "a b"+"c" = "a"+"b c" joined by spaces, as pyvi's Vietnamese words hold spaces): our walk
    over the repeated n-grams only sums what datatrove's walk over every position sums. One object
    per list asked for n = 1, 2, ... in turn, as the step asks: it had taken every n-gram distinct
    at some n for every n-gram distinct at all longer n, which joined texts do not promise."""
    import random

    from datatrove.pipeline.filters.gopher_repetition_filter import find_all_duplicate, find_top_duplicate, get_n_grams

    from pipeline.steps.quality import Ngrams

    rng = random.Random(20261125)
    for _ in range(3000):
        vocab = ["a", "b", "ab", "c", "bc", "abc", "d", "a b", "b c"][: rng.randint(1, 9)]
        words = [rng.choice(vocab) for _ in range(rng.randint(0, 60))]
        joined, spaced = Ngrams(words, ""), Ngrams(words, " ")
        for n in range(1, 11):
            assert joined.repeated(n) == find_all_duplicate(words, n), (words, n)
            if len(words) >= n:
                assert spaced.top(n) == find_top_duplicate(get_n_grams(words, n)), (words, n)
    words = "alpha bravoc delta echo foxtrot golfhotel zulu alphabravo c delta echo foxtrotgolf hotel".split()
    joined = Ngrams(words, "")
    assert [joined.repeated(n) for n in (5, 6)] == [find_all_duplicate(words, n) for n in (5, 6)] == [0, 36]


C4_PLANTED = [
    "One sentence here. Two sentences here. Three now.\nFour is here! Five is here? Six.",
    "One sentence here. Two sentences here. Three now.\nFour is here!",
    "A line with a citation[1] ends well.\nAnother line [edit] is here.\nThird line, no end\nShort.\nGood line number four.\n"
    "Good line number five. And six.",
    "Lorem ipsum dolor sit amet, consectetur.\nSecond line is fine here.",
    "A fine first line here.\nThis page uses cookies to work well.\nThe terms of use apply here.\n"
    "Enable JavaScript to see this page.\nA { curly } line is here.",
    "Lines that end with an ellipsis are removed...\n" * 3 + "Quoted line ends here.\"\nSingle quoted line ends here.'",
    "x" * 1001 + " a b c.\n" + "Normal sentence one is here. Two. Three. Four. Five.",
    "", "\n\n", "No terminal punctuation anywhere in this document",
]


@pytest.mark.parametrize("lang", LANGS)
def test_c4_decides_and_cuts_as_datatrove(lang: str, pages: list[str]) -> None:
    from datatrove.pipeline.filters import C4QualityFilter

    from pipeline.steps.quality import C4Quality, C4QualityConfig
    from pipeline.steps.words import sentence_fallback

    if sentence_fallback(lang):
        pytest.skip(f"datatrove cannot split {lang} sentences here: {sentence_fallback(lang)}")
    name = FW2_FILES.get(lang, "eng")
    texts = [page for page in pages if page.strip()][::25] + C4_PLANTED + boundary_docs(lang)[:4]
    for split_paragraph in (True, False):
        ours = C4Quality(C4QualityConfig(split_paragraph=split_paragraph))
        theirs = C4QualityFilter(split_paragraph=split_paragraph, language=name)
        compared = 0
        for text in texts:
            doc = Document(text=text, id="x")
            got = ours({"text": text, "lang": lang})
            try:
                result = theirs.filter(doc)
            except ValueError:  # datatrove's sentence spans cannot find a sentence the Indic NLP
                continue  # splitter rewrote (README, differences): ours decides without raising
            expected = (None, doc.text) if result is True else (result[1], None)
            assert ((got.reason, None) if isinstance(got, Drop) else (None, got["text"])) == expected, (split_paragraph, text[:80])
            compared += 1
        assert compared >= len(texts) // 2, (split_paragraph, compared, len(texts))  # not mostly skipped


# lid.176 labels beyond XNLI, one or two per kind of datatrove's tokenizer table: a spaCy proxy (yue and
# jieba, jv: ms, nn: nb, sw: tn), the Indic NLP Library (bn, ta, hi), Thai, WhitespaceTokenizer (dv: spaCy's
# xx rules, not a fallback) and spaCy's own rules (en); each with datatrove's name of its csv row. The last
# sentences of bn, ta and nn tokenize otherwise with spaCy's bn, ta and nn rules.
LID_LABELS = {
    "yue": ("yue_Hani", ["我哋今日去飲茶，你嚟唔嚟呀？", "呢間餐廳嘅點心好好食，不過要排隊好耐。"]),
    "jv": ("jav_Latn", ["Aku arep lunga menyang pasar esuk. Kowé arep mèlu ora?", "Omahé simbah ana ing desa, cedhak sawah."]),
    "bn": ("ben_Beng", ["আমি প্রতিদিন সকালে স্কুলে যাই। তুমি কোথায় যাও?", "ঢাকা বাংলাদেশের রাজধানী, এখানে অনেক মানুষ থাকে।",
                         "ডা. রায় ১২.৫% বেশি দাম দিয়েছেন—কেন? ই-মেইল: info@example.com"]),
    "ta": ("tam_Taml", ["நான் தினமும் பள்ளிக்குச் செல்கிறேன். நீ எங்கே போகிறாய்?", "சென்னை தமிழ்நாட்டின் தலைநகரம்.",
                         "டாக்டர். ராஜ் 12.5% அதிக விலை கொடுத்தார்—ஏன்? மின்னஞ்சல்: info@example.com"]),
    "nn": ("nno_Latn", ["Eg har ikkje sett han sidan i går. Kvar er du no?", "Bergen er ein by på Vestlandet, kjend for regn.",
                         "Dei budde i Nord-Noreg t.d. i Tromsø."]),
    "dv": ("div_Thaa", ["އަހަރެން މިއަދު ސްކޫލަށް ދިޔައީމެވެ. ކަލޭ ކޮންތާކު؟", "މާލެ އަކީ ދިވެހިރާއްޖޭގެ ވެރިރަށެވެ."]),
    "sw": ("swh_Latn", ["Ninakwenda sokoni kesho asubuhi. Je, utakuja nami?", "Dar es Salaam ni mji mkubwa wa Tanzania."]),
    "th": ("tha_Thai", ["ฉันไปโรงเรียนทุกวัน คุณจะไปไหน", "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย"]),
    "hi": ("hin_Deva", ["मैं रोज़ सुबह स्कूल जाता हूँ। तुम कहाँ जाते हो?", "दिल्ली भारत की राजधानी है, यहाँ बहुत लोग रहते हैं।"]),
    "en": ("eng_Latn", ["I'm going to the market tomorrow. Won't you come along?", "London is the U.K.'s capital (pop. 8.9M)."]),
}
NEEDS = {"yue": "jieba", "th": "pythainlp", "bn": "indicnlp", "ta": "indicnlp", "hi": "indicnlp"}


@pytest.mark.parametrize("lang", sorted(LID_LABELS))
def test_lid_labels_tokenize_as_datatrove_table(lang: str) -> None:
    """A lid.176 label gets the tokenizer of its row in datatrove's tokenizer_assignment.csv, as FineWeb-2
    names it (yue: spaCy zh with jieba, jv: spaCy ms, bn: Indic NLP, dv: WhitespaceTokenizer, ...)."""
    pytest.importorskip("spacy", reason="spaCy (the quality extra) is not installed")
    if lang in NEEDS:
        pytest.importorskip(NEEDS[lang], reason=f"{NEEDS[lang]} (the quality extra) is not installed")
    name, texts = LID_LABELS[lang]
    tok = tokenizer_for(lang)
    assert tok.fallback == "", tok.fallback
    reference = load_word_tokenizer(name)
    for text in texts + ["\n".join(texts)]:
        words = tok.words(text)
        assert words == reference.word_tokenize(text), text
        assert len(words) > 3, words  # not the whole line as one "word"


@pytest.mark.parametrize("lang, name", [("be", "Stanza"), ("km", "KhmerTokenizer")])
def test_lid_labels_without_datatrove_tokenizer_fall_back_and_say_why(lang: str, name: str) -> None:
    tok = tokenizer_for(lang)
    assert (tok.kind, tok.code) == ("spacy", "xx")
    assert tok.fallback.startswith(f"datatrove uses {name}") and f"for {lang!r}" in tok.fallback, tok.fallback
    assert tokenizer_for("bh").fallback == "spaCy has no rules for 'bh'"  # spaCy installed, no row, no rules


@pytest.mark.parametrize("lang", ["bn", "ta", "hi"])
def test_indic_labels_split_sentences_as_datatrove(lang: str) -> None:
    pytest.importorskip("indicnlp", reason="indic-nlp-library (the quality extra) is not installed")
    from pipeline.steps.words import sentence_ends

    text = " ".join(LID_LABELS[lang][1])
    expected = [end for _, end in load_word_tokenizer(LID_LABELS[lang][0]).span_tokenize(text)]
    assert sentence_ends(text, lang) == expected and len(expected) > 2, expected
