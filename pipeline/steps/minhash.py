"""Near-duplicate maths, Beam-free: shingles, MinHash signatures, LSH band keys, candidate edges and
the star steps of connected components. The ``near_dedup`` step declares the stage
(``pipeline.steps.near_dedup``); ``pipeline.transforms.near_dedup`` runs it in Beam.

The stage, as datatrove / text-dedup do it but without an in-memory index on one worker:

1. **Shingles.** The text is lowercased; letters, combining marks and numbers form words,
   everything else separates them; every run of decimal digits becomes one ``0``, so dates and
   counters do not matter. Word shingles are ``word_ngram`` consecutive words; character shingles
   (``char_ngram`` consecutive word characters, separators dropped) serve scripts written without
   spaces (:data:`CHAR_SHINGLE_LANGS` under ``shingle: auto``; under ``scope: global``, texts
   mostly in their scripts, :data:`UNSPACED`). A document with fewer words
   (characters) than the n-gram size is one shingle; an empty document has none and is never a
   near-duplicate.
2. **Signatures.** Each shingle is hashed to 32 bits (a polynomial hash of its code points mixed
   by MurmurHash3's finalizer, vectorised with numpy) and fed to datasketch's default MinHash
   scheme (``affine32``: the same permutations from ``MinHash(num_perm, seed)``, the same
   arithmetic), so a signature equals ``MinHash(num_perm, seed, hashfunc=int)`` updated with the
   shingle hashes. Only the shingle hash differs from datasketch's default (SHA-1 of the shingle
   string, one Python call per shingle): ~10x faster per document, estimates alike.
   :func:`signatures` is the interface another backend would implement.
3. **LSH.** The signature is cut into ``bands`` x ``rows``; ``(scope, band, hash of the band)``
   is a bucket. Documents sharing a bucket are candidates. The shuffle does not carry one element
   per document and band: a batch of documents sends one element per ``(scope, partition)`` (the
   band hash modulo ``partitions``) with the rows of its band hashes there, and each partition
   finds its shared buckets with one sort (:func:`shared_buckets`). With ``verify`` (default), a
   bucket's members are joined (union-find) by their alike pairs, those whose estimated Jaccard
   (matching signature positions / ``num_perm``) reaches ``threshold``, which removes LSH false
   positives, and each group so joined is linked to its smallest id (:func:`bucket_edges`; in a
   bucket of more than ``verify_limit`` members a later member is checked against the first ones only);
   without it every member is linked to the bucket's smallest id (a star; datatrove pairs each
   document with the one before it in the bucket, a chain: the same components). A bucket of n
   members gives at most n - 1 edges.
4. **Connected components** by the alternating large-star / small-star algorithm (Kiveris et
   al., 2014), unrolled ``max_iterations`` times in the graph (a Beam graph is static); once a
   round changes nothing the edges leave the loop and the remaining rounds run empty. Edges
   still changing after the last round are joined in one worker, by union-find in memory
   (:func:`star_edges`; datatrove clusters all of a dump's pairs so), and counted as
   ``cc_not_converged``. At the end each component is a star around its smallest id, the kept
   document; the others are removed with ``duplicate_of`` set to it. A chain A~B~C is one
   cluster even if A and C are not alike.
5. **Join** by document id: kept documents get ``minhash_cluster_size`` (1 for singletons);
   removed ones are counted (``near_duplicate``) and, with ``write.removed``, written to
   ``removed/near_dedup/`` with ``duplicate_of``.

Document ids (WARC-Record-ID) are the graph's nodes; they are unique in a crawl (two documents
sharing one would be one node: the join that applies the verdicts stops the run there). The result depends only on the documents and the config, not on bundling or workers.
"""
from __future__ import annotations

import functools
import unicodedata
from typing import Iterable, Protocol, Sequence

import numpy as np

from .minhash_datatrove import union_find

SHINGLES = ("auto", "word", "char")
SCOPES = ("language", "global")
CHAR_SHINGLE_LANGS = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo", "yue", "wuu"})
"""Languages (fastText lid.176 labels) written without spaces between words."""
UNSPACED = ((0x0E00, 0x0EFF), (0x0F00, 0x0FFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x3040, 0x30FF), (0x31F0, 0x31FF),
            (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF66, 0xFF9F), (0x20000, 0x323AF))
"""Code points of the scripts of :data:`CHAR_SHINGLE_LANGS`, written without spaces between words:
Thai and Lao, Tibetan, Myanmar, Khmer, kana, Han."""
EMPTY = np.uint32(0xFFFFFFFF)
"""Every position of the signature of a document without shingles (datasketch's empty MinHash)."""

CHAR_BASE = 0x100000001B3
"""Base of the polynomial hash of a word's code points (odd, so invertible modulo 2**64)."""
NGRAM_BASE = 0x9E3779B97F4A7C15
"""Base of the polynomial hash of a shingle's units (word hashes or code points)."""

_U64 = np.uint64
_MASK64 = (1 << 64) - 1
_CHUNK_SHINGLES = 8192  # shingles permuted at once: (num_perm x chunk) uint32 stays in cache
_BATCH_CHARS = 1 << 20  # characters hashed at once: the power tables (2 x 2**21 x 8 bytes) fit


@functools.cache
def optimal_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """datasketch's ``MinHashLSH`` choice of (bands, rows) with equal FP/FN weights (``lsh._optimal_param``:
    the first pair, bands then rows ascending, with the least ``(FP + FN) / 2``), without importing
    datasketch and scipy under it (0.6-0.75 s in every process that runs near-dup: it held up the
    first SDK workers of a 2-worker run by 0.6 s). Its integrals are of ``1 - (1 - s^r)^b``, a
    polynomial of degree ``r * b <= num_perm``, which Gauss-Legendre quadrature with
    ``num_perm // 2 + 1`` nodes integrates exactly, where datasketch calls scipy's adaptive ``quad``
    (the same choice on a grid of thresholds and sizes: tests)."""
    nodes, weights = np.polynomial.legendre.leggauss(num_perm // 2 + 1)
    below, above = threshold * (nodes + 1) / 2, threshold + (1 - threshold) * (nodes + 1) / 2
    below_w, above_w = weights * threshold / 2, weights * (1 - threshold) / 2
    best, choice = float("inf"), (0, 0)
    for b in range(1, num_perm + 1):
        r = np.arange(1, num_perm // b + 1, dtype=np.float64)[:, None]
        false_positive = (1 - (1 - below ** r) ** b) @ below_w
        false_negative = (1 - above ** r) ** b @ above_w
        error = false_positive * 0.5 + false_negative * 0.5
        i = int(np.argmin(error))  # the first of equal ones, as datasketch's strict < keeps it
        if error[i] < best:
            best, choice = float(error[i]), (b, i + 1)
    return choice


def shingle_kind(lang: str | None, shingle: str, text: str | None = None) -> str:
    """``word`` or ``char`` for a document in ``lang`` under the configured ``shingle``. With
    ``text`` (``scope: global``, where documents of every language meet, before LID has labelled
    them or under two labels for one text) ``auto`` goes by the text's own script instead:
    ``char`` where most of the letters of its first 1,000 characters are of a script written
    without spaces (:data:`UNSPACED`)."""
    if shingle != "auto":
        return shingle
    if text is not None:
        letters = [ord(c) for c in text[:1000] if c.isalpha()]
        unspaced = sum(any(low <= c <= high for low, high in UNSPACED) for c in letters)
        return "char" if 2 * unspaced > len(letters) else "word"
    return "char" if lang in CHAR_SHINGLE_LANGS else "word"


# --------------------------------------------------------------------------- hashing

@functools.cache
def _fold_table() -> np.ndarray:
    """Code point -> itself for letters, marks and numbers (decimal digits -> "0"), 0 for separators."""
    n = 0x110000
    kind = np.fromiter(
        (2 if (cat := unicodedata.category(chr(c))) == "Nd" else cat[0] in "LMN" for c in range(n)), np.uint8, n)
    fold = np.where(kind == 1, np.arange(n, dtype=np.uint32), np.uint32(0))
    fold[kind == 2] = ord("0")
    return fold


@functools.lru_cache(maxsize=1)
def powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``base**k`` and ``base**-k`` modulo 2**64 for k < n (numpy integer arithmetic wraps)."""
    inverse = pow(CHAR_BASE, -1, 1 << 64)
    up, down = np.full(n, CHAR_BASE, _U64), np.full(n, inverse, _U64)
    up[0] = down[0] = 1
    return np.cumprod(up, dtype=_U64), np.cumprod(down, dtype=_U64)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (a bijection that spreads every input bit)."""
    h = h ^ (h >> _U64(33))
    h = h * _U64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> _U64(33))
    h = h * _U64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> _U64(33))


def _units(texts: Sequence[str], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """The words (as 64-bit hashes) or word characters of each text, and the text each belongs to."""
    lowered = [t.lower() for t in texts]
    starts = np.cumsum([0] + [len(t) + 1 for t in lowered[:-1]])
    # "\0" (a separator) between texts keeps words apart; offsets come from the lengths, so a
    # "\0" inside a text changes nothing.
    x = _fold_table()[np.frombuffer("\0".join(lowered).encode("utf-32-le", "surrogatepass"), np.uint32)]
    digit = x == ord("0")
    repeat = digit[1:] & digit[:-1]  # the rest of a run of digits: dropped, the run becomes one "0"
    if repeat.any():
        keep = np.concatenate([[True], ~repeat])
        starts = np.concatenate([[0], np.cumsum(keep)])[starts]
        x = x[keep]
    if kind == "char":
        at = np.flatnonzero(x)
        return x[at].astype(_U64), np.searchsorted(starts, at, side="right") - 1
    edges = np.diff((x != 0).view(np.int8), prepend=np.int8(0), append=np.int8(0))
    begin, end = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    up, down = powers(1 << max(21, len(x).bit_length()))
    prefix = np.zeros(len(x) + 1, _U64)
    np.cumsum(x.astype(_U64) * down[:len(x)], out=prefix[1:])
    # sum of x[k] * base**(end - 1 - k) over the word: position-independent polynomial hash
    words = fmix64(up[end - 1] * (prefix[end] - prefix[begin])) if len(begin) else np.empty(0, _U64)
    return words, np.searchsorted(starts, begin, side="right") - 1


def _ngram(values: Iterable[int]) -> int:
    """The polynomial n-gram hash of a short run of units, with Python integers (mod 2**64)."""
    h = 0
    for v in values:
        h = (h * NGRAM_BASE + int(v)) & _MASK64
    return h


def shingle_hashes(texts: Sequence[str], kind: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """32-bit hashes of every shingle of ``texts`` and the index of the text of each, in text order.

    A shingle of units ``u_0 .. u_{n-1}`` (word hashes or code points) hashes to
    ``fmix64(sum u_k * B**(n-1-k) mod 2**64) >> 32``; a text with fewer units than ``n`` has
    one shingle of all of them.
    """
    if not texts:
        return np.empty(0, np.uint32), np.empty(0, np.int64)
    units, owner = _units(texts, kind)
    m = len(units) - n + 1
    hashes = np.zeros(max(m, 0), _U64)
    for k in range(n if m > 0 else 0):
        hashes = hashes * _U64(NGRAM_BASE) + units[k:k + m]
    whole = owner[:m] == owner[n - 1:n - 1 + m] if m > 0 else np.zeros(0, bool)
    hashes, docs = hashes[whole], owner[:max(m, 0)][whole]
    counts = np.bincount(owner, minlength=len(texts))
    short = np.flatnonzero((counts > 0) & (counts < n))
    if len(short):
        first = np.searchsorted(owner, short)
        extra = [_ngram(units[f:f + counts[d]]) for d, f in zip(short, first)]
        hashes = np.concatenate([hashes, np.array(extra, _U64)])
        docs = np.concatenate([docs, short])
        order = np.argsort(docs, kind="stable")
        hashes, docs = hashes[order], docs[order]
    return (fmix64(hashes) >> _U64(32)).astype(np.uint32), docs


@functools.lru_cache(maxsize=8)
def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's affine32 permutation parameters ``(a, b)`` of ``MinHash(num_perm, seed)`` as column
    vectors (uint32), drawn as it draws them (numpy's ``RandomState(seed)``: an odd ``a``, then any
    ``b``) without importing it (scipy under it: :func:`optimal_bands`); equal to its own (tests)."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a[:, None].copy(), b[:, None].copy()


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer: datasketch's pre-mix of the input hash (affine32 scheme)."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def minhash(hashes: np.ndarray, docs: np.ndarray, n_docs: int, num_perm: int, seed: int) -> np.ndarray:
    """Signatures (``n_docs x num_perm`` uint32) of shingle hashes grouped by ``docs`` (sorted).

    Row ``d`` equals ``MinHash(num_perm, seed, hashfunc=int)`` updated with the hashes of
    document ``d``; a document without hashes gets :data:`EMPTY` everywhere.
    """
    a, b = permutations(num_perm, seed)
    out = np.full((n_docs, num_perm), EMPTY, np.uint32)
    if not len(hashes):
        return out
    hv = _fmix32(hashes)
    seg = np.flatnonzero(np.diff(docs, prepend=-1))  # first shingle of each document
    bounds = np.append(seg, len(hv))
    i = 0
    while i < len(seg):
        j = max(i + 1, int(np.searchsorted(bounds, bounds[i] + _CHUNK_SHINGLES, side="right")) - 1)
        j = min(j, len(seg))
        lo, hi = bounds[i], bounds[j]
        phv = np.multiply(a, hv[lo:hi])
        phv += b
        out[docs[seg[i:j]]] = np.minimum.reduceat(phv, seg[i:j] - lo, axis=1).T
        i = j
    return out


class SignatureParams(Protocol):
    """What :func:`signatures` reads of a near-dup config."""

    word_ngram: int
    char_ngram: int
    num_perm: int
    seed: int


def signatures(texts: Sequence[str], cfg: SignatureParams, kind: str = "word") -> np.ndarray:
    """MinHash signatures (``len(texts) x num_perm`` uint32) of texts shingled as ``kind``.

    The backend interface: another implementation (e.g. a native library) must return the same
    shape, EMPTY rows for texts without shingles, and comparable estimates.
    """
    n = cfg.char_ngram if kind == "char" else cfg.word_ngram
    out = np.empty((len(texts), cfg.num_perm), np.uint32)
    start = 0
    while start < len(texts):
        stop, chars = start, 0
        while stop < len(texts) and (stop == start or chars + len(texts[stop]) <= _BATCH_CHARS):
            chars += len(texts[stop])
            stop += 1
        hashes, docs = shingle_hashes(texts[start:stop], kind, n)
        out[start:stop] = minhash(hashes, docs, stop - start, cfg.num_perm, cfg.seed)
        start = stop
    return out


def is_empty(sigs: np.ndarray) -> np.ndarray:
    """Rows of signatures of documents without shingles."""
    return (sigs == EMPTY).all(axis=1)


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``n x bands`` int64 hashes of each band's rows (FNV-1a over the 32-bit values, mixed)."""
    keys = np.empty((len(sigs), bands), np.int64)
    for band in range(bands):
        h = np.full(len(sigs), 0xCBF29CE484222325, _U64)
        for col in sigs[:, band * rows:(band + 1) * rows].T.astype(_U64):
            h = (h ^ col) * _U64(0x100000001B3)
        keys[:, band] = fmix64(h).view(np.int64)
    return keys


def band_partitions(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The shuffle partition of each band hash of :func:`band_keys` (same shape)."""
    return (keys.view(_U64) % _U64(partitions)).astype(np.int64)


def shared_buckets(bands: np.ndarray, keys: np.ndarray) -> list[np.ndarray]:
    """The rows of every bucket (equal ``bands[i], keys[i]``) that two or more rows share: one index
    array per bucket, in (band, key) order."""
    order = np.lexsort((keys, bands))
    band, key = bands[order], keys[order]
    first = np.ones(len(order), bool)
    first[1:] = (band[1:] != band[:-1]) | (key[1:] != key[:-1])
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, len(order)))
    return [order[start:start + size] for start, size in zip(starts[sizes > 1], sizes[sizes > 1])]


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Estimated Jaccard similarity of two signatures (datasketch's ``MinHash.jaccard``)."""
    return float(np.count_nonzero(a == b)) / len(a)


def bucket_edges(members: Iterable[tuple[str, bytes]], min_matches: int | None,
                 verify_limit: int | None = None) -> tuple[list[tuple[str, str]], bool]:
    """Edges ``(smaller id, larger id)`` among the ``(id, signature bytes)`` sharing an LSH bucket,
    and whether the bucket had more members than ``verify_limit``.

    Without ``min_matches``: every member to the smallest id. With it: the members joined by pairs
    with at least ``min_matches`` equal signature positions, each such group as edges from its
    smallest id to each other member (a chain A~B~C~D in one bucket is one group, whatever the
    order of its ids: linking each member only to its smallest alike member split it in two when
    that member was D, say, and B's was A). A member alike to the first is joined to it without
    further comparisons; any other is compared with every member, or, past the first
    ``verify_limit`` members of a bucket of more, with those first members only (about
    ``2 x members x verify_limit`` comparisons in all; ``NearDupConfig.verify_limit``).
    """
    unique = dict(sorted(members, reverse=True))  # one signature per id, the smallest: deterministic
    ids = sorted(unique)
    capped = verify_limit is not None and len(ids) > verify_limit
    if len(ids) < 2:
        return [], capped
    if min_matches is None:
        return [(ids[0], other) for other in ids[1:]], capped
    sigs = np.frombuffer(b"".join(unique[i] for i in ids), np.uint32).reshape(len(ids), -1)
    first = sigs[:verify_limit] if capped else sigs
    root = list(range(len(ids)))  # union-find over the members' places (their ids' order)

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    to_first = np.count_nonzero(sigs == sigs[0], axis=1) >= min_matches
    for i in range(1, len(ids)):
        against = sigs if i < len(first) else first  # (a pair with a first member is seen from both sides)
        alike = [0] if to_first[i] else np.flatnonzero(np.count_nonzero(against == sigs[i], axis=1) >= min_matches).tolist()
        for j in alike:  # (a pair of members both alike to the first is joined through it)
            a, b = find(i), find(j)
            root[max(a, b)] = min(a, b)
    return [(ids[find(i)], ids[i]) for i in range(1, len(ids)) if find(i) != i], capped


# --------------------------------------------------------------------------- connected components

def large_star(node: str, neighbors: Iterable[str]) -> tuple[list[tuple[str, str]], bool]:
    """Link every larger neighbor of ``node`` to the smallest of its neighborhood (and itself).

    Returns the new edges and whether anything changed.
    """
    linked = set(neighbors)
    smallest = min(linked | {node})
    larger = sorted(v for v in linked if v > node)
    return [(smallest, v) for v in larger], bool(larger) and smallest != node


def small_star(node: str, smaller: Iterable[str]) -> tuple[list[tuple[str, str]], bool]:
    """Link ``node`` and its smaller neighbors to the smallest of them.

    Returns the new edges and whether anything changed.
    """
    linked = sorted(set(smaller))
    if not linked:
        return [], False
    smallest = linked[0]
    return [(smallest, v) for v in (*linked[1:], node)], len(linked) > 1


def resolve(node: str, neighbors: Iterable[str]) -> tuple[str | None, int]:
    """In a converged graph (stars around their smallest ids): ``(kept id, 0)`` for a removed
    node, ``(None, cluster size)`` for a kept one."""
    linked = set(neighbors)
    smaller = min((v for v in linked if v < node), default=None)
    return (None, 1 + len(linked)) if smaller is None else (smaller, 0)


def star_edges(edges: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The converged graph of ``edges`` at once, by union-find in memory: every component a star
    around its smallest id, each edge both ways (what the rounds converge to)."""
    removed, sizes = union_find(edges)
    members: dict[str, list[str]] = {root: [root] for root in sizes}
    for node, root in removed.items():
        members[root].append(node)
    stars = []
    for nodes in members.values():
        kept = min(nodes)
        stars += [pair for node in nodes if node != kept for pair in ((kept, node), (node, kept))]
    return stars
