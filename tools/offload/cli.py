"""tencache command line: `profile` a model's tensor execution order, `train` it across device, CPU and NVMe.

Exit codes: 0 success; 1 runtime failure (a corrupt block or checkpoint, a non-finite loss, gradient or
lr, a busy --nvme-dir, a full disk); 2 usage error (a bad flag, budget, profile or missing folder).
"""
from __future__ import annotations

import contextlib
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mlsyskit.core.cli import (
    config_option,
    ensure_out_dir,
    json_option,
    load_command_config,
    make_app,
    out_option,
    quiet_option,
    run_app,
    seed_option,
    verbose_option,
)
from mlsyskit.core.config import format_size
from mlsyskit.core.console import emit_json, emit_table, log, make_table, reporter, set_verbosity
from mlsyskit.core.errors import RuntimeFailure, UsageError, UserError
from mlsyskit.core.storage_errors import MissingDirectoryError, StorageError, StoragePermissionError
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.offload.progress import Heartbeat, ProgressNote

if TYPE_CHECKING:  # torch and the library load only when a command runs: --help and --version stay fast
    from mlsyskit.tools.offload.profiler import Profile

app = make_app(
    "tencache",
    "Train models larger than device memory (after 10Cache, SoCC'25): profile the execution order of "
    "parameter tensors, then cache and prefetch parameters and optimizer states across GPU, CPU and NVMe "
    "with size-class buffer pools that are reused, never reallocated. Exit codes: 0 ok, 1 runtime failure, "
    "2 usage error.",
)
PROFILE_FILE, PLOT_FILE = "profile.json", "profile.png"
STEPS_FILE, SUMMARY_FILE = "steps.jsonl", "summary.json"
PROGRESS_S = 9.5  # a progress line at least this often (+ the heartbeat's 0.5 s tick: <= 10 s), every phase


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Library errors as the shared hierarchy: what the user asked for is wrong (2) or could not be done (1)."""
    try:
        yield
    except UserError:
        raise
    except (MissingDirectoryError, StoragePermissionError, ValueError) as e:  # BudgetError, ProfileError among them
        raise UsageError(str(e)) from None
    except (StorageError, OSError, RuntimeError) as e:
        raise RuntimeFailure(str(e)) from None


@app.command()
def profile(model: str = typer.Option("gpt-tiny", help="Model preset (gpt-tiny ... gpt-1.3b; the same default as "
                                                         "train) or package.module:factory."),
            data: str = typer.Option(None, help="Token file or package.module:loader (default: the Shakespeare corpus)."),
            batch: int = typer.Option(4, help="Sequences per step."),
            seq: int = typer.Option(64, help="Tokens per sequence."),
            seed: int = seed_option(0, "Seed for weights and data."),
            out: Path = out_option(f"{PROFILE_FILE}, and {PLOT_FILE} with --plot; default tencache-profile"),
            plot: bool = typer.Option(False, "--plot", help=f"Also write {PLOT_FILE} (size distribution and timeline)."),
            as_json: bool = json_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Run the warm-up step with recording hooks and write the profile (it records model, batch and seq)."""
    from mlsyskit.tools.offload.trainer import TrainConfig, run_profile

    set_verbosity(verbose, quiet)
    folder = ensure_out_dir(out or Path("tencache-profile"))
    note = ProgressNote()
    with user_errors(), reporter(interval=PROGRESS_S) as rep:
        rep.phase("profiling")
        with Heartbeat(note, lambda t: rep.update(note=t)):
            prof = run_profile(TrainConfig(model=model, batch=batch, seq=seq, seed=seed, data=data), note)
        prof.save(folder / PROFILE_FILE)
        if plot:
            from mlsyskit.tools.offload.plots import plot_profile

            plot_profile(prof, folder / PLOT_FILE)
    log(f"wrote {folder / PROFILE_FILE}" + (f" and {folder / PLOT_FILE}" if plot else ""))
    summary = profile_summary(prof)
    if as_json:
        emit_json(summary)
        return
    emit_table(make_table(f"{model}: {summary['tensors']} tensors, {format_size(summary['bytes'])}, "
                          f"order length {summary['order_length']}, activations {format_size(prof.activation_bytes)}",
                          ["size class", "count", "bytes"],
                          [(format_size(s), c, format_size(s * c)) for s, c in prof.size_distribution.items()]))
    emit_table(make_table("largest tensors", ["tensor", "shape", "bytes"],
                          [(t["name"], str(tuple(t["shape"])), format_size(t["nbytes"])) for t in summary["largest"]]))


def profile_summary(prof: Profile) -> dict:
    largest = sorted(prof.tensors, key=lambda t: -t.nbytes)[:5]
    return {"model": prof.model, "batch": prof.batch, "seq": prof.seq, "tensors": len(prof.tensors),
            "activation_bytes": prof.activation_bytes,
            "bytes": sum(t.nbytes for t in prof.tensors), "order_length": len(prof.uses),
            "size_classes": {str(k): v for k, v in prof.size_distribution.items()},
            "largest": [{"name": t.name, "shape": list(t.shape), "nbytes": t.nbytes} for t in largest]}


def load_profile(path: Path) -> Profile:
    """A profile file, or a `tencache profile --out` folder holding profile.json."""
    from mlsyskit.tools.offload.profiler import Profile

    return Profile.load(path / PROFILE_FILE if path.is_dir() else path)


@app.command()
def train(model: str = typer.Option(None, help="Model preset (gpt-tiny, gpt-small, gpt-10m ... gpt-1.3b; default "
                                                "the profile's, else gpt-tiny) or package.module:factory (called "
                                                "with no arguments; its forward(x, y) returns the loss)."),
          data: str = typer.Option(None, help="Token file (.npy, .pt or raw uint8 bytes) or package.module:loader "
                                   "(loader(step, batch, seq, seed) -> (x, y)); default: the Shakespeare corpus."),
          accumulate: int = typer.Option(None, help="Micro-batches (backward passes) per optimizer step (default 1)."),
          clip: float = typer.Option(None, help="Clip the global gradient norm to this value (default: no clipping)."),
          weight_decay: float = typer.Option(None, help="AdamW decoupled weight decay (default 0)."),
          warmup: int = typer.Option(None, help="Linear lr warm-up over this many steps (default 0)."),
          profile_path: Path | None = typer.Option(None, "--profile", help="Profile file or `tencache profile --out` "
                                                   "folder; without it the run profiles first."),
          device_mem: str = typer.Option(None, help="Device budget (e.g. 2GiB; default 1GiB)."),
          cpu_mem: str = typer.Option(None, help="CPU parameter-cache budget (default 4GiB)."),
          opt_mem: str = typer.Option(None, help="CPU optimizer-state cache budget (default 8GiB; overflow goes to NVMe)."),
          nvme_dir: Path | None = typer.Option(None, help="Folder for the NVMe tier (must exist; locked for this run; "
                                               "its blocks are removed at exit)."),
          steps: int = typer.Option(None, help="Training steps (default 10)."),
          batch: int = typer.Option(None, help="Sequences per step (default the profile's, else 4)."),
          seq: int = typer.Option(None, help="Tokens per sequence (default the profile's, else 64)."),
          seed: int = typer.Option(None, "--seed", help="Seed for weights and data (default 0)."),
          lr: float = typer.Option(None, help="AdamW learning rate (default 1e-3; finite and positive)."),
          policy: str = typer.Option(None, help="tencache (profile-guided, default) | on-demand (naive offload) | lru."),
          checkpoint_dir: Path | None = typer.Option(None, help="Write checkpoints here (must exist)."),
          checkpoint_every: int = typer.Option(None, help="Checkpoint every N steps (and at the end)."),
          keep_checkpoints: int = typer.Option(None, help="Keep the N newest checkpoints (default 2)."),
          resume: bool = typer.Option(False, "--resume", help="Continue from the newest valid checkpoint in "
                                      "--checkpoint-dir (a corrupt one is skipped with a warning). --model, --seed, "
                                      "--batch and --seq must equal the checkpoint's; --steps, --lr, the budgets, "
                                      "--nvme-dir, --policy and --checkpoint-every may change."),
          export: Path | None = typer.Option(None, "--export", help="Write the final weights to this .safetensors file "
                                             "(consolidated: under torchrun, rank 0 writes every rank's tensors)."),
          rank_timeout: float = typer.Option(None, help="Under torchrun: seconds a rank waits for the others in a "
                                             "collective before failing with a clear error (default 300)."),
          config: Path | None = config_option(),
          out: Path | None = out_option(f"{STEPS_FILE} (one JSON line per step, then the summary) and {SUMMARY_FILE}"),
          as_json: bool = json_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Train a GPT preset or your own model (--model package.module:factory) on the Shakespeare corpus or your
    data (--data) with the chosen offload policy. A preset is built lazily: each tensor is generated straight
    into its tier, so it may be larger than host memory."""
    from mlsyskit.tools.offload import trainer

    set_verbosity(verbose, quiet)
    with user_errors():
        prof = load_profile(profile_path) if profile_path is not None else None
        overrides = {"model": model or (prof.model if prof else None), "device_mem": device_mem, "cpu_mem": cpu_mem,
                     "opt_mem": opt_mem, "nvme_dir": nvme_dir, "steps": steps,
                     "batch": batch or (prof.batch if prof and prof.batch else None),
                     "seq": seq or (prof.seq if prof and prof.seq else None), "seed": seed, "lr": lr,
                     "policy": policy, "checkpoint_dir": checkpoint_dir, "checkpoint_every": checkpoint_every,
                     "keep_checkpoints": keep_checkpoints, "resume": resume or None, "data": data,
                     "accumulate": accumulate, "clip": clip, "weight_decay": weight_decay, "lr_warmup": warmup,
                     "export": export, "rank_timeout": rank_timeout}
        cfg = load_command_config(trainer.TrainConfig, config, overrides)
        if cfg.checkpoint_dir is not None and not cfg.checkpoint_every:
            cfg = load_command_config(trainer.TrainConfig, config, {**overrides, "checkpoint_every": cfg.steps})
        folder = ensure_out_dir(out) if out is not None else None
        note, lock = ProgressNote(), threading.Lock()
        with Telemetry(log_path=folder / STEPS_FILE if folder else None) as tel, reporter(interval=PROGRESS_S) as rep:
            rep.phase("starting")  # before the heartbeat: its lines always name a phase

            def phase(name: str) -> None:
                with lock:
                    if name == "training":
                        rep.start(f"{cfg.policy} {cfg.model} step", total=cfg.steps, unit="steps")
                    else:
                        rep.phase(name)

            def step(r: dict) -> None:
                with lock:
                    rep.update(completed=r["step"] + 1, note=f"loss {r['loss']:.4f}, {r['step_s']:.2f} s/step")

            with Heartbeat(note, lambda t: rep.update(note=t), lock=lock):
                result = trainer.train(cfg, prof, telemetry=tel, on_phase=phase, on_step=step, progress=note)
        if folder is not None:
            (folder / SUMMARY_FILE).write_text(json.dumps({"summary": result.summary, "losses": result.losses},
                                                          indent=1, default=str))
    if as_json:
        emit_json({"summary": result.summary, "losses": result.losses})
        return
    emit_table(summary_table(result.summary))


@app.command()
def export(checkpoint_dir: Path = typer.Argument(..., help="A --checkpoint-dir of `tencache train`."),
           out: Path = typer.Option(..., "--out", help="The .safetensors file to write."),
           as_json: bool = json_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Write the newest valid checkpoint's fp32 weights as one safetensors file, one tensor at a time."""
    import torch

    from mlsyskit.tools.offload import checkpoint
    from mlsyskit.tools.offload.export import write_safetensors

    set_verbosity(verbose, quiet)
    with user_errors():
        ckpt = checkpoint.latest(checkpoint_dir)
        if ckpt is None:
            raise UsageError(f"no valid checkpoint in {checkpoint_dir}")
        tensors = ckpt.manifest["tensors"]
        specs = [(t["name"], torch.float32, tuple(t["shape"])) for t in tensors]
        write_safetensors(out, specs, (master for _, master, _, _ in ckpt.states()),
                          {"format": "pt", "model": str(ckpt.manifest.get("model")), "step": str(ckpt.step)})
    result = {"path": str(out), "step": ckpt.step, "tensors": len(specs),
              "bytes": sum(4 * math.prod(t["shape"]) for t in tensors)}
    if as_json:
        emit_json(result)
        return
    log(f"wrote {out}: {result['tensors']} tensors, {format_size(result['bytes'])} of fp32 weights (step {ckpt.step})")


GPU_LABELS = {"gpu_mem_used": "device memory used (bytes)", "gpu_mem_budget": "device budget (bytes)",
              "gpu_mem_vs_budget": "device memory used / budget", "gpu_util_pct": "GPU utilisation (%)",
              "pcie_tx_MBps": "PCIe tx (MB/s)", "pcie_rx_MBps": "PCIe rx (MB/s)"}


def summary_table(s: dict) -> object:
    occ = s["occupancy"]["bytes"]
    rows = [("device", s["device"]), ("step time, mean (s)", s["step_s"]), ("step time, median (s)", s["step_s_median"]),
            ("process CPU time per step (s)", s["cpu_s_median"]), ("tokens/s", s["tokens_per_s"]),
            ("device hit rate", s["device_hit_rate"]), ("fetch wait per step (s)", s["fetch_wait_s"]),
            ("fetch wait p99 (s)", s["fetch_wait_p99_s"]), ("allocations per step", s["allocations_per_step"]),
            ("optimizer-state miss rate", s["optimizer_miss_rate"]),
            ("optimizer-state wait per step (s)", s["optimizer_wait_s"]),
            ("profile deviations per step", s["deviations_per_step"]),
            ("device budget used", f"{s['device_utilisation']:.1%}"), ("CPU budget used", f"{s['cpu_utilisation']:.1%}"),
            ("optimizer budget used", f"{s['optimizer_utilisation']:.1%}"),
            ("tensors on device / CPU / NVMe", " / ".join(format_size(occ[k]) for k in ("device", "cpu", "nvme"))),
            ("peak RSS", format_size(s["peak_rss"])), ("budgets (device + CPU + optimizer)", format_size(s["budgets"])),
            ("activations (saved for backward, one step)", format_size(s.get("activations", 0))),
            ("runtime overhead (RSS before the model)", format_size(s.get("runtime_overhead_rss", 0))),
            ("peak RSS / (budgets + activations + overhead)", f"{s.get('peak_rss_over_bound', float('nan')):.2f}"),
            ("final loss", s["final_loss"])]
    rows += [(f"moved {k} per step", format_size(v)) for k, v in s["bytes_moved_per_step"].items()]
    rows += [(f"{GPU_LABELS.get(k, k)} (NVML, mean)", v) for k, v in s.get("gpu", {}).items()]
    return make_table(f"tencache, policy {s['policy']}, on {s['model']} ({s['device']}, {s['measured_steps']} measured steps)",
                      ["metric", "value"], rows)


def main() -> None:
    run_app(app)
