"""Run safety: a locked, namespaced --nvme-dir; checksummed checkpoints with fallback and pruning;
non-finite values stop training (exit 1); settings refused before the model is built (exit 2)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CliResult, invoke_cli

from mlsyskit.tools.offload.cli import app

SMALL = ["--model", "gpt-small", "--batch", "2", "--seq", "32", "--device-mem", "96KiB", "--cpu-mem", "128KiB",
         "--opt-mem", "2MiB"]
HOLDER = """
import sys
from mlsyskit.tools.offload.nvme_run import NvmeRun
run = NvmeRun.open(sys.argv[1])
(run.path / "p0.blk").write_bytes(b"x" * 4096)
print(run.path, flush=True)
sys.stdin.read()
run.close()
"""


def invoke(*args: str) -> CliResult:
    """As `tencache` behaves: a UserError is one `error:` line and its exit code (1 or 2)."""
    return invoke_cli(app, args)


def losses(r: CliResult) -> list[float]:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout[r.stdout.index("{"):])["losses"]


def start_holder(nvme: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(nvme)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # blocks until the holder has the lock (or died)
    assert line, "holder process did not start"
    return proc, Path(line.strip())


@pytest.mark.slow
def test_second_run_on_one_nvme_dir_is_refused_and_a_killed_runs_blocks_are_reclaimed(tmp_path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    holder, holder_dir = start_holder(nvme)
    try:
        r = invoke("train", *SMALL, "--steps", "1", "--nvme-dir", str(nvme))
        assert r.exit_code == 1, r.output
        assert f"is in use by another tencache run (pid {holder.pid})" in r.output
        assert "profiling" not in r.output  # refused before the model is built
        assert holder_dir.is_dir() and (holder_dir / "p0.blk").exists()  # the other run's blocks are untouched
        holder.send_signal(signal.SIGKILL)  # dies holding the lock: the kernel releases it
        holder.wait(timeout=30)
        assert holder_dir.is_dir()  # left behind by the killed run
        first = losses(invoke("train", *SMALL, "--steps", "2", "--nvme-dir", str(nvme), "--json"))
        assert not holder_dir.exists()  # stale blocks of the dead run were removed
        assert [p.name for p in nvme.iterdir()] == [".tencache.lock"]  # and this run's at its exit
        assert first == losses(invoke("train", *SMALL, "--steps", "2", "--nvme-dir", str(nvme), "--json"))
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)


@pytest.mark.slow
def test_two_concurrent_runs_one_refused_the_other_exact(tmp_path):
    """The lock holds across processes: a CLI run in a subprocess while this process trains."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    reference = losses(invoke("train", *SMALL, "--steps", "3", "--nvme-dir", str(nvme), "--json"))
    holder, _ = start_holder(nvme)
    try:
        env = {**os.environ, "COLUMNS": "200"}
        cli = [sys.executable, "-c", "from mlsyskit.tools.offload.cli import main; main()", "train", *SMALL,
               "--steps", "3", "--nvme-dir", str(nvme)]
        other = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=300)
        assert other.returncode == 1, other.stderr
        assert other.stderr.strip().splitlines()[-1].startswith("error: --nvme-dir")
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert reference == losses(invoke("train", *SMALL, "--steps", "3", "--nvme-dir", str(nvme), "--json"))


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory) -> tuple[Path, Path, list[float]]:
    """One 3-step reference and one 2-step run checkpointed after each step, for the module; each test edits a copy."""
    return _checkpointed_run(tmp_path_factory.mktemp("checkpointed"))


def _copy(run: tuple[Path, Path, list[float]], tmp_path: Path) -> tuple[Path, Path, list[float]]:
    nvme, ckpt, full = run
    return shutil.copytree(nvme, tmp_path / "nvme"), shutil.copytree(ckpt, tmp_path / "ckpt"), full


def _checkpointed_run(tmp_path: Path) -> tuple[Path, Path, list[float]]:
    nvme, ckpt = tmp_path / "nvme", tmp_path / "ckpt"
    nvme.mkdir()
    ckpt.mkdir()
    full = losses(invoke("train", *SMALL, "--steps", "3", "--nvme-dir", str(nvme), "--json"))
    r = invoke("train", *SMALL, "--steps", "2", "--nvme-dir", str(nvme), "--checkpoint-dir", str(ckpt),
               "--checkpoint-every", "1", "--json")
    assert losses(r) == full[:2]
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-1", "step-2"]
    return nvme, ckpt, full


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(checkpointed, tmp_path):
    nvme, ckpt, full = _copy(checkpointed, tmp_path)
    block = ckpt / "step-2" / "t5.blk"
    data = bytearray(block.read_bytes())
    data[4096 + 7] ^= 0x01
    block.write_bytes(bytes(data))
    r = invoke("train", *SMALL, "--steps", "3", "--nvme-dir", str(nvme), "--checkpoint-dir", str(ckpt),
               "--resume", "--json")
    assert "skipping" in r.output and "step-2" in r.output and "checksum" in r.output
    assert losses(r) == full[1:3]  # continued from step 1, exactly


def test_edited_manifest_fails_its_checksum(checkpointed, tmp_path):
    nvme, ckpt, full = _copy(checkpointed, tmp_path)
    manifest = ckpt / "step-2" / "manifest.json"
    body = json.loads(manifest.read_text())
    body["lr"] = 1.0
    manifest.write_text(json.dumps(body))
    r = invoke("train", *SMALL, "--steps", "3", "--nvme-dir", str(nvme), "--checkpoint-dir", str(ckpt),
               "--resume", "--json")
    assert "fails its checksum" in r.output
    assert losses(r) == full[1:3]
    for step in ("step-1", "step-3"):  # nothing valid left: a runtime failure, exit 1
        (ckpt / step / "manifest.json").write_text("{}")
    r = invoke("train", *SMALL, "--steps", "4", "--nvme-dir", str(nvme), "--checkpoint-dir", str(ckpt), "--resume")
    assert r.exit_code == 1 and "no valid checkpoint" in r.output, r.output


def test_non_finite_loss_stops_training_with_exit_1(tmp_path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    r = invoke("train", *SMALL, "--steps", "6", "--lr", "1e30", "--nvme-dir", str(nvme))
    assert r.exit_code == 1, r.output
    assert "is not finite" in r.output or "the loss is" in r.output, r.output
    assert "Traceback" not in r.output


def test_profile_settings_are_taken_or_a_mismatch_refused(tmp_path):
    prof = tmp_path / "prof"
    assert invoke("profile", "--model", "gpt-small", "--batch", "2", "--seq", "32", "--out", str(prof)).exit_code == 0
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    budgets = SMALL[6:]
    r = invoke("train", "--profile", str(prof), *budgets, "--steps", "1", "--nvme-dir", str(nvme), "--json")
    summary = json.loads(r.stdout[r.stdout.index("{"):])["summary"]
    assert summary["model"] == "gpt-small" and summary["deviations_per_step"] == 0  # batch, seq from the profile
    r = invoke("train", "--profile", str(prof), *budgets, "--seq", "16", "--steps", "1", "--nvme-dir", str(nvme))
    assert r.exit_code == 2 and "recorded with --batch 2 --seq 32" in r.output, r.output


def test_exit_codes_usage_2_runtime_1(tmp_path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    assert invoke("train", *SMALL, "--policy", "nope").exit_code == 2  # bad value
    assert invoke("train", *SMALL, "--nvme-dir", str(tmp_path / "absent")).exit_code == 2  # missing folder
    assert invoke("train", *SMALL, "--steps", "6", "--nvme-dir", str(nvme), "--lr", "1e30").exit_code == 1
