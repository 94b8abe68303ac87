"""Training backends by their CLI name (`fl-server simulate --backend inprocess|ray`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlsyskit.tools.fl.backends import TrainingBackend

BACKEND_NAMES = ("inprocess", "ray")


def make_backend(name: str, address: str | None = None) -> TrainingBackend:
    """A backend by its CLI name; `ray` joins the cluster at `address`, else starts a local Ray (optional extra)."""
    # imported for the backend chosen only: the ray backend needs the optional extra
    if name == "inprocess":
        from mlsyskit.tools.fl.backends import InProcessBackend

        return InProcessBackend()
    if name == "ray":
        from mlsyskit.tools.fl.ray_backend import RayBackend

        return RayBackend(address)
    raise ValueError(f"backend must be one of {', '.join(BACKEND_NAMES)}, got {name!r}")
