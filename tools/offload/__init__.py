"""tencache: profile-guided tensor caching and prefetch across device, CPU and NVMe (after 10Cache, SoCC'25).

Library entry points (imported lazily so `tencache --version` stays fast): `offload`, `profile`, `Budgets`,
`LazyInit` (build a model on the meta device and initialise each tensor straight into its tier), `RankGroup`
(under torchrun: `offload(..., ranks=RankGroup.from_env())` shards parameters and optimizer states).
"""
from __future__ import annotations

from typing import Any

__all__ = ["Budgets", "LazyInit", "RankGroup", "offload", "profile"]


def __getattr__(name: str) -> Any:
    if name in ("offload", "profile"):
        from mlsyskit.tools.offload import api

        return getattr(api, name)
    if name == "Budgets":
        from mlsyskit.tools.offload.engine import Budgets

        return Budgets
    if name == "LazyInit":
        from mlsyskit.tools.offload.lazy import LazyInit

        return LazyInit
    if name == "RankGroup":
        from mlsyskit.tools.offload.ranks import RankGroup

        return RankGroup
    raise AttributeError(name)
