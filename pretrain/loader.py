"""Masked-language-model batches from token shards: alpha-mixed languages, packed sequences, dynamic masking.

Every sequence is XLM-R "full sentences": ``<s>`` + the next ``seq_len - 2`` tokens of one
language's document stream + ``</s>``, documents in the stream separated by ``</s>``
(``cross_document: false``: a sequence holds the next piece of one document only, padded). Each
sequence's language is drawn with probability q_i ∝ p_i^α (p_i over training tokens). A language's
stream walks its documents in a fresh seeded permutation per epoch; each language cycles on its
own, so small languages are repeated (upsampled) as in XLM-R.

Data-parallel ranks get disjoint documents: rank r reads documents r, r + world_size, ... of every
language. Randomness is a function of (seed, rank, step), so the loader's state is the step and a
cursor (epoch, position, offset) per language: ``state_dict()`` is small and ``load_state_dict()``
resumes exactly where the run stopped, without replaying batches.

Masking is dynamic (new each time a sequence is drawn), as BERT/RoBERTa: ``mask_prob`` of the
maskable positions (never ``<s> <pad> </s> <unk> <mask>``) are chosen; of those ``mask_replace``
become ``<mask>``, ``random_replace`` a random ordinary token, the rest stay; ``labels`` hold the
original id there and -100 elsewhere. ``whole_word`` chooses whole words (pieces after a word-start
piece; in scripts written without spaces, such as Chinese or Thai, each piece is a word, as BERT's
Chinese models take each character); ``span`` chooses SpanBERT spans of whole words with geometric
lengths (``span_p``, cut at ``max_span`` and rescaled, as SpanBERT's) and, as SpanBERT, replaces a
span's tokens all alike (all ``<mask>``, all random, or all kept).
"""
from __future__ import annotations

import dataclasses
import math
import types
import zlib
from typing import Any, Iterator

import numpy as np

from pipeline.util.configfile import Source, build_dataclass, check_choices_and_ranges, source_of
from pipeline.util.errors import UserError

from .shards import DocList, TokenShards
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

MASKINGS = ("token", "whole_word", "span")
IGNORE = -100
STATE_VERSION = 1
RANGES = {"seq_len": (3, None), "batch_size": (1, None), "alpha": (1e-6, 1.0), "mask_prob": (0.0, 1.0),
          "mask_replace": (0.0, 1.0), "random_replace": (0.0, 1.0), "span_p": (1e-6, 1.0), "max_span": (1, None),
          "seed": (0, 2**32 - 1)}  # (the RNGs take 32 bits of it: 2^32 would be seed 0 again)
TRAIN_STREAM, VALID_STREAM = 0, 1


@dataclasses.dataclass
class LoaderConfig:
    seq_len: int = 512
    """Tokens per sequence, <s> and </s> included."""
    batch_size: int = 8
    """Sequences per batch on each data-parallel rank (the micro batch)."""
    alpha: float = 0.3
    """Language sampling exponent: q_i ∝ p_i^alpha, p_i over training tokens."""
    languages: list[str] = dataclasses.field(default_factory=list)
    """Use only these languages (default: every language of the token shards)."""
    mask_prob: float = 0.15
    """Share of maskable positions (or words, spans) chosen for prediction."""
    mask_replace: float = 0.8
    """Share of chosen positions replaced by <mask>."""
    random_replace: float = 0.1
    """Share of chosen positions replaced by a random ordinary token (the rest stay unchanged)."""
    masking: str = "token"
    """token (BERT), whole_word (all pieces of a chosen word), span (SpanBERT spans of whole words)."""
    span_p: float = 0.2
    """span masking: span lengths in words ~ Geometric(span_p), cut at max_span and rescaled (SpanBERT: 0.2)."""
    max_span: int = 10
    """span masking: longest span in words (SpanBERT: 10)."""
    cross_document: bool = True
    """Sequences run across document boundaries (joined by </s>); false: one document per sequence, padded."""
    seed: int = 0
    """Seed of language choice, document order and masking."""

    def validate(self, source: Source | str, section: str = "") -> None:
        """UserError naming the first bad key (as ``section.key`` when the config is a section) in ``source``."""
        prefix = f"{section}." if section else ""
        root = types.SimpleNamespace(**{section: self}) if section else self
        check_choices_and_ranges(root, source, {f"{prefix}masking": MASKINGS},
                                 {f"{prefix}{key}": limits for key, limits in RANGES.items()})
        if self.mask_replace + self.random_replace > 1.0 + 1e-9:
            where = source_of(source, f"{prefix}mask_replace", f"{prefix}random_replace")
            raise UserError(f"{where}: {prefix}mask_replace + {prefix}random_replace must not exceed 1")
        twice = next((lang for lang in self.languages if self.languages.count(lang) > 1), None)
        if twice:  # (each name would be one more share of the mix)
            raise UserError(f"{source_of(source, f'{prefix}languages')}: {prefix}languages names {twice} twice")


def loader_config(data: dict[str, Any], source: str) -> LoaderConfig:
    """A checked :class:`LoaderConfig` from a mapping (e.g. a YAML section)."""
    cfg = build_dataclass(LoaderConfig, data, source)
    cfg.validate(source)
    return cfg


def _seed(*parts: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([p & 0xFFFFFFFF for p in parts])))


def _lang_key(lang: str) -> int:
    return zlib.crc32(lang.encode("utf-8"))


class _Stream:
    """One language's documents as a stream, with a cursor (epoch, position in the epoch's order, offset)."""

    def __init__(self, docs: DocList, indices: np.ndarray, seed: int, lang: str, cycle: bool):
        self.docs, self.indices, self.seed, self.key, self.cycle = docs, indices, seed, _lang_key(lang), cycle
        self.epoch = self.pos = self.offset = 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1
        self.index = -1  # the current document's index in ``docs``
        self.copied: list[int] = []  # the documents the last fill copied tokens from

    def _current(self) -> np.ndarray | None:
        if self.pos >= len(self.indices):
            if not self.cycle:
                return None
            self.epoch, self.pos, self.offset = self.epoch + 1, 0, 0
        if self._order_epoch != self.epoch:
            if self.cycle:
                self._order = self.indices[_seed(self.seed, self.key, self.epoch).permutation(len(self.indices))]
            else:
                self._order = self.indices
            self._order_epoch = self.epoch
        assert self._order is not None
        self.index = int(self._order[self.pos])
        return self.docs[self.index]

    def _advance(self) -> None:
        self.pos, self.offset = self.pos + 1, 0

    def fill(self, out: np.ndarray, cross_document: bool) -> int:
        """Write the stream's next tokens into ``out``; returns how many (fewer only at the end of a
        non-cycling stream, or at a document's end when not crossing documents)."""
        filled, n = 0, len(out)
        self.copied = []
        doc = self._current()
        while doc is not None and filled < n:
            if self.offset < len(doc):
                self.copied.append(self.index)
                k = min(len(doc) - self.offset, n - filled)
                out[filled:filled + k] = doc[self.offset:self.offset + k]
                filled += k
                self.offset += k
                if not cross_document:
                    break
                continue
            self._advance()
            doc = None if filled == n - 1 else self._current()
            if doc is None:
                break  # the sequence's closing </s> ends the document (or the stream): no separator before it
            out[filled] = EOS_ID
            filled += 1
        if doc is not None and self.offset >= len(doc):
            self._advance()  # the sequence's closing </s> ends this document too
        return filled

    def state(self) -> list[int]:
        return [self.epoch, self.pos, self.offset]

    def restore(self, state: list[int]) -> None:
        self.epoch, self.pos, self.offset = (int(v) for v in state)


class MLMLoader:
    """Infinite iterator of MLM batches for one data-parallel rank (see the module docstring)."""

    def __init__(self, shards: TokenShards, cfg: LoaderConfig, rank: int = 0, world_size: int = 1,
                 tokenizer: Tokenizer | None = None, valid_seed: int | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        cfg.validate("loader config")
        self.shards, self.cfg, self.rank, self.world_size = shards, cfg, rank, world_size
        self.valid_seed = cfg.seed if valid_seed is None else valid_seed  # (a run's, whatever its training streams')
        unknown = [lang for lang in cfg.languages if lang not in shards.languages]
        if unknown:
            raise UserError(f"loader config: languages holds {unknown[0]!r}, not in token shards {shards.directory} "
                            f"({', '.join(shards.languages)})")
        self.languages: list[str] = sorted(cfg.languages) if cfg.languages else list(shards.languages)
        q = shards.sampling_weights(cfg.alpha)
        weights = np.array([q[lang] for lang in self.languages], dtype=np.float64)
        self.probs = weights / weights.sum()
        self._cum = np.cumsum(self.probs)
        self.vocab_size = shards.vocab_size
        self.mask_id = self.vocab_size - 1
        self.special = np.zeros(self.vocab_size, dtype=np.bool_)
        self.special[[BOS_ID, PAD_ID, EOS_ID, UNK_ID, self.mask_id]] = True
        self.word_start: np.ndarray | None = None
        if cfg.masking != "token":
            if tokenizer is None:
                tokenizer = Tokenizer.load(shards.meta["tokenizer"]["dir"])
            self.word_start = tokenizer.word_start
        if tokenizer is not None:
            shards.check_tokenizer(tokenizer)
        self.streams = []
        for lang in self.languages:
            docs = shards.docs(lang, "train")
            mine = np.arange(rank, len(docs), world_size, dtype=np.int64)
            if not len(mine):
                raise UserError(f"token shards {shards.directory}: lang={lang} has {len(docs)} training documents, "
                                f"too few for rank {rank} of {world_size}")
            self.streams.append(_Stream(docs, mine, cfg.seed, lang, cycle=True))
        self.step = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        rng = _seed(self.cfg.seed, TRAIN_STREAM, self.rank, self.step)
        self.step += 1
        langs = np.minimum(np.searchsorted(self._cum, rng.random(self.cfg.batch_size), side="right"),
                           len(self.languages) - 1)
        ids, sources = self._pack([self.streams[int(lang)] for lang in langs])
        return self._collate(ids, langs, rng, sources)

    def _pack(self, streams: list[_Stream]) -> tuple[np.ndarray, list[tuple[DocList, list[int]]]]:
        """[len(streams), seq_len] int64: ``<s>`` + each stream's next tokens + ``</s>``, padded; and
        each row's documents (to name one in an error)."""
        seq_len = self.cfg.seq_len
        ids = np.full((len(streams), seq_len), PAD_ID, dtype=np.int64)
        ids[:, 0] = BOS_ID
        sources = []
        for row, stream in enumerate(streams):
            k = stream.fill(ids[row, 1:seq_len - 1], self.cfg.cross_document)
            ids[row, 1 + k] = EOS_ID
            sources.append((stream.docs, stream.copied))
        return ids, sources

    def _collate(self, ids: np.ndarray, langs: np.ndarray, rng: np.random.Generator,
                 sources: list[tuple[DocList, list[int]]]) -> dict[str, Any]:
        import torch

        if ids.min() < 0 or ids.max() >= self.vocab_size:  # (shard.json's max_id was checked, not each id)
            row = int(np.flatnonzero(((ids < 0) | (ids >= self.vocab_size)).any(axis=1))[0])
            self._outside_the_vocabulary(self.languages[int(langs[row])], *sources[row])
        inputs, labels = self.mask(ids, rng)
        return {"input_ids": torch.from_numpy(inputs), "attention_mask": torch.from_numpy((ids != PAD_ID).astype(np.int64)),
                "labels": torch.from_numpy(labels), "lang": torch.from_numpy(langs.astype(np.int64))}

    def _outside_the_vocabulary(self, lang: str, docs: DocList, indices: list[int]) -> None:
        """The UserError naming the token file, the document and the id outside the vocabulary among
        ``docs[indices]`` (the documents a row was packed from)."""
        for index in indices:
            doc = docs[index]
            bad = doc[(doc < 0) | (doc >= self.vocab_size)]
            if len(bad):
                path, number = docs.locate(index)
                raise UserError(f"token shard {path}: document {number} (lang={lang}) holds id {bad[0]} outside the "
                                f"vocabulary (0..{self.vocab_size - 1}): a token array damaged or edited in place; run "
                                "`pretrain tokenize` again into a new --out")

    def _words(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Word index of every position (flat, increasing) and the start position of every word."""
        assert self.word_start is not None
        starts = self.word_start[ids]
        starts[:, 0] = True
        starts[:, 1:] |= self.special[ids[:, :-1]]
        flat = starts.ravel()
        return np.cumsum(flat) - 1, np.flatnonzero(flat)

    def _chosen(self, ids: np.ndarray, maskable: np.ndarray,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        """The positions to predict, and for span masking the span of each position (-1 outside one),
        whose replacement is decided once for the whole span, as SpanBERT's; None otherwise."""
        p, shape = self.cfg.mask_prob, ids.shape
        if self.cfg.masking == "token":
            return maskable & (rng.random(shape, dtype=np.float32) < p), None
        word, first = self._words(ids)
        if self.cfg.masking == "whole_word":
            return maskable & (rng.random(len(first), dtype=np.float32) < p)[word].reshape(shape), None
        # span: starts at words with a rate that covers ~p of the words (Poisson approximation), lengths
        # as SpanBERT draws them (:meth:`span_lengths`), cut at the end of the sequence; where spans
        # overlap, a word belongs to the last that starts at or before it
        lengths, weights = self.span_lengths()
        rate = -math.log1p(-min(p, 1 - 1e-9)) / float(lengths @ weights)
        start = np.flatnonzero(rng.random(len(first), dtype=np.float32) < rate)
        lengths = rng.choice(lengths, size=len(start), p=weights)
        last_word_of_row = word.reshape(shape)[:, -1]
        end = np.minimum(start + lengths, last_word_of_row[first[start] // shape[1]] + 1)
        edges = np.bincount(start, minlength=len(first) + 1) - np.bincount(end, minlength=len(first) + 1)
        covered = np.cumsum(edges[:-1]) > 0
        span = np.where(covered, np.searchsorted(start, np.arange(len(first)), side="right") - 1, -1)
        return maskable & covered[word].reshape(shape), span[word].reshape(shape)

    def span_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Span lengths in words, 1 to ``max_span``, and their probabilities: Geometric(``span_p``)
        cut at ``max_span`` and scaled to sum to 1, as SpanBERT draws them (mean 3.8 words at its
        0.2 and 10; clipping instead piles 13 % of the spans on the longest, mean 4.5)."""
        lengths = np.arange(1, self.cfg.max_span + 1)
        weights = self.cfg.span_p * (1 - self.cfg.span_p) ** (lengths - 1)
        return lengths, weights / weights.sum()

    def mask(self, ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, labels) for a [B, S] int64 array of ids: dynamic masking as the module docstring says."""
        maskable = ~self.special[ids]
        chosen, span = self._chosen(ids, maskable, rng)
        labels = np.where(chosen, ids, IGNORE)
        u = rng.random(ids.shape, dtype=np.float32)
        if span is not None:  # one draw per span: all of it <mask>, random tokens, or left as it was
            per_span = rng.random(int(span.max()) + 2, dtype=np.float32)
            u = np.where(span >= 0, per_span[span], u)
        to_mask = chosen & (u < self.cfg.mask_replace)
        to_random = chosen & ~to_mask & (u < self.cfg.mask_replace + self.cfg.random_replace)
        inputs = ids.copy()
        inputs[to_mask] = self.mask_id
        inputs[to_random] = rng.integers(UNK_ID + 1, self.mask_id, size=int(to_random.sum()))
        return inputs, labels

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the step and each language's cursor, plus what must match on resume."""
        return {"version": STATE_VERSION, "step": self.step, "rank": self.rank, "world_size": self.world_size,
                "seed": self.cfg.seed, "languages": list(self.languages), "fingerprint": self.shards.fingerprint,
                "documents": [len(s.docs) for s in self.streams], "cursors": [s.state() for s in self.streams]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the run that saved ``state`` stopped (same shards, seed, ranks)."""
        if state.get("version") != STATE_VERSION:
            raise UserError(f"loader state: version {state.get('version')!r}, expected {STATE_VERSION}")
        mine = self.state_dict()
        for key in ("rank", "world_size", "seed", "languages", "fingerprint", "documents"):
            if state.get(key) != mine[key]:
                raise UserError(f"loader state: {key} was {state.get(key)!r}, now {mine[key]!r}; the data order "
                                f"cannot be resumed exactly")
        self.step = int(state["step"])
        for stream, cursor in zip(self.streams, state["cursors"]):
            stream.restore(cursor)

    def valid_batches(self, lang: str) -> Iterator[dict[str, Any]]:
        """One pass over ``lang``'s held-out documents in order, packed and masked with a fixed seed; the
        same on every rank. The last batch may hold fewer sequences."""
        if lang not in self.languages:
            raise UserError(f"valid_batches: no language {lang!r} (have {', '.join(self.languages)})")
        docs = self.shards.docs(lang, "valid")
        stream = _Stream(docs, np.arange(len(docs), dtype=np.int64), self.valid_seed, lang, cycle=False)
        index, lang_index = 0, self.languages.index(lang)
        while True:
            rows, sources = [], []
            while len(rows) < self.cfg.batch_size and stream.pos < len(docs):
                row, source = self._pack([stream])
                rows.append(row)
                sources += source
            if not rows:
                return
            rng = _seed(self.valid_seed, VALID_STREAM, _lang_key(lang), index)
            yield self._collate(np.concatenate(rows), np.full(len(rows), lang_index, dtype=np.int64), rng, sources)
            index += 1
            if len(rows) < self.cfg.batch_size:
                return
