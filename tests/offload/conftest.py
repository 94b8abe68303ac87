"""Fixtures: a small configuration with tensors on all three tiers, and its profile (recorded once).

gpt-small: 69 tensors, 487 KiB of bf16 parameters, 3.9 MiB of fp32 optimizer state; these budgets put
parameters on the (emulated) device, the CPU and NVMe, and spill optimizer states to NVMe. (Fixtures,
not an importable helper module, so the tests work under any pytest import mode.)
"""
from __future__ import annotations

import pytest

from mlsyskit.tools.offload.trainer import TrainConfig, run_profile

SMALL = dict(model="gpt-small", batch=2, seq=32, seed=0, device_mem=96 * 1024, cpu_mem=128 * 1024,
             opt_mem=2 << 20, device="cpu")


@pytest.fixture(scope="session")
def small() -> dict:
    return dict(SMALL)


@pytest.fixture
def small_cfg(tmp_path) -> TrainConfig:
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    return TrainConfig(**SMALL, steps=4, nvme_dir=nvme)


@pytest.fixture(scope="session")
def small_profile():
    return run_profile(TrainConfig(**SMALL, steps=1))


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread: the tests' tensors are small, and on a shared 2-core machine thread contention
    made them ~4x slower. Results do not depend on it (every comparison runs in the same process)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
