"""Tokenize a corpus into memory-mapped token shards, one per corpus shard, per language.

Each corpus shard ``lang=<l>/bucket=<b>/part-N.arrow`` becomes a folder ``lang=<l>/bucket=<b>/part-N/``
with flat arrays per split: ``train.tokens.npy`` (int32 ids, documents concatenated, no special
tokens) and ``train.offsets.npy`` (int64, documents + 1 entries), the same for ``valid``, and
``shard.json`` (counts, tokenizer fingerprint). Document i is ``tokens[offsets[i]:offsets[i+1]]``:
O(1) through ``np.load(mmap_mode="r")``. Documents keep the corpus order (shards sorted by name,
rows by id). A folder is written under a temporary name and renamed, so a rerun skips every shard
already written. A document goes to ``valid`` when the hash of its id falls under
``--valid-fraction``; a language left without one gets its lowest-hash document (if it has two or
more). ``meta.json`` (written last; removed first by a rerun that rewrites a shard) holds the
tokenizer fingerprint, vocabulary size, per-language documents and tokens, and q_i over training tokens.

With ``--rehydration`` (FineWeb-2's schedule, ``fineweb2``, or your own ``[[size, copies], ...]``)
a training document is written as many times as its ``minhash_cluster_size`` earns it (held-out
documents once): the loader then samples it, and its language, by that weight. Counts before the
copies are kept in ``shard.json`` and ``meta.json`` (``train_documents_before``, ``train_tokens_before``).
"""
from __future__ import annotations

import argparse
import functools
import os
import posixpath
import shutil
import sys
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from pipeline.output import fs, stores
from pipeline.util.configfile import path_argument
from pipeline.util.errors import UserError
from pipeline.report.sampling import FINEWEB2_REHYDRATION, check_alpha, check_rehydration, copies, sampling_weights

from .tokenizer import META as TOKENIZER_META, Tokenizer, language_shards, read_columns, recorded_alpha

SPLITS = ("train", "valid")
META, SHARD_META = "meta.json", "shard.json"
FORMAT = 1
HASH_SCALE = 1 << 64
ENCODE_BATCH = 256


def valid_score(doc_id: str) -> float:
    """A document's position in [0, 1) for the held-out split (stable hash of its id)."""
    from pipeline.output.shards import stable_hash  # Beam's file systems come with pipeline.output.shards: not at --help time

    return stable_hash(doc_id) / HASH_SCALE


def forced_valid(shards: dict[str, list[str]], fraction: float) -> dict[str, str]:
    """Per language with no document under ``fraction`` (and at least two): the id of its lowest-hash
    document with a text that is not blank (a blank one has no tokens, and no held-out document)."""
    forced = {}
    for lang, paths in shards.items():
        count, lowest = 0, 1.0
        for path in paths:
            ids = read_columns(path, "id")[0]
            count += len(ids)
            lowest = min([lowest, *(valid_score(i) for i in ids)])
        if not count:
            raise UserError(f"lang={lang}: no documents in {len(paths)} shard(s), e.g. {paths[0]} (empty language; "
                            f"leave it out with --languages)")
        if fraction > 0 and count > 1 and lowest >= fraction:  # (a small language: its texts read once more)
            candidates = [(valid_score(i), i) for path in paths for text, i in zip(*read_columns(path, "text", "id"))
                          if text and not text.isspace()]
            if candidates:
                forced[lang] = min(candidates)[1]
    return forced


@dataclass
class ShardJob:
    source: str  # a corpus shard: local path, s3:// or gs://
    target: Path
    lang: str
    valid_fraction: float
    forced: str | None
    rehydration: tuple[tuple[int, int], ...] = ()


_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(tokenizer_dir: str, store_options: dict[str, Any]) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions

    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = Tokenizer.load(tokenizer_dir)
    fs.configure(PipelineOptions.from_dictionary(store_options))


def _flatten(encoded: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    tokens = np.fromiter(chain.from_iterable(encoded), dtype=np.int32, count=int(lengths.sum()))
    return tokens, lengths


def tokenize_shard(job: ShardJob, tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """Tokenize one corpus shard into its folder (atomically); returns its ``shard.json``."""
    tokenizer = tokenizer or _WORKER_TOKENIZER
    assert tokenizer is not None
    texts, ids = read_columns(job.source, "text", "id")
    sizes = read_columns(job.source, "minhash_cluster_size")[0] if job.rehydration else [1] * len(ids)
    if None in sizes:  # (near_dedup gives every kept document its cluster's size)
        raise UserError(f"--rehydration: corpus shard {job.source} has no minhash_cluster_size (a corpus built "
                        "without near_dedup): nothing to rehydrate by; leave --rehydration out")
    is_valid = [valid_score(i) < job.valid_fraction or i == job.forced for i in ids]
    before = [0, 0]  # training documents and tokens before the copies
    parts: dict[str, tuple[list[np.ndarray], list[int]]] = {s: ([], []) for s in SPLITS}
    empty = 0
    for start in range(0, len(texts), ENCODE_BATCH):
        batch = [t or "" for t in texts[start:start + ENCODE_BATCH]]
        tokens, lengths = _flatten(tokenizer.encode_batch(batch))
        ends = np.cumsum(lengths)
        for k, length in enumerate(lengths.tolist()):
            if not length:
                empty += 1
                continue
            split = "valid" if is_valid[start + k] else "train"
            times = 1 if split == "valid" else copies(sizes[start + k], job.rehydration)
            if split == "train":
                before[0], before[1] = before[0] + 1, before[1] + length
            parts[split][0].extend([tokens[ends[k] - length:ends[k]]] * times)
            parts[split][1].extend([length] * times)
    tmp = job.target.with_name(f"{job.target.name}.tmp-{uuid.uuid4().hex}")
    tmp.mkdir(parents=True)
    info: dict[str, Any] = {"source": posixpath.basename(job.source), "fingerprint": tokenizer.fingerprint,
                            "vocab_size": tokenizer.vocab_size, "valid_fraction": job.valid_fraction,
                            "empty_documents": empty, "rehydration": [list(pair) for pair in job.rehydration],
                            "forced_valid": job.forced,
                            "source_sha256": fs.sha256(job.source)}
    for split, (chunks, lengths) in parts.items():
        tokens = np.concatenate(chunks) if chunks else np.zeros(0, np.int32)
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(np.asarray(lengths, np.int64), out=offsets[1:])
        np.save(tmp / f"{split}.tokens.npy", tokens)
        np.save(tmp / f"{split}.offsets.npy", offsets)
        info[split] = {"documents": len(lengths), "tokens": int(offsets[-1]),
                       "max_id": int(tokens.max()) if len(tokens) else -1}
    info["train"].update(documents_before=before[0], tokens_before=before[1])
    fs.write_json(tmp / SHARD_META, info)
    if job.target.exists():
        shutil.rmtree(job.target)
    os.rename(tmp, job.target)
    return info


def done_shard(job: ShardJob, fingerprint: str) -> dict[str, Any] | None:
    """The shard's ``shard.json`` when it was already written with this tokenizer and split from these
    bytes of its source, else None (a corpus shard rewritten since, or another corpus's: redone).
    The source is known by its bytes' hash, not its time: shard.json stays the same bytes for the
    same corpus on every machine."""
    path = job.target / SHARD_META
    if not path.is_file():
        return None
    info = fs.read_json(path, what="token shard")
    if info.get("fingerprint") != fingerprint:
        raise UserError(f"token shard {job.target}: written with another tokenizer (fingerprint "
                        f"{str(info.get('fingerprint'))[:12]}, now {fingerprint[:12]}); use a new --out")
    if info.get("valid_fraction") != job.valid_fraction:
        raise UserError(f"token shard {job.target}: written with --valid-fraction {info.get('valid_fraction')}, "
                        f"now {job.valid_fraction}; use a new --out")
    if info.get("rehydration", []) != [list(pair) for pair in job.rehydration]:
        raise UserError(f"token shard {job.target}: written with --rehydration {info.get('rehydration', [])}, "
                        f"now {[list(pair) for pair in job.rehydration]}; use a new --out")
    if info.get("forced_valid") != job.forced:  # the language's shards changed: another document is held out
        return None
    if info.get("source_sha256") != fs.sha256(job.source):
        return None
    try:  # its arrays as shard.json says (a copy cut short, a file lost): written again
        for split in SPLITS:
            load_split(job.target, split, info, info["vocab_size"])
    except UserError:
        return None
    return info


def target_of(shard: str, corpus: str) -> Path:
    """``lang=<l>/bucket=<b>/part-N`` for the corpus shard ``lang=<l>/bucket=<b>/part-N.arrow``."""
    return Path(posixpath.splitext(fs.relative(shard, corpus))[0])


def tokenize_corpus(corpus: str | Path, tokenizer_dir: str | Path, out: str | Path, *, buckets: Iterable[str] = (),
                    languages: Iterable[str] = (), valid_fraction: float = 0.01, alpha: float | None = None,
                    workers: int = 1, progress: bool = False, store_options: dict[str, Any] | None = None,
                    rehydration: Iterable[Iterable[int]] = ()) -> dict[str, Any]:
    """Write the token shards (skipping those already written) and ``meta.json``; returns the meta."""
    from tqdm import tqdm

    if not 0 <= valid_fraction < 1:
        raise UserError(f"--valid-fraction {valid_fraction}: must be in [0, 1)")
    if workers < 1:
        raise UserError(f"--workers {workers}: must be 1 or more")
    schedule = tuple((int(size), int(times)) for size, times in rehydration)
    problem = check_rehydration([list(pair) for pair in schedule])
    if problem:
        raise UserError(f"--rehydration: {problem}")
    fs.check_local(str(tokenizer_dir), "--tokenizer")
    fs.check_local(str(out), "--out")
    tokenizer = Tokenizer.load(tokenizer_dir)
    corpus, out, buckets = str(corpus), Path(out), sorted(buckets)
    if alpha is None:
        alpha = recorded_alpha(tokenizer.meta, f"tokenizer {Path(tokenizer_dir) / TOKENIZER_META}")
    if problem := check_alpha(alpha):
        raise UserError(f"--alpha {problem}")
    written = [META, *(p.name for p in out.glob("lang=*") if p.is_dir())]  # by this command, for any languages
    fs.check_folder(str(out), "--out", written)
    shards = language_shards(corpus, buckets, languages)
    if (out / META).is_file():
        previous = fs.read_json(out / META, what="token shards")
        if previous.get("tokenizer", {}).get("fingerprint") != tokenizer.fingerprint:
            raise UserError(f"token shards {out}: written with another tokenizer; use a new --out")
    forced = forced_valid(shards, valid_fraction)
    jobs = [ShardJob(path, out / target_of(path, corpus), lang, valid_fraction, forced.get(lang), schedule)
            for lang, paths in shards.items() for path in paths]
    infos: dict[Path, dict[str, Any]] = {}
    for job in jobs:
        info = done_shard(job, tokenizer.fingerprint)
        if info is not None:
            infos[job.target] = info
    todo = [job for job in jobs if job.target not in infos]
    if todo:  # the shards change: until the new meta.json the folder reads as unfinished, never as the old one
        (out / META).unlink(missing_ok=True)
    for job in todo:  # folders an interrupted run left half-written
        for stale in job.target.parent.glob(f"{job.target.name}.tmp-*"):
            shutil.rmtree(stale)
    bar = tqdm(total=len(jobs), initial=len(infos), unit="shard", disable=not progress, desc="tokenize")
    if workers <= 1 or len(todo) <= 1:
        for job in todo:
            infos[job.target] = tokenize_shard(job, tokenizer)
            bar.update()
    else:
        with ProcessPoolExecutor(workers, initializer=_init_worker,
                                 initargs=(str(tokenizer_dir), store_options or {})) as pool:
            futures = {pool.submit(tokenize_shard, job): job for job in todo}
            for future in as_completed(futures):
                infos[futures[future].target] = future.result()
                bar.update()
    bar.close()
    meta = shards_meta(jobs, infos, tokenizer, tokenizer_dir, corpus, buckets, valid_fraction, alpha)
    meta["rehydration"] = [list(pair) for pair in schedule]
    fs.write_json(out / META, meta)
    left = sorted(p.name for p in out.glob("lang=*") if p.is_dir() and p.name[len("lang="):] not in meta["languages"])
    if left:  # an earlier run's, for other --languages: on the disk, not in training
        print(f"warning: --out {out}: {', '.join(left)} from an earlier run are not in this run's {META} (training "
              "reads only what it lists); remove them, or rerun with those languages", file=sys.stderr)
    return meta


def shards_meta(jobs: list[ShardJob], infos: dict[Path, dict[str, Any]], tokenizer: Tokenizer,
                tokenizer_dir: str | Path, corpus: str, buckets: list[str], valid_fraction: float,
                alpha: float) -> dict[str, Any]:
    languages: dict[str, dict[str, Any]] = {}
    for job in jobs:
        info, row = infos[job.target], languages.setdefault(job.lang, {"shards": [], "empty_documents": 0})
        row["shards"].append(str(job.target.relative_to(job.target.parents[2])))
        row["empty_documents"] += info["empty_documents"]
        for split in SPLITS:
            for key in ("documents", "tokens"):
                row[f"{split}_{key}"] = row.get(f"{split}_{key}", 0) + info[split][key]
        for key in ("documents", "tokens"):  # shards written before rehydration existed: no copies
            row[f"train_{key}_before"] = row.get(f"train_{key}_before", 0) + info["train"].get(f"{key}_before",
                                                                                          info["train"][key])
    empty = [lang for lang, row in languages.items() if not row["train_tokens"]]
    if empty:
        raise UserError(f"lang={empty[0]}: no training tokens after tokenization (empty language; leave it out "
                        f"with --languages)")
    weights = sampling_weights({lang: row["train_tokens"] for lang, row in languages.items()}, alpha)
    for lang, row in languages.items():
        row["p"], row["q"] = weights[lang]["p"], weights[lang]["q"]
    return {"format": FORMAT, "corpus": corpus, "buckets": buckets or "all", "valid_fraction": valid_fraction,
            "alpha": alpha, "tokenizer": {"dir": str(tokenizer_dir), "fingerprint": tokenizer.fingerprint,
                                          "vocab_size": tokenizer.vocab_size},
            "languages": dict(sorted(languages.items()))}


class DocList:
    """The documents of one language and split: ``len()``, ``[i]`` (int32 view, O(1)), ``lengths``, ``num_tokens``."""

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray]], paths: list[Path]):
        self.parts, self.paths = parts, paths  # each part's (tokens, offsets) and its token file (for errors)
        counts = np.array([len(offsets) - 1 for _, offsets in parts], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_tokens = sum(int(offsets[-1]) for _, offsets in parts)

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """Tokens per document (int64), computed on first use."""
        return np.concatenate([np.diff(o) for _, o in self.parts] or [np.zeros(0, np.int64)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _part_of(self, i: int) -> tuple[int, int]:
        """(part, index in the part) of document ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(i)
        part = int(np.searchsorted(self.starts, i, side="right")) - 1
        return part, i - int(self.starts[part])

    def locate(self, i: int) -> tuple[Path, int]:
        """Document ``i``'s token file and its index there (to name in an error)."""
        part, j = self._part_of(i)
        return self.paths[part], j

    def __getitem__(self, i: int) -> np.ndarray:
        part, j = self._part_of(i)
        tokens, offsets = self.parts[part]
        return tokens[offsets[j]:offsets[j + 1]]


def load_split(folder: Path, split: str, info: dict[str, Any], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """One split's (tokens, offsets) memory maps, checked for consistency; a mismatch is a UserError."""
    arrays = []
    for kind, dtype in (("tokens", np.int32), ("offsets", np.int64)):
        path = folder / f"{split}.{kind}.npy"
        try:
            array = np.load(path, mmap_mode="r")
        except FileNotFoundError:
            raise UserError(f"token shard {path}: missing") from None
        except (ValueError, OSError, EOFError) as exc:
            raise UserError(f"token shard {path}: corrupt ({exc})") from None
        if array.dtype != dtype or array.ndim != 1:
            raise UserError(f"token shard {path}: expected 1-d {np.dtype(dtype).name}, found {array.ndim}-d {array.dtype}")
        arrays.append(array)
    tokens, offsets = arrays
    expected = info[split]
    if (len(offsets) != expected["documents"] + 1 or len(tokens) != expected["tokens"] or offsets[0] != 0
            or offsets[-1] != len(tokens) or (len(offsets) > 1 and np.any(np.diff(offsets) < 0))):
        raise UserError(f"token shard {folder}: {split} arrays do not match {SHARD_META} "
                        f"({expected['documents']} documents, {expected['tokens']} tokens): corrupt or truncated")
    if expected["max_id"] >= vocab_size:
        raise UserError(f"token shard {folder}: {split} holds id {expected['max_id']} >= vocab size {vocab_size}")
    return tokens, offsets


class TokenShards:
    """A token shard directory written by ``pretrain tokenize``."""

    def __init__(self, directory: Path, meta: dict[str, Any], docs: dict[tuple[str, str], DocList]):
        self.directory, self.meta, self._docs = directory, meta, docs
        self.fingerprint: str = meta["tokenizer"]["fingerprint"]
        self.vocab_size: int = meta["tokenizer"]["vocab_size"]
        self.languages: list[str] = sorted(meta["languages"])

    @classmethod
    def open(cls, directory: str | Path) -> "TokenShards":
        directory = Path(directory)
        if not directory.is_dir():
            raise UserError(f"token shards {directory}: no such directory")
        if not (directory / META).is_file():
            raise UserError(f"token shards {directory}: no {META} (not written by `pretrain tokenize`, or it did "
                            f"not finish: rerun it, written shards are skipped)")
        meta = fs.read_json(directory / META, what="token shards")
        if meta.get("format") != FORMAT:
            raise UserError(f"token shards {directory / META}: format {meta.get('format')!r}, expected {FORMAT}")
        try:
            return cls._open(directory, meta)
        except (KeyError, TypeError, AttributeError) as exc:  # valid JSON, not the layout tokenize writes
            raise UserError(f"token shards {directory}: malformed {META} or {SHARD_META} ({type(exc).__name__}: "
                            f"{exc}); rerun `pretrain tokenize` into a new --out") from None

    @classmethod
    def _open(cls, directory: Path, meta: dict[str, Any]) -> "TokenShards":
        vocab_size = meta["tokenizer"]["vocab_size"]
        docs = {}
        for lang, row in meta["languages"].items():
            parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {s: [] for s in SPLITS}
            paths: dict[str, list[Path]] = {s: [] for s in SPLITS}
            for rel in row["shards"]:
                folder = directory / rel
                info = fs.read_json(folder / SHARD_META, what="token shard")
                if info.get("fingerprint") != meta["tokenizer"]["fingerprint"]:
                    raise UserError(f"token shard {folder}: tokenizer fingerprint differs from {directory / META}")
                for split in SPLITS:
                    parts[split].append(load_split(folder, split, info, vocab_size))
                    paths[split].append(folder / f"{split}.tokens.npy")
            for split in SPLITS:
                docs[lang, split] = DocList(parts[split], paths[split])
        return cls(directory, meta, docs)

    def docs(self, lang: str, split: str = "train") -> DocList:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if lang not in self.languages:
            raise UserError(f"token shards {self.directory}: no language {lang!r} (have {', '.join(self.languages)})")
        return self._docs[lang, split]

    def sampling_weights(self, alpha: float) -> dict[str, float]:
        """q_i ∝ p_i^α with p_i over training tokens."""
        weights = sampling_weights({lang: self.docs(lang).num_tokens for lang in self.languages}, alpha)
        return {lang: weights[lang]["q"] for lang in self.languages}

    def check_tokenizer(self, tokenizer: Tokenizer) -> None:
        """UserError unless ``tokenizer`` is the one these shards were written with."""
        if tokenizer.fingerprint != self.fingerprint or tokenizer.vocab_size != self.vocab_size:
            raise UserError(f"token shards {self.directory} were written with tokenizer {self.fingerprint[:12]} "
                            f"(vocab {self.vocab_size}), not with {tokenizer.fingerprint[:12]} (vocab "
                            f"{tokenizer.vocab_size}): use the same tokenizer or rerun `pretrain tokenize`")


def rehydration_arg(value: str) -> tuple[tuple[int, int], ...]:
    """``--rehydration``: ``fineweb2`` or a JSON list of ``[smallest cluster size, copies]``."""
    import json

    if value == "fineweb2":
        return FINEWEB2_REHYDRATION
    try:
        loaded = json.loads(value)
        pairs = tuple(tuple(pair) for pair in loaded) if isinstance(loaded, list) else ((None,),)  # {}: no pairs
    except (ValueError, TypeError):
        pairs = ((None,),)
    if not all(len(pair) == 2 and all(type(n) is int for n in pair) for pair in pairs):
        raise argparse.ArgumentTypeError(f"{value!r}: expected fineweb2 or a JSON list of whole-number pairs such as "
                                         "[[1, 1], [2, 2]]")
    return pairs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="pipeline output directory (lang=<l>/bucket=<b>/part-*.arrow), "
                        "local or s3:// gs://")
    parser.add_argument("--tokenizer", required=True, help="tokenizer directory written by `pretrain tokenizer` (local)")
    parser.add_argument("--out", required=True, type=path_argument,
                        help="token shard directory, a local folder (a rerun skips shards "
                        "already written)")
    parser.add_argument("--buckets", nargs="+", action="extend", default=[], metavar="BUCKET", help="only these buckets (default: all)")
    parser.add_argument("--languages", nargs="+", action="extend", default=[], metavar="LANG", help="only these languages (default: all)")
    parser.add_argument("--valid-fraction", type=float, default=0.01,
                        help="held-out share of documents, chosen by a hash of the id (default 0.01; a language "
                             "with none gets its lowest-hash document when it has two or more)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="exponent of the q_i recorded in meta.json (default: the tokenizer's alpha)")
    parser.add_argument("--rehydration", type=rehydration_arg, default=(), metavar="SCHEDULE",
                        help="repeat each training document by its minhash_cluster_size: fineweb2 (FineWeb-2's "
                             "x1/x2/x3/x5/x8/x1 for sizes 1/2/3-4/5-99/100-999/1000+) or a JSON list of "
                             "[smallest size, copies] (default: off)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="processes tokenizing shards in parallel (default: all cores)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    stores.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    meta = tokenize_corpus(args.corpus, args.tokenizer, args.out, buckets=args.buckets, languages=args.languages,
                           valid_fraction=args.valid_fraction, alpha=args.alpha, workers=args.workers,
                           progress=not args.no_progress, store_options=stores.open_stores(args, {"--corpus": args.corpus}),
                           rehydration=args.rehydration)
    print(f"{'lang':<6} {'train docs':>10} {'train tokens':>13} {'valid docs':>10} {'valid tokens':>12} {'q':>7}")
    for lang, row in meta["languages"].items():
        print(f"{lang:<6} {row['train_documents']:>10} {row['train_tokens']:>13} {row['valid_documents']:>10} "
              f"{row['valid_tokens']:>12} {row['q']:>7.4f}")
    total = sum(row["train_tokens"] + row["valid_tokens"] for row in meta["languages"].values())
    print(f"wrote {args.out}: {len(meta['languages'])} languages, {total} tokens")
    return 0
