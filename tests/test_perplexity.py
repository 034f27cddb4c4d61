"""Perplexity as CCNet computes it, buckets, cutoffs, and bad models, on LMs trained from the sample."""
from __future__ import annotations

import re
import shutil
from unittest import mock

import pytest
from reference_data import CCNET, SAMPLE_LANGS, held_out_docs, load_lm, sanity_rates, split_reference

from pipeline.util.errors import UserError
from pipeline.steps.normalize import normalize
from pipeline.steps.perplexity import (PerplexityConfig, PerplexityScorer, bucket_of, check_models, document_perplexity,
                                       read_cutoffs, write_cutoffs)


def reference_perplexity(text: str, sp, lm, ccnet_normalize) -> float:
    """Straight from the description: CCNet's normalize on the whole document (newlines deleted),
    SentencePiece pieces joined by spaces, one KenLM log10 score with <s> </s>,
    pp = 10^(-score / (pieces + 1)), rounded to 0.1."""
    pieces = sp.encode_as_pieces(ccnet_normalize(text))
    score = lm.score(" ".join(pieces), bos=True, eos=True)
    return round(10 ** (-score / (len(pieces) + 1)), 1)


@pytest.mark.parametrize("lang", ["de", "zh", "ar", "hi"])
def test_parity_with_an_independent_ccnet_computation(sample_lms, ccnet_normalizer, lang, sample):
    sp, lm = load_lm(sample_lms, lang)
    docs = held_out_docs(lang)[:40]
    assert len(docs) >= 10 and sum("\n" in d for d in docs) >= len(docs) // 2
    for doc in docs:
        assert document_perplexity(doc, sp, lm) == reference_perplexity(doc, sp, lm, ccnet_normalizer.normalize)


def test_per_line_mode_sums_over_paragraphs(sample_lms):
    sp, lm = load_lm(sample_lms, "fr")
    doc = held_out_docs("fr")[0]
    total = length = 0
    for line in doc.split("\n"):
        pieces = sp.encode(normalize(line), out_type=str)
        total += lm.score(" ".join(pieces))
        length += len(pieces) + 1
    assert document_perplexity(doc, sp, lm, "per_line") == round(10 ** (-total / length), 1)
    assert document_perplexity(doc, sp, lm, "per_line") != document_perplexity(doc, sp, lm, "document")


@pytest.mark.parametrize("lang", SAMPLE_LANGS)
def test_held_out_text_beats_shuffled_and_foreign_text(sample_lms, lang):
    vs_shuffled, vs_other = sanity_rates(sample_lms, lang)
    assert vs_shuffled >= 0.95 and vs_other >= 0.95, (vs_shuffled, vs_other)


def test_buckets():
    cutoffs = [float(i * 10) for i in range(101)]
    assert bucket_of(100.0, cutoffs, 30, 60) == "head"
    assert bucket_of(300.0, cutoffs, 30, 60) == "middle"
    assert bucket_of(599.9, cutoffs, 30, 60) == "middle"
    assert bucket_of(600.0, cutoffs, 30, 60) == "tail"
    assert bucket_of(None, cutoffs, 30, 60) == "all"
    assert bucket_of(5.0, None, 30, 60) == "all"


def test_ccnets_published_cutoff_file_is_read():
    cutoffs = read_cutoffs(str(CCNET / "data" / "cutoff.csv"))
    assert {"de", "en", "fr", "zh", "ar", "hi"} <= set(cutoffs)
    assert all(len(v) == 100 and v == sorted(v) for v in cutoffs.values())  # CCNet's has percentiles 0..99
    assert bucket_of(cutoffs["de"][30] - 1, cutoffs["de"], 30, 60) == "head"


def test_ccnets_cutoff_file_is_written_back_unchanged(tmp_path):
    original = CCNET / "data" / "cutoff.csv"
    write_cutoffs(read_cutoffs(str(original)), str(tmp_path / "cutoff.csv"))
    assert (tmp_path / "cutoff.csv").read_bytes() == original.read_bytes()


def test_cutoff_values_round_trip_exactly(tmp_path):
    values = [123456.7, 1234567.8, 98765432.1, 1e5, 0.1, 2.5e-3, 7.0, 1e16 + 2, 1.0 / 3]
    cutoffs = {"zh": sorted(values[i % len(values)] * (1 + i) for i in range(100)), "de": [float(i) for i in range(100)]}
    write_cutoffs(cutoffs, str(tmp_path / "cutoff.csv"))
    text = (tmp_path / "cutoff.csv").read_text()
    assert text.splitlines()[0] == ",zh,de" and text.splitlines()[-1].startswith("99,")
    assert "e+" not in text and ",123456.7," in text  # never cut to 6 digits, never exponent notation
    read = read_cutoffs(str(tmp_path / "cutoff.csv"))
    assert read == cutoffs and list(read) == ["zh", "de"]


def test_cutoff_bad_files(tmp_path):
    cutoffs = {"de": [float(i) for i in range(100)], "fr": [i / 2 for i in range(100)]}
    write_cutoffs(cutoffs, str(tmp_path / "cutoff.csv"))
    with pytest.raises(UserError, match="no such file"):
        read_cutoffs(str(tmp_path / "missing.csv"))
    lines = (tmp_path / "cutoff.csv").read_text().splitlines()
    (tmp_path / "short.csv").write_text("\n".join(lines[:50]))
    with pytest.raises(UserError, match="a row per percentile"):
        read_cutoffs(str(tmp_path / "short.csv"))
    lines[10] = lines[10].replace(",", ",x", 1)
    (tmp_path / "bad.csv").write_text("\n".join(lines))
    with pytest.raises(UserError, match="line 11: 'x.*' for de is not a number"):
        read_cutoffs(str(tmp_path / "bad.csv"))
    header, *rows = (tmp_path / "cutoff.csv").read_text().splitlines()
    (tmp_path / "no-column.csv").write_text("\n".join([header.rsplit(",", 1)[0], *rows]))  # "fr" left out
    with pytest.raises(UserError, match="line 2: expected percentile 0 and 1 values"):
        read_cutoffs(str(tmp_path / "no-column.csv"))


@pytest.mark.parametrize("cell, line, message", [
    ("nan", 32, "'nan' for de is not a finite perplexity"),  # no document head: nothing is below nan
    ("inf", 62, "'inf' for de is not a finite perplexity"),  # every document middle
    ("-Infinity", 2, "'-Infinity' for de is not a finite perplexity"),
    ("1e400", 100, "'1e400' for de is not a finite perplexity"),  # a float too large: inf
    ("1_000", 50, "'1_000' for de is not a number"),  # Python reads 1000, pandas a string
    ("١٥٠", 50, "'١٥٠' for de is not a number"),  # Arabic-Indic digits: the same
    ("10", 33, "'10' for de is below percentile 30's 30 "),  # the head cutoff above the ones after it
])
def test_cutoff_values_pandas_takes_and_buckets_wrongly_are_refused(tmp_path, cell, line, message):
    """pandas, CCNet's reader, takes nan and inf: a comparison with nan is false, so every perplexity
    was middle or tail, silently; so did ours. Percentiles never decrease down a column."""
    write_cutoffs({"de": [float(i) for i in range(100)], "fr": [float(i) for i in range(100)]}, str(tmp_path / "c.csv"))
    lines = (tmp_path / "c.csv").read_text().splitlines()
    percentile, _, fr = lines[line - 1].split(",")
    lines[line - 1] = ",".join([percentile, cell, fr])
    (tmp_path / "c.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=f"^{tmp_path / 'c.csv'}: line {line}: {message}"):
        read_cutoffs(str(tmp_path / "c.csv"))


def test_scorer_fallbacks(sample_lms, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("de.sp.model", "de.arpa.bin", "fr.sp.model"):
        shutil.copy(sample_lms / name, models / name)
    shutil.copy(sample_lms / "en.sp.model", models / "en.sp.model")
    shutil.copy(sample_lms / "en.arpa.bin", models / "en.arpa.bin")
    languages = check_models(str(models), None)
    assert languages == ["de", "en"]  # fr has no .arpa.bin
    # truncated after the check (or a model in a bucket, checked where a worker copies it): that
    # language's documents get bucket 'all', counted
    (models / "en.arpa.bin").write_bytes((sample_lms / "en.arpa.bin").read_bytes()[:4096])
    scorer = PerplexityScorer(PerplexityConfig(models=str(models)), languages=languages, cutoffs={"fr": [1.0] * 101})
    de = scorer({"lang": "de", "text": held_out_docs("de")[0]})
    assert de["perplexity"] > 0 and de["bucket"] == "all" and scorer.take_counts() == {"no_cutoff": 1}
    en = scorer({"lang": "en", "text": held_out_docs("en")[0]})
    assert (en["perplexity"], en["bucket"]) == (None, "all") and scorer.take_counts() == {"model_load_failed": 1}
    xx = scorer({"lang": "sw", "text": "habari ya asubuhi"})
    assert (xx["perplexity"], xx["bucket"]) == (None, "all")


def test_bad_model_files_are_clear_errors(sample_lms, tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        check_models(str(tmp_path / "nope"), None)
    shutil.copy(sample_lms / "de.sp.model", tmp_path / "de.sp.model")
    (tmp_path / "de.arpa.bin").write_bytes(b"garbage" * 100)
    with pytest.raises(UserError, match="not a KenLM binary model"):
        check_models(str(tmp_path), None)
    with pytest.raises(UserError, match="no xx.sp.model"):
        check_models(str(sample_lms), ["fr", "xx"])
    lm = (sample_lms / "de.arpa.bin").read_bytes()
    (tmp_path / "de.arpa.bin").write_bytes(lm[: len(lm) // 2])
    with pytest.raises(UserError, match=rf"de.arpa.bin: KenLM cannot load it, the file is truncated or corrupt \(Binary "
                                        rf"file has size {len(lm) // 2} but"):
        check_models(str(tmp_path), None)
    (tmp_path / "de.arpa.bin").write_bytes(lm)
    (tmp_path / "de.sp.model").write_bytes(b"not a protobuf")
    with pytest.raises(UserError, match="not a SentencePiece model"):
        check_models(str(tmp_path), None)
    sp = (sample_lms / "de.sp.model").read_bytes()
    (tmp_path / "de.sp.model").write_bytes(sp[: len(sp) // 3])  # truncated
    with pytest.raises(UserError, match="de.sp.model: not a SentencePiece model"):
        check_models(str(tmp_path), None)
    (tmp_path / "de.sp.model").write_bytes(b"")
    with pytest.raises(UserError, match="de.sp.model: an empty file, not a SentencePiece model"):
        check_models(str(tmp_path), None)


def test_train_lm_on_a_tiny_text_uses_discount_fallback(tmp_path):
    from pipeline.steps.lm import train_lm

    lines = split_reference("fr")[0][:5]
    (tmp_path / "tiny.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = train_lm("fr", [str(tmp_path / "tiny.txt")], tmp_path / "lm", vocab_size=65536)
    assert report.discount_fallback and "discount_fallback" in report.describe()
    assert report.vocab_size < 65536 and report.ngrams[1] > 0
    sp, lm = load_lm(tmp_path / "lm", "fr")
    assert document_perplexity("\n".join(lines[:3]), sp, lm) > 0
    # retrained into the same folder (--overwrite) and the disk fills while the models are copied in:
    # the models there stay whole, and nothing of the failed copy is left beside them
    before = {p.name: p.read_bytes() for p in (tmp_path / "lm").iterdir()}
    copyfile = shutil.copyfile

    def disk_full_at_the_lm(src, dst, *args, **kwargs):
        if str(src).endswith(".arpa.bin"):
            raise OSError(28, "No space left on device")
        return copyfile(src, dst, *args, **kwargs)

    with mock.patch("pipeline.steps.lm.shutil.copyfile", disk_full_at_the_lm), \
            pytest.raises(UserError, match=r"lm: cannot write the fr models \(No space left on device\)"):
        train_lm("fr", [str(tmp_path / "tiny.txt")], tmp_path / "lm", vocab_size=300, seed=1)
    assert {p.name: p.read_bytes() for p in (tmp_path / "lm").iterdir()} == before



def test_a_line_longer_than_sentencepieces_limit_is_learnt_from(tmp_path):
    """SentencePiece leaves out every line over its ``max_sentence_length`` (4,192 bytes by default)
    with a warning its log level hides: a text whose Greek came as one long line trained a model
    that had seen no Greek, and made every Greek word byte pieces."""
    from pipeline.steps.lm import train_lm

    greek = " ".join(split_reference("el")[0][:60])
    assert len(normalize(greek).encode("utf-8")) > 4192
    (tmp_path / "mixed.txt").write_text("\n".join([*split_reference("de")[0][:300], greek]) + "\n", encoding="utf-8")
    train_lm("mx", [str(tmp_path / "mixed.txt")], tmp_path / "lm", vocab_size=3000)
    sp, _ = load_lm(tmp_path / "lm", "mx")
    pieces = sp.encode(normalize(split_reference("el")[1][0]), out_type=str)
    assert pieces and not [piece for piece in pieces if piece.startswith("<0x")], pieces


def test_corrupt_cutoff_file_and_corrupt_shard_are_clear_errors(tmp_path):
    from pipeline.steps.perplexity import compute_cutoffs

    (tmp_path / "cutoff.csv").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(UserError, match="not a CSV text file"):
        read_cutoffs(str(tmp_path / "cutoff.csv"))
    shard = tmp_path / "corpus" / "lang=de" / "bucket=all" / "part-00000.arrow"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"ARROW1 but not really" * 10)
    with pytest.raises(UserError, match="part-00000.arrow: not a corpus shard"):
        compute_cutoffs(str(tmp_path / "corpus"), 100, 0)


def test_cutoffs_leave_out_a_writers_leftover(tmp_path):
    """A shard writer killed outside the run's cleanup leaves ``part-N.arrow.tmp-<hex>`` beside the
    shards: its documents are not the corpus's (they were counted twice)."""
    import pyarrow as pa

    from pipeline.output.shards import SCHEMA, write_table
    from pipeline.steps.perplexity import compute_cutoffs

    shard = tmp_path / "lang=de" / "bucket=all" / "part-00000.arrow"
    shard.parent.mkdir(parents=True)
    rows = {"id": [f"d{i}" for i in range(20)], "lang": ["de"] * 20, "perplexity": [100.0 + i * i for i in range(20)]}
    write_table(pa.table({f.name: rows.get(f.name, [None] * 20) for f in SCHEMA}, schema=SCHEMA), str(shard), "arrow")
    before = compute_cutoffs(str(tmp_path), 100_000, 0)
    write_table(pa.table({f.name: rows.get(f.name, [None] * 20) if f.name != "perplexity" else [1.0] * 20
                          for f in SCHEMA}, schema=SCHEMA), f"{shard}.tmp-0123abcd", "arrow")
    assert compute_cutoffs(str(tmp_path), 100_000, 0) == before and before[1] == {"de": 20}


def test_a_non_finite_perplexity_and_an_out_that_is_no_cutoff_table_are_one_line(tmp_path, capsys):
    """One NaN in a shard edited by hand made its language's every cutoff NaN (``pipeline run`` then
    refused the file); ``--out`` replaced whatever file it named (a corpus's stats.json)."""
    import pyarrow as pa

    from pipeline.__main__ import main
    from pipeline.output.shards import SCHEMA, write_table
    from pipeline.steps.perplexity import compute_cutoffs

    shard = tmp_path / "corpus" / "lang=de" / "bucket=all" / "part-00000.arrow"
    shard.parent.mkdir(parents=True)
    rows = {"id": [f"d{i}" for i in range(20)], "lang": ["de"] * 20, "perplexity": [100.0 + i * i for i in range(20)]}
    write_table(pa.table({f.name: rows.get(f.name, [None] * 20) for f in SCHEMA}, schema=SCHEMA), str(shard), "arrow")
    stats = tmp_path / "corpus" / "stats.json"
    stats.write_text("{}")
    assert main(["cutoffs", "--corpus", str(tmp_path / "corpus"), "--out", str(stats)]) == 2
    assert stats.read_text() == "{}"
    (tmp_path / "cutoff.csv").write_text("")  # made by mktemp, say
    capsys.readouterr()
    assert main(["cutoffs", "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "cutoff.csv")]) == 0
    assert capsys.readouterr().err == ("warning: cutoffs of de (20) from fewer than 100 documents: too few to "
                                       "tell 100 percentiles apart\n")  # (they were said nothing of)
    assert main(["cutoffs", "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "cutoff.csv"), "--sample", "1"]) == 0
    assert capsys.readouterr().err.endswith("de (1) from fewer than 100 documents: too few to tell 100 "
                                            "percentiles apart (--sample 1 drew no more)\n")
    assert main(["cutoffs", "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "cutoff.csv")]) == 0
    table = (tmp_path / "cutoff.csv").read_text()
    lines = table.splitlines()
    lines[5] = "4,nan"  # an earlier one from a NaN perplexity: read_cutoffs refuses it, and it is replaced
    (tmp_path / "cutoff.csv").write_text("\n".join(lines) + "\n")
    assert main(["cutoffs", "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "cutoff.csv")]) == 0
    assert (tmp_path / "cutoff.csv").read_text() == table
    rows["perplexity"][7] = float("nan")
    write_table(pa.table({f.name: rows.get(f.name, [None] * 20) for f in SCHEMA}, schema=SCHEMA), str(shard), "arrow")
    with pytest.raises(UserError, match=f"^{re.escape(str(shard))}: document d7: perplexity nan is not a finite number"):
        compute_cutoffs(str(tmp_path / "corpus"), 100, 0)


def test_what_sentencepiece_keeps_nothing_of_has_no_perplexity(sample_lms, tmp_path):
    """Zero-width spaces and byte-order marks survive CCNet's normalization but not SentencePiece's:
    CCNet's DocLM gives an empty ``tokenized`` no perplexity (bucket all); scoring ``<s> </s>`` gave
    328.3, the head of CCNet's cutoffs. In ``per_line`` mode a text of two lines is not empty
    (DocLM scores each line: test_ccnet_parity.py)."""
    from pipeline.steps.lm import train_lm

    sp, lm = load_lm(sample_lms, "de")
    for text in ("\u200b", "\ufeff\u200b", "\u200b\n\ufeff"):
        assert normalize(text) and document_perplexity(text, sp, lm) is None, repr(text)
    for text in ("\u200b", "\ufeff\u200b"):
        assert document_perplexity(text, sp, lm, "per_line") is None, repr(text)
    (tmp_path / "invisible.txt").write_text("\u200b\n\ufeff\n", encoding="utf-8")  # SentencePiece's trainer aborted
    with pytest.raises(UserError, match="no character SentencePiece keeps"):  # the process (exit 255)
        train_lm("de", [str(tmp_path / "invisible.txt")], tmp_path / "lm")


def test_perplexity_settings_without_models_and_blank_cutoff_lines(tmp_path):
    """drop_buckets, max_perplexity, cutoffs or languages set without models: the step does not run,
    so nothing they ask for happened, silently; now one line. A blank last line in a cutoff.csv
    (which pandas, CCNet's reader, skips) was refused."""
    from pipeline.config import load_config

    base = {"input": ["x.warc.wet.gz"], "output": str(tmp_path / "out")}
    with pytest.raises(UserError, match="max_perplexity set without perplexity.models"):
        load_config(None, base, ["perplexity.max_perplexity=100"])
    with pytest.raises(UserError, match="languages set without perplexity.models"):
        load_config(None, base, ["perplexity.languages=[de]"])
    original = (CCNET / "data" / "cutoff.csv").read_text()
    (tmp_path / "blank.csv").write_text(original + "\n")
    assert read_cutoffs(str(tmp_path / "blank.csv")) == read_cutoffs(str(CCNET / "data" / "cutoff.csv"))
