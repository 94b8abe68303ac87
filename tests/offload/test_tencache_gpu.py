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


# -- the pieces of the GPU path on a real device (their CPU-side ordering tests: test_tencache_gpu_path_*) --
def _cuda_store(n: int, numel: int, tmp_path=None):
    from mlsyskit.tools.offload.filetier import FileTier
    from mlsyskit.tools.offload.tiers import Entry, TierStore

    entries = []
    for i in range(n):
        p = torch.nn.Parameter(torch.zeros(numel, dtype=torch.bfloat16))
        entries.append(Entry(i, f"t{i}", p, p.shape, p.dtype, numel * 2))
    nvme = FileTier(tmp_path) if tmp_path is not None else None
    size = {numel * 2: n}
    return TierStore(entries, device=torch.device("cuda"), device_slots=size, cpu_slots=size, nvme=nvme), entries


@pytest.mark.parametrize("numel", [1000, 100_000])  # batched small copies, one copy each
def test_cuda_prefetch_is_consumed_on_the_compute_stream(numel):
    from mlsyskit.tools.offload.streams import StreamCopy
    from mlsyskit.tools.offload.tiers import CPU

    st, entries = _cuda_store(8, numel)
    try:
        assert st.cpu_pool.pinned and st.dev_pool.arena.is_cuda
        for e in entries:
            e.cpu = st.cpu_pool.acquire(e.nbytes, e.idx, exact=True)
            e.cpu.view(e.dtype, e.shape).fill_(e.idx + 1)
            e.where = CPU
            st.cpu_to_device(e, st.dev_pool.acquire(e.nbytes, e.idx, exact=True))
        st.flush_copies()
        sums = []
        for e in entries:
            assert st.ready_for_compute(e)
            sums.append(st.device_view(e).float().sum())  # enqueued after the wait, no host sync before it
        copies = {id(e.pending.copy if hasattr(e.pending, "copy") else e.pending) for e in entries}
        assert len(copies) == (1 if numel * 2 <= 64 * 1024 else 8)
        assert all(isinstance(getattr(e.pending, "copy", e.pending), StreamCopy) for e in entries)
        assert [float(s) for s in sums] == [float((i + 1) * numel) for i in range(8)]
        st.drain()
        assert st.cpu_pool.stats.slots_in_use == 0  # every source slot released after its copy
    finally:
        st.close()


def test_cuda_async_eviction_to_nvme_reads_back_what_compute_wrote(tmp_path):
    from mlsyskit.tools.offload.tiers import DEVICE, NVME

    st, (e,) = _cuda_store(1, 300_000, tmp_path)
    try:
        e.dev = st.dev_pool.acquire(e.nbytes, e.idx, exact=True)
        e.where = DEVICE
        torch.cuda._sleep(50_000_000)  # keep the compute stream busy: the fill below is still queued
        st.device_view(e).fill_(5.0)
        st.device_to_nvme(e, sync=False)
        assert e.where == NVME
        st.settle(e)
        assert torch.equal(st.read_home(e), torch.full((300_000,), 5.0, dtype=torch.bfloat16))
    finally:
        st.close()
        st.nvme.close()


def test_cuda_gradient_staging_and_worker():
    from mlsyskit.tools.offload.grad_pipeline import GradStager, OptimizerWorker
    from mlsyskit.tools.offload.streams import CudaStreams

    streams = CudaStreams(torch.device("cuda"))
    stager = GradStager(streams, {2_000_000: 4}, 2, write=lambda *_: None)
    worker = OptimizerWorker(2)
    seen = {}
    try:
        assert stager.pool.pinned
        for i in range(2):
            grad = torch.full((1_000_000,), float(i + 1), dtype=torch.bfloat16, device="cuda")
            torch.cuda._sleep(20_000_000)
            grad.mul_(2)  # still queued on the compute stream when the copy is enqueued
            buf, copy, slot = stager.stage(i, grad)
            del grad  # recorded on the side stream: not reused before the copy ran
            worker.submit(lambda i=i, buf=buf, copy=copy: (copy.result(), seen.__setitem__(i, buf.float().sum())))
        assert worker.join() is None
    finally:
        worker.close()
    assert [float(seen[i]) for i in range(2)] == [2e6, 4e6]


def test_device_figures_from_nvml():
    from mlsyskit.tools.offload.gpu_stats import DeviceFigures

    figures = DeviceFigures.open(0)
    if figures is None:
        pytest.skip("pynvml (the gpu extra: pip install nvidia-ml-py) is not installed")
    row = figures.sample(160 << 20)
    assert row["gpu_mem_used"] > 0 and 0 <= row["gpu_util_pct"] <= 100 and row["pcie_rx_MBps"] >= 0


def test_cuda_batched_copy_orders_after_the_producer_and_returns_done_without_a_stream():
    from mlsyskit.tools.offload.copy_kernels import batched_copy
    from mlsyskit.tools.offload.memory import aligned_empty

    sizes = (100, 5000, 70_000)
    srcs = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
    torch.cuda._sleep(50_000_000)  # the fills below are still queued when the copies are issued
    for i, s in enumerate(srcs):
        s.fill_(i + 1)
    side = torch.cuda.Stream()
    on_device = [torch.empty_like(s) for s in srcs]
    batched_copy(on_device, srcs, stream=side)  # the side stream waits for the producer (the fills)
    side.synchronize()
    assert [int(d.min().item()) for d in on_device] == [1, 2, 3]
    torch.cuda._sleep(50_000_000)
    for s in srcs:
        s.fill_(9)
    host = [aligned_empty(n, pin=True) for n in sizes]
    batched_copy(host, srcs)  # no stream: the copies are complete when it returns
    assert all(bool((h == 9).all()) for h in host)  # read on the host, no synchronize in between
