"""xeval readers on the real file layouts (hand-made fixtures), label mapping, malformed lines,
HF datasets Arrow/Parquet read with pyarrow, discovery errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.util.errors import UserError
from xeval.data import (LABELS, XNLI_LANGUAGES, discover, label_id, load_split, read_hf, read_mt_tsv,
                        read_multinli_jsonl, read_xnli_tsv)

FIXTURES = Path(__file__).parent / "data" / "xnli"
XNLI_DEV = FIXTURES / "XNLI-1.0" / "xnli.dev.tsv"
MT_EN = FIXTURES / "XNLI-MT-1.0" / "multinli" / "multinli.train.en.tsv"
MNLI = FIXTURES / "multinli_1.0" / "multinli_1.0_train.jsonl"


def test_label_mapping() -> None:
    assert LABELS == ("entailment", "neutral", "contradiction")
    assert [label_id(x, "f:1") for x in ("entailment", "neutral", "contradiction", "contradictory", "Neutral")] == [0, 1, 2, 2, 1]
    with pytest.raises(UserError, match=r"f:7: label 'not_entailment' is not in the NLI label set"):
        label_id("not_entailment", "f:7")


def test_xnli_tsv_all_languages() -> None:
    sets, log = read_xnli_tsv(XNLI_DEV, XNLI_LANGUAGES)
    assert list(sets) == list(XNLI_LANGUAGES) and all(len(s) == 3 for s in sets.values())
    assert sets["en"].premises[0] == "The museum opens at nine in the morning."
    assert sets["zh"].hypotheses[2] == "博物馆从来不在中午之前开门。"
    assert all(s.labels == [0, 1, 2] for s in sets.values())
    assert log.format == "xnli-1.0-tsv" and log.examples["th"] == 3 and len(log.sha256) == 64


def test_mt_tsv_reads_quotes_verbatim_and_contradictory() -> None:
    sets, log = read_mt_tsv(MT_EN, "en")
    en = sets["en"]
    assert len(en) == 24 and en.labels[:3] == [0, 1, 2]
    assert en.premises[9] == 'The sign said "closed" when we arrived at the shop.'
    assert en.premises[21] == 'The concert was cancelled because the singer was "very ill".'


def test_multinli_jsonl_skips_no_consensus() -> None:
    sets, log = read_multinli_jsonl(MNLI)
    assert len(sets["en"]) == 23 and log.skipped_no_label == 1
    assert sets["en"].hypotheses[0] == "The library is open on weekdays."


@pytest.mark.parametrize("mutation, message", [
    (lambda line: line.rsplit("\t", 1)[0], "expected 19 tab-separated fields, got 18"),
    (lambda line: line.replace("\tneutral\t", "\tentails\t", 1), "label 'entails' is not in the NLI label set"),
    (lambda line: "\t" + line.split("\t", 1)[1], "empty language"),
    (lambda line: "EN\t" + line.split("\t", 1)[1], "language 'EN' is not one of XNLI's"),  # was left out unsaid
    (lambda line: "\t".join([line.split("\t")[0], "", *line.split("\t")[2:]]), "label '' is not in the NLI label set"),
])
def test_malformed_xnli_line_names_file_and_line(tmp_path: Path, mutation, message) -> None:
    lines = XNLI_DEV.read_text(encoding="utf-8").splitlines()
    lines[5] = mutation(lines[5])
    bad = tmp_path / "xnli.dev.tsv"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"^{bad}:6: {message}"):
        read_xnli_tsv(bad, XNLI_LANGUAGES)
    sets, log = read_xnli_tsv(bad, XNLI_LANGUAGES, skip_malformed=True)
    assert log.malformed == 1 and log.malformed_at[0].startswith(f"{bad}:6: ")
    assert sum(map(len, sets.values())) == 44


def test_malformed_jsonl_and_mt_lines(tmp_path: Path) -> None:
    bad = tmp_path / "multinli_1.0_train.jsonl"
    bad.write_text(MNLI.read_text(encoding="utf-8") + '{"gold_label": "neutral", "sentence1": "x"\n', encoding="utf-8")
    with pytest.raises(UserError, match=rf"^{bad}:25: not a JSON object"):
        read_multinli_jsonl(bad)
    latin = tmp_path / "latin1.jsonl"  # a line in another encoding: its place, or counted with --skip-malformed
    latin.write_bytes(MNLI.read_bytes() + '{"gold_label": "neutral", "sentence1": "café", "sentence2": "x"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match=rf"^{latin}:25: not UTF-8 text \(invalid continuation byte at byte 43 of the line\)$"):
        read_multinli_jsonl(latin)
    sets, log = read_multinli_jsonl(latin, skip_malformed=True)
    assert log.malformed == 1 and len(sets["en"]) == len(read_multinli_jsonl(MNLI)[0]["en"])
    mt = tmp_path / "multinli.train.en.tsv"
    mt.write_text(MT_EN.read_text(encoding="utf-8") + "a premise\ta hypothesis\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"^{mt}:26: expected 3 tab-separated fields, got 2"):
        read_mt_tsv(mt, "en")
    huge = tmp_path / "huge.tsv"  # a field past csv's limit (131,072 characters): one line, no traceback
    huge.write_text(MT_EN.read_text(encoding="utf-8") + "x" * 200_000 + "\ty\tneutral\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"^{huge}:26: field larger than field limit"):
        read_mt_tsv(huge, "en")
    header = tmp_path / "h.tsv"
    header.write_text("sentence1\tsentence2\tlabel\n", encoding="utf-8")
    with pytest.raises(UserError, match=r":1: header lacks column\(s\) premise, hypo"):
        read_mt_tsv(header, "en")


def test_tsv_line_not_utf8_names_its_line(tmp_path: Path) -> None:
    """A TSV line in another encoding is a malformed line like any other: its file and line (the byte
    offset was inside the reader's decode chunk), or skipped and counted with --skip-malformed."""
    lines = MT_EN.read_bytes().splitlines(keepends=True)
    lines[9] = "Le café ferme à six heures.\tThe café is open.\tneutral\n".encode("latin-1")
    latin = tmp_path / "multinli.train.en.tsv"
    latin.write_bytes(b"".join(lines))
    with pytest.raises(UserError, match=rf"^{latin}:10: not UTF-8 text \(invalid continuation byte at byte 6 of the line\)$"):
        read_mt_tsv(latin, "en")
    sets, log = read_mt_tsv(latin, "en", skip_malformed=True)
    assert log.malformed == 1 and log.malformed_at == [f"{latin}:10: not UTF-8 text (invalid continuation byte at byte 6 "
                                                       "of the line)"]
    assert len(sets["en"]) == 23 and sets["en"].premises[8] == read_mt_tsv(MT_EN, "en")[0]["en"].premises[9]
    dev = tmp_path / "xnli.dev.tsv"  # and the XNLI-1.0 reader: the line after it keeps its own number
    lines = XNLI_DEV.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"museum", b"mus\xe9um")
    lines[7] = lines[7].rsplit(b"\t", 1)[0] + b"\n"
    dev.write_bytes(b"".join(lines))
    with pytest.raises(UserError, match=rf"^{dev}:4: not UTF-8 text"):
        read_xnli_tsv(dev, XNLI_LANGUAGES)
    sets, log = read_xnli_tsv(dev, XNLI_LANGUAGES, skip_malformed=True)
    assert log.malformed == 2 and [where.split(": ")[0] for where in log.malformed_at] == [f"{dev}:4", f"{dev}:8"]
    assert sum(map(len, sets.values())) == 43
    dev.write_bytes(XNLI_DEV.read_bytes().replace(b"language", b"langu\xe1ge", 1))  # no header to skip to
    with pytest.raises(UserError, match=rf"^{dev}:1: not UTF-8 text"):
        read_xnli_tsv(dev, XNLI_LANGUAGES, skip_malformed=True)


def test_tsv_line_csv_refuses_is_a_malformed_line(tmp_path: Path) -> None:
    """A line csv refuses (a bare carriage return inside it) is one malformed line: its file and line,
    or skipped and counted with --skip-malformed, the lines after it read."""
    lines = MT_EN.read_bytes().splitlines(keepends=True)
    lines[4] = lines[4].replace(b" ", b"\r", 1)
    bad = tmp_path / "multinli.train.en.tsv"
    bad.write_bytes(b"".join(lines))
    with pytest.raises(UserError, match=rf"^{bad}:5: new-line character seen in unquoted field"):
        read_mt_tsv(bad, "en")
    sets, log = read_mt_tsv(bad, "en", skip_malformed=True)
    assert log.malformed == 1 and [where.split(": ")[0] for where in log.malformed_at] == [f"{bad}:5"]
    assert len(sets["en"]) == len(read_mt_tsv(MT_EN, "en")[0]["en"]) - 1


def _hf_table(split_pairs: list[tuple[str, str, int]]) -> pa.Table:
    """HF xnli's features: premise, hypothesis (string), label (ClassLabel -> int64), with datasets' schema metadata."""
    features = {"premise": {"dtype": "string", "_type": "Value"}, "hypothesis": {"dtype": "string", "_type": "Value"},
                "label": {"names": list(LABELS), "_type": "ClassLabel"}}
    schema = pa.schema([("premise", pa.string()), ("hypothesis", pa.string()), ("label", pa.int64())],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    premises, hypotheses, labels = zip(*split_pairs)
    return pa.table({"premise": list(premises), "hypothesis": list(hypotheses), "label": list(labels)}, schema=schema)


def _save_to_disk(table: pa.Table, directory: Path, names: list[str] = list(LABELS)) -> None:
    """What datasets' Dataset.save_to_disk writes: an Arrow *stream* file, state.json, dataset_info.json."""
    directory.mkdir(parents=True)
    with pa.OSFile(str(directory / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (directory / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_fingerprint": "0123456789abcdef",
        "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
        "_split": directory.name}, indent=2))
    (directory / "dataset_info.json").write_text(json.dumps({
        "builder_name": "xnli", "config_name": directory.parent.name,
        "features": {"premise": {"dtype": "string", "_type": "Value"}, "hypothesis": {"dtype": "string", "_type": "Value"},
                     "label": {"names": names, "_type": "ClassLabel"}}}, indent=2))


@pytest.fixture
def hf_data(tmp_path: Path) -> Path:
    """en as save_to_disk DatasetDict dirs, fr as Parquet exports (facebook/xnli's <lang>/<split>-00000-of-00001.parquet)."""
    root = tmp_path / "hf"
    mt, _ = read_mt_tsv(MT_EN, "en")
    dev, _ = read_xnli_tsv(XNLI_DEV, ("en", "fr"))
    test, _ = read_xnli_tsv(FIXTURES / "XNLI-1.0" / "xnli.test.tsv", ("en", "fr"))
    rows = lambda s: list(zip(s.premises, s.hypotheses, s.labels))  # noqa: E731
    (root / "en").mkdir(parents=True)
    (root / "en" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test", "validation"]}))
    _save_to_disk(_hf_table(rows(mt["en"]) + [("unlabeled", "pair", -1)]), root / "en" / "train")
    _save_to_disk(_hf_table(rows(dev["en"])), root / "en" / "validation")
    _save_to_disk(_hf_table(rows(test["en"])), root / "en" / "test")
    (root / "fr").mkdir()
    for split, nli in (("validation", dev["fr"]), ("test", test["fr"])):
        pq.write_table(_hf_table(rows(nli)), root / "fr" / f"{split}-00000-of-00001.parquet")
    return root


def test_hf_arrow_and_parquet(hf_data: Path) -> None:
    train, logs = load_split(hf_data, "train", ("en",))
    assert len(train["en"]) == 24 and logs[0].format == "hf-arrow" and logs[0].skipped_no_label == 1
    test, logs = load_split(hf_data, "test", ("en", "fr"))
    assert [log.format for log in logs] == ["hf-arrow", "hf-parquet"]
    reference, _ = read_xnli_tsv(FIXTURES / "XNLI-1.0" / "xnli.test.tsv", ("en", "fr"))
    for lang in ("en", "fr"):
        assert test[lang] == reference[lang]


def test_hf_label_names_mismatch(hf_data: Path) -> None:
    directory = hf_data / "en" / "validation"
    info = json.loads((directory / "dataset_info.json").read_text())
    info["features"]["label"]["names"] = ["entailment", "not_entailment"]
    (directory / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match=r"dataset_info.json: label names \['entailment', 'not_entailment'\] do not match"):
        load_split(hf_data, "dev", ("en",))


def test_hf_dataset_info_cut_short(hf_data: Path) -> None:
    info = hf_data / "en" / "validation" / "dataset_info.json"
    info.write_text(info.read_text()[:40])
    with pytest.raises(UserError, match=rf"^HF dataset info {info}: not valid JSON"):
        load_split(hf_data, "dev", ("en",))


def test_hf_label_out_of_range(tmp_path: Path) -> None:
    path = tmp_path / "test-00000-of-00001.parquet"
    pq.write_table(pa.table({"premise": ["a"], "hypothesis": ["b"], "label": [3]}), path)
    with pytest.raises(UserError, match=r"row 0: label 3 is not in 0..2"):
        read_hf([path], "hf-parquet", "en")


def test_discovery(tmp_path: Path) -> None:
    assert discover(FIXTURES, "train", "en").format == "xnli-mt-1.0-tsv"
    assert discover(FIXTURES, "dev", "sw").files == [XNLI_DEV]
    assert discover(FIXTURES / "multinli_1.0", "train", "en").format == "multinli-1.0-jsonl"
    with pytest.raises(UserError, match=r"no train data for language sw \(looked for multinli.train.sw.tsv"):
        discover(FIXTURES, "train", "sw")
    with pytest.raises(UserError, match=r"--data .*: no such directory"):
        discover(tmp_path / "missing", "dev", "en")
    twice = tmp_path / "twice"
    shutil.copytree(FIXTURES / "XNLI-1.0", twice / "a")
    shutil.copytree(FIXTURES / "XNLI-1.0", twice / "b")
    with pytest.raises(UserError, match=r"2 files named xnli.dev.tsv"):
        discover(twice, "dev", "en")
