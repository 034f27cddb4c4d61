"""Exact paragraph dedup: the hash tables, both policies on planted duplicates, through Beam too."""
from __future__ import annotations

import functools
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import gz, warc_record

from pipeline.config import ReadConfig
from pipeline.runners.options import direct_pipeline
from pipeline.steps.base import RunInfo
from pipeline.steps.dedup import DedupConfig, ParagraphDedup
from pipeline.transforms.dedup import ReadAndDedup
from pipeline.steps.dedup import Occurrences, duplicates, group_of, removal_index, remove_paragraphs
from pipeline.steps.base import Drop
from pipeline.steps.normalize import paragraph_hash

BOILER = "Ce site utilise des cookies. En savoir plus."
SHARED = "Pour ouvrir la boîte de dialogue, choisissez Format - Caractère."

# Two files, as (record id, paragraphs). Copies differ in case and digits, which normalization removes.
FILES = [
    [("a", ["Titre A", BOILER, "Paragraphe propre à A, assez long pour rester.", SHARED]),
     ("b", ["Titre B", "ce site utilise des cookies. en savoir plus.", "Texte de C numéro 7."])],
    [("c", ["Titre C", BOILER.upper(), "Texte de C numéro 2.", SHARED, "Texte de C numéro 2."]),
     ("d", ["Titre D", "Rien de commun.", "rien de commun."])],  # repeated inside one document only
]
EXPECTED = {
    "drop_all": {
        "a": "Titre A\nParagraphe propre à A, assez long pour rester.",
        "b": "Titre B",
        "c": "Titre C",
        "d": "Titre D\nRien de commun.",
    },
    "keep_first": {  # the first copy in (file order, position, line) stays
        "a": f"Titre A\n{BOILER}\nParagraphe propre à A, assez long pour rester.\n{SHARED}",
        "b": "Titre B\nTexte de C numéro 7.",
        "c": "Titre C",
        "d": "Titre D\nRien de commun.",
    },
}


GROUPS_OF_ONE_FILE = {  # drop_all with a dedup group per file: only copies inside each file count
    "a": f"Titre A\nParagraphe propre à A, assez long pour rester.\n{SHARED}",
    "b": "Titre B\nTexte de C numéro 7.",
    "c": f"Titre C\n{BOILER.upper()}\nTexte de C numéro 2.\n{SHARED}",
    "d": "Titre D\nRien de commun.",
}


def docs_of(file: list) -> list[dict]:
    return [{"id": i, "text": "\n".join(lines), "nlines": len(lines)} for i, lines in file]


def write_wet(root: Path) -> list[str]:
    paths = []
    for n, file in enumerate(FILES):
        path = root / f"f{n}.warc.wet.gz"
        path.write_bytes(b"".join(gz(warc_record("\n".join(lines).encode(), record_id=i, uri=f"https://x.org/{i}", title=None))
                                  for i, lines in file))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("policy", ["drop_all", "keep_first"])
@pytest.mark.parametrize("partitions", [1, 3, 64])
def test_planted_duplicates_removed_exactly(policy, partitions):
    tables = [Occurrences.of(docs_of(file)) for file in FILES]
    removed: dict[int, list] = {}
    for p in range(partitions):
        part = [(f, t) for f, table in enumerate(tables) for q, t in table.partitions(partitions) if q == p]
        for f, found in duplicates(part, policy).items():
            removed.setdefault(f, []).append(found)
    got = {}
    for f, file in enumerate(FILES):
        index = removal_index(removed.get(f, []))
        for ordinal, doc in enumerate(docs_of(file)):
            got[doc["id"]] = remove_paragraphs(doc, index.get(ordinal, ()), 0)["text"]
    assert got == EXPECTED[policy]


@pytest.mark.parametrize("policy", ["drop_all", "keep_first"])
def test_duplicates_are_those_of_a_sort_by_hash_then_position(policy):
    """Random tables (few hashes, so many copies; files in any order, one file's rows split over two
    tables, one table out of position order): the removals are those of the plain definition, a
    sort by (hash, file, document, line) whose first row of each hash is the keeper."""
    rng = np.random.default_rng(7)
    tables = []
    for f in rng.permutation(6):
        n = int(rng.integers(0, 400))
        positions = np.sort(rng.choice(40 * 30, n, replace=False))  # (document, line), each once
        docs, lines = (positions // 30).astype(np.uint32), (positions % 30).astype(np.uint32)
        table = Occurrences(rng.integers(0, 500, n).astype(np.uint64), docs, lines)
        if f == 2:  # in two pieces, the second first
            tables += [(int(f), Occurrences(*(a[n // 2:] for a in table))),
                       (int(f), Occurrences(*(a[:n // 2] for a in table)))]
        elif f == 0:  # rows out of position order
            tables.append((int(f), Occurrences(*(a[::-1].copy() for a in table))))
        else:
            tables.append((int(f), table))
    hashes = np.concatenate([t.hashes for _, t in tables])
    files = np.concatenate([np.full(len(t.hashes), f) for f, t in tables])
    docs, lines = (np.concatenate([getattr(t, name) for _, t in tables]) for name in ("docs", "lines"))
    expected: dict[int, set] = {}
    first_of_hash, docs_of_hash, seen = {}, {}, set()
    rows = sorted(zip(hashes.tolist(), files.tolist(), docs.tolist(), lines.tolist()))
    for h, f, d, _ in rows:
        docs_of_hash.setdefault(h, set()).add((f, d))
    for h, f, d, line in rows:
        again_in_doc = (h, f, d) in seen
        seen.add((h, f, d))
        first = first_of_hash.setdefault(h, (f, d, line)) == (f, d, line)
        dropped_copy = again_in_doc or len(docs_of_hash[h]) > 1
        if (policy == "keep_first" and not first) or (policy == "drop_all" and dropped_copy):
            expected.setdefault(f, set()).add((d, line))
    got = {f: set(zip(d.tolist(), line.tolist())) for f, (d, line) in duplicates(tables, policy).items()}
    assert got == expected and sum(map(len, got.values())) > 100


def test_occurrence_tables():
    table = Occurrences.of(docs_of(FILES[0][:2]))
    assert table.hashes.dtype == np.uint64 and len(table.hashes) == 7
    assert table.docs.tolist() == [0, 0, 0, 0, 1, 1, 1] and table.lines.tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert int(table.hashes[1]) == paragraph_hash(BOILER) == int(table.hashes[5])
    parts = dict(table.partitions(4))
    assert sum(len(t.hashes) for t in parts.values()) == 7
    assert all(int(h) % 4 == p for p, t in parts.items() for h in t.hashes)
    assert duplicates([], "drop_all") == {}


def test_remove_paragraphs_results():
    doc = docs_of(FILES[0])[0]
    kept = remove_paragraphs(doc, [1, 3], min_length=0)
    assert kept["text"] == "Titre A\nParagraphe propre à A, assez long pour rester."
    assert (kept["nlines"], kept["length"], kept["line_ids"]) == (2, len(kept["text"]), [0, 2])
    assert remove_paragraphs(doc, (), 0)["line_ids"] == [0, 1, 2, 3]
    assert remove_paragraphs(doc, [0, 1, 2, 3], 0) == Drop("all_paragraphs_duplicated")
    assert remove_paragraphs(doc, [1, 2, 3], 100) == Drop("too_short")


def test_removal_index_merges_partitions_into_ascending_lines_per_document():
    u32 = functools.partial(np.array, dtype=np.uint32)
    parts = [(u32([2, 0, 2]), u32([5, 1, 0])), (u32([]), u32([])), (u32([0, 7, 2]), u32([0, 4_000_000_000, 5]))]
    assert removal_index(parts) == {0: [0, 1], 2: [0, 5], 7: [4_000_000_000]}
    assert removal_index([]) == removal_index([(u32([]), u32([]))]) == {}


def test_groups_are_runs_of_consecutive_files_as_ccnet_cuts_a_dump():
    """CCNet: shard s holds segments s*n//1600 .. (s+1)*n//1600; a group is 50 shards: a dump's
    files / 32 per group, whatever part of it a run reads."""
    for n in (64000, 63999, 90000, 100, 5):
        shard_starts = [s * n // 1600 for s in range(1600)]
        for i in range(0, n, max(1, n // 997)):
            shard = max(s for s, start in enumerate(shard_starts) if start <= i)
            assert group_of(i, n / 32) == shard // 50, (n, i)
    assert [group_of(i, 2) for i in range(4)] == [0, 0, 1, 1]
    assert [group_of(i, 2000) for i in (0, 2, 1999, 2000)] == [0, 0, 0, 1]  # 3 files: one group, as in CCNet
    assert [group_of(i, 0) for i in range(3)] == [0, 0, 0]


@pytest.mark.parametrize("policy, group_files", [("drop_all", 0), ("keep_first", 2000), ("drop_all", 1)])
def test_beam_two_pass_dedup_on_wet_files(policy, group_files, tmp_path):
    paths = write_wet(tmp_path)
    wanted = EXPECTED[policy] if group_files != 1 else GROUPS_OF_ONE_FILE
    expected = [(k, v) for k, v in wanted.items() if len(v) >= 10]
    with direct_pipeline() as p:
        files = p | beam.Create(list(enumerate(paths)))
        step = ParagraphDedup(DedupConfig(policy=policy, min_length=10, group_files=group_files), RunInfo(len(paths)))
        out = files | ReadAndDedup(step, ReadConfig(title=False), step.run)
        assert_that(out.main | beam.Map(lambda d: (d["id"], d["text"])), equal_to(expected))


def test_occurrences_reach_find_duplicates_through_the_scratch_folder(tmp_path):
    """With a scratch folder (the DirectRunner's) HashFile's tables wait in files there and only
    where each lies goes to FindDuplicates: the same documents as with the tables themselves."""
    paths = write_wet(tmp_path)
    expected = [(k, v) for k, v in EXPECTED["drop_all"].items() if len(v) >= 10]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with direct_pipeline() as p:
        files = p | beam.Create(list(enumerate(paths)))
        step = ParagraphDedup(DedupConfig(policy="drop_all", min_length=10), RunInfo(len(paths), scratch=str(scratch)))
        out = files | ReadAndDedup(step, ReadConfig(title=False), step.run)
        assert_that(out.main | beam.Map(lambda d: (d["id"], d["text"])), equal_to(expected))
    assert sum(path.stat().st_size for path in scratch.glob("*.pickles")) > 0
