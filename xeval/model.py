"""The classifier to fine-tune and its tokenizer, from one of our checkpoints or an HF model directory.

Engines:

- ``ours``: this project's encoders (``pretrain.models.build_classifier`` /
  ``classifier_from_pretrained``), loaded from a training checkpoint
  (``pretrain.checkpoint.load_for_inference``) or an HF directory (``pretrain.models.hf.load_hf``:
  XLM-R and DeBERTa-v2/v3 MaskedLM or SequenceClassification dirs); saved with ``save_hf``.
- ``hf``: ``transformers.AutoModelForSequenceClassification`` on an HF directory (any architecture).
- ``auto``: ``ours`` when the project's model code supports the input, else ``hf`` for an HF directory.

A model is resolved and read once (:func:`load_pretrained`) and every seed's classifier is built from
those weights: a training run's ``latest`` moved by a pretraining that still writes changes no seed.
Each seed draws a fresh NLI head, except from a ``*ForSequenceClassification`` folder, whose trained
head is kept (its labels checked): ``info["head"]`` says which, and the report does not set such a run
beside the published rows.

The tokenizer is always HF's, from the model (or the checkpoint's tokenizer) directory, so sentence
pairs are encoded exactly as HF encodes them (XLM-R ``<s> A </s></s> B </s>``, DeBERTa
``[CLS] A [SEP] B [SEP]``).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Callable

import torch

from pipeline.util.errors import UserError, first_line

from .data import LABELS

OUR_MODEL_TYPES = {"xlm-roberta": "xlmr", "deberta-v2": "deberta-v3"}
"""HF ``model_type`` -> our arch, for the model types our code converts."""


@dataclasses.dataclass
class Classifier:
    """A sequence-pair classifier (``module(input_ids=, attention_mask=).logits``), ``save(module, dir)``, provenance."""

    module: torch.nn.Module
    save: Callable[[torch.nn.Module, Path], None]
    info: dict[str, Any]
    vocab_size: int
    """Rows of its token embedding: a tokenizer giving larger ids is not its own."""
    max_length: int | None
    """Longest input it takes (absolute positions); None where it has relative positions only."""


@dataclasses.dataclass
class Pretrained:
    """A model resolved and read once (:func:`load_pretrained`) and its HF tokenizer."""

    build: Callable[[], Classifier]
    """A new classifier of these weights for one seed, its head fresh (drawn from torch's current RNG) or
    the folder's own (a sequence classifier's)."""
    tokenizer: Any


def hf_max_length(config: Any) -> int | None:
    """The longest input of an HF model: ``max_position_embeddings``, less the positions RoBERTa's
    family skips (its ids start after ``pad_token_id``); None for a DeBERTa with relative positions only."""
    if config.model_type.startswith("deberta") and not getattr(config, "position_biased_input", True):
        return None
    skipped = config.pad_token_id + 1 if config.model_type in ("roberta", "xlm-roberta", "camembert") else 0
    return config.max_position_embeddings - skipped


def _hf_config(path: Path) -> dict[str, Any]:
    from pipeline.output import fs

    return fs.read_json(path / "config.json", what="HF model config")


def model_kind(path: str) -> str:
    """``hf`` (a dir with config.json) or ``checkpoint`` (our run/checkpoints/step dir); else a UserError."""
    root = Path(path)
    if not root.exists():
        raise UserError(f"--model {path}: no such file or directory")
    if (root / "config.json").is_file():
        return "hf"
    if root.is_dir() and ((root / "checkpoints").is_dir() or (root / "latest").is_file()
                          or (root / "meta.json").is_file() or list(root.glob("*model_states.pt"))):
        return "checkpoint"
    raise UserError(f"--model {path}: neither an HF model directory (config.json) nor a training run or checkpoint directory")


def _ours_available() -> bool:
    try:
        from pretrain.models import build_classifier, classifier_from_pretrained  # noqa: F401
        from pretrain.models.hf import load_hf, save_hf  # noqa: F401
    except ImportError:
        return False
    return True


def _ours_can_load(config: dict[str, Any]) -> bool:
    """Whether our model code loads the HF model of ``config``: one of our model types, as a masked
    LM or a sequence classifier (or with no architecture named), as ``pretrain.models.hf.load_hf`` takes it."""
    architecture = (config.get("architectures") or [""])[0]
    return config.get("model_type") in OUR_MODEL_TYPES and (
        not architecture or architecture.endswith(("ForMaskedLM", "ForSequenceClassification")))


def choose_engine(engine: str, path: str) -> str:
    """The engine ``auto`` resolves to for ``path``; an impossible explicit choice is a UserError."""
    kind = model_kind(path)
    ours_ok = _ours_available() and (kind == "checkpoint" or _ours_can_load(_hf_config(Path(path))))
    if engine == "auto":
        engine = "ours" if ours_ok else "hf"
    if engine == "ours" and not ours_ok:
        config = _hf_config(Path(path))
        why = ("pretrain.models has no build_classifier / hf.load_hf yet" if not _ours_available()
               else f"model_type {config.get('model_type')!r} is not one of {', '.join(OUR_MODEL_TYPES)}"
               if config.get("model_type") not in OUR_MODEL_TYPES else
               f"architecture {(config.get('architectures') or [''])[0]} has no head ours loads "
               "(*ForMaskedLM, *ForSequenceClassification)")
        raise UserError(f"--engine ours cannot load {path}: {why}")
    if engine == "hf" and kind != "hf":
        raise UserError(f"--engine hf needs an HF model directory; {path} is a training checkpoint "
                        "(use --engine ours or auto, or `python -m pretrain export` it first)")
    return engine


def load_tokenizer(directory: str) -> Any:
    """HF's tokenizer for ``directory`` (AutoTokenizer; tokenizer dirs of ours hold both SP layouts)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError, TypeError) as exc:
        if (Path(directory) / "sentencepiece.bpe.model").is_file():
            from transformers import XLMRobertaTokenizer
            return XLMRobertaTokenizer.from_pretrained(directory)
        raise UserError(f"{directory}: no tokenizer HF can load ({first_line(exc)})") from None


def check_tokenizer(tokenizer: Any, directory: str, model: str, vocab_size: int | None) -> None:
    """The tokenizer has a vocabulary (HF builds one of its special tokens alone where the files are
    missing) and gives no id beyond the model's embeddings (a larger one is another model's)."""
    if len(tokenizer) <= len(tokenizer.all_special_tokens):
        raise UserError(f"{directory}: the tokenizer has no vocabulary, only its {len(tokenizer)} special tokens "
                        f"(its files, e.g. sentencepiece.bpe.model or tokenizer.json, are missing)")
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise UserError(f"{directory}: the tokenizer has {len(tokenizer)} tokens, more than the {vocab_size} the model "
                        f"{model} embeds: it is not that model's tokenizer")
    if tokenizer.pad_token_id is None:  # a batch of pairs is padded to its longest
        raise UserError(f"{directory}: the tokenizer has no padding token (its special_tokens_map.json or "
                        "tokenizer_config.json names no pad_token), which batches of sentence pairs need")


def weights_digest(path: Path) -> str:
    """sha256 over the model's weight files (safetensors / bin), for provenance."""
    digest = hashlib.sha256()
    files = sorted(list(path.glob("*.safetensors")) + list(path.glob("*.bin")) + list(path.glob("*.pt")))
    for file in files:
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest() if files else ""


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over a state dict's names, dtypes, shapes and bytes in name order: the weights a training
    checkpoint's files merge to, whatever their ZeRO partitioning."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def check_label_set(where: str, names: list[str]) -> None:
    """An existing classification head must have our 3 labels in our order (generic LABEL_i names pass)."""
    if len(names) != len(LABELS):
        raise UserError(f"{where}: a classifier with {len(names)} labels; NLI needs {len(LABELS)} "
                        f"({', '.join(LABELS)}) (label set mismatch)")
    if all(n.startswith("LABEL_") for n in names):
        return
    if [n.lower() for n in names] != list(LABELS):
        raise UserError(f"{where}: classifier labels {names} are not {list(LABELS)} in this order (label set mismatch)")


def _load_hf_engine(path: str, num_labels: int, digest: str) -> Classifier:
    from safetensors import SafetensorError
    from transformers import AutoModelForSequenceClassification

    config = _hf_config(Path(path))
    id2label = {i: name for i, name in enumerate(LABELS)}
    try:
        model, loading = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=num_labels, id2label=id2label, label2id={v: k for k, v in id2label.items()},
            output_loading_info=True)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        raise UserError(f"--model {path}: HF cannot load it as a sequence classifier ({first_line(exc)})") from None

    def save(module: torch.nn.Module, out: Path) -> None:
        module.save_pretrained(out)
        load_tokenizer(path).save_pretrained(out)

    head = [key for key in model.state_dict() if not key.startswith(f"{model.base_model_prefix}.")]
    kept = any(key not in loading["missing_keys"] for key in head)  # HF draws only what the folder lacks
    info = {"engine": "hf", "class": type(model).__name__, "model_type": config.get("model_type"),
            "weights_sha256": digest, "head": "kept" if kept else "fresh"}
    return Classifier(model, save, info, model.config.vocab_size, hf_max_length(model.config))


def _load_ours(path: str, kind: str, num_labels: int) -> tuple[Callable[[], Classifier], str, int]:
    """(classifier builder, tokenizer dir, vocabulary size) of ``path``, its weights read once; a training
    run or checkpoints dir is resolved to the checkpoint ``latest`` names now."""
    from pretrain.models import Classifier as OurClassifier
    from pretrain.models import classifier_from_pretrained
    from pretrain.models.hf import load_hf, save_hf

    loaded: torch.nn.Module | None = None
    if kind == "checkpoint":
        from pretrain.checkpoint import load_for_inference, read_meta, resolve_path
        directory, tag = resolve_path(path, flag="--model")
        cfg, pretraining, tokenizer_dir = load_for_inference(str(directory), tag=tag, flag="--model")
        state = pretraining.state_dict()
        provenance = {"checkpoint": {"dir": str((directory / tag).resolve()), "tag": tag,
                                     "step": read_meta(directory / tag)["step"]},
                      "weights_sha256": state_digest(state)}
    else:
        cfg, loaded = load_hf(path)
        tokenizer_dir = path
        state = loaded.state_dict()
        provenance = {"weights_sha256": weights_digest(Path(path))}

    def save(module: torch.nn.Module, out: Path) -> None:
        save_hf(module, cfg, out, tokenizer_dir=tokenizer_dir, labels=list(LABELS))

    def build() -> Classifier:
        model = (copy.deepcopy(loaded) if isinstance(loaded, OurClassifier)
                 else classifier_from_pretrained(cfg, state, num_labels))
        info = {"engine": "ours", "class": type(model).__name__, "arch": cfg.arch,
                "model_config": dataclasses.asdict(cfg), **provenance,
                "head": "kept" if isinstance(loaded, OurClassifier) else "fresh"}
        return Classifier(model, save, info, cfg.vocab_size, cfg.max_sequence_length)

    return build, tokenizer_dir, cfg.vocab_size


def load_pretrained(path: str, engine: str, num_labels: int = len(LABELS)) -> Pretrained:
    """``--model path`` resolved, checked and (engine ours) read once, with its HF tokenizer; each
    ``build()`` is a classifier with a fresh NLI head drawn from torch's current RNG, or the head of a
    ``*ForSequenceClassification`` folder (labels checked here)."""
    engine = choose_engine(engine, path)
    kind = model_kind(path)
    tokenizer = None
    if kind == "hf":  # its config and tokenizer checked before its weights load
        config = _hf_config(Path(path))
        if any("ForSequenceClassification" in a for a in config.get("architectures") or []):
            names = config.get("id2label") or {str(i): f"LABEL_{i}" for i in range(int(config.get("num_labels", 2)))}
            if not isinstance(names, dict) or not all(str(k).isdigit() for k in names):
                raise UserError(f"{path}/config.json: id2label must map label ids (0, 1, 2) to names, not {names!r}")
            check_label_set(f"{path}/config.json", [str(v) for _, v in sorted(names.items(), key=lambda kv: int(kv[0]))])
        tokenizer = load_tokenizer(path)
        check_tokenizer(tokenizer, path, path, config.get("vocab_size"))
    if engine == "ours":
        build, tokenizer_dir, vocab_size = _load_ours(path, kind, num_labels)
        if tokenizer is None:  # a training checkpoint's tokenizer dir
            tokenizer = load_tokenizer(tokenizer_dir)
            check_tokenizer(tokenizer, str(tokenizer_dir), path, vocab_size)
    else:  # an HF directory, read again for each seed (HF draws the missing head as it loads)
        digest = weights_digest(Path(path))
        build, tokenizer_dir = (lambda: _load_hf_engine(path, num_labels, digest)), path
    provenance = {"path": str(Path(path).resolve()), "kind": kind, "tokenizer_dir": str(tokenizer_dir),
                  "tokenizer_class": type(tokenizer).__name__}

    def built() -> Classifier:
        classifier = build()
        classifier.info.update({**provenance, "parameters": sum(p.numel() for p in classifier.module.parameters())})
        return classifier

    return Pretrained(built, tokenizer)
