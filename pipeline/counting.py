"""The base of every counting DoFn: drop reasons and events become Beam counters."""
from __future__ import annotations

from collections import Counter

import apache_beam as beam
from apache_beam.metrics import Metrics


class CountingDoFn(beam.DoFn):
    """A DoFn whose ``count(name)`` calls end up as ``Metrics.counter(step, name)`` in stats.json.

    Counts are summed in a dict and reach Beam's counters once per bundle (a Beam counter update
    costs about ten dict updates, and the read step counts several events per document); Beam
    commits counters per bundle anyway, so a retried bundle is counted once either way.
    """

    def __init__(self, step: str) -> None:
        super().__init__()
        self.step = step
        self._pending: Counter[tuple[str, str]] = Counter()

    def count(self, name: str, n: int = 1, step: str | None = None) -> None:
        self._pending[(step or self.step, name)] += n

    def start_bundle(self) -> None:
        self._pending.clear()

    def finish_bundle(self) -> None:
        for (step, name), n in sorted(self._pending.items()):
            Metrics.counter(step, name).inc(n)
        self._pending.clear()
