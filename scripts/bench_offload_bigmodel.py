#!/usr/bin/env python3
"""Larger than host memory: train a GPT preset whose fp32 parameters + AdamW states are several times the
process's memory cap, built lazily (meta device, each tensor generated straight into its tier, NVMe
included), through the CLI (`tencache train`) and through the library API (`offload(..., init=...)`), each
in a child process under an enforced cap (RLIMIT_DATA: every private writable mapping of the process, heap,
anonymous mmaps and thread stacks, counts; file-backed library code does not). Their losses must equal the
plain in-memory reference's (a separate, uncapped process: every fp32 master, moment and gradient resident,
reference.PlainAdamW's arithmetic), bit for bit, and each run's peak RSS is reported against budgets +
activations + runtime overhead (memory_accounting.MemoryBound).

    scripts/bench_offload_bigmodel.py --model gpt-350m --cap 1GiB --steps 3 --nvme-dir /var/tmp/tc \\
        --out runs/bench_offload_bigmodel.json
    scripts/bench_offload_bigmodel.py --dry-run ...      the plan (sizes, ratio, free disk) as JSON, runs nothing

Refuses (exit 2) when the disk under --nvme-dir lacks room for the run's blocks (checked with statvfs
first) or the ratio (fp32 parameters + states) / cap is below --min-ratio. Exit 1 when a run fails, the
losses differ from the reference, or a run's peak RSS exceeds the cap.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

CHILD = "--child"


def parse_args(argv: list[str]) -> argparse.Namespace:
    from mlsyskit.core.config import parse_size

    p = argparse.ArgumentParser(prog="bench_offload_bigmodel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-350m")
    p.add_argument("--cap", default="1GiB", help="RLIMIT_DATA of each capped run")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="cpu", help="cpu (the emulated device) or cuda (the CLI run picks cuda "
                   "whenever one is there)")
    p.add_argument("--device-mem", default="64MiB")
    p.add_argument("--cpu-mem", default="64MiB")
    p.add_argument("--opt-mem", default="448MiB")
    p.add_argument("--nvme-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/var/tmp")) / "tencache-bigmodel")
    p.add_argument("--min-ratio", type=float, default=3.0, help="least (fp32 parameters + states) / cap")
    p.add_argument("--runs", default="reference,cli,library", help="which runs, comma-separated")
    p.add_argument("--out", type=Path)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    args.cap, args.device_mem, args.cpu_mem, args.opt_mem = (parse_size(v) for v in (args.cap, args.device_mem,
                                                                                     args.cpu_mem, args.opt_mem))
    args.runs = [r for r in args.runs.split(",") if r]
    if not set(args.runs) <= {"reference", "cli", "library"} or args.steps < 1:
        p.error("--runs takes reference, cli, library; --steps >= 1")
    return args


def plan(args: argparse.Namespace) -> dict:
    from mlsyskit.tools.offload.model import preset

    n = preset(args.model).n_params
    states = 12 * n  # fp32 master + m + v
    disk = 18 * n + (256 << 20)  # bf16 blocks + fp32 master|m|v|grad per tensor + block headers
    args.nvme_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.nvme_dir).free
    return {"model": args.model, "params": n, "fp32_params_and_states": states, "cap": args.cap,
            "ratio": states / args.cap, "disk_needed": disk, "disk_free": free, "steps": args.steps,
            "batch": args.batch, "seq": args.seq, "budgets": args.device_mem + args.cpu_mem + args.opt_mem,
            "runs": args.runs, "nvme_dir": str(args.nvme_dir)}


def cap_limit(cap: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    return apply


def child_library(args: argparse.Namespace) -> dict:
    """The library API on the lazily built preset (init=InitialWeights), under the cap."""
    import torch

    from mlsyskit.tools.offload import Budgets, offload, profile
    from mlsyskit.tools.offload.corpus import batch
    from mlsyskit.tools.offload.memory_accounting import MemoryBound, peak_rss, warm_up_runtime
    from mlsyskit.tools.offload.model import build_model
    from mlsyskit.tools.offload.trainer import TrainConfig, run_profile

    torch.set_num_threads(2)
    overhead = warm_up_runtime(lambda: run_profile(TrainConfig(model="gpt-tiny", batch=1, seq=8)))
    model, init = build_model(args.model, args.seed, lazy=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    x0, y0 = batch(0, args.batch, args.seq, args.seed)
    prof = profile(model, lambda m: m(x0.to("meta"), y0.to("meta")), name=args.model, batch=args.batch,
                   seq=args.seq)
    budgets = Budgets(args.device_mem, args.cpu_mem, args.opt_mem, args.nvme_dir)
    losses, step_s = [], []
    device = torch.device(args.device)
    with offload(model, opt, budgets, prof, init=init, device=device) as engine:
        for step in range(args.steps):
            t0 = time.perf_counter()
            x, y = batch(step, args.batch, args.seq, args.seed)
            engine.begin_step()
            loss = model(x.to(device), y.to(device))
            engine.backward(loss)
            losses.append(loss.item())
            step_s.append(time.perf_counter() - t0)
            print(f"library step {step}: loss {losses[-1]:.6f}, {step_s[-1]:.1f} s", file=sys.stderr, flush=True)
        activations = engine.tracker.peak_saved_bytes
    bound = MemoryBound(budgets.device + budgets.cpu + budgets.optimizer, activations, overhead, peak_rss())
    return {"losses": losses, "step_s": step_s, **bound.as_dict()}


def child_reference(args: argparse.Namespace) -> dict:
    import torch

    from mlsyskit.tools.offload.memory_accounting import peak_rss
    from mlsyskit.tools.offload.trainer import TrainConfig, train_plain

    torch.set_num_threads(2)
    cfg = TrainConfig(model=args.model, batch=args.batch, seq=args.seq, steps=args.steps, seed=args.seed, lr=args.lr,
                      device=args.device)
    return {"losses": train_plain(cfg), "peak_rss": peak_rss()}


def run_child(kind: str, args: argparse.Namespace, argv: list[str]) -> dict:
    t0 = time.perf_counter()
    if kind == "cli":
        cmd = [sys.executable, "-c", "from mlsyskit.tools.offload.cli import main; main()", "train",
               "--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
               "--seed", str(args.seed), "--lr", str(args.lr), "--device-mem", str(args.device_mem),
               "--cpu-mem", str(args.cpu_mem), "--opt-mem", str(args.opt_mem), "--nvme-dir", str(args.nvme_dir),
               "--json"]
    else:
        cmd = [sys.executable, __file__, *argv, CHILD, kind]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env,
                          preexec_fn=None if kind == "reference" else cap_limit(args.cap))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"ok": False, "exit_code": proc.returncode, "wall_s": wall}
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    if kind == "cli":
        s = out["summary"]
        out = {"losses": out["losses"], **{k: s[k] for k in ("peak_rss", "budgets", "activations",
                                                             "runtime_overhead_rss", "rss_bound",
                                                             "peak_rss_over_bound", "step_s")}}
    return {"ok": True, "wall_s": wall, **out}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if CHILD in argv:
        i = argv.index(CHILD)
        kind, rest = argv[i + 1], argv[:i]
        args = parse_args(rest)
        result = child_library(args) if kind == "library" else child_reference(args)
        print(json.dumps(result))
        return 0
    args = parse_args(argv)
    p = plan(args)
    if args.dry_run:
        print(json.dumps(p, indent=1))
        return 0
    if p["disk_free"] < p["disk_needed"]:
        print(f"error: {args.nvme_dir} has {p['disk_free'] >> 20} MiB free, the run needs {p['disk_needed'] >> 20} MiB",
              file=sys.stderr)
        return 2
    if p["ratio"] < args.min_ratio:
        print(f"error: (fp32 parameters + states) / cap is {p['ratio']:.2f}, below --min-ratio {args.min_ratio}",
              file=sys.stderr)
        return 2
    results = {}
    for kind in args.runs:
        print(f"{kind} ...", file=sys.stderr, flush=True)
        results[kind] = run_child(kind, args, argv)
        results[kind]["load_avg"] = os.getloadavg()
        print(f"{kind}: {json.dumps(results[kind])}", file=sys.stderr, flush=True)
    ref = results.get("reference", {}).get("losses")
    checks = {}
    for kind in ("cli", "library"):
        r = results.get(kind)
        if r is None:
            continue
        checks[kind] = {"ran": r["ok"], "within_cap": r.get("peak_rss", 1 << 62) <= args.cap,
                        "losses_equal_reference": ref is not None and r.get("losses") == ref}
    report = {"plan": p, "results": results, "checks": checks, "load_avg": os.getloadavg()}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if all(all(c.values()) for c in checks.values()) and all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
