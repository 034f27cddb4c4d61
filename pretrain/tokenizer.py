"""Train one SentencePiece unigram vocabulary on text sampled across languages with q_i ∝ p_i^α (XLM-R).

Sentences (the corpus documents' lines) are drawn per language in proportion to q_i with a seeded
RNG; a language with fewer sentences than its share is repeated (``--short-languages repeat``, the
multinomial sampling XLM-R describes) or kept at what it has (``cap``). The model is trained in
memory, single-threaded by default, so the same corpus and options give the same bytes.

The output directory holds the model twice, in two id layouts with the same ids:
``spm.model`` (raw SentencePiece ids = our ids: ``<s>``=0 ``<pad>``=1 ``</s>``=2 ``<unk>``=3,
pieces, ``<mask>`` last; DebertaV2Tokenizer reads it) and ``sentencepiece.bpe.model`` (fairseq
layout, ``<unk>``=0 ``<s>``=1 ``</s>``=2; XLMRobertaTokenizer adds the offset), plus
``tokenizer_config.json``, ``special_tokens_map.json`` and ``tokenizer_meta.json``.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from pipeline.output import fs, stores
from pipeline.util.configfile import path_argument
from pipeline.util.errors import UserError, first_line
from pipeline.report.sampling import check_alpha, sampling_weights
from pipeline.steps.minhash import UNSPACED

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MASK = "<mask>"
OUR_MODEL, HF_MODEL, META = "spm.model", "sentencepiece.bpe.model", "tokenizer_meta.json"
TOKENIZER_CONFIG, SPECIAL_TOKENS = "tokenizer_config.json", "special_tokens_map.json"  # HF's
SHORT_POLICIES = ("repeat", "cap")
WORD_MARK = "\u2581"
SP_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


def language_shards(corpus: str, buckets: Iterable[str] = (), languages: Iterable[str] = ()) -> dict[str, list[str]]:
    """Corpus shards per language (``lang=<l>/bucket=<b>/part-*``), sorted; only the given buckets/languages
    (LID's ``unknown`` only when named). ``corpus`` may be a local folder or a bucket prefix (s3://, gs://)."""
    from pipeline.output.layout import missing_shards, shard_files
    from pipeline.report.sampling import EXCLUDED

    corpus = str(corpus)
    if fs.is_local(corpus) and not Path(corpus).is_dir():
        raise UserError(f"corpus {corpus}: no such directory")
    gap = missing_shards(corpus)
    if gap:  # sampling.json's weights describe the whole corpus, the shards read are fewer
        print(f"warning: corpus {corpus}: {gap}", file=sys.stderr)
    buckets, wanted = set(buckets), list(languages)
    found: dict[str, list[str]] = {}
    present: set[str] = set()
    for path in shard_files(corpus):
        lang_dir, bucket_dir, name = fs.relative(path, corpus).split("/")
        lang, bucket = lang_dir[len("lang="):], bucket_dir[len("bucket="):]
        if (lang not in wanted if wanted else lang in EXCLUDED) or not name.endswith((".arrow", ".parquet")):
            continue  # (LID's unknown is no language of the mix, as sampling.json has it, unless named)
        present.add(bucket)
        paths = found.setdefault(lang, [])
        if not buckets or bucket in buckets:
            paths.append(path)
    missing = [lang for lang in wanted if lang not in found]
    if missing:
        raise UserError(f"corpus {corpus}: no lang={missing[0]} directory")
    empty = [lang for lang, paths in found.items() if not paths]
    if found and len(empty) == len(found):  # a bucket name mistyped, or one this corpus has none of
        raise UserError(f"corpus {corpus}: no language has a shard in buckets {', '.join(sorted(buckets))} "
                        f"(its buckets: {', '.join(sorted(present))})")
    if empty:
        where = f" in buckets {', '.join(sorted(buckets))}" if buckets else ""
        raise UserError(f"corpus {corpus}: lang={empty[0]} has no shard{where} (empty language; "
                        f"leave it out with --languages)")
    if not found:
        raise UserError(f"corpus {corpus}: no lang=<code> directories (is it a pipeline output?)")
    return {lang: sorted(paths) for lang, paths in sorted(found.items())}


def read_columns(path: str, *names: str) -> list[list[Any]]:
    """Columns of one corpus shard as lists; a corrupt or foreign file is a UserError naming it."""
    from pipeline.output.shards import read_shard

    try:
        table = read_shard(path)
        if "raw_content" in table.column_names and "text" not in table.column_names:
            raise UserError(f"corpus shard {path}: written with write.schema=ccnet (CCNet's fields); pretrain reads "
                            "our schema: run the pipeline with --set write.schema=polyglot")
        return [table.column(name).to_pylist() for name in names]
    except (OSError, ValueError, KeyError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"corpus shard {path}: cannot read it ({first_line(exc)})") from None


def read_texts(path: str) -> list[str]:
    """The ``text`` column of one corpus shard."""
    return read_columns(path, "text")[0]


def sentences(text: str | None, max_bytes: int) -> list[str]:
    """A document's non-empty lines, stripped, of at most ``max_bytes`` UTF-8 bytes (SentencePiece skips longer ones)."""
    return [s for s in (line.strip() for line in (text or "").split("\n")) if s and len(s.encode("utf-8")) <= max_bytes]


def language_seed(seed: int, lang: str) -> list[int]:
    """Seed material for a language's RNG: independent of which other languages are present."""
    return [seed, zlib.crc32(lang.encode("utf-8"))]


def corpus_file(corpus: str, name: str) -> str | None:
    """``corpus/name`` when that file exists (local folder or bucket prefix), else None."""
    path = fs.join(corpus, name)
    return path if fs.exists(path) else None


def corpus_weights(corpus: str, alpha: float, buckets: Iterable[str], languages: Iterable[str],
                   measured: dict[str, int]) -> tuple[dict[str, float], str]:
    """q_i per language: sampling.json's when its α and buckets match, else recomputed from its counts
    (rehydrated ones where it has them for these buckets; its per-bucket counts otherwise, before
    rehydration, which the source then says), else from ``measured`` (characters read). Returns (q,
    where it came from)."""
    languages, buckets = sorted(languages), sorted(set(buckets))
    path = corpus_file(corpus, "sampling.json")
    if path:
        try:
            found = _recorded_weights(path, fs.read_json(path, what="corpus statistics"), alpha, buckets, languages)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # edited by hand, or another tool's
            raise UserError(f"corpus statistics {path}: not as pipeline run writes it ({type(exc).__name__}: {exc})") from None
        if found is not None:
            return found
    weights = sampling_weights({lang: measured[lang] for lang in languages}, alpha)
    return {lang: weights[lang]["q"] for lang in languages}, f"recomputed from the shards' characters (alpha={alpha})"


def _recorded_weights(path: str, report: dict[str, Any], alpha: float, buckets: list[str],
                      languages: list[str]) -> tuple[dict[str, float], str] | None:
    """:func:`corpus_weights` from ``sampling.json`` (``report``), or None where it cannot say."""
    recorded = report.get("languages", {})
    chosen = report.get("buckets")  # the corpus config's list, in its order, or "all"
    same_buckets = not buckets if chosen == "all" else isinstance(chosen, list) and sorted(set(chosen)) == buckets
    if report.get("alpha") == alpha and same_buckets and set(recorded) == set(languages):
        q = {lang: float(recorded[lang]["q"]) for lang in languages}
        if bad := next((lang for lang, share in q.items() if not 0 <= share <= 1), None):  # NaN too
            raise ValueError(f"q of {bad} is {q[bad]}, not a share in [0, 1]")
        return q, f"{path} (alpha={alpha})"
    unit, summary = report.get("unit", "characters"), report.get("corpus", {})
    rehydrated = (report.get("rehydration") or {}).get("languages", {})
    if rehydrated and same_buckets and all(lang in rehydrated for lang in languages):
        weights = sampling_weights({lang: rehydrated[lang][f"{unit}_rehydrated"] for lang in languages}, alpha)
        return ({lang: weights[lang]["q"] for lang in languages},
                f"recomputed from {path} {unit} after rehydration (alpha={alpha})")
    if all(lang in summary for lang in languages):
        sizes = {lang: sum(c[unit] for b, c in summary[lang]["buckets"].items() if not buckets or b in buckets)
                 for lang in languages}
        weights = sampling_weights(sizes, alpha)
        if set(weights) == set(languages):
            dropped = " before rehydration (its rehydrated counts are for other buckets)" if rehydrated else ""
            return ({lang: weights[lang]["q"] for lang in languages},
                    f"recomputed from {path} {unit}{dropped} (alpha={alpha})")
    return None


def recorded_alpha(data: dict[str, Any], named: str) -> float:
    """The ``alpha`` a JSON file of ours recorded (0.3 where it has none); ``named`` (what and path)
    in the one error line when it is no number in (0, 1], edited by hand."""
    alpha = data.get("alpha", 0.3)
    number = isinstance(alpha, (int, float)) and not isinstance(alpha, bool)
    if problem := check_alpha(alpha) if number else f"{alpha!r}: must be a number in (0, 1]":
        raise UserError(f"{named}: alpha {problem}; correct it or give --alpha")
    return float(alpha)


@dataclass
class LanguageSample:
    lang: str
    q: float
    available: int
    target: int
    drawn: int

    def note(self) -> str:
        if self.drawn == self.target and self.target > self.available:
            return f"repeated x{self.target / self.available:.2f}"
        if self.drawn < self.target:
            return f"capped: only {self.available} sentences"
        return ""


def draw_indices(available: int, target: int, short: str, rng: np.random.Generator) -> np.ndarray:
    """Sorted sentence indices (with repeats when ``short`` is repeat and the language is short)."""
    if target <= available:
        return np.sort(rng.choice(available, size=target, replace=False))
    if short == "cap":
        return np.arange(available)
    full, rest = divmod(target, available)
    extra = rng.choice(available, size=rest, replace=False)
    return np.sort(np.concatenate([np.repeat(np.arange(available), full), extra]))


def sample_sentences(shards: dict[str, list[str]], q: Callable[[dict[str, int]], dict[str, float]], sample_size: int,
                     short: str, seed: int, max_bytes: int) -> tuple[list[str], list[LanguageSample]]:
    """Two passes over each language's shards: count sentences (and characters, for ``q``), then draw."""
    counts, characters = {}, {}
    for lang, paths in shards.items():
        counts[lang], characters[lang] = 0, 0
        for path in paths:
            for text in read_texts(path):
                counts[lang] += len(sentences(text, max_bytes))
                characters[lang] += len(text or "")
        if not counts[lang]:
            raise UserError(f"lang={lang}: no text in {len(paths)} shard(s), e.g. {paths[0]} (empty language; "
                            f"leave it out with --languages)")
    weights = q(characters)
    drawn: list[str] = []
    report = []
    for lang, paths in shards.items():
        target = max(1, round(sample_size * weights[lang]))
        picks = draw_indices(counts[lang], target, short, np.random.default_rng(language_seed(seed, lang)))
        before, index, cursor = len(drawn), 0, 0
        for path in paths:
            for text in read_texts(path):
                for sentence in sentences(text, max_bytes):
                    while cursor < len(picks) and picks[cursor] == index:
                        drawn.append(sentence)
                        cursor += 1
                    index += 1
        report.append(LanguageSample(lang, weights[lang], counts[lang], target, len(drawn) - before))
    return drawn, report


def train_unigram(sample: list[str], vocab_size: int, character_coverage: float, byte_fallback: bool, seed: int,
                  threads: int, max_bytes: int) -> bytes:
    """A fairseq-layout unigram model (``<unk>``=0 ``<s>``=1 ``</s>``=2) with ``vocab_size`` - 2 pieces."""
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample), model_writer=model, model_type="unigram", vocab_size=vocab_size - 2,
            character_coverage=character_coverage, byte_fallback=byte_fallback, unk_id=0, bos_id=1, eos_id=2,
            pad_id=-1, input_sentence_size=0, shuffle_input_sentence=False, num_threads=threads,
            max_sentence_length=max_bytes, minloglevel=2)
    except RuntimeError as exc:
        match = SP_TOO_HIGH.search(str(exc))
        if match:
            raise UserError(f"--vocab-size {vocab_size} is too large for this sample: SentencePiece allows at most "
                            f"{int(match.group(2)) + 2} here; lower it or raise --sample-size") from None
        raise UserError(f"SentencePiece training failed: {exc}") from None
    return model.getvalue()


def our_layout(fairseq_model: bytes) -> bytes:
    """The same model with raw ids = our ids: specials 0..3 reordered, pieces shifted by one, ``<mask>`` last."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(fairseq_model)
    kind = pb.ModelProto.SentencePiece
    pieces = list(proto.pieces)
    assert [p.piece for p in pieces[:3]] == ["<unk>", "<s>", "</s>"], "unexpected special pieces"
    del proto.pieces[:]
    for piece, type_ in zip(SPECIALS, (kind.CONTROL, kind.CONTROL, kind.CONTROL, kind.UNKNOWN)):
        proto.pieces.add(piece=piece, score=0.0, type=type_)
    proto.pieces.extend(pieces[3:])
    proto.pieces.add(piece=MASK, score=0.0, type=kind.CONTROL)
    spec = proto.trainer_spec
    spec.bos_id, spec.pad_id, spec.eos_id, spec.unk_id = BOS_ID, PAD_ID, EOS_ID, UNK_ID
    spec.vocab_size = len(proto.pieces)
    return proto.SerializeToString(deterministic=True)


def hf_config() -> dict[str, Any]:
    """``tokenizer_config.json``: the XLM-R special tokens for both HF tokenizer classes."""
    return {"tokenizer_class": "XLMRobertaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
            "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": MASK,
            "add_prefix_space": True, "do_lower_case": False, "split_by_punct": False, "model_max_length": 512}


def train_tokenizer(corpus: str | Path, out: str | Path, *, vocab_size: int, alpha: float | None = None,
                    buckets: Iterable[str] = (), languages: Iterable[str] = (), sample_size: int = 2_000_000,
                    short: str = "repeat", character_coverage: float = 0.9995, byte_fallback: bool = False,
                    seed: int = 0, threads: int = 1, max_sentence_bytes: int = 4192) -> dict[str, Any]:
    """Sample, train and write the tokenizer directory; returns ``tokenizer_meta.json``'s content."""
    if vocab_size < 8:
        raise UserError(f"--vocab-size {vocab_size}: too small (at least the 5 specials and a few pieces)")
    if sample_size < 1:
        raise UserError(f"--sample-size {sample_size}: must be at least 1 (sentences)")
    if not 0 <= seed < 2**32:
        raise UserError(f"--seed {seed}: must be 0 to 2^32-1 (SentencePiece's seed)")
    if not 10 <= max_sentence_bytes <= 1 << 30:  # SentencePiece's range; below it every line was left out
        raise UserError(f"--max-sentence-bytes {max_sentence_bytes}: must be 10 to {1 << 30} (SentencePiece's range)")
    if short not in SHORT_POLICIES:
        raise UserError(f"--short-languages {short!r}: one of {', '.join(SHORT_POLICIES)}")
    if not 0.98 <= character_coverage <= 1.0:  # SentencePiece's range (NaN too), checked only after the sampling
        raise UserError(f"--character-coverage {character_coverage}: must be 0.98 to 1 (SentencePiece's range)")
    if not 1 <= threads <= 1024:
        raise UserError(f"--threads {threads}: must be 1 to 1024 (SentencePiece's range)")
    fs.check_local(str(out), "--out")
    corpus, out, buckets = str(corpus), Path(os.path.realpath(out)), sorted(buckets)  # (a link: its folder's swapped)
    fs.restore_folder(out)
    fs.check_folder(str(out), "--out", (HF_MODEL, OUR_MODEL, META, TOKENIZER_CONFIG, SPECIAL_TOKENS))
    shards = language_shards(corpus, buckets, languages)
    if alpha is None:
        path = corpus_file(corpus, "sampling.json")
        alpha = recorded_alpha(fs.read_json(path, what="corpus statistics"), f"corpus statistics {path}") if path else 0.3
    if problem := check_alpha(alpha):
        raise UserError(f"--alpha {problem}")
    source: list[str] = []

    def weights(measured: dict[str, int]) -> dict[str, float]:
        q, where = corpus_weights(corpus, alpha, buckets, shards, measured)
        source.append(where)
        return q

    sample, report = sample_sentences(shards, weights, sample_size, short, seed, max_sentence_bytes)
    fairseq = train_unigram(sample, vocab_size, character_coverage, byte_fallback, seed, threads, max_sentence_bytes)
    ours = our_layout(fairseq)
    # written beside the output and swapped in whole: a run that fails leaves the previous tokenizer
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (staging / HF_MODEL).write_bytes(fairseq)
        (staging / OUR_MODEL).write_bytes(ours)
        config = hf_config()
        fs.write_json(staging / TOKENIZER_CONFIG, config)
        fs.write_json(staging / SPECIAL_TOKENS, {k: v for k, v in config.items() if k.endswith("_token")})
        meta = {
            "vocab_size": vocab_size, "fingerprint": hashlib.sha256(ours).hexdigest(),
            "special_ids": {"bos": BOS_ID, "pad": PAD_ID, "eos": EOS_ID, "unk": UNK_ID, "mask": vocab_size - 1},
            "alpha": alpha, "weights_from": source[0], "corpus": corpus, "buckets": buckets or "all",
            "sample_size": sample_size, "short_languages": short, "character_coverage": character_coverage,
            "byte_fallback": byte_fallback, "seed": seed,
            "languages": {r.lang: {"q": r.q, "sentences": r.available, "target": r.target, "drawn": r.drawn}
                          for r in report},
        }
        fs.write_json(staging / META, meta)
        fs.swap_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return meta


def unspaced(piece: str) -> bool:
    """Whether ``piece`` is of a script written without spaces between words (:data:`UNSPACED`; its
    first character after the word mark): whole-word and span masking take each such piece for a
    word, as BERT's Chinese models take each character (a whitespace word there is a phrase or a
    whole line)."""
    first = piece.lstrip(WORD_MARK)[:1]
    return bool(first) and any(low <= ord(first) <= high for low, high in UNSPACED)


class Tokenizer:
    """The trained tokenizer in our id layout (``spm.model``)."""

    def __init__(self, model: bytes, meta: dict[str, Any]):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_proto=model)
        self.meta = meta
        self.vocab_size: int = self.sp.get_piece_size()
        self.bos_id, self.pad_id, self.eos_id, self.unk_id = BOS_ID, PAD_ID, EOS_ID, UNK_ID
        self.mask_id: int = self.vocab_size - 1
        self.special_ids: tuple[int, ...] = (BOS_ID, PAD_ID, EOS_ID, UNK_ID, self.mask_id)
        self.fingerprint: str = hashlib.sha256(model).hexdigest()
        pieces = [self.sp.id_to_piece(i) for i in range(self.vocab_size)]
        self.word_start = np.array([p.startswith(WORD_MARK) or unspaced(p) for p in pieces], dtype=np.bool_)
        self.word_start[list(self.special_ids)] = True

    @classmethod
    def load(cls, directory: str | Path) -> "Tokenizer":
        """Load ``spm.model`` + ``tokenizer_meta.json``; a missing or inconsistent directory is a UserError."""
        directory = Path(directory)
        model_path, meta_path = directory / OUR_MODEL, directory / META
        for path in (model_path, meta_path):
            if not path.is_file():
                raise UserError(f"tokenizer {directory}: no {path.name} (write one with `python -m pretrain tokenizer`)")
        model = model_path.read_bytes()
        meta = fs.read_json(meta_path, what="tokenizer")
        if not model:  # SentencePiece loads an empty model without a word: no pieces at all
            raise UserError(f"tokenizer {model_path}: an empty file, not a SentencePiece model")
        try:
            tokenizer = cls(model, meta)
        except RuntimeError as exc:
            raise UserError(f"tokenizer {model_path}: not a SentencePiece model ({exc})") from None
        if meta.get("fingerprint") != tokenizer.fingerprint or meta.get("vocab_size") != tokenizer.vocab_size:
            raise UserError(f"tokenizer {directory}: {OUR_MODEL} does not match {META} (fingerprint or vocab_size)")
        return tokenizer

    def encode(self, text: str) -> list[int]:
        """Our ids for ``text``, no special tokens added."""
        return self.sp.encode(text)

    def encode_batch(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        return self.sp.encode(texts, num_threads=threads)

    def decode(self, ids: Iterable[int]) -> str:
        """Text for ``ids``; special tokens decode to nothing."""
        return self.sp.decode([int(i) for i in ids])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="pipeline output directory (lang=<l>/bucket=<b>/part-*.arrow, "
                        "sampling.json), local or s3:// gs://")
    parser.add_argument("--out", required=True, type=path_argument,
                        help="tokenizer directory to write (a local folder)")
    parser.add_argument("--vocab-size", type=int, default=250_002,
                        help="final vocabulary size V incl. <s> <pad> </s> <unk> <mask> (default 250002, XLM-R's)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="sampling exponent, q_i ∝ p_i^alpha (default: sampling.json's alpha, else 0.3)")
    parser.add_argument("--buckets", nargs="+", action="extend", default=[], metavar="BUCKET",
                        help="use only these buckets, e.g. head middle (default: all)")
    parser.add_argument("--languages", nargs="+", action="extend", default=[], metavar="LANG", help="use only these languages (default: all)")
    parser.add_argument("--sample-size", type=int, default=2_000_000,
                        help="sentences (document lines) to draw in total, split by q_i (default 2000000)")
    parser.add_argument("--short-languages", choices=SHORT_POLICIES, default="repeat",
                        help="a language with fewer sentences than its share: repeat them up to the share (default) "
                             "or cap at what it has")
    parser.add_argument("--character-coverage", type=float, default=0.9995, help="SentencePiece character_coverage (default 0.9995)")
    parser.add_argument("--byte-fallback", action=argparse.BooleanOptionalAction, default=False,
                        help="byte pieces for unseen characters instead of <unk> (default off, as XLM-R; HF's "
                             "XLMRobertaTokenizer ignores byte fallback, so ids then differ on unseen characters)")
    parser.add_argument("--max-sentence-bytes", type=int, default=4192,
                        help="lines longer than this (UTF-8 bytes) are not sampled (SentencePiece's limit, default 4192)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sentence sample and of SentencePiece (default 0)")
    parser.add_argument("--threads", type=int, default=1,
                        help="SentencePiece training threads (default 1: byte-identical reruns)")
    stores.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    stores.open_stores(args, {"--corpus": args.corpus})
    meta = train_tokenizer(args.corpus, args.out, vocab_size=args.vocab_size, alpha=args.alpha, buckets=args.buckets,
                           languages=args.languages, sample_size=args.sample_size, short=args.short_languages,
                           character_coverage=args.character_coverage, byte_fallback=args.byte_fallback,
                           seed=args.seed, threads=args.threads, max_sentence_bytes=args.max_sentence_bytes)
    print(f"sample weights: {meta['weights_from']}")
    print(f"{'lang':<6} {'q':>7} {'sentences':>10} {'target':>9} {'drawn':>9}  note")
    for lang, row in meta["languages"].items():
        note = LanguageSample(lang, row["q"], row["sentences"], row["target"], row["drawn"]).note()
        print(f"{lang:<6} {row['q']:>7.4f} {row['sentences']:>10} {row['target']:>9} {row['drawn']:>9}  {note}")
    print(f"wrote {args.out}: vocab_size {meta['vocab_size']}, fingerprint {meta['fingerprint'][:12]}")
    return 0
