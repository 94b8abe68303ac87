"""Checkpoints: fp32 master weights and Adam moments per tensor, written atomically.

A checkpoint is a directory `step-<N>/` with one checksummed file-tier block per tensor
(master | m | v, fp32) and a `manifest.json` naming the model signature, the step and the run's
settings. It is written under a temporary name, fsynced and renamed into place, so a crash or a full
disk leaves either the complete checkpoint or none (the temporary directory is removed on error).
Free space is checked before writing, so a disk that is already too full fails before any byte.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlsyskit.core.config import format_size
from mlsyskit.core.storage_errors import DiskFullError, MissingDirectoryError, StorageError
from mlsyskit.tools.offload.filetier import FileTier

SCHEMA = 1
_STEP_DIR = re.compile(r"step-(\d+)")


class CheckpointError(StorageError):
    """A checkpoint that is missing, incomplete or for another model."""


@dataclass
class Checkpoint:
    step: int
    manifest: dict[str, Any]
    path: Path

    def states(self) -> Iterator[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(name, master, m, v) per tensor, read and checksum-verified one at a time."""
        with FileTier(self.path) as tier:
            for i, t in enumerate(self.manifest["tensors"]):
                numel = t["numel"]
                buf = torch.empty(3 * numel, dtype=torch.float32)
                tier.read_into(f"t{i}", buf)
                shape = tuple(t["shape"])
                yield t["name"], buf[:numel].view(shape), buf[numel:2 * numel].view(shape), buf[2 * numel:].view(shape)


def check_space(directory: Path, step: int, shapes: dict[str, tuple[int, ...]]) -> None:
    """DiskFullError unless `directory` has room for one checkpoint of tensors of `shapes` (fp32 master|m|v
    per tensor plus block headers): checked when training starts and again before each checkpoint."""
    directory = Path(directory)
    if not directory.is_dir():
        raise MissingDirectoryError(f"checkpoint directory {directory} does not exist")
    need = sum(4096 + 12 * math.prod(shape) + 4096 for shape in shapes.values()) + (1 << 20)
    free = shutil.disk_usage(directory).free
    if free < need:
        raise DiskFullError(f"a checkpoint (from step {step}) needs {format_size(need)} but {directory} has "
                            f"{format_size(free)} free; nothing was written")


def save(directory: Path, step: int, manifest: dict[str, Any], states: Iterable[tuple[str, torch.Tensor]],
         shapes: dict[str, tuple[int, ...]]) -> Path:
    """Write `states` ((name, fp32 master|m|v) pairs, consumed one at a time so only one tensor's state
    is in memory) as checkpoint `step`; returns its directory."""
    directory = Path(directory)
    check_space(directory, step, shapes)
    final = directory / f"step-{step}"
    tmp = directory / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        entries = []
        with FileTier(tmp, fsync=True) as tier:
            for i, (name, buf) in enumerate(states):
                tier.write(f"t{i}", buf)
                entries.append({"name": name, "numel": buf.numel() // 3, "shape": list(shapes[name])})
        body = {"schema": SCHEMA, "step": step, **manifest, "tensors": entries}
        body["checksum"] = _digest(body)
        with open(tmp / "manifest.json", "w") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in body.items() if k != "checksum"}, sort_keys=True)
                          .encode()).hexdigest()


def _steps(directory: Path) -> list[tuple[int, Path]]:
    directory = Path(directory)
    if not directory.is_dir():
        raise MissingDirectoryError(f"checkpoint directory {directory} does not exist")
    return sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_DIR.fullmatch(p.name)))


def open_checkpoint(step: int, path: Path) -> Checkpoint:
    """Read and check a checkpoint's manifest (schema, checksum, block files present with their sizes);
    the blocks' own crc32s are checked by `verify` or while reading."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}/manifest.json is unreadable: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise CheckpointError(f"{path} is not a tencache checkpoint (schema {SCHEMA})")
    if manifest.get("checksum") != _digest(manifest):
        raise CheckpointError(f"{path}/manifest.json fails its checksum (edited or damaged)")
    for i, t in enumerate(manifest.get("tensors", [])):
        block = path / f"t{i}.blk"
        if not block.is_file() or block.stat().st_size < 4096 + 12 * t["numel"]:
            raise CheckpointError(f"{path}: block of {t['name']} is missing or truncated")
    return Checkpoint(step, manifest, path)


def verify(ckpt: Checkpoint) -> None:
    """Read every block once through one reusable buffer, checking its crc32 (raises CorruptBlockError)."""
    largest = max((t["numel"] for t in ckpt.manifest["tensors"]), default=0)
    buf = torch.empty(3 * largest, dtype=torch.float32)
    with FileTier(ckpt.path) as tier:
        for i in range(len(ckpt.manifest["tensors"])):
            tier.read_into(f"t{i}", buf)


def candidates(directory: Path) -> Iterator[tuple[Checkpoint | None, Path, str]]:
    """Checkpoints newest first: (checkpoint, path, "") when its manifest checks out, else (None, path, why)."""
    for step, path in reversed(_steps(directory)):
        try:
            yield open_checkpoint(step, path), path, ""
        except (CheckpointError, KeyError, TypeError) as e:
            yield None, path, str(e)


def prune(directory: Path, keep: int) -> list[Path]:
    """Keep the `keep` newest checkpoints whose manifest checks out (after a new one is safely in place);
    remove the rest, including ones that fail the check (they could never be resumed from)."""
    removed, kept = [], 0
    for ckpt, path, _ in candidates(directory):
        if ckpt is not None and kept < keep:
            kept += 1
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def latest(directory: Path) -> Checkpoint | None:
    """The newest checkpoint whose manifest checks out (incomplete temporary ones are ignored)."""
    return next((c for c, _, _ in candidates(directory) if c is not None), None)
