"""CCNet-style multilingual corpus pipeline on Apache Beam.

Importing the package makes glibc's malloc Arrow's default memory pool (``ARROW_DEFAULT_MEMORY_POOL=
system``) for this process and those it starts (the fork server, its workers, a Dask cluster's),
unless the variable is set (not empty) already; Arrow reads it once, so it holds where pyarrow (or
Beam, which imports it) is not imported yet. Arrow's own default, mimalloc, maps its memory with
transparent huge pages and hands it back to the system within milliseconds of a free, so each table
a worker builds zeroes fresh 2 MB pages, slowly on a virtual machine: with glibc, `[dedup, lid]` at
2 workers took 0.87x the time in 6 of 6 alternated pairs, the graph's table building 0.5-0.7 s of
worker time against 0.6-1.3 s (spikes to 2.3 s), with less system time and worker peaks 60-70 MB
lower (BENCHMARKS.md, 2026-12-02).
"""
import os

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
if not os.environ.get(ARROW_POOL_ENV):  # (empty: unset, as Arrow reads it)
    os.environ[ARROW_POOL_ENV] = "system"
