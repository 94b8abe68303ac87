"""The five commands, the namespace mapping and the console helpers."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, VENV_BIN

pytestmark = pytest.mark.slow  # starts servers or subprocesses

COMMANDS = ["tencache", "fl-server", "fl-client", "marble", "bespokv"]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_and_version(cmd):
    exe = VENV_BIN / cmd
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith(f"{cmd} (mlsyskit) ")
    helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True)
    assert "Usage" in helptext.stdout and len(helptext.stdout) > 200


def test_bare_core_and_tools_do_not_import(tmp_path):
    for name in ("core", "tools"):
        # from the repo root the folders are on sys.path, and the package refuses the bare name
        r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO, capture_output=True, text=True)
        assert r.returncode != 0 and "ImportError" in r.stderr
        r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode != 0
    ok = subprocess.run([sys.executable, "-c", "import mlsyskit.core, mlsyskit.tools.kv"], cwd=tmp_path)
    assert ok.returncode == 0


@pytest.mark.slow
def test_wheel_contains_only_mlsyskit(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(REPO)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (wheel,) = Path(tmp_path).glob("mlsyskit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    payload = [n for n in names if ".dist-info/" not in n]
    assert payload and all(n.startswith("mlsyskit/") for n in payload), [n for n in payload if not n.startswith("mlsyskit/")]
    assert "mlsyskit/core/config.py" in payload
    # shipped data (licences included) travels with the wheel, not only with editable installs
    for data in ("mlsyskit/tools/sched/data/pollux-workloads/workload-1.csv",
                 "mlsyskit/tools/sched/data/LICENSE-adaptdl-Apache-2.0",
                 "mlsyskit/tools/fl/data/flash-device-benchmarks.json"):
        assert data in payload, data
    assert any(n.startswith("mlsyskit/tools/offload/data/shakespeare/") for n in payload)


def test_fail_prints_clear_error_and_exit_code(capsys):
    from mlsyskit.core.cli import fail

    exc = fail("budget too small")
    assert exc.exit_code == 2


def test_emit_json_is_plain_json(capsys):
    import json

    import numpy as np

    from mlsyskit.core.console import emit_json, fmt

    emit_json({"a": np.arange(3), "b": 1.5})
    assert json.loads(capsys.readouterr().out) == {"a": [0, 1, 2], "b": 1.5}
    assert fmt(1234567) == "1,234,567" and fmt(0.5) == "0.5000"
