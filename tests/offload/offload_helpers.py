"""Shared settings for the tencache tests (imported by name: pytest puts this folder on sys.path)."""
from __future__ import annotations

from dataclasses import replace

from mlsyskit.tools.offload.trainer import TrainConfig

# gpt-small: 69 tensors, 487 KiB of bf16 parameters, 3.9 MiB of fp32 optimizer state; these budgets put
# parameters on the (emulated) device, the CPU and NVMe, and spill optimizer states to NVMe.
SMALL = dict(model="gpt-small", batch=2, seq=32, seed=0, device_mem=96 * 1024, cpu_mem=128 * 1024,
             opt_mem=2 << 20, device="cpu")


def with_(cfg: TrainConfig, **kw) -> TrainConfig:
    return replace(cfg, **kw)
