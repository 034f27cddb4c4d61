"""Cross-lingual pretraining: tokenizer, token shards, mixing MLM loader, XLM-R / mDeBERTa-v3 models, DeepSpeed trainer."""
