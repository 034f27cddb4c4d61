"""XLM-R and mDeBERTa-v3 (disentangled attention, replaced-token detection with GDES) in PyTorch,
weight-compatible with HF transformers (see :mod:`pretrain.models.hf`)."""
from __future__ import annotations

from .config import ModelConfig, load_model_config, model_config_from_dict
from .heads import ClassifierOutput, PretrainOutput
from .modeling import (Classifier, MaskedLM, build_classifier, build_pretraining_model, classifier_from_pretrained,
                       encoder_state_dict)

__all__ = [
    "Classifier", "ClassifierOutput", "MaskedLM", "ModelConfig", "PretrainOutput", "build_classifier",
    "build_pretraining_model", "classifier_from_pretrained", "encoder_state_dict", "load_model_config",
    "model_config_from_dict",
]
