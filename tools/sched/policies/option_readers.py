"""Which policies read the threshold options a user can set from the command line, so a flag
that no chosen policy reads is refused instead of silently changing nothing (the default
`marble` sizes jobs by goodput and reads neither)."""
from __future__ import annotations

from collections.abc import Iterable

from mlsyskit.tools.sched.policies.base import PolicyOptions

READERS: dict[str, tuple[str, ...]] = {
    "efficiency_threshold": ("marble-fifo", "marble-las"),
    "pressure_threshold": ("marble-fifo",),
}


def unread_options(policies: Iterable[str], options: PolicyOptions) -> list[str]:
    """One message per option set away from its default that none of `policies` reads."""
    chosen, defaults = set(policies), PolicyOptions()
    return [f"--{field.replace('_', '-')} is read only by {' and '.join(readers)}, which "
            f"{'is' if len(chosen) == 1 else 'are'} not among the policies ({', '.join(sorted(chosen))})"
            for field, readers in READERS.items()
            if getattr(options, field) != getattr(defaults, field) and not chosen.intersection(readers)]
