"""A user's own model and data from the CLI (--model package.module:factory, --data FILE|package.module:loader,
--accumulate, --clip, --weight-decay, --warmup) equal the plain reference; --lr must be representable;
checkpoints export to safetensors per tensor; progress lines every <= 10 s in every phase (fake clock)."""
from __future__ import annotations

import io
import json
import textwrap
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import CliResult, invoke_cli
from rich.console import Console

from mlsyskit.core.console import Reporter
from mlsyskit.tools.offload import progress as progress_mod
from mlsyskit.tools.offload.cli import app
from mlsyskit.tools.offload.progress import Heartbeat, ProgressNote
from mlsyskit.tools.offload.trainer import TrainConfig, train, train_plain

USER_MODULE = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(64, 32)
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 192), nn.ReLU(), nn.Linear(192, 32))
                                        for _ in range(2))
            self.norm, self.head = nn.LayerNorm(32), nn.Linear(32, 64)

        def forward(self, x, y):
            h = self.emb(x)
            for b in self.blocks:
                h = h + b(h)
            return nn.functional.cross_entropy(self.head(self.norm(h)).float().reshape(-1, 64), y.reshape(-1))

    def make():
        return Net()

    def loader(step, batch, seq, seed):
        g = torch.Generator().manual_seed(seed * 1000 + step)
        x = torch.randint(0, 64, (batch, seq), generator=g)
        return x, (x * 3 + 1) % 64
""")


def invoke(*args: str) -> CliResult:
    return invoke_cli(app, args)


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "userpkg.models"


BUDGETS = ["--device-mem", "32KiB", "--cpu-mem", "28KiB", "--opt-mem", "512KiB"]


@pytest.mark.parametrize("data_kind", ["file", "loader"])
def test_user_model_and_data_with_accumulate_clip_decay_warmup_equal_the_reference(data_kind, user_pkg, tmp_path):
    if data_kind == "file":
        tokens = tmp_path / "tokens.npy"
        np.save(tokens, (np.arange(5000) * 7 % 64).astype(np.int64))
        data = str(tokens)
    else:
        data = f"{user_pkg}:loader"
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    flags = ["--model", f"{user_pkg}:make", "--data", data, "--batch", "2", "--seq", "16", "--steps", "4",
             "--accumulate", "2", "--clip", "0.5", "--weight-decay", "0.1", "--warmup", "3", "--lr", "0.01"]
    r = invoke("train", *flags, *BUDGETS, "--nvme-dir", str(nvme), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["summary"]["occupancy"]["bytes"]["nvme"] > 0  # parameters really offloaded
    cfg = TrainConfig(model=f"{user_pkg}:make", data=data, batch=2, seq=16, steps=4, accumulate=2, clip=0.5,
                      weight_decay=0.1, lr_warmup=3, lr=0.01, device="cpu")
    assert out["losses"] == train_plain(cfg)
    # each flag changes the run: the reference without them differs
    assert train_plain(replace(cfg, clip=None, weight_decay=0.0, lr_warmup=0)) != out["losses"]


def test_bad_model_data_and_lr_are_one_line_usage_errors(user_pkg, tmp_path):
    for flags, why in [(["--model", "nosuchpkg.mod:make"], "cannot import"),
                       (["--model", f"{user_pkg}:nothing"], "no callable"),
                       (["--model", "gpt-small", "--data", str(tmp_path / "missing.npy")], "no such file"),
                       (["--model", "gpt-small", "--lr", "1e38"], "not representable"),
                       (["--model", "gpt-small", "--lr", "inf"], "finite"),
                       (["--model", "gpt-small", "--clip", "0"], "clip must be"),
                       (["--model", "gpt-small", "--accumulate", "0"], "accumulate must be")]:
        r = invoke("train", *flags, "--batch", "2", "--seq", "16", "--steps", "1", "--policy", "lru", *BUDGETS,
                   "--nvme-dir", str(tmp_path))
        assert r.exit_code == 2 and why in r.output and r.output.count("error:") == 1, (flags, r.output)


def test_checkpoint_exports_to_safetensors_per_tensor(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    ckpt, nvme = tmp_path / "ckpt", tmp_path / "nvme"
    ckpt.mkdir()
    nvme.mkdir()
    cfg = TrainConfig(model="gpt-small", batch=2, seq=32, steps=2, device_mem=96 << 10, cpu_mem=128 << 10,
                      opt_mem=2 << 20, nvme_dir=nvme, checkpoint_dir=ckpt, checkpoint_every=2, device="cpu",
                      policy="lru")
    train(cfg)
    out = tmp_path / "model.safetensors"
    r = invoke("export", str(ckpt), "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    loaded = safetensors.load_file(str(out))
    from mlsyskit.tools.offload import checkpoint

    stored = {name: master.clone() for name, master, _, _ in checkpoint.latest(ckpt).states()}
    assert loaded.keys() == stored.keys() and len(loaded) == 69
    assert all(torch.equal(loaded[k], stored[k]) for k in stored)


def test_progress_lines_every_ten_seconds_in_every_phase_with_a_fake_clock(tmp_path, monkeypatch):
    """A real training run (profiling, populating the tiers, steps, the optimizer sweep, a checkpoint) whose
    every unit of work costs 3 fake seconds while the heartbeat ticks: never silent for > 10 s, and the
    lines say where in each phase the run is."""
    now = [0.0]
    buf = io.StringIO()
    rep = Reporter(terminal=False, quiet=False, interval=9.5, clock=lambda: now[0],
                   console=Console(file=buf, width=300))
    note = ProgressNote()
    beat = Heartbeat(note, lambda t: rep.update(note=t))
    stamps: list[float] = []
    real_line = rep._line

    def line(text: str) -> None:
        stamps.append(now[0])
        real_line(text)

    monkeypatch.setattr(rep, "_line", line)
    real_set = ProgressNote.set

    def slow_set(self, template, *args):  # each unit of work takes 3 s, the heartbeat ticks every 0.5 s
        real_set(self, template, *args)
        for _ in range(6):
            now[0] += beat.tick_s
            beat.poll()

    monkeypatch.setattr(progress_mod.ProgressNote, "set", slow_set)
    ckpt, nvme = tmp_path / "ckpt", tmp_path / "nvme"
    ckpt.mkdir()
    nvme.mkdir()
    cfg = TrainConfig(model="gpt-small", batch=2, seq=32, steps=2, device_mem=96 << 10, cpu_mem=128 << 10,
                      opt_mem=2 << 20, nvme_dir=nvme, checkpoint_dir=ckpt, checkpoint_every=2, device="cpu",
                      clip=1.0)
    with rep:
        rep.phase("tencache")
        train(cfg, progress=note)
    text = buf.getvalue()
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert len(stamps) > 20 and max(gaps) <= 10.0, gaps
    for phase in ("profiling: ", "populating tiers: ", "step 1: ", "% of modules (forward)",
                  "% of modules (backward)", "optimizer", "writing checkpoint"):
        assert phase in text, phase
