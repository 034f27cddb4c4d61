"""The SentencePiece tokenizer: alpha-sampled training text, XLM-R id layout, HF transformers parity, errors."""
from __future__ import annotations

import io
import json
import re
import shutil
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from pipeline.util.errors import UserError
from pretrain.__main__ import main
from pretrain.tokenizer import HF_MODEL, OUR_MODEL, Tokenizer, language_shards, read_texts, train_tokenizer
from pretrain_fixtures import SAMPLE_VOCAB

DOCS_PER_LANGUAGE = 25


def sample_texts(corpus: Path) -> dict[str, list[str]]:
    """The first documents of every language of the sample corpus."""
    return {lang: read_texts(paths[0])[:DOCS_PER_LANGUAGE] for lang, paths in language_shards(corpus).items()}


def test_id_layout_matches_xlmr(sample_tokenizer: Path) -> None:
    import sentencepiece as spm

    tok = Tokenizer.load(sample_tokenizer)
    ours = spm.SentencePieceProcessor(model_file=str(sample_tokenizer / OUR_MODEL))
    fairseq = spm.SentencePieceProcessor(model_file=str(sample_tokenizer / HF_MODEL))
    assert tok.vocab_size == SAMPLE_VOCAB == fairseq.get_piece_size() + 2
    assert [ours.id_to_piece(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert ours.id_to_piece(tok.mask_id) == "<mask>" and tok.mask_id == SAMPLE_VOCAB - 1
    assert (ours.bos_id(), ours.pad_id(), ours.eos_id(), ours.unk_id()) == (0, 1, 2, 3)
    assert [fairseq.id_to_piece(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]
    for k in range(3, fairseq.get_piece_size()):  # fairseq offset: SentencePiece piece k is our id k + 1
        assert ours.id_to_piece(k + 1) == fairseq.id_to_piece(k)
    assert tok.word_start[ours.piece_to_id("\u2581the")] and not tok.word_start[ours.piece_to_id("s")]
    meta = json.loads((sample_tokenizer / "tokenizer_meta.json").read_text())
    assert meta["fingerprint"] == tok.fingerprint and meta["special_ids"]["mask"] == tok.mask_id
    text = "Ein kleines Beispiel."
    assert tok.encode(text) == [i + 1 if i >= 3 else 3 for i in fairseq.encode(text)]


def test_sample_follows_q(sample_tokenizer: Path, sample_corpus: Path) -> None:
    meta = json.loads((sample_tokenizer / "tokenizer_meta.json").read_text())
    sampling = json.loads((sample_corpus / "sampling.json").read_text())["languages"]
    assert meta["alpha"] == 0.3 and set(meta["languages"]) == set(sampling)
    total = sum(row["drawn"] for row in meta["languages"].values())
    for lang, row in meta["languages"].items():
        assert row["q"] == pytest.approx(sampling[lang]["q"])
        assert row["drawn"] == row["target"] == round(meta["sample_size"] * row["q"])
        assert row["drawn"] / total == pytest.approx(row["q"], abs=1e-3)
    # alpha flattens the mix: the smallest language (hi) gets more than its share p_i
    assert meta["languages"]["hi"]["q"] > sampling["hi"]["p"]


def test_lids_unknown_is_no_language_of_the_mix(sample_corpus: Path, tmp_path: Path) -> None:
    """A corpus whose LID kept unsure documents as ``lang=unknown`` (``below_threshold: unknown``):
    sampling.json leaves them out, and so do the tokenizer and the token shards, unless named."""
    from pretrain.tokenizer import language_shards

    corpus = tmp_path / "corpus"
    shutil.copytree(sample_corpus, corpus)
    shutil.copytree(corpus / "lang=de", corpus / "lang=unknown")
    assert set(language_shards(str(corpus))) == set(json.loads((corpus / "sampling.json").read_text())["languages"])
    assert set(language_shards(str(corpus), languages=["unknown", "de"])) == {"unknown", "de"}


def test_round_trip_in_every_language(sample_tokenizer: Path, sample_corpus: Path) -> None:
    tok = Tokenizer.load(sample_tokenizer)
    exact = {}
    for lang, texts in sample_texts(sample_corpus).items():
        exact[lang] = 0
        for text in texts:
            ids = tok.encode(text)
            assert ids and min(ids) >= 3 and max(ids) < tok.mask_id  # no <s> <pad> </s> <mask> from text
            if tok.unk_id in ids:
                continue
            squashed = " ".join(text.split())
            # lossless up to SentencePiece's nmt_nfkc normalization (NFKC, whitespace squashed, marks as spaces)
            assert tok.decode(ids) == tok.sp.normalize(text).replace("\u2581", " ").strip()
            exact[lang] += tok.decode(ids) == squashed
    # literally (text already NFKC) in at least 10 languages; zh text is mostly full-width punctuation
    # (NFKC changes it) and rare characters (<unk> with a 4,000-piece vocabulary)
    assert len(exact) == 11 and sum(n >= 5 for n in exact.values()) >= 10, sorted(exact.items())


def score(sp, pieces: list[str]) -> float:
    return sum(sp.get_score(sp.piece_to_id(p)) for p in pieces)


def assert_same_or_tie(tok: Tokenizer, ours: list[int], theirs: list[int]) -> bool:
    """True when the ids are equal; otherwise they must be an equal-score segmentation of the same text
    (the Viterbi tie SentencePiece and HF tokenizers break differently, e.g. '...' + '.' vs '.' + '...')."""
    if ours == theirs:
        return True
    mine, other = [tok.sp.id_to_piece(i) for i in ours], [tok.sp.id_to_piece(i) for i in theirs]
    assert "".join(mine) == "".join(other)
    assert score(tok.sp, mine) == pytest.approx(score(tok.sp, other), abs=1e-4)
    return False


def test_hf_tokenizers_give_our_ids(sample_tokenizer: Path, sample_corpus: Path) -> None:
    from transformers import AutoTokenizer, DebertaV2Tokenizer, XLMRobertaTokenizer

    tok = Tokenizer.load(sample_tokenizer)
    assert isinstance(AutoTokenizer.from_pretrained(sample_tokenizer), XLMRobertaTokenizer)
    xlmr = XLMRobertaTokenizer.from_pretrained(sample_tokenizer)
    deberta = DebertaV2Tokenizer.from_pretrained(sample_tokenizer)
    for hf in (xlmr, deberta):
        assert len(hf) == tok.vocab_size
        assert (hf.cls_token_id, hf.pad_token_id, hf.sep_token_id, hf.unk_token_id, hf.mask_token_id) == \
            (tok.bos_id, tok.pad_id, tok.eos_id, tok.unk_id, tok.mask_id)
    equal = total = 0
    for lang, texts in sample_texts(sample_corpus).items():
        for text in texts:
            ours = tok.encode(text)
            assert xlmr(text)["input_ids"][0] == tok.bos_id and xlmr(text)["input_ids"][-1] == tok.eos_id
            equal += assert_same_or_tie(tok, ours, xlmr(text, add_special_tokens=False)["input_ids"])
            total += 1
            # HF v5's DebertaV2Tokenizer normalizes with NFC, not the model's nmt_nfkc charsmap: compare on text
            # SentencePiece has normalized already (where NFC leaves that unchanged)
            normalized = tok.sp.normalize(text).replace("\u2581", " ").strip()
            if unicodedata.normalize("NFC", normalized) == normalized:
                equal += assert_same_or_tie(tok, ours, deberta(normalized, add_special_tokens=False)["input_ids"])
                total += 1
            if tok.unk_id not in ours:
                assert xlmr.decode(ours) == tok.decode(ours)
    assert equal / total > 0.95, (equal, total)


def test_cli_prints_sample_sizes_and_is_deterministic(sample_corpus: Path, tmp_path: Path, capsys) -> None:
    args = ["tokenizer", "--corpus", str(sample_corpus), "--vocab-size", "1000", "--sample-size", "3000",
            "--short-languages", "cap", "--alpha", "0.5", "--languages", "de", "el", "hi", "zh"]
    assert main(args + ["--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "recomputed from" in out and "alpha=0.5" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line[:2] in ("de", "el", "hi", "zh")}
    assert set(rows) == {"de", "el", "hi", "zh"} and all(int(r[4]) <= int(r[3]) for r in rows.values())
    assert main(args + ["--out", str(tmp_path / "b")]) == 0
    for name in (OUR_MODEL, HF_MODEL, "tokenizer_meta.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_cli_help_documents_every_option(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["tokenizer", "--help"])
    out = capsys.readouterr().out
    for option in ("--corpus", "--out", "--vocab-size", "--alpha", "--buckets", "--languages", "--sample-size",
                   "--short-languages", "--character-coverage", "--byte-fallback", "--seed", "--threads"):
        assert option in out


def test_bad_input_is_one_line(sample_corpus: Path, sample_tokenizer: Path, tmp_path: Path, capsys) -> None:
    from pipeline.output.shards import docs_to_table, output_table, write_table

    corpus = tmp_path / "corpus"
    shutil.copytree(sample_corpus, corpus)
    empty = corpus / "lang=xx" / "bucket=all" / "part-00000.arrow"
    empty.parent.mkdir(parents=True)
    write_table(docs_to_table([]), str(empty), "arrow")
    assert main(["tokenizer", "--corpus", str(corpus), "--out", str(tmp_path / "t"), "--vocab-size", "1000"]) == 2
    assert "lang=xx" in capsys.readouterr().err
    for option, value, message in (("--character-coverage", "nan", "must be 0.98 to 1"),  # a traceback; the others
                                   ("--character-coverage", "2", "must be 0.98 to 1"),    # SentencePiece's own line
                                   ("--threads", "0", "must be 1 to 1024")):              # after the sampling
        assert main(["tokenizer", "--corpus", str(corpus), "--out", str(tmp_path / "t"), option, value]) == 2
        assert capsys.readouterr().err.startswith(f"error: {option} {float(value) if 'cov' in option else value}: "
                                                  f"{message} (SentencePiece's range)")
    shutil.rmtree(corpus / "lang=xx")
    sampling = corpus / "sampling.json"
    sampling.write_text(sampling.read_text()[:40])
    assert main(["tokenizer", "--corpus", str(corpus), "--out", str(tmp_path / "t"), "--vocab-size", "1000"]) == 2
    assert f"corpus statistics {sampling}: not valid JSON" in capsys.readouterr().err
    edited = json.loads((sample_corpus / "sampling.json").read_text())
    del edited["languages"]["de"]["q"]
    sampling.write_text(json.dumps(edited))
    assert main(["tokenizer", "--corpus", str(corpus), "--out", str(tmp_path / "t"), "--vocab-size", "1000"]) == 2
    assert f"corpus statistics {sampling}: not as pipeline run writes it (KeyError: 'q')" in capsys.readouterr().err
    for q in (float("nan"), -5):  # NaN was a traceback further on; -5 a weight printed and used
        edited["languages"]["de"]["q"] = q
        sampling.write_text(json.dumps(edited))
        assert main(["tokenizer", "--corpus", str(corpus), "--out", str(tmp_path / "t"), "--vocab-size", "1000"]) == 2
        assert (f"corpus statistics {sampling}: not as pipeline run writes it (ValueError: q of de is {float(q)}, not a "
                "share in [0, 1])") in capsys.readouterr().err
    shutil.copy(sample_corpus / "sampling.json", sampling)
    shard = next((corpus / "lang=de" / "bucket=all").glob("part-*.arrow"))
    shard.write_bytes(shard.read_bytes()[:200])
    assert main(["tokenizer", "--corpus", str(corpus), "--out", str(tmp_path / "t"), "--vocab-size", "1000"]) == 2
    err = capsys.readouterr().err
    assert str(shard) in err and err.count("\n") == 1
    write_table(output_table(docs_to_table([{"id": "1", "text": "x", "lang": "de", "url": "https://a.b/", "source": "a.wet"}]), "ccnet"), str(shard), "arrow")
    assert main(["tokenizer", "--corpus", str(corpus), "--out", str(tmp_path / "t"), "--vocab-size", "1000"]) == 2
    assert "write.schema=ccnet" in capsys.readouterr().err
    with pytest.raises(UserError, match="too large"):
        train_tokenizer(sample_corpus, tmp_path / "big", vocab_size=500_000, sample_size=2000, languages=["en"])
    with pytest.raises(UserError, match="no lang=qq"):
        train_tokenizer(sample_corpus, tmp_path / "t", vocab_size=1000, languages=["qq"])
    with pytest.raises(UserError, match="--sample-size 0: must be at least 1"):
        train_tokenizer(sample_corpus, tmp_path / "t", vocab_size=1000, sample_size=0)
    with pytest.raises(UserError, match=r"--max-sentence-bytes 0: must be 10 to 1073741824 \(SentencePiece's range\)"):
        train_tokenizer(sample_corpus, tmp_path / "t", vocab_size=1000, max_sentence_bytes=0)  # said: empty language
    for seed in (-1, 2**32):  # tracebacks from numpy's RNG and (after the whole sampling) SentencePiece's
        with pytest.raises(UserError, match=rf"--seed {seed}: must be 0 to 2\^32-1"):
            train_tokenizer(sample_corpus, tmp_path / "t", vocab_size=1000, seed=seed)
    # a bucket this corpus has none of (built without perplexity: only `all`) named the first language
    # as empty and told to leave it out, which moved the error to the next one
    with pytest.raises(UserError, match=r"no language has a shard in buckets head, middle \(its buckets: all\)"):
        train_tokenizer(sample_corpus, tmp_path / "t", vocab_size=1000, buckets=["head", "middle"])
    # --out given the corpus, or a file: refused before any work, nothing replaced
    before = sorted(p.name for p in corpus.iterdir())
    assert main(["tokenizer", "--corpus", str(corpus), "--out", str(corpus), "--vocab-size", "1000"]) == 2
    assert "the folder holds 'lang=ar' and" in capsys.readouterr().err and sorted(p.name for p in corpus.iterdir()) == before
    assert main(["tokenizer", "--corpus", str(corpus), "--out", str(sampling), "--vocab-size", "1000"]) == 2
    assert f"{sampling} is a file, not a folder" in capsys.readouterr().err and sampling.is_file()
    assert main(["tokenize", "--corpus", str(corpus), "--tokenizer", str(sample_tokenizer), "--out", str(tmp_path / "s"),
                 "--alpha", "5"]) == 2
    assert "--alpha 5.0: must be in (0, 1]" in capsys.readouterr().err
    assert main(["tokenize", "--corpus", str(corpus), "--tokenizer", str(sample_tokenizer), "--out", f"{sampling}/s"]) == 2
    assert f"--out {sampling}/s: {sampling} is a file, not a folder" in capsys.readouterr().err
    (tmp_path / "broken").mkdir()
    shutil.copy(sample_tokenizer / "tokenizer_meta.json", tmp_path / "broken")
    (tmp_path / "broken" / OUR_MODEL).write_bytes(b"not a model")
    with pytest.raises(UserError, match="not a SentencePiece model"):
        Tokenizer.load(tmp_path / "broken")
    (tmp_path / "broken" / OUR_MODEL).write_bytes(b"")  # SentencePiece takes it: an IndexError further on
    with pytest.raises(UserError, match=f"{OUR_MODEL}: an empty file, not a SentencePiece model"):
        Tokenizer.load(tmp_path / "broken")


def test_a_hand_edited_alpha_is_one_line(sample_corpus: Path, sample_tokenizer: Path, tmp_path: Path, capsys) -> None:
    """The alpha a command takes by default, sampling.json's (tokenizer) or tokenizer_meta.json's
    (tokenize): a null or a string was a traceback, a number out of range was blamed on --alpha."""
    corpus, tokenizer = tmp_path / "corpus", tmp_path / "tokenizer"
    shutil.copytree(sample_corpus, corpus)
    shutil.copytree(sample_tokenizer, tokenizer)
    for path, command in ((corpus / "sampling.json", ["tokenizer", "--vocab-size", "1000"]),
                          (tokenizer / "tokenizer_meta.json", ["tokenize", "--tokenizer", str(tokenizer)])):
        what = "corpus statistics" if path.name == "sampling.json" else "tokenizer"
        data = json.loads(path.read_text())
        for alpha, problem in ((None, "None: must be a number in (0, 1]"), ("0.3", "'0.3': must be a number in (0, 1]"),
                               (True, "True: must be a number in (0, 1]"), (5, "5: must be in (0, 1]")):
            path.write_text(json.dumps({**data, "alpha": alpha}))
            assert main([*command, "--corpus", str(corpus), "--out", str(tmp_path / "out")]) == 2
            assert capsys.readouterr().err == f"error: {what} {path}: alpha {problem}; correct it or give --alpha\n"
        assert not (tmp_path / "out").exists()


def test_a_bucket_out_or_tokenizer_is_one_line(sample_corpus: Path, sample_tokenizer: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """SentencePiece and the token shards' memory maps are local files: ``--out s3://b/tok`` wrote the
    local folder ``s3:/b/tok`` and printed ``wrote s3://b/tok``. (A corpus in a bucket is read:
    tests/test_stores.py.)"""
    monkeypatch.chdir(tmp_path)
    corpus, tokenizer = str(sample_corpus), str(sample_tokenizer)
    for flag, args in (
            ("--out", ["tokenizer", "--corpus", corpus, "--vocab-size", "1000", "--sample-size", "2000",
                       "--out", "s3://polyglot/tok"]),
            ("--out", ["tokenize", "--corpus", corpus, "--tokenizer", tokenizer, "--out", "gs://polyglot/tokens"]),
            ("--tokenizer", ["tokenize", "--corpus", corpus, "--tokenizer", "s3://polyglot/tok", "--out", "tokens"])):
        assert main([*args, "--no-progress"] if args[0] == "tokenize" else args) == 2
        out, err = capsys.readouterr()
        path = args[args.index(flag) + 1]
        assert out == "" and err.count("\n") == 1
        assert err.startswith(f"error: {flag} {path}: a bucket path; give a local folder (copy it ")
    assert list(tmp_path.iterdir()) == []  # no folder s3: or gs: made here


def test_a_failed_run_leaves_the_previous_tokenizer(sample_corpus: Path, sample_tokenizer: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import pretrain.tokenizer as tok
    from pipeline.output import fs

    out = tmp_path / "tok"
    shutil.copytree(sample_tokenizer, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = fs.write_json

    def dies_at_meta(path: Path, obj: Any, **kwargs: Any) -> None:
        if Path(path).name == tok.META:
            raise OSError("disk full")
        real(path, obj, **kwargs)

    monkeypatch.setattr(fs, "write_json", dies_at_meta)
    with pytest.raises(OSError, match="disk full"):
        train_tokenizer(sample_corpus, out, vocab_size=1000, sample_size=2000, languages=["de", "en"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]  # no staging folder left
    # killed between the swap's two renames: the next run finds the old folder aside and puts it back
    old = tmp_path / ".tok.old"
    out.rename(old)
    fs.restore_folder(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and not old.exists()
    monkeypatch.setattr(fs, "write_json", real)
    meta = train_tokenizer(sample_corpus, out, vocab_size=1000, sample_size=2000, languages=["de", "en"])
    assert Tokenizer.load(out).fingerprint == meta["fingerprint"] and [p.name for p in tmp_path.iterdir()] == ["tok"]


def test_an_out_that_is_a_link_keeps_the_link(sample_corpus: Path, sample_tokenizer: Path, tmp_path: Path) -> None:
    """``--out`` a symbolic link to a folder: the folder it names is replaced and the link kept (the
    link itself was renamed aside and replaced by the new folder, left as ``.<name>.old``, and the
    next run stopped on a traceback from deleting it)."""
    target = tmp_path / "data" / "tok"
    shutil.copytree(sample_tokenizer, target)
    link = tmp_path / "linktok"
    link.symlink_to(target)
    for _ in range(2):
        meta = train_tokenizer(sample_corpus, link, vocab_size=1000, sample_size=2000, languages=["de", "en"])
        assert link.is_symlink() and Tokenizer.load(target).fingerprint == meta["fingerprint"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "linktok"]
        assert [p.name for p in target.parent.iterdir()] == ["tok"]
    link.unlink()  # what the versions before left: the new folder in the link's place, the link aside
    shutil.copytree(target, link)
    (tmp_path / ".linktok.old").symlink_to(target)
    train_tokenizer(sample_corpus, link, vocab_size=1000, sample_size=2000, languages=["de", "en"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "linktok"] and (target / "spm.model").is_file()


def test_a_corpus_missing_shards_is_said(sample_corpus: Path, tmp_path: Path, capsys) -> None:
    """A corpus whose shards were removed or not copied whole: ``pipeline status`` called it finished,
    and the tokenizer read it silently (sampling.json's weights are the whole corpus's)."""
    from pipeline.__main__ import main as pipeline_main

    corpus = tmp_path / "corpus"
    shutil.copytree(sample_corpus, corpus)
    assert pipeline_main(["status", str(corpus)]) == 0
    assert "incomplete" not in capsys.readouterr().out
    language_shards(corpus)
    assert capsys.readouterr().err == ""
    shards = sorted(corpus.glob("lang=*/bucket=*/part-*.arrow"))
    shards[0].unlink()
    assert pipeline_main(["status", str(corpus)]) == 0
    assert (f"incomplete: 1 of the {len(shards)} shards {corpus / 'stats.json'} counts are missing"
            in capsys.readouterr().out)
    assert shards[0] not in [Path(p) for paths in language_shards(corpus).values() for p in paths]
    assert capsys.readouterr().err.startswith(f"warning: corpus {corpus}: 1 of the {len(shards)} shards")
    (shards[0].parent / f"{shards[1].name}.tmp-0123").write_bytes(b"")  # a writer's leftover is not a shard
    assert pipeline_main(["status", str(corpus)]) == 0
    assert f"incomplete: 1 of the {len(shards)} shards" in capsys.readouterr().out
    (corpus / "stats.json").write_text("{}")  # not ours: status says so, and the readers go on
    assert pipeline_main(["status", str(corpus)]) == 0
    out = capsys.readouterr().out
    assert "incomplete" not in out and f"  damaged: corpus {corpus / 'stats.json'}: not written by pipeline run" in out


def test_status_names_the_damaged_files_of_a_finished_corpus(sample_corpus: Path, tmp_path: Path, capsys) -> None:
    """A stats.json that is not JSON and shards cut short (a copy that stopped): ``pipeline status``
    called the corpus finished and said nothing; each shard's footer is read now."""
    import pyarrow.parquet as pq

    from pipeline.__main__ import main as pipeline_main
    from pipeline.output.shards import read_shard

    corpus = tmp_path / "corpus"
    shutil.copytree(sample_corpus, corpus)
    shards = sorted(corpus.glob("lang=*/bucket=*/part-*.arrow"))
    pq.write_table(read_shard(str(shards[0])), shards[0].with_suffix(".parquet"))  # a whole one: said nothing of
    assert pipeline_main(["status", str(corpus)]) == 0
    assert "  damaged:" not in capsys.readouterr().out
    stats = corpus / "stats.json"
    stats.write_text(stats.read_text()[:-10])
    for shard in (shards[1], shards[0].with_suffix(".parquet")):
        shard.write_bytes(shard.read_bytes()[:-100])
    assert pipeline_main(["status", str(corpus)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(rf"{re.escape(str(corpus))}: a finished corpus \(DirectRunner, \d+ s\)", out[0]), out
    assert out[1].startswith(f"  damaged: corpus {stats}: not valid JSON")
    assert out[2].startswith(f"  damaged: 2 of the {len(shards) + 1} shards cannot be read: "
                             f"{shards[0].with_suffix('.parquet')} (Parquet magic bytes not found")
    assert out[2].endswith("), and 1 more") and len(out) == 3
    from pipeline.output.shards import unreadable

    folder = shards[0].parent / "part-99999.arrow"  # a folder under a shard's name, or a shard removed since it
    folder.mkdir()                                   # was listed: damage, not the store's failure
    assert unreadable(str(folder)) == "a folder, not a file" and unreadable(str(folder) + "x") == "no such file"


@pytest.mark.parametrize("failing", ["stats.json", "part-"])
def test_status_of_a_corpus_the_store_cannot_give_is_an_error_not_damage(sample_corpus: Path, tmp_path: Path, capsys,
                                                                          monkeypatch, failing: str) -> None:
    """A read the store fails (a connection reset) says nothing of the file: ``pipeline status`` ends
    with one error line naming it, where it called the corpus damaged."""
    from pipeline.__main__ import main as pipeline_main
    from pipeline.output import fs

    class Reset(io.BytesIO):
        def read(self, *args):
            raise ConnectionResetError(104, "Connection reset by peer")

    corpus = tmp_path / "corpus"
    shutil.copytree(sample_corpus, corpus)
    shard = sorted(corpus.glob("lang=*/bucket=*/part-*.arrow"))[1]
    victim = str(corpus / "stats.json") if failing == "stats.json" else str(shard)
    open_read = fs.open_read
    monkeypatch.setattr(fs, "open_read", lambda path: Reset(Path(victim).read_bytes()) if str(path) == victim
                        else open_read(path))
    assert pipeline_main(["status", str(corpus)]) == 2
    captured = capsys.readouterr()
    assert "damaged" not in captured.out
    assert captured.err == f"error: {'corpus ' if failing == 'stats.json' else 'shard '}{victim}: cannot read it " \
                           "(ConnectionResetError: [Errno 104] Connection reset by peer)\n"
