"""Checkpoints of a training run: written per tensor from the engine's state cache, checked for space before
training starts, and resumed from the newest valid one (corrupt ones skipped with a warning)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mlsyskit.core.console import warn
from mlsyskit.core.errors import UsageError
from mlsyskit.core.storage_errors import StorageError
from mlsyskit.tools.offload import checkpoint
from mlsyskit.tools.offload.engine import OffloadEngine
from mlsyskit.tools.offload.progress import ProgressNote

# `cfg` below is a trainer.TrainConfig (typed Any: the trainer imports this module)


def check_space(engine: OffloadEngine, cfg: Any) -> None:
    """Before training starts: the checkpoint folder has room for one checkpoint (DiskFullError otherwise)."""
    if cfg.checkpoint_dir is not None and engine.writes_files:
        checkpoint.check_space(cfg.checkpoint_dir, engine.adam_step, {e.name: tuple(e.shape) for e in engine.trainable})


def save_checkpoint(engine: OffloadEngine, cfg: Any, step: int, progress: ProgressNote | None = None) -> Path | None:
    """One consolidated checkpoint of every trainable tensor. With several ranks every rank calls it (each
    tensor's state comes from its owner) and rank 0 writes it; the others return None."""
    if not engine.writes_files:
        for _ in engine.iter_states():
            pass
        return None
    manifest = {"model": cfg.model, "signature": engine.signature, "adam_step": engine.adam_step,
                "seed": cfg.seed, "batch": cfg.batch, "seq": cfg.seq, "lr": cfg.lr, "data": cfg.data,
                "accumulate": cfg.accumulate * _world(engine)}  # micro-batches per step, all ranks together
    shapes = {e.name: tuple(e.shape) for e in engine.trainable}
    states = engine.iter_states()
    if progress is not None:
        n = len(shapes)
        states = (progress.set("step {}: writing checkpoint, {} of {} tensors", step, k, n) or item
                  for k, item in enumerate(states))
    path = checkpoint.save(cfg.checkpoint_dir, step, manifest, states, shapes)
    checkpoint.prune(cfg.checkpoint_dir, cfg.keep_checkpoints)
    return path


# Settings that fix the weights' initialisation and the batch stream (a function of seed, batch, seq, data,
# accumulate and step): changing one on resume would silently break "resumed losses equal an uninterrupted run".
# `accumulate` is stored and compared as micro-batches per step over all ranks (--accumulate x ranks), so a run
# may resume with another number of ranks that takes the same global batch (2 ranks x 1 = 1 process x 2).
# Everything else (lr, steps, budgets, policy, checkpoint cadence, device) may change on resume.
RESUME_FIXED = ("model", "seed", "batch", "seq", "data", "accumulate")


def _world(engine: OffloadEngine) -> int:
    return engine.ranks.world if engine.ranks is not None else 1


def resume_mismatches(cfg: Any, manifest: dict[str, Any], world: int = 1) -> list[str]:
    """'name: stored X, requested Y' for each setting in RESUME_FIXED that differs from the checkpoint's
    (accumulate: over all `world` ranks)."""
    requested = {k: getattr(cfg, k) for k in RESUME_FIXED}
    requested["accumulate"] *= world
    return [f"{k}: stored {manifest[k]!r}, requested {requested[k]!r}"
            for k in RESUME_FIXED if k in manifest and manifest[k] != requested[k]]


def resume(cfg: Any, engine: OffloadEngine) -> None:
    """Load the newest valid checkpoint, falling back past corrupt ones (each skipped with a warning)."""
    skipped = []
    for ckpt, path, why in checkpoint.candidates(cfg.checkpoint_dir):
        if ckpt is None:
            warn(f"--resume: skipping {path}: {why}")
            skipped.append(path.name)
            continue
        if mismatches := resume_mismatches(cfg, ckpt.manifest, _world(engine)):
            raise UsageError(f"--resume: {ckpt.path} was written with other settings ("
                                             f"{'; '.join(mismatches)}); resume with the stored values or use a "
                                             f"new --checkpoint-dir")
        if ckpt.manifest.get("signature") != engine.signature:
            raise checkpoint.CheckpointError(f"{ckpt.path} was written for model {ckpt.manifest.get('model')!r}, "
                                             f"not {cfg.model!r}")
        if ckpt.manifest["adam_step"] >= cfg.steps:
            raise UsageError(f"--resume: {ckpt.path} is already at step "
                                             f"{ckpt.manifest['adam_step']}; ask for more --steps than that")
        try:
            checkpoint.verify(ckpt)
        except StorageError as e:
            warn(f"--resume: skipping {path}: {e}")
            skipped.append(path.name)
            continue
        engine.load_states(ckpt.states(), ckpt.manifest["adam_step"])
        if skipped:
            warn(f"--resume: continuing from {path.name} (skipped {', '.join(skipped)})")
        return
    raise checkpoint.CheckpointError(f"--resume: no valid checkpoint in {cfg.checkpoint_dir}"
                                     + (f" (skipped {', '.join(skipped)})" if skipped else ""))
