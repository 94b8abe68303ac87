"""Fixtures: a small configuration on all three tiers, and its profile (recorded once per session)."""
from __future__ import annotations

import pytest
from offload_helpers import SMALL

from mlsyskit.tools.offload.trainer import TrainConfig, run_profile


@pytest.fixture
def small_cfg(tmp_path) -> TrainConfig:
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    return TrainConfig(**SMALL, steps=4, nvme_dir=nvme)


@pytest.fixture(scope="session")
def small_profile():
    return run_profile(TrainConfig(**SMALL, steps=1))
