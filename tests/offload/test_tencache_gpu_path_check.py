"""scripts/gpu_check's argument handling and plan (no GPU needed), and the NVML step figures with a fake
NVML."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mlsyskit.tools.offload.gpu_stats import DeviceFigures

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check"


def gpu_check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.mark.slow
def test_dry_run_prints_the_plan_within_eight_minutes_and_runs_nothing(tmp_path):
    out = tmp_path / "out"
    r = gpu_check("--dry-run", env={"OUT": str(out), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["dry_run"] and plan["out"] == str(out) and plan["budget_s"] == 480
    names = [s["name"] for s in plan["steps"]]
    assert names == ["gpu-tests", "copies", "offload-bench", "bigmodel", "ranks"]
    tests, _, bench, big, ranks = (s["cmd"] for s in plan["steps"])
    assert "tests/offload/test_tencache_ranks_gpu.py" in ranks and ranks[ranks.index("-m", 2) + 1] == "gpu"
    assert tests[tests.index("-m", 2) + 1] == "gpu" and f"--junitxml={out / 'gpu-tests.xml'}" in tests
    # the offload benchmark's states exceed the device budget: gpt-350m (608 MB bf16) on 160 MiB
    assert bench[bench.index("--model") + 1] == "gpt-350m" and bench[bench.index("--device-mem") + 1] == "160MiB"
    assert bench[bench.index("--device") + 1] == "cuda" and str(out / "bench_offload_gpu.json") in bench
    # the larger-than-memory run: fp32 parameters + states >= 3x the cap, on the GPU
    assert big[big.index("--model") + 1] == "gpt-760m" and big[big.index("--device") + 1] == "cuda"
    assert "--min-ratio" not in big  # the script's default, 3.0, applies
    assert not out.exists()  # nothing run, nothing written


@pytest.mark.slow
def test_skip_and_out_flags_shape_the_plan(tmp_path):
    r = gpu_check("--dry-run", "--skip", "offload-bench", "--skip", "copies", "--out", str(tmp_path), "--budget-s", "300")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert [s["name"] for s in plan["steps"]] == ["gpu-tests", "bigmodel", "ranks"] and plan["budget_s"] == 300
    assert plan["out"] == str(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--budget-s", "900"], ["--budget-s", "10"], ["--skip", "everything"],
                                  ["--frobnicate"]])
def test_bad_arguments_exit_2_with_one_error_line(args):
    r = gpu_check("--dry-run", *args)
    assert r.returncode == 2 and "error:" in r.stderr and r.stdout == ""


@pytest.mark.slow
def test_without_a_gpu_it_fails_with_exit_1_and_says_why(tmp_path):
    r = gpu_check("--out", str(tmp_path / "o"), env={"PATH": str(tmp_path)})  # no nvidia-smi on this PATH
    assert r.returncode == 1 and "not a GPU machine" in r.stderr


class FakeNvml:
    """pynvml's calls used by DeviceFigures, answering fixed figures."""

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init

    def nvmlInit(self):  # noqa: N802 (NVML's names)
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return ("handle", i)

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(used=300 << 20, total=80 << 30)

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetPcieThroughput(self, h, counter):  # noqa: N802
        return {0: 2_000_000, 1: 12_500_000}[counter]  # KB/s: tx 2 GB/s, rx 12.5 GB/s


def test_device_figures_report_memory_against_budget_utilisation_and_pcie():
    figures = DeviceFigures.open(0, nvml=FakeNvml())
    row = figures.sample(budget_bytes=160 << 20)
    assert row == {"gpu_mem_used": float(300 << 20), "gpu_mem_budget": float(160 << 20),
                   "gpu_mem_vs_budget": 300 / 160, "gpu_util_pct": 87.0,
                   "pcie_tx_MBps": 2000.0, "pcie_rx_MBps": 12500.0}


def test_device_figures_are_absent_without_nvml():
    assert DeviceFigures.open(0, nvml=FakeNvml(fail_init=True)) is None


def test_engine_device_figures_use_its_device_budget_and_are_empty_when_emulated(small_cfg, small_profile):
    from mlsyskit.tools.offload.engine import Budgets, OffloadEngine
    from mlsyskit.tools.offload.model import build_model
    from mlsyskit.tools.offload.optimizer import AdamConfig, HyperParams

    model, masters = build_model(small_cfg.model, 0)
    engine = OffloadEngine(model, masters, policy="tencache", profile=small_profile,
                           hyper=HyperParams.fixed(AdamConfig(), list(range(len(masters)))),
                           budgets=Budgets(small_cfg.device_mem, small_cfg.cpu_mem, small_cfg.opt_mem,
                                           small_cfg.nvme_dir), device=torch.device("cpu"))
    try:
        assert engine.device_figures() == {}
        engine._figures = DeviceFigures.open(0, nvml=FakeNvml())  # as on a GPU with NVML
        row = engine.device_figures()
        assert row["gpu_mem_budget"] == small_cfg.device_mem and row["gpu_mem_vs_budget"] == (300 << 20) / small_cfg.device_mem
    finally:
        engine.close()
