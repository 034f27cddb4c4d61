"""Shared helpers of the model tests (no tests here): a small SentencePiece tokenizer trained on the
bundled reference text with the contract's ids, real-text batches, masking, and HF model loading."""
from __future__ import annotations

import functools
import io
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "data" / "sample" / "ref"


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run on one torch thread: on the shared 2-core machine two threads spin against
    other processes and a training step gets ~10x slower. Restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.lru_cache(maxsize=1)
def reference_lines() -> tuple[str, ...]:
    """The first 150 non-empty lines of every language's reference text (11 languages)."""
    lines: list[str] = []
    for path in sorted(REF.glob("*.txt")):
        lines += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()][:150]
    return tuple(lines)


@functools.lru_cache(maxsize=1)
def sample_spm():
    """(SentencePieceProcessor, V): ids <s>=0 <pad>=1 </s>=2 <unk>=3, pieces 4..V-2, <mask>=V-1."""
    import sentencepiece as spm

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(reference_lines()), model_writer=buffer, vocab_size=2000,
                                   model_type="unigram", bos_id=0, pad_id=1, eos_id=2, unk_id=3,
                                   character_coverage=0.9995, num_threads=1, minloglevel=2)
    processor = spm.SentencePieceProcessor(model_proto=buffer.getvalue())
    return processor, processor.get_piece_size() + 1


def text_batch(batch_size: int, seq_len: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of ``<s> text </s>`` rows of real text, right-padded with <pad>=1:
    row i holds line start+i*97 (languages interleave), cut to seq_len - i*seq_len/batch_size tokens
    (row 0 full, the others padded)."""
    processor, _ = sample_spm()
    lines = reference_lines()
    ids = torch.full((batch_size, seq_len), 1, dtype=torch.long)
    for row in range(batch_size):
        limit = max(4, seq_len - row * (seq_len // batch_size))
        pieces = [0] + processor.encode(lines[(start + row * 97) % len(lines)])[: limit - 2] + [2]
        ids[row, : len(pieces)] = torch.tensor(pieces)
    return ids, ids.ne(1).long()


def mask_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab_size: int, seed: int,
               prob: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked input_ids, labels): ``prob`` of the ordinary tokens predicted, replaced by <mask>=V-1."""
    generator = torch.Generator().manual_seed(seed)
    ordinary = attention_mask.bool() & input_ids.ge(4)
    chosen = ordinary & (torch.rand(input_ids.shape, generator=generator) < prob)
    chosen[0, 1] = True
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    return torch.where(chosen, torch.full_like(input_ids, vocab_size - 1), input_ids), labels


def max_diff_at_tokens(a: torch.Tensor, b: torch.Tensor, attention_mask: torch.Tensor) -> float:
    """Largest absolute difference of [B, S, ...] tensors over the real (non-pad) tokens."""
    real = attention_mask.bool()
    return (a[real] - b[real]).abs().max().item()


def check_hf_round_trip(ours: torch.nn.Module, cfg, directory: Path, hf_class: str) -> None:
    """ours -> save_hf -> HF loads it as ``hf_class`` with every weight, same logits on real padded
    text (<= 1e-5) -> load_hf gives back the same config and bit-identical weights."""
    import transformers

    from pretrain.models.hf import load_hf, save_hf

    save_hf(ours, cfg, directory)
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(directory, output_loading_info=True)
    assert type(hf).__name__ == hf_class
    assert not info["missing_keys"] and not info["unexpected_keys"]
    input_ids, attention_mask = text_batch(3, 48, start=5)
    with torch.no_grad():
        diff = (hf.eval()(input_ids=input_ids, attention_mask=attention_mask).logits
                - ours.eval().logits(input_ids, attention_mask)).abs().max().item()
    assert diff <= 1e-5
    cfg_back, back = load_hf(directory)
    assert cfg_back == cfg
    original, loaded = ours.state_dict(), back.state_dict()
    assert original.keys() == loaded.keys()
    assert all(torch.equal(original[key], loaded[key]) for key in original)


def check_classifier_parity(hf: torch.nn.Module, directory: Path) -> None:
    """An HF sequence classifier saved by HF, imported by load_hf: same logits and loss on real
    padded text; written back by save_hf with label names, HF reads the same logits and load_hf the
    same weights."""
    import transformers

    from pretrain.models.hf import load_hf, save_hf

    hf.eval().save_pretrained(directory / "hf")
    cfg, ours = load_hf(directory / "hf")
    input_ids, attention_mask = text_batch(4, 40, start=3)
    labels = torch.tensor([0, 2, 1, 2])
    with torch.no_grad():
        expected = hf(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        got = ours.eval()(input_ids, attention_mask, labels)
    assert got.logits.shape == (4, 3)
    assert (got.logits - expected.logits).abs().max().item() <= 1e-5
    assert abs(got.loss.item() - expected.loss.item()) <= 1e-5
    save_hf(ours, cfg, directory / "ours", labels=["entailment", "neutral", "contradiction"])
    again = transformers.AutoModelForSequenceClassification.from_pretrained(directory / "ours").eval()
    assert again.config.id2label[2] == "contradiction"
    with torch.no_grad():
        assert (again(input_ids=input_ids, attention_mask=attention_mask).logits
                - expected.logits).abs().max().item() <= 1e-6
    _, back = load_hf(directory / "ours")
    assert all(torch.equal(value, back.state_dict()[key]) for key, value in ours.state_dict().items())
