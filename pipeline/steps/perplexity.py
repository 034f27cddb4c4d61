"""The ``perplexity`` step: CCNet perplexity scoring and head/middle/tail buckets.

A document's perplexity is computed as CCNet's pipeline does: the whole text goes through
:func:`pipeline.steps.normalize.normalize` (which deletes newlines without a space, so the document
is one sequence), SentencePiece cuts it into pieces, KenLM scores the pieces joined by spaces
(with <s> and </s>) as one log10 probability, and pp = 10^(-score / (pieces + 1)), rounded to
0.1. ``per_line`` mode instead normalizes and scores every paragraph separately and divides the
summed log10 scores by the summed (pieces + 1): CCNet's DocLM over real lines, an empty one
(or one SentencePiece keeps nothing of) counted as ``<s> </s>`` with length 1, as DocLM counts it.

Buckets follow CCNet's ``cutoff.csv`` (PerplexityBucket): head if pp < the language's p<head> percentile (30),
middle if pp < p<tail> (60), else tail. A language without an LM gets ``all``; so does a
language with an LM but no column in the cutoff file (counted as ``no_cutoff``). A model that
fails to load is counted (``model_load_failed``) and its language treated as having no LM.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import logging
import math
import operator
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..output import fs
from ..output.layout import FORMATS, shard_files
from .base import Document, Drop, RunInfo, Step, StepResult
from ..util.errors import UserError, first_line
from .normalize import normalize

MODES = ("document", "per_line")
BUCKETS = ("head", "middle", "tail")
PERCENTILES = 100  # cutoff.csv rows: percentiles 0..99, as in CCNet's file
KENLM_MAGIC = b"mmap lm http://kheafield.com/code"
LOG = logging.getLogger(__name__)


def perplexity(log10_score: float, length: int) -> float:
    """CCNet's pp(): 10^(-score / length), rounded to 0.1."""
    return round(10.0 ** (-log10_score / length), 1)


def document_perplexity(text: str, sp: Any, lm: Any, mode: str = "document") -> float | None:
    """The document's perplexity as CCNet's ``DocLM`` gives it over the ``tokenized`` text (each
    line normalized, cut into pieces, the pieces joined by spaces, the lines by newlines): every
    line, an empty one too, adds its KenLM score (``<s> </s>`` alone for an empty one) and its pieces
    + 1. In ``document`` mode the whole text is one line. None where the tokenized text is empty (a
    text of one line SentencePiece keeps nothing of: zero-width spaces or byte-order marks alone),
    to which ``DocLM`` gives no perplexity (bucket ``all``)."""
    lines = [text] if mode == "document" else text.split("\n")
    tokenized = [" ".join(sp.encode(normalize(line), out_type=str)) for line in lines]
    if tokenized == [""]:
        return None
    return perplexity(sum(lm.score(line) for line in tokenized), sum(len(line.split()) + 1 for line in tokenized))


def model_paths(model_dir: str, lang: str) -> tuple[str, str]:
    return fs.join(model_dir, f"{lang}.sp.model"), fs.join(model_dir, f"{lang}.arpa.bin")


def available_languages(model_dir: str) -> list[str]:
    """Languages with both ``<lang>.sp.model`` and ``<lang>.arpa.bin`` in ``model_dir``."""
    if fs.is_local(model_dir) and not Path(model_dir).is_dir():
        raise UserError(f"perplexity.models {model_dir}: no such directory")
    lms = {Path(p).name.removesuffix(".arpa.bin") for p in fs.match_optional(model_dir, "*.arpa.bin")}
    sps = {Path(p).name.removesuffix(".sp.model") for p in fs.match_optional(model_dir, "*.sp.model")}
    for lang in sorted(lms ^ sps):
        have, missing = (".arpa.bin", ".sp.model") if lang in lms else (".sp.model", ".arpa.bin")
        LOG.warning("%s: %s%s without %s%s: no perplexity for %s", model_dir, lang, have, lang, missing, lang)
    if not lms | sps:  # on a bucket, a folder is only a prefix: one with nothing below it is this
        raise UserError(f"perplexity.models {model_dir}: no <lang>.sp.model or <lang>.arpa.bin in it")
    return sorted(lms & sps)


def check_models(model_dir: str, languages: list[str] | None) -> list[str]:
    """The languages to score, each with a readable SentencePiece model and a KenLM binary whose size
    matches its header (checked for local files; a model in a bucket is checked by the worker that
    copies it)."""
    import kenlm
    import sentencepiece as spm

    found = available_languages(model_dir)
    if languages:
        absent = sorted(set(languages) - set(found))
        if absent:
            raise UserError(f"perplexity.languages: no {absent[0]}.sp.model + {absent[0]}.arpa.bin in {model_dir}")
        found = sorted(languages)
    for lang in found:
        sp_path, lm_path = model_paths(model_dir, lang)
        with fs.open_read(lm_path) as f:
            if not f.read(len(KENLM_MAGIC)) == KENLM_MAGIC:
                raise UserError(f"{lm_path}: not a KenLM binary model (build it with build_binary)")
        if fs.is_local(lm_path):  # KenLM checks the size its header promises; a lazy load maps nothing
            config = kenlm.Config()
            config.load_method = kenlm.LoadMethod.LAZY
            try:
                kenlm.Model(lm_path, config)
            except OSError as exc:  # its message ends with the reason: "... Binary file has size N but ..."
                detail = str(exc).rsplit(". ", 1)[-1].rstrip(")")[:300]
                raise UserError(f"{lm_path}: KenLM cannot load it, the file is truncated or corrupt ({detail})") from None
        with fs.open_read(sp_path) as f:
            model = f.read()
        if not model:  # SentencePiece loads it as a model of no pieces
            raise UserError(f"{sp_path}: an empty file, not a SentencePiece model")
        try:
            spm.SentencePieceProcessor(model_proto=model)
        except RuntimeError as exc:
            raise UserError(f"{sp_path}: not a SentencePiece model ({first_line(exc)})") from None
    return found


def read_cutoffs(path: str) -> dict[str, list[float]]:
    """A ``cutoff.csv``: a header of languages, then one row per percentile from 0, in the file's
    column order. CCNet's layout (and ours) has percentiles 0..99; files with 0..100 (written by
    our releases before 2026-11) are read too. Every value is a finite number (:func:`cutoff_value`)
    and none is below the one before it in its column (a head cutoff above the tail one, say)."""
    try:
        with fs.open_read(path) as f:
            rows = [row for row in csv.reader(io.TextIOWrapper(f, encoding="utf-8")) if row]  # blank lines
            # skipped, as pandas (CCNet's reader) skips them
    except IsADirectoryError:
        raise UserError(f"perplexity.cutoffs {path}: a folder, not a file") from None
    except OSError:
        raise UserError(f"perplexity.cutoffs {path}: no such file") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: not a CSV text file ({exc})") from None
    if len(rows) - 1 not in (100, 101):
        raise UserError(f"{path}: expected a header and a row per percentile 0..100 (or 0..99), "
                        f"got {max(len(rows) - 1, 0)} rows")
    langs = rows[0][1:]
    for lang in langs:
        if not lang or langs.count(lang) > 1:
            raise UserError(f"{path}: line 1: " + (f"column {lang!r} given twice" if lang else "a column without a language"))
    cutoffs: dict[str, list[float]] = {lang: [] for lang in langs}
    for number, row in enumerate(rows[1:], 2):
        if len(row) != len(langs) + 1 or row[0] != str(number - 2):
            raise UserError(f"{path}: line {number}: expected percentile {number - 2} and {len(langs)} values")
        for lang, value in zip(langs, row[1:]):
            try:
                cutoff = cutoff_value(value)
            except ValueError as exc:
                raise UserError(f"{path}: line {number}: {value!r} for {lang} {exc}") from None
            if cutoffs[lang] and cutoff < cutoffs[lang][-1]:
                raise UserError(f"{path}: line {number}: {value!r} for {lang} is below percentile {number - 3}'s "
                                f"{exact(cutoffs[lang][-1])} (a percentile is never below the one before it)")
            cutoffs[lang].append(cutoff)
    return cutoffs


def not_a_cutoff_table(path: str) -> str | None:
    """Why the existing file ``path`` is not a cutoff table that ``pipeline cutoffs --out`` may
    replace, or None: by its shape alone (a header ``,<lang>,...``, then percentiles 0..99 or 0..100
    in the first column), whatever its values (an earlier one's ``nan``); an empty file is replaced."""
    with fs.open_read(path) as f:
        data = f.read()
    try:
        rows = [row for row in csv.reader(io.StringIO(data.decode("utf-8"))) if row]
    except (UnicodeDecodeError, csv.Error) as exc:
        return f"not a CSV text file ({exc})"
    percentiles = [row[0] for row in rows[1:]]
    if rows and (rows[0][:1] != [""] or percentiles not in ([str(p) for p in range(n)] for n in (100, 101))):
        return "not a cutoff table (a header ,<lang>,... and a row per percentile 0..99)"
    return None


def cutoff_value(text: str) -> float:
    """The perplexity a cutoff.csv cell holds; a ValueError says what is wrong with it. ``nan``,
    ``inf`` and ``1e400`` (read as pandas, CCNet's reader, reads them: no perplexity is below nan, all
    are below inf, and the buckets were wrong without a word) are refused, as is ``1_000`` (Python's
    float reads it; pandas keeps it as text, which CCNet's bucketing fails on), as are digits other than ASCII's."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or "_" in text or not text.isascii():  # ("١٥٠": 150.0 to Python, text to pandas)
        raise ValueError("is not a number")
    if not math.isfinite(value):
        raise ValueError("is not a finite perplexity")
    return value


def exact(value: float) -> str:
    """``value`` as CSV text that reads back to the same float: integers as CCNet writes them
    (``150``), other values in Python's shortest round-trip form (``123456.7``)."""
    return str(int(value)) if value.is_integer() else repr(value)


def write_cutoffs(cutoffs: Mapping[str, list[float]], path: str) -> None:
    """CCNet's layout: a header ``,<lang>,...`` (languages in the mapping's order), then one row per
    percentile 0..99, every value exact (:func:`exact`)."""
    langs = list(cutoffs)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["", *langs])
    for pct in range(PERCENTILES):
        writer.writerow([pct, *(exact(cutoffs[lang][pct]) for lang in langs)])
    fs.write_atomic(path, lambda stream: stream.write(out.getvalue().encode("utf-8")))


def bucket_of(pp: float | None, cutoffs: list[float] | None, head: int, tail: int) -> str:
    if pp is None or cutoffs is None:
        return "all"
    if pp < cutoffs[head]:
        return "head"
    if pp < cutoffs[tail]:
        return "middle"
    return "tail"


@dataclasses.dataclass
class PerplexityConfig:
    models: str | None = None
    """Directory of <lang>.sp.model + <lang>.arpa.bin (CCNet names; train-lm writes them). null: no scoring, every document in bucket all."""
    languages: list[str] = dataclasses.field(default_factory=list)
    """Score only these languages (default: every language with both model files)."""
    mode: str = "document"
    """document (CCNet: the whole document as one normalized sequence) or per_line (each paragraph scored, scores summed)."""
    cutoffs: str | None = None
    """CCNet-layout cutoff.csv (python -m pipeline cutoffs writes one). null: perplexity only, bucket 'all'."""
    head: int = 30
    """Percentile below which a document is head."""
    tail: int = 60
    """Percentile from which a document is tail (middle in between)."""
    drop_buckets: list[str] = dataclasses.field(default_factory=list)
    """Buckets to drop, e.g. [tail] (counted)."""
    max_perplexity: float | None = None
    """Drop documents above this perplexity (counted)."""

    choices = {"mode": MODES}
    ranges = {"head": (0, 99), "tail": (0, 99), "max_perplexity": (1.0, None)}

    def validate(self) -> None:
        if self.head > self.tail:
            raise UserError(f"head ({self.head}) must not exceed tail")
        if set(self.drop_buckets) & set(BUCKETS) and not self.cutoffs:
            raise UserError(f"drop_buckets {self.drop_buckets}: head, middle and tail need perplexity.cutoffs "
                            "(without them every document is in bucket all)")
        for value in self.drop_buckets:
            if value not in (*BUCKETS, "all"):
                raise UserError(f"drop_buckets holds {value!r}; buckets are {', '.join(BUCKETS)}, all")
        if self.models is None:  # the step does not run: what it was asked to do would silently not happen
            asked = [f.name for f in dataclasses.fields(self) if f.name != "models" and getattr(self, f.name) !=
                     (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)]
            if asked:
                raise UserError(f"{', '.join(asked)} set without perplexity.models: the step does not run without "
                                "models (set models, or remove them)")


class PerplexityScorer(Step):
    """Sets ``perplexity`` and ``bucket``; models load lazily per language."""

    name = "perplexity"
    Config = PerplexityConfig
    counters = ("above_max_perplexity", "dropped_head", "dropped_middle", "dropped_tail", "dropped_all",
                "model_load_failed", "no_cutoff")
    provides = ("perplexity", "bucket")
    worker_modules = ("kenlm", "sentencepiece")
    order_key = operator.itemgetter("lang")
    """One language's SentencePiece and KenLM models in a row keep their tables in the CPU caches:
    the benchmark's 45,832 kept documents, shuffled, scored in blocks of 8,192 took 0.81x the time
    sorted by language than in input order (A-B-B-A per block, sorted faster in 6 of 6 blocks;
    blocks of 256: 0.85x, faster in 163 of 180)."""
    chunk_docs = 8192

    def __init__(self, cfg: PerplexityConfig, run: RunInfo = RunInfo(), languages: list[str] | None = None,
                 cutoffs: dict[str, list[float]] | None = None) -> None:
        super().__init__(cfg, run)
        self.languages, self.cutoffs = set(languages or ()), cutoffs
        self._models: dict[str, tuple[Any, Any] | None] = {}

    @classmethod
    def active(cls, cfg: PerplexityConfig) -> bool:
        return cfg.models is not None

    @classmethod
    def requires(cls, cfg: PerplexityConfig) -> tuple[str, ...]:
        return ("lang",)

    def store_paths(self) -> dict[str, str]:
        return {key: path for key, path in (("perplexity.models", self.cfg.models),
                                            ("perplexity.cutoffs", self.cfg.cutoffs)) if path}

    def prepare(self) -> None:
        """The languages to score (their models checked) and the cutoff table."""
        assert self.cfg.models is not None
        self.languages = set(check_models(self.cfg.models, self.cfg.languages))
        self.cutoffs = read_cutoffs(self.cfg.cutoffs) if self.cfg.cutoffs else None
        if self.cutoffs is not None:
            uncovered = sorted(self.languages - set(self.cutoffs))
            if uncovered:
                LOG.warning("%s has no cutoffs for %s: their documents get bucket 'all'", self.cfg.cutoffs,
                            ", ".join(uncovered))

    def languages_named(self) -> dict[str, Iterable[str]]:
        """The languages listed, or else those with models (``deu.arpa.bin`` would never be used)."""
        return {"languages": self.cfg.languages} if self.cfg.languages else {"models": self.languages}

    def models(self, lang: str) -> tuple[Any, Any] | None:
        if lang not in self._models:
            self._models[lang] = self._load(lang) if lang in self.languages else None
        return self._models[lang]

    def _load(self, lang: str) -> tuple[Any, Any] | None:
        import kenlm
        import sentencepiece as spm

        assert self.cfg.models is not None
        sp_path, lm_path = model_paths(self.cfg.models, lang)
        try:
            with fs.open_read(sp_path) as f:
                sp = spm.SentencePieceProcessor(model_proto=f.read())
            lm = kenlm.Model(str(fs.local_copy(lm_path)))
        except (OSError, RuntimeError, UserError) as exc:
            LOG.error("%s: cannot load the %s model (%s); its documents get bucket 'all'", lm_path, lang, exc)
            self.count("model_load_failed")
            return None
        return sp, lm

    def __call__(self, doc: Document) -> StepResult:
        cfg = self.cfg
        models = self.models(doc["lang"])
        pp = document_perplexity(doc["text"], *models, cfg.mode) if models else None
        cutoffs = None
        if pp is not None and self.cutoffs is not None:
            cutoffs = self.cutoffs.get(doc["lang"])
            if cutoffs is None:
                self.count("no_cutoff")
        bucket = bucket_of(pp, cutoffs, cfg.head, cfg.tail)
        if cfg.max_perplexity is not None and pp is not None and pp > cfg.max_perplexity:
            return Drop("above_max_perplexity")
        if bucket in cfg.drop_buckets:
            return Drop(f"dropped_{bucket}")
        return {**doc, "perplexity": pp, "bucket": bucket}


def compute_cutoffs(corpus: str, sample_size: int, seed: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Perplexity percentiles 0..99 per language (sorted by language) from the scored documents of a pipeline output.

    At most ``sample_size`` documents per language are used, drawn with a seeded RNG from the
    documents sorted by id (so the result does not depend on shard layout; by digest in shards of
    CCNet's fields, ``write.schema: ccnet``, which have no id). Shards of every ``write.format``
    are read. Returns the cutoffs and the number of documents each language's percentiles come from.
    """
    import random

    import numpy as np

    from ..output.shards import read_shard

    shards = [path for path in shard_files(corpus) + shard_files(corpus, "json")
              if path.endswith(tuple(FORMATS.values()))]  # not a writer's temporary file
    if not shards:
        raise UserError(f"--corpus {corpus}: no shards (lang=*/bucket=*/part-*, or <lang>_<bucket>_NNNN.json.gz) in it")
    values: dict[str, list[tuple[str, float]]] = {}
    for path in shards:
        try:
            table = read_shard(path)
            if "perplexity" not in table.column_names and path.endswith(FORMATS["json"]):
                continue  # JSON lines leave out null fields: no document of this shard was scored
            columns = ("id", "lang", "perplexity") if "id" in table.column_names else ("digest", "language", "perplexity")
            table = table.select(list(columns))
        except (OSError, EOFError, ValueError, KeyError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise UserError(f"{path}: not a corpus shard ({first_line(exc)})") from None
        for doc_id, lang, pp in zip(*(table.column(c).to_pylist() for c in columns)):
            if pp is not None:  # (None: not scored, no model for its language)
                if not math.isfinite(pp):  # a shard edited by hand: one NaN made the language's every cutoff NaN
                    raise UserError(f"{path}: document {doc_id}: perplexity {pp} is not a finite number")
                values.setdefault(lang, []).append((doc_id, pp))
    if not values:
        raise UserError(f"--corpus {corpus}: no document has a perplexity (run the pipeline with perplexity.models)")
    cutoffs, used = {}, {}
    for lang, pairs in sorted(values.items()):
        pairs.sort()
        if len(pairs) > sample_size:
            pairs = random.Random(f"{seed}-{lang}").sample(pairs, sample_size)
        pcts = np.percentile(np.array([pp for _, pp in pairs]), np.arange(PERCENTILES))
        cutoffs[lang], used[lang] = [round(float(v), 1) for v in pcts], len(pairs)
    return cutoffs, used
