"""Profiling: execution order from hooks, size distribution, save/load, mismatch detection."""
from __future__ import annotations

import json

import pytest

from mlsyskit.tools.offload.corpus import batch, corpus_bytes
from mlsyskit.tools.offload.model import PRESETS, build_model
from mlsyskit.tools.offload.profiler import Profile, ProfileError, profile_model


def test_profile_records_forward_then_reverse_backward(small_profile):
    p = small_profile
    n_layers = PRESETS["gpt-small"].n_layers
    modules = [u.module for u in p.uses]
    half = len(p.uses) // 2
    assert [u.phase for u in p.uses] == ["forward"] * half + ["backward"] * half
    assert modules[:3] == ["tok", "pos", "blocks.0.ln1"] and modules[half - 1] == "head"
    assert modules[half:] == modules[:half][::-1]  # backward visits modules in reverse
    assert sorted(p.optimizer_order) == list(range(len(p.tensors)))
    assert p.optimizer_order[0] == p.tensors[-1].idx  # the head's gradient is ready first
    assert len(p.tensors) == 2 + 16 * n_layers + 3
    assert sum(c for c in p.size_distribution.values()) == len(p.tensors)
    assert p.size_distribution[64 * 64 * 2] == 4 * n_layers  # q, k, v, o of each block
    rows = [r for r in p.rows if r["phase"] == "forward"]
    assert all(r["end"] >= r["start"] >= 0 for r in p.rows) and len(rows) == len(p.tensors)


def test_save_load_round_trip_and_model_mismatch(tmp_path, small_profile):
    path = tmp_path / "p.json"
    small_profile.save(path)
    loaded = Profile.load(path)
    assert loaded.uses == small_profile.uses and loaded.tensors == small_profile.tensors
    assert json.loads(path.read_text())["size_distribution"]
    other, _ = build_model("gpt-tiny", 0)
    with pytest.raises(ProfileError, match="recorded for model 'gpt-small'.*re-run `tencache profile`"):
        loaded.check_model(other, "gpt-tiny")
    same, _ = build_model("gpt-small", 1)
    loaded.check_model(same)  # same shapes, other seed: fine


def test_bad_profile_files(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        Profile.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not readable JSON"):
        Profile.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"schema": 99}')
    with pytest.raises(ProfileError, match="not a tencache profile"):
        Profile.load(tmp_path / "other.json")


def test_unused_parameter_is_reported():
    model, _ = build_model("gpt-tiny", 0)
    x, y = batch(0, 1, 8, 0)
    with pytest.raises(ProfileError, match="no gradient reached"):
        profile_model(model, lambda: model.head(model.tok(x)).float().mean(), model_name="t", batch=1, seq=8)


def test_corpus_is_the_vendored_plays():
    data = corpus_bytes()
    assert len(data) > 700_000
    assert b"HAMLET" in data.tobytes() and b"MACBETH" in data.tobytes()
    x, y = batch(3, 2, 16, seed=5)
    assert (x[:, 1:] == y[:, :-1]).all()
    assert (batch(3, 2, 16, seed=5)[0] == x).all() and not (batch(4, 2, 16, seed=5)[0] == x).all()
