"""The base of every counting DoFn: drop reasons and events become Beam counters."""
from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics


class CountingDoFn(beam.DoFn):
    """A DoFn with cached ``Metrics.counter(step, name)`` counters; they end up in stats.json."""

    def __init__(self, step: str) -> None:
        super().__init__()
        self.step = step
        self._counters: dict[tuple[str, str], Any] = {}

    def count(self, name: str, n: int = 1, step: str | None = None) -> None:
        key = (step or self.step, name)
        if key not in self._counters:
            self._counters[key] = Metrics.counter(*key)
        self._counters[key].inc(n)
