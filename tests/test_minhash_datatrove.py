"""``near_dedup.scheme: datatrove`` (the fineweb2 profile's MinHash) against datatrove's own four
MinHash stages (``MinhashDedupSignature``, ``MinhashDedupBuckets``, ``MinhashDedupCluster`` with
``save_cluster_size``, ``MinhashDedupFilter``), configured as ``fineweb-2-pipeline.py`` configures
them, run per language on the same documents in id order: the same documents removed, the same
``minhash_cluster_size`` on every kept one. The documents: the bundled sample (11 languages, its
own duplicates and near-duplicates), planted families of copies and edited variants with random
ids (so that clusters merge in every order and union by size picks roots that are not the
smallest id), and for bg, th, sw and ur documents shuffled from a few sentences."""
from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.steps import minhash_datatrove as mdt
from pipeline.steps.near_dedup import NearDupConfig
from quality_docs import FW2_FILES, PLANTED_LINES
from test_neardup import VARIANTS, originals, run_stage, sample_docs, variant  # noqa: F401  (fixtures)

pytest.importorskip("spacy", reason="the quality extra (spaCy, xxhash, ...) is not installed")
pytest.importorskip("datatrove", reason="the dev extra (datatrove) is not installed")

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = 12  # planted families per sample language


def profile_config() -> NearDupConfig:
    return load_config(str(ROOT / "configs" / "corpus" / "fineweb2.yaml")).section("near_dedup")


def reference_config() -> Any:
    """``fineweb-2-pipeline.py``'s MinhashConfig."""
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.utils.hashing import HashConfig

    return MinhashConfig(hash_config=HashConfig(hash_fc="xxhash", precision=64), num_buckets=14, hashes_per_bucket=8,
                         n_grams=5)


def datatrove_dedup(docs: list[dict], lang: str, work: Path) -> tuple[dict[str, int], set[str]]:
    """datatrove's four stages on ``docs`` (one language) read in id order, in one task:
    ({kept id: minhash_cluster_size}, removed ids)."""
    from datatrove.data import Document
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)

    config = reference_config()
    ordered = sorted(docs, key=lambda d: d["id"])
    sigs, buckets, remove_ids = (str(work / name) for name in ("signatures", "buckets", "remove_ids"))
    MinhashDedupSignature(sigs, config=config, language=FW2_FILES.get(lang, "eng_Latn")).run(
        iter(Document(text=d["text"], id=d["id"]) for d in ordered), 0, 1)
    for bucket in range(config.num_buckets):  # as fineweb-2-pipeline.py: its stage 2 takes only the hash config
        MinhashDedupBuckets(sigs, buckets,
                            config=MinhashConfig(hash_config=config.hash_config)).run(None, bucket, config.num_buckets)
    MinhashDedupCluster(buckets, remove_ids, config=config, save_cluster_size=True).run(None, 0, 1)
    kept = {doc.id: doc.metadata.get("minhash_cluster_size", 1)  # a language without duplicates has no .sizes
            for doc in MinhashDedupFilter(remove_ids, load_cluster_sizes=True).run(
                iter(Document(text=d["text"], id=d["id"]) for d in ordered), 0, 1)}
    return kept, {d["id"] for d in ordered} - set(kept)


def random_id(rng: random.Random) -> str:
    return f"<urn:uuid:{rng.getrandbits(128):032x}>"


@pytest.fixture(scope="module")
def documents(sample_docs, originals) -> list[dict]:  # noqa: F811  (fixtures imported above)
    docs, _ = sample_docs
    rng = random.Random(32)
    out = list(docs)
    for lang in sorted({d["lang"] for d in originals}):
        for doc in [d for d in originals if d["lang"] == lang][:FAMILIES]:
            copies = rng.randrange(1, 4)  # clusters of several sizes, merging through the variants
            out += [{**doc, "id": random_id(rng)} for _ in range(copies)]
            for how in rng.sample(VARIANTS, 4):
                out.append({**doc, "id": random_id(rng), "text": variant(doc, how, rng)})
    for lang, lines in sorted(PLANTED_LINES.items()):
        for _ in range(30):
            text = "\n".join(rng.choice(lines) for _ in range(rng.randrange(3, 12)))
            out.append({"id": random_id(rng), "url": f"https://example.{lang}/", "text": text, "lang": lang})
    return out


def test_shingles_and_signatures_equal_datatrove(originals) -> None:  # noqa: F811
    from datatrove.pipeline.dedup.minhash import MinhashDedupSignature
    from datatrove.utils.text import simplify_text

    config = reference_config()
    planted = ["Le 12,5 % de 1.000.000 — 3٫14 et ١٢٣ ÉCOLE naïve", "a\u0301b\u0327c", "１２３ ¹²³ ½ x\u200by", "", " \n\t "]
    texts = [d["text"] for d in originals[::7]] + planted
    for text in texts:
        assert mdt.simplify(text) == simplify_text(text)
    for lang in ("en", "zh", "th", "hi", "vi", "ar"):
        reference = MinhashDedupSignature("/nonexistent", config=config, language=FW2_FILES.get(lang, "eng_Latn"))
        for text in texts[:8] + planted:
            expected = reference.get_shingles(text)
            ours = mdt.shingles(text, lang, 5)
            assert np.array_equal(expected.ravel(), ours), (lang, text[:60])
            if len(ours):
                assert np.array_equal(np.array(reference.get_signature(expected)).ravel(), mdt.signature(ours, 112, 1))


def test_simplify_numbers_equal_datatrove() -> None:
    """Every decimal digit of ``re``'s tables or ``regex``'s (datatrove's), alone, repeated, with a
    decimal part after each separator datatrove takes and with two: simplified as ``simplify_text``
    does (U+116D0.. Myanmar Eastern Pwo Karen, Unicode 16, are digits to ``regex`` only)."""
    import re

    import regex
    from datatrove.utils.text import simplify_text

    digits = [chr(c) for c in range(sys.maxunicode + 1)
              if re.fullmatch(r"\d", chr(c)) or regex.fullmatch(r"\p{Nd}", chr(c))]
    assert "\U000116D0" in digits
    for d in digits:
        text = f"{d} {d}{d} x{d},{d}{d}.{d}y " + " ".join(f"{d}{sep}{d}{d}" for sep in ".,،٫⎖⎗⎘") + f" {d}.{d}.{d}"
        assert mdt.simplify(text) == simplify_text(text), hex(ord(d))


def test_same_removals_and_cluster_sizes_as_datatrove(documents, tmp_path: Path) -> None:
    cfg = profile_config()
    assert (cfg.scheme, cfg.word_ngram, cfg.band_rows(), cfg.seed) == ("datatrove", 5, (14, 8), 1)
    kept, removed, counters = run_stage(documents, cfg, tmp_path / "ours")
    by_lang: dict[str, list[dict]] = {}
    for doc in documents:
        by_lang.setdefault(doc["lang"], []).append(doc)
    expected_kept, expected_removed = {}, set()
    for lang, docs in sorted(by_lang.items()):
        k, r = datatrove_dedup(docs, lang, tmp_path / "datatrove" / lang)
        expected_kept.update(k)
        expected_removed |= r
    assert set(removed) == expected_removed
    assert kept == expected_kept
    # the documents exercise what the test is for: clusters of many sizes, and roots chosen by size
    sizes = [s for s in kept.values() if s > 1]
    assert len(sizes) > 100 and max(sizes) >= 8 and counters["near_duplicate"] == len(removed) > 200
    members: dict[str, list[str]] = {}
    for doc_id, root in removed.items():
        members.setdefault(root, [root]).append(doc_id)
    assert sum(min(ids) != root for root, ids in members.items()) >= 3


def test_union_find_as_datatrove_orders_it() -> None:
    # a bucket joins b..e (root b, size 4); a later bucket pairs a with b: the bigger set's root stays
    removed, sizes = mdt.union_find([("b", "c"), ("c", "d"), ("d", "e"), ("a", "b")])
    assert sizes == {"b": 5} and removed == {"a": "b", "c": "b", "d": "b", "e": "b"}
    # on a tie the pair's first root stays
    removed, sizes = mdt.union_find([("x", "y"), ("a", "b"), ("x", "a")])
    assert sizes == {"x": 4} and set(removed) == {"y", "a", "b"}
    assert mdt.union_find([]) == ({}, {})


def test_short_and_empty_documents_have_no_signature() -> None:
    assert mdt.signature(mdt.shingles("one two three four", "en", 5), 112, 1) is None
    assert mdt.signature(mdt.shingles("", "en", 5), 112, 1) is None
    assert mdt.signature(mdt.shingles("one two three four five", None, 5), 112, 1) is not None


def test_a_language_without_a_tokenizer_falls_back_and_is_counted(tmp_path: Path) -> None:
    text = "one two three four five six seven eight nine ten eleven twelve"
    docs = [{"id": f"<urn:uuid:{i}>", "url": "https://x.test/", "text": text, "lang": "qq"} for i in range(3)]
    kept, removed, counters = run_stage(docs, profile_config(), tmp_path)
    assert counters["tokenizer_fallback/qq"] == 3  # spaCy's multi-language rules
    assert kept == {"<urn:uuid:0>": 3} and set(removed) == {"<urn:uuid:1>", "<urn:uuid:2>"}


def test_the_scheme_s_modules_are_checked_before_the_job(monkeypatch):
    """``scheme: datatrove`` without xxhash or regex installed is one line in the driver (it failed in
    every worker at its first document); the default scheme needs neither."""
    import importlib.util

    from pipeline.steps.base import RunInfo
    from pipeline.steps.near_dedup import NearDedup, NearDupConfig
    from pipeline.util.errors import UserError

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "regex" else find_spec(name, *a))
    NearDedup(NearDupConfig(), RunInfo()).prepare()
    with pytest.raises(UserError, match=r"^near_dedup.scheme datatrove needs regex: pip install 'polyglot-corpus\[quality\]'"):
        NearDedup(NearDupConfig(scheme="datatrove"), RunInfo()).prepare()
