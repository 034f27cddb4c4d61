"""A stage's input handed to the FnApiRunner's workers as they free up, not split once among them.

Beam 2.77's ``ParallelBundleManager`` cuts a stage's input into one part per worker before the
stage starts, and the stage ends when the slowest worker's part does. On a shared host two cores
can differ in speed by 10-60 % for minutes at a time, and one file can cost more than another: in
2-worker runs of the floor benchmark the two workers' dedup passes ended 0.13-0.94 s apart, one
core idle meanwhile, of a 6-10 s run.

:func:`process_bundle` (``ParallelBundleManager.process_bundle``, installed with the other
overrides by ``forkserver.install``) cuts a grouped input into units instead (a key with all its
values) and runs one bundle after another on each worker, each taking the next units from a
shared queue when its last bundle ends: guided self-scheduling, a bundle taking
``ceil(remaining / (2 x workers))`` units, so that the first bundles are large (few bundles, long
runs for steps that work in chunks, such as LID) and the last ones small (the workers end
together, give or take one unit). Once a bundle of the stage took under :data:`LIGHT_S`, what is
left goes in one batch per worker: a stage of little work pays for two bundles a worker, not ten.
A stage whose input is not grouped (a Flatten's, a Create's), holds no more keys than there are
workers, has more than one input or timers to fire runs as Beam runs it.

What changes is only which worker takes which elements, and in how many bundles: the graph's
outputs do not depend on either (they are the same bytes on every runner and worker count, tested).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import execution, fn_runner
from apache_beam.utils import thread_pool_executor

LIGHT_S = 0.2
"""A bundle that took less than this marks its stage light (seconds)."""
BEAMS: Callable[..., Any] = fn_runner.ParallelBundleManager.process_bundle


class _OneWorker:
    """A stage's bundle context whose only worker is ``handler``: a ``BundleManager`` made with it
    runs its bundle there (Beam's picks a worker by a counter of bundles)."""

    def __init__(self, context: execution.BundleContextManager, handler: Any) -> None:
        self._context, self.worker_handlers = context, [handler]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def units(buffer: Any) -> list[bytes] | None:
    """A grouping buffer's keys, each with all its values, encoded (Beam's partition of it, a part
    per key), or None for another kind of buffer or one partitioned already."""
    if not isinstance(buffer, execution.GroupingBuffer) or buffer._grouped_output:
        return None
    keys = len(buffer._table)
    return [b"".join(part) for part in buffer.partition(keys)] if keys else []


class Queue:
    """The units of a stage's input, taken in batches of ``ceil(remaining / (2 x workers))``; once a
    bundle of the stage was light, what is left goes in one batch per worker."""

    def __init__(self, items: list[bytes], workers: int) -> None:
        self.items, self.workers = items, workers
        self.rest: list[list[bytes]] | None = None  # the last batches, once the stage is found light
        self.lock = threading.Lock()

    def take(self, light: bool = False) -> list[bytes]:
        with self.lock:
            if light and self.rest is None:
                self.rest = [batch for batch in (self.items[k::self.workers] for k in range(self.workers)) if batch]
                self.items = []
            if self.rest is not None:
                return self.rest.pop() if self.rest else []
            size = -(-len(self.items) // (2 * self.workers))
            batch, self.items = self.items[:size], self.items[size:]
            return batch


class _Parts:
    """Units already cut from a buffer, partitioned as Beam partitions a grouping buffer: part k
    takes every n-th unit from the k-th."""

    def __init__(self, items: list[bytes]) -> None:
        self.items = items

    def partition(self, n: int) -> list[list[bytes]]:
        return [self.items[k::n] for k in range(n)]


def process_bundle(self: fn_runner.ParallelBundleManager, inputs: Mapping[str, Any], expected_outputs: Any,
                   fired_timers: Mapping[Any, Any], expected_output_timers: Any,
                   dry_run: bool = False) -> tuple[beam_fn_api_pb2.InstructionResponse, list[Any]]:
    """``ParallelBundleManager.process_bundle``: the stage's one grouped input in units, each worker
    running bundles of them until none is left (see the module's docstring)."""
    found = units(next(iter(inputs.values()))) if len(inputs) == 1 and not fired_timers else None
    workers = self._num_workers
    if found is None or len(found) <= workers:
        if found is not None:  # cut into units already: a part per worker, as Beam's would be
            inputs = {name: _Parts(found) for name in inputs}
        return BEAMS(self, inputs, expected_outputs, fired_timers, expected_output_timers, dry_run)
    [name] = inputs
    queue = Queue(found, workers)
    context = self.bundle_context_manager

    def work(handler: Any) -> list[tuple[Any, list[Any]]]:
        done, light = [], False
        while batch := queue.take(light):
            manager = fn_runner.BundleManager(_OneWorker(context, handler), self._progress_frequency,
                                              cache_token_generator=self._cache_token_generator)
            start = time.perf_counter()
            done.append(manager.process_bundle({name: batch}, expected_outputs, {}, expected_output_timers, dry_run))
            light = time.perf_counter() - start < LIGHT_S
        return done

    with thread_pool_executor.shared_unbounded_instance() as executor:
        results = [result for part in executor.map(work, context.worker_handlers[:workers]) for result in part]
    merged: beam_fn_api_pb2.InstructionResponse | None = None
    splits: list[Any] = []
    for result, split in results:  # as Beam merges its parts' results
        splits += split
        merged = result if merged is None else beam_fn_api_pb2.InstructionResponse(
            process_bundle=beam_fn_api_pb2.ProcessBundleResponse(monitoring_infos=monitoring_infos.consolidate(
                [*result.process_bundle.monitoring_infos, *merged.process_bundle.monitoring_infos])),
            error=result.error or merged.error)
    assert merged is not None
    return merged, splits


def install() -> None:
    fn_runner.ParallelBundleManager.process_bundle = process_bundle
