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


# Both runs share one budget below the global 300 s pytest timeout: a test past that timeout is
# interrupted inside subprocess.run, which on a worker can end the whole xdist session.
BUDGET_S = 270


def simulate(tmp_path, name: str, *extra: str, deadline: float) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([str(VENV_BIN / "fl-server"), "simulate", "--strategy", "fedavg", "--clients", "6",
                           "--per-round", "3", "--rounds", "2", "--seed", "3", "--run-dir", str(tmp_path / name),
                           "--json", *extra], env=env, capture_output=True, text=True,
                          timeout=max(1.0, deadline - time.monotonic()))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def test_backend_ray_starts_a_local_ray_when_none_runs_and_stops_it(tmp_path):
    from ray._private.services import find_gcs_addresses

    if find_gcs_addresses():
        pytest.skip("a Ray cluster is already running on this machine (the backend would join it)")
    deadline = time.monotonic() + BUDGET_S
    reference, _ = simulate(tmp_path, "inprocess", deadline=deadline)
    try:
        summary, stderr = simulate(tmp_path, "ray", "--backend", "ray", deadline=deadline - 30)
        assert "started a local Ray" in stderr
        assert "Traceback" not in stderr
        assert summary["final_accuracy"] == reference["final_accuracy"] and summary["rounds"] == 2
        while find_gcs_addresses():  # the local Ray is stopped with the run
            assert time.monotonic() < deadline, "the local Ray outlived the run"
            time.sleep(0.2)  # polling for Ray's processes to exit, with a deadline
    finally:  # a run killed at its timeout leaves its Ray daemons behind: stop them
        if find_gcs_addresses():
            subprocess.run([str(VENV_BIN / "ray"), "stop", "--force"], capture_output=True, timeout=25)
