"""`marble sim`'s settings (kept apart from cli.py, which loads nothing a client command does not need)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlsyskit.core.cli import load_command_config
from mlsyskit.core.config import load_toml, require
from mlsyskit.tools.sched.policies.learned import DEFAULT_MODEL_ERROR


@dataclass(frozen=True)
class SimSettings:
    """`marble sim` settings: defaults here, then --config FILE.toml ([sim] table or top level), then flags."""

    workload: str = ""
    cluster: str = "16x6"
    policies: str = ""             # "" -> fifo,backfill,optimus,tiresias and the default policy
    seeds: int = 1
    seed: int = 0
    restart_cost: float = 30.0
    model_error: float = DEFAULT_MODEL_ERROR  # what a fitted model misses; 0 is still no oracle
    efficiency_threshold: float = 0.5
    pressure_threshold: float = 0.8
    events: bool = False

    def __post_init__(self) -> None:
        require(bool(self.workload), "workload: required (--workload or workload = ... in --config)")
        require(self.seeds >= 1, f"seeds: must be >= 1, got {self.seeds}")
        require(0.0 <= self.restart_cost, f"restart_cost: must be >= 0 seconds, got {self.restart_cost}")
        require(0.0 <= self.model_error <= 0.9, f"model_error: must be in [0, 0.9], got {self.model_error}")


def sim_settings(config: Path | None, flags: dict) -> SimSettings:
    section = None
    if config is not None and "sim" in load_toml(config):
        section = "sim"
    return load_command_config(SimSettings, config, flags, section=section)
