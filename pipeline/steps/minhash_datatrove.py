"""Near-duplicates as datatrove's four MinHash stages find them (``near_dedup.scheme: datatrove``,
FineWeb-2's configuration), Beam-free; ``pipeline.transforms.near_dedup`` runs it.

1. **Shingles** (``MinhashDedupSignature.get_shingles``): the text simplified as datatrove's
   ``simplify_text`` does by default (lowercase; each number, with one decimal part, becomes
   ``0``, a digit being what the ``regex`` module's ``\\p{Nd}`` matches, as in datatrove;
   punctuation becomes spaces; whitespace runs become one space; accents dropped after NFD),
   split into words by the language's word tokenizer (``pipeline.steps.words``), and every run of
   ``word_ngram`` words joined by a space and hashed with xxHash64 (of its UTF-8 bytes). A text
   with fewer words has no shingle and no signature: it is never a near-duplicate.
2. **Signatures**: ``min((shingle * a + b) mod (2**61 - 1))`` per hash function, the products
   wrapping at 2**64 as numpy's do; ``a`` and ``b`` drawn from ``numpy.random.RandomState(seed)``
   as datatrove draws them; ``bands`` buckets of ``rows`` values each.
3. **Pairs** (``MinhashDedupBuckets``): in each bucket, the documents whose ``rows`` values are all
   equal, in document order, each paired with the one before it.
4. **Clusters** (``MinhashDedupCluster``): union-find with union by size over the pairs in
   datatrove's order (bucket, then signature, then document); on a tie the first document of the
   pair stays the root. The root is kept, with ``minhash_cluster_size``; the rest are removed.

Document order is datatrove's ``(task, index in task)``; here it is the document id, so the result
is what datatrove gives on the documents read in id order, and it does not depend on how a runner
splits the input. Clustering is one sequential pass per scope (language), as datatrove's single
clustering task.
"""
from __future__ import annotations

import functools
import re
import sys
import unicodedata
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from .punctuation import PUNCTUATION
from .words import tokenizer_for

if TYPE_CHECKING:
    import regex

MERSENNE = np.uint64((1 << 61) - 1)
WHITESPACE = re.compile(r"\s+")
TO_SPACES = str.maketrans(PUNCTUATION, " " * len(PUNCTUATION))
DEFAULT_LANG = "en"
"""The tokenizer of a document without ``lang`` (datatrove's default language)."""


@functools.cache
def _no_marks() -> dict[int, None]:
    """A ``str.translate`` table deleting every nonspacing mark (category Mn)."""
    return {c: None for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Mn"}


@functools.cache
def _numbers() -> regex.Pattern[str]:
    """datatrove's number pattern (one decimal part at most), compiled as it compiles it: with the
    ``regex`` module, whose ``\\p{Nd}`` follows its own Unicode tables, newer than ``re``'s ``\\d``."""
    import regex

    return regex.compile(r"\p{Nd}+([.,،٫⎖⎗⎘]{1}\p{Nd}+)?", regex.VERBOSE | regex.UNICODE)


def simplify(text: str) -> str:
    """datatrove's ``simplify_text`` with its default ``TextNormConfig``."""
    text = _numbers().sub("0", text.lower()).translate(TO_SPACES)
    text = WHITESPACE.sub(" ", text.strip())
    return unicodedata.normalize("NFD", text).translate(_no_marks()).strip()


def shingles(text: str, lang: str | None, n: int) -> np.ndarray:
    """xxHash64 of every ``n`` consecutive words of the simplified text (uint64)."""
    import xxhash

    words = tokenizer_for(lang or DEFAULT_LANG).words(simplify(text))
    digest = xxhash.xxh64_intdigest  # of the UTF-8 bytes: what xxhash < 4 made of a str
    return np.fromiter((digest(" ".join(words[i:i + n]).encode()) for i in range(len(words) - n + 1)), np.uint64)


@functools.lru_cache(maxsize=8)
def permutations(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)``, each ``(1, count)`` uint64, as datatrove draws them."""
    gen = np.random.RandomState(seed)
    return (gen.randint(1, MERSENNE, dtype=np.uint64, size=(1, count)),
            gen.randint(0, MERSENNE, dtype=np.uint64, size=(1, count)))


def signature(hashes: np.ndarray, count: int, seed: int) -> np.ndarray | None:
    """The ``count`` minimum permuted hashes of a document's shingles (None without shingles)."""
    if not len(hashes):
        return None
    a, b = permutations(count, seed)
    return ((hashes[:, None] * a + b) % MERSENNE).min(axis=0)


def band_keys(sig: np.ndarray, bands: int, rows: int) -> list[bytes]:
    """Each bucket's ``rows`` values as big-endian bytes: bytes order is datatrove's numeric order."""
    raw = sig[:bands * rows].astype(">u8").tobytes()
    width = rows * 8
    return [raw[i * width:(i + 1) * width] for i in range(bands)]


def run_pairs(ids: Iterable[str]) -> list[tuple[str, str]]:
    """The pairs of one bucket's equal signatures: each document (by id) with the one before it."""
    ordered = sorted(set(ids))
    return list(zip(ordered, ordered[1:]))


def union_find(pairs: Sequence[tuple[str, str]]) -> tuple[dict[str, str], dict[str, int]]:
    """``({removed id: kept id}, {kept id: cluster size})`` of pairs taken in order, as
    ``MinhashDedupCluster``: union by size, the first of a pair's roots kept on a tie."""
    parent: dict[str, str] = {}
    size: dict[str, int] = {}

    def root(x: str) -> str:
        path = []
        while parent.get(x, x) != x:
            path.append(x)
            x = parent[x]
        for p in path:  # path compression (changes no root)
            parent[p] = x
        return x

    for a, b in pairs:
        root_a, root_b = root(a), root(b)
        if root_a == root_b:
            continue
        size_a, size_b = size.get(root_a, 1), size.get(root_b, 1)
        if size_a < size_b:
            root_a, root_b = root_b, root_a
        parent[root_b] = root_a
        parent.setdefault(root_a, root_a)
        size[root_a] = size_a + size_b
        size.pop(root_b, None)
    removed = {node: root(node) for node in parent if root(node) != node}
    return removed, size
