"""Rehydration (FineWeb-2): a kept document counts, and is trained on, as many times as its
near-duplicate cluster's size earns it: in sampling.json and the report (the pipeline's sums) and
in the token shards (``pretrain tokenize --rehydration``). Off by default."""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.output import shards
from pipeline.output.layout import shard_files
from pipeline.report.sampling import FINEWEB2_REHYDRATION, copies
from pipeline.util.errors import UserError

SIZES = [1, 2, 3, 4, 5, 99, 100, 999, 1000, 5000]


def test_fineweb2_schedule() -> None:
    assert [copies(n, FINEWEB2_REHYDRATION) for n in SIZES] == [1, 2, 3, 3, 5, 5, 8, 8, 1, 1]
    assert copies(7, ()) == 1


def test_sampling_json_counts_the_copies(tmp_path: Path) -> None:
    from pipeline.config import load_config
    from pipeline.report.corpus_report import sampling_section
    from pipeline.report.stats import table_stats, write_artifacts
    from pipeline.transforms.write import CorpusStats

    texts = ["a" * 10, "b" * 20, "c" * 30, "d" * 40]
    table = pa.table({"lang": ["en", "en", "fr", "fr"], "bucket": ["all"] * 4, "text": texts,
                      "minhash_cluster_size": pa.array([1, 2, 100, None], pa.int32()), "perplexity": [None] * 4})
    combine = CorpusStats()
    corpus = combine.extract_output(combine.add_input(combine.create_accumulator(), table_stats(table)))
    for schedule, expected in (([], {"en": 30, "fr": 70}), ([list(p) for p in FINEWEB2_REHYDRATION],
                                                             {"en": 10 + 2 * 20, "fr": 8 * 30 + 40})):
        cfg = load_config(None, {"input": ["x"], "output": str(tmp_path / "out")},
                          [f"sampling.rehydration={json.dumps(schedule)}"])
        write_artifacts({}, corpus, cfg, 1, {})
        sampling = json.loads((tmp_path / "out" / "sampling.json").read_text())
        assert {lang: row["n"] for lang, row in sampling["languages"].items()} == expected
        assert ("rehydration" in sampling) == bool(schedule)
    assert sampling["rehydration"]["languages"]["fr"] == {"documents": 2, "characters": 70, "documents_rehydrated": 9,
                                                          "characters_rehydrated": 280}
    section = sampling_section(sampling)
    assert section.tables[1].rows[1] == ["fr", "2", "9", "70", "280"]
    # pretrain's weights at another alpha: from the rehydrated counts, as sampling.json's own are
    from pipeline.report.sampling import sampling_weights
    from pretrain.tokenizer import corpus_weights

    q, where = corpus_weights(str(tmp_path / "out"), 0.7, [], ["en", "fr"], {})
    expected = sampling_weights({"en": 10 + 2 * 20, "fr": 8 * 30 + 40}, 0.7)
    assert q == pytest.approx({lang: row["q"] for lang, row in expected.items()})
    assert where.endswith("characters after rehydration (alpha=0.7)")
    # the config's buckets in any order (commoncrawl.yaml's head, middle, all): pretrain sorts its own
    cfg = load_config(None, {"input": ["x"], "output": str(tmp_path / "out")},
                      [f"sampling.rehydration={json.dumps(schedule)}", "sampling.buckets=[head, all]"])
    write_artifacts({}, corpus, cfg, 1, {})
    recorded = json.loads((tmp_path / "out" / "sampling.json").read_text())["languages"]
    q, where = corpus_weights(str(tmp_path / "out"), 0.3, ["head", "all"], ["en", "fr"], {})
    assert q == {lang: row["q"] for lang, row in recorded.items()} and where.endswith("sampling.json (alpha=0.3)")
    assert corpus_weights(str(tmp_path / "out"), 0.7, ["all", "head"], ["en", "fr"], {})[1].endswith(
        "characters after rehydration (alpha=0.7)")


def test_bad_schedule_is_one_line() -> None:
    from pipeline.config import load_config

    with pytest.raises(UserError, match="sampling.rehydration: cluster sizes must rise from 1"):
        load_config(None, {"input": ["x"], "output": "/tmp/x"}, ["sampling.rehydration=[[2, 2], [1, 1]]"])
    with pytest.raises(UserError, match=r"copies from 1 to 1000\] pairs"):  # (its tokens would not fit in memory)
        load_config(None, {"input": ["x"], "output": "/tmp/x"}, ["sampling.rehydration=[[1, 1000000000000]]"])


def test_tokenize_repeats_training_documents(sample_corpus: Path, sample_tokenizer: Path, tmp_path: Path) -> None:
    """One shard of the sample gets planted cluster sizes; tokenize with FineWeb-2's schedule
    writes each training document that many times, held-out ones once, and counts both."""
    from pretrain.shards import META, TokenShards, tokenize_corpus, valid_score

    corpus = tmp_path / "corpus"
    shutil.copytree(sample_corpus, corpus)
    path = next(p for p in shard_files(str(corpus)) if "lang=fr" in p)
    table = shards.read_shard(path)
    planted = [SIZES[i % len(SIZES)] for i in range(table.num_rows)]
    column = table.schema.get_field_index("minhash_cluster_size")
    shards.write_table(table.set_column(column, "minhash_cluster_size", pa.array(planted, pa.int32())), path, "arrow")
    plain = tokenize_corpus(corpus, sample_tokenizer, tmp_path / "plain", valid_fraction=0.2, languages=["fr"])
    meta = tokenize_corpus(corpus, sample_tokenizer, tmp_path / "rehydrated", valid_fraction=0.2, languages=["fr"],
                           rehydration=FINEWEB2_REHYDRATION)
    row, base = meta["languages"]["fr"], plain["languages"]["fr"]
    assert meta["rehydration"] == [list(p) for p in FINEWEB2_REHYDRATION] and plain["rehydration"] == []
    assert row["valid_documents"] == base["valid_documents"] and row["valid_tokens"] == base["valid_tokens"]
    assert row["train_documents_before"] == base["train_documents"] and row["train_tokens_before"] == base["train_tokens"]

    ids = table.column("id").to_pylist()
    trained = [copies(size, FINEWEB2_REHYDRATION) for size, doc_id in zip(planted, ids) if valid_score(doc_id) >= 0.2]
    other = base["train_documents"] - len(trained)  # the language's other shards: size 1, once each
    assert row["train_documents"] == sum(trained) + other > base["train_documents"]
    docs = TokenShards.open(tmp_path / "rehydrated").docs("fr")
    assert len(docs) == row["train_documents"]
    with pytest.raises(UserError, match="written with --rehydration"):
        tokenize_corpus(corpus, sample_tokenizer, tmp_path / "rehydrated", valid_fraction=0.2, languages=["fr"])
    assert (tmp_path / "rehydrated" / META).is_file()
    # a shard without cluster sizes (a corpus built without near_dedup): said, not each document once
    shards.write_table(table.set_column(column, "minhash_cluster_size", pa.nulls(table.num_rows, pa.int32())), path, "arrow")
    with pytest.raises(UserError, match=rf"^--rehydration: corpus shard {re.escape(path)} has no minhash_cluster_size"):
        tokenize_corpus(corpus, sample_tokenizer, tmp_path / "sizeless", valid_fraction=0.2, languages=["fr"],
                        rehydration=FINEWEB2_REHYDRATION)


def test_rehydration_option_takes_whole_numbers_only() -> None:
    from pretrain.shards import rehydration_arg

    assert rehydration_arg("[[1, 1], [2, 3]]") == ((1, 1), (2, 3)) and rehydration_arg("fineweb2") == FINEWEB2_REHYDRATION
    for bad in ("[[1, 1.7]]", "[[1]]", "5", '"x"', "[[1, true]]", "[[1, 2", "{}", '""', '{"1": 1}'):  # {}: off, silently
        with pytest.raises(argparse.ArgumentTypeError, match="whole-number pairs"):
            rehydration_arg(bad)
