"""The real GPU path (CUDA device pool, pinned CPU pool, copy stream and events). Skipped without CUDA;
run on a GPU machine with scripts/gpu_check."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mlsyskit.tools.offload.trainer import train, train_plain

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("policy", ["tencache", "on-demand", "lru"])
def test_cuda_losses_match_plain_cuda_run(policy, small_cfg, small_profile):
    cfg = replace(small_cfg, steps=10, policy=policy, device="cuda")
    reference = train_plain(cfg)
    result = train(cfg, small_profile if policy == "tencache" else None)
    torch.testing.assert_close(torch.tensor(result.losses), torch.tensor(reference), rtol=1e-6, atol=0)
    s = result.summary
    assert s["device"].startswith("cuda")
    assert s["occupancy"]["bytes"]["nvme"] > 0
    if policy == "tencache":
        assert s["allocations_per_step"] == 0


def test_cuda_engine_uses_pinned_cpu_pool_and_device_pool(small_cfg, small_profile):
    from mlsyskit.tools.offload.engine import Budgets, OffloadEngine
    from mlsyskit.tools.offload.model import build_model
    from mlsyskit.tools.offload.optimizer import AdamConfig, HyperParams

    model, masters = build_model(small_cfg.model, 0)
    engine = OffloadEngine(model.cuda(), masters, policy="tencache", profile=small_profile, hyper=HyperParams.fixed(AdamConfig(), list(range(len(masters)))),
                           budgets=Budgets(small_cfg.device_mem, small_cfg.cpu_mem, small_cfg.opt_mem,
                                           small_cfg.nvme_dir), device=torch.device("cuda"))
    try:
        assert engine.store.cpu_pool.pinned and engine.store.dev_pool.arena.is_cuda
        assert not engine.emulated
    finally:
        engine.close()
