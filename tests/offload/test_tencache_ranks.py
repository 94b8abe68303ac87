"""Several ranks: `torchrun --nproc-per-node 2 tencache train` (gloo on the CPU) equals one process taking the
same global batch as micro-batches (accumulate=2), loss for loss, bit for bit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

from mlsyskit.tools.offload.trainer import TrainConfig, train

pytestmark = pytest.mark.slow  # starts torchrun and two rank processes

BIN = Path(sys.executable).parent
SMALL = ["--model", "gpt-small", "--batch", "1", "--seq", "32", "--steps", "3", "--device-mem", "96KiB",
         "--cpu-mem", "128KiB", "--opt-mem", "2MiB", "--lr", "0.003"]


def test_two_ranks_equal_one_process_on_the_same_global_batch(tmp_path):
    nvme, logs = tmp_path / "nvme", tmp_path / "logs"
    nvme.mkdir()
    cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "--log-dir", str(logs), "--redirects", "1",
           str(BIN / "tencache"), "train", *SMALL, "--nvme-dir", str(nvme), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    outs = sorted(logs.rglob("stdout.log"))
    assert len(outs) == 2
    runs = [json.loads(p.read_text()[p.read_text().index("{"):]) for p in outs]
    assert runs[0]["losses"] == runs[1]["losses"]  # every rank reports the global batch's loss
    single_nvme = tmp_path / "single"
    single_nvme.mkdir()
    single = train(TrainConfig(model="gpt-small", batch=1, seq=32, steps=3, device_mem=96 << 10, cpu_mem=128 << 10,
                               opt_mem=2 << 20, lr=0.003, accumulate=2, nvme_dir=single_nvme, device="cpu"))
    assert runs[0]["losses"] == single.losses
    assert {"rank0", "rank1"} <= {p.name for p in nvme.iterdir()}  # each rank its own locked share
