"""DeepSpeed checkpoints of a training run, saved so that ``latest`` never names a broken one.

Layout: ``<run>/checkpoints/step-<N>/`` holds DeepSpeed's files (model states with our ``client_state``:
step, model config, tokenizer fingerprint and dir, rank 0's loader and RNG state; ZeRO optimizer
partitions), ``trainer_state_rank<R>.pt`` (each rank's loader and RNG state) and ``meta.json`` (the
client state without the per-rank parts, readable without torch). A save goes: DeepSpeed writes its
files (``save_latest=False``), every rank writes its state file (temp name + rename), all ranks
meet, rank 0 checks that every expected file is there and only then replaces ``latest`` (temp file +
``os.replace``), and prunes to the newest ``keep`` complete checkpoints (never the one ``latest``
names). A process killed anywhere in between leaves ``latest`` on the previous good checkpoint.
``step-<N>-universal/`` is DeepSpeed's universal form of ``step-<N>`` (``train --resume --universal``
converts to it), loadable on another rank count.

Fault injection for tests: ``PRETRAIN_FAULT=<point>@<step>`` with point ``mid_save`` (DeepSpeed's
files written, ``latest`` not yet moved) or ``after_save`` makes the process print
``fault point <point> step <N>`` to stderr and sleep until it is killed.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.util import faults
from pipeline.util.errors import UserError, first_line

TAG_PREFIX = "step-"
LATEST = "latest"
META = "meta.json"
RANK_STATE = "trainer_state_rank{rank}.pt"
UNIVERSAL_SUFFIX = "-universal"


def tag_for(step: int) -> str:
    return f"{TAG_PREFIX}{step}"


def step_of(tag: str) -> int | None:
    """The step of a ``step-<N>`` tag, None for other names."""
    suffix = tag[len(TAG_PREFIX):]
    return int(suffix) if tag.startswith(TAG_PREFIX) and suffix.isdigit() else None


def rng_state() -> dict[str, Any]:
    """This process's Python, numpy and torch (CPU and CUDA) random states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # this rank's device: the only one it draws on
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") if torch.cuda.is_available() else None
    if isinstance(cuda, list):  # a checkpoint of before: every device's state, this rank's at its device's index
        device = torch.cuda.current_device()
        cuda = cuda[device] if device < len(cuda) else None
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


def fault_point(point: str, step: int) -> None:
    """Test hook (see the module doc)."""
    faults.fault_point("PRETRAIN_FAULT", point, step)


def _write_atomic(path: Path, write: Any) -> None:
    """Write via ``write(tmp_path)`` then rename over ``path``, so readers see the old or the whole new file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def missing_files(tag_dir: Path, world_size: int) -> list[str]:
    """What a complete checkpoint written by ``world_size`` ranks lacks in ``tag_dir`` (empty: complete)."""
    missing = [RANK_STATE.format(rank=r) for r in range(world_size) if not (tag_dir / RANK_STATE.format(rank=r)).is_file()]
    if not (tag_dir / META).is_file():
        missing.append(META)
    if not list(tag_dir.glob("*model_states.pt")):
        missing.append("*model_states.pt")
    optim = len(list(tag_dir.glob("*optim_states.pt")))
    if optim != world_size:
        missing.append(f"{world_size - optim} of {world_size} *optim_states.pt")
    return missing


def read_meta(tag_dir: Path) -> dict[str, Any]:
    """The checkpoint's ``meta.json``; a missing, malformed or incomplete one is a UserError naming it."""
    from pipeline.output import fs

    if not (tag_dir / META).is_file():
        raise UserError(f"checkpoint {tag_dir}: no {META}; not a checkpoint written by `pretrain train` or an interrupted save")
    meta = fs.read_json(tag_dir / META, what="checkpoint")
    missing = [key for key in ("step", "world_size", "model_config", "tokenizer_dir", "tokenizer_fingerprint") if key not in meta]
    if missing:
        raise UserError(f"checkpoint {tag_dir / META}: lacks {', '.join(missing)}")
    return meta


def is_complete(tag_dir: Path) -> bool:
    return (tag_dir / META).is_file() and not missing_files(tag_dir, read_meta(tag_dir)["world_size"])


class CheckpointManager:
    """Saves, prunes and finds the checkpoints under ``directory`` for one rank of a run."""

    def __init__(self, directory: Path, keep: int, rank: int, world_size: int) -> None:
        self.directory = directory
        self.keep = keep
        self.rank = rank
        self.world_size = world_size

    def latest(self) -> str | None:
        """The tag ``latest`` names, or None before the first complete save."""
        try:
            return (self.directory / LATEST).read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None

    def save(self, engine: Any, step: int, meta: dict[str, Any], rank_state: dict[str, Any]) -> str:
        """Save a checkpoint tagged ``step-<step>`` on every rank (collective); returns the tag."""
        import deepspeed.comm as dist

        tag = tag_for(step)
        tag_dir = self.directory / tag
        for stale in (tag_dir, self.directory / f"{tag}{UNIVERSAL_SUFFIX}") if self.rank == 0 else ():
            if stale.exists():  # left by an interrupted save or a run resumed from an older tag (and the
                shutil.rmtree(stale)  # conversion of the step it replaces, which a universal resume would load)
        dist.barrier()
        from deepspeed.checkpoint.constants import (UNIVERSAL_CHECKPOINT_INFO, UNIVERSAL_CHECKPOINT_VERSION_KEY,
                                                    UNIVERSAL_CHECKPOINT_VERSION_VALUE)

        # the universal-checkpoint record lets ds_to_universal convert this checkpoint for another rank count
        universal = {UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}}
        client_state = {**meta, **rank_state, **universal}
        engine.save_checkpoint(str(self.directory), tag=tag, client_state=client_state, save_latest=False)
        fault_point("mid_save", step)
        _write_atomic(tag_dir / RANK_STATE.format(rank=self.rank), lambda p: torch.save(rank_state, p))
        if self.rank == 0:
            _write_atomic(tag_dir / META, lambda p: p.write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8"))
        dist.barrier()
        if self.rank == 0:
            missing = missing_files(tag_dir, self.world_size)
            if missing:
                raise RuntimeError(f"checkpoint {tag_dir} is incomplete after saving (missing {', '.join(missing)}); "
                                   f"`latest` still names {self.latest()}")
            self.point_latest(tag)
            self.prune()
        dist.barrier()
        fault_point("after_save", step)
        return tag

    def point_latest(self, tag: str) -> None:
        """Make ``latest`` name ``tag`` (rank 0)."""
        _write_atomic(self.directory / LATEST, lambda p: p.write_text(tag, encoding="utf-8"))

    def prune(self) -> None:
        """Keep the newest ``keep`` complete checkpoints and the one ``latest`` names; delete older and broken ones."""
        latest = self.latest()
        latest_step = step_of(latest) if latest else None
        tags = sorted((step_of(p.name), p) for p in self.directory.iterdir() if p.is_dir() and step_of(p.name) is not None)
        complete = [p for _, p in tags if is_complete(p)]
        kept = {p.name for p in complete[-self.keep:]} | {latest}
        for step, path in tags:
            older_than_latest = latest_step is not None and step < latest_step
            if path.name not in kept and (path in complete or older_than_latest):
                shutil.rmtree(path)
        for path in self.directory.glob(f"*{UNIVERSAL_SUFFIX}"):  # a conversion goes with its checkpoint
            if not (self.directory / path.name.removesuffix(UNIVERSAL_SUFFIX)).is_dir():
                shutil.rmtree(path)

    def resolve(self, tag: str | None, flag: str = "--resume") -> str:
        """The tag to resume from: ``tag``, or the one ``latest`` names; UserError when it is missing or
        broken (naming ``flag``, the option that gave the checkpoint)."""
        tag = tag or self.latest()
        if tag is None:
            found = sorted(p.name for p in self.directory.iterdir() if p.is_dir()) if self.directory.is_dir() else []
            if (self.directory / LATEST).is_file():  # cut short or emptied by hand: it names none
                raise UserError(f"{flag}: {self.directory / LATEST} is empty, it names no checkpoint; give one by name "
                                f"(found: {', '.join(found) or 'none'})")
            raise UserError(f"{flag}: no checkpoint in {self.directory} (no `{LATEST}` file)")
        tag_dir = self.directory / tag
        if not tag_dir.is_dir():
            found = sorted(p.name for p in self.directory.iterdir() if p.is_dir()) if self.directory.is_dir() else []
            raise UserError(f"{flag}: no checkpoint {tag!r} in {self.directory} (found: {', '.join(found) or 'none'})")
        meta = read_meta(tag_dir)
        missing = missing_files(tag_dir, meta["world_size"])
        if missing:
            raise UserError(f"{flag}: checkpoint {tag_dir} is incomplete (missing {', '.join(missing)})")
        return tag

    def load(self, engine: Any, tag: str, expected: dict[str, Any],
             universal: bool = False) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Load ``tag`` into ``engine`` after checking it was written for the same model, tokenizer and world
        size as ``expected`` (meta keys); returns (meta, this rank's state). With ``universal`` (the engine
        built with ``checkpoint.load_universal``) the checkpoint is converted by DeepSpeed's ds_to_universal
        into ``<tag>-universal`` (once) and loaded on any rank count; there is no rank state then (None)."""
        import deepspeed.comm as dist

        tag_dir = self.directory / tag
        meta = read_meta(tag_dir)
        for key, what in (("model_config", "another model config"), ("tokenizer_fingerprint", "another tokenizer"),
                          ("rtd_head", "another RTD head (one older than DeBERTa's, whose trained weights would feed "
                                       "another function)")):
            if meta.get(key) != expected.get(key):
                raise UserError(f"--resume: checkpoint {tag_dir} was written for {what} ({key} differs: "
                                f"{_diff(meta.get(key), expected.get(key))}); start a new run dir or resume the matching config")
        saved, now = meta.get("run_config"), json.loads(json.dumps(expected["run_config"]))  # as meta.json has it
        for key in (RESUME_FIXED if not universal else UNIVERSAL_FIXED) if saved is not None else ():
            if saved.get(key) != now.get(key):
                raise UserError(f"--resume: checkpoint {tag_dir} was written with another {key} "
                                f"({_diff(saved.get(key), now.get(key))}): the checkpoint carries it (optimizer state "
                                f"and settings, data position, RNG, batch), so the change would be undone or would end "
                                f"exact resume; resume with the checkpoint's values, or start a new run dir")
        if meta["world_size"] != self.world_size and not universal:
            raise UserError(f"--resume: checkpoint {tag_dir} was written by {meta['world_size']} ranks, this run has "
                            f"{self.world_size}: exact resume needs the same count; add --universal to continue "
                            f"through a DeepSpeed universal checkpoint (data order not exact)")
        trained = global_batch(meta) if universal else None
        if universal and trained is not None and trained != expected["global_batch"]:
            raise UserError(f"--resume --universal: checkpoint {tag_dir} was trained with a global batch of "
                            f"{trained} sequences, this run's is {expected['global_batch']} on {self.world_size} "
                            f"ranks; set global_batch_size: {trained} (grad_accum then follows the rank count), or "
                            "start a new run dir")
        load_tag = tag
        if universal:
            load_tag = f"{tag}{UNIVERSAL_SUFFIX}"
            if self.rank == 0 and not (self.directory / load_tag).is_dir():
                convert_to_universal(tag_dir, self.directory / load_tag)
            dist.barrier()
        try:
            load_path, _ = engine.load_checkpoint(str(self.directory), tag=load_tag)
            if load_path is None:
                raise UserError(f"--resume: DeepSpeed could not load {self.directory / load_tag}")
            if universal:
                return meta, None
            rank_state = torch.load(tag_dir / RANK_STATE.format(rank=self.rank), map_location="cpu", weights_only=False)
        except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:  # torch.load of a cut file
            earlier = sorted((p.name for p in self.directory.iterdir() if p.is_dir() and (step_of(p.name) or 0) < meta["step"]
                              and not p.name.endswith(UNIVERSAL_SUFFIX)), key=lambda name: step_of(name) or 0)
            way_out = f"resume an earlier one with --resume {earlier[-1]}" if earlier else "no earlier checkpoint is kept"
            raise UserError(f"--resume: checkpoint {tag_dir} cannot be loaded, a file of it is truncated or corrupt "
                            f"({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}); {way_out}") from None
        return meta, rank_state


def convert_to_universal(tag_dir: Path, out: Path) -> None:
    """DeepSpeed's ds_to_universal on ``tag_dir`` into ``out`` (written under a temp name, then renamed)."""
    import subprocess

    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    proc = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(tag_dir),
                           "--output_folder", str(tmp)], capture_output=True, text=True)
    if proc.returncode:
        raise UserError(f"ds_to_universal failed on {tag_dir}: {proc.stderr.strip().splitlines()[-1:]}")
    os.replace(tmp, out)


RESUME_FIXED = ("seed", "precision", "global_batch_size", "grad_accum", "loader", "optimizer")
"""Run config keys a resumed run must keep: DeepSpeed restores the optimizer's settings with its
state (a new learning rate was silently the old one), and the loader's position, the RNGs and the
batch continue the checkpoint's. ``steps``, ``schedule`` (computed from the config each step),
``intervals`` and the like may change."""
UNIVERSAL_FIXED = tuple(key for key in RESUME_FIXED if key not in ("global_batch_size", "grad_accum"))
"""On another rank count (``--universal``) the global batch must stay, however the config gives it
(``global_batch_size``, or ``grad_accum``, which must then change with the rank count):
:meth:`CheckpointManager.load` compares meta.json's ``global_batch`` instead."""


def global_batch(meta: dict[str, Any]) -> int | None:
    """Sequences per optimizer step of the run that wrote ``meta``: its ``global_batch``, or for a
    checkpoint of before it was recorded, from its run config and world size (None without one)."""
    if "global_batch" in meta:
        return int(meta["global_batch"])
    saved = meta.get("run_config")
    if saved is None:
        return None
    accum = saved.get("grad_accum") or 1
    return saved.get("global_batch_size") or saved["loader"]["batch_size"] * accum * meta["world_size"]


def _diff(saved: Any, current: Any) -> str:
    if isinstance(saved, dict) and isinstance(current, dict):
        keys = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
        return "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {current.get(k)!r}" for k in keys[:3])
    return f"checkpoint {saved!r}, now {current!r}"


def resolve_path(path: str, tag: str | None = None, flag: str = "--checkpoint") -> tuple[Path, str]:
    """(checkpoints dir, tag) for a run dir, a checkpoints dir (with ``latest``) or a ``step-<N>`` dir
    given by option ``flag``."""
    root = Path(path)
    if (root / META).is_file() or list(root.glob("*model_states.pt")):
        if tag is not None and tag != root.name:
            raise UserError(f"{path} is checkpoint {root.name}; --tag {tag} names another one")
        return root.parent, root.name
    if (root / "checkpoints").is_dir():
        root = root / "checkpoints"
    if not root.is_dir():
        raise UserError(f"{path}: no such checkpoint, checkpoints or run directory")
    manager = CheckpointManager(root, keep=1, rank=0, world_size=1)
    return root, manager.resolve(tag, flag)


def load_for_inference(path: str, tag: str | None = None, flag: str = "--checkpoint",
                       tokenizer: str | None = None) -> tuple[Any, torch.nn.Module, str]:
    """(ModelConfig, pretraining model with the checkpoint's fp32 weights, tokenizer dir) from a run dir,
    checkpoints dir or checkpoint dir given by option ``flag``; ZeRO-1/2/3 partitions are merged by
    DeepSpeed's zero_to_fp32. The tokenizer dir is ``tokenizer`` (``--tokenizer``) or the one the
    checkpoint's meta.json names, checked first to hold the tokenizer the run was trained with."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from pretrain.models import build_pretraining_model
    from pretrain.models.config import model_config_from_dict
    from pretrain.tokenizer import Tokenizer

    directory, tag = resolve_path(path, tag, flag)
    meta = read_meta(directory / tag)
    tokenizer_dir = tokenizer or meta["tokenizer_dir"]
    if tokenizer is None and not Path(tokenizer_dir).is_dir():
        raise UserError(f"tokenizer dir {tokenizer_dir} (named by the checkpoint's meta.json): no such directory; "
                        f"pass --tokenizer with where it is now")
    found = Tokenizer.load(tokenizer_dir).fingerprint
    if found != meta["tokenizer_fingerprint"]:
        raise UserError(f"tokenizer {tokenizer_dir} (fingerprint {found[:12]}) is not the one checkpoint "
                        f"{directory / tag} was trained with ({meta['tokenizer_fingerprint'][:12]}): pass --tokenizer "
                        "with the run's tokenizer")
    cfg = model_config_from_dict(meta["model_config"], f"{directory / tag / META}")
    model = build_pretraining_model(cfg)
    try:
        state = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=tag)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise UserError(f"checkpoint {directory / tag}: cannot read its weights ({type(exc).__name__}: "
                        f"{first_line(exc) if str(exc) else 'truncated or corrupt'})") from None
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise UserError(f"checkpoint {directory / tag} does not match its model config: {first_line(exc)}") from None
    model.eval()
    return cfg, model, tokenizer_dir
