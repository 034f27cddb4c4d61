"""Exact paragraph dedup, CCNet style, as pure functions the Beam graph keys and groups.

Each paragraph (line) of a document is hashed with :func:`normalize.paragraph_hash`. The Beam
stage groups occurrences by hash across the whole run; a hash seen more than once is a
duplicate. Policies:

* ``drop_all`` (CCNet paper): every copy of a repeated paragraph is removed.
* ``keep_first``: the occurrence with the smallest ``(document id, line number)`` stays.

Documents left shorter than ``min_length`` characters are dropped.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from .documents import Document, Drop, StepResult
from .normalize import paragraph_hash

POLICIES = ("drop_all", "keep_first")
Occurrence = tuple[str, int]  # (document id, line number)


def doc_key(doc: Document) -> str:
    """Documents are joined back by WARC-Record-ID (unique in a crawl; repeats are rejected)."""
    return doc["id"]


def occurrences(doc: Document) -> Iterator[tuple[int, Occurrence]]:
    """``(hash, (document id, line number))`` for every paragraph of the document."""
    key = doc_key(doc)
    for i, line in enumerate(doc["text"].split("\n")):
        yield paragraph_hash(line), (key, i)


def duplicates(found: Iterable[Occurrence], policy: str) -> Iterator[Occurrence]:
    """The occurrences of one paragraph hash that must be removed under ``policy``."""
    found = list(found)
    if len(found) < 2:
        return
    keeper = min(found) if policy == "keep_first" else None
    for occ in found:
        if occ != keeper:
            yield occ


def remove_paragraphs(doc: Document, removed: Iterable[int], min_length: int) -> StepResult:
    """The document without the given line numbers, or a drop reason if too little is left."""
    drop = set(removed)
    if not drop:
        kept_text = doc["text"]
    else:
        kept_text = "\n".join(line for i, line in enumerate(doc["text"].split("\n")) if i not in drop)
    if not kept_text:
        return Drop("all_paragraphs_duplicated")
    if len(kept_text) < min_length:
        return Drop("too_short")
    return {**doc, "text": kept_text, "nlines": kept_text.count("\n") + 1, "length": len(kept_text)}
