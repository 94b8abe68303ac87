"""PNG plots of simulated runs (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def jct_cdf(jct_by_policy: dict[str, list[float]], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, values in jct_by_policy.items():
        xs = sorted(v / 3600.0 for v in values)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def utilisation(timelines: dict[str, list[tuple[float, int, float]]], total_gpus: int, path: Path,
                title: str) -> Path:
    names = list(timelines)
    fig, axes = plt.subplots(len(names), 1, figsize=(6.4, 1.6 * len(names) + 0.8), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        tl = timelines[name]
        t = [p[0] / 3600.0 for p in tl]
        ax.step(t, [p[1] / total_gpus for p in tl], where="post", label="allocated")
        ax.step(t, [p[2] / total_gpus for p in tl], where="post", label="effective")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(name, fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel("time (hours)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
