"""The ccnet profile against CCNet's own code: the same documents, field for field.

CCNet's `mine` steps (cc_net 1.0.0 from its PyPI sdist, which workflows/setup.sh caches) run here
as CCNet runs them: its WET reader, HashesCollector per shard, DuplicatesRemover over a group of
hash files, Classifier, MultiSentencePiece, DocLM and PerplexityBucket. The only change to CCNet is
the fix of its issue #16 (its reader takes Content-Length from the 9th header line, which current
WET files fill with Content-Type). Each input file is one CCNet shard.
"""
from __future__ import annotations

import gzip
import json
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import kenlm
import numpy as np
import pytest
import sentencepiece as spm
from conftest import gz, warc_record
from reference_data import CCNET, SAMPLE, split_reference

from pipeline.__main__ import main
from pipeline.steps.normalize import normalize_for_dedup
from pipeline.steps.perplexity import document_perplexity, write_cutoffs
from pipeline.output.shards import read_shard

HEADER_BUG = "length = int(headers[8].split()[1])"
HEADER_FIX = 'length = int(next(h for h in headers if h.startswith("Content-Length:")).split()[1])'
PROFILE = str(Path(__file__).parents[1] / "configs" / "corpus" / "ccnet.yaml")
CUTOFF_LANGS = ["de", "en", "fr", "ru", "zh", "el"]  # the others have an LM but no cutoffs: bucket "all"


@pytest.fixture(scope="module")
def ccnet() -> Iterator[types.SimpleNamespace]:
    """CCNet's modules, imported from its sdist, with the header fix of CCNet's issue #16."""
    root = str(CCNET.parent)
    sys.path.insert(0, root)
    try:
        import cc_net  # noqa: F401  (the package, so that the fixed reader can take its place)

        source = (CCNET / "process_wet_file.py").read_text(encoding="utf-8")
        assert source.count(HEADER_BUG) == 1
        reader = types.ModuleType("cc_net.process_wet_file")
        reader.__file__ = str(CCNET / "process_wet_file.py")
        sys.modules[reader.__name__] = reader
        exec(compile(source.replace(HEADER_BUG, HEADER_FIX), reader.__file__, "exec"), reader.__dict__)
        from cc_net import dedup, jsonql, perplexity, split_by_lang

        yield types.SimpleNamespace(reader=reader, dedup=dedup, jsonql=jsonql, perplexity=perplexity,
                                    split_by_lang=split_by_lang)
    finally:
        sys.path.remove(root)
        for name in [n for n in sys.modules if n == "cc_net" or n.startswith("cc_net.")]:
            del sys.modules[name]


def lid_model() -> Path:
    from pipeline.steps.lid import default_model_path

    return Path(default_model_path())


def ccnet_mine(ccnet: types.SimpleNamespace, files: list[Path], hash_in_mem: int, lms: Path,
               cutoffs: Path, work: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """CCNet's hashes and mine steps (mine.py: _hashes_shard, _mine_shard), one shard per file;
    the cutoff file is written from CCNet's own perplexities before bucketing. Keyed by (url, digest)."""
    def shard(path: Path) -> Iterator[dict]:  # CCSegmentsReader.__iter__, on a local segment
        for doc in ccnet.reader.parse_warc_file(ccnet.jsonql.open_read(path), min_len=300):
            doc["cc_segment"] = path.name
            yield doc

    hashes = []
    for i, path in enumerate(files):
        hashes.append(work / f"{i:04d}.bin")
        for _ in ccnet.dedup.HashesCollector(field="raw_content", output=hashes[-1]).map(shard(path)):
            pass
    groups = list(ccnet.jsonql.grouper(hashes, hash_in_mem))
    langs = sorted(p.name.removesuffix(".arpa.bin") for p in lms.glob("*.arpa.bin"))
    mined: list[dict] = []
    for i, path in enumerate(files):
        docs: Iterator[Any] = shard(path)
        for step in (
            ccnet.dedup.DuplicatesRemover(field="raw_content", hashes_files=groups[i // hash_in_mem]),
            ccnet.split_by_lang.Classifier(model=lid_model(), field="raw_content", out_field="language", top=1,
                                           threshold=0.5),
            ccnet.perplexity.MultiSentencePiece({lang: lms / f"{lang}.sp.model" for lang in langs},
                                                field="raw_content", output_field="tokenized", normalize=True),
            ccnet.perplexity.DocLM({lang: lms / f"{lang}.arpa.bin" for lang in langs}, field="tokenized",
                                   output_field="perplexity", normalize=False),
            ccnet.perplexity.DropKeys("tokenized"),
        ):
            docs = step.map(docs)
        mined += [doc for doc in docs if doc]
    by_lang: dict[str, list[float]] = {}
    for doc in mined:
        if "perplexity" in doc:
            by_lang.setdefault(doc["language"], []).append(doc["perplexity"])
    write_cutoffs({lang: [round(float(v), 1) for v in np.percentile(by_lang[lang], np.arange(100))]
                   for lang in CUTOFF_LANGS}, str(cutoffs))
    bucketed = ccnet.perplexity.PerplexityBucket(cutoffs).map(mined)
    return {(doc["url"], doc["digest"]): doc for doc in bucketed}


def our_run(tmp: Path, inputs: Path, group_files: int | None, fmt: str, lms: Path,
            cutoffs: Path) -> dict[tuple[str, str], dict]:
    """The ccnet profile on ``inputs``, its dedup groups as shipped or of ``group_files`` files."""
    out = tmp / f"ours-{group_files}-{fmt}"
    groups = [] if group_files is None else ["--set", f"dedup.group_files={group_files}"]
    assert main(["run", "--no-progress", "--config", PROFILE, "--input", str(inputs / "*.warc.wet.gz"),
                 "--output", str(out), *groups, "--set", f"write.format={fmt}",
                 "--set", f"perplexity.models={lms}", "--set", f"perplexity.cutoffs={cutoffs}"]) == 0
    return output_rows(out, fmt)


def output_rows(out: Path, fmt: str) -> dict[tuple[str, str], dict]:
    """The documents of a ``write.schema: ccnet`` output, keyed by (url, digest)."""
    if fmt == "json":
        rows = [json.loads(line) for p in sorted(out.glob("*.json.gz")) for line in gzip.open(p, "rt", encoding="utf-8")]
    else:
        rows = [{k: v for k, v in row.items() if v is not None}  # null: a field CCNet leaves out
                for p in sorted(out.glob("lang=*/bucket=*/part-*")) for row in read_shard(str(p)).to_pylist()]
    return {(row["url"], row["digest"]): row for row in rows}


def unique_reference_lines(lang: str, taken: set[str]) -> list[str]:
    """Reference lines of 80+ characters whose dedup form is nowhere in the sample or in ``taken``
    (then added to it)."""
    lines = []
    train, held_out = split_reference(lang)
    for line in train + held_out:
        key = normalize_for_dedup(line)
        if len(line) >= 80 and key not in taken:
            taken.add(key)
            lines.append(line)
    return lines


def near_threshold_texts(de: list[str], fr: list[str]) -> tuple[list[str], list[str]]:
    """German/French mixtures of 300+ characters whose fastText score, newlines deleted as CCNet
    does, lies in [0.495, 0.5) (CCNet rounds it to 0.5 and keeps the document) or in [0.48, 0.495)."""
    import fasttext

    fasttext.FastText.eprint = lambda *args, **kwargs: None
    model = fasttext.load_model(str(lid_model()))
    up: list[str] = []
    down: list[str] = []
    i = 0
    while i < min(len(de), len(fr)) - 4 and (len(up) < 3 or len(down) < 3):
        for n in (1, 2, 3):  # windows that do not overlap: no line is in two documents
            text = "\n".join(de[i:i + n] + fr[i:i + n + 1])
            score = float(model.predict(text.replace("\n", ""), k=1)[1][0])
            if 0.495 <= score < 0.5 and len(up) < 3:
                up.append(text)
            elif 0.48 <= score < 0.495 and len(down) < 3:
                down.append(text)
            else:
                continue
            i += 3
            break
        i += 1
    return up, down


def sample_paragraphs() -> set[str]:
    taken = set()
    for path in (SAMPLE / "wet").glob("*.warc.wet.gz"):
        for line in gzip.decompress(path.read_bytes()).decode("utf-8").splitlines():
            taken.add(normalize_for_dedup(line.strip()))
    return taken


def record(body: str, n: int) -> bytes:
    return gz(warc_record(body.encode("utf-8"), uri=f"https://planted.example/{n}",
                          record_id=f"<urn:uuid:{n:08d}-0000-0000-0000-000000000000>", title=None))


def planted_files(folder: Path) -> dict[str, list[str]]:
    """Two WET files around the sample's (sorted first and last, so that with two dedup groups of
    three files they fall in different groups), with the cases where CCNet's reading differs from a
    plain one. Returns the bodies of the near-threshold documents, up and down."""
    taken = sample_paragraphs()
    de, fr, en, es, ru = (unique_reference_lines(lang, taken) for lang in ("de", "fr", "en", "es", "ru"))
    up, down = near_threshold_texts(de[40:], fr[40:])
    assert len(up) >= 2 and len(down) >= 2, "the reference text no longer gives LID scores near 0.5"
    shared = en[0]  # in both planted files: a duplicate across the two dedup groups only
    title = "Kurze Anleitung zum Drucken"
    first = [
        # 1: a title repeated in the body and as the next document's title; no final line break
        f"{title}\n{de[0]}\n{title}\n{de[1]}\n{de[2]}\n{de[3]}",
        # 2: \r\n and lone \r line ends, empty lines, a final line break
        f"{title}\r\n{de[4]}\r\n\r\n{de[5]}\r{de[6]}\r\r{de[7]}\n",
        # 3: a paragraph repeated inside this document (and, in the other file, once more)
        f"Page\n{fr[0]}\n{fr[1]}\n{fr[0]}\n{fr[2]}\n{fr[3]}\n\n",
        # 4, 5: raw_content of 299 and of 300 characters (an empty line counts), the title not counted
        "A title long enough to pass 300 characters with the body\n" + (en[1] + " " + en[2] + " " + en[3])[:299] + "\n",
        "A title\n" + (en[4] + " " + en[8] + " " + en[9])[:297] + "\n\nx\n",
        # 6: every paragraph is in another document: dropped by dedup
        f"Copies\n{de[1]}\n{fr[1]}\n{de[2]}\n{fr[2]}\n{de[3]}",
        # 7
        f"Shared\n{shared}\n{en[5]}\n{en[6]}\n{en[7]}",
        *(f"Gemischt\n{text}" for text in up + down),
    ]
    last = [
        f"Shared too\n{shared}\n{es[0]}\n{es[1]}\n{es[2]}\n{es[3]}",
        f"Page\n{fr[0]}\n{fr[4]}\n{fr[5]}\n{fr[6]}",  # makes fr[0] a duplicate across documents here
        f"Заголовок\n{ru[0]}\n{ru[1]}\n{ru[2]}\n{ru[3]}\n{ru[4]}",
    ]
    n = 0
    for name, bodies in (("a-planted.warc.wet.gz", first), ("z-planted.warc.wet.gz", last)):
        with open(folder / name, "wb") as f:
            for body in bodies:
                n += 1
                f.write(record(body, n))
    return {"up": up, "down": down, "shared": [shared]}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, dict[str, list[str]]]:
    folder = tmp_path_factory.mktemp("ccnet-inputs")
    for path in sorted((SAMPLE / "wet").glob("*.warc.wet.gz")):
        (folder / path.name).write_bytes(path.read_bytes())
    return folder, planted_files(folder)


@pytest.mark.parametrize("lang", ["de", "zh"])
def test_perplexity_is_ccnets_doclm_in_both_modes(ccnet, sample_lms, lang):
    """CCNet's MultiSentencePiece and DocLM: on the whole text (``document`` mode, as ``mine`` runs
    them) and on each line of it, the lines' pieces joined by newlines (``per_line``), where DocLM
    scores an empty line, or one SentencePiece keeps nothing of, as ``<s> </s>`` of length 1."""
    sp = spm.SentencePieceProcessor(model_file=str(sample_lms / f"{lang}.sp.model"))
    lm = kenlm.Model(str(sample_lms / f"{lang}.arpa.bin"))
    pieces = ccnet.perplexity.MultiSentencePiece({lang: sample_lms / f"{lang}.sp.model"}, field="raw_content",
                                                 output_field="tokenized", normalize=True)
    doc_lm = ccnet.perplexity.DocLM({lang: sample_lms / f"{lang}.arpa.bin"}, field="tokenized",
                                    output_field="perplexity", normalize=False)

    def tokenized(text: str) -> str:
        return pieces({"raw_content": text, "language": lang})["tokenized"]

    _, held_out = split_reference(lang)
    texts = ["\n".join(held_out[i:i + 3]) for i in range(0, 30, 3)]
    texts += [f"{held_out[40]}\n\n{held_out[41]}", f"{held_out[42]}\n \n\t\n", f"\n{held_out[43]}",
              f"{held_out[44]}\n\u200b\n\ufeff{held_out[45]}", "\u200b\n\ufeff", "\u200b", "\n", "...\n---"]
    unscored = set()
    with pieces, doc_lm:
        for text in texts:
            for mode, theirs in (("document", tokenized(text)), ("per_line", "\n".join(map(tokenized, text.split("\n"))))):
                expected = doc_lm({"tokenized": theirs, "language": lang}).get("perplexity")
                assert document_perplexity(text, sp, lm, mode) == expected, (mode, text)
                if expected is None:
                    unscored.add((mode, text))
    # an empty tokenized text (normalize deletes newlines), and in per_line mode one line of it only
    assert unscored == {("document", "\u200b"), ("document", "\u200b\n\ufeff"), ("document", "\n"), ("per_line", "\u200b")}


@pytest.mark.parametrize("fmt", ["json", "arrow"])
def test_ccnet_schema_without_dedup_has_ccnets_fields(ccnet, inputs, tmp_path, fmt):
    """CCNet's reader and LID without its dedup: a document has the reader's ``length``, the record's
    Content-Length in bytes (it was characters), and no ``original_length``, ``original_nlines`` or
    ``line_ids`` (those come from CCNet's dedup)."""
    folder, _ = inputs
    classifier = ccnet.split_by_lang.Classifier(model=lid_model(), field="raw_content", out_field="language", top=1,
                                                threshold=0.5)
    theirs = {}
    for path in sorted(folder.glob("*.warc.wet.gz")):
        for doc in classifier.map(ccnet.reader.parse_warc_file(ccnet.jsonql.open_read(path), min_len=300)):
            if doc:
                theirs[doc["url"], doc["digest"]] = {**doc, "cc_segment": path.name}
    out = tmp_path / "ours"
    assert main(["run", "--no-progress", "--config", PROFILE, "--input", str(folder / "*.warc.wet.gz"), "--output", str(out),
                 "--set", "steps=[lid]", "--set", f"write.format={fmt}"]) == 0
    ours = output_rows(out, fmt)
    assert len(theirs) > 1900 and sorted(ours) == sorted(theirs)
    for key, doc in theirs.items():
        mine = ours[key]
        assert Path(mine.pop("cc_segment")).name == doc.pop("cc_segment")
        assert mine == {**doc, "bucket": "all"}, key  # bucket: every document's, without the perplexity step
    assert any(doc["length"] != len(doc["raw_content"]) for doc in theirs.values())


@pytest.mark.parametrize("group_files, fmt", [(None, "json"), (3, "arrow")])
def test_ccnet_profile_keeps_exactly_ccnets_documents(ccnet, inputs, sample_lms, tmp_path, group_files, fmt):
    """As shipped (6 files, fewer than one CCNet group: CCNet's hash_in_mem of 50 one-file shards)
    and with groups of 3 files (hash_in_mem 3): two groups."""
    folder, near = inputs
    files = sorted(folder.glob("*.warc.wet.gz"))
    assert len(files) == 6
    cutoffs = tmp_path / "cutoff.csv"
    theirs = ccnet_mine(ccnet, files, group_files or 50, sample_lms, cutoffs, tmp_path)
    ours = our_run(tmp_path, folder, group_files, fmt, sample_lms, cutoffs)
    groups = 1 if group_files is None else 2

    assert len(theirs) > 1900 and sorted(ours) == sorted(theirs)
    for key, doc in theirs.items():
        mine = ours[key]
        assert Path(mine.pop("cc_segment")).name == doc.pop("cc_segment")
        assert mine == doc, key
    # every planted case happened
    planted = {url: doc for (url, _), doc in theirs.items() if url.startswith("https://planted.example/")}
    assert {doc["bucket"] for doc in theirs.values()} == {"head", "middle", "tail", "all"}
    assert any("\r" not in doc["raw_content"] and doc["title"] == "Kurze Anleitung zum Drucken"
               and "Kurze Anleitung zum Drucken" in doc["raw_content"].split("\n") for doc in planted.values())
    assert "https://planted.example/4" not in planted and "https://planted.example/5" in planted  # 299 / 300
    assert planted["https://planted.example/5"]["original_nlines"] == 3  # 297 characters, "", "x"
    assert "https://planted.example/6" not in planted  # all duplicated
    kept_near = [doc for doc in planted.values() if doc["title"] == "Gemischt"]  # raw scores in [0.495, 0.5)
    assert len(kept_near) == len(near["up"]) and all(doc["language_score"] == 0.5 for doc in kept_near)
    [shared] = near["shared"]  # a paragraph duplicated across the two groups only stays with two groups
    assert (shared in planted["https://planted.example/7"]["raw_content"].split("\n")) == (groups == 2)
    # document 3: fr[0] twice, fr[1] and fr[2] (also in document 6), fr[3], "": with two groups fr[0]
    # is repeated inside this document only (its first copy stays), with one it is in the other file too
    assert len(planted["https://planted.example/3"]["raw_content"].split("\n")) == (2 if groups == 2 else 1)
