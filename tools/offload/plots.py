"""PNG of a profile: tensor size distribution and the access timeline (which tensor is used when)."""
from __future__ import annotations

from pathlib import Path

from mlsyskit.tools.offload.profiler import Profile


def plot_profile(prof: Profile, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    dist = prof.size_distribution
    ax1.bar(range(len(dist)), [s * c / 2**20 for s, c in dist.items()], color="tab:blue")
    ax1.set_xticks(range(len(dist)), [f"{s / 1024:.0f}K\nx{c}" for s, c in dist.items()], fontsize=7)
    ax1.set_ylabel("MiB in class")
    ax1.set_title("size classes (tensor bytes x count)")
    for phase, color in (("forward", "tab:green"), ("backward", "tab:red")):
        rows = [r for r in prof.rows if r["phase"] == phase]
        ax2.hlines([r["idx"] for r in rows], [r["start"] * 1e3 for r in rows],
                   [max(r["end"], r["start"] + 1e-5) * 1e3 for r in rows], colors=color, label=phase, linewidth=2)
    ax2.set_xlabel("time in warm-up step (ms)")
    ax2.set_ylabel("tensor id")
    ax2.set_title(f"access timeline ({len(prof.uses)} uses)")
    ax2.legend()
    fig.suptitle(f"tencache profile: {prof.model}, batch {prof.batch} x seq {prof.seq}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
