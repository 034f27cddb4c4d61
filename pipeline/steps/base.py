"""The step contract, and the types every step shares.

A **step** is a subclass of :class:`Step` in a module of ``pipeline/steps/`` (found there by
name, see ``pipeline.steps.registry``) or in any importable module named by its dotted path in a
profile's ``steps:`` list. It declares:

- ``name``: its name in ``steps:``, its config section and its counters' group in stats.json;
- ``Config``: the dataclass of its config section (field docstrings are ``pipeline run --help``);
- ``counters``: every counter it can emit, drop reasons included (``reason/<lang>`` breakdowns of
  a declared name are allowed);
- ``provides`` / ``requires(cfg)``: the document fields it sets / needs from an earlier step
  (``lang`` from ``lid``): the config loader refuses an order that breaks them;
- ``active(cfg)`` (optional): whether it does anything with its config (perplexity without models
  does not, and is left out of the graph); ``inactive_error(cfg)`` says why a config on which it
  is not active is refused instead (url_filter without lists);
- ``splits_words(cfg)`` (optional): whether it splits documents into words with ``steps.words``;
- ``worker_modules``: the third-party modules it imports lazily (in ``setup()`` or on its first
  document, to keep the command line fast); the DirectRunner's fork server imports them once,
  while the driver prepares, rather than every worker after it starts;
- ``order_key`` (optional): a sort key for the documents of each chunk the runner hands it (LID
  takes them grouped by script, which keeps fastText's tables in the CPU caches), and
  ``chunk_docs``: how many documents a chunk holds (:data:`CHUNK_DOCS` unless the step says).

Its life: ``__init__(cfg, run)`` keeps the config (cheap, no I/O); ``prepare()`` runs once on the
driver before any work (check model files, read a cutoff table: a mistake is one
:class:`UserError` line; then every language its config names, ``languages_named()``, is checked
against ``lang_labels()`` of the step that sets ``lang``); the object is then pickled to every
worker, where ``setup()`` loads models once; ``__call__(doc)`` returns the document (possibly
changed) or a :class:`Drop` with its reason. The runner hands it documents a chunk at a time
through ``apply_chunk(docs)``, which calls it per document unless the step overrides it to do the
chunk at once (same results, in order). The runner counts drops (``reason`` and
``reason/<lang>``) and kept documents (``documents_out``) and, with ``write.removed``, writes each
dropped document with its reason to ``removed/<step>/``.

A **global step** (exact dedup, near-dup) needs every document at once: it sets ``transform`` to
``"module:Class"`` of its Beam composite instead of implementing ``__call__``; the composite is
built as ``Class(step, run)`` (``step``: the built step, prepared; ``run``: the :class:`RunInfo` of
the run being built, its scratch folder included), takes the PCollection of documents and returns
a dict of PCollections (or a ParDo's tagged outputs) with its kept documents under ``main`` and
removed records (the document with its ``reason``, ``transforms.apply.removed_record``) under
``removed``. ``reads_files`` marks the one step that works on the input files themselves (exact
paragraph dedup, CCNet's two passes); it must come first, and its composite is built as
``Class(step, read, run)`` (``read``: the run's ``read:`` section, a ``config.ReadConfig``), takes
the PCollection of ``(index, path)`` of the input files and returns ``main`` (the documents),
``rejected`` (a :class:`Rejected` per record that could not become a document) and ``removed``
(``transforms.dedup.ReadAndDedup`` does all three). A composite built or returning otherwise is one
:class:`UserError` line naming the step's class as the graph is built.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable, ClassVar, Iterable, Union

CHUNK_DOCS = 256
"""Documents a step takes in a row by default (the runner's chunks; the reader's too)."""

Document = dict[str, Any]
"""One corpus row (DESIGN.md: id, url, date, digest, source, text, lang, ...)."""


@dataclasses.dataclass(frozen=True)
class Drop:
    """A step's verdict that a document leaves the corpus, and why (a declared counter name)."""

    reason: str
    lang: str | None = dataclasses.field(default=None, compare=False)
    """The language its ``reason/<lang>`` count goes to, when not the document's (LID's best guess)."""


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


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a step may know of the run it is part of (set by the driver)."""

    n_files: int = 0
    """Input files, in path order."""
    write_removed: bool = False
    """``write.removed``: dropped documents go to ``removed/<step>/``."""
    progress: bool = False
    """Print a line per input file as it is read."""
    scratch: str = ""
    """A folder on the driver's machine for the run's temporary files, where every worker runs on
    that machine (the DirectRunner); empty elsewhere."""


class Step:
    """Base of every pipeline step (see the module docstring for the contract)."""

    name: ClassVar[str]
    Config: ClassVar[type]
    counters: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[tuple[str, ...]] = ()
    """Document fields it sets (a later step's ``requires`` names them)."""
    transform: ClassVar[str | None] = None
    reads_files: ClassVar[bool] = False
    worker_modules: ClassVar[tuple[str, ...]] = ()
    """Modules its workers import lazily (the fork server imports them before forking workers)."""
    order_key: ClassVar[Callable[[Document], Any] | None] = None
    """Optional: the order in which the runner hands it each chunk of documents (``sorted`` by this
    key, stable), for a step whose cost depends on which documents came just before (what it left
    in the CPU caches). Only the order of work changes: every output is sorted or summed."""
    chunk_docs: ClassVar[int] = CHUNK_DOCS
    """Documents per chunk (the rest of a bundle at its end): larger for a step with an
    ``order_key``, whose runs of alike documents grow with it."""

    def __init__(self, cfg: Any, run: RunInfo) -> None:
        self.cfg, self.run = cfg, run
        self._counts: Counter[str] = Counter()

    @classmethod
    def active(cls, cfg: Any) -> bool:
        """Whether the step does anything with this config (a perplexity step without models does not)."""
        return True

    @classmethod
    def inactive_error(cls, cfg: Any) -> str:
        """For a config on which it is not ``active``: why naming it in ``steps:`` is an error (it
        would be left out silently), or "" where leaving it out is what that config means."""
        return ""

    @classmethod
    def splits_words(cls, cfg: Any) -> bool:
        """Whether it splits documents into words with ``steps.words`` (stats.json's ``versions``
        then has the word tokenizers of the languages it saw)."""
        return False

    @classmethod
    def requires(cls, cfg: Any) -> tuple[str, ...]:
        """Document fields an earlier step must set (``lang``: after ``lid``)."""
        return ()

    def store_paths(self) -> dict[str, str]:
        """``{config key: path}`` of the files it reads, checked on their store before any work."""
        return {}

    def prepare(self) -> None:
        """Driver side, once, before any work: check model files, read small tables (a mistake is
        one :class:`UserError` line). What it sets travels to the workers with the step."""

    def lang_labels(self) -> frozenset[str] | None:
        """For a step that sets ``lang``: every value it can give it, known after ``prepare()``
        (LID: its model's labels); None where it cannot tell."""
        return None

    def languages_named(self) -> dict[str, Iterable[str]]:
        """``{config key: the languages it names}`` (per-language values, language lists): after
        ``prepare()``, each is checked against the ``lang_labels()`` of the step that sets ``lang``
        before this one (or this one itself), so that a code it never gives (``eng`` for lid.176's
        ``en``) is an error rather than a value that silently never applies."""
        return {}

    def setup(self) -> None:
        """Load models: once per worker process, before the first document."""

    def __call__(self, doc: Document) -> StepResult:
        raise NotImplementedError(f"step {self.name} is global: its transform {self.transform} runs it")

    def apply_chunk(self, docs: list[Document]) -> list[StepResult]:
        """The step over one chunk, a result per document in order: each document's ``__call__``,
        unless a step does a chunk at once faster with the same results (LID: one fastText call)."""
        return [self(doc) for doc in docs]

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (declared in ``counters``, or ``<declared>/<detail>``)."""
        if name.split("/", 1)[0] not in self.counters:
            raise ValueError(f"step {self.name} counts {name!r}, which it does not declare in `counters`")
        self._counts[name] += n

    def take_counts(self) -> Counter[str]:
        """The counts since the last call (the runner sends them to stats.json)."""
        counts, self._counts = self._counts, Counter()
        return counts


def graph_label(name: str) -> str:
    """A step's label in the Beam graph: its name in CamelCase (``near_dedup``: ``NearDedup``)."""
    return "".join(part.title() for part in name.split("_"))
