"""The types every step shares: a corpus document, a drop reason, a note and a rejected record."""
from __future__ import annotations

import dataclasses
from typing import Any, Union

Document = dict[str, Any]
"""One corpus row (DESIGN.md: id, url, date, digest, source, text, lang, ...)."""


@dataclasses.dataclass(frozen=True)
class Drop:
    """A step's verdict that a document leaves the corpus, and why (a counter name)."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Note:
    """Something that happened to a record that is kept (counted under its reason), e.g. an HTTP
    body whose chunked encoding is broken, extracted as it is."""

    reason: str


StepResult = Union[Document, Drop]


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A record that could not become a document: routed to ``<out>/rejected/``."""

    source: str
    offset: int
    reason: str
    detail: str
    record_id: str = ""
    raw: str = ""
    """The start of the record (headers), decoded with replacement, for a human to inspect."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
