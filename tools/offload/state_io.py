"""The engine's state in and out, one tensor at a time: checkpoints, resume, export and handing the model back.

`StateIO` is a mixin of `engine.OffloadEngine` (it reads the engine's store, states, entries and ranks and
owns nothing). With several ranks (shards.py) every rank takes part in each stream (gather.stream_states,
stream_weights: each tensor broadcast from its owner), so a checkpoint and an export are consolidated,
the same files a single process writes, whatever the number of ranks; rank 0 writes them. A resumed run
reads the consolidated checkpoint on every rank and keeps only the tensors it owns, so it may resume
with another number of ranks.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mlsyskit.tools.offload.export import export_engine
from mlsyskit.tools.offload.gather import stream_states, stream_weights
from mlsyskit.tools.offload.tiers import Entry


class StateIO:
    store: Any
    states: Any
    trainable: list[Entry]
    by_name: dict[str, Entry]
    ranks: Any  # ranks.RankGroup or None
    shards: Any  # shards.Shards or None
    adam_step: int
    param_steps: dict[int, int]

    def owns(self, e: Entry) -> bool:
        return self.shards is None or self.shards.owns(e.idx)

    @property
    def writes_files(self) -> bool:
        """Whether this process writes checkpoints and exports (rank 0, or the only process)."""
        return self.ranks is None or self.ranks.rank == 0

    def iter_states(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, fp32 master|m|v view) per trainable tensor, streamed through the state cache one at a time
        (the view is valid until the next item): checkpoints never hold all states in memory. With several
        ranks, every rank must iterate it to the end (each tensor comes from its owner)."""
        if self.shards is not None:
            yield from stream_states(self.ranks, self.shards, self.states, self.trainable)
            return
        self.states.flush()
        for e in self.trainable:
            yield e.name, self.states.peek(e.idx)

    def weights(self) -> Iterator[tuple[Entry, torch.Tensor]]:
        """(entry, value) per tensor, one at a time: a trainable one's fp32 master weight, a frozen one's
        compute copy (with several ranks: on every rank, each from its owner)."""
        if self.shards is not None:
            yield from stream_weights(self.ranks, self.shards, self.states, self.store)
            return
        self.states.flush()
        for e in self.store.entries:
            yield e, (self.states.peek(e.idx)[:e.shape.numel()].view(e.shape) if e.trainable
                      else self.store.read_home(e))

    def load_states(self, items, adam_step: int) -> None:
        """Stream (name, fp32 master, m, v) items (a checkpoint, read one tensor at a time) into the
        optimizer-state cache and the compute copies; training continues from `adam_step`. With several
        ranks each keeps only the tensors it owns."""
        for name, master, m, v in items:
            e = self.by_name[name]
            if not self.owns(e):
                continue
            self.states.initialize(e.idx, master, m, v)
            self.store.write_home(e, master.reshape(-1), m)  # m is copied: its buffer stages the cast
        self.states.flush()
        self.adam_step = adam_step
        self.param_steps = dict.fromkeys(self.param_steps, adam_step)

    def export(self, path: Path, dtypes: dict[str, torch.dtype] | None = None) -> Path:
        """Write the weights to one safetensors file, one tensor at a time (export.export_engine); with several
        ranks every rank must call it and rank 0 writes the consolidated file."""
        return export_engine(self, path, dtypes)

    def materialize(self, dtypes: dict[str, torch.dtype] | None = None) -> None:
        """Give every parameter ordinary storage again (in `dtypes[name]`, default its compute dtype):
        trainable ones from their fp32 master weight, frozen ones from their compute copy (with several
        ranks: every rank gets the whole model)."""
        dtypes = dtypes or {}
        values = {e.name: value.to(dtypes.get(e.name, e.dtype), copy=True) for e, value in self.weights()}
        self.remove_hooks()
        for e in self.store.entries:
            e.param.data = values.pop(e.name)
            e.bound = False

    def remove_hooks(self) -> None: ...
