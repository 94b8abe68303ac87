"""Chunks, not whole tensors (issue 24 item 2): the optimizer-state cache and the NVMe blocks work on fixed-size
chunks, so neither the optimizer budget nor the CPU budget has to hold any whole tensor, and training is
unchanged. The chunk size is lowered here (2048 elements) so gpt-small's 16384-element tensors are 8 chunks."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mlsyskit.tools.offload import chunks
from mlsyskit.tools.offload.chunk_updates import accumulate_and_step, clip_update
from mlsyskit.tools.offload.filetier import FileTier
from mlsyskit.tools.offload.optimizer import AdamConfig, NonFiniteError, OptimizerStateCache, adam_update
from mlsyskit.tools.offload.pools import BudgetError
from mlsyskit.tools.offload.trainer import train, train_plain

CHUNK = 2048


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunks, "CHUNK_ELEMS", CHUNK)


def test_chunk_ranges_cover_the_tensor_and_stay_aligned():
    assert chunks.chunk_ranges(5000, 2048) == [(0, 2048), (2048, 4096), (4096, 5000)]
    assert chunks.chunk_ranges(2048, 2048) == [(0, 2048)]
    assert chunks.chunk_ranges(0, 2048) == [(0, 0)]
    with pytest.raises(ValueError, match="multiple of 2048"):
        chunks.chunk_ranges(10, 1000)


def test_a_state_budget_smaller_than_one_tensor_trains_it_exactly(tmp_path, small_chunks):
    """One tensor of 16 chunks (1 MiB of fp32 state) through a 320 KiB budget: its chunks rotate through NVMe,
    and five AdamW steps equal the whole-tensor update bit for bit."""
    numel = 16 * CHUNK
    torch.manual_seed(0)
    w = torch.randn(numel)
    with FileTier(tmp_path) as tier:
        cache = OptimizerStateCache({0: numel}, [0], 320 << 10, tier, read_ahead=True)
        assert len(cache.chunks(0)) == 16 and cache.nvme_homed > 0
        assert cache.pool.capacity_bytes < 16 * numel  # the budget never held the whole tensor's state
        cache.initialize(0, w)
        master, m, v = w.clone(), torch.zeros(numel), torch.zeros(numel)
        cfg = AdamConfig(lr=1e-2, weight_decay=0.1)
        for step in range(1, 6):
            g = torch.randn(numel).to(torch.bfloat16)
            cache.begin_step()
            buf = g.clone()
            sumsq = accumulate_and_step(cache, 0, buf, first=True, last=True, step=step, cfg=cfg)
            g32 = g.float()
            exact = float(torch.dot(g32.double(), g32.double()))
            assert sumsq == pytest.approx(exact, rel=1e-6)  # per-chunk fp32 dots, summed exactly
            adam_update(master, g32, m, v, step, cfg)
            assert torch.equal(buf, master.to(torch.bfloat16))  # the new compute copy, cast in place
        cache.flush()
        state = cache.peek(0)
        assert torch.equal(state[:numel], master) and torch.equal(state[numel:2 * numel], m)
        assert torch.equal(state[2 * numel:], v)
        cache.close()


def test_clip_update_and_a_non_finite_chunk(tmp_path, small_chunks):
    numel = 4 * CHUNK
    with FileTier(tmp_path) as tier:
        cache = OptimizerStateCache({0: numel}, [0], 96 << 10, tier, read_ahead=True, persist_grad=True)
        cache.initialize(0, torch.zeros(numel))
        g = torch.ones(numel, dtype=torch.bfloat16)
        cache.begin_step()
        accumulate_and_step(cache, 0, g.clone(), first=True, last=False, step=None, cfg=None)
        cache.begin_step()
        assert accumulate_and_step(cache, 0, g.clone(), first=False, last=True, step=None, cfg=None) == 4.0 * numel
        written = torch.zeros(numel)
        cache.begin_step()
        clip_update(cache, 0, 0.5, 1, AdamConfig(lr=0.1), lambda lo, master, _: written[lo:lo + len(master)]
                    .copy_(master))
        assert torch.allclose(written, torch.full((numel,), -0.1))  # Adam's first step: -lr * sign(g)
        bad = g.clone()
        bad[3 * CHUNK + 5] = float("nan")
        cache.begin_step()
        with pytest.raises(NonFiniteError, match="w0 is not finite"):
            accumulate_and_step(cache, 0, bad, first=True, last=True, step=2, cfg=AdamConfig(), what="w0")
        cache.close()


def test_budgets_below_the_largest_tensor_train_equal_to_the_plain_run(small_cfg, small_profile, small_chunks):
    """gpt-small with an optimizer budget below one 16384-element tensor's state (256 KiB) and a CPU budget below
    one tensor's bf16 copy (32 KiB): refused before chunks; now the losses equal the plain run's bit for bit."""
    cfg = replace(small_cfg, steps=3, opt_mem=200 << 10, cpu_mem=16 << 10)  # step 3's loss: after 2 chunked updates
    result = train(cfg, small_profile)
    assert result.losses == train_plain(cfg)
    occ = result.summary["occupancy"]
    assert occ["optimizer_capacity"] < 256 << 10 and occ["cpu_capacity"] < 32 << 10
    assert occ["bytes"]["nvme"] > 0 and occ["optimizer_nvme_tensors"] > 0


def test_chunked_clipping_and_accumulation_stay_within_rounding_of_the_plain_run(small_cfg, small_profile,
                                                                                 small_chunks):
    """The global norm is summed per chunk (exactly, math.fsum) instead of per tensor: the clip coefficient may
    differ in the last bit, so the losses agree to rounding, not bit for bit."""
    cfg = replace(small_cfg, steps=2, opt_mem=200 << 10, accumulate=2, clip=0.5)  # step 2's loss: a clipped update
    result = train(cfg, small_profile)
    assert result.losses == pytest.approx(train_plain(cfg), abs=1e-5)


def test_without_nvme_a_budget_must_still_hold_the_states(small_cfg, small_profile, small_chunks):
    with pytest.raises(BudgetError, match="no --nvme-dir"):
        train(replace(small_cfg, nvme_dir=None, opt_mem=200 << 10, cpu_mem=1 << 20, device_mem=1 << 20),
              small_profile)
