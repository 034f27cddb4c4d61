"""xeval xnli end to end on a tiny XLM-R and the hand-made format fixtures: the independent HF
evaluation path, determinism, selection, reports, models from `pretrain export` and HF dirs, bad input."""
from __future__ import annotations

import html.parser
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

from pipeline.util.errors import UserError
from xeval.model import load_tokenizer

FIXTURES = Path(__file__).parent / "data" / "xnli"
LANGS = "en,fr,de,zh,ar,sw"
ARGS = ["--epochs", "3", "--batch-size", "8", "--lr", "2e-3", "--warmup", "0", "--max-length", "64", "--device", "cpu",
        "--dataset-name", "xeval test fixtures", "--data-note", "hand-made format fixtures, not XNLI"]


@pytest.fixture(scope="module")
def exported(sample_tokenizer: Path, tmp_path_factory) -> Path:  # noqa: F811
    """A tiny XLM-R written by save_hf with the sample tokenizer: what `pretrain export` writes."""
    from pretrain.models import build_pretraining_model, load_model_config
    from pretrain.models.hf import save_hf
    from pretrain.tokenizer import Tokenizer

    cfg = load_model_config("xlmr-tiny", {"vocab_size": Tokenizer.load(sample_tokenizer).vocab_size})
    torch.manual_seed(0)
    return save_hf(build_pretraining_model(cfg), cfg, tmp_path_factory.mktemp("exported"), tokenizer_dir=sample_tokenizer)


def xeval(*argv: str) -> int:
    from xeval.__main__ import main
    return main(list(argv))


@pytest.fixture(scope="module")
def run(exported: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")  # seeds whose models (which learn little) predict different labels
    assert xeval("xnli", "--model", str(exported), "--data", str(FIXTURES), "--out", str(out), "--languages", LANGS,
                 "--seeds", "1,3", "--save-models", *ARGS) == 0
    return out


def test_results_schema_and_selection(run: Path) -> None:
    results = json.loads((run / "results.json").read_text())
    assert results["languages"] == ["en", "fr", "de", "ar", "zh", "sw"]
    assert results["selection"]["languages"] == ["en"] and results["model"]["engine"] == "ours"
    assert results["model"]["head"] == "fresh"  # a masked LM's folder: each seed draws its own head
    assert results["data"]["note"] == "hand-made format fixtures, not XNLI"
    assert [s["seed"] for s in results["seeds"]] == [1, 3]
    for seed in results["seeds"]:
        assert len(seed["history"]) == 3  # one dev evaluation per epoch
        best = max(seed["history"], key=lambda p: p["score"])
        assert seed["selected"]["score"] == best["score"]
        assert seed["selected"] == next(p for p in seed["history"] if p["score"] == best["score"])  # earliest
        assert seed["dev"]["en"]["accuracy"] == seed["selected"]["dev"]["en"]  # the selected weights were kept
        for lang in results["languages"]:
            test = seed["test"][lang]
            assert test["n"] == 6 and sum(map(sum, test["confusion"])) == 6
            assert test["accuracy"] == sum(test["confusion"][i][i] for i in range(3)) / 6
    summary = results["summary"]
    assert summary["test"]["en"]["n_seeds"] == 2
    assert summary["gap"]["fr"] == pytest.approx(summary["test"]["en"]["mean"] - summary["test"]["fr"]["mean"])


def test_selection_rule_uses_dev_only() -> None:
    from xeval.finetune import select

    history = [{"epoch": 1, "score": 0.50}, {"epoch": 2, "score": 0.70}, {"epoch": 3, "score": 0.70},
               {"epoch": 4, "score": 0.60, "test": {"en": 0.99}}]
    assert select(history)["epoch"] == 2  # best dev, earliest of ties; a test number on a point is ignored


def test_same_predictions_as_plain_hf_loop(run: Path) -> None:
    """Our per-language confusion matrices equal those of a plain HF AutoModelForSequenceClassification
    loop (one example at a time, no padding) over the saved fine-tuned weights."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from xeval.data import load_split

    results = json.loads((run / "results.json").read_text())
    test, _ = load_split(FIXTURES, "test", tuple(results["languages"]))
    varied = set()
    for seed in results["seeds"]:
        model_dir = run / "models" / f"seed-{seed['seed']}"
        model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        assert model.config.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}
        for lang, nli in test.items():
            matrix = [[0] * 3 for _ in range(3)]
            for premise, hypothesis, gold in zip(nli.premises, nli.hypotheses, nli.labels):
                enc = tokenizer(premise, hypothesis, truncation=True, max_length=64, return_tensors="pt")
                with torch.no_grad():
                    pred = int(model(**enc).logits.argmax(-1))
                matrix[gold][pred] += 1
                varied.add(pred)
            assert matrix == seed["test"][lang]["confusion"], (seed["seed"], lang)
    assert len(varied) > 1, "the fine-tuned model predicts one class only: the comparison would prove little"


def test_seed_is_deterministic(exported: Path, run: Path, tmp_path: Path) -> None:
    """Seed 3 alone reproduces, to the bit, seed 3 of the two-seed run (history, selection, dev, test)."""
    out = tmp_path / "again"
    assert xeval("xnli", "--model", str(exported), "--data", str(FIXTURES), "--out", str(out), "--languages", LANGS,
                 "--seeds", "3", *ARGS) == 0
    alone = json.loads((out / "results.json").read_text())["seeds"][0]
    assert alone == json.loads((run / "results.json").read_text())["seeds"][1]


class _Parser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_reports(run: Path, tmp_path: Path) -> None:
    import matplotlib.image

    md = (run / "report.md").read_text()
    assert "> **" in md and ": hand-made format fixtures, not XNLI**" in md
    assert "| XLM-R base (published), test | 85.8 |" in md and "| mDeBERTa-v3 base (published), test | 88.2 |" in md
    assert "He et al. 2021 (DeBERTaV3), Table 6" in md and "calls them dev results" in md
    # our checkpoint selection is ours: the published rows' is as their sources state it, unstated for XLM-R
    assert "model selected on English dev" not in md and "Our rows: checkpoint selected on English dev" in md
    assert md.count("| not stated in the paper (Schmidt et al. 2023") == 2 and "| not stated in the model card" in md
    parser = _Parser()
    parser.feed((run / "report.html").read_text())
    assert "table" in parser.tags and len(parser.images) == 2
    assert all(src.startswith("data:image/png;base64,") for src in parser.images)
    for name in ("accuracy.png", "gap.png"):
        width, height = _png_size(run / name)
        assert width > 300 and height > 200
        assert matplotlib.image.imread(run / name).shape[:2] == (height, width)
    # re-render two runs side by side from their results.json
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(run / "results.json", other / "results.json")
    assert xeval("report", str(run / "results.json"), str(other), "--out", str(tmp_path / "cmp"),
                 "--names", "first,second") == 0
    compared = (tmp_path / "cmp" / "report.md").read_text()
    assert "| first (ours, 2 seeds, test) |" in compared and "| second (ours, 2 seeds, test) |" in compared
    assert (tmp_path / "cmp" / "report.html").is_file() and _png_size(tmp_path / "cmp" / "gap.png")[0] > 300


def test_runs_are_told_apart_in_the_report(run: Path, tmp_path: Path, capsys) -> None:
    """Models exported as ``<run>/hf`` (pretrain's layout) were all called ``hf`` in the tables; the
    default names now take as many parent folders as tell them apart, and ``--names`` a name twice is
    one line."""
    from xeval.report import default_names

    def results(path: str, data: str = "XNLI") -> dict:
        return {"model": {"path": path}, "data": {"name": data}}

    assert default_names([results("/r/xlmr/hf"), results("/r/mdeberta/hf"), results("/q/mdeberta/hf")]) == [
        "r/xlmr/hf", "r/mdeberta/hf", "q/mdeberta/hf"]
    assert default_names([results("/r/xlmr/hf"), results("/r/mdeberta/step-9")]) == ["hf", "step-9"]
    assert default_names([results("/r/hf"), results("/r/hf"), results("/r/hf", "fixtures")]) == [
        "hf (run 1)", "hf (run 2)", "hf (fixtures)"]
    assert xeval("report", str(run / "results.json"), str(run / "results.json"), "--out", str(tmp_path / "a"),
                 "--names", "x,x") == 2
    assert "--names gives 'x' twice" in capsys.readouterr().err


def fifteen_language_run(results: dict, n: int = 5010) -> dict:
    """The fixture run as if it were XNLI in all 15 languages of ``n`` test pairs (XNLI's 5,010), two
    in three right in each (predictions spread over two labels)."""
    from xeval.data import XNLI_LANGUAGES

    run = json.loads(json.dumps(results))
    run["data"]["name"], run["data"]["note"] = "XNLI", ""
    run["languages"] = list(XNLI_LANGUAGES)
    third = n // 3
    for seed in run["seeds"]:
        seed["test"] = {lang: {"accuracy": 2 * third / n, "n": n,
                               "confusion": [[third, 0, 0], [0, third, 0], [third // 2, third - third // 2, 0]]}
                        for lang in XNLI_LANGUAGES}
    return run


def test_incomparable_rows_are_never_averaged_with_published_ones(run: Path, tmp_path: Path) -> None:
    from xeval.report import load_results, render, summarize

    fixture = load_results(str(run))
    full = fifteen_language_run(fixture)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "results.json").write_text(json.dumps({k: v for k, v in full.items() if k != "summary"}))
    render([load_results(str(tmp_path / "full")), fixture], tmp_path / "report", names=["full", "fixtures"])
    md = (tmp_path / "report" / "report.md").read_text()
    main_table, rest = md.split("## Runs not comparable with the published results")
    assert "| full (ours, 2 seeds, test) |" in main_table and "| XLM-R base (published), test |" in main_table
    assert "fixtures (ours" not in main_table  # 6 languages of a hand-made set: its own table only
    assert "| fixtures (ours, 2 seeds, test) |" in rest.split("## Published rows")[0]
    assert "6 languages, missing es, el, bg, ru, tr, vi, th, hi, ur" in rest and "not XNLI" in rest
    row = next(line for line in main_table.splitlines() if line.startswith("| full (ours"))
    assert row.rstrip(" |").endswith("66.7 ± 0.0")  # averaged over the 15 languages
    # all 15 languages of XNLI, but its checkpoints chosen on French dev, or trained on a cut of the data
    chosen_on_fr = json.loads(json.dumps(full))
    chosen_on_fr["selection"]["languages"] = ["fr"]
    cut = json.loads(json.dumps(full))
    cut["config"]["max_train_examples"] = 100
    # or of another size than XNLI's test sets (a file cut short, another set in its layout), or with
    # malformed lines left out; a run of one seed shows no spread
    small = fifteen_language_run(fixture, n=12)
    skipped = json.loads(json.dumps(full))
    skipped["data"]["files"]["test"][0]["malformed"] = 3
    train_skipped = json.loads(json.dumps(full))  # --skip-malformed left training pairs out: not all of them
    train_skipped["data"]["files"]["train"][0]["malformed"] = 2
    train_skipped["summary"] = summarize(train_skipped)
    one_seed = json.loads(json.dumps(full))
    one_seed["seeds"] = one_seed["seeds"][:1]
    one_seed["summary"] = summarize(one_seed)
    render([chosen_on_fr, cut, small, skipped, train_skipped, one_seed], tmp_path / "other",
           names=["fr-dev", "cut", "small", "skipped", "train-skipped", "one-seed"])
    main_table, rest = (tmp_path / "other" / "report.md").read_text().split("## Runs not comparable with the published results")
    assert [line.split(" (ours")[0] for line in main_table.splitlines() if "(ours" in line] == ["| one-seed"]
    assert "| one-seed (ours, 1 seeds, test) | 66.7 ± – |" in main_table
    assert "checkpoints selected on fr dev, not English dev alone" in rest
    assert "trained on the first 100 examples per language only" in rest
    assert "test sets not of XNLI's 5,010 pairs a language (en 12, fr 12," in rest
    assert "3 malformed dev/test lines left out" in rest
    assert "| train-skipped (ours" in rest and "2 malformed training lines left out" in rest


def test_results_name_the_training_pairs_used(exported: Path, tmp_path: Path) -> None:
    """data.files keeps what each file held; data.train_examples the pairs trained on, after the cut."""
    out = tmp_path / "cut"
    assert xeval("xnli", "--model", str(exported), "--data", str(FIXTURES), "--out", str(out), "--languages", "en",
                 "--seeds", "1", "--max-train-examples", "10", *ARGS, "--epochs", "1") == 0
    results = json.loads((out / "results.json").read_text())
    assert [f["examples"] for f in results["data"]["files"]["train"]] == [{"en": 24}]
    assert results["data"]["train_examples"] == {"en": 10} and results["seeds"][0]["steps"] == 2  # ceil(10 / 8)
    assert "| train en (10 pairs); test |" in (out / "report.md").read_text()


def test_a_run_at_chance_says_so(run: Path, tmp_path: Path) -> None:
    from xeval.report import load_results, render, summarize

    results = load_results(str(run))
    for seed in results["seeds"]:
        for scores in seed["test"].values():  # every example predicted "neutral"
            scores["confusion"] = [[0, sum(row), 0] for row in scores["confusion"]]
            scores["accuracy"] = scores["confusion"][1][1] / scores["n"]
    results["summary"] = summarize(results)
    render([results], tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "predict (nearly) one label for every example" in md and "within noise of chance" in md
    assert "| % predicted entailment | % predicted neutral |" in md.replace("| run | seed ", "|")
    assert "| 0.0 | 100.0 | 0.0 |" in md


def test_the_report_in_a_browser(run: Path) -> None:
    from conftest import ROOT, open_in_chromium

    seen = open_in_chromium(run / "report.html", ROOT / "out" / "screenshots" / "xnli-report.png")
    assert seen["images"] == 2 and seen["broken"] == 0, seen
    assert seen["tables"] >= 5 and not seen["errors"] and not seen["console_errors"], seen
    assert seen["screenshot"]


def test_hf_model_dir_with_both_engines(exported: Path, tmp_path: Path) -> None:
    """A directory written by HF itself (save_pretrained) runs through our code and through HF's."""
    from transformers import AutoTokenizer, XLMRobertaForMaskedLM

    hf_dir = tmp_path / "hf"
    XLMRobertaForMaskedLM.from_pretrained(exported).save_pretrained(hf_dir)
    AutoTokenizer.from_pretrained(exported).save_pretrained(hf_dir)
    accuracy = {}
    for engine in ("ours", "hf"):
        out = tmp_path / f"out-{engine}"  # not tmp_path / "hf", the model's own folder
        assert xeval("xnli", "--model", str(hf_dir), "--data", str(FIXTURES), "--out", str(out), "--languages", "en,de",
                     "--seeds", "3", "--engine", engine, *ARGS) == 0
        results = json.loads((out / "results.json").read_text())
        assert results["model"]["engine"] == engine and results["model"]["head"] == "fresh"
        accuracy[engine] = results["seeds"][0]["test"]
    assert set(accuracy["ours"]) == set(accuracy["hf"]) == {"en", "de"}
    for lang in ("en", "de"):  # each engine tested every pair of the fixtures, each pair once
        ours, hf = accuracy["ours"][lang], accuracy["hf"][lang]
        assert ours["n"] == hf["n"] > 0 and sum(map(sum, ours["confusion"])) == sum(map(sum, hf["confusion"])) == ours["n"]


def test_a_trained_classifier_keeps_its_head_and_is_not_comparable(run: Path, tmp_path: Path) -> None:
    """A *ForSequenceClassification folder (here a seed's saved model) is fine-tuned from its trained head
    by both engines: results.json says so, and the run is not set beside the published rows."""
    from xeval.report import load_results, why_not_comparable

    classifier = run / "models" / "seed-1"
    for engine in ("ours", "hf"):
        out = tmp_path / engine
        assert xeval("xnli", "--model", str(classifier), "--data", str(FIXTURES), "--out", str(out), "--languages", "en",
                     "--seeds", "1", "--engine", engine, *ARGS, "--epochs", "1") == 0
        results = load_results(str(out))
        assert results["model"]["head"] == "kept", engine
        assert "fine-tuned from the model folder's trained classifier head, not a fresh one" in why_not_comparable(results)
        assert "its classifier head kept" in (out / "report.md").read_text()
    full = fifteen_language_run(load_results(str(run)))
    assert not why_not_comparable(full)
    full["model"]["head"] = "kept"
    assert why_not_comparable(full) == "fine-tuned from the model folder's trained classifier head, not a fresh one"


def _error(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert xeval(*argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_bad_input_is_one_line(exported: Path, tmp_path: Path, capsys) -> None:
    common = ["--out", str(tmp_path / "out"), "--seeds", "1", *ARGS]
    assert "no such file or directory" in _error(capsys, "xnli", "--model", str(tmp_path / "nope"), "--data", str(FIXTURES), *common)
    assert "neither an HF model directory" in _error(capsys, "xnli", "--model", str(tmp_path), "--data", str(FIXTURES), *common)
    # missing language: the fixtures' XNLI-1.0 files lack no language, so drop one from a copy
    data = tmp_path / "data"
    shutil.copytree(FIXTURES, data)
    for split in ("dev", "test"):
        path = data / "XNLI-1.0" / f"xnli.{split}.tsv"
        path.write_text("".join(line for line in path.read_text().splitlines(True) if not line.startswith("sw\t")))
    line = _error(capsys, "xnli", "--model", str(exported), "--data", str(data), "--languages", "en,sw", *common)
    assert "xnli.dev.tsv: no dev examples for language sw" in line
    (data / "XNLI-1.0" / "xnli.test.tsv").unlink()
    assert "no test data for language en" in _error(capsys, "xnli", "--model", str(exported), "--data", str(data),
                                                     "--languages", "en", *common)
    # label set mismatch: a 2-label classifier
    two = tmp_path / "two-labels"
    shutil.copytree(exported, two)
    config = json.loads((two / "config.json").read_text())
    config.update(architectures=["XLMRobertaForSequenceClassification"], id2label={"0": "yes", "1": "no"})
    (two / "config.json").write_text(json.dumps(config))
    assert "label set mismatch" in _error(capsys, "xnli", "--model", str(two), "--data", str(FIXTURES), "--languages", "en", *common)
    assert "languages ['xx'] are not XNLI languages" in _error(capsys, "xnli", "--model", str(exported), "--data",
                                                               str(FIXTURES), "--languages", "en,xx", *common)
    # found before any fine-tuning: an --out that cannot be the report folder, a --max-length past the
    # model's positions, a tokenizer without its files or with more tokens than the model embeds
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert f"--out {afile}: {afile} is a file, not a folder" in _error(
        capsys, "xnli", "--model", str(exported), "--data", str(FIXTURES), *common, "--out", str(afile))
    assert "max_length 1024: the model" in _error(capsys, "xnli", "--model", str(exported), "--data", str(FIXTURES),
                                                 *common, "--max-length", "1024")
    bare = tmp_path / "no-tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(exported / name, bare / name)
    assert "the tokenizer has no vocabulary" in _error(capsys, "xnli", "--model", str(bare), "--data", str(FIXTURES), *common)
    grown = tmp_path / "grown-tokenizer"
    shutil.copytree(exported, grown)
    tokenizer = load_tokenizer(str(exported))
    vocab = len(tokenizer)
    tokenizer.add_tokens([f"newword{i}" for i in range(50)])
    tokenizer.save_pretrained(grown)
    for engine in ("hf", "ours"):
        assert f"the tokenizer has {vocab + 50} tokens, more than the {vocab} the model" in _error(
            capsys, "xnli", "--model", str(grown), "--data", str(FIXTURES), *common, "--engine", engine)
    unpadded = tmp_path / "no-pad-token"
    shutil.copytree(exported, unpadded)
    config = json.loads((unpadded / "tokenizer_config.json").read_text())
    (unpadded / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": None}))
    special = json.loads((unpadded / "special_tokens_map.json").read_text())
    (unpadded / "special_tokens_map.json").write_text(json.dumps({k: v for k, v in special.items() if k != "pad_token"}))
    assert load_tokenizer(str(unpadded)).pad_token_id is None
    assert "the tokenizer has no padding token" in _error(capsys, "xnli", "--model", str(unpadded), "--data",
                                                         str(FIXTURES), *common, "--engine", "hf")
    assert afile.read_text() == "mine" and not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exited:  # argparse's own line (exit 2)
        xeval("xnli", "--model", str(exported), "--data", str(FIXTURES), *common, "--seeds", "1,a")
    assert exited.value.code == 2
    assert "argument --seeds: expected comma-separated whole numbers, e.g. 1,2,3; got '1,a'" in capsys.readouterr().err


def test_an_hf_model_without_a_head_ours_loads_goes_to_hf(exported: Path, tmp_path: Path, capsys) -> None:
    from xeval.model import choose_engine

    bare = tmp_path / "bare-encoder"
    shutil.copytree(exported, bare)
    config = json.loads((bare / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**config, "architectures": ["XLMRobertaModel"]}))
    assert choose_engine("auto", str(exported)) == "ours" and choose_engine("auto", str(bare)) == "hf"
    with pytest.raises(UserError, match="architecture XLMRobertaModel has no head ours loads"):
        choose_engine("ours", str(bare))
    (bare / "config.json").write_text(json.dumps({**config, "architectures": ["XLMRobertaForSequenceClassification"],
                                                  "id2label": {"a": "entailment", "b": "neutral", "c": "contradiction"}}))
    common = ["--data", str(FIXTURES), "--out", str(tmp_path / "out"), "--languages", "en", *ARGS]
    assert "config.json: id2label must map label ids (0, 1, 2) to names" in _error(capsys, "xnli", "--model", str(bare), *common)
    (bare / "config.json").write_text("[1, 2]")
    assert f"HF model config {bare}/config.json: expected a JSON object" in _error(capsys, "xnli", "--model", str(bare), *common)
    assert "seeds must be a non-empty list of distinct integers from 0 to 2^32-1" in _error(
        capsys, "xnli", "--model", str(exported), *common, "--seeds", "5000000000000000000")


def test_segment_ids_go_to_an_hf_model_that_takes_them(tmp_path: Path) -> None:
    """BERT's family (mBERT, the usual XNLI baseline) tells premise from hypothesis by segment ids:
    the hf engine passes them, as HF's Trainer passes every input its tokenizer makes."""
    from transformers import BertTokenizerFast

    from xeval.data import NLISet
    from xeval.finetune import encode

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"]) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    nli = NLISet("en")
    nli.add("a b", "c", 0)
    nli.add("a", "b c c", 1)
    encoded = encode(tokenizer, nli, 16, segments=True)
    assert encoded.types == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1, 1]]
    assert encoded.inputs([0, 1], 0, "cpu")["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1]]
    plain = encode(tokenizer, nli, 16)  # our engine: XLM-R and mDeBERTa take none
    assert plain.types is None and sorted(plain.inputs([1], 0, "cpu")) == ["attention_mask", "input_ids"]


def test_report_of_an_edited_results_file_is_one_line(run: Path, tmp_path: Path, capsys) -> None:
    results = json.loads((run / "results.json").read_text())
    del results["seeds"][1]["selected"]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(results))
    assert f"{edited}: not as xeval writes it (KeyError: 'selected')" in _error(
        capsys, "report", str(edited), "--out", str(tmp_path / "report"))
    del results["mode"]
    edited.write_text(json.dumps(results))
    assert f"{edited}: not as xeval writes it (no 'mode')" in _error(capsys, "report", str(edited), "--out", str(tmp_path / "report"))
    edited.write_bytes(json.dumps(results).encode("utf-16"))  # a BOM: UnicodeDecodeError's traceback
    assert f"{edited}: not UTF-8 text, so not a results.json" in _error(capsys, "report", str(edited), "--out",
                                                                         str(tmp_path / "report"))


def test_a_failed_run_keeps_the_last_results_and_their_models(run: Path, exported: Path, tmp_path: Path,
                                                              monkeypatch) -> None:
    """--save-models writes each seed's model aside until the run's results.json is written: a run
    that fails after saving one leaves the previous run's results and models as they were; a run
    without --save-models takes away the models that went with the results it replaces."""
    from xeval import finetune as finetuning

    out = tmp_path / "out"
    shutil.copytree(run, out)
    files = lambda: {p.relative_to(out): p.read_bytes() for p in out.rglob("*")  # noqa: E731
                     if p.is_file() and "models.tmp" not in p.parts}
    before = files()
    assert any(p.parts[0] == "models" for p in before)
    finetune, calls = finetuning.finetune, []

    def second_seed_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the machine went away")
        return finetune(*args, **kwargs)

    monkeypatch.setattr(finetuning, "finetune", second_seed_fails)
    common = ["--model", str(exported), "--data", str(FIXTURES), "--out", str(out), "--languages", "en", *ARGS]
    with pytest.raises(RuntimeError, match="the machine went away"):
        xeval("xnli", *common, "--seeds", "7,8", "--save-models")
    assert len(calls) == 2 and files() == before and (out / "models.tmp" / "seed-7").is_dir()
    monkeypatch.undo()
    assert xeval("xnli", *common, "--seeds", "7") == 0
    assert not (out / "models").exists() and not (out / "models.tmp").exists()
    assert json.loads((out / "results.json").read_text())["config"]["seeds"] == [7]


def test_translate_train_all_and_yaml_config(exported: Path, tmp_path: Path, capsys) -> None:
    config = tmp_path / "xnli.yaml"
    config.write_text("languages: [en, fr, de, es]\nseeds: [4]\nepochs: 1\ntranslate_train_all: true\neval_every: 2\n")
    out = tmp_path / "tta"
    assert xeval("xnli", "--config", str(config), "--model", str(exported), "--data", str(FIXTURES), "--out", str(out),
                 *ARGS[2:]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "translate-train-all"
    assert results["data"]["train_languages"] == ["en", "fr", "de"]  # es has no training file
    assert [f["examples"] for f in results["data"]["files"]["train"]] == [{"en": 24}, {"fr": 6}, {"de": 6}]
    assert [p["step"] for p in results["seeds"][0]["history"]] == [2, 4, 5]  # every 2 steps + epoch end (ceil(36 / 8))
    assert xeval("xnli", "--config", str(config), "--model", str(exported), "--data", str(FIXTURES), "--out",
                 str(tmp_path / "tta-fr"), "--languages", "fr,es", "--select", "fr", *ARGS[2:]) == 0
    results = json.loads((tmp_path / "tta-fr" / "results.json").read_text())
    assert results["data"]["train_languages"] == ["en", "fr"]  # English is trained on though not tested
    twice = tmp_path / "twice"  # two training files for fr: the user's to settle, not fr left out of training
    shutil.copytree(FIXTURES, twice)
    (twice / "copy").mkdir()
    shutil.copy(next(FIXTURES.rglob("multinli.train.fr.tsv")), twice / "copy")
    assert "2 files named multinli.train.fr.tsv" in _error(capsys, "xnli", "--config", str(config), "--model",
                                                           str(exported), "--data", str(twice), "--out",
                                                           str(tmp_path / "tta-twice"), *ARGS[2:])
    config.write_text("languages: [en]\nlearning_rat: 0.1\n")
    assert "unknown config key 'learning_rat'" in _error(capsys, "xnli", "--config", str(config), "--model", str(exported),
                                                         "--data", str(FIXTURES), "--out", str(out))


@pytest.mark.slow
def test_two_ranks_match_one(exported: Path, tmp_path: Path) -> None:
    """The DeepSpeed launcher with 2 CPU ranks (gloo, each half of every batch) gives the single process's
    results when dropout is off (the gradient is the same mean; only float summation order differs)."""
    import os
    import socket
    import subprocess
    import sys

    model = tmp_path / "nodropout"
    shutil.copytree(exported, model)
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model / "config.json").write_text(json.dumps(config))
    common = ["--model", str(model), "--data", str(FIXTURES), "--languages", "en,fr,zh", "--seeds", "1", *ARGS]
    assert xeval("xnli", "--out", str(tmp_path / "one"), *common) == 0
    launch_env = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {**{k: v for k, v in os.environ.items() if k not in launch_env}, "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    proc = subprocess.run([str(Path(sys.executable).with_name("deepspeed")), "--num_nodes", "1", "--num_accelerators", "2",
                           "--master_port", port, "--no_local_rank", "--module", "xeval", "xnli", "--out", str(tmp_path / "two"), *common],
                          env=env, cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two"))
    assert two["environment"]["world_size"] == 2
    assert [p["score"] for p in one["seeds"][0]["history"]] == [p["score"] for p in two["seeds"][0]["history"]]
    # the training loss is the global batch's on every rank count (rank 0 logged its own half of it)
    assert [p["train_loss"] for p in two["seeds"][0]["history"]] == pytest.approx(
        [p["train_loss"] for p in one["seeds"][0]["history"]], rel=1e-4)
    assert one["seeds"][0]["test"] == two["seeds"][0]["test"]
