"""tencache command line: `profile` a model's tensor execution order, `train` it across device, CPU and NVMe."""
from __future__ import annotations

from pathlib import Path

import typer

from mlsyskit.core.cli import fail, make_app, run_app
from mlsyskit.core.config import ConfigError, format_size, load_config
from mlsyskit.core.console import emit_json, emit_table, err, make_table, progress
from mlsyskit.core.storage_errors import StorageError
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.offload.pools import BudgetError
from mlsyskit.tools.offload.profiler import Profile, ProfileError

app = make_app(
    "tencache",
    "Train models larger than device memory (after 10Cache, SoCC'25): profile the execution order of "
    "parameter tensors, then cache and prefetch parameters and optimizer states across GPU, CPU and NVMe "
    "with size-class buffer pools that are reused, never reallocated.",
)
USER_ERRORS = (BudgetError, ProfileError, StorageError, ConfigError, ValueError)


@app.command()
def profile(model: str = typer.Option("gpt-tiny", help="Model preset (gpt-tiny ... gpt-1.3b; the same default as train)."),
            batch: int = typer.Option(4, help="Sequences per step."),
            seq: int = typer.Option(64, help="Tokens per sequence."),
            seed: int = typer.Option(0, help="Seed for weights and data."),
            out: Path = typer.Option(Path("profile.json"), help="Where to write the profile (JSON)."),
            plot: Path | None = typer.Option(None, help="Also write a PNG of the size distribution and timeline."),
            json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Run the warm-up step with recording hooks and write the profile."""
    from mlsyskit.tools.offload.trainer import TrainConfig, run_profile

    try:
        prof = run_profile(TrainConfig(model=model, batch=batch, seq=seq, seed=seed))
        prof.save(out)
    except (*USER_ERRORS, OSError) as e:
        raise fail(str(e)) from None
    summary = profile_summary(prof)
    if plot is not None:
        from mlsyskit.tools.offload.plots import plot_profile

        plot_profile(prof, plot)
        err.print(f"wrote {plot}")
    err.print(f"wrote {out}")
    if json_out:
        emit_json(summary)
        return
    emit_table(make_table(f"{model}: {summary['tensors']} tensors, {format_size(summary['bytes'])}, "
                          f"order length {summary['order_length']}", ["size class", "count", "bytes"],
                          [(format_size(s), c, format_size(s * c)) for s, c in prof.size_distribution.items()]))
    emit_table(make_table("largest tensors", ["tensor", "shape", "bytes"],
                          [(t["name"], str(tuple(t["shape"])), format_size(t["nbytes"])) for t in summary["largest"]]))


def profile_summary(prof: Profile) -> dict:
    largest = sorted(prof.tensors, key=lambda t: -t.nbytes)[:5]
    return {"model": prof.model, "tensors": len(prof.tensors), "bytes": sum(t.nbytes for t in prof.tensors),
            "order_length": len(prof.uses), "size_classes": {str(k): v for k, v in prof.size_distribution.items()},
            "largest": [{"name": t.name, "shape": list(t.shape), "nbytes": t.nbytes} for t in largest]}


@app.command()
def train(model: str = typer.Option(None, help="Model preset (gpt-tiny, gpt-small, gpt-10m ... gpt-1.3b; default gpt-tiny)."),
          profile_path: Path | None = typer.Option(None, "--profile", help="Profile from `tencache profile`; "
                                                   "without it the run profiles first."),
          device_mem: str = typer.Option(None, help="Device budget (e.g. 2GiB; default 1GiB)."),
          cpu_mem: str = typer.Option(None, help="CPU parameter-cache budget (default 4GiB)."),
          opt_mem: str = typer.Option(None, help="CPU optimizer-state cache budget (default 8GiB; overflow goes to NVMe)."),
          nvme_dir: Path | None = typer.Option(None, help="Directory for the NVMe tier (must exist)."),
          steps: int = typer.Option(None, help="Training steps (default 10)."),
          batch: int = typer.Option(None, help="Sequences per step (default 4)."),
          seq: int = typer.Option(None, help="Tokens per sequence (default 64)."),
          seed: int = typer.Option(None, help="Seed for weights and data (default 0)."),
          lr: float = typer.Option(None, help="AdamW learning rate (default 1e-3)."),
          policy: str = typer.Option(None, help="tencache (profile-guided, default) | on-demand (naive offload) | lru."),
          checkpoint_dir: Path | None = typer.Option(None, help="Write checkpoints here (must exist)."),
          checkpoint_every: int = typer.Option(None, help="Checkpoint every N steps (and at the end)."),
          resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in "
                                      "--checkpoint-dir. --model, --seed, --batch and --seq must equal the "
                                      "checkpoint's (they fix the weights and the batch stream; a mismatch is "
                                      "refused); --steps, --lr, the budgets, --nvme-dir, --policy and "
                                      "--checkpoint-every may change."),
          config: Path | None = typer.Option(None, help="TOML file with any of these options."),
          log: Path | None = typer.Option(None, help="Per-step telemetry (JSON lines)."),
          json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Train a GPT preset on the Shakespeare corpus with the chosen offload policy."""
    from mlsyskit.tools.offload import trainer

    overrides = {"model": model, "device_mem": device_mem, "cpu_mem": cpu_mem, "opt_mem": opt_mem,
                 "nvme_dir": nvme_dir, "steps": steps, "batch": batch, "seq": seq, "seed": seed, "lr": lr,
                 "policy": policy, "checkpoint_dir": checkpoint_dir, "checkpoint_every": checkpoint_every,
                 "resume": resume or None}
    try:
        cfg = load_config(trainer.TrainConfig, config, overrides)
        prof = Profile.load(profile_path) if profile_path is not None else None
        if cfg.checkpoint_dir is not None and not cfg.checkpoint_every:
            cfg = load_config(trainer.TrainConfig, config, {**overrides, "checkpoint_every": cfg.steps})
        with Telemetry(log_path=log) as tel, progress() as bar:
            task = bar.add_task(f"{cfg.policy} {cfg.model}", total=cfg.steps)
            result = trainer.train(cfg, prof, telemetry=tel, on_step=lambda r: bar.update(
                task, completed=r["step"] + 1, description=f"{cfg.policy} loss {r['loss']:.3f}"))
    except (*USER_ERRORS, OSError) as e:
        raise fail(str(e)) from None
    if json_out:
        emit_json({"summary": result.summary, "losses": result.losses})
        return
    emit_table(summary_table(result.summary))


def summary_table(s: dict) -> object:
    occ = s["occupancy"]["bytes"]
    rows = [("device", s["device"]), ("step time, mean (s)", s["step_s"]), ("step time, median (s)", s["step_s_median"]),
            ("process CPU time per step (s)", s["cpu_s_median"]), ("tokens/s", s["tokens_per_s"]),
            ("device hit rate", s["device_hit_rate"]), ("fetch wait per step (s)", s["fetch_wait_s"]),
            ("fetch wait p99 (s)", s["fetch_wait_p99_s"]), ("allocations per step", s["allocations_per_step"]),
            ("optimizer-state miss rate", s["optimizer_miss_rate"]),
            ("profile deviations per step", s["deviations_per_step"]),
            ("device budget used", f"{s['device_utilisation']:.1%}"), ("CPU budget used", f"{s['cpu_utilisation']:.1%}"),
            ("optimizer budget used", f"{s['optimizer_utilisation']:.1%}"),
            ("tensors on device / CPU / NVMe", " / ".join(format_size(occ[k]) for k in ("device", "cpu", "nvme"))),
            ("final loss", s["final_loss"])]
    rows += [(f"moved {k} per step", format_size(v)) for k, v in s["bytes_moved_per_step"].items()]
    return make_table(f"tencache, policy {s['policy']}, on {s['model']} ({s['device']}, {s['measured_steps']} measured steps)",
                      ["metric", "value"], rows)


def main() -> None:
    run_app(app)
