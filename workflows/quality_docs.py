"""Documents for the quality filters' parity test and benchmark: the bundled sample's pages, and
planted documents that sweep each FineWeb-2 check across its threshold in each XNLI language."""
from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import ReadConfig
from pipeline.readers.files import read_file

from reference_data import SAMPLE

TESTS = Path(__file__).resolve().parents[1] / "tests"
XNLI = ("en", "fr", "es", "de", "el", "bg", "ru", "tr", "ar", "vi", "th", "zh", "hi", "sw", "ur")
FW2_FILES = {"ar": "arb_Arab", "bg": "bul_Cyrl", "de": "deu_Latn", "el": "ell_Grek", "es": "spa_Latn",
             "fr": "fra_Latn", "hi": "hin_Deva", "ru": "rus_Cyrl", "sw": "swh_Latn", "th": "tha_Thai",
             "tr": "tur_Latn", "ur": "urd_Arab", "vi": "vie_Latn", "zh": "cmn_Hani"}
"""lid.176 code -> FineWeb-2's config name (tests/data/fineweb2/<name>.yml, copied verbatim)."""

PLANTED_LINES = {  # for the languages the sample has no pages in: a few plain sentences each
    "bg": ["Това е първото изречение на документа.", "Градът е разположен на брега на реката.",
           "Учениците четат книги в библиотеката всеки ден.", "Времето днес е слънчево и топло.",
           "Той отиде на пазара, за да купи хляб и мляко.", "Музеят е отворен от девет до пет часа."],
    "th": ["วันนี้อากาศดีมากและท้องฟ้าแจ่มใส", "นักเรียนไปโรงเรียนทุกวันตอนเช้า",
           "เมืองนี้มีตลาดที่ใหญ่ที่สุดในภาคเหนือ", "เขาชอบอ่านหนังสือที่ห้องสมุดในวันหยุด",
           "ร้านอาหารนี้เปิดตั้งแต่เช้าจนถึงค่ำ", "แม่น้ำสายนี้ไหลผ่านหลายจังหวัด"],
    "sw": ["Hii ni sentensi ya kwanza ya hati hii.", "Mji huu uko karibu na pwani ya bahari.",
           "Wanafunzi wanasoma vitabu kwenye maktaba kila siku.", "Hali ya hewa leo ni nzuri na ya joto.",
           "Alikwenda sokoni kununua mkate na maziwa.", "Makumbusho yanafunguliwa kuanzia saa tatu asubuhi."],
    "ur": ["یہ دستاویز کا پہلا جملہ ہے۔", "شہر دریا کے کنارے پر واقع ہے۔", "طلبہ ہر روز کتب خانے میں کتابیں پڑھتے ہیں۔",
           "آج موسم دھوپ والا اور گرم ہے۔", "وہ روٹی اور دودھ خریدنے بازار گیا۔", "عجائب گھر نو بجے سے پانچ بجے تک کھلا رہتا ہے۔"],
}


def sample_pages() -> list[str]:
    """The text of every page of the bundled sample's WET files."""
    texts = []
    for path in sorted(glob.glob(str(SAMPLE / "wet" / "*.warc.wet.gz"))):
        texts.extend(r["text"] for r in read_file(path, ReadConfig()) if isinstance(r, dict))
    return texts


def base_lines(lang: str, n: int = 30) -> list[str]:
    """``n`` distinct real lines of ``lang`` (the sample's reference text, or the planted sentences)."""
    ref = SAMPLE / "ref" / f"{lang}.txt"
    if ref.exists():
        seen: dict[str, None] = {}
        for line in ref.read_text(encoding="utf-8").splitlines():
            if len(line.split()) >= 4 or (lang == "zh" and len(line) >= 12):
                seen.setdefault(line.strip())
            if len(seen) == n:
                break
        return list(seen)
    lines = PLANTED_LINES[lang]
    return [f"{line} ({i})" if i >= len(lines) else line for i, line in
            ((i, lines[i % len(lines)]) for i in range(n))]


def planted(lang: str, stop_words: list[str], step: int = 1) -> list[str]:
    """Documents sweeping each check of the three filters across its threshold (``step`` thins the sweeps)."""
    lines = base_lines(lang)
    words = " ".join(lines).split()
    doc = "\n".join(lines)
    out = ["", " ", "\n\n", "...", "| | |", "#", doc]
    for k in range(0, 31, step):
        out.append("\n".join(lines + lines[:k]))  # repeated lines
        out.append("\n".join(lines[:10] + [lines[0]] * k))  # the same line again and again
        out.append(doc + "\n" + " ".join(words[:2] * k))  # a frequent 2-gram
        out.append(doc + "\n" + " ".join(words[3:6] * k))  # 3-gram
        out.append(doc + "\n" + " ".join(words[6:10] * k))  # 4-gram
        out.append(doc + "\n" + " ".join(words[10:22] * (k // 3 + 1)))  # repeated 5- to 10-grams
        out.append("\n".join(line.rstrip(".。!?؟۔") if i < k else line for i, line in enumerate(lines)))
        out.append("\n".join(lines[:30 - k] + [w for line in lines[30 - k:] for w in line.split()]))  # list-like
        out.append("\n".join(f"- {line}" if i < k else line for i, line in enumerate(lines)))  # bullets
        out.append("\n".join(f"{line}..." if i < k else line for i, line in enumerate(lines)))  # end ellipses
        out.append(doc + " #" * (k * 4))  # hashes
        out.append(doc + "\n" + " ".join(["123", "4,5", "67%"] * (k * 4)))  # non-alphabetic words
        out.append(doc + "\n" + " ".join(["Überlänge" * 3] * (k * 3)))  # long words
        out.append(doc + "\n" + " ".join(["a", "b"] * (k * 10)))  # short words
        out.append(" ".join(words[:k + 40]))  # around the minimum word count
        out.append(" ".join(w for w in words if w not in stop_words) + " " + " ".join(stop_words[:k % 4]))
    out.append("\n".join(lines) * 3)
    return out


PII_AND_MOJIBAKE = [
    "Write to jean.dupont@exemple.fr or admin@[192.168.0.1], not to @nobody or x@y.",
    "Servers: 8.8.8.8, 10.0.0.1, 192.168.1.1, 127.0.0.1, 256.1.1.1, 1.2.3.4.5 and 172.217.16.14.",
    "mojibake: The Mona Lisa doesnâ€™t have eyebrows. Ã©tÃ© ÐŸÑ€Ð¸Ð²ÐµÑ‚ &amp; &lt;b&gt;",
    "control\x00chars\x07 and \x1b[31mterminal escapes\x1b[0m and \x85 C1",
    "a table\n| | |\n|---|---|\n| x | y |\n||||\n\nend",
    "price: 5€ — “quoted” ‘text’ ﬁ ligature, full-width ＡＢＣ",
    "only ascii here, & an ampersand",
    "a first line\nÃ  la carte, then Ã© and Ã¨", "Â  starts the text", "zero\u200bwidth, a \ufeffBOM and \u206a",
    "accents à é ü ñ ç and Ã© together", "no\u0085next line, \x9d C1 alone",
]


def reference_filters(lang: str) -> tuple[Any, Any, Any]:
    """Datatrove's three filters for ``lang`` as fineweb-2-pipeline.py constructs them (imported
    here: datatrove is only in the dev extra)."""
    from datatrove.pipeline.filters import FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter

    if lang == "en":
        return GopherRepetitionFilter(language="eng"), FineWebQualityFilter(language="eng"), GopherQualityFilter(language="eng")
    name = FW2_FILES[lang]
    c = yaml.safe_load((TESTS / "data" / "fineweb2" / f"{name}.yml").read_text(encoding="utf-8"))
    return (GopherRepetitionFilter(language=name, dup_para_frac=0, dup_line_char_frac=0, dup_para_char_frac=0,
                                   dup_line_frac=c["dup_line_frac"], top_n_grams=c["top_n_grams"],
                                   dup_n_grams=c["dup_n_grams"]),
            FineWebQualityFilter(language=name, short_line_thr=999, char_duplicates_ratio=0.1,
                                 line_punct_thr=c["line_punct_thr"], new_line_ratio=c["new_line_ratio"]),
            GopherQualityFilter(language=name, max_avg_word_length=c["max_avg_word_length"],
                                min_avg_word_length=c["min_avg_word_length"], stop_words=c["stopwords"],
                                max_non_alpha_words_ratio=c["max_non_alpha_words_ratio"], min_stop_words=2))


def restart_pii_turn(formatter: Any) -> None:
    """Start datatrove's PIIFormatter replacements again at the first, as ours do for every document
    (its turn otherwise carries over from the task's previous document: README, differences)."""
    for replacer in ("emails_replacer", "ip_replacer"):
        if hasattr(formatter, replacer):
            getattr(formatter, replacer)._replace_i = 0


def reference_values(lang: str) -> dict[str, Any]:
    """FineWeb-2's values for ``lang`` as fineweb-2-pipeline.py applies them (English: FineWeb's,
    datatrove's defaults), from the verbatim copies in tests/data/fineweb2/."""
    if lang == "en":
        return {"dup_line_frac": 0.3, "top_n_grams": [[2, 0.2], [3, 0.18], [4, 0.16]],
                "dup_n_grams": [[5, 0.15], [6, 0.14], [7, 0.13], [8, 0.12], [9, 0.11], [10, 0.1]],
                "line_punct_thr": 0.12, "new_line_ratio": 0.3, "char_duplicates_ratio": 0.01, "min_avg_word_length": 3,
                "max_avg_word_length": 10, "max_non_alpha_words_ratio": 0.8,
                "stopwords": ["the", "be", "to", "of", "and", "that", "have", "with"]}
    values = yaml.safe_load((TESTS / "data" / "fineweb2" / f"{FW2_FILES[lang]}.yml").read_text(encoding="utf-8"))
    return {**values, "char_duplicates_ratio": 0.1}


def bracket(build: Any, crossed: Any, high: int = 3000) -> list[str]:
    """``build(k)`` for the two neighbouring ``k`` on either side of where ``crossed(text)`` turns
    (binary search between 0 and ``high``); [] when it does not turn in that range."""
    lo, hi = 0, high
    at_lo = crossed(build(lo))
    if at_lo == crossed(build(hi)):
        return []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if crossed(build(mid)) == at_lo:
            lo = mid
        else:
            hi = mid
    return [build(lo), build(hi)]


def latin(i: int) -> str:
    """A unique alphabetic token that every tokenizer keeps whole."""
    letters = "bcdfghjklmnpqrstvwxz"
    out = ""
    while True:
        i, r = divmod(i, len(letters))
        out += letters[r]
        if not i:
            return "ka" + out


def boundary_docs(lang: str) -> list[str]:
    """For each of ``lang``'s FineWeb-2 values, the two documents just either side of it: moving any
    one value in the profile (by 0.001 for a fraction, 1 for a length) changes a decision."""
    from pipeline.steps.quality import LINES, Ngrams, duplicates
    from pipeline.steps.words import split_words

    v = reference_values(lang)
    words = lambda text: split_words(text, lang)  # noqa: E731
    stops = [s for s in v["stopwords"] if words(f"{latin(0)} {s} {latin(1)}") == [latin(0), s, latin(1)]]
    two_stops = " ".join(stops[:2])
    docs: list[str] = []

    def add(pair: list[str], what: str) -> None:
        assert pair, f"{lang}: no pair of documents straddles {what}"
        docs.extend(pair)

    # Gopher repetition: repeated lines, the most frequent n-gram, repeated n-grams
    unique = [f"{latin(i)} {latin(i + 7)} {latin(i + 11)}." for i in range(1000)]
    add(bracket(lambda k: "\n".join(unique[:1000 - k] + [unique[0]] * k),
                lambda t: (lambda ls: duplicates(ls)[0] / len(ls))(LINES.split(t)) > v["dup_line_frac"], 600), "dup_line_frac")
    for n, frac in v["top_n_grams"]:
        gram = " ".join(latin(5000 + j) for j in range(n))
        base = " ".join(f"{gram} {latin(i)}" for i in range(60))
        add(bracket(lambda k: base + " " + " ".join(latin(9000 + i) for i in range(k)),
                    lambda t: Ngrams(words(t), " ").top(n) / len(t) > frac), f"top_{n}_gram")
    for n, frac in v["dup_n_grams"]:
        phrase = " ".join(latin(6000 + j) for j in range(n))
        base = " ".join(f"{phrase} {latin(i)}" for i in range(30))
        add(bracket(lambda k: base + " " + " ".join(latin(9000 + i) for i in range(k)),
                    lambda t: Ngrams(words(t), "").repeated(n) / len(t) > frac), f"duplicated_{n}_n_grams")
    # FineWeb quality: lines ending in punctuation, line breaks per word, repeated-line characters
    bare = [f"{latin(i)} {latin(i + 3)}" for i in range(1000)]
    if v["line_punct_thr"] > 0:
        add(bracket(lambda k: "\n".join(f"{line}." if i < k else line for i, line in enumerate(bare)),
                    lambda t: sum(line.endswith(".") for line in t.split("\n")) / 1000 < v["line_punct_thr"], 1000),
            "line_punct_thr")
    lines = [f"{latin(i) * 3}." for i in range(300)]
    add(bracket(lambda k: "\n".join(lines) + " " + " ".join(latin(9000 + i) for i in range(k)),
                lambda t: t.count("\n") / len(words(t)) > v["new_line_ratio"]), "new_line_ratio")
    add(bracket(lambda k: "\n".join([unique[0]] * 12 + unique[1:40]) + " " + " ".join(latin(9000 + i) for i in range(k)),
                lambda t: duplicates(t.split("\n"))[1] / (len(t) - t.count("\n")) > v["char_duplicates_ratio"]),
        "char_duplicates_ratio")
    # Gopher quality: mean word length, alphabetic words, stop words
    for key, long, short in (("max_avg_word_length", "x" * (v["max_avg_word_length"] + 4), "x" * 2),
                             ("min_avg_word_length", "x" * (v["min_avg_word_length"] + 2), "x")):
        if v[key] > 1:
            add(bracket(lambda k: " ".join([long] * k + [short] * (400 - k)) + " " + two_stops,
                        lambda t: (lambda ws: sum(map(len, ws)) / len(ws))(words(t)) > v[key], 400), key)
    add(bracket(lambda k: " ".join([latin(i) for i in range(1000 - k)] + ["1234"] * k) + " " + two_stops,
                lambda t: sum(any(c.isalpha() for c in w) for w in words(t)) / len(words(t))
                < v["max_non_alpha_words_ratio"], 1000), "max_non_alpha_words_ratio")
    filler = " ".join(latin(i) for i in range(80))
    assert len(stops) >= 2, f"{lang}: fewer than two stop words are tokens of their own"
    docs += [f"{filler} {s} {stops[(i + 1) % len(stops)]}" for i, s in enumerate(stops)] + [f"{filler} {s}" for s in stops[:3]]
    return docs
