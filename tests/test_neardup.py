"""MinHash near-dup removal: shingle hashes vs a reference, datasketch parity, quality on planted
near-duplicates of the real sample, transitive chains, connected components, determinism, edge cases."""
from __future__ import annotations

import dataclasses
import json
import pickle
import random
import re
import unicodedata
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from datasketch import MinHash, MinHashLSH

from pipeline.steps import minhash as nd
from pipeline.util.errors import UserError
from pipeline.steps.base import RunInfo
from pipeline.steps.near_dedup import NearDedup, NearDupConfig
from pipeline.readers import spill
from pipeline.runners.options import direct_pipeline
from pipeline.transforms.near_dedup import (BandKeys, CandidateEdges, ConnectedComponents, DocsByPartition,
                                           NearDedupTransform, partition_of)
from pipeline.transforms.scratch import ScratchPickles, Unpickler
from pipeline.readers.warc import RecordReader

MASK = (1 << 64) - 1


# --------------------------------------------------------------------------- reference definition

def fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & MASK
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK
    return h ^ (h >> 33)


def poly(values, base: int) -> int:
    h = 0
    for v in values:
        h = (h * base + v) & MASK
    return h


def ref_units(text: str, kind: str) -> list[str]:
    """Words (or word characters): letters, marks and numbers after lower(), a run of digits as one 0."""
    folded, digits = [], False
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if cat == "Nd" and not digits:
            folded.append("0")
        elif cat != "Nd":
            folded.append(ch if cat[0] in "LMN" else " ")
        digits = cat == "Nd"
    joined = "".join(folded)
    return list(joined.replace(" ", "")) if kind == "char" else joined.split()


def ref_shingles(text: str, kind: str, n: int) -> list[tuple[str, ...]]:
    units = ref_units(text, kind)
    if len(units) < n:
        return [tuple(units)] if units else []
    return [tuple(units[i:i + n]) for i in range(len(units) - n + 1)]


def ref_hash(shingle: tuple[str, ...], kind: str) -> int:
    words = [fmix64(poly(map(ord, w), nd.CHAR_BASE)) for w in shingle]
    values = [ord(c) for c in shingle] if kind == "char" else words
    return fmix64(poly(values, nd.NGRAM_BASE)) >> 32


def true_jaccard(a: str, b: str, kind: str, n: int = 5) -> float:
    sa, sb = set(ref_shingles(a, kind, n)), set(ref_shingles(b, kind, n))
    return len(sa & sb) / len(sa | sb) if sa | sb else 0.0


def kind_of(doc: dict) -> str:
    return nd.shingle_kind(doc.get("lang"), "auto")


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def sample_docs(sample: Path) -> tuple[list[dict], dict[str, dict]]:
    """The sample's WET documents (with lang from the manifest) and the manifest by id."""
    manifest = json.loads((sample / "manifest.json").read_text(encoding="utf-8"))
    truth = {d["id"]: d for d in manifest["documents"]}
    docs = []
    for path in sorted((sample / "wet").glob("*.warc.wet.gz")):
        with open(path, "rb") as stream:
            for result in RecordReader(str(path), "wet").read(stream):
                if isinstance(result, dict):
                    docs.append({**result, "lang": truth[result["id"]]["lang"]})
    assert len(docs) == len(truth) > 1000
    return docs, truth


@pytest.fixture(scope="module")
def originals(sample_docs) -> list[dict]:
    """Distinct sample documents (the manifest's originals: pairwise word 5-gram Jaccard < 0.3)."""
    docs, truth = sample_docs
    return sorted((d for d in docs if not truth[d["id"]].get("dup_of") and not truth[d["id"]].get("near_dup_of")),
                  key=lambda d: d["id"])


def edit(text: str, fraction: float, rng: random.Random, chars: bool) -> str:
    """Replace, delete or swap ``fraction`` of the words (characters for space-less scripts)."""
    lines = [list(line) if chars else line.split(" ") for line in text.split("\n")]
    slots = [(i, j) for i, line in enumerate(lines) for j in range(len(line))
             if not chars or lines[i][j].isalpha()]
    vocab = [lines[i][j] for i, j in slots]
    for i, j in rng.sample(slots, max(1, round(fraction * len(slots)))):
        op = rng.random()
        if op < 0.6:
            lines[i][j] = rng.choice(vocab)
        elif op < 0.8:
            lines[i][j] = ""
        elif j + 1 < len(lines[i]):
            lines[i][j], lines[i][j + 1] = lines[i][j + 1], lines[i][j]
    return "\n".join(("" if chars else " ").join(t for t in line if t) for line in lines)


def renumber(text: str, rng: random.Random) -> str:
    """Every number changed (another value, often another length), as dates and counters do."""
    return re.sub(r"\d+", lambda m: str(rng.randrange(1, 10 ** (len(m.group()) + 1))), text)


def reorder(text: str, rng: random.Random) -> str:
    """One paragraph moved elsewhere."""
    lines = text.split("\n")
    line = lines.pop(rng.randrange(len(lines)))
    lines.insert(rng.randrange(len(lines) + 1), line)
    return "\n".join(lines)


VARIANTS = ["edit_0.01", "edit_0.02", "edit_0.05", "edit_0.10", "edit_0.20", "numbers", "reorder",
            "numbers+reorder+edit_0.01"]


def variant(doc: dict, kind: str, rng: random.Random) -> str:
    text = doc["text"]
    for step in kind.split("+"):
        if step.startswith("edit_"):
            text = edit(text, float(step[5:]), rng, chars=kind_of(doc) == "char")
        elif step == "numbers":
            text = renumber(text, rng)
        else:
            text = reorder(text, rng)
    return text


@pytest.fixture(scope="module")
def planted(sample_docs, originals) -> tuple[list[dict], dict[str, str], dict[str, str]]:
    """The whole sample plus planted variants of 32 originals per language.

    Returns the documents, ``family`` (id -> id of the original it derives from) and ``kinds``
    (variant id -> how it was made: a VARIANTS entry, or the sample's ``dup`` / ``near_dup``).
    """
    docs, truth = sample_docs
    family = {d["id"]: truth[d["id"]].get("dup_of") or truth[d["id"]].get("near_dup_of") or d["id"] for d in docs}
    kinds = {i: "sample_" + ("dup" if truth[i].get("dup_of") else "near_dup") for i, f in family.items() if f != i}
    rng = random.Random(4)
    out = list(docs)
    for lang in sorted({d["lang"] for d in originals}):
        for k, doc in enumerate([d for d in originals if d["lang"] == lang][:32]):
            how = VARIANTS[k % len(VARIANTS)]
            new_id = f"<urn:uuid:planted-{lang}-{k:03d}>"
            out.append({**doc, "id": new_id, "url": doc["url"] + "?v=2", "text": variant(doc, how, rng)})
            family[new_id], kinds[new_id] = doc["id"], how
    return out, family, kinds


def write_jsonl(docs: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")


def run_stage(docs: list[dict], cfg: NearDupConfig, work: Path, *options: str, write_removed: bool = True,
              scratch: str = ""):
    """Run the near_dedup step on ``docs``: ({kept id: cluster size}, {removed id: duplicate_of}, its counters)."""
    work.mkdir(parents=True, exist_ok=True)
    write_jsonl(docs, work / "in.jsonl")
    p = direct_pipeline(*options)
    out = p | beam.io.ReadFromText(str(work / "in.jsonl")) | beam.Map(json.loads) | NearDedupTransform(
        NearDedup(cfg, RunInfo()), RunInfo(write_removed=write_removed, scratch=scratch))
    _ = (out.main | "Kept" >> beam.Map(lambda d: json.dumps([d["id"], d["minhash_cluster_size"], d["text"]]))
         | "WriteKept" >> beam.io.WriteToText(str(work / "kept")))
    _ = out.removed | "Removed" >> beam.Map(json.dumps) | "WriteRemoved" >> beam.io.WriteToText(str(work / "removed"))
    result = p.run()
    result.wait_until_finish()
    kept, texts = {}, {d["id"]: d["text"] for d in docs}
    for path in sorted(work.glob("kept-*")):
        for line in path.read_text(encoding="utf-8").splitlines():
            doc_id, size, text = json.loads(line)
            assert text == texts[doc_id]  # documents pass through unchanged
            kept[doc_id] = size
    removed = {}
    for path in sorted(work.glob("removed-*")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            removed[record["id"]] = record["duplicate_of"]
    counters = {c.key.metric.name: c.committed for c in result.metrics().query(MetricsFilter())["counters"]
                if c.key.metric.namespace == NearDedup.name}
    return kept, removed, counters


# --------------------------------------------------------------------------- config

def test_config_defaults_and_validation():
    cfg = NearDupConfig()
    cfg.validate()
    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    assert cfg.band_rows() == (lsh.b, lsh.r) == (9, 13)
    assert NearDupConfig(bands=16, rows=8).band_rows() == (16, 8)
    assert NearDupConfig(scheme="datatrove").band_rows() == (14, 8)  # datatrove's buckets x hashes per bucket
    NearDupConfig(scheme="datatrove", bands=20, rows=8).validate()  # num_perm is the datasketch scheme's
    assert cfg.min_matches() == 103  # 103/128 >= 0.8 > 102/128
    bad = [dict(scheme="minhash"), dict(shingle="bigram"), dict(scope="world"), dict(word_ngram=0), dict(num_perm=0),
           dict(threshold=0.0), dict(threshold=1.5), dict(bands=4), dict(bands=20, rows=7),
           dict(bands=0, rows=4), dict(max_iterations=0), dict(seed=-1)]
    for values in bad:
        with pytest.raises(UserError):
            NearDupConfig(**values).validate()


# --------------------------------------------------------------------------- shingles and signatures

def test_shingle_hashes_match_the_reference_definition(originals):
    rng = random.Random(1)
    texts = {lang: [d["text"] for d in originals if d["lang"] == lang][:3] for lang in {d["lang"] for d in originals}}
    extra = ["", "Wort", "drei kurze Wörter", "İstanbul'da 12.05.2024 — ÇOK güzel!", "a\0b c\0d e f", "  \n "]
    for kind, n in (("word", 5), ("char", 5), ("word", 1), ("char", 3)):
        batch = [t for group in texts.values() for t in group] + extra
        rng.shuffle(batch)
        hashes, docs = nd.shingle_hashes(batch, kind, n)
        assert np.all(np.diff(docs) >= 0)
        for i, text in enumerate(batch):
            expected = [ref_hash(s, kind) for s in ref_shingles(text, kind, n)]
            assert hashes[docs == i].tolist() == expected, (kind, n, text[:60])


def test_band_layout_and_permutations_equal_datasketch():
    """:func:`nd.optimal_bands` (exact Gauss-Legendre integrals) picks datasketch's (bands, rows)
    (scipy's ``quad``) on a grid of thresholds and sizes; the permutations are ``MinHash``'s own."""
    from datasketch.lsh import _optimal_param

    grid = [(128, t / 100) for t in range(5, 100, 5)] + [(n, t / 10) for n in (16, 32, 64, 100, 256) for t in range(1, 10)]
    for num_perm, threshold in grid:
        assert nd.optimal_bands(threshold, num_perm) == _optimal_param(threshold, num_perm, 0.5, 0.5), (num_perm, threshold)
    for num_perm, seed in ((128, 1), (64, 42), (256, 0), (1, 7)):
        a, b = nd.permutations(num_perm, seed)
        theirs = MinHash(num_perm=num_perm, seed=seed).permutations
        assert a.dtype == b.dtype == theirs.dtype == np.uint32
        assert np.array_equal(a[:, 0], theirs[0]) and np.array_equal(b[:, 0], theirs[1])


def test_signatures_equal_datasketch_minhash(originals):
    docs = originals[::50]
    for num_perm, seed in ((128, 1), (64, 42)):
        cfg = NearDupConfig(num_perm=num_perm, seed=seed)
        for kind in ("word", "char"):
            texts = [d["text"] for d in docs]
            sigs = nd.signatures(texts, cfg, kind)
            hashes, owner = nd.shingle_hashes(texts, kind, 5)
            for i in range(len(texts)):
                m = MinHash(num_perm=num_perm, seed=seed, hashfunc=int)
                m.update_batch(hashes[owner == i].tolist())
                assert np.array_equal(sigs[i], m.hashvalues)
                assert m.scheme == "affine32"


def test_estimates_agree_with_datasketch_and_true_jaccard(originals):
    """Our estimate vs datasketch's default MinHash (SHA-1 of the shingle strings) vs the truth."""
    rng = random.Random(2)
    cfg = NearDupConfig()
    ours, theirs, truth = [], [], []
    for k, doc in enumerate(originals[:: max(1, len(originals) // 150)]):
        kind = kind_of(doc)
        other = variant(doc, VARIANTS[k % len(VARIANTS)], rng)
        a, b = nd.signatures([doc["text"], other], cfg, kind)
        ours.append(nd.jaccard(a, b))
        ds = [MinHash(num_perm=128, seed=1) for _ in range(2)]
        for m, text in zip(ds, (doc["text"], other)):
            m.update_batch(["\x1f".join(s).encode("utf-8") for s in ref_shingles(text, kind, 5)])
        theirs.append(ds[0].jaccard(ds[1]))
        truth.append(true_jaccard(doc["text"], other, kind))
    ours, theirs, truth = map(np.array, (ours, theirs, truth))
    assert len(truth) >= 140 and truth.min() < 0.5 < 0.9 < truth.max()
    # standard error of one estimate: sqrt(J(1-J)/128) <= 0.044
    assert np.abs(ours - truth).mean() < 0.035 and np.abs(ours - truth).max() < 0.15
    assert np.abs(theirs - truth).mean() < 0.035
    assert abs((ours - truth).mean()) < 0.01 and abs(ours.mean() - theirs.mean()) < 0.015


def test_lsh_buckets_and_verified_edges(originals):
    doc = next(d for d in originals if len(re.findall(r"\d+", d["text"])) >= 3 and kind_of(d) == "word")
    rng = random.Random(3)
    cfg = NearDupConfig()
    texts = [doc["text"], variant(doc, "numbers", rng), variant(doc, "edit_0.01", rng), originals[1]["text"]]
    sigs = nd.signatures(texts, cfg)
    assert texts[1] != texts[0] and np.array_equal(sigs[0], sigs[1])  # other numbers: the same shingles
    keys = nd.band_keys(sigs, *cfg.band_rows())
    assert keys.shape == (4, 9) and keys.dtype == np.int64
    assert (keys[0] == keys[2]).any() and not (keys[0] == keys[2]).all() and not (keys[0] == keys[3]).any()
    sigs = sigs[[0, 1, 3]]
    members = [("c", sigs[2].tobytes()), ("b", sigs[1].tobytes()), ("a", sigs[0].tobytes())]
    assert nd.bucket_edges(members, None) == ([("a", "b"), ("a", "c")], False)
    assert nd.bucket_edges(members, cfg.min_matches()) == ([("a", "b")], False)  # c is unlike a and b


def test_a_chain_in_one_bucket_is_one_cluster_whatever_its_ids():
    """A~B~C~D in one bucket, no other pair alike, ids ordered A < D < B < C: each member linked to
    its smallest alike member gave B-A, C-D and D-C, two clusters where the chain is one."""
    base = np.arange(10, dtype=np.uint32)

    def sig(changes: dict[int, int]) -> bytes:
        s = base.copy()
        s[list(changes)] = list(changes.values())
        return s.tobytes()

    chain = {"a": sig({6: 100, 7: 101}), "b": sig({}), "c": sig({8: 200, 9: 201}), "d": sig({8: 200, 9: 201, 4: 300, 5: 301})}
    ids = dict(zip("abcd", ("a1", "a3", "a4", "a2")))  # A < D < B < C
    members = [(ids[k], s) for k, s in chain.items()]
    matches = {(x, y): int((np.frombuffer(chain[x], np.uint32) == np.frombuffer(chain[y], np.uint32)).sum())
               for x in "abcd" for y in "abcd" if x < y}
    assert {pair for pair, n in matches.items() if n >= 8} == {("a", "b"), ("b", "c"), ("c", "d")}
    assert nd.bucket_edges(members, 8) == ([("a1", "a2"), ("a1", "a3"), ("a1", "a4")], False)
    assert nd.bucket_edges(members[:1], None) == ([], False)


def test_a_bucket_over_the_verify_limit_compares_its_later_members_with_its_first_ones_only():
    """Past ``verify_limit`` members a member is checked against the first ones only: a pair of later
    members alike to each other alone is not joined; one alike to a first member, or to the very
    first, is; a first member is still checked against every member (a3, unlike a0, joins it through
    b5, which is past the limit and alike to a0); at or under the limit the edges are those of every
    pair checked."""
    rng = np.random.default_rng(3)

    def unlike() -> np.ndarray:
        return rng.integers(1, 2**32, 10, dtype=np.uint32)  # no position shared with another

    def like(sig: np.ndarray) -> bytes:
        near = sig.copy()
        near[0] += 1  # 9 of 10 positions equal: alike at 8
        return near.tobytes()

    first = {f"a{i}": unlike() for i in range(5)}
    first["a3"] = first["a0"].copy()
    first["a3"][:4] += 1  # 6 of 10 positions like a0's: not alike
    b1, b5 = unlike(), first["a0"].copy()
    b5[:2] = first["a3"][:2]  # 8 like a0's and 8 like a3's: alike to both, so a3 joins a0 through b5
    members = [*((k, v.tobytes()) for k, v in first.items()), ("b1", b1.tobytes()), ("b2", like(b1)),
               ("b3", like(first["a2"])), ("b4", like(first["a0"])), ("b5", b5.tobytes())]
    every = [("a0", "a3"), ("b1", "b2"), ("a2", "b3"), ("a0", "b4"), ("a0", "b5")]  # in the later member's order
    assert nd.bucket_edges(members, 8) == (every, False)
    assert nd.bucket_edges(members, 8, verify_limit=len(members)) == (every, False)
    assert nd.bucket_edges(members, 8, verify_limit=5) == ([("a0", "a3"), ("a2", "b3"), ("a0", "b4"), ("a0", "b5")], True)
    assert nd.bucket_edges(members, None, verify_limit=5) == ([("a0", k) for k, _ in members[1:]], True)
    with pytest.raises(UserError, match="verify_limit must be >= 1, got 0"):
        NearDupConfig(verify_limit=0).validate()


@pytest.mark.parametrize("verify", [True, False])
def test_partitioned_band_shuffle_finds_every_shared_bucket(originals, verify, tmp_path):
    """BandKeys' rows per (scope, partition), in any batching and partition count, as bytes or in a
    scratch folder's file, give CandidateEdges the buckets and edges that grouping one element per
    (scope, band, band hash) gives."""
    rng = random.Random(5)
    docs = [dict(d, lang=d.get("lang") or "xx") for d in originals[:60]]
    docs += [dict(d, id=d["id"] + f"-v{i}", text=variant(d, "edit_0.01", rng)) for i, d in enumerate(docs[:30])]
    docs += [dict(docs[0], id="same-text"), dict(docs[1], id="empty", text="")]
    cfg = NearDupConfig(verify=verify, scope="language")
    bands, rows = cfg.band_rows()
    expected: dict[tuple, list] = {}
    for doc in docs:
        sig = nd.signatures([doc["text"]], cfg, kind_of(doc))
        if nd.is_empty(sig)[0]:
            continue
        for band, key in enumerate(nd.band_keys(sig, bands, rows)[0]):
            expected.setdefault((doc["lang"], band, key), []).append((doc["id"], sig[0].tobytes() if verify else b""))
    min_matches = cfg.min_matches() if verify else None
    want = sorted(edge for members in expected.values() if len(members) > 1
                  for edge in nd.bucket_edges(members, min_matches)[0])
    assert len(want) > 30
    for partitions, batch, scratch in ((1, 100, ""), (3, 7, str(tmp_path)), (8, 33, str(tmp_path))):
        keys, grouped = BandKeys(cfg, partitions, scratch), {}
        keys.declared = True  # as Counted sets it
        keys.setup()
        keys.start_bundle()
        for start in range(0, len(docs), batch):
            for key, value in keys.process(docs[start:start + batch]):
                grouped.setdefault(key, []).append(value)
        assert dict(keys._pending)[("near_dedup", "no_shingles")] == 1
        list(keys.finish_bundle())
        assert {part for _, part in grouped} <= set(range(partitions))
        assert {type(v) for values in grouped.values() for v in values} == {str if scratch else bytes}
        edges = CandidateEdges(min_matches)
        got = sorted(edge for item in grouped.items() for edge in edges.process(item))
        assert got == want
        counts = dict(edges._pending)
        assert counts[("near_dedup", "candidate_buckets")] == sum(len(m) > 1 for m in expected.values())
        assert counts[("near_dedup", "edges")] == len(want)
        if verify:  # a limit of 2 members: the buckets of 3 or more are counted, each as bucket_edges says
            limited = CandidateEdges(min_matches, 2)
            assert sorted(edge for item in grouped.items() for edge in limited.process(item)) == sorted(
                edge for members in expected.values() if len(members) > 1
                for edge in nd.bucket_edges(members, min_matches, 2)[0])
            over = sum(len({i for i, _ in members}) > 2 for members in expected.values())
            assert over and dict(limited._pending)[("near_dedup", "buckets_over_verify_limit")] == over


# --------------------------------------------------------------------------- quality (Beam)

def test_planted_near_duplicates_precision_and_recall(planted, tmp_path):
    docs, family, kinds = planted
    kept, removed, counters = run_stage(docs, NearDupConfig(), tmp_path)
    assert sorted([*kept, *removed]) == sorted(d["id"] for d in docs)
    assert all(kept_id in kept for kept_id in removed.values())  # removed docs point at kept ones
    root = {**{i: i for i in kept}, **removed}
    by_id = {d["id"]: d for d in docs}
    pairs = []  # (variant, original, true Jaccard, kind)
    for doc_id, origin in family.items():
        if doc_id != origin:
            d = by_id[doc_id]
            pairs.append((doc_id, origin, true_jaccard(by_id[origin]["text"], d["text"], kind_of(d)), kinds[doc_id]))
    found = {v: root[v] == root[o] for v, o, _, _ in pairs}
    high = [v for v, _, j, _ in pairs if j >= 0.9]
    recall = sum(found[v] for v in high) / len(high)
    correct = sum(family[r] == family[dup] for r, dup in removed.items())
    precision = correct / len(removed)
    lines = [f"{len(docs)} documents, {len(pairs)} near-dup pairs ({len(high)} with J >= 0.9), "
             f"{len(removed)} removed: precision {precision:.4f}, recall(J >= 0.9) {recall:.4f}"]
    for lo, hi in ((0.0, 0.5), (0.5, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 0.95), (0.95, 1.01)):
        band = [found[v] for v, _, j, _ in pairs if lo <= j < hi]
        if band:
            lines.append(f"  J in [{lo:.2f}, {min(hi, 1):.2f}): {len(band):4d} pairs, found {np.mean(band):.3f}")
    for how in sorted({k for *_, k in pairs}):
        group = [(v, j) for v, _, j, k in pairs if k == how]
        lines.append(f"  {how:28s} {len(group):4d} pairs, mean J {np.mean([j for _, j in group]):.3f}, "
                     f"found {sum(found[v] for v, _ in group) / len(group):.3f}")
    print("\n".join(lines))
    assert len(high) >= 200
    assert recall >= 0.95, "\n".join(lines)
    assert precision >= 0.99, "\n".join(lines)
    assert counters.get("cc_not_converged", 0) == 0
    assert counters["near_duplicate"] == len(removed)
    assert counters["documents_out"] == len(kept)
    sizes = {}
    for r in removed.values():
        sizes[r] = sizes.get(r, 1) + 1
    assert {i: s for i, s in kept.items() if s > 1} == sizes


def test_transitive_chain_is_one_cluster(originals, tmp_path):
    """A~B~C~D~E, where A is like B only: one cluster through B, kept = the smallest id.

    Sliding windows of 700 words, 100 apart, over real English text: neighbors share ~75 % of
    their shingles, A and C ~55 %. The threshold is set between the two (measured on the
    signatures), so only the chain links A to the rest.
    """
    words = " ".join(d["text"] for d in originals if d["lang"] == "en").split()[:1100]
    texts = [" ".join(words[k * 100:k * 100 + 700]) for k in range(5)]
    sigs = nd.signatures(texts, NearDupConfig(num_perm=256))
    sim = [[nd.jaccard(a, b) for b in sigs] for a in sigs]
    link, apart = min(sim[i][i + 1] for i in range(4)), max(sim[0][2:])
    assert link - apart >= 0.1, (link, apart)
    cfg = NearDupConfig(num_perm=256, threshold=round((link + apart) / 2, 3), bands=64, rows=4,  # links are candidates
                        max_iterations=5)
    ids = ["n0", "n3", "n1", "n4", "n2"]  # the smallest id at the end only B links, the rest out of order
    docs = [{"id": i, "text": t, "lang": "en", "url": f"https://x.org/{i}"} for i, t in zip(ids, texts)]
    distinct = [{**d, "id": f"z{k}"} for k, d in enumerate(originals[1:6])]
    kept, removed, counters = run_stage(docs + distinct, cfg, tmp_path)
    assert kept["n0"] == 5 and removed == {i: "n0" for i in ids[1:]}
    assert all(kept[d["id"]] == 1 for d in distinct)
    assert counters.get("cc_not_converged", 0) == 0
    assert counters.get("buckets_over_verify_limit", 0) == 0
    kept, removed, counters = run_stage(docs + distinct, dataclasses.replace(cfg, verify_limit=1), tmp_path / "limited")
    assert counters["buckets_over_verify_limit"] > 0  # the step's setting reaches the stage that checks the buckets
    assert all(kept[d["id"]] == 1 for d in distinct) and set(removed) <= set(ids[1:])


# --------------------------------------------------------------------------- connected components

def union_find(edges: list[tuple[str, str]]) -> dict[str, str]:
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {x: find(x) for x in parent}


def random_graph(rng: random.Random) -> list[tuple[str, str]]:
    nodes = [f"id{rng.randrange(10**6):06d}" for _ in range(300)]
    path = [f"p{rng.randrange(10**6):06d}" for _ in range(64)]  # a long path, ids in random order
    edges = [(a, b) for a, b in zip(path, path[1:])]
    edges += [(rng.choice(nodes), rng.choice(nodes)) for _ in range(200)]
    return [(min(e), max(e)) for e in edges if e[0] != e[1]]


def test_large_star_small_star_converge_to_union_find():
    for seed in range(20):
        edges = set(random_graph(random.Random(seed)))
        expected = union_find(sorted(edges))
        stars = nd.star_edges(sorted(edges))  # what the rounds converge to, at once
        assert {b: a for a, b in stars if a < b} == {n: r for n, r in expected.items() if n != r}
        assert len(stars) == len(set(stars)) and {(b, a) for a, b in stars} == set(stars)
        for _ in range(20):
            neighbors: dict[str, set[str]] = {}
            for a, b in edges:
                neighbors.setdefault(a, set()).add(b)
                neighbors.setdefault(b, set()).add(a)
            large = {e for node, ns in neighbors.items() for e in nd.large_star(node, ns)[0]}
            smaller: dict[str, set[str]] = {}
            for a, b in large:
                smaller.setdefault(b, set()).add(a)
            edges = {e for node, ns in smaller.items() for e in nd.small_star(node, ns)[0]}
        assert {b: a for a, b in edges} == {n: r for n, r in expected.items() if n != r}


def test_beam_connected_components_and_convergence_counter(tmp_path):
    edges = random_graph(random.Random(7))
    expected = {n: r for n, r in union_find(edges).items() if n != r}
    for iterations, converged in ((20, True), (1, False), (0, False)):
        p = direct_pipeline()
        out = p | beam.Create(edges) | ConnectedComponents(iterations)
        for name, tag in (("parent", "main"), ("size", "size")):
            _ = (out[tag] | f"{name}/Json" >> beam.Map(json.dumps)
                 | f"{name}/Write" >> beam.io.WriteToText(str(tmp_path / f"{name}{iterations}")))
        result = p.run()
        result.wait_until_finish()
        parents, sizes = ({k: v for f in tmp_path.glob(f"{name}{iterations}-*")
                           for k, v in map(json.loads, f.read_text().splitlines())} for name in ("parent", "size"))
        unconverged = result.metrics().query(MetricsFilter().with_name("cc_not_converged"))["counters"]
        # one round (or none) is not enough for a 64-node path: the rest is joined in one worker, exactly
        assert parents == expected
        assert sizes == {r: 1 + list(expected.values()).count(r) for r in set(expected.values())}
        if converged:
            assert not unconverged or unconverged[0].committed == 0
        else:
            assert unconverged and unconverged[0].committed > 0


# --------------------------------------------------------------------------- determinism

def survivors(docs, cfg, work, *options):
    kept, removed, _ = run_stage(docs, cfg, work, *options)
    return sorted(kept.items()), sorted(removed.items())


@pytest.mark.slow
def test_same_survivors_across_runs_and_workers(planted, tmp_path):
    docs = planted[0][::3]
    cfg = NearDupConfig()
    first = survivors(docs, cfg, tmp_path / "a")
    assert len(first[1]) > 20
    assert survivors(list(reversed(docs)), cfg, tmp_path / "b") == first
    assert survivors(docs, cfg, tmp_path / "c", "--direct_num_workers=2",
                     "--direct_running_mode=multi_processing") == first


def test_documents_reach_the_join_through_the_scratch_folder_or_as_bytes(planted, tmp_path, monkeypatch):
    """With a scratch folder the documents go to files there and only where each lies moves; without
    room there they move as bytes; the join keeps and removes the same documents either way."""
    docs, cfg = planted[0][::5], NearDupConfig()
    plain = run_stage(docs, cfg, tmp_path / "bytes")
    for name, room in (("files", None), ("no room", 0)):
        if room is not None:
            monkeypatch.setattr(spill, "budget", lambda scratch: room)
        scratch = tmp_path / f"{name}-scratch"
        scratch.mkdir()
        assert run_stage(docs, cfg, tmp_path / name, scratch=str(scratch))[:2] == plain[:2]
        written = sum(p.stat().st_size for p in scratch.glob("*.pickles"))
        assert written > sum(len(d["text"]) for d in docs) if room is None else written == 0


def test_documents_go_to_the_join_in_chunks_by_partition_and_as_bytes_when_a_write_fails(originals, tmp_path):
    docs = [{"id": f"<urn:{i}>", "text": doc["text"]} for i, doc in enumerate(originals[:40])]
    fn = DocsByPartition(str(tmp_path), 3)
    fn.CHUNK_BYTES = sum(len(doc["text"]) for doc in docs) // 8  # a few documents a chunk
    fn.start_bundle()
    keyed = [pair for doc in docs[:20] for pair in fn.process(doc)]

    class Full:
        def tell(self) -> int:
            return 0

        def write(self, data: bytes) -> int:
            raise OSError(28, "No space left on device")

        def close(self) -> None:
            pass

    assert keyed and all(isinstance(ref, str) for _, ref in keyed)  # the first chunks: in the file
    fn.pickles.out.close()
    fn.pickles.out = Full()
    keyed += [pair for doc in docs[20:] for pair in fn.process(doc)] + [v.value for v in fn.finish_bundle()]
    reader = Unpickler()
    chunks = [(part, reader.load(ref)) for part, ref in keyed]
    assert len(chunks) < len(docs) and {part for part, _ in chunks} == {0, 1, 2}
    assert all(partition_of(doc_id, 3) == part for part, chunk in chunks for doc_id, _ in chunk)
    assert sorted((doc_id, doc["text"]) for _, chunk in chunks for doc_id, doc in chunk) == \
        sorted((d["id"], d["text"]) for d in docs)
    assert all(doc_id == doc["id"] for _, chunk in chunks for doc_id, doc in chunk)
    assert isinstance(keyed[-1][1], bytes)  # after the failed write: bytes
    reader.close()


def test_unpickler_keeps_few_files_open_and_none_in_a_copy(tmp_path):
    import copy

    first, second = ScratchPickles(str(tmp_path)), ScratchPickles(str(tmp_path))
    refs = first.put([pickle.dumps(i) for i in range(3)]) + second.put([pickle.dumps("x")])
    first.close(), second.close()
    assert len({ref.rpartition("@")[0] for ref in refs}) == 2
    reader = Unpickler()
    reader.OPEN_FILES = 1
    assert [reader.load(ref) for ref in refs + refs[:1]] == [0, 1, 2, "x", 0]
    assert len(reader.files) == 1 and copy.deepcopy(reader).files == {}
    reader.close()


# --------------------------------------------------------------------------- edge cases

def test_edge_case_shingles():
    for kind in ("word", "char"):
        _, docs = nd.shingle_hashes(["", " \n\t ", "!!! --- ...", "Wort", "zwei Wörter", "\ud800"], kind, 5)
        assert docs.tolist() == ([3, 4] if kind == "word" else [3, 4, 4, 4, 4, 4, 4])  # a lone surrogate: no crash
    sigs = nd.signatures(["", "Wort"], NearDupConfig())
    assert nd.is_empty(sigs).tolist() == [True, False]


def test_edge_cases_through_beam(originals, tmp_path):
    zh = next(d for d in originals if d["lang"] == "zh" and len(d["text"]) > 800)
    rng = random.Random(6)
    zh_variant = edit(zh["text"], 0.01, rng, chars=True)
    cfg = NearDupConfig(max_iterations=3)  # these graphs converge in one round
    # the character shingles see the near-duplicate; the space-separated "words" of zh do not
    by_char = nd.jaccard(*nd.signatures([zh["text"], zh_variant], cfg, "char"))
    by_word = nd.jaccard(*nd.signatures([zh["text"], zh_variant], cfg, "word"))
    assert by_char >= 0.85 > cfg.threshold > by_word
    docs = [
        {"id": "e1", "text": "", "lang": "de"},
        {"id": "e2", "text": "", "lang": "de"},          # two empty documents are not duplicates
        {"id": "p1", "text": "!!! --- ...", "lang": "de"},
        {"id": "w1", "text": "Hallo", "lang": "de"},
        {"id": "w2", "text": "hallo!", "lang": "de"},     # one word, same after normalization
        {"id": "w3", "text": "Tschüss", "lang": "de"},
        {"id": "s1", "text": "Guten Tag zusammen", "lang": "de"},   # shorter than 5 words
        {"id": "s2", "text": "guten  Tag\nzusammen.", "lang": "de"},
        {"id": "s3", "text": "Guten Tag allerseits", "lang": "de"},
        {"id": "s4", "text": "Guten Tag zusammen", "lang": "fr"},   # another language: another scope
        {"id": "z1", "text": zh["text"], "lang": "zh"},
        {"id": "z2", "text": zh_variant, "lang": "zh"},
    ]
    kept, removed, counters = run_stage(docs, cfg, tmp_path / "language")
    assert removed == {"w2": "w1", "s2": "s1", "z2": "z1"}
    assert kept == {"e1": 1, "e2": 1, "p1": 1, "w1": 2, "w3": 1, "s1": 2, "s3": 1, "s4": 1, "z1": 2}
    assert counters["no_shingles"] == 3
    kept, removed, counters = run_stage(docs, dataclasses.replace(cfg, scope="global"), tmp_path / "global",
                                        write_removed=False)
    assert removed == {} and counters["near_duplicate"] == 4  # counted, not written (write.removed off)
    assert kept == {"e1": 1, "e2": 1, "p1": 1, "w1": 2, "w3": 1, "s1": 3, "s3": 1, "z1": 2}


@pytest.mark.parametrize("sets, message", [
    (["near_dedup.threshold=1.0", "near_dedup.verify=false"], "does not use threshold, verify"),
    (["near_dedup.shingle=char"], "does not use shingle"),
    (["near_dedup.bands=65536", "near_dedup.rows=1"], "bands must be <= 65535"),
])
def test_near_dup_settings_that_would_do_nothing_are_refused(sets, message):
    """FineWeb-2's scheme ran with threshold 1.0, verification or character shingles set and took
    none of them; a band number past 16 bits wrapped to band 0 (merging two bands' buckets)."""
    from pipeline.config import load_config
    from pipeline.util.errors import UserError

    with pytest.raises(UserError, match=message):
        load_config(str(Path(__file__).resolve().parents[1] / "configs" / "corpus" / "fineweb2.yaml"), {"input": ["x.warc.wet.gz"], "output": "out"}, sets)


def test_global_scope_picks_the_shingle_kind_from_the_text():
    """Under ``scope: global`` (documents of every language compared together), ``shingle: auto``
    took each document's kind from its label: before LID (no label) Chinese got word shingles (a
    clause a word) and two near-copies labelled zh and ko got different kinds, and so never met."""
    zh = "香港係一個國際金融中心亦都係全球最繁忙嘅港口之一。佢嘅經濟以服務業為主包括金融貿易物流同埋旅遊業。" * 3
    assert nd.shingle_kind(None, "auto") == "word" and nd.shingle_kind("zh", "auto") == "char"
    assert {nd.shingle_kind(lang, "auto", zh) for lang in (None, "zh", "ko", "en")} == {"char"}
    assert nd.shingle_kind("zh", "auto", "Hello world, a page in English 香港.") == "word"
    assert nd.shingle_kind("en", "word", zh) == "word"
