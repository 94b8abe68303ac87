"""Bad input fails clearly, before or at the point of failure, and never leaves a half-written checkpoint."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from mlsyskit.core.storage import CorruptBlockError, DiskFullError, MissingDirectoryError
from mlsyskit.tools.offload import checkpoint
from mlsyskit.tools.offload.engine import Budgets, OffloadEngine
from mlsyskit.tools.offload.model import build_model
from mlsyskit.tools.offload.optimizer import AdamConfig, HyperParams
from mlsyskit.tools.offload.pools import BudgetError
from mlsyskit.tools.offload.profiler import ProfileError
from mlsyskit.tools.offload.trainer import TrainConfig, run_profile, train, train_plain


def test_budget_smaller_than_largest_tensor(small_cfg, small_profile):
    with pytest.raises(BudgetError, match=r"device budget 16.00 KiB is too small.*largest tensor is 32.00 KiB"):
        train(replace(small_cfg, device_mem=16 * 1024), small_profile)
    with pytest.raises(BudgetError, match="optimizer-state .* budget"):
        train(replace(small_cfg, opt_mem=64 * 1024), small_profile)


@pytest.mark.parametrize("policy", ["tencache", "lru"])
def test_device_budget_below_one_modules_tensors_is_refused_and_the_minimum_runs(policy, small_cfg, small_profile):
    # gpt-small: one 32 KiB, one 8 KiB and one 512 B tensor per module at most, but LayerNorms use two 128 B
    # tensors at once; one slot per class (48 KiB) cannot run them, the per-module minimum (52 KiB) can
    cfg = replace(small_cfg, steps=2, policy=policy)
    with pytest.raises(BudgetError, match=r"device budget 48.00 KiB is too small: the tensors one module uses at once"):
        train(replace(cfg, device_mem=48 * 1024), small_profile)
    result = train(replace(cfg, device_mem=52 * 1024), small_profile)
    assert len(result.losses) == 2 and result.summary["occupancy"]["bytes"]["device"] > 0


def test_spill_without_nvme_dir(small_cfg, small_profile):
    with pytest.raises(BudgetError, match="do not fit the device and CPU budgets and no --nvme-dir"):
        train(replace(small_cfg, nvme_dir=None), small_profile)


@pytest.mark.parametrize("policy", ["tencache", "lru"])
def test_without_nvme_a_class_needs_a_spare_slot_to_swap_through(policy, small_cfg, small_profile):
    # 96 KiB device + 640 KiB CPU hold every 32 KiB tensor exactly, with no slot free to swap through
    cfg = replace(small_cfg, steps=2, policy=policy, nvme_dir=None, cpu_mem=640 * 1024, opt_mem=8 << 20)
    with pytest.raises(BudgetError, match=r"without --nvme-dir, 1 size class\(es\) .* raise the CPU budget by 32.00 KiB"):
        train(cfg, small_profile)
    result = train(replace(cfg, cpu_mem=672 * 1024), small_profile)
    assert result.losses == train_plain(replace(cfg, cpu_mem=672 * 1024))
    assert result.summary["occupancy"]["bytes"]["nvme"] == 0 and result.summary["device_hit_rate"] < 1


def test_missing_nvme_dir(small_cfg, small_profile, tmp_path):
    with pytest.raises(MissingDirectoryError, match="does not exist"):
        train(replace(small_cfg, nvme_dir=tmp_path / "absent"), small_profile)


def test_profile_from_another_model(small_cfg):
    tiny = run_profile(TrainConfig(model="gpt-tiny", batch=small_cfg.batch, seq=small_cfg.seq, steps=1))
    with pytest.raises(ProfileError, match="recorded for model 'gpt-tiny'"):
        train(small_cfg, tiny)


def test_corrupted_nvme_block_is_detected(small_cfg, small_profile):
    model, masters = build_model(small_cfg.model, 0)
    engine = OffloadEngine(model, masters, policy="tencache", profile=small_profile, hyper=HyperParams.fixed(AdamConfig(), list(range(len(masters)))),
                           budgets=Budgets(small_cfg.device_mem, small_cfg.cpu_mem, small_cfg.opt_mem,
                                           small_cfg.nvme_dir), device=model.tok.weight.device)
    victim = next(e for e in engine.store.entries if e.where == "nvme")
    path = engine.nvme.path(victim.key)
    data = bytearray(path.read_bytes())
    data[4096 + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    try:
        from mlsyskit.tools.offload.corpus import batch

        x, y = batch(0, 2, 32, 0)
        engine.begin_step()
        with pytest.raises(CorruptBlockError, match=rf"corrupt block '{victim.key}' in .*payload checksum mismatch"):
            engine.backward(engine.model(x, y))
    finally:
        engine.close()


def test_disk_full_during_training_is_a_clear_error(small_cfg, small_profile, monkeypatch):
    real = os.pwritev
    calls = {"n": 0}

    def fill_up(fd, buffers, offset, *args):
        calls["n"] += 1
        if calls["n"] > 150:  # setup writes succeed, then the disk is full mid-training
            raise OSError(28, "No space left on device")
        return real(fd, buffers, offset, *args)

    monkeypatch.setattr(os, "pwritev", fill_up)
    with pytest.raises(DiskFullError, match="disk full .* while writing block"):
        train(replace(small_cfg, steps=3), small_profile)


def test_failed_checkpoint_leaves_no_partial_directory(small_cfg, small_profile, tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    train(replace(small_cfg, steps=1, checkpoint_dir=ckpt, checkpoint_every=1), small_profile)
    assert [p.name for p in ckpt.iterdir()] == ["step-1"]
    from mlsyskit.tools.offload import filetier

    real_write = filetier.FileTier.write

    def full_after_some(self, key, buf, length=None):
        if self.directory.name.startswith(".step-2") and key == "t40":
            raise DiskFullError(f"disk full while writing block {key!r}")
        return real_write(self, key, buf, length)

    monkeypatch.setattr(filetier.FileTier, "write", full_after_some)
    with pytest.raises(DiskFullError):
        train(replace(small_cfg, steps=2, checkpoint_dir=ckpt, checkpoint_every=1, resume=True), small_profile)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-1"]  # no step-2, no temporary directory
    assert checkpoint.latest(ckpt).step == 1


def test_checkpoint_refuses_up_front_when_disk_is_too_full(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 10))
    with pytest.raises(DiskFullError, match="nothing was written"):
        checkpoint.save(tmp_path, 1, {}, {"w": torch.zeros(30)}, {"w": (10,)})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_read_only_nvme_dir(tmp_path, small):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code = textwrap.dedent(f"""
        from mlsyskit.core.storage import StoragePermissionError
        from mlsyskit.tools.offload.trainer import TrainConfig, train
        try:
            train(TrainConfig(**{small!r}, steps=1, policy="lru", nvme_dir={str(ro)!r}))
        except StoragePermissionError as e:
            print("OK", e)
    """)
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    try:
        r = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    finally:
        ro.chmod(0o755)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"OK --nvme-dir {ro} is not writable"), r.stdout  # before the model is built
