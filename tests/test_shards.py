"""Token shards: layout, O(1) document access, held-out split, resume, determinism, bad input."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.output.shards import SCHEMA, read_shard, write_table
from pipeline.util.errors import UserError
from pretrain.__main__ import main
from pretrain.shards import TokenShards, tokenize_corpus, valid_score
from pretrain.tokenizer import Tokenizer, language_shards, train_tokenizer

VALID = 0.02


def token_files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*.npy"))}


def test_documents_are_the_corpus_in_order(sample_tokens: Path, sample_tokenizer: Path, sample_corpus: Path) -> None:
    from pipeline.output.shards import read_shard

    shards = TokenShards.open(sample_tokens)
    tok = Tokenizer.load(sample_tokenizer)
    shards.check_tokenizer(tok)
    assert shards.languages == sorted(shards.languages) and len(shards.languages) == 11
    assert shards.fingerprint == tok.fingerprint and shards.vocab_size == tok.vocab_size
    for lang, paths in language_shards(sample_corpus).items():
        tables = [read_shard(str(p)) for p in paths]
        ids = [i for t in tables for i in t.column("id").to_pylist()]
        texts = [x for t in tables for x in t.column("text").to_pylist()]
        held = [valid_score(i) < VALID for i in ids]
        if not any(held):  # a language with none under the fraction holds out its lowest-hash document
            held[min(range(len(ids)), key=lambda k: valid_score(ids[k]))] = True
        train, valid = shards.docs(lang, "train"), shards.docs(lang, "valid")
        assert len(valid) >= 1 and len(train) + len(valid) == len(ids)
        for split, docs, wanted in (("train", train, [not h for h in held]), ("valid", valid, held)):
            expected = [t for t, keep in zip(texts, wanted) if keep]
            for i in sorted({0, len(docs) // 2, len(docs) - 1}):
                assert docs[i].dtype == np.int32 and docs[i].tolist() == tok.encode(expected[i]), (lang, split, i)
            assert docs.lengths.tolist() == [len(tok.encode(t)) for t in expected]
            assert docs.num_tokens == int(docs.lengths.sum())
    meta = json.loads((sample_tokens / "meta.json").read_text())
    q = shards.sampling_weights(meta["alpha"])
    assert sum(q.values()) == pytest.approx(1.0)
    assert all(meta["languages"][lang]["q"] == pytest.approx(q[lang]) for lang in q)
    assert meta["tokenizer"]["fingerprint"] == tok.fingerprint


def test_parallel_is_identical_and_rerun_skips_written_shards(sample_tokens: Path, sample_tokenizer: Path,
                                                               sample_corpus: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "tokens"
    assert main(["tokenize", "--corpus", str(sample_corpus), "--tokenizer", str(sample_tokenizer), "--out", str(out),
                 "--valid-fraction", str(VALID), "--workers", "2", "--no-progress"]) == 0
    summary = capsys.readouterr().out
    assert "train tokens" in summary and all(f"\n{lang} " in summary for lang in ("ar", "zh"))
    assert token_files(out) == token_files(sample_tokens)
    assert (out / "meta.json").read_bytes() != b""
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("shard.json")}
    gone = next(iter(sorted(stamps))).parent
    shutil.rmtree(gone)
    (gone.parent / f"{gone.name}.tmp-interrupted").mkdir()
    tokenize_corpus(sample_corpus, sample_tokenizer, out, valid_fraction=VALID)
    assert token_files(out) == token_files(sample_tokens)
    for path, stamp in stamps.items():
        assert (path.stat().st_mtime_ns == stamp) == (path.parent != gone)
    assert not list(out.rglob("*.tmp-*"))
    with pytest.raises(UserError, match="--valid-fraction"):
        tokenize_corpus(sample_corpus, sample_tokenizer, out, valid_fraction=0.5)
    # the corpus copied elsewhere (same files): nothing redone; a shard rewritten since: redone (its
    # old tokens were kept, silently)
    corpus = tmp_path / "corpus"
    shutil.copytree(sample_corpus, corpus)
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("shard.json")}
    tokenize_corpus(corpus, sample_tokenizer, out, valid_fraction=VALID)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("shard.json")} == stamps
    shard = sorted((corpus / "lang=de" / "bucket=all").glob("part-*.arrow"))[0]
    write_table(read_shard(str(shard)).slice(0, 5), str(shard), "arrow")
    tokenize_corpus(corpus, sample_tokenizer, out, valid_fraction=VALID)
    info = json.loads((out / "lang=de" / "bucket=all" / shard.stem / "shard.json").read_text())
    assert info["train"]["documents"] + info["valid"]["documents"] + info["empty_documents"] == 5
    assert [p for p in out.rglob("shard.json") if p.stat().st_mtime_ns != stamps[p]] == [
        out / "lang=de" / "bucket=all" / shard.stem / "shard.json"]
    # fewer --languages into the same --out: meta.json lists those, and the others' shards are said
    capsys.readouterr()
    tokenize_corpus(corpus, sample_tokenizer, out, languages=["de"], valid_fraction=VALID)
    others = sorted(p.name for p in out.glob("lang=*") if p.name != "lang=de")
    assert list(json.loads((out / "meta.json").read_text())["languages"]) == ["de"] and others
    assert capsys.readouterr().err == (f"warning: --out {out}: {', '.join(others)} from an earlier run are not in this "
                                       "run's meta.json (training reads only what it lists); remove them, or rerun "
                                       "with those languages\n")


def test_a_rerun_holds_out_what_a_new_run_holds_out(sample_tokenizer: Path, tmp_path: Path) -> None:
    """A language with no document under --valid-fraction holds out its lowest-hash one: when a
    shard rewritten since brings a lower one, a rerun into the same --out redoes every shard of the
    language (it kept the old one held out in the shard it skipped) and ends as a new run does."""
    fraction = 0.001
    ids = [i for score, i in sorted((valid_score(f"sw-{n}"), f"sw-{n}") for n in range(400)) if score >= fraction]
    lowest, second, rest = ids[0], ids[1], ids[2:12]

    def write(part: int, docs: list[str], blank: str = "") -> None:
        folder = tmp_path / "corpus" / "lang=sw" / "bucket=all"
        folder.mkdir(parents=True, exist_ok=True)
        rows = {"id": sorted(docs), "text": [" \n" if i == blank else "paka ameketi juu ya mkeka" for i in sorted(docs)],
                "lang": ["sw"] * len(docs), "bucket": ["all"] * len(docs)}
        table = pa.table({f.name: rows.get(f.name, [None] * len(docs)) for f in SCHEMA}, schema=SCHEMA)
        write_table(table, str(folder / f"part-{part:05d}.arrow"), "arrow")

    def held_out(out: Path) -> tuple[int, int]:
        meta = json.loads((out / "meta.json").read_text())["languages"]["sw"]
        return meta["valid_documents"], meta["train_documents"]

    write(0, [second, *rest[:5]])
    write(1, rest[5:])
    tokenize_corpus(tmp_path / "corpus", sample_tokenizer, tmp_path / "tokens", valid_fraction=fraction)
    assert held_out(tmp_path / "tokens") == (1, 10)
    write(1, [*rest[5:], lowest])
    tokenize_corpus(tmp_path / "corpus", sample_tokenizer, tmp_path / "tokens", valid_fraction=fraction)
    tokenize_corpus(tmp_path / "corpus", sample_tokenizer, tmp_path / "fresh", valid_fraction=fraction)
    assert held_out(tmp_path / "tokens") == held_out(tmp_path / "fresh") == (1, 11)
    assert token_files(tmp_path / "tokens") == token_files(tmp_path / "fresh")
    write(1, [*rest[5:], lowest], blank=lowest)  # a blank lowest has no tokens: the next one is held out
    tokenize_corpus(tmp_path / "corpus", sample_tokenizer, tmp_path / "blank", valid_fraction=fraction)
    assert held_out(tmp_path / "blank") == (1, 10)


def test_a_rerun_repairs_a_shard_cut_short(sample_corpus: Path, sample_tokenizer: Path, sample_tokens: Path,
                                           tmp_path: Path) -> None:
    """A token array cut short (a copy interrupted) or lost: the rerun that the error suggests writes
    it again; it took the shard for done by its shard.json alone."""
    out = tmp_path / "tokens"
    shutil.copytree(sample_tokens, out)
    tokens = sorted(out.rglob("train.tokens.npy"))
    tokens[0].write_bytes(tokens[0].read_bytes()[:-100])
    tokens[1].unlink()
    with pytest.raises(UserError, match="corrupt"):
        TokenShards.open(out)
    tokenize_corpus(sample_corpus, sample_tokenizer, out, valid_fraction=VALID)
    TokenShards.open(out)
    assert token_files(out) == token_files(sample_tokens)


def test_a_rerun_cut_short_is_never_taken_for_complete(sample_corpus: Path, sample_tokenizer: Path, sample_tokens: Path,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rerun rewrites shards in place: killed part-way, or failing at meta.json (an empty
    language), it left the old meta.json over new shards for some languages and old ones for
    others, and `pretrain train` took the mix for complete. Now the folder reads as unfinished
    until the rerun's own meta.json is written."""
    import pretrain.shards as shards

    corpus, out = tmp_path / "corpus", tmp_path / "tokens"
    shutil.copytree(sample_corpus, corpus)
    for lang in ("de", "en"):  # rewritten since: a rerun redoes them
        shard = sorted((corpus / f"lang={lang}" / "bucket=all").glob("part-*.arrow"))[0]
        write_table(read_shard(str(shard)).slice(0, 5), str(shard), "arrow")
    real, written = shards.tokenize_shard, []

    def killed_after_one(job: shards.ShardJob, tokenizer: Tokenizer | None = None) -> dict:
        if written:
            raise KeyboardInterrupt
        written.append(job.target)
        return real(job, tokenizer)

    def empty_language(*args: object) -> dict:
        raise UserError("lang=xx: no training tokens after tokenization (empty language)")

    for name, dies, error in (("tokenize_shard", killed_after_one, KeyboardInterrupt),
                              ("shards_meta", empty_language, UserError)):  # after every shard was rewritten
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(sample_tokens, out)
        with monkeypatch.context() as patch:
            patch.setattr(shards, name, dies)
            with pytest.raises(error):
                tokenize_corpus(corpus, sample_tokenizer, out, valid_fraction=VALID)
        with pytest.raises(UserError, match=r"^token shards .*: no meta.json \(.* did not finish: rerun it"):
            TokenShards.open(out)
    assert len(written) == 1
    meta = tokenize_corpus(corpus, sample_tokenizer, out, valid_fraction=VALID)
    opened = TokenShards.open(out)
    assert all(meta["languages"][lang]["train_tokens"] == opened.docs(lang).num_tokens for lang in opened.languages)


def test_cli_help_documents_every_option(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["tokenize", "--help"])
    out = capsys.readouterr().out
    for option in ("--corpus", "--tokenizer", "--out", "--buckets", "--languages", "--valid-fraction", "--alpha",
                   "--workers", "--no-progress"):
        assert option in out


def test_an_out_folder_of_other_files_and_no_workers_are_refused(sample_tokens: Path, sample_tokenizer: Path,
                                                                  sample_corpus: Path, tmp_path: Path) -> None:
    """`--out` holding a file of the user's was written into (the other commands refuse it), and
    `--workers 0` or below ran as one worker. A folder this command wrote (for other languages too)
    is taken again: it skips the shards already there."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(UserError, match=r"--out .*mine: the folder holds 'notes.txt', not written by this command"):
        tokenize_corpus(sample_corpus, sample_tokenizer, tmp_path / "mine")
    with pytest.raises(UserError, match=r"--workers 0: must be 1 or more"):
        tokenize_corpus(sample_corpus, sample_tokenizer, tmp_path / "new", workers=0)
    assert not (tmp_path / "new").exists()
    again = tmp_path / "again"
    shutil.copytree(sample_tokens, again)
    before = token_files(again)
    tokenize_corpus(sample_corpus, sample_tokenizer, again, valid_fraction=VALID,
                    languages=sorted(TokenShards.open(again).languages)[:1])
    assert {k: v for k, v in token_files(again).items() if k != "meta.json"} == {
        k: v for k, v in before.items() if k != "meta.json"}


def test_corrupt_shard_is_a_clear_error(sample_tokens: Path, tmp_path: Path, capsys) -> None:
    copy = tmp_path / "tokens"
    shutil.copytree(sample_tokens, copy)
    tokens = sorted(copy.rglob("train.tokens.npy"))[0]
    tokens.write_bytes(tokens.read_bytes()[:-100])
    with pytest.raises(UserError, match="corrupt"):
        TokenShards.open(copy)
    tokens.write_bytes(b"garbage")
    with pytest.raises(UserError, match=str(tokens)):
        TokenShards.open(copy)
    offsets = sorted(copy.rglob("valid.offsets.npy"))[0]
    shutil.copy(sample_tokens / tokens.relative_to(copy), tokens)
    np.save(offsets, np.zeros(3, np.int64))
    with pytest.raises(UserError, match="do not match"):
        TokenShards.open(copy)
    shutil.copy(sample_tokens / offsets.relative_to(copy), offsets)
    meta = json.loads((copy / "meta.json").read_text())
    del meta["languages"][sorted(meta["languages"])[0]]["shards"]  # valid JSON, a key missing
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"malformed meta.json or shard.json \(KeyError: 'shards'\)"):
        TokenShards.open(copy)
    (copy / "meta.json").write_text('{"format": 1, "tokenizer": ')
    with pytest.raises(UserError, match="not valid JSON"):
        TokenShards.open(copy)
    (copy / "meta.json").unlink()
    with pytest.raises(UserError, match="did not finish"):
        TokenShards.open(copy)


def test_other_tokenizer_is_refused(sample_tokens: Path, sample_corpus: Path, tmp_path: Path, capsys) -> None:
    from pretrain.loader import LoaderConfig, MLMLoader

    other = tmp_path / "other"
    train_tokenizer(sample_corpus, other, vocab_size=1000, sample_size=2000, languages=["en", "de"])
    shards = TokenShards.open(sample_tokens)
    with pytest.raises(UserError, match="written with tokenizer"):
        shards.check_tokenizer(Tokenizer.load(other))
    with pytest.raises(UserError, match="written with tokenizer"):
        MLMLoader(shards, LoaderConfig(seq_len=64, batch_size=2), tokenizer=Tokenizer.load(other))
    out = tmp_path / "tokens"
    shutil.copytree(sample_tokens, out)
    assert main(["tokenize", "--corpus", str(sample_corpus), "--tokenizer", str(other), "--out", str(out),
                 "--no-progress"]) == 2
    assert "another tokenizer" in capsys.readouterr().err


def test_empty_language_is_a_clear_error(sample_corpus: Path, sample_tokenizer: Path, tmp_path: Path, capsys) -> None:
    from pipeline.output.shards import docs_to_table, write_table

    corpus = tmp_path / "corpus"
    shutil.copytree(sample_corpus, corpus)
    write_table(docs_to_table([]), str(corpus / "lang=xx" / "bucket=all" / "part-00000.arrow"), "arrow")
    args = ["tokenize", "--corpus", str(corpus), "--tokenizer", str(sample_tokenizer), "--no-progress"]
    assert main(args + ["--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "lang=xx" in err and "empty language" in err and err.count("\n") == 1
    assert main(args + ["--out", str(tmp_path / "t"), "--buckets", "head"]) == 2
    assert "no language has a shard in buckets head (its buckets: all)" in capsys.readouterr().err
