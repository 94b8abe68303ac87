"""Training backends by their CLI name (`fl-server simulate --backend inprocess|ray`)."""
from __future__ import annotations

from mlsyskit.tools.fl.backends import InProcessBackend, TrainingBackend
from mlsyskit.tools.fl.ray_backend import RayBackend

BACKEND_NAMES = ("inprocess", "ray")


def make_backend(name: str, address: str | None = None) -> TrainingBackend:
    """A backend by its CLI name; `ray` joins the cluster at `address`, else starts a local Ray (optional extra)."""
    if name == "inprocess":
        return InProcessBackend()
    if name == "ray":
        return RayBackend(address)
    raise ValueError(f"backend must be one of {', '.join(BACKEND_NAMES)}, got {name!r}")
