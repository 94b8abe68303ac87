"""The tencache CLI: profile and train from the command line, clear one-line errors for bad input."""
from __future__ import annotations

import json

from conftest import CliResult, invoke_cli

from mlsyskit.tools.offload.cli import app

SMALL_ARGS = ["--model", "gpt-small", "--batch", "2", "--seq", "32", "--device-mem", "96KiB", "--cpu-mem", "128KiB",
              "--opt-mem", "2MiB"]


def invoke(*args: str) -> CliResult:
    """As `tencache` behaves: a UserError is one `error:` line and its exit code (1 or 2)."""
    return invoke_cli(app, args)


def test_profile_then_train_with_all_tiers(tmp_path):
    prof, png = tmp_path / "prof" / "profile.json", tmp_path / "prof" / "profile.png"
    r = invoke("profile", "--model", "gpt-small", "--batch", "2", "--seq", "32", "--out", str(prof.parent), "--plot",
               "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["tensors"] == 69 and summary["order_length"] == 72
    assert png.stat().st_size > 10_000
    nvme, run = tmp_path / "nvme", tmp_path / "run"
    nvme.mkdir()
    r = invoke("train", *SMALL_ARGS, "--profile", str(prof.parent), "--steps", "3", "--nvme-dir", str(nvme),
               "--out", str(run), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert len(out["losses"]) == 3 and out["summary"]["device"] == "emulated device"
    assert out["summary"]["occupancy"]["bytes"]["nvme"] > 0
    events = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["step", "step", "step", "summary"]
    assert json.loads((run / "summary.json").read_text())["losses"] == out["losses"]
    assert out["summary"]["peak_rss"] > 0 and all(e["peak_rss"] > 0 for e in events[:3])
    assert [p.name for p in nvme.iterdir()] == [".tencache.lock"]  # the run's blocks are removed at exit
    r = invoke("train", *SMALL_ARGS, "--profile", str(prof), "--steps", "1", "--nvme-dir", str(nvme),
               "--policy", "lru")
    assert r.exit_code == 0, r.output
    assert "emulated device" in r.stdout and "device hit rate" in r.stdout


def test_train_checkpoint_and_resume(tmp_path):
    nvme, ckpt = tmp_path / "nvme", tmp_path / "ckpt"
    nvme.mkdir()
    ckpt.mkdir()
    full = invoke("train", *SMALL_ARGS, "--steps", "3", "--nvme-dir", str(nvme), "--json")
    first = invoke("train", *SMALL_ARGS, "--steps", "1", "--nvme-dir", str(nvme), "--checkpoint-dir", str(ckpt),
                   "--json")
    resumed = invoke("train", *SMALL_ARGS, "--steps", "3", "--nvme-dir", str(nvme), "--checkpoint-dir", str(ckpt),
                     "--resume", "--json")
    losses = [json.loads(r.stdout[r.stdout.index("{"):])["losses"] for r in (full, first, resumed)]
    # two resumed steps: the last loss depends on an update made with the restored optimizer state (m, v, step)
    assert len(losses[1]) == 1 and len(losses[2]) == 2
    assert losses[1] + losses[2] == losses[0]  # resuming continues exactly where the checkpoint left off
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-1", "step-3"]
    again = invoke("train", *SMALL_ARGS, "--steps", "3", "--nvme-dir", str(nvme), "--checkpoint-dir", str(ckpt),
                   "--resume")
    assert again.exit_code == 2 and "already at step 3" in again.output, again.output


def test_checkpoint_every_n_steps_and_at_the_end(tmp_path):
    nvme, ckpt = tmp_path / "nvme", tmp_path / "ckpt"
    nvme.mkdir()
    ckpt.mkdir()
    r = invoke("train", *SMALL_ARGS, "--steps", "3", "--nvme-dir", str(nvme), "--checkpoint-dir", str(ckpt),
               "--checkpoint-every", "2")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-2", "step-3"]


def test_clear_errors(tmp_path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = [
        (["train", *SMALL_ARGS, "--nvme-dir", str(tmp_path / "absent")], "does not exist"),
        (["train", *SMALL_ARGS, "--device-mem", "8KiB", "--nvme-dir", str(nvme)], "device budget 8.00 KiB is too small"),
        (["train", *SMALL_ARGS, "--profile", str(tmp_path / "none.json")], "profile"),
        (["train", "--model", "gpt-huge"], "unknown model 'gpt-huge'"),
        (["train", *SMALL_ARGS, "--policy", "fifo"], "unknown policy 'fifo'"),
        (["train", *SMALL_ARGS, "--device-mem", "lots"], "cannot parse size 'lots'"),
        (["train", *SMALL_ARGS, "--resume"], "--resume needs --checkpoint-dir"),
        (["train", *SMALL_ARGS, "--checkpoint-every", "-2"], "checkpoint_every and warmup_steps must be >= 0"),
        (["train", *SMALL_ARGS, "--lr", "0"], "--lr must be positive, got 0.0"),
        (["train", *SMALL_ARGS, "--lr", "inf"], "lr: expected a finite number, got inf"),
        (["train", *SMALL_ARGS, "--nvme-dir", str(nvme), "--keep-checkpoints", "0"], "keep_checkpoints must be >= 1"),
        (["train", *SMALL_ARGS, "--nvme-dir", str(nvme), "--checkpoint-dir", str(tmp_path / "no-ckpt")],
         "checkpoint directory"),  # refused before training, not when the first checkpoint is due
        (["profile", "--model", "gpt-tiny", "--batch", "1", "--seq", "8", "--out", str(blocker)], "is a file"),
    ]
    for args, message in cases:
        r = invoke(*args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output, (args, r.output)
        assert "Traceback" not in r.output


def test_resume_refuses_settings_that_change_the_data_stream(tmp_path):
    nvme, ckpt = tmp_path / "nvme", tmp_path / "ckpt"
    nvme.mkdir()
    ckpt.mkdir()
    common = [*SMALL_ARGS, "--nvme-dir", str(nvme), "--checkpoint-dir", str(ckpt)]
    first = invoke("train", *common, "--steps", "1", "--json")
    assert first.exit_code == 0, first.output
    other_seed = invoke("train", *common, "--steps", "2", "--resume", "--seed", "1")
    assert other_seed.exit_code == 2, other_seed.output
    assert "seed: stored 0, requested 1" in " ".join(other_seed.output.split())  # rich may wrap the line
    assert "Traceback" not in other_seed.output
    assert "batch:" not in other_seed.output and "seq:" not in other_seed.output  # only what differs is named
    several = invoke("train", *common, "--steps", "2", "--resume", "--seed", "5", "--seq", "16", "--model", "gpt-tiny")
    assert several.exit_code == 2, several.output
    message = " ".join(several.output.split())
    for part in ("model: stored 'gpt-small', requested 'gpt-tiny'", "seed: stored 0, requested 5",
                 "seq: stored 32, requested 16"):
        assert part in message, several.output
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-1"]  # a refused resume writes nothing
    # lr, policy, budgets and checkpoint cadence may change; same model/seed/batch/seq continues the stream
    resumed = invoke("train", *common, "--steps", "2", "--resume", "--policy", "lru", "--checkpoint-every", "1",
                     "--json")
    assert resumed.exit_code == 0, resumed.output
    full = invoke("train", *SMALL_ARGS, "--nvme-dir", str(nvme), "--steps", "2", "--json")
    losses = [json.loads(r.stdout[r.stdout.index("{"):])["losses"] for r in (first, resumed, full)]
    assert len(losses[0]) == len(losses[1]) == 1
    assert losses[0] + losses[1] == losses[2]
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-1", "step-2"]


def test_nvml_figures_are_step_table_rows_when_the_engine_has_them(tmp_path, monkeypatch):
    """On a GPU, engine.device_figures() (NVML) is recorded per step and its means are rows of the step table;
    a fake stands in for NVML here. On the emulated device the figures are empty and no row appears."""
    from mlsyskit.tools.offload.engine import OffloadEngine
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    plain = invoke("train", *SMALL_ARGS, "--steps", "1", "--nvme-dir", str(nvme))
    assert plain.exit_code == 0, plain.output
    assert "NVML" not in plain.stdout
    monkeypatch.setattr(OffloadEngine, "device_figures", lambda self: {"gpu_util_pct": 50.0, "pcie_tx_MBps": 200.0})
    r = invoke("train", *SMALL_ARGS, "--steps", "2", "--nvme-dir", str(nvme), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["summary"]["gpu"] == {"gpu_util_pct": 50.0, "pcie_tx_MBps": 200.0}
    table = invoke("train", *SMALL_ARGS, "--steps", "1", "--nvme-dir", str(nvme))
    assert "GPU utilisation (%) (NVML, mean)" in table.stdout and "PCIe tx (MB/s) (NVML, mean)" in table.stdout
