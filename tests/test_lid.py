"""Language ID with lid.176 on real sentences in the sample's languages."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.steps.base import Drop
from pipeline.util.errors import UserError
from pipeline.steps.lid import LanguageIdentifier, LidConfig, default_model_path, round_like_numpy

LANGS = ["ar", "de", "el", "en", "es", "fr", "hi", "ru", "tr", "vi", "zh"]


@pytest.fixture(scope="module")
def lid() -> LanguageIdentifier:
    return LanguageIdentifier(LidConfig())


def real_lines(sample, lang: str, n: int = 30) -> list[str]:
    lines = [line for line in (sample / "ref" / f"{lang}.txt").read_text(encoding="utf-8").splitlines()
             if len(line) >= 80]
    return lines[:: max(1, len(lines) // n)][:n]


@pytest.mark.parametrize("lang", LANGS)
def test_real_sentences_get_their_language(lid, sample, lang):
    lines = real_lines(sample, lang)
    assert len(lines) >= 20
    predicted = [lid.predict(line)[0] for line in lines]
    assert sum(p == lang for p in predicted) / len(lines) >= 0.9, predicted


def test_document_lines_are_joined_with_spaces(lid, sample):
    text = "\n".join(real_lines(sample, "de", 5))
    doc = lid({"text": text})
    assert doc["lang"] == "de" and 0.5 <= doc["lang_score"] <= 1.0


def test_thresholds_and_unknown(lid):
    ambiguous = {"text": "ok 123 ??? --"}
    strict = LanguageIdentifier(LidConfig(threshold=0.99, thresholds={"en": 0.1}, below_threshold="unknown"))
    label, score, _ = lid.predict(ambiguous["text"])
    assert label == "en" and 0.1 <= score < 0.99
    assert LanguageIdentifier(LidConfig(threshold=0.99))(ambiguous) == Drop("below_threshold")
    assert strict(ambiguous)["lang"] == "en"  # over en's own threshold, under the default
    assert strict.predict("Guten Tag")[0] == "de" and strict({"text": "Guten Tag"})["lang"] == "unknown"  # under 0.99
    assert strict({"text": "This is clearly an English sentence about the weather."})["lang"] == "en"


def test_ccnet_rounds_the_score_before_the_threshold_and_deletes_newlines(lid):
    """CCNet's Classifier: text.replace("\\n", ""), scores.round(2), then ``< threshold``."""
    text = "Das ist ein\nSatz"
    labels, scores = lid.model.predict(text.replace("\n", ""), k=1)
    ccnet = LanguageIdentifier(LidConfig(newlines="delete", score_digits=2, threshold_on_rounded=True))
    doc = ccnet({"text": text})
    assert (doc["lang"], doc["lang_score"]) == (labels[0].removeprefix("__label__"), float(scores.round(2)[0]))
    sentence = {"text": "Das ist ein Satz über das Wetter"}  # scored 0.9999969: rounds up to 1.0
    score = float(lid.model.predict(sentence["text"], k=1)[1][0])
    threshold = (score + 1.0) / 2
    assert score < threshold < round(score, 2)
    assert LanguageIdentifier(LidConfig(threshold=threshold, newlines="delete", score_digits=2, threshold_on_rounded=True))(sentence)["lang"] == "de"
    assert LanguageIdentifier(LidConfig(threshold=threshold, newlines="delete", score_digits=2))(sentence) == Drop("below_threshold")


def test_default_model_is_the_wheel_file():
    assert default_model_path().endswith("resources/lid.176.ftz")


def test_bad_model_path_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        LanguageIdentifier(LidConfig(model=str(tmp_path / "missing.bin"))).model
    bad = tmp_path / "garbage.bin"
    bad.write_bytes(b"not a model")
    with pytest.raises(UserError, match="not a fastText model"):
        LanguageIdentifier(LidConfig(model=str(bad))).model


def test_broken_models_are_found_before_the_job(tmp_path):
    """A directory, an empty file, a fastText header with a garbage body, a truncated model: one
    error line each before any work (fastText itself crashes the process on a truncated file)."""
    from pipeline.steps.lid import check_model

    model = Path(default_model_path()).read_bytes()
    (tmp_path / "dir.bin").mkdir()
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "garbage.bin").write_bytes(model[:16] + b"x" * 5000)
    (tmp_path / "truncated.ftz").write_bytes(model[: len(model) // 2])
    for name, message in [("dir.bin", "is a directory"), ("empty.bin", r"not a fastText model \(bad header\)"),
                          ("garbage.bin", "fastText cannot load it, the file is truncated or corrupt"),
                          ("truncated.ftz", "fastText cannot load it, the file is truncated or corrupt")]:
        with pytest.raises(UserError, match=message):
            check_model(str(tmp_path / name))
    labels = check_model(None)  # lid.176's languages: the wheel's model, loaded in this process
    assert len(labels) == 176 and {"en", "zh", "sw", "no"} <= labels
    assert check_model(default_model_path()) == labels  # the same file given by a user: loaded in a child


def test_predict_equals_fasttexts_public_predict_and_numpys_round(lid, sample):
    """The binding called directly gives what ``FastText.predict`` and CCNet's ``np.round`` give."""
    steps = {digits: LanguageIdentifier(LidConfig(score_digits=digits)) for digits in (0, 2, 4, 17)}
    for step in steps.values():
        step._model = lid.model
    for lang in LANGS:
        for line in real_lines(sample, lang, 10):
            labels, scores = lid.model.predict(line, k=1)
            for digits, step in steps.items():
                ours = step.predict(line)
                assert ours == (labels[0].removeprefix("__label__"), min(float(scores[0]), 1.0),
                                float(np.round(scores, digits)[0]))


@pytest.mark.parametrize("cfg", [LidConfig(), LidConfig(threshold=0.9, thresholds={"en": 0.2}),
                                 LidConfig(threshold=0.9, below_threshold="unknown"),
                                 LidConfig(newlines="delete", score_digits=2, threshold_on_rounded=True, threshold=0.6)])
def test_a_chunk_at_once_gives_each_documents_own_result(lid, sample, cfg):
    """``apply_chunk`` (one ``multilinePredict`` call) returns what ``__call__`` returns for each
    document, drops and their languages included, on real multi-line documents of every language."""
    step = LanguageIdentifier(cfg)
    step._model = lid.model
    docs = [{"id": f"{lang}{i}", "text": "\n".join(real_lines(sample, lang, 12)[i:i + 1 + i % 3])}
            for lang in LANGS for i in range(8)]
    docs += [{"id": "short", "text": "ok 123 ??? --"}, {"id": "empty", "text": ""}, {"id": "lines", "text": "\n\n"}]
    one = [step(doc) for doc in docs]
    chunk = step.apply_chunk(docs)
    assert chunk == one and [r.lang for r in chunk if isinstance(r, Drop)] == [r.lang for r in one if isinstance(r, Drop)]
    kept_unknown = [r for r in one if not isinstance(r, Drop) and r["lang"] == "unknown"]
    assert (kept_unknown if cfg.below_threshold == "unknown" else [r for r in one if isinstance(r, Drop)])
    assert step.apply_chunk([]) == []


def test_round_like_numpy_on_halves_and_random_scores():
    rng = np.random.default_rng(0)
    values = [*rng.random(20_000), *(k / 2000 for k in range(2001)), *(k / 20 + 0.005 for k in range(20)),
              0.125, 0.375, 1.0000001, 0.9999969, 0.0]
    for digits in (0, 1, 2, 3, 4, 6, 17):
        assert [round_like_numpy(v, digits) for v in values] == [float(np.round(v, digits)) for v in values]
