"""`marble serve`'s settings: defaults here, then --config FILE.toml ([serve] table or top level),
then flags. The executor and policy names are checked where they are loaded (runner.py)."""
from __future__ import annotations

from dataclasses import dataclass

from mlsyskit.core.config import require
from mlsyskit.tools.sched.daemon.specs import parse_time


@dataclass(frozen=True)
class ServeSettings:
    cluster: str = ""
    executor: str = "local"
    policy: str = ""               # "" -> policies.DEFAULT_POLICY
    efficiency_threshold: float = 0.5
    pressure_threshold: float = 0.8
    state_dir: str = ""
    listen: str = "127.0.0.1:0"
    token_file: str = ""
    tls: bool = False
    tls_cert: str = ""
    tls_key: str = ""
    profiles: str = ""
    poll_interval: float = 0.5
    max_time: str = ""             # QOS MaxWall: longest --time a job may ask (and the limit of jobs without one)
    users: str = ""                # users.toml: per-user tokens (users.py)

    def __post_init__(self) -> None:
        require(bool(self.cluster), "cluster: required (--cluster or cluster = ... in --config)")
        try:
            parse_time(self.max_time)
        except ValueError as e:
            require(False, f"max_{e}")
        require(0.05 <= self.poll_interval <= 60, f"poll_interval: must be in [0.05, 60] s, got {self.poll_interval}")
        require(bool(self.tls_cert) == bool(self.tls_key), "tls_cert and tls_key go together")
