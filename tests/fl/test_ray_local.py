"""`fl-server simulate --backend ray` without --ray-address starts a local Ray itself when none runs (as
Flower's simulation does), trains the rounds on it and stops it at the end; the job equals the in-process
one for the same seed."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.conftest import VENV_BIN

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'mlsyskit[fl-ray]' (or pip install ray)")
pytestmark = pytest.mark.slow  # starts Ray (tens of seconds on a loaded machine)


def simulate(tmp_path, name: str, *extra: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([str(VENV_BIN / "fl-server"), "simulate", "--strategy", "fedavg", "--clients", "6",
                           "--per-round", "3", "--rounds", "2", "--seed", "3", "--run-dir", str(tmp_path / name),
                           "--json", *extra], env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def test_backend_ray_starts_a_local_ray_when_none_runs_and_stops_it(tmp_path):
    from ray._private.services import find_gcs_addresses

    if find_gcs_addresses():
        pytest.skip("a Ray cluster is already running on this machine (the backend would join it)")
    summary, stderr = simulate(tmp_path, "ray", "--backend", "ray")
    assert "started a local Ray" in stderr
    assert "Traceback" not in stderr
    reference, _ = simulate(tmp_path, "inprocess")
    assert summary["final_accuracy"] == reference["final_accuracy"] and summary["rounds"] == 2
    deadline = time.monotonic() + 30
    while find_gcs_addresses():  # the local Ray is stopped with the run
        assert time.monotonic() < deadline, "the local Ray outlived the run"
        time.sleep(0.2)  # polling for Ray's processes to exit, with a deadline
