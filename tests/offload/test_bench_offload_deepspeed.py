"""scripts/bench_offload_deepspeed.py without DeepSpeed: the plan it would run (--dry-run), its argument
checks, and the summary and targets it computes from runs (DeepSpeed itself is never run in CI)."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_offload_deepspeed.py"


def load_bench():
    return load_script(SCRIPT, "bench_offload_deepspeed")


@pytest.mark.slow
def test_dry_run_plans_both_systems_with_the_same_model_seed_batches_and_steps(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--model", "gpt-10m", "--batch", "2",
                          "--seq", "32", "--steps", "3", "--seed", "7", "--nvme-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4
    for line in lines:
        for flag in ("--model gpt-10m", "--batch 2", "--seq 32", "--steps 3", "--seed 7"):
            assert flag in line, (flag, line)
    assert "--offload nvme" in lines[0] and "--offload cpu" in lines[2] and "worker.py" in lines[0]
    assert lines[1].split()[1] == "train" and lines[3].split()[1] == "train"
    from mlsyskit.core.config import parse_size
    from mlsyskit.tools.offload.model import preset

    n = preset("gpt-10m").n_params
    size = lambda words, flag: parse_size(words[words.index(flag) + 1])  # noqa: E731
    # before DeepSpeed is measured the budgets add up to 18 bytes per parameter (+64 MiB); the device budget is
    # a quarter of the bf16 parameters in both placements, so parameters really move
    for line, placement in ((lines[1], "nvme"), (lines[3], "cpu")):
        words = line.split()
        assert size(words, "--device-mem") < 2 * n / 3
        total = sum(size(words, f) for f in ("--device-mem", "--cpu-mem", "--opt-mem"))
        assert 18 * n <= total <= 18 * n + (64 << 20)
        assert ("--nvme-dir" in words) == (placement == "nvme")
    cpu = lines[3].split()
    assert size(cpu, "--cpu-mem") >= 2 * n and size(cpu, "--opt-mem") >= 16 * n


def test_equal_budgets_add_up_to_deepspeeds_memory():
    bench = load_bench()
    n = 50_000_000
    for placement in ("nvme", "cpu"):
        for total in (18 * n, 30 * n):
            device, cpu, opt = bench.equal_budgets(n, total, placement)
            assert device + cpu + opt == total and device == 2 * n // 4
            assert opt <= 16 * n * 11 // 10  # no more than every optimizer state needs; the spare caches parameters
    device, cpu, opt = bench.equal_budgets(n, 6 * n, "nvme")  # less memory than the states: most go to NVMe
    assert cpu < 2 * n - device and opt < 16 * n
    with pytest.raises(ValueError, match="cannot hold"):
        bench.equal_budgets(n, 2 * n, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--steps", "1"], ["--configs", "tencache-gpu"], ["--rounds", "0"]])
def test_bad_arguments_are_refused(args):
    out = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "error" in out.stderr


def run(step_s, rss, losses=(5.0, 4.0, 3.0)):
    steps = [{"step": i, "step_s": s, "cpu_s": s / 2, "loss": x}
             for i, (s, x) in enumerate(zip(step_s, losses, strict=True))]
    return {"steps": steps, "losses": list(losses), "peak_rss": rss}


def test_summary_drops_each_runs_warm_up_step_and_targets_compare_medians():
    bench = load_bench()
    tc = [run([9.0, 1.0, 1.2], 2 << 30), run([8.0, 1.1, 0.9], 3 << 30)]
    ds = [run([20.0, 2.0, 1.8], 4 << 30), run([30.0, 1.6, 1.7], 4 << 30)]
    s = bench.summarize(tc)
    assert s["step_s_median"] == pytest.approx(1.05) and s["measured_steps"] == 4 and s["peak_rss"] == 3 << 30
    peers = {"tencache-nvme": {"summary": s}, "deepspeed-nvme": {"summary": bench.summarize(ds)},
             "tencache-cpu": {"summary": bench.summarize(ds)}, "deepspeed-cpu": {"summary": s}}
    t = {x["target"]: x for x in bench.targets(peers)}
    nvme = t["median step: ZeRO-3 nvme offload / tencache"]
    assert nvme["value"] == pytest.approx(1.75 / 1.05) and nvme["met"]  # >= 1.5
    cpu = t["median step: ZeRO-3 cpu offload / tencache"]
    assert cpu["value"] == pytest.approx(1.05 / 1.75) and not cpu["met"]
    assert t["peak RSS: ZeRO-3 nvme offload / tencache"]["met"] and not t["peak RSS: ZeRO-3 cpu offload / tencache"]["met"]
    assert cpu["goal"] == ">= 1.2" and nvme["goal"] == ">= 1.5"


def test_round_ratios_pair_the_runs_of_each_round():
    bench = load_bench()
    tc = [run([9.0, 1.0, 1.0], 1), run([9.0, 2.0, 2.0], 1)]
    ds = [run([9.0, 2.0, 2.0], 1), run([9.0, 3.0, 3.0], 1)]
    assert bench.round_ratios(tc, ds) == [2.0, 1.5]
    peers = {"tencache-nvme": {"summary": bench.summarize(tc), "runs": tc},
             "deepspeed-nvme": {"summary": bench.summarize(ds), "runs": ds}}
    worst = next(t for t in bench.targets(peers) if t["target"].startswith("every round"))
    assert worst["value"] == 1.5 and worst["met"]


def test_a_missing_peer_yields_no_target():
    bench = load_bench()
    assert bench.targets({"tencache-nvme": {"summary": bench.summarize([run([1, 1, 1], 1)])}}) == []


def load_worker():
    return load_script(SCRIPT.parent / "bench_offload_ds" / "worker.py", "bench_offload_ds_worker")


@pytest.mark.parametrize("swap", ["pipelined", "sync"])
def test_deepspeeds_optimizer_swapping_has_a_buffer_per_state_of_each_sub_group_in_flight(swap):
    """Pipelined NVMe swapping keeps 3 sub-groups in flight, 4 buffers each (fp32 master, m, v, gradient):
    with DeepSpeed's documented 4 its first step asserted. sync is DeepSpeed's own default: 4 buffers, one
    sub-group of 1e9, no pipeline. The CPU placement has no swap buffers at all."""
    worker = load_worker()
    args = argparse.Namespace(offload="nvme", nvme_dir="/nvme", optimizer_swap=swap, batch=2, lr=3e-4, aio=None)
    zero = worker.ds_config(args, hidden=512, largest=16 << 20, n_params=50_000_000)["zero_optimization"]
    optimizer = zero["offload_optimizer"]
    if swap == "pipelined":
        assert optimizer["buffer_count"] == 4 * 3 and optimizer["pipeline_read"] and optimizer["pipeline_write"]
        assert zero["sub_group_size"] == 12_500_000  # a quarter of the model: tiles for the pipeline
    else:
        assert optimizer["buffer_count"] == 4 and "pipeline_read" not in optimizer
        assert zero["sub_group_size"] == int(1e9)
    assert optimizer["nvme_path"] == "/nvme" and zero["offload_param"]["buffer_count"] == 5
    cpu = worker.ds_config(argparse.Namespace(**{**vars(args), "offload": "cpu"}), 512, 16 << 20, 50_000_000)
    assert "buffer_count" not in cpu["zero_optimization"]["offload_optimizer"]
