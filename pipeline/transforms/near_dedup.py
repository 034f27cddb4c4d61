"""The ``near_dedup`` step in Beam: band keys, LSH buckets, connected components unrolled in the
graph (or, for ``scheme: datatrove``, datatrove's pairs and one union-find per scope), and the join
that keeps one document per cluster (the maths: ``pipeline.steps.minhash`` and ``minhash_datatrove``)."""
from __future__ import annotations

import pickle
from typing import Any, Iterable, Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindow, GlobalWindows
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from ..output.shards import stable_hash
from ..steps.base import Document, RunInfo
from ..steps.dedup import auto_partitions
from ..steps.minhash import (_fold_table, band_keys, band_partitions, bucket_edges, is_empty, large_star, resolve,
                             shared_buckets, shingle_kind, signatures, small_star, star_edges)
from ..steps.minhash_datatrove import (DEFAULT_LANG, band_keys as datatrove_band_keys, run_pairs, shingles, signature,
                                      union_find)
from ..steps.near_dedup import CLUSTER_SIZES, NearDedup, NearDupConfig
from ..steps.words import tokenizer_for
from ..util.errors import StepFailed
from .apply import REMOVED, removed_record
from .counting import MAIN, Counted, CountingDoFn
from .scratch import Pickled, PicklingDoFn, UnpicklingDoFn


class _Star(beam.DoFn):
    """A large-star or small-star step on ``(node, neighbors)``; ``changed`` gets a 1 per bundle that
    changed. A large star's edges come out keyed by their larger end, for the small star after it; a
    small star's both ways, for the next round's large star. Given the round before's ``changed``
    (side inputs ``large`` and ``small``), a large star after a round that changed nothing passes
    its node's edges on to ``done`` as they are: the graph has converged."""

    def __init__(self, small: bool) -> None:
        super().__init__()
        self.step = small_star if small else large_star
        self.small = small
        self.changed = False

    def start_bundle(self) -> None:
        self.changed = False

    def process(self, item: tuple[str, Iterable[str]], large: list[int] | None = None,
                small: list[int] | None = None) -> Iterator[Any]:
        if not _active(large, small):
            node, neighbors = item
            for neighbor in neighbors:
                yield beam.pvalue.TaggedOutput("done", (node, neighbor))
            return
        edges, changed_now = self.step(*item)
        self.changed |= changed_now
        for edge in edges:
            yield from _both_ways(edge) if self.small else (_by_larger(edge),)

    def finish_bundle(self) -> Iterator[Any]:
        if self.changed:
            yield beam.pvalue.TaggedOutput("changed", WindowedValue(1, MIN_TIMESTAMP, (GlobalWindow(),)))


class _Route(beam.DoFn):
    """After the last round: edges go on (to :class:`_Finish`) while that round changed the graph,
    else they are ``done`` (converged)."""

    def process(self, edge: tuple[str, str], large: list[int] | None = None,
                small: list[int] | None = None) -> Iterator[Any]:
        yield edge if _active(large, small) else beam.pvalue.TaggedOutput("done", edge)


def _active(large: list[int] | None, small: list[int] | None) -> bool:
    """Whether a round is still needed: the first one always (no side inputs), later ones while
    the round before (its large and small stars' ``changed`` flags) changed the graph."""
    return large is None or any(large) or any(small or ())


class _Resolve(CountingDoFn):
    """(node, neighbors) -> main ``(node, kept id)``, or ``(node, cluster size)`` to ``size`` if kept."""

    def __init__(self) -> None:
        super().__init__(NearDedup.name)

    def process(self, item: tuple[str, Iterable[str]]) -> Iterator[tuple[str, tuple[str, Any]]]:
        node, neighbors = item
        kept, size = resolve(node, neighbors)
        if kept is None:
            self.count("clusters")
            yield beam.pvalue.TaggedOutput("size", (node, size))
        else:
            yield node, kept


class _Finish(CountingDoFn):
    """All edges still changing after the last round (one key) -> the converged stars, both ways;
    their nodes are counted as ``cc_not_converged``."""

    def __init__(self) -> None:
        super().__init__(NearDedup.name)

    def process(self, item: tuple[int, Iterable[tuple[str, str]]]) -> Iterator[tuple[str, str]]:
        stars = star_edges(list(item[1]))
        self.count("cc_not_converged", len({node for node, _ in stars}))
        yield from stars


def _both_ways(edge: tuple[str, str]) -> tuple[tuple[str, str], tuple[str, str]]:
    return edge, (edge[1], edge[0])


def _by_larger(edge: tuple[str, str]) -> tuple[str, str]:
    return (edge[1], edge[0]) if edge[0] < edge[1] else edge


class ConnectedComponents(beam.PTransform):
    """Edges ``(a, b)`` -> ``main``: ``(id, kept id)`` per non-kept node; ``size``: ``(kept id, size)``.

    The kept id of a component is its smallest id. Each round is a large-star and a small-star
    step; once a round changes nothing (side inputs tell the next round's large star), the edges
    leave the loop and later rounds run empty, so the work follows the rounds needed, not
    ``max_iterations``. Every round is four transforms (two groupings and the two steps, each step
    keying its output for the next grouping, the large star routing converged edges out), as each
    one, even empty, costs the graph's build and the runner's scheduling time. Edges still changing
    after the last round are joined in one worker by union-find (:class:`_Finish`), so the
    components are exact whatever ``max_iterations``; their nodes are counted as
    ``cc_not_converged``.
    """

    def __init__(self, max_iterations: int) -> None:
        super().__init__()
        self.max_iterations = max_iterations

    def expand(self, edges: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        done = []
        edges = edges | "BothWays" >> beam.FlatMap(_both_ways)
        changed: dict[str, beam.pvalue.AsList] = {}  # the round before's flags
        for i in range(self.max_iterations):
            large = (
                edges
                | f"LargeStar{i}/Group" >> beam.GroupByKey()
                | f"LargeStar{i}/Link" >> beam.ParDo(_Star(small=False), **changed).with_outputs(
                    "changed", "done", main="edges")
            )
            small = (
                large.edges
                | f"SmallStar{i}/Group" >> beam.GroupByKey()
                | f"SmallStar{i}/Link" >> beam.ParDo(_Star(small=True)).with_outputs("changed", main="edges")
            )
            done.append(large.done)
            changed = {"large": beam.pvalue.AsList(large.changed), "small": beam.pvalue.AsList(small.changed)}
            edges = small.edges
        routed = edges | "Route" >> beam.ParDo(_Route(), **changed).with_outputs("done", main="active")
        finished = (routed.active
                    | "Finish/Key" >> beam.Map(lambda edge: (0, edge))
                    | "Finish/Group" >> beam.GroupByKey()
                    | "Finish/Stars" >> Counted(_Finish()))
        return (
            (*done, routed.done, finished)
            | "Resolve/Flatten" >> beam.Flatten()
            | "Resolve/Group" >> beam.GroupByKey()
            | "Resolve/Roots" >> Counted(_Resolve(), outputs=("size",))
        )


BandRows = tuple[list[str], bytes, bytes, bytes, bytes]
"""A batch's band hashes in one partition of a scope: the documents' ids and signatures (uint32 x
num_perm each; empty without ``verify``), then per row the document (int32, into those), the band
(uint16) and the band hash (int64)."""


class BandKeys(PicklingDoFn, CountingDoFn):
    """A batch of documents -> ``((scope, partition), BandRows)`` per partition its band hashes fall
    in, pickled (:class:`ScratchPickles`: in a file of the scratch folder where there is one, so
    that the rows, each document's signature once per partition, do not go through the driver:
    0.7 s of its CPU in a 2-worker run of the 50 MB benchmark)."""

    def __init__(self, cfg: NearDupConfig, partitions: int, scratch: str = "") -> None:
        super().__init__(NearDedup.name)
        self.cfg, self.partitions, self.scratch = cfg, partitions, scratch

    def setup(self) -> None:
        self.bands, self.rows = self.cfg.band_rows()
        _fold_table()  # ~0.3 s per worker process, here rather than in the first bundle

    def process(self, batch: Sequence[Document]) -> Iterator[tuple[tuple[str, int], Pickled]]:
        cfg = self.cfg
        kinds: dict[str, list[int]] = {}
        for i, doc in enumerate(batch):
            text = doc["text"] if cfg.scope == "global" else None
            kinds.setdefault(shingle_kind(doc.get("lang"), cfg.shingle, text), []).append(i)
        sigs = np.empty((len(batch), cfg.num_perm), np.uint32)
        for kind, index in kinds.items():
            sigs[index] = signatures([batch[i]["text"] for i in index], cfg, kind)
        keys = band_keys(sigs, self.bands, self.rows)
        parts = band_partitions(keys, self.partitions)
        empty = is_empty(sigs)
        if empty.any():
            self.count("no_shingles", int(empty.sum()))
        scopes: dict[str, list[int]] = {}
        for i, doc in enumerate(batch):
            if not empty[i]:
                scopes.setdefault((doc.get("lang") or "") if cfg.scope == "language" else "", []).append(i)
        width = cfg.num_perm if cfg.verify else 0  # unverified: ids suffice
        found: list[tuple[tuple[str, int], bytes]] = []
        for scope, members in sorted(scopes.items()):
            index = np.array(members)
            scoped = parts[index]
            for part in np.unique(scoped):
                doc_at, band_at = np.nonzero(scoped == part)
                used, local = np.unique(doc_at, return_inverse=True)
                docs = index[used]
                rows: BandRows = ([batch[i]["id"] for i in docs], sigs[docs, :width].tobytes(),
                                  local.astype(np.int32).tobytes(), band_at.astype(np.uint16).tobytes(),
                                  keys[index[doc_at], band_at].tobytes())
                found.append(((scope, int(part)), pickle.dumps(rows, pickle.HIGHEST_PROTOCOL)))
        self.count("signatures", len(batch))
        yield from self.put(found)


class CandidateEdges(UnpicklingDoFn):
    """A partition's :data:`BandRows` (:class:`BandKeys`'s) -> the edges of each bucket two or more rows share
    (:func:`bucket_edges`). The rows' bands and hashes are read first; ids and signatures only
    for the rows of shared buckets, in a second pass over the partition."""

    def __init__(self, min_matches: int | None, verify_limit: int | None = None) -> None:
        super().__init__(NearDedup.name)
        self.min_matches, self.verify_limit = min_matches, verify_limit

    def process(self, item: tuple[tuple[str, int], Iterable[Pickled]]) -> Iterator[tuple[str, str]]:
        parts: list[BandRows] = [self.unpickler.load(ref) for ref in item[1]]
        bands, keys, sizes = [], [], []
        for _ids, _sigs, _docs, band, key in parts:
            bands.append(np.frombuffer(band, np.uint16))
            keys.append(np.frombuffer(key, np.int64))
            sizes.append(len(keys[-1]))
        buckets = shared_buckets(np.concatenate(bands), np.concatenate(keys)) if keys else []
        if not buckets:
            return
        starts = np.cumsum([0, *sizes[:-1]])
        wanted = np.unique(np.concatenate(buckets))
        element = np.searchsorted(starts, wanted, side="right") - 1
        members: dict[int, tuple[str, bytes]] = {}
        for e, (ids, sigs, docs, _band, _key) in enumerate(parts):
            rows = wanted[element == e]
            if not len(rows):
                continue
            at = np.frombuffer(docs, np.int32)[rows - starts[e]]
            width = len(sigs) // len(ids)
            for row, doc in zip(rows.tolist(), at.tolist()):
                members[row] = ids[doc], sigs[doc * width:(doc + 1) * width]
        for bucket in buckets:
            edges, capped = bucket_edges([members[row] for row in bucket.tolist()], self.min_matches, self.verify_limit)
            self.count("candidate_buckets")
            if capped:
                self.count("buckets_over_verify_limit")
            self.count("edges", len(edges))
            yield from edges


class DatatroveBandKeys(CountingDoFn):
    """A document -> ``((scope, bucket, its values), id)`` per bucket (datatrove's signature stage)."""

    def __init__(self, cfg: NearDupConfig) -> None:
        super().__init__(NearDedup.name)
        self.cfg = cfg

    def setup(self) -> None:
        self.bands, self.rows = self.cfg.band_rows()  # in the worker: see BandKeys.setup

    def process(self, doc: Document) -> Iterator[tuple[tuple[str, int, bytes], str]]:
        cfg = self.cfg
        self.count("signatures")
        lang = doc.get("lang") or DEFAULT_LANG
        if tokenizer_for(lang).fallback:
            self.count(f"tokenizer_fallback/{lang}")
        sig = signature(shingles(doc["text"], lang, cfg.word_ngram), self.bands * self.rows, cfg.seed)
        if sig is None:
            self.count("no_shingles")
            return
        scope = (doc.get("lang") or "") if cfg.scope == "language" else ""
        for band, key in enumerate(datatrove_band_keys(sig, self.bands, self.rows)):
            yield (scope, band, key), doc["id"]


class BucketPairs(CountingDoFn):
    """A bucket's equal signatures -> ``(scope, ((bucket, values, i), pair))``: its pairs, each with
    its place in datatrove's order of pairs."""

    def __init__(self) -> None:
        super().__init__(NearDedup.name)

    def process(self, item: tuple[tuple[str, int, bytes], Iterable[str]]) -> Iterator[tuple[str, Any]]:
        (scope, band, key), ids = item
        pairs = run_pairs(ids)
        if not pairs:
            return
        self.count("candidate_buckets")
        self.count("edges", len(pairs))
        for i, pair in enumerate(pairs):
            yield scope, ((band, key, i), pair)


class UnionFind(CountingDoFn):
    """A scope's pairs -> main ``(id, kept id)`` per removed document, ``size``: ``(kept id, size)``."""

    def __init__(self) -> None:
        super().__init__(NearDedup.name)

    def process(self, item: tuple[str, Iterable[Any]]) -> Iterator[Any]:
        removed, sizes = union_find([pair for _, pair in sorted(item[1])])
        yield from sorted(removed.items())
        for kept, size in sorted(sizes.items()):
            self.count("clusters")
            yield beam.pvalue.TaggedOutput("size", (kept, size))


class ApplyNearDup(UnpicklingDoFn):
    """(partition, {doc: :class:`DocsByPartition`'s chunks, parent: ``(id, kept id)``, size: ``(kept
    id, cluster size)``}) -> each kept document with ``minhash_cluster_size``, or its removal."""

    def __init__(self, write_removed: bool) -> None:
        super().__init__(NearDedup.name)
        self.write_removed = write_removed

    def process(self, item: tuple[int, dict[str, Iterable[Any]]]) -> Iterator[Any]:
        _, grouped = item
        parents: dict[str, str] = {}
        for node, parent in grouped["parent"]:
            parents[node] = min(parent, parents.get(node, parent))
        sizes = dict(grouped["size"])
        sources: dict[str, str] = {}  # every document of an id meets here, so an id on two is found here
        for ref in grouped["doc"]:
            for doc_id, doc in self.unpickler.load(ref):
                if doc_id in sources:
                    raise StepFailed(f"step {NearDedup.name}: record id {doc_id} is on two documents, of "
                                     f"{sources[doc_id]} and of {doc.get('source')}: near-dup knows a document by "
                                     "its WARC-Record-ID, which must be unique; give each record an id of its own, "
                                     "or leave near_dedup out")
                sources[doc_id] = doc.get("source", "")
                self.count("documents_in")
                if doc_id in parents:
                    self.count("near_duplicate")
                    if doc.get("lang"):
                        self.count(f"near_duplicate/{doc['lang']}")
                    if self.write_removed:
                        yield beam.pvalue.TaggedOutput(REMOVED, removed_record(doc, "near_duplicate",
                                                                              duplicate_of=parents[doc_id]))
                    continue
                self.count("documents_out")
                size = sizes.get(doc_id, 1)
                if size > 1:  # one count per cluster: its kept document
                    self.count(str(size), step=CLUSTER_SIZES)
                yield {**doc, "minhash_cluster_size": size}


def partition_of(doc_id: str, partitions: int) -> int:
    """The partition of the join a document and its cluster's verdict meet in."""
    return stable_hash(doc_id) % partitions


def _by_partition(pair: tuple[str, Any], partitions: int) -> tuple[int, tuple[str, Any]]:
    """A verdict ``(id, value)`` keyed by :func:`partition_of` its id."""
    return partition_of(pair[0], partitions), pair


class DocsByPartition(PicklingDoFn):
    """Documents -> ``(partition, Pickled [(id, document), ...])``: a bundle's documents in chunks of
    about :data:`CHUNK_BYTES` of text, each chunk cut by :func:`partition_of` its ids, so that the
    join with the clusters' verdicts groups a partition's chunks, not each document: in the
    FnApiRunner a join's Flatten is a stage of its own, and one element per document (46,381 on
    the 50 MB benchmark) took 0.22-0.24 s of it at 2 workers, and the driver grouped as many keys.
    With a scratch folder the chunks wait in files there, and only where each lies moves (each
    document went through the driver four times before: 1.1 s of its CPU). The join has as many
    partitions as exact dedup's, and at least one per input file: a partition's group holds about
    what one input file keeps (Beam's CoGroupByKey lists a group's values; on runners without a
    scratch folder those are the documents' pickles), however large the run; with many files a
    chunk is cut into about one piece a document, as the join by id had. On the 50 MB benchmark
    (8 files, 8 partitions) the apply stage's two workers ended within 0.06 s of each other; with
    32 partitions, 0.09-0.40 s apart (two runs each)."""

    CHUNK_BYTES = 4 << 20

    def __init__(self, scratch: str, partitions: int) -> None:
        super().__init__()
        self.scratch, self.partitions = scratch, partitions

    def start_bundle(self) -> None:
        super().start_bundle()
        self.chunk: dict[int, list[tuple[str, Document]]] = {}
        self.size = 0  # characters of text in the chunk

    def process(self, doc: Document) -> Iterator[tuple[int, Pickled]]:
        self.chunk.setdefault(partition_of(doc["id"], self.partitions), []).append((doc["id"], doc))
        self.size += len(doc["text"])
        if self.size >= self.CHUNK_BYTES:
            yield from self._flush()

    def finish_bundle(self) -> list[WindowedValue]:
        flushed = [GlobalWindows.windowed_value(keyed) for keyed in self._flush()]
        super().finish_bundle()
        return flushed

    def _flush(self) -> list[tuple[int, Pickled]]:
        chunk, self.chunk, self.size = self.chunk, {}, 0
        return list(self.put([(part, pickle.dumps(docs, pickle.HIGHEST_PROTOCOL))
                              for part, docs in sorted(chunk.items())]))


class NearDedupTransform(beam.PTransform):
    """Documents -> tagged outputs ``main`` (kept, with ``minhash_cluster_size``) and ``removed``."""

    def __init__(self, step: NearDedup, run: RunInfo | None = None) -> None:
        super().__init__()
        step.cfg.validate()
        run = run or step.run
        self.cfg, self.write_removed, self.scratch = step.cfg, run.write_removed, run.scratch
        self.partitions = auto_partitions(run.n_files)  # as exact dedup's: a key ~ 1/partitions of a scope
        self.join_partitions = max(self.partitions, run.n_files)  # (DocsByPartition)

    def expand(self, docs: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        cfg = self.cfg
        if cfg.scheme == "datatrove":
            clusters = (
                docs
                | "BandKeys" >> Counted(DatatroveBandKeys(cfg))
                | "GroupByBucket" >> beam.GroupByKey()
                | "BucketPairs" >> Counted(BucketPairs())
                | "GroupByScope" >> beam.GroupByKey()
                | "UnionFind" >> Counted(UnionFind(), outputs=("size",))
            )
        else:
            edges = (
                docs
                | "Batch" >> beam.BatchElements(min_batch_size=256, max_batch_size=2048)
                | "BandKeys" >> Counted(BandKeys(cfg, self.partitions, self.scratch))
                | "GroupByPartition" >> beam.GroupByKey()
                | "CandidateEdges" >> Counted(CandidateEdges(cfg.min_matches() if cfg.verify else None,
                                                             cfg.verify_limit if cfg.verify else None))
            )
            clusters = edges | "Components" >> ConnectedComponents(cfg.max_iterations)
        partitions = self.join_partitions
        return (
            {"doc": docs | "DocsByPartition" >> beam.ParDo(DocsByPartition(self.scratch, partitions)),
             "parent": clusters[MAIN] | "ParentsByPartition" >> beam.Map(_by_partition, partitions),
             "size": clusters["size"] | "SizesByPartition" >> beam.Map(_by_partition, partitions)}
            | "JoinByPartition" >> beam.CoGroupByKey()
            | "Apply" >> Counted(ApplyNearDup(self.write_removed), outputs=(REMOVED,))
        )
