"""Session fixtures for the pretraining and evaluation tests: a small tokenizer trained on the sample
corpus and its token shards; tests/conftest.py imports them. Both are built once per test session
under pytest's base temporary directory."""
from __future__ import annotations

from pathlib import Path

import pytest

SAMPLE_VOCAB = 4000
"""Vocabulary size of the sample tokenizer (ids 0..3999; <mask> = 3999)."""


@pytest.fixture(scope="session")
def sample_tokenizer(sample_corpus: Path, tmp_path_factory) -> Path:
    """A tokenizer directory (spm.model, sentencepiece.bpe.model, HF config files) trained on 20,000
    sentences alpha-sampled from the sample corpus (~12 s)."""
    from pretrain.tokenizer import META, train_tokenizer

    out = tmp_path_factory.getbasetemp() / "sample-tokenizer"
    if not (out / META).is_file():  # written last
        train_tokenizer(sample_corpus, out, vocab_size=SAMPLE_VOCAB, sample_size=20_000, seed=0)
    return out


@pytest.fixture(scope="session")
def sample_tokens(sample_corpus: Path, sample_tokenizer: Path, tmp_path_factory) -> Path:
    """Token shards of the whole sample corpus (2 % held out, at least one document per language)."""
    from pretrain.shards import META, tokenize_corpus

    out = tmp_path_factory.getbasetemp() / "sample-tokens"
    if not (out / META).is_file():  # written last
        tokenize_corpus(sample_corpus, sample_tokenizer, out, valid_fraction=0.02)
    return out
