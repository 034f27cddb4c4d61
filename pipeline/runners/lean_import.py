"""Beam imported without the cloud clients a run on this machine's files never uses.

``import apache_beam`` imports, besides Beam, every optional client it finds installed: Google
Cloud Storage's and S3's file systems (``google.cloud.storage``, ``boto3``), BigQuery's and
Pub/Sub's IO, Dataflow's API client. Installed here for ``gs://`` and ``s3://`` paths and
Dataflow, they took 0.3-0.4 s of the 1.0-1.4 s of the import (5 alternated rounds, BENCHMARKS.md),
in the driver and again in the fork server the SDK workers come from, both before the first
bundle. Beam imports each of them inside a ``try`` and goes on without it where it is missing
(:data:`LEFT_OUT`, checked against the installed Beam by the tests).

:func:`install` leaves them out of Beam's own import in ``python -m pipeline run`` where the run
is on the DirectRunner and its config names no URL at all (no ``scheme://`` anywhere: inputs,
output, models, lists, Beam options: :func:`wanted`), and ``prefork.start_for_run`` in its fork
server. Only while ``apache_beam`` itself is being imported: anything that imports one of them
later gets it as usual, though ``beam.io`` then lacks the names Beam's ``io/__init__.py`` imports
after BigQuery (Pub/Sub, ``gcsio``, the cross-language IOs): runs with a plugin step are not lean.
"""
from __future__ import annotations

import importlib.abc
import json
import os
import sys
from typing import Any, Iterable, Sequence

LEFT_OUT = ("apache_beam.io.gcp.gcsfilesystem", "apache_beam.io.aws.s3filesystem", "apache_beam.io.gcp.bigquery",
            "google.cloud.dataflow")
"""Modules Beam's own import takes where they import and skips where they raise ModuleNotFoundError:
``io/filesystems.py`` (the two file systems), ``io/__init__.py`` (BigQuery, and after it in the same
``try`` Pub/Sub, ``gcsio`` and the cross-language IOs), ``runners/dataflow/dataflow_runner.py``."""
ENV = "POLYGLOT_LEAN_BEAM"
"""1 in the environment the fork server starts with (and nowhere else): importing this module
first, it leaves them out too."""


class _LeaveOut(importlib.abc.MetaPathFinder):
    """Refuses the modules of :data:`LEFT_OUT` while ``apache_beam`` is being imported."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        beam = sys.modules.get("apache_beam")
        if name in LEFT_OUT and getattr(getattr(beam, "__spec__", None), "_initializing", False):
            raise ModuleNotFoundError(f"{name}: left out of Beam's import (no URL in this run's config)", name=name)
        return None


def wanted(config: Sequence[Any], step_modules: Iterable[str]) -> bool:
    """Whether this process may leave them out of a run of ``config`` on the DirectRunner: it is
    ``python -m pipeline`` (one run, then it ends: no later run of it can want them), ``config``
    (its values, as JSON) holds no ``://``, and every step is one of ours (``step_modules``: a
    plugin's code may name a bucket, or use ``beam.io``'s BigQuery or Pub/Sub, which Beam's
    ``io/__init__.py`` then never exported)."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (getattr(main, "name", "") == "pipeline.__main__" and "://" not in json.dumps(config, default=str)
            and all(module.startswith("pipeline.steps.") for module in step_modules))


def install() -> None:
    """Leave them out of Beam's import in this process (before it imports Beam), once."""
    if not any(isinstance(finder, _LeaveOut) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LeaveOut())


if os.environ.pop(ENV, None) == "1":  # the fork server of a run that leaves them out (prefork.start_for_run);
    install()                          # the SDK workers forked from it do not inherit the variable
