"""Counts that travel as data: every counting DoFn emits its counts per bundle on a ``counts``
output, and one combine sums them into stats.json.

Beam metrics are not reported the same way by every runner (Dask reports none, Dataflow
attempted vs committed), but every runner commits a bundle's outputs exactly once, retries
included: counts as elements are exact everywhere. They also go to Beam's counters, for the
live view a runner's UI gives.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from ..output.stores import take_retries
from ..report.stats import IO_STEP, Counts

COUNTS = "counts"
MAIN = "main"


class CountingDoFn(beam.DoFn):
    """A DoFn whose ``count(name)`` calls reach stats.json; apply it with :class:`Counted`.

    Counts are summed in a dict and leave once per bundle, as one ``counts`` element and as
    Beam counter increments.
    """

    def __init__(self, step: str) -> None:
        super().__init__()
        self.step = step
        self.declared = False  # set by Counted: a runner may drop an undeclared output silently
        self._pending: Counter[tuple[str, str]] = Counter()

    def count(self, name: str, n: int = 1, step: str | None = None) -> None:
        self._pending[(step or self.step, name)] += n

    def start_bundle(self) -> None:
        self._pending.clear()

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if not self.declared:
            raise TypeError(f"{type(self).__name__} was applied without Counted: its counts would be lost")
        retried = take_retries()  # this process's S3 retries since the last bundle that counted them
        if retried:
            self._pending[(IO_STEP, "s3_retries")] += retried
        pending = sorted(self._pending.items())
        self._pending.clear()
        for (step, name), n in pending:
            Metrics.counter(step, name).inc(n)
        if pending:  # batch pipelines: every element is in the global window
            yield beam.pvalue.TaggedOutput(COUNTS, GlobalWindows.windowed_value(pending))


class Counted(beam.PTransform):
    """``ParDo(fn)`` with its ``counts`` output declared: the main output, or with ``outputs``
    named, every output by tag (``result.main``, ``result[tag]``). ``main_type``: the main output's
    element type, where Beam cannot infer it from the DoFn (a ``process`` that yields from another
    call): a key typed ``Any`` that a later GroupByKey groups by reaches the runner as opaque bytes
    (its ``FastPrimitivesCoder`` encoding).

    The ``counts`` outputs are not returned: :func:`counts_of` finds them all in the graph.
    """

    def __init__(self, fn: CountingDoFn, *args: Any, outputs: tuple[str, ...] = (), main_type: Any = None) -> None:
        super().__init__()
        fn.declared = True
        self.fn, self.args, self.outputs, self.main_type = fn, args, outputs, main_type

    def expand(self, pcoll: beam.PCollection) -> Any:
        do = beam.ParDo(self.fn, *self.args)
        if self.main_type is not None:
            do = do.with_output_types(self.main_type)
        result = pcoll | do.with_outputs(COUNTS, *self.outputs, main=MAIN)
        return result if self.outputs else result[MAIN]


def counts_of(pipeline: beam.Pipeline) -> list[beam.PCollection]:
    """Every ``counts`` output in the graph built so far, in graph order."""
    found: list[beam.PCollection] = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node: beam.pipeline.AppliedPTransform) -> None:
            if COUNTS in node.outputs:
                found.append(node.outputs[COUNTS])

    pipeline.visit(Visitor())
    return found


class SumCounts(beam.CombineFn):
    """Per-bundle ``[((step, name), n), ...]`` -> :data:`Counts`."""

    def create_accumulator(self) -> Counter[tuple[str, str]]:
        return Counter()

    def add_input(self, acc: Counter[tuple[str, str]], pending: Iterable[tuple[tuple[str, str], int]]) -> Counter:
        for key, n in pending:
            acc[key] += n
        return acc

    def merge_accumulators(self, accs: Iterable[Counter[tuple[str, str]]]) -> Counter[tuple[str, str]]:
        merged: Counter[tuple[str, str]] = Counter()
        for acc in accs:
            merged.update(acc)
        return merged

    def extract_output(self, acc: Counter[tuple[str, str]]) -> Counts:
        counts: Counts = {}
        for (step, name), n in sorted(acc.items()):
            counts.setdefault(step, {})[name] = n
        return counts


def total_counts(pipeline: beam.Pipeline) -> beam.PCollection:
    """The one :data:`Counts` element of every count in the graph built so far; none where nothing
    was counted (no default: each run's read counts its files, and a default costs a stage)."""
    return (counts_of(pipeline) | "FlattenCounts" >> beam.Flatten(pipeline=pipeline)
            | "SumCounts" >> beam.CombineGlobally(SumCounts()).without_defaults())
