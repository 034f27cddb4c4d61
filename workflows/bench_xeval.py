"""Benchmark of the XNLI evaluator on CPU (or --device cuda), two ratios against baselines measured in the same run:

1. evaluation: xeval's batched evaluation (``finetune.confusion``: batches of 128 pairs of similar length,
   right padding) vs a plain loop over the same model, one pair at a time (no padding); pairs/s.
2. fine-tuning: training steps/s of our encoder (``--engine ours``) vs HF's XLMRobertaForSequenceClassification
   (``--engine hf``) on the same batches.

The model is a random XLM-R (--hidden/--layers) with a SentencePiece tokenizer trained on the bundled
sample's reference text; the pairs are the hand-made XNLI fixtures repeated. Run:
``python workflows/bench_xeval.py [--hidden 256 --layers 4 --pairs 900 --train-steps 8]``
"""
from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def build_model(out: Path, hidden: int, layers: int) -> Path:
    """A random XLM-R MaskedLM dir (our save_hf) with a fairseq-layout SentencePiece tokenizer."""
    import sentencepiece as spm
    from transformers import XLMRobertaTokenizer

    from pretrain.models import build_pretraining_model, load_model_config
    from pretrain.models.hf import save_hf

    lines = [line for f in sorted((ROOT / "tests/data/sample/ref").glob("*.txt"))
             for line in f.read_text(encoding="utf-8").splitlines()[:400] if line.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=4000,
                                   character_coverage=0.9995, num_threads=1, minloglevel=2)
    tok_dir = out / "tok"
    tok_dir.mkdir(parents=True)
    (tok_dir / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    tokenizer = XLMRobertaTokenizer.from_pretrained(str(tok_dir))
    tokenizer.save_pretrained(str(tok_dir))
    cfg = load_model_config("xlmr-tiny", {"vocab_size": len(tokenizer), "hidden_size": hidden, "num_hidden_layers": layers,
                                          "num_attention_heads": max(1, hidden // 64), "intermediate_size": 4 * hidden})
    torch.manual_seed(0)
    return save_hf(build_pretraining_model(cfg), cfg, out / "model", tokenizer_dir=tok_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=900, help="evaluation pairs")
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    from xeval.data import XNLI_LANGUAGES, load_split
    from xeval.config import TrainConfig
    from xeval.finetune import Dist, Encoded, confusion, encode, finetune
    from xeval.model import load_pretrained

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp), args.hidden, args.layers)
        test, _ = load_split(ROOT / "tests/data/xnli", "test", XNLI_LANGUAGES)
        pretrained = load_pretrained(str(model_dir), "ours")
        classifier, tokenizer = pretrained.build(), pretrained.tokenizer
        classifier.module.to(args.device).eval()
        cfg = TrainConfig(max_length=128, device=args.device, batch_size=32, epochs=1, warmup=0.0)
        encoded = [encode(tokenizer, nli, 128) for nli in test.values()]
        ids = [i for e in encoded for i in e.ids]
        labels = [y for e in encoded for y in e.labels]
        reps = -(-args.pairs // len(ids))
        data = Encoded((ids * reps)[:args.pairs], (labels * reps)[:args.pairs])
        start = time.perf_counter()
        confusion(classifier, data, tokenizer.pad_token_id, cfg, Dist())
        ours = args.pairs / (time.perf_counter() - start)
        start = time.perf_counter()
        with torch.no_grad():
            for seq in data.ids:
                classifier.module(input_ids=torch.tensor([seq], device=args.device)).logits.argmax(-1)
        plain = args.pairs / (time.perf_counter() - start)
        print(f"evaluation ({args.pairs} pairs, hidden {args.hidden}, {args.layers} layers): xeval batched "
              f"{ours:.0f} pairs/s, baseline plain one-pair loop {plain:.0f} pairs/s, ratio {ours / plain:.2f}x")

        train = Encoded((ids * 4)[:args.train_steps * cfg.batch_size], (labels * 4)[:args.train_steps * cfg.batch_size])
        rates: dict[str, float] = {}
        for engine in ("ours", "hf") * 2:  # each twice, interleaved: the best run counts (the first pays warm-up)
            torch.manual_seed(0)
            classifier = load_pretrained(str(model_dir), engine).build()
            start = time.perf_counter()
            fit = finetune(classifier, train, {"en": Encoded(ids[:6], labels[:6])}, ["en"], tokenizer.pad_token_id,
                           cfg, 0, Dist(), log=lambda *_: None)
            rates[engine] = max(rates.get(engine, 0.0), fit["steps"] / (time.perf_counter() - start))
        print(f"fine-tuning (batch {cfg.batch_size}): ours {rates['ours']:.2f} steps/s, baseline HF "
              f"XLMRobertaForSequenceClassification {rates['hf']:.2f} steps/s, ratio {rates['ours'] / rates['hf']:.2f}x")


if __name__ == "__main__":
    main()
