"""A per-document step in Beam: :class:`ApplyStep` runs a :class:`~pipeline.steps.base.Step` over
documents, counts its drops and what it counted, and sends dropped documents to ``removed``."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from ..output import fs
from ..steps.base import Document, Drop, Step
from ..util.errors import StepFailed
from ..util.memory import OwnArena
from .counting import CountingDoFn

REMOVED = "removed"
"""The tagged output of what a step removed (written to ``removed/<step>/`` with ``write.removed``)."""


def removed_record(doc: Document, reason: str, **extra: Any) -> dict[str, Any]:
    """What ``removed/<step>/`` holds for a dropped document: the document as the step saw it, and why."""
    return {**doc, "reason": reason, **extra}


class ApplyStep(CountingDoFn):
    """Runs a per-document step; drops become counters (``reason`` and ``reason/<lang>``), kept
    documents ``documents_out``; the step's own counts are added once per chunk.

    Documents are taken ``step.chunk_docs`` at a time (the rest at the end of the bundle), so fused steps
    run a whole chunk each in a row instead of taking turns per document and evicting each
    other's working set from the CPU caches: parsing then fastText costs about 20 % less CPU
    this way, fastText then KenLM about 10 % less (measured on the benchmark's WET files). A step
    with an ``order_key`` takes each chunk in that order.

    The step's setup (its models loaded) and its chunks run in one thread of their own per worker
    (``util.memory.OwnArena``), so that what they allocate lies in another malloc arena than the
    documents the worker holds: fastText's model and buffers, SentencePiece's and KenLM's. On the
    benchmark, LID took 1.25x the time with its model among the held documents, and the perplexity
    step 13.4 s in the bundle's thread against 12.5 s in its own, the floor's time (BENCHMARKS.md,
    2026-11-30).
    """

    def __init__(self, step: Step) -> None:
        super().__init__(step.name)
        self.applied, self.chunk = step, step.chunk_docs
        self.write_removed = step.run.write_removed
        self.waiting: list[Document] = []
        self.arena: OwnArena | None = None

    def setup(self) -> None:
        self.arena = OwnArena(carry=[fs.WRITTEN])  # what a step writes itself is its task's too
        try:
            self.arena.run(self.applied.setup)
        except Exception as exc:
            raise StepFailed(f"step {self.applied.name}: setup() failed on a worker: {type(exc).__name__}: {exc}") from exc

    def teardown(self) -> None:
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    def start_bundle(self) -> None:
        super().start_bundle()
        self.waiting = []

    def process(self, doc: Document) -> Iterator[Any]:
        self.waiting.append(doc)
        if len(self.waiting) >= self.chunk:
            yield from self._run()

    def finish_bundle(self) -> Iterator[Any]:
        for out in self._run():  # batch pipelines: every document is in the global window
            if isinstance(out, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(out.tag, GlobalWindows.windowed_value(out.value))
            else:
                yield GlobalWindows.windowed_value(out)
        yield from super().finish_bundle()

    def _run(self) -> list[Any]:
        step, out = self.applied, []
        if step.order_key is not None:
            self.waiting.sort(key=step.order_key)
        assert self.arena is not None, "a DoFn runs after its setup"
        try:
            results = self.arena.run(_listed, step.apply_chunk, self.waiting)
        except Exception as exc:
            raise self._failure(exc)  # noqa: B904 (its cause: what the step raised on the document alone)
        if len(results) != len(self.waiting):
            raise StepFailed(f"step {step.name} gave {len(results)} results for {len(self.waiting)} documents "
                             "(apply_chunk gives one per document, in their order)")
        for doc, result in zip(self.waiting, results):
            if isinstance(result, Drop):
                if result.reason.split("/", 1)[0] not in step.counters:
                    raise StepFailed(f"step {step.name} dropped document {_named(doc)} for {result.reason!r}, which "
                                     "it does not declare in `counters`")
                self.count(result.reason)
                lang = result.lang or doc.get("lang")
                if lang:  # per language where there is one (the report's funnel)
                    self.count(f"{result.reason}/{lang}")
                if self.write_removed:
                    out.append(beam.pvalue.TaggedOutput(REMOVED, removed_record(doc, result.reason)))
            elif isinstance(result, dict):
                self.count("documents_out")
                out.append(result)
            else:
                raise StepFailed(f"step {step.name} gave {result!r:.80} for document {_named(doc)}: a step gives the "
                                 "document (a dict) or a Drop")
        for name, n in sorted(step.take_counts().items()):
            self.count(name, n)
        self.waiting = []
        return out

    def _failure(self, exc: Exception) -> StepFailed:
        """What a step raised on a chunk, put on the first document that it raises on alone."""
        assert self.arena is not None
        failure = None
        for doc in self.waiting:
            try:
                self.arena.run(_listed, self.applied.apply_chunk, [doc])
            except Exception as alone:  # noqa: BLE001 (the step's own error, named)
                exc, failure = alone, StepFailed(f"step {self.applied.name} failed on document {_named(doc)}: "
                                                 f"{type(alone).__name__}: {alone}")
                break
        failure = failure or StepFailed(f"step {self.applied.name} failed on a chunk of {len(self.waiting)} "
                                        f"documents, from {_named(self.waiting[0])} on: {type(exc).__name__}: {exc}")
        failure.__cause__ = exc  # (its traceback, with POLYGLOT_DEBUG=1)
        return failure


def _listed(apply_chunk: Callable[[list[Document]], Iterable[Any]], docs: list[Document]) -> list[Any]:
    """What ``apply_chunk`` gives, as a list (a step may give a generator)."""
    return list(apply_chunk(docs))


def _named(doc: Document) -> str:
    """A document as an error names it: its id and the file it came from."""
    return f"{doc.get('id')} of {doc.get('source')}"
