"""A file's stages on one worker: the GroupByKeys keyed by input file index are annotated
:data:`BY_FILE`, and a runner that honours it (the DirectRunner's FnApiRunner with the overrides of
``runners.forkserver``) runs the stage that reads such a GroupByKey's key ``i`` on worker ``i % n``
of its ``n``. Exact dedup's two passes over file ``i`` then run in one process, which keeps what the
first read in its memory for the second (``readers.spill``) rather than writing it to the disk for
whichever worker reads it next. Other runners ignore the annotation; where a file's passes meet on
different workers all the same, the second parses the file again: the same documents either way."""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import apache_beam as beam

BY_FILE = "polyglot_by_file"
"""The annotation of a GroupByKey whose keys are input file indexes (ints from 0)."""


@contextlib.contextmanager
def by_file(pipeline: beam.Pipeline) -> Iterator[None]:
    """The transforms applied inside (the GroupByKeys among them) annotated :data:`BY_FILE`."""
    with pipeline.transform_annotations(**{BY_FILE: "1"}):
        yield


def _pairs(item: tuple[int, Iterable[str]]) -> Iterator[tuple[int, str]]:
    index, paths = item
    for path in paths:
        yield index, path


class Distribute(beam.Reshuffle):
    """A Reshuffle of ``(file index, path)`` pairs keyed by their index rather than a random key, so
    that the runner may place each file by it (:data:`BY_FILE`; the index an int to the runner, not
    pickled bytes). Runners that replace a Reshuffle with their own (Dataflow's, the DaskRunner's
    pass-through) do so with this one too."""

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        with by_file(pcoll.pipeline):
            grouped = pcoll | "ByFile" >> beam.GroupByKey().with_input_types(tuple[int, str])
        return grouped | "Pairs" >> beam.FlatMap(_pairs).with_output_types(tuple[int, str])
