"""NLI data readers for the files users have, one label space, and discovery of a data directory.

Formats (read exactly as published):

- XNLI-1.0 ``xnli.dev.tsv`` / ``xnli.test.tsv``: tab-separated, header line, all languages in one
  file (column ``language``), text in ``sentence1`` / ``sentence2``, label in ``gold_label``.
- XNLI-MT-1.0 ``multinli/multinli.train.<lang>.tsv``: header ``premise hypo label``, label
  ``contradictory`` for contradiction; quote characters are text (read with QUOTE_NONE).
- MultiNLI 1.0 ``multinli_1.0_*.jsonl``: ``sentence1``, ``sentence2``, ``gold_label``; ``-`` (no
  annotator consensus) is skipped and counted.
- HF ``datasets`` xnli saved with ``save_to_disk`` (Arrow stream files listed in ``state.json``) or
  exported to Parquet: ``premise``, ``hypothesis``, ``label`` (ClassLabel 0 entailment, 1 neutral,
  2 contradiction; -1 = unlabeled, skipped and counted). Read with pyarrow, no ``datasets`` needed.

A line that does not fit its format is a :class:`UserError` naming the file and line, unless the
caller asks to skip malformed lines (then they are counted and the first few locations kept).
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Iterator

from pipeline.output import fs
from pipeline.util.errors import UserError

LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")
"""Label ids 0, 1, 2: the order of HF ``xnli``'s ClassLabel and of the classifier's logits."""
LABEL_IDS: dict[str, int] = {
    "entailment": 0, "neutral": 1, "contradiction": 2,
    "contradictory": 2,  # XNLI-MT-1.0 spelling
}
XNLI_LANGUAGES: tuple[str, ...] = ("en", "fr", "es", "de", "el", "bg", "ru", "tr", "ar", "vi", "th", "zh", "hi", "sw", "ur")
XNLI_TEST_PAIRS = 5010
"""Test sentence pairs of XNLI 1.0 in each language (Conneau et al. 2018)."""
"""The 15 XNLI languages in the order the XLM-R paper and XTREME print them."""
XNLI_COLUMNS: tuple[str, ...] = (
    "language", "gold_label", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse",
    "sentence2_parse", "sentence1", "sentence2", "promptID", "pairID", "genre", "label1", "label2",
    "label3", "label4", "label5", "sentence1_tokenized", "sentence2_tokenized", "match")
MT_COLUMNS: tuple[str, ...] = ("premise", "hypo", "label")
SPLITS: tuple[str, ...] = ("train", "dev", "test")
HF_SPLIT = {"train": "train", "dev": "validation", "test": "test"}
MAX_LOCATIONS = 20
"""How many malformed-line locations a skipping read keeps for the report."""


@dataclasses.dataclass
class NLISet:
    """Examples of one language and split: parallel lists, labels as ids into :data:`LABELS`."""

    lang: str
    premises: list[str] = dataclasses.field(default_factory=list)
    hypotheses: list[str] = dataclasses.field(default_factory=list)
    labels: list[int] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)

    def add(self, premise: str, hypothesis: str, label: int) -> None:
        self.premises.append(premise)
        self.hypotheses.append(hypothesis)
        self.labels.append(label)


@dataclasses.dataclass
class ReadLog:
    """What a read kept and left out, for the report's provenance."""

    path: str
    format: str
    sha256: str = ""
    examples: dict[str, int] = dataclasses.field(default_factory=dict)
    skipped_no_label: int = 0
    malformed: int = 0
    malformed_at: list[str] = dataclasses.field(default_factory=list)

    def bad(self, where: str, why: str, skip: bool) -> None:
        """A malformed record: an error naming it, or (``skip``) counted and its place kept."""
        if not skip:
            raise UserError(f"{where}: {why}")
        self.malformed += 1
        if len(self.malformed_at) < MAX_LOCATIONS:
            self.malformed_at.append(f"{where}: {why}")


def label_id(value: object, where: str) -> int:
    """The id of a label name (XNLI, XNLI-MT or MultiNLI spelling); anything else is a label set mismatch."""
    key = str(value).strip().lower()
    if key not in LABEL_IDS:
        raise UserError(f"{where}: label {value!r} is not in the NLI label set "
                        f"({', '.join(sorted(LABEL_IDS))})")
    return LABEL_IDS[key]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tsv_rows(path: Path, columns: tuple[str, ...], log: ReadLog, skip: bool) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a headed TSV read with QUOTE_NONE, decoded line by line; a line that is
    not UTF-8 or has too few or too many fields is malformed (the header line is always an error)."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    lineno = 0

    def decoded() -> Iterator[str]:
        nonlocal lineno
        for lineno, raw in enumerate(handle, 1):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                log.bad(f"{path}:{lineno}", f"not UTF-8 text ({exc.reason} at byte {exc.start} of the line)",
                        skip and lineno > 1)

    with handle:
        reader = csv.reader(decoded(), delimiter="\t", quoting=csv.QUOTE_NONE)  # one line a row: no quoting
        try:
            header = next(reader, None)
            if header is None:
                raise UserError(f"{path}: empty file (expected a header line: {' '.join(columns)})")
            missing = [c for c in columns if c not in header]
            if missing:
                raise UserError(f"{path}:1: header lacks column(s) {', '.join(missing)} "
                                f"(expected: {' '.join(columns)})")
        except csv.Error as exc:  # in the header line: a carriage return inside it, a field past csv's limit
            raise UserError(f"{path}:{lineno}: {exc}") from None
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:  # a bare carriage return in the line, a field past csv's limit (131,072 characters)
                log.bad(f"{path}:{lineno}", str(exc), skip)
                continue
            if not row or row == [""]:
                continue
            if len(row) != len(header):
                log.bad(f"{path}:{lineno}", f"expected {len(header)} tab-separated fields, got {len(row)}", skip)
                continue
            yield lineno, dict(zip(header, row))


def read_xnli_tsv(path: Path, languages: tuple[str, ...], skip_malformed: bool = False) -> tuple[dict[str, NLISet], ReadLog]:
    """XNLI-1.0 ``xnli.dev.tsv`` / ``xnli.test.tsv``: the rows of ``languages``, by language."""
    log = ReadLog(str(path), "xnli-1.0-tsv")
    sets = {lang: NLISet(lang) for lang in languages}
    for lineno, row in _tsv_rows(path, XNLI_COLUMNS, log, skip_malformed):
        lang = row["language"]
        if not lang.strip():  # a row of no language would otherwise be left out like another language's
            log.bad(f"{path}:{lineno}", "empty language", skip_malformed)
            continue
        if lang not in XNLI_LANGUAGES:  # ``EN`` or a typo would otherwise be left out like a language not asked for
            log.bad(f"{path}:{lineno}", f"language {lang!r} is not one of XNLI's ({' '.join(XNLI_LANGUAGES)})",
                    skip_malformed)
            continue
        if lang not in sets:
            continue
        try:
            label = label_id(row["gold_label"], f"{path}:{lineno}")
        except UserError as exc:
            log.bad(f"{path}:{lineno}", str(exc).split(": ", 1)[1], skip_malformed)
            continue
        sets[lang].add(row["sentence1"], row["sentence2"], label)
    return _finish(sets, log, path)


def read_mt_tsv(path: Path, lang: str, skip_malformed: bool = False) -> tuple[dict[str, NLISet], ReadLog]:
    """XNLI-MT-1.0 ``multinli.train.<lang>.tsv`` (``premise hypo label``)."""
    log = ReadLog(str(path), "xnli-mt-1.0-tsv")
    nli = NLISet(lang)
    for lineno, row in _tsv_rows(path, MT_COLUMNS, log, skip_malformed):
        try:
            label = label_id(row["label"], f"{path}:{lineno}")
        except UserError as exc:
            log.bad(f"{path}:{lineno}", str(exc).split(": ", 1)[1], skip_malformed)
            continue
        nli.add(row["premise"], row["hypo"], label)
    return _finish({lang: nli}, log, path)


def read_multinli_jsonl(path: Path, skip_malformed: bool = False) -> tuple[dict[str, NLISet], ReadLog]:
    """MultiNLI 1.0 jsonl (English): ``gold_label`` ``-`` is skipped and counted."""
    log = ReadLog(str(path), "multinli-1.0-jsonl")
    nli = NLISet("en")
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    with handle:
        for lineno, raw in enumerate(handle, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                log.bad(where, f"not UTF-8 text ({exc.reason} at byte {exc.start} of the line)", skip_malformed)
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                log.bad(where, f"not a JSON object ({exc.msg} at column {exc.colno})", skip_malformed)
                continue
            if not isinstance(record, dict) or not all(k in record for k in ("gold_label", "sentence1", "sentence2")):
                log.bad(where, "expected keys gold_label, sentence1, sentence2", skip_malformed)
                continue
            if record["gold_label"] == "-":
                log.skipped_no_label += 1
                continue
            try:
                label = label_id(record["gold_label"], where)
            except UserError as exc:
                log.bad(where, str(exc).split(": ", 1)[1], skip_malformed)
                continue
            nli.add(str(record["sentence1"]), str(record["sentence2"]), label)
    return _finish({"en": nli}, log, path)


def _hf_label_names(schema_metadata: dict[bytes, bytes] | None, info_path: Path | None) -> list[str] | None:
    """The ClassLabel names of column ``label`` from dataset_info.json or the Arrow schema's HF metadata."""
    info: dict | None = None
    if info_path is not None and info_path.is_file():
        info = fs.read_json(info_path, what="HF dataset info")
    elif schema_metadata and b"huggingface" in schema_metadata:
        info = json.loads(schema_metadata[b"huggingface"]).get("info")
    label = ((info or {}).get("features") or {}).get("label") or {}
    names = label.get("names")
    return list(names) if names else None


def _hf_files(split_dir: Path) -> tuple[list[Path], str]:
    """The data files of one HF split: save_to_disk's state.json list, else Parquet files."""
    state = split_dir / "state.json"
    if state.is_file():
        try:
            listed = json.loads(state.read_text(encoding="utf-8"))["_data_files"]
            return [split_dir / item["filename"] for item in listed], "hf-arrow"
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{state}: not a datasets state.json (expected _data_files)") from None
    return sorted(split_dir.glob("*.parquet")), "hf-parquet"


def read_hf(files: list[Path], fmt: str, lang: str, info_path: Path | None = None) -> tuple[dict[str, NLISet], ReadLog]:
    """HF ``xnli`` rows (premise, hypothesis, label) from save_to_disk Arrow stream files or Parquet files."""
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet as pq

    where = str(files[0].parent if len(files) > 1 else files[0])
    log = ReadLog(where, fmt)
    nli = NLISet(lang)
    for path in files:
        try:
            if fmt == "hf-arrow":
                with pa.memory_map(str(path)) as source:
                    table = pa.ipc.open_stream(source).read_all()
            else:
                table = pq.read_table(path)
        except FileNotFoundError:
            raise UserError(f"{path}: no such file (listed in state.json)") from None
        except pa.ArrowInvalid as exc:
            raise UserError(f"{path}: not a readable {'Arrow stream' if fmt == 'hf-arrow' else 'Parquet'} file ({exc})") from None
        missing = [c for c in ("premise", "hypothesis", "label") if c not in table.column_names]
        if missing:
            raise UserError(f"{path}: no column(s) {', '.join(missing)} (columns: {', '.join(table.column_names)}); "
                            "expected HF xnli's premise, hypothesis, label")
        names = _hf_label_names(table.schema.metadata, info_path)
        if names is not None and [n.lower() for n in names] != list(LABELS):
            raise UserError(f"{info_path or path}: label names {names} do not match {list(LABELS)}")
        if not pa.types.is_integer(table.schema.field("label").type):
            raise UserError(f"{path}: column label has type {table.schema.field('label').type}, expected ClassLabel ints")
        premises, hypotheses = table.column("premise").to_pylist(), table.column("hypothesis").to_pylist()
        for row, (p, h, y) in enumerate(zip(premises, hypotheses, table.column("label").to_pylist())):
            if y == -1:
                log.skipped_no_label += 1
            elif y not in (0, 1, 2) or not isinstance(p, str) or not isinstance(h, str):
                raise UserError(f"{path}: row {row}: label {y!r} is not in 0..2 or the text is not a string "
                                "(label set mismatch)")
            else:
                nli.add(p, h, y)
    digest = hashlib.sha256()
    for path in files:
        digest.update(file_sha256(path).encode())
    log.sha256 = digest.hexdigest()
    log.examples = {lang: len(nli)}
    return {lang: nli}, log


def _finish(sets: dict[str, NLISet], log: ReadLog, path: Path) -> tuple[dict[str, NLISet], ReadLog]:
    log.sha256 = file_sha256(path)
    log.examples = {lang: len(s) for lang, s in sets.items()}
    return sets, log


@dataclasses.dataclass
class Source:
    """Where one split of one language comes from (a file, or an HF split's files)."""

    split: str
    lang: str
    format: str
    files: list[Path]
    info: Path | None = None


def load_split(root: Path, split: str, languages: tuple[str, ...], skip_malformed: bool = False) -> tuple[dict[str, NLISet], list[ReadLog]]:
    """Every language's examples of ``split`` under ``root`` (an XNLI-1.0 file holding several languages is read once)."""
    sources = [discover(root, split, lang) for lang in languages]
    sets: dict[str, NLISet] = {}
    logs: list[ReadLog] = []
    shared = [s for s in sources if s.format == "xnli-1.0-tsv"]
    if shared:
        got, log = read_xnli_tsv(shared[0].files[0], tuple(s.lang for s in shared), skip_malformed)
        sets.update(got)
        logs.append(log)
    for source in sources:
        if source.format == "xnli-1.0-tsv":
            continue
        if source.format == "xnli-mt-1.0-tsv":
            got, log = read_mt_tsv(source.files[0], source.lang, skip_malformed)
        elif source.format == "multinli-1.0-jsonl":
            got, log = read_multinli_jsonl(source.files[0], skip_malformed)
        else:
            got, log = read_hf(source.files, source.format, source.lang, source.info)
        sets.update(got)
        logs.append(log)
    for lang in languages:
        if not len(sets[lang]):
            where = next(log.path for log in logs if lang in log.examples)
            raise UserError(f"{where}: no {split} examples for language {lang} (choose languages with --languages)")
    return {lang: sets[lang] for lang in languages}, logs


def _unique(root: Path, name: str) -> Path | None:
    found = sorted(p for p in root.rglob(name) if p.is_file())
    if len(found) > 1:
        raise UserError(f"{root}: {len(found)} files named {name} ({', '.join(map(str, found[:3]))}); "
                        "point --data at the folder holding one")
    return found[0] if found else None


def _hf_source(root: Path, split: str, lang: str) -> Source | None:
    """HF xnli for ``lang`` under ``root/<lang>``: save_to_disk split dirs or Parquet exports."""
    base = root / lang
    if not base.is_dir():
        return None
    name = HF_SPLIT[split]
    split_dir = base / name
    if split_dir.is_dir():
        files, fmt = _hf_files(split_dir)
        if files:
            return Source(split, lang, fmt, files, split_dir / "dataset_info.json" if fmt == "hf-arrow" else None)
    files = sorted(base.glob(f"{name}-*.parquet")) or sorted(base.glob(f"{name}.parquet"))
    return Source(split, lang, "hf-parquet", files) if files else None


class MissingData(UserError):
    """No source of a split for a language under ``--data`` (:func:`discover`)."""


def discover(root: Path, split: str, lang: str) -> Source:
    """The source of ``split`` for ``lang`` under ``root``; a missing one is an error listing what was looked for.

    Looked for, in this order: train: XNLI-MT-1.0 ``multinli.train.<lang>.tsv``, MultiNLI
    ``multinli_1.0_train.jsonl`` (en), HF ``<lang>/train``; dev/test: XNLI-1.0 ``xnli.<split>.tsv``
    (the language's rows), HF ``<lang>/validation`` or ``<lang>/test``.
    """
    if not root.is_dir():
        raise UserError(f"--data {root}: no such directory")
    if split == "train":
        found = _unique(root, f"multinli.train.{lang}.tsv")
        if found:
            return Source(split, lang, "xnli-mt-1.0-tsv", [found])
        if lang == "en":
            found = _unique(root, "multinli_1.0_train.jsonl")
            if found:
                return Source(split, lang, "multinli-1.0-jsonl", [found])
        tried = f"multinli.train.{lang}.tsv" + (", multinli_1.0_train.jsonl" if lang == "en" else "")
    else:
        found = _unique(root, f"xnli.{split}.tsv")
        if found:
            return Source(split, lang, "xnli-1.0-tsv", [found])
        tried = f"xnli.{split}.tsv"
    hf = _hf_source(root, split, lang)
    if hf:
        return hf
    raise MissingData(f"--data {root}: no {split} data for language {lang} (looked for {tried} anywhere below it, "
                    f"and HF datasets {lang}/{HF_SPLIT[split]}/ or {lang}/{HF_SPLIT[split]}-*.parquet)")
