"""The quality steps on bad input: config mistakes are one line naming the closest key, a language
without values uses the section's and is counted, odd documents never raise."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.steps.base import Drop
from pipeline.steps.formatters import Ftfy, FtfyConfig, Pii, PiiConfig, SymbolLines, SymbolLinesConfig
from pipeline.steps.quality import (C4Quality, C4QualityConfig, FineWebQuality, FineWebQualityConfig, GopherQuality,
                                    GopherQualityConfig, GopherRepetition, GopherRepetitionConfig)
from pipeline.steps.url_filter import UrlFilter, UrlFilterConfig
from pipeline.util.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "configs" / "corpus" / "fineweb2.yaml")


@pytest.mark.parametrize("sets, message", [
    (["gopher_quality.min_stop_word=3"], "unknown config key 'gopher_quality.min_stop_word' (did you mean 'gopher_quality.min_stop_words'?)"),
    (["gopher_repetition.languages.fr.dup_line_frc=0.2"], "unknown key 'languages.fr.dup_line_frc' (did you mean 'languages.fr.dup_line_frac'?)"),
    (["gopher_repetition.languages.fr.top_n_grams=[[50, 0.1]]"],
     "gopher_repetition: languages.fr.top_n_grams: expected [n, fraction] pairs with 1 <= n <= 20"),
    (["gopher_repetition.top_n_grams=[[2,0.2,1]]"],  # the section's own mistake, not a language's
     "gopher_repetition: top_n_grams: expected [n, fraction] pairs with 1 <= n <= 20 and 0 <= fraction <= 1, got [2.0, 0.2, 1.0]"),
    (["pii.email_replacement=[]"], "pii: email_replacement: empty; give at least one replacement (or remove_emails: false)"),
    (["symbol_lines.symbols_to_remove='|-+'"], "symbol_lines: symbols_to_remove holds '|-+': give single characters"),
    ([r"symbol_lines.replace_char=\n"],  # YAML's escapes are read in double quotes only: a backslash and n in every document
     r'symbol_lines: replace_char holds \n as two characters (a backslash, then n), which would go into every document '
     r'with a symbol line: YAML reads escapes only in double quotes; write "\n"'),
    ([r"symbol_lines.replace_char='\t'"], r'replace_char holds \t as two characters (a backslash, then t)'),
    ([r"symbol_lines.replace_char='x\\'"], r'replace_char holds \\ as two characters'),
    (["ftfy.unescape_html=no"], "ftfy.unescape_html must be one of"),
    (["perplexity.drop_buckets=[tail]"], "perplexity: drop_buckets ['tail']: head, middle and tail need perplexity.cutoffs"),
    (["perplexity.max_perplexity=0"], "perplexity.max_perplexity=0.0 is out of range"),
    (["fineweb_quality.languages.de.line_punct_thr=high"], "languages.de.line_punct_thr: expected a number"),
    (["ftfy.normalization=NFX"], "ftfy.normalization must be one of"),
    (["steps=[dedup, lid, url_filter]", "url_filter.domains=d.txt", "url_filter.soft_word_threshold=0"],
     "url_filter.soft_word_threshold=0 is out of range"),
    (["steps=[dedup, lid, url_filter]"],  # left out of the graph, silently, while stats.json listed it
     "--set steps=[dedup, lid, url_filter]: steps: url_filter is in steps but has no lists: set one of "
     "url_filter.domains, url_filter.urls, url_filter.banned_words, url_filter.banned_subwords, "
     "url_filter.soft_banned_words, or take it out of steps"),
    (["near_dedup.scheme=minhash"], "near_dedup.scheme must be one of datasketch, datatrove, got 'minhash'"),
    (["dedup.group_files=-1"], "dedup.group_files=-1.0 is out of range"),
    (["dedup.groups=2"], "unknown config key 'dedup.groups' (did you mean 'dedup.group_files'?)"),
])
def test_config_mistakes_are_one_line(sets: list[str], message: str) -> None:
    with pytest.raises(UserError) as error:
        load_config(PROFILE, {"output": "/tmp/x"}, sets)
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_language_without_values_uses_the_sections_and_is_counted() -> None:
    cfg = load_config(PROFILE, {"output": "/tmp/x"})
    step = GopherQuality(cfg.section("gopher_quality"))
    text = " ".join(["Lorem ipsum dolor sit amet consectetur adipiscing elit."] * 10)
    assert not isinstance(step({"text": text, "lang": "it"}), Drop)  # no stop-word check without a list
    counts = step.take_counts()
    assert counts["default_values/it"] == 1 and counts["default_values"] == 0  # a breakdown only
    assert isinstance(step({"text": text, "lang": "fr"}), Drop)  # French stop words are required
    assert "default_values/fr" not in step.take_counts()


ODD = [{"text": ""}, {"text": None}, {}, {"text": "\x00\x01\x02"}, {"text": "\n\n\n"}, {"text": "#"},
       {"text": "...", "lang": None}, {"text": "� " * 50, "lang": "xx-unknown"}]
STEPS = [GopherRepetition(GopherRepetitionConfig()), FineWebQuality(FineWebQualityConfig()),
         GopherQuality(GopherQualityConfig(min_doc_words=None, max_doc_words=None)),
         C4Quality(C4QualityConfig()), Ftfy(FtfyConfig()), Pii(PiiConfig()), SymbolLines(SymbolLinesConfig()),
         UrlFilter(UrlFilterConfig())]


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_odd_documents_never_raise(step) -> None:
    for doc in ODD:
        result = step({"id": "x", **doc})
        assert isinstance(result, (Drop, dict))


def test_ftfy_shortcut_never_skips_a_text_ftfys_badness_pattern_matches() -> None:
    """``may_be_bad`` is a necessary condition of ftfy's ``BADNESS_RE``: on random strings of the
    pattern's own characters, ASCII and spaces, every match is let through."""
    import random

    ftfy_badness = pytest.importorskip("ftfy.badness", reason="the quality extra (ftfy) is not installed")
    from pipeline.steps.formatters import badness_conditions, may_be_bad

    conditions = badness_conditions(ftfy_badness.BADNESS_RE)
    assert conditions is not None and len(conditions) > 30
    alphabet = sorted({c for sets in conditions for s in sets for c in s}) + list("aZ ,.(°") * 20
    rng = random.Random(0)
    matched = skipped = 0
    for _ in range(30_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 7)))
        bad = ftfy_badness.BADNESS_RE.search(text) is not None
        assert may_be_bad(text, conditions) or not bad, repr(text)
        matched += bad
        skipped += not may_be_bad(text, conditions)
    assert matched > 3000 and skipped > 3000


def test_vietnamese_words_equal_spacys_pyvi_tokenizer_on_odd_text() -> None:
    """Our pyvi features (computed once, false flags left out) give spaCy's own pyvi tokens;
    the sample's Vietnamese pages are compared with datatrove's in test_quality_parity.py."""
    pytest.importorskip("pyvi", reason="the quality extra (pyvi) is not installed")
    from pipeline.steps import words

    nlp = words._spacy("vi")
    for text in ["", "   ", "\n", "A", "Xin chào!!", "Tp. Hồ Chí Minh có 12.000,5 người", "ĐẠI HỌC Quốc Gia Hà Nội",
                 "email a.b@c.vn và http://x.vn/a?b=1 ==> ... >> 3,14", "Việt Nam\n\nđất nước tươi đẹp"]:
        assert words._pyvi_words(nlp.tokenizer, text) == words._strip(nlp.tokenizer.pyvi_tokenize(text)), text


def test_vietnamese_words_leave_no_model_file_in_a_process_that_ends_without_teardown(tmp_path) -> None:
    """pyvi's CRF keeps its model in a temporary file that only its finalizer removes; a process
    ending by ``os._exit`` (an SDK worker, our CLI) left one behind per process (637 KB each)."""
    pytest.importorskip("pyvi", reason="the quality extra (pyvi) is not installed")
    script = ("import os, sys\nfrom pipeline.steps.words import split_words\n"
              "print(split_words('Tôi là sinh viên trường đại học', 'vi'))\n"
              "print(sorted(os.listdir(sys.argv[1])), flush=True)\nos._exit(0)\n")
    temp = tmp_path / "temp"
    temp.mkdir()
    done = subprocess.run([sys.executable, "-c", script, str(temp)], capture_output=True, text=True, check=True,
                          cwd=ROOT, env={**os.environ, "TMPDIR": str(temp)})
    assert done.stdout.splitlines() == ["['Tôi', 'là', 'sinh viên', 'trường', 'đại học']", "[]"]
    assert not list(temp.iterdir())


def test_url_lists_as_people_write_them(tmp_path: Path, capsys) -> None:
    """A byte-order mark, an indented comment (an entry, as datatrove reads it), blank-looking lines (left
    out: datatrove keeps the empty entry, which blocks every URL with an IP address), upper case (in the list and in the
    URL's host) and internationalized domains (UTS 46, as URLs carry them); words with no ASCII letter (a list in another script): left out and said (as the empty
    word, datatrove's reading, they blocked every URL ending in /); a line that is not UTF-8: its number."""
    domains, words = tmp_path / "domains.txt", tmp_path / "words.txt"
    domains.write_bytes("\ufeffbad.com\n   \n  # adult sites\nEvil.COM\nbücher.de\nstraße.de\ni❤.ws\n".encode("utf-8"))
    words.write_text("casino\nпорно\n----\n", encoding="utf-8")
    step = UrlFilter(UrlFilterConfig(domains=str(domains), banned_words=str(words)))
    step.prepare()
    assert "2 entries without an ASCII letter or digit (e.g. 'порно') can never match" in capsys.readouterr().err
    assert step.lists["domains"] == {"bad.com", "evil.com", "bücher.de", "xn--bcher-kva.de", "straße.de", "xn--strae-oqa.de",
                                     "i❤.ws", "xn--i-7iq.ws",  # (IDNA 2008 refuses it; registered under IDNA 2003)
                                     "# adult sites"}
    assert step.lists["banned_words"] == {"casino"}
    for url, reason in (("http://bad.com/x", "domain"), ("http://evil.com/", "domain"),
                        ("http://xn--bcher-kva.de/", "domain"), ("http://example.com/", None),
                        ("https://wikipedia.org/wiki/Paris/", None), ("http://192.168.1.1/page", None),
                        ("http://a.org/casino/", "hard_blacklisted"),
                        # IDNA 2008 as URLs carry it (Python's IDNA 2003 codec made straße.de strasse.de,
                        ("http://xn--strae-oqa.de/", "domain"), ("http://strasse.de/", None),  # another domain)
                        ("http://EVIL.com/", "domain"), ("http://www.Bad.COM/x", "domain"),  # hosts' case
                        ("http://xn--i-7iq.ws/", "domain")):
        assert step.check(url) == reason, url
    for data in (b"casino\nroulette\ncaf\xe9\n", b"casino\rroulette\r\ncaf\xe9\r"):  # lines end as they are read
        words.write_bytes(data)
        with pytest.raises(UserError, match=rf"^url_filter.banned_words {words}: line 3 is not UTF-8"):
            UrlFilter(UrlFilterConfig(banned_words=str(words))).prepare()


def test_a_cutoff_file_with_a_language_twice_is_refused(tmp_path: Path) -> None:
    from pipeline.steps.perplexity import read_cutoffs

    path = tmp_path / "cutoff.csv"
    path.write_text(",en,fr,en\n" + "".join(f"{p},{p},{2 * p},{3 * p}\n" for p in range(100)))
    with pytest.raises(UserError, match=rf"^{path}: line 1: column 'en' given twice$"):
        read_cutoffs(str(path))
    with pytest.raises(UserError, match="a folder, not a file"):
        read_cutoffs(str(tmp_path))


def test_every_module_a_built_in_step_decides_with_has_its_distribution_known() -> None:
    """stats.json's versions map the built-in steps' modules to their distributions from a table
    (reading every installed distribution's files to find them took 0.2 s of every run): the table
    covers every step's worker_modules and every language's word tokenizer, and agrees with what is
    installed."""
    from importlib.metadata import packages_distributions

    from pipeline.report.stats import MODULE_DISTRIBUTIONS
    from pipeline.steps import registry
    from pipeline.steps.words import TOKENIZERS, tokenizer_modules

    modules = {m for cls in registry().values() for m in cls.worker_modules}
    modules |= {m for lang in [*TOKENIZERS, "en", "ja", "vi", "zh"] for m in tokenizer_modules(lang)}
    assert {m.partition(".")[0] for m in modules} <= set(MODULE_DISTRIBUTIONS)
    installed = packages_distributions()
    for module, distribution in MODULE_DISTRIBUTIONS.items():
        if module in installed:
            assert [d.lower() for d in installed[module]] == [distribution], module


def test_stats_json_versions_name_what_the_run_s_steps_decide_with(tmp_path: Path) -> None:
    """stats.json's ``versions`` ("what shapes the corpus") named a fixed list: not ftfy, the URL
    filter's libraries, nor the word tokenizers the quality steps split each language with. Now the
    active steps' ``worker_modules`` and, where a step splits words, the tokenizers of the languages it
    saw (the corpus's and those dropped from it on), installed ones only."""
    import json
    from collections import Counter
    from importlib.metadata import PackageNotFoundError, version

    from pipeline.report.stats import write_artifacts

    def installed(*names: str) -> set[str]:
        found = set()
        for name in names:
            try:
                version(name)
                found.add(name)
            except PackageNotFoundError:
                pass
        return found

    assert installed("spacy", "jieba", "pythainlp", "ftfy") == {"spacy", "jieba", "pythainlp", "ftfy"}  # the quality extra
    tokenizers, steps_own = ("spacy", "jieba", "pyvi", "pythainlp", "indic-nlp-library"), ("ftfy", "pyahocorasick", "tldextract")
    totals = {("de", "all"): (1, 5, 5), ("zh", "all"): (1, 5, 15)}  # the corpus: documents, characters, bytes
    counters = {"lid": {"below_threshold/hi": 1}, "gopher_quality": {"gopher_short_doc/th": 2}}  # hi: dropped before
    for sets, expected in (
            ([], set()),
            (["steps=[dedup, lid, url_filter, gopher_quality, ftfy]", "url_filter.domains=d.txt"],
             installed("spacy", "jieba", "pythainlp", *steps_own)),
            (["steps=[dedup, lid, near_dedup]", "near_dedup.scheme=datatrove"], installed("spacy", "jieba"))):
        cfg = load_config(None, {"input": ["x.wet.gz"], "output": str(tmp_path / "out")}, sets)
        write_artifacts(counters, (totals, Counter(), {}), cfg, 1, {})
        named = set(json.loads((tmp_path / "out" / "stats.json").read_text())["versions"])
        assert named & {*tokenizers, *steps_own} == expected, sets
        assert {"python", "apache-beam", "pyarrow", "numpy"} <= named
