"""Normalization and paragraph hashes against CCNet's own text_normalizer, on tricky and real text."""
from __future__ import annotations

import hashlib

import pytest

from pipeline.steps.normalize import normalize, normalize_for_dedup, paragraph_hash, paragraph_hashes

TRICKY = [
    "Café Ünïcödé naïve résumé",                      # accents
    "Preis: １２３，４５ € — ２０２４年",                 # full-width digits, CJK comma, em dash
    "「引用」《书名》，句号。问号？感叹！（括号）【方】％",   # CJK punctuation
    "مرحبا بالعالم ١٢٣ «اقتباس»",                      # RTL Arabic with Arabic-Indic digits
    "עברית 456 ‏mark",                                 # Hebrew with a right-to-left mark
    "ह िंदी ० १ २ देवनागरी",                              # Devanagari digits and combining signs
    "  tabs\tand\x00control\x1f chars\x7f\x85 ",        # control characters (C0 and C1)
    "line one\nline two\r\nthree",                    # newlines are deleted without a space
    "한국어 텍스트",                                      # Hangul: CCNet keeps the NFD form
    "Ελληνικά με τόνους και ΚΕΦΑΛΑΙΑ",
    "…ellipsis ‘single’ “double” „low” ´acute –en ►arrow ━bar ～tilde",
    "",
    "   ",
]


@pytest.mark.parametrize("text", TRICKY)
def test_normalize_matches_ccnet(text, ccnet_normalizer):
    assert normalize(text) == ccnet_normalizer.normalize(text)


@pytest.mark.parametrize("text", TRICKY)
def test_normalize_for_dedup_matches_ccnet(text, ccnet_normalizer):
    assert normalize_for_dedup(text) == ccnet_normalizer.normalize_for_dedup(text)


def test_real_sample_text_matches_ccnet(sample, ccnet_normalizer):
    lines = []
    for path in sorted((sample / "ref").glob("*.txt")):
        lines.extend(path.read_text(encoding="utf-8").splitlines()[:300])
    assert len(lines) > 1000
    for line in lines:
        assert normalize(line) == ccnet_normalizer.normalize(line), line
        assert normalize_for_dedup(line) == ccnet_normalizer.normalize_for_dedup(line), line


def test_specific_rules():
    assert normalize_for_dedup("Éte ２０２４，“ok”") == "éte 0000ok"  # accents kept, punct removed
    assert normalize("Éte ２０２４，“ok”") == 'ete 0000,"ok"'      # accents stripped, punct replaced
    assert normalize("a\nb") == "ab"                                 # glued, as CCNet does
    assert normalize_for_dedup("٣ apples") == normalize_for_dedup("7 APPLES")


def test_paragraph_hash_is_ccnet_str_hash():
    # CCNet: np.frombuffer(sha1(normalize_for_dedup(s)).digest()[:8], dtype=np.uint64) (little endian)
    import numpy as np

    line = "Hello ２０２４ World!"
    expected = np.frombuffer(hashlib.sha1(normalize_for_dedup(line).encode()).digest()[:8], dtype="<u8")[0]
    assert paragraph_hash(line) == int(expected)
    assert paragraph_hash("Hello 1999 world!") == paragraph_hash(line)
    assert paragraph_hash("Hello world") != paragraph_hash("Hello word")


def test_every_code_point_matches_ccnet(ccnet_normalizer):
    """Each code point, in context (a letter before, an accented letter and a digit after)."""
    mismatches = []
    for start in range(0, 0x110000, 256):
        chunk = "".join(f"a{chr(c)}É1 " for c in range(start, start + 256))
        if normalize(chunk) != ccnet_normalizer.normalize(chunk) or \
                normalize_for_dedup(chunk) != ccnet_normalizer.normalize_for_dedup(chunk):
            mismatches.append(hex(start))
    assert not mismatches


def per_line_hashes(text: str) -> bytes:
    return b"".join(paragraph_hash(line).to_bytes(8, "little") for line in text.split("\n"))


def test_whole_text_hashes_equal_per_line_hashes(sample):
    """paragraph_hashes normalizes a document at once: same hashes as line by line, on tricky text
    (final sigma before a newline, control characters, blank and space-only lines) and real text."""
    tricky = "\n".join(TRICKY) + "\nΟΔΟΣ\nΟΔΟΣ \n ΟΔΟΣ.\n\n\t\n\x85x\x1e\nİstanbul ǅ\n"
    assert paragraph_hashes(tricky) == per_line_hashes(tricky)
    assert paragraph_hashes("") == per_line_hashes("") and len(paragraph_hashes("a\n\nb")) == 24
    for path in sorted((sample / "ref").glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        assert paragraph_hashes(text) == per_line_hashes(text), path.name


def test_hashes_of_the_readers_documents_need_no_second_strip(sample):
    """The reader strips every line, so the hash pass leaves that out: the same hashes."""
    from pipeline.config import ReadConfig
    from pipeline.readers.files import read_file

    for empty_lines in (False, True):
        for path in sorted((sample / "wet").glob("*.warc.wet.gz")):
            docs = [r for r in read_file(str(path), ReadConfig(empty_lines=empty_lines)) if isinstance(r, dict)]
            assert len(docs) > 100
            for doc in docs:
                assert paragraph_hashes(doc["text"], stripped=True) == paragraph_hashes(doc["text"]), doc["id"]


def test_whole_text_hashes_on_every_code_point():
    for start in range(0, 0x110000, 4096):
        chars = [chr(c) for c in range(start, start + 4096) if not 0xD800 <= c < 0xE000]  # no UTF-8 for surrogates
        text = "\n".join(f"Σ{c}É1 x{c}" for c in chars)
        assert paragraph_hashes(text) == per_line_hashes(text), hex(start)
