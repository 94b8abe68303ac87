"""Several ranks, ZeRO-3 style: `torchrun --nproc-per-node 2 tencache train` (gloo on the CPU) shards parameters and
optimizer states across the ranks and equals one process taking the same global batch as micro-batches
(accumulate=2) bit for bit: losses, the consolidated export and the consolidated checkpoint (master, m, v); so
does the library API (`offload(..., ranks=...)`, ranks_worker.py), every rank getting the whole model back.
The consolidated checkpoint of the 2-rank run resumes in one process (accumulate=2) exactly.
Each rank's tiers hold about half of the single process's bytes (measured: pool slots in use and NVMe files).
A rank that fails makes the other exit with a clear error instead of hanging."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import free_port
from safetensors.torch import load_file

from mlsyskit.tools.offload import checkpoint
from mlsyskit.tools.offload.trainer import TrainConfig, train
from tests.conftest import load_script

pytestmark = pytest.mark.slow  # starts torchrun and two rank processes

BIN = Path(sys.executable).parent
BUDGETS = dict(device_mem=96 << 10, cpu_mem=128 << 10, opt_mem=4 << 20)  # parameters spill to NVMe; states fit
ARGS = ["--model", "gpt-small", "--batch", "1", "--seq", "32", "--steps", "2", "--device-mem", "96KiB",
        "--cpu-mem", "128KiB", "--opt-mem", "4MiB", "--lr", "0.003", "--clip", "1.0", "--checkpoint-every", "1"]
# torchrun runs each rank with one intra-op thread; the reference must too, or reductions inside a kernel
# (LayerNorm's weight gradient) sum in another order
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
WORKER = Path(__file__).with_name("ranks_worker.py")  # the torchrun script (tests are not importable as modules)
ranks_worker = load_script(WORKER, "ranks_worker")


def _held(run: dict) -> int:
    return sum(run["summary"]["occupancy"]["held"].values())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranks")
    nvme, logs, ckpt = tmp / "nvme", tmp / "logs", tmp / "ckpt"
    nvme.mkdir()
    ckpt.mkdir()
    cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "--log-dir", str(logs), "--redirects", "1",
           str(WORKER), str(tmp), "--", *ARGS, "--nvme-dir", str(nvme),
           "--checkpoint-dir", str(ckpt),
           "--export", str(tmp / "ranks.safetensors"), "--rank-timeout", "120", "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env={**os.environ, **ONE_THREAD})
    assert r.returncode == 0, r.stderr[-3000:]
    outs = sorted(logs.rglob("stdout.log"), key=lambda p: p.parent.name)
    assert [p.parent.name for p in outs] == ["0", "1"]
    runs = [json.loads(p.read_text()[p.read_text().index("{"):]) for p in outs]
    return {"runs": runs, "tmp": tmp, "nvme": nvme, "ckpt": ckpt, "wall_s": time.perf_counter() - t0}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single")
    (tmp / "nvme").mkdir()
    (tmp / "ckpt").mkdir()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train(TrainConfig(model="gpt-small", batch=1, seq=32, steps=2, **BUDGETS, lr=0.003, clip=1.0,
                                   accumulate=2, nvme_dir=tmp / "nvme", checkpoint_dir=tmp / "ckpt", checkpoint_every=2,
                                   export=tmp / "single.safetensors", device="cpu"))
    finally:
        torch.set_num_threads(threads)
    return {"result": result, "tmp": tmp}


def test_two_ranks_equal_one_process_bit_for_bit(two_ranks, single):
    runs = two_ranks["runs"]
    assert runs[0]["losses"] == runs[1]["losses"]  # every rank reports the global batch's loss
    assert runs[0]["losses"] == single["result"].losses
    ours = load_file(two_ranks["tmp"] / "ranks.safetensors")  # consolidated by rank 0
    ref = load_file(single["tmp"] / "single.safetensors")
    assert sorted(ours) == sorted(ref) and len(ref) > 20
    assert all(torch.equal(ours[k], ref[k]) for k in ref)
    a, b = checkpoint.latest(two_ranks["ckpt"]), checkpoint.latest(single["tmp"] / "ckpt")
    assert a.step == b.step == 2
    n = 0
    for (na, *sa), (nb, *sb) in zip(a.states(), b.states(), strict=True):
        assert na == nb and all(torch.equal(x, y) for x, y in zip(sa, sb, strict=True)), na
        n += 1
    assert n == len(ref)


def test_a_two_rank_checkpoint_resumes_in_one_process_exactly(two_ranks, single, tmp_path):
    ckpt, nvme = tmp_path / "ckpt", tmp_path / "nvme"
    nvme.mkdir()
    shutil.copytree(two_ranks["ckpt"] / "step-1", ckpt / "step-1")  # written by rank 0 after step 1 of 2
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        resumed = train(TrainConfig(model="gpt-small", batch=1, seq=32, steps=2, **BUDGETS, lr=0.003, clip=1.0,
                                    accumulate=2, nvme_dir=nvme, checkpoint_dir=ckpt, resume=True,
                                    export=tmp_path / "resumed.safetensors", device="cpu"))
    finally:
        torch.set_num_threads(threads)
    assert resumed.losses == single["result"].losses[1:]
    ours, ref = load_file(tmp_path / "resumed.safetensors"), load_file(single["tmp"] / "single.safetensors")
    assert all(torch.equal(ours[k], ref[k]) for k in ref)


def test_the_library_api_with_two_ranks_equals_one_process(two_ranks):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = ranks_worker.api_run(None, accumulate=2)
    finally:
        torch.set_num_threads(threads)
    for r in (0, 1):  # at exit every rank holds the whole model again
        got = torch.load(two_ranks["tmp"] / f"api-rank{r}.pt")
        assert sorted(got) == sorted(ref) and all(torch.equal(got[k], ref[k]) for k in ref), r


def test_each_rank_holds_about_half_of_the_bytes(two_ranks, single):
    runs = two_ranks["runs"]
    whole = sum(single["result"].summary["occupancy"]["held"].values())
    held = [_held(r) for r in runs]
    # measured: pool slots in use (device, CPU, optimizer states) + this rank's NVMe files
    assert all(h <= 0.6 * whole for h in held), (held, whole)
    assert 0.85 * whole <= sum(held) <= 1.15 * whole, (held, whole)
    opt = [r["summary"]["occupancy"]["held"]["optimizer"] for r in runs]
    single_opt = single["result"].summary["occupancy"]["held"]["optimizer"]
    assert all(o <= 0.6 * single_opt for o in opt) and sum(opt) >= 0.9 * single_opt, (opt, single_opt)
    shards = [r["summary"]["occupancy"]["shard"] for r in runs]
    assert [s["rank"] for s in shards] == [0, 1] and all(s["imbalance"] < 1.1 for s in shards)
    assert all(r["summary"]["occupancy"]["held"]["nvme"] > 0 for r in runs)  # each rank spills to its own folder
    assert {p.name for p in two_ranks["nvme"].iterdir() if p.is_dir()} == {"rank0", "rank1"}


def test_a_failed_rank_makes_the_other_exit_with_a_clear_error(tmp_path):
    """Rank 1's --nvme-dir does not exist on its machine: it exits; rank 0 must not wait forever."""
    (tmp_path / "nvme").mkdir()
    port = free_port()
    procs = []
    t0 = time.perf_counter()
    for rank, nvme in ((0, tmp_path / "nvme"), (1, tmp_path / "missing")):
        env = {**os.environ, **ONE_THREAD, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([str(BIN / "tencache"), "train", "--model", "gpt-tiny", "--batch", "1",
                                       "--seq", "16", "--steps", "2", "--nvme-dir", str(nvme), "--rank-timeout",
                                       "60", "-q"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    try:
        outs = [p.communicate(timeout=200) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[1].returncode == 2 and "does not exist" in outs[1][1]
    assert procs[0].returncode == 1, outs[0][1][-2000:]
    # both fail at the checks before training (rank 0 has not built its model): rank 0 names rank 1's error
    assert "error: rank 0 of 2: the checks before training failed on rank 1: MissingDirectoryError" in outs[0][1]
    assert time.perf_counter() - t0 < 190
