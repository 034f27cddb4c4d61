"""The ``near_dedup`` step: MinHash near-duplicate removal (the maths in ``minhash`` and, for
``scheme: datatrove``, ``minhash_datatrove``; the Beam stage in ``pipeline.transforms.near_dedup``).

Where it stands in ``steps:`` is where it runs: after ``lid`` (the default) it compares documents
within their language (``scope: language``); before ``lid`` it needs ``scope: global``.
"""
from __future__ import annotations

import dataclasses
import math
from ..util.errors import UserError
from .base import Step
from .minhash import SCOPES, SHINGLES, optimal_bands

SCHEMES = ("datasketch", "datatrove")
DATATROVE_BANDS = (14, 8)
"""datatrove's ``MinhashConfig`` buckets x hashes per bucket (FineWeb-2's)."""
DATATROVE_IGNORES = ("shingle", "char_ngram", "num_perm", "threshold", "verify", "verify_limit", "max_iterations")
"""Settings ``scheme: datatrove`` has no use for: set to anything but their defaults, they are refused."""
MAX_BANDS = 65535


@dataclasses.dataclass
class NearDupConfig:
    scheme: str = "datasketch"
    """datasketch (our shingles, datasketch's permutations, LSH with verification, distributed clustering, smallest
    id kept) or datatrove (FineWeb-2's: datatrove's MinhashDedup stages; uses word_ngram, bands, rows, seed and scope only, and refuses the others)."""
    shingle: str = "auto"
    """word, char, or auto (character shingles for zh, ja, th, lo, km, my, bo, yue, wuu, under scope global for texts mostly in their scripts; word shingles otherwise)."""
    word_ngram: int = 5
    """Words per word shingle."""
    char_ngram: int = 5
    """Characters per character shingle."""
    num_perm: int = 128
    """MinHash permutations (signature length)."""
    threshold: float = 0.8
    """Jaccard similarity from which two documents are near-duplicates."""
    bands: int | None = None
    """LSH bands; with rows unset too, derived from threshold and num_perm (datasketch's optimizer, equal weights),
    or 14 for scheme datatrove (its buckets)."""
    rows: int | None = None
    """Signature positions per LSH band (bands x rows <= num_perm); 8 for scheme datatrove (its hashes per bucket)."""
    verify: bool = True
    """Keep a candidate pair only if its estimated Jaccard (from the signatures) reaches threshold."""
    verify_limit: int = 1000
    """With verify, in an LSH bucket of more members than this, a member past the first verify_limit
    (by id) that is not alike to the first is compared with those first members only, not with every
    other member (the first ones still are): such a bucket costs about 2 x its members x verify_limit
    signature comparisons, not its members squared (a bucket of 100,000 pages of one site's template,
    alike in a band but not in whole, would take about 18 minutes on one worker, from 42 s at 20,000,
    and such pages share buckets in several bands). Pairs of two later members can still join through
    a first member or through another band's bucket; no pair is joined without its check. Such
    buckets are counted (near_dedup/buckets_over_verify_limit)."""
    seed: int = 1
    """Seed of the MinHash permutations (datasketch's)."""
    scope: str = "language"
    """language (documents are compared within their lang only) or global."""
    max_iterations: int = 8
    """Large-star/small-star rounds of the connected components in the graph; edges still changing
    after them are joined in one worker (counter near_dedup/cc_not_converged: their nodes). The
    result is the same whatever the rounds; more rounds spread large graphs over the workers, each
    costs about 0.1 s of a run even when empty (the benchmark's 53,328 documents need 3)."""

    choices = {"scheme": SCHEMES, "shingle": SHINGLES, "scope": SCOPES}

    def validate(self) -> None:
        """Raise :class:`UserError` naming the first bad value."""
        def fail(message: str) -> None:
            raise UserError(message)

        if self.scheme not in SCHEMES:
            fail(f"scheme must be one of {', '.join(SCHEMES)}, got {self.scheme!r}")
        if self.shingle not in SHINGLES:
            fail(f"shingle must be one of {', '.join(SHINGLES)}, got {self.shingle!r}")
        if self.scope not in SCOPES:
            fail(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        for name in ("word_ngram", "char_ngram", "num_perm", "verify_limit", "max_iterations"):
            if getattr(self, name) < 1:
                fail(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.threshold <= 1.0:
            fail(f"threshold must be in (0, 1], got {self.threshold}")
        if not 0 <= self.seed < 2**32:
            fail(f"seed must be in [0, 2**32), got {self.seed}")
        if (self.bands is None) != (self.rows is None):
            fail("set both bands and rows, or neither (derived from threshold and num_perm)")
        if self.bands is not None and self.rows is not None:
            if self.bands < 1 or self.rows < 1:
                fail(f"bands and rows must be >= 1, got {self.bands} x {self.rows}")
            if self.bands > MAX_BANDS:  # (a band's number travels as 16 bits)
                fail(f"bands must be <= {MAX_BANDS}, got {self.bands}")
            if self.scheme == "datasketch" and self.bands * self.rows > self.num_perm:
                fail(f"bands x rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")

        if self.scheme == "datatrove":
            ignored = [f.name for f in dataclasses.fields(self)
                       if f.name in DATATROVE_IGNORES and getattr(self, f.name) != f.default]
            if ignored:
                fail(f"scheme datatrove (FineWeb-2's MinHash) does not use {', '.join(ignored)}: it takes word_ngram, "
                     "bands, rows, seed and scope only (remove them, or use scheme datasketch)")

    def band_rows(self) -> tuple[int, int]:
        """``(bands, rows)``: as configured, or minimizing false positives + false negatives."""
        if self.bands is not None and self.rows is not None:
            return self.bands, self.rows
        if self.scheme == "datatrove":
            return DATATROVE_BANDS
        return optimal_bands(self.threshold, self.num_perm)

    def min_matches(self) -> int:
        """Matching signature positions an estimated Jaccard >= threshold needs."""
        return math.ceil(self.threshold * self.num_perm - 1e-9)


CLUSTER_SIZES = "near_dedup_cluster_sizes"
"""stats.json counters group: near-duplicate clusters (2+ documents) by size."""


class NearDedup(Step):
    """Global step: removes every document of a near-duplicate cluster but one (the smallest id;
    datatrove's union-find root under ``scheme: datatrove``), and sets ``minhash_cluster_size`` on the kept one."""

    name = "near_dedup"
    Config = NearDupConfig
    counters = ("documents_in", "documents_out", "near_duplicate", "no_shingles", "signatures", "candidate_buckets",
                "buckets_over_verify_limit", "edges", "clusters", "cc_not_converged", "tokenizer_fallback")
    provides = ("minhash_cluster_size",)
    transform = "pipeline.transforms.near_dedup:NearDedupTransform"

    @classmethod
    def requires(cls, cfg: NearDupConfig) -> tuple[str, ...]:
        return ("lang",) if cfg.scope == "language" else ()

    @classmethod
    def splits_words(cls, cfg: NearDupConfig) -> bool:
        return cfg.scheme == "datatrove"  # (FineWeb-2's shingles are words of the document's language)

    def prepare(self) -> None:
        """``scheme: datatrove`` hashes shingles with xxhash and finds numbers with regex (the
        ``quality`` extra): missing, it is one line before the job, not a failure in every worker."""
        import importlib.util

        missing = [m for m in ("xxhash", "regex") if self.cfg.scheme == "datatrove" and importlib.util.find_spec(m) is None]
        if missing:
            raise UserError(f"near_dedup.scheme datatrove needs {' and '.join(missing)}: pip install "
                            f"'polyglot-corpus[quality]' (or {' '.join(missing)})")
