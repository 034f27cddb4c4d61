"""Zero-shot cross-lingual evaluation: XNLI fine-tuning on English, test on 15 languages, transfer reports."""
