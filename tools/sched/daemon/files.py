"""Where a marble daemon keeps its state, and its service name: what clients and the daemon share
(kept apart from the daemon's modules, so a client command imports none of them)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SERVICE = "marble"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "marble"


def default_user_token_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "marble" / "token"


@dataclass(frozen=True)
class DaemonFiles:
    state_dir: Path

    @property
    def db(self) -> Path:
        return self.state_dir / "jobs.db"

    @property
    def token(self) -> Path:
        return self.state_dir / "token"

    @property
    def info(self) -> Path:
        return self.state_dir / "daemon.json"

    @property
    def lock(self) -> Path:
        return self.state_dir / "daemon.lock"

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / "tls"
