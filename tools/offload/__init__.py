"""tencache: profile-guided tensor caching and prefetch across device, CPU and NVMe (after 10Cache, SoCC'25).

Library entry points (imported lazily so `tencache --version` stays fast): `offload`, `profile`, `Budgets`.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Budgets", "offload", "profile"]


def __getattr__(name: str) -> Any:
    if name in ("offload", "profile"):
        from mlsyskit.tools.offload import api

        return getattr(api, name)
    if name == "Budgets":
        from mlsyskit.tools.offload.engine import Budgets

        return Budgets
    raise AttributeError(name)
