"""Several ranks on GPUs (NCCL): `torchrun --nproc-per-node 2 tencache train --device cuda` shards parameters and
optimizer states across two GPUs and equals one process on one GPU taking the same global batch as two
micro-batches. Run by scripts/gpu_check (step `ranks`); NCCL refuses two ranks on one GPU, so it needs 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import free_port
from safetensors.torch import load_file

from mlsyskit.tools.offload.trainer import TrainConfig, train

pytestmark = [pytest.mark.gpu, pytest.mark.slow,  # starts torchrun and two rank processes
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="NCCL needs one GPU per rank: this check needs 2 CUDA GPUs")]

BIN = Path(sys.executable).parent


def test_two_nccl_ranks_equal_one_gpu_process(tmp_path):
    nvme, logs = tmp_path / "nvme", tmp_path / "logs"
    nvme.mkdir()
    args = ["--model", "gpt-10m", "--batch", "2", "--seq", "64", "--steps", "3", "--device-mem", "8MiB",
            "--cpu-mem", "8MiB", "--opt-mem", "64MiB", "--lr", "0.001", "--clip", "1.0", "--device", "cuda"]
    cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "--log-dir", str(logs), "--redirects", "1",
           str(BIN / "tencache"), "train", *args, "--nvme-dir", str(nvme), "--export", str(tmp_path / "ranks.safetensors"),
           "--rank-timeout", "90", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    outs = sorted(logs.rglob("stdout.log"), key=lambda p: p.parent.name)
    runs = [json.loads(p.read_text()[p.read_text().index("{"):]) for p in outs]
    assert len(runs) == 2 and runs[0]["losses"] == runs[1]["losses"]
    assert all(run["summary"]["device"].startswith("cuda") for run in runs)
    (tmp_path / "single").mkdir()
    single = train(TrainConfig(model="gpt-10m", batch=2, seq=64, steps=3, device_mem=8 << 20, cpu_mem=8 << 20,
                               opt_mem=64 << 20, lr=0.001, clip=1.0, accumulate=2, nvme_dir=tmp_path / "single",
                               export=tmp_path / "single.safetensors", device="cuda"))
    # NCCL sums two fp32 gradients exactly (a+b); the GPU kernels of both runs are the same, so this is
    # expected bit for bit; the bound allows a kernel that picks another algorithm per process
    assert runs[0]["losses"] == pytest.approx(single.losses, rel=1e-5, abs=1e-6)
    ours, ref = load_file(tmp_path / "ranks.safetensors"), load_file(tmp_path / "single.safetensors")
    assert sorted(ours) == sorted(ref)
    worst = max(float((ours[k] - ref[k]).abs().max()) for k in ref)
    assert worst <= 1e-4, worst
    held = [sum(run["summary"]["occupancy"]["held"].values()) for run in runs]
    whole = sum(single.summary["occupancy"]["held"].values())
    assert all(h <= 0.65 * whole for h in held), (held, whole)
