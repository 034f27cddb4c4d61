"""Exact paragraph dedup: pure functions and the Beam transform, both policies, planted duplicates."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from pipeline.beam_pipeline import ExactDedup
from pipeline.config import DedupConfig
from pipeline.dedup import duplicates, occurrences, remove_paragraphs
from pipeline.documents import Drop

BOILER = "Ce site utilise des cookies. En savoir plus."
SHARED = "Pour ouvrir la boîte de dialogue, choisissez Format - Caractère."


def doc(i: str, *lines: str) -> dict:
    return {"id": i, "source": "s.wet.gz", "text": "\n".join(lines), "url": f"https://x.org/{i}"}


DOCS = [
    doc("a", "Titre A", BOILER, "Paragraphe propre à A, assez long pour rester.", SHARED),
    doc("b", "Titre B", "ce site utilise des cookies. en savoir plus.", "Texte de C numéro 7."),  # case and digits differ
    doc("c", "Titre C", BOILER.upper(), "Texte de C numéro 2.", SHARED, "Texte de C numéro 2."),  # digit + in-doc repeat
    doc("d", "Titre D", "Rien de commun."),
]


def run_dedup(policy: str, min_length: int = 0) -> None:
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        result = p | beam.Create(DOCS) | ExactDedup(DedupConfig(policy=policy, min_length=min_length))
        texts = result.docs | beam.Map(lambda d: (d["id"], d["text"]))
        assert_that(texts, equal_to(list(expected(policy, min_length).items())))


def expected(policy: str, min_length: int) -> dict[str, str]:
    if policy == "drop_all":
        texts = {
            "a": "Titre A\nParagraphe propre à A, assez long pour rester.",
            "b": "Titre B",  # "numéro 7" and "numéro 2" normalize alike: digits -> 0
            "c": "Titre C",
            "d": "Titre D\nRien de commun.",
        }
    else:
        texts = {
            "a": f"Titre A\n{BOILER}\nParagraphe propre à A, assez long pour rester.\n{SHARED}",
            "b": "Titre B\nTexte de C numéro 7.",
            "c": "Titre C",
            "d": "Titre D\nRien de commun.",
        }
    return {k: v for k, v in texts.items() if len(v) >= min_length}


@pytest.mark.parametrize("policy", ["drop_all", "keep_first"])
def test_beam_dedup_removes_exactly_the_planted_paragraphs(policy):
    run_dedup(policy)


def test_min_length_drops_short_documents():
    run_dedup("drop_all", min_length=20)


def test_keep_first_keeps_the_smallest_occurrence():
    found = [("b", 1), ("a", 3), ("a", 1)]
    assert sorted(duplicates(found, "keep_first")) == [("a", 3), ("b", 1)]
    assert sorted(duplicates(found, "drop_all")) == sorted(found)
    assert list(duplicates([("a", 0)], "drop_all")) == []


def test_occurrences_hash_normalized_lines():
    hashes = [h for h, _ in occurrences(DOCS[0])] + [h for h, _ in occurrences(DOCS[1])]
    assert hashes[1] == hashes[5]  # BOILER in a == lowercase copy in b
    assert [occ for _, occ in occurrences(DOCS[0])] == [("a", i) for i in range(4)]


def test_remove_paragraphs_results():
    d = DOCS[0]
    kept = remove_paragraphs(d, {1, 3}, min_length=0)
    assert kept["text"] == "Titre A\nParagraphe propre à A, assez long pour rester."
    assert (kept["nlines"], kept["length"]) == (2, len(kept["text"]))
    assert remove_paragraphs(d, {0, 1, 2, 3}, 0) == Drop("all_paragraphs_duplicated")
    assert remove_paragraphs(d, {1, 2, 3}, 100) == Drop("too_short")
