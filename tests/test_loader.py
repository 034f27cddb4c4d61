"""The MLM loader: language mix, packing, masking statistics, disjoint ranks, exact resume, validation batches."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.util.errors import UserError
from pretrain.loader import IGNORE, LoaderConfig, MLMLoader, loader_config
from pretrain.shards import TokenShards
from pretrain.tokenizer import Tokenizer

CHI2_DF10_P001 = 29.588  # chi-square critical value, 10 degrees of freedom, p = 0.001


@pytest.fixture(scope="module")
def shards(sample_tokens: Path) -> TokenShards:
    return TokenShards.open(sample_tokens)


def batches(loader: MLMLoader, n: int) -> list[dict[str, torch.Tensor]]:
    return [next(loader) for _ in range(n)]


def test_language_mix_matches_q(shards: TokenShards) -> None:
    loader = MLMLoader(shards, LoaderConfig(seq_len=16, batch_size=500, seed=3))
    langs = torch.cat([b["lang"] for b in batches(loader, 20)]).numpy()  # 10,000 sequences
    q = shards.sampling_weights(0.3)
    expected = np.array([q[lang] for lang in loader.languages]) * len(langs)
    observed = np.bincount(langs, minlength=len(loader.languages))
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert len(loader.languages) == 11 and chi2 < CHI2_DF10_P001, (observed, expected.round())
    # alpha matters: with alpha = 1 the mix follows p_i, and the smallest language (hi) is rarer
    flat = MLMLoader(shards, LoaderConfig(seq_len=16, batch_size=500, seed=3, alpha=1.0))
    hi = loader.languages.index("hi")
    assert np.mean(torch.cat([b["lang"] for b in batches(flat, 20)]).numpy() == hi) < observed[hi] / len(langs) - 0.01


def test_masking_rates_and_never_specials(shards: TokenShards) -> None:
    cfg = LoaderConfig(seq_len=128, batch_size=64, seed=1)
    plain = batches(MLMLoader(shards, LoaderConfig(seq_len=128, batch_size=64, seed=1, mask_prob=0.0)), 12)
    masked = batches(MLMLoader(shards, cfg), 12)
    special = np.zeros(shards.vocab_size, bool)
    special[[0, 1, 2, 3, shards.vocab_size - 1]] = True
    chosen = maskable = to_mask = to_random = kept = 0
    for p, m in zip(plain, masked):
        ids, inputs, labels = p["input_ids"].numpy(), m["input_ids"].numpy(), m["labels"].numpy()
        assert (p["labels"] == IGNORE).all() and torch.equal(p["lang"], m["lang"])
        assert torch.equal(p["attention_mask"], m["attention_mask"]) and (m["attention_mask"] == (p["input_ids"] != 1)).all()
        hit = labels != IGNORE
        assert (labels[hit] == ids[hit]).all() and (inputs[~hit] == ids[~hit]).all()
        assert not hit[special[ids]].any()  # never <s> <pad> </s> <unk> <mask>
        assert not special[inputs[hit & (inputs != shards.vocab_size - 1)]].any()  # random tokens are ordinary
        assert all(t.dtype == torch.int64 for t in m.values()) and m["input_ids"].shape == (64, 128)
        chosen += hit.sum()
        maskable += (~special[ids]).sum()
        to_mask += (hit & (inputs == shards.vocab_size - 1)).sum()
        kept += (hit & (inputs == ids)).sum()
        to_random += (hit & (inputs != ids) & (inputs != shards.vocab_size - 1)).sum()
    n = maskable
    assert abs(chosen / n - 0.15) < 4 * np.sqrt(0.15 * 0.85 / n)
    for count, share in ((to_mask, 0.8), (to_random, 0.1), (kept, 0.1)):
        # a random replacement can draw the original token (1 in ~4,000): within the tolerance
        assert abs(count / chosen - share) < 4 * np.sqrt(share * (1 - share) / chosen) + 1e-3, (count, chosen, share)


def word_runs(tok: Tokenizer, row: np.ndarray) -> list[np.ndarray]:
    """Positions of every word of a row (a word-start piece or a token after a special one starts a word)."""
    starts = tok.word_start[row].copy()
    starts[0] = True
    starts[1:] |= np.isin(row[:-1], tok.special_ids)
    return np.split(np.arange(len(row)), np.flatnonzero(starts)[1:])


@pytest.mark.parametrize("masking", ["whole_word", "span"])
def test_whole_word_and_span_masking(shards: TokenShards, sample_tokenizer: Path, masking: str) -> None:
    tok = Tokenizer.load(sample_tokenizer)
    cfg = LoaderConfig(seq_len=256, batch_size=32, masking=masking, seed=2, languages=["de", "en", "es", "fr", "ru"])
    plain = batches(MLMLoader(shards, dataclasses.replace(cfg, mask_prob=0.0)), 6)
    masked = batches(MLMLoader(shards, cfg), 6)
    chosen = maskable = 0
    runs = []
    for p, m in zip(plain, masked):
        ids, labels = p["input_ids"].numpy(), m["labels"].numpy()
        hit = labels != IGNORE
        for row, row_hit in zip(ids, hit):
            for word in word_runs(tok, row):
                ordinary = word[~np.isin(row[word], tok.special_ids)]
                assert row_hit[ordinary].all() or not row_hit[ordinary].any()  # whole words only
            edges = np.diff(np.concatenate([[0], row_hit.astype(int), [0]]))
            runs += list(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))
        chosen += hit.sum()
        maskable += (~np.isin(ids, tok.special_ids)).sum()
    assert 0.13 < chosen / maskable < 0.17
    if masking == "span":  # spans of several words: runs longer than whole-word masking's
        assert np.mean(runs) > 4


def test_unspaced_scripts_mask_a_piece_as_a_word(shards: TokenShards, sample_tokenizer: Path) -> None:
    """In Chinese a whitespace word is a phrase or a line: whole-word masking took it whole (a row
    masked a sentence at once, or nothing); each Han piece is now a word of its own. Span masking
    replaces a span all alike (SpanBERT): all <mask>, all random, or all kept."""
    from pretrain.tokenizer import unspaced

    tok = Tokenizer.load(sample_tokenizer)
    assert unspaced("▁中国") and unspaced("ภาษา") and not unspaced("▁word") and not unspaced("▁")
    pieces = [tok.sp.id_to_piece(i) for i in range(tok.vocab_size)]
    assert all(tok.word_start[i] for i, piece in enumerate(pieces) if unspaced(piece))
    for masking in ("whole_word", "span"):
        cfg = LoaderConfig(seq_len=256, batch_size=32, masking=masking, seed=3, languages=["zh"])
        plain = batches(MLMLoader(shards, dataclasses.replace(cfg, mask_prob=0.0)), 4)
        masked = batches(MLMLoader(shards, cfg), 4)
        shares, runs, mixed = [], 0, 0
        for p, m in zip(plain, masked):
            ids, inputs, hit = p["input_ids"].numpy(), m["input_ids"].numpy(), m["labels"].numpy() != IGNORE
            shares += list(hit.sum(1) / (~np.isin(ids, tok.special_ids)).sum(1))
            for row_hit, row_in, row_ids in zip(hit, inputs, ids):
                edges = np.diff(np.concatenate([[0], row_hit.astype(int), [0]]))
                for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
                    kinds = {"mask" if t == tok.mask_id else "kept" if t == o else "random"
                             for t, o in zip(row_in[a:b], row_ids[a:b])}
                    runs, mixed = runs + (b - a > 1), mixed + (b - a > 1 and len(kinds) > 1)
        assert 0.12 < np.mean(shares) < 0.18 and min(shares) > 0.03 and np.std(shares) < 0.06, (masking, np.std(shares))
        if masking == "span":  # mixed runs only where two spans meet
            assert runs > 100 and mixed / runs < 0.15, (mixed, runs)


def test_a_document_ending_one_short_of_a_row_gets_one_closing_eos() -> None:
    """A document filling all but a row's last slot, or the last of a stream, was followed by a
    separator </s> and the row's closing </s>; now by the closing one only."""
    from pretrain.loader import _Stream
    from pretrain.shards import DocList

    docs = DocList([(np.arange(10, 18, dtype=np.int32), np.array([0, 5, 8]))], [Path("train.tokens.npy")])  # 5 and 3 tokens
    stream, out = _Stream(docs, np.arange(2), 0, "xx", cycle=False), np.full(6, 1, np.int64)
    assert stream.fill(out, True) == 5 and out.tolist() == [10, 11, 12, 13, 14, 1]
    out[:] = 1
    assert stream.fill(out, True) == 3 and out.tolist() == [15, 16, 17, 1, 1, 1]
    cycling = _Stream(docs, np.arange(2), 0, "xx", cycle=True)
    rows = []
    for _ in range(8):
        out[:] = 1
        rows.append(out[:cycling.fill(out, True)].tolist())
    assert all(row[-1] != 2 and row[0] != 2 for row in rows)  # a separator only between two documents


def test_ranks_see_disjoint_documents(shards: TokenShards) -> None:
    docs = shards.docs("tr", "train")
    seq_len = int(docs.lengths.max()) + 2  # one whole document per sequence
    seen = []
    for rank in (0, 1):
        cfg = LoaderConfig(seq_len=seq_len, batch_size=8, mask_prob=0.0, cross_document=False, languages=["tr"])
        loader = MLMLoader(shards, cfg, rank=rank, world_size=2)
        rows = [r for b in batches(loader, -(-len(docs) // 16)) for r in b["input_ids"].numpy()]
        texts = {tuple(r[1:np.flatnonzero(r == 2)[0]]) for r in rows[:(len(docs) + 1 - rank) // 2]}
        seen.append(texts)
    everything = {tuple(docs[i]) for i in range(len(docs))}
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == everything


def test_packing_reproduces_the_document_stream(shards: TokenShards) -> None:
    cfg = LoaderConfig(seq_len=64, batch_size=16, mask_prob=0.0, languages=["hi"])
    loader = MLMLoader(shards, cfg)
    docs, stream = shards.docs("hi", "train"), loader.streams[0]
    rows = [r for b in batches(loader, 4) for r in b["input_ids"].numpy()]
    assert all(r[0] == 0 and r[-1] == 2 and 1 not in r for r in rows)  # <s> ... </s>, no padding
    inner = np.concatenate([r[1:-1] for r in rows])
    order = stream._order
    assert order is not None and sorted(order.tolist()) == list(range(len(docs)))
    joined = np.concatenate([docs[int(i)] for i in order])
    flat = inner[inner != 2]  # document separators removed
    assert np.array_equal(flat, joined[:len(flat)])


@pytest.mark.parametrize("options", [{}, {"masking": "span", "cross_document": False},
                                     {"masking": "whole_word", "languages": ["hi", "zh"]}])
def test_resume_gives_exactly_the_uninterrupted_batches(shards: TokenShards, options: dict) -> None:
    cfg = LoaderConfig(seq_len=512, batch_size=24, seed=5, **options)
    uninterrupted = batches(MLMLoader(shards, cfg, rank=1, world_size=2), 14)
    first = MLMLoader(shards, cfg, rank=1, world_size=2)
    batches(first, 9)
    state = json.loads(json.dumps(first.state_dict()))
    assert len(json.dumps(state)) < 2000
    resumed = MLMLoader(shards, cfg, rank=1, world_size=2)
    resumed.load_state_dict(state)
    for expected, got in zip(uninterrupted[9:], batches(resumed, 5)):
        assert expected.keys() == got.keys()
        assert all(torch.equal(expected[k], got[k]) for k in expected)
    if "languages" in options:  # hi and zh alone: both have started a second epoch
        assert min(cursor[0] for cursor in resumed.state_dict()["cursors"]) >= 1
    other = MLMLoader(shards, cfg, rank=0, world_size=2)
    with pytest.raises(UserError, match="rank"):
        other.load_state_dict(state)


def test_valid_batches_are_fixed_and_held_out(shards: TokenShards) -> None:
    cfg = LoaderConfig(seq_len=64, batch_size=4, seed=7)
    loader = MLMLoader(shards, cfg)
    for lang in ("en", "zh"):
        first, second = list(loader.valid_batches(lang)), list(MLMLoader(shards, cfg, 1, 2).valid_batches(lang))
        assert first and len(first) == len(second)
        for a, b in zip(first, second):
            assert all(torch.equal(a[k], b[k]) for k in a)
            assert (a["lang"] == loader.languages.index(lang)).all()
        ids = torch.cat([b["input_ids"] for b in first]).numpy()
        labels = torch.cat([b["labels"] for b in first]).numpy()
        original = np.where(labels != IGNORE, labels, ids)
        inner = np.concatenate([r[1:][(r[1:] != 1)][:-1] for r in original])
        docs = shards.docs(lang, "valid")
        assert np.array_equal(inner[inner != 2], np.concatenate([docs[i] for i in range(len(docs))]))
    # a universal resume restarts the training streams from another seed; validation keeps the run's
    moved = MLMLoader(shards, dataclasses.replace(cfg, seed=7 + 2000), valid_seed=7)
    for a, b in zip(loader.valid_batches("en"), moved.valid_batches("en"), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    other = next(MLMLoader(shards, dataclasses.replace(cfg, seed=7 + 2000)).valid_batches("en"))
    assert not torch.equal(other["labels"], next(loader.valid_batches("en"))["labels"])


def test_span_lengths_are_spanberts(shards: TokenShards) -> None:
    """Geometric(0.2) cut at 10 words and rescaled, as SpanBERT's code draws them: mean 3.8 words
    (3 % of them 10 words long; clipped at 10 instead, 13 % were, and the mean was 4.5)."""
    lengths, weights = MLMLoader(shards, LoaderConfig(masking="span")).span_lengths()
    assert list(lengths) == list(range(1, 11)) and weights.sum() == pytest.approx(1.0)
    assert float(lengths @ weights) == pytest.approx(3.797, abs=1e-3) and weights[-1] == pytest.approx(0.0301, abs=1e-4)
    assert weights[1] / weights[0] == pytest.approx(0.8)


def test_config_errors_name_the_key() -> None:
    with pytest.raises(UserError, match="loader.masking"):
        LoaderConfig(masking="random").validate("run.yaml", "loader")
    with pytest.raises(UserError, match="run.yaml: loader.languages names de twice"):  # de's share would double
        LoaderConfig(languages=["de", "en", "de"]).validate("run.yaml", "loader")
    with pytest.raises(UserError, match="mask_replace"):
        loader_config({"mask_replace": 0.95, "random_replace": 0.1}, "run.yaml")
    with pytest.raises(UserError, match="unknown config key 'mask_rate'"):
        loader_config({"mask_rate": 0.2}, "run.yaml")
    with pytest.raises(UserError, match="seq_len"):
        loader_config({"seq_len": 2}, "run.yaml")


def test_unknown_language_and_too_many_ranks(shards: TokenShards) -> None:
    with pytest.raises(UserError, match="'xx'"):
        MLMLoader(shards, LoaderConfig(languages=["xx"]))
    with pytest.raises(UserError, match="too few for rank"):
        MLMLoader(shards, LoaderConfig(), rank=999, world_size=1000)


@pytest.mark.parametrize("bad", [-5, 99999])
def test_an_id_outside_the_vocabulary_is_one_line_naming_the_shard_and_document(sample_tokens: Path, tmp_path: Path, bad: int) -> None:
    """A token array damaged or edited in place at its length passes the shards' checks (shard.json's
    max_id): an id at or over the vocabulary was an IndexError in the masking, a negative one went
    into the batch (an embedding error on CPU, a device assert on GPU)."""
    import shutil

    copy = tmp_path / "tokens"
    shutil.copytree(sample_tokens, copy)
    path = sorted(copy.glob("lang=de/*/*/train.tokens.npy"))[0]
    np.save(path, np.full_like(np.load(path), bad))
    loader = MLMLoader(TokenShards.open(copy), LoaderConfig(seq_len=64, batch_size=4, languages=["de"]))
    with pytest.raises(UserError, match=rf"^token shard {path}: document \d+ \(lang=de\) holds id {bad} outside the "
                                        r"vocabulary \(0\.\.\d+\)"):
        for _ in range(50):
            next(loader)
    np.save(path, np.load(sample_tokens / path.relative_to(copy)))  # one id, in a later document of another file
    other = sorted(copy.glob("lang=de/*/*/train.tokens.npy"))[-1]
    tokens, offsets = np.load(other), np.load(other.with_name("train.offsets.npy"))
    tokens[offsets[-2]] = bad
    np.save(other, tokens)
    loader = MLMLoader(TokenShards.open(copy), LoaderConfig(seq_len=64, batch_size=4, languages=["de"]))
    with pytest.raises(UserError, match=rf"^token shard {other}: document {len(offsets) - 2} \(lang=de\) holds id {bad} "):
        for _ in range(5000):
            next(loader)
    held_out = sorted(copy.glob("lang=de/*/*/valid.tokens.npy"))[0]  # and in a validation batch
    np.save(held_out, np.full_like(np.load(held_out), bad))
    loader = MLMLoader(TokenShards.open(copy), LoaderConfig(seq_len=64, batch_size=4, languages=["de"]))
    with pytest.raises(UserError, match=rf"^token shard {held_out}: document 0 \(lang=de\) holds id {bad} "):
        list(loader.valid_batches("de"))
