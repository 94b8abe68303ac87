#!/usr/bin/env python3
"""tencache benchmark: one >= 300M-parameter model, all policies in one run (same seed, same budgets,
steps interleaved between the policies), plus the NVMe tier's bandwidth against fio (or dd with
O_DIRECT) on the same filesystem.

    .venv/bin/python scripts/bench_offload.py                      # defaults below, ~5-8 min on 2 cores
    .venv/bin/python scripts/bench_offload.py --model gpt-10m --steps 3 --device-mem 8MiB ...   # quick look

Writes JSON to --out (default runs/bench_offload.json) and prints a table. Every target is a measured
ratio or rate from this run; without a GPU the device tier is the emulated device (host memory with a
budget) and the JSON says so.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from mlsyskit.core.config import format_size, parse_size
from mlsyskit.core.console import emit_table, err, make_table
from mlsyskit.tools.offload.filetier import FileTier
from mlsyskit.tools.offload.memory import aligned_empty
from mlsyskit.tools.offload.model import preset
from mlsyskit.tools.offload.trainer import (
    TrainConfig,
    build_engine,
    one_step,
    peak_rss,
    run_profile,
    summarize,
)

POLICIES = ("tencache", "on-demand", "lru")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-350m")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="steps per policy; the first is warm-up")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--device-mem", default="160MiB")
    p.add_argument("--cpu-mem", default="256MiB")
    p.add_argument("--opt-mem", default="3GiB")
    p.add_argument("--nvme-dir", type=Path, default=Path("runs/bench-nvme"))
    p.add_argument("--disk-bytes", default="1GiB", help="bytes per direction for the bandwidth comparison")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--device", default=None, help="cuda or cpu (emulated device); default: cuda if present")
    p.add_argument("--out", type=Path, default=Path("runs/bench_offload.json"))
    p.add_argument("--peer", choices=("deepspeed",), default=None,
                   help="also run scripts/bench_offload_deepspeed.py (DeepSpeed ZeRO-3 NVMe and CPU offload, each "
                        "with a tencache run of the same placement, in their own processes) with this model, batch, "
                        "seq and steps, and put every run in one table")
    p.add_argument("--peer-json", type=Path, default=None,
                   help="with --peer: the JSON of an earlier bench_offload_deepspeed.py run instead of a new run")
    return p.parse_args()


# -- disk bandwidth: our file tier against fio / dd on the same directory --------------------------------
def tier_bandwidth(directory: Path, total: int, block: int = 8 << 20, workers: int = 4) -> dict[str, float]:
    """Write then read `total` bytes as 8 MiB blocks through FileTier's thread pool (as tencache does).
    The blocks exist beforehand (tencache overwrites its blocks in place; fio preallocates its files)."""
    directory.mkdir(parents=True, exist_ok=True)
    n = max(1, total // block)
    bufs = [aligned_empty(block) for _ in range(workers * 2)]
    for b in bufs:
        b.random_(0, 255)
    with FileTier(directory, workers=workers) as tier:
        for fut in [tier.submit_write(f"bw{i}", bufs[i % len(bufs)]) for i in range(n)]:
            fut.result()
        t0 = time.perf_counter()
        for fut in [tier.submit_write(f"bw{i}", bufs[i % len(bufs)]) for i in range(n)]:
            fut.result()
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for fut in [tier.submit_read(f"bw{i}", bufs[i % len(bufs)]) for i in range(n)]:
            fut.result()
        read_s = time.perf_counter() - t0
        direct = tier.direct
        for i in range(n):
            tier.delete(f"bw{i}")
    return {"write_Bps": n * block / write_s, "read_Bps": n * block / read_s, "o_direct": direct,
            "block_bytes": block, "workers": workers}


def disk_comparison(directory: Path, total: int, rounds: int = 3) -> dict:
    """Our tier and the peer (fio, else dd) alternately, `rounds` times; the median of each is compared,
    so a burst of other I/O on a shared machine does not decide the ratio."""
    tier_runs, peer_runs = [], []
    for _ in range(rounds):
        tier_runs.append(tier_bandwidth(directory, total))
        peer_runs.append(fio_bandwidth(directory, total) or dd_bandwidth(directory, total))
    med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    tier = {**tier_runs[0], "write_Bps": med(tier_runs, "write_Bps"), "read_Bps": med(tier_runs, "read_Bps")}
    peer = {**peer_runs[0], "write_Bps": med(peer_runs, "write_Bps"), "read_Bps": med(peer_runs, "read_Bps")}
    return {"tier": tier, "peer": peer, "rounds": rounds, "tier_runs": tier_runs, "peer_runs": peer_runs}


def fio_bandwidth(directory: Path, total: int, block: int = 8 << 20, jobs: int = 4) -> dict[str, float] | None:
    if shutil.which("fio") is None:
        return None
    out = {}
    size = max(block, total // jobs)
    for rw in ("write", "read"):
        cmd = ["fio", f"--name=tencache-{rw}", f"--directory={directory}", f"--rw={rw}", f"--bs={block}",
               f"--size={size}", "--direct=1", "--ioengine=psync", f"--numjobs={jobs}", "--group_reporting",
               "--output-format=json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"fio failed: {r.stderr[-500:]}")
        job = json.loads(r.stdout)["jobs"][0]
        out[f"{rw}_Bps"] = float(job[rw]["bw_bytes"])
    for f in directory.glob("tencache-*"):
        f.unlink()
    out.update({"tool": "fio", "block_bytes": block, "jobs": jobs, "ioengine": "psync", "direct": True})
    return out


def dd_bandwidth(directory: Path, total: int) -> dict[str, float]:
    path = directory / "dd.dat"
    count = max(1, total // (8 << 20))
    res = {}
    for rw, args in (("write", ["if=/dev/zero", f"of={path}", "oflag=direct"]),
                     ("read", [f"if={path}", "of=/dev/null", "iflag=direct"])):
        t0 = time.perf_counter()
        subprocess.run(["dd", *args, "bs=8M", f"count={count}"], check=True, capture_output=True)
        res[f"{rw}_Bps"] = count * (8 << 20) / (time.perf_counter() - t0)
    path.unlink()
    res.update({"tool": "dd", "block_bytes": 8 << 20, "direct": True})
    return res


# -- the DeepSpeed peer ---------------------------------------------------------------------------------------
def run_peer(args: argparse.Namespace) -> dict:
    """The DeepSpeed side-by-side benchmark's JSON: loaded from --peer-json, or run now with this model."""
    if args.peer_json is not None:
        return json.loads(args.peer_json.read_text())
    out = args.out.with_name(args.out.stem + "_deepspeed.json")
    cmd = [sys.executable, str(Path(__file__).with_name("bench_offload_deepspeed.py")), "--model", args.model,
           "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps), "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def side_by_side(result: dict, peer: dict) -> None:
    """One table: this run's policies (one process, engines interleaved) and the peer's runs (a process each)."""
    rows = [(f"{p} (this run, in-process)", r["summary"]["step_s_median"], r["summary"]["cpu_s_median"], "-",
             r["losses"][-1]) for p, r in result["policies"].items()]
    rows += [(f"{c} ({peer['batch']}x{peer['seq']}, own process)", r["summary"]["step_s_median"],
              r["summary"]["cpu_s_median"], format_size(r["summary"]["peak_rss"]), r["summary"]["final_loss"])
             for c, r in peer["peers"].items()]
    rows += [(c, "-", "-", "-", f"not run: {why}") for c, why in peer.get("skipped", {}).items()]
    emit_table(make_table(f"{args_model(result)} with DeepSpeed {peer['deepspeed']} ZeRO-3 offload side by side",
                          ["run", "median step s", "CPU s/step", "peak RSS", "final loss"], rows))
    if peer.get("targets"):
        emit_table(make_table("DeepSpeed targets (measured in the peer run)", ["target", "value", "goal", "met"],
                              [(t["target"], t["value"], t["goal"], "yes" if t["met"] else "NO")
                               for t in peer["targets"]]))


def args_model(result: dict) -> str:
    return f"{result['model']} batch {result['batch']} x seq {result['seq']}"


# -- training runs ------------------------------------------------------------------------------------------
def run_interleaved(policies: list[str], args: argparse.Namespace, profile) -> dict:
    """All policies' engines live at once and take steps in turn (the order rotates every step), so a burst
    of load from other processes on a shared machine hits every policy alike instead of one of them."""
    cfgs, engines, records = {}, {}, {p: [] for p in policies}
    try:
        for p in policies:
            nvme = args.nvme_dir / p
            shutil.rmtree(nvme, ignore_errors=True)
            nvme.mkdir(parents=True)
            cfgs[p] = TrainConfig(model=args.model, batch=args.batch, seq=args.seq, steps=args.steps, lr=args.lr,
                                  policy=p, device_mem=args.device_mem, cpu_mem=args.cpu_mem, opt_mem=args.opt_mem,
                                  nvme_dir=nvme, warmup_steps=1, device=args.device)
            engines[p] = build_engine(cfgs[p], profile if p == "tencache" else None)
            gc.collect()
        for step in range(args.steps):
            order = policies[step % len(policies):] + policies[:step % len(policies)]
            for p in order:
                r = one_step(engines[p], cfgs[p], step)
                records[p].append(r)
                err.print(f"  step {step} {p}: {r['step_s']:.2f} s (CPU {r['cpu_s']:.2f} s), loss {r['loss']:.4f}, "
                          f"hit {r['device_hit_rate']:.3f}, wait {r['fetch_wait_s']:.3f} s")
        return {p: {"summary": summarize(records[p], cfgs[p], engines[p]), "losses": [r["loss"] for r in records[p]],
                    "steps": records[p]} for p in policies}
    finally:
        for p, engine in engines.items():
            engine.close()
            shutil.rmtree(args.nvme_dir / p, ignore_errors=True)


def targets(runs: dict, disk: dict) -> list[dict]:
    t = []

    def add(name, value, goal, met, note=""):
        t.append({"target": name, "value": value, "goal": goal, "met": bool(met), "note": note})

    # every policy gets the same optimizer-state read-ahead; the fetch wait counts parameter waits only
    # (look-ahead bookkeeping included), the optimizer-state wait is its own column
    tc = runs.get("tencache", {}).get("summary")
    od = runs.get("on-demand", {}).get("summary")
    lru = runs.get("lru", {}).get("summary")
    if tc:  # the configuration the issue asks for, checked rather than assumed
        occ = tc["occupancy"]
        tiers = all(occ["bytes"][k] > 0 for k in ("device", "cpu", "nvme")) and occ["optimizer_nvme_tensors"] > 0
        add("parameters on all three tiers, optimizer states spill to NVMe", tiers, "yes", tiers,
            f"{occ['optimizer_nvme_tensors']} tensors' optimizer states on NVMe")
        add("tencache device hit rate", tc["device_hit_rate"], ">= 0.95", tc["device_hit_rate"] >= 0.95)
        add("tencache allocations per step (steady state)", tc["allocations_per_step"], "== 0",
            tc["allocations_per_step"] == 0)
        add("tencache optimizer-state miss rate", tc["optimizer_miss_rate"], "<= 0.01", tc["optimizer_miss_rate"] <= 0.01)
    if tc and od:
        ratio = od["fetch_wait_s"] / max(tc["fetch_wait_s"], 1e-9)
        add("fetch wait: on-demand / tencache", ratio, ">= 10", ratio >= 10)
        ratio = od["step_s_median"] / tc["step_s_median"]
        add("step time (median): on-demand / tencache", ratio, ">= 1.3", ratio >= 1.3)
    if tc and lru:
        ratio = lru["step_s_median"] / tc["step_s_median"]
        add("step time (median): lru / tencache", ratio, "> 1.0", ratio > 1.0)
    peer = disk.get("peer")
    if peer:
        for rw in ("read", "write"):
            ratio = disk["tier"][f"{rw}_Bps"] / peer[f"{rw}_Bps"]
            add(f"NVMe tier {rw} bandwidth / {peer['tool']}", ratio, ">= 0.8", ratio >= 0.8)
    losses = [r["losses"] for r in runs.values()]
    add("same per-step losses for every policy", all(x == losses[0] for x in losses), "identical",
        all(x == losses[0] for x in losses))
    return t


def main() -> int:
    args = parse_args()
    for name in ("device_mem", "cpu_mem", "opt_mem", "disk_bytes"):
        setattr(args, name, parse_size(getattr(args, name)))
    policies = [p for p in args.policies.split(",") if p]
    args.nvme_dir.mkdir(parents=True, exist_ok=True)
    cfg = preset(args.model)
    t_start = time.perf_counter()
    err.print(f"[bold]tencache bench[/]: {args.model} ({cfg.n_params / 1e6:.0f}M parameters), batch {args.batch} x "
              f"seq {args.seq}, budgets device {format_size(args.device_mem)} / CPU {format_size(args.cpu_mem)} / "
              f"optimizer {format_size(args.opt_mem)}, NVMe {args.nvme_dir}")
    disk_dir = args.nvme_dir / "bandwidth"
    disk_dir.mkdir(parents=True, exist_ok=True)
    disk = disk_comparison(disk_dir, args.disk_bytes)
    err.print(f"disk: tier write {format_size(disk['tier']['write_Bps'])}/s read {format_size(disk['tier']['read_Bps'])}/s; "
              f"{disk['peer']['tool']} write {format_size(disk['peer']['write_Bps'])}/s read "
              f"{format_size(disk['peer']['read_Bps'])}/s")
    t0 = time.perf_counter()
    profile = run_profile(TrainConfig(model=args.model, batch=args.batch, seq=args.seq, lr=args.lr)) \
        if "tencache" in policies else None
    profile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    runs = run_interleaved(policies, args, profile)
    train_s = time.perf_counter() - t0
    result = {
        "bench": "offload", "model": args.model, "parameters": cfg.n_params, "batch": args.batch, "seq": args.seq,
        "steps_per_policy": args.steps, "measured_steps": args.steps - 1, "lr": args.lr,
        "budgets": {"device": args.device_mem, "cpu": args.cpu_mem, "optimizer": args.opt_mem},
        "device": next(iter(runs.values()))["summary"]["device"] if runs else None,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "python": sys.version.split()[0]},
        "profile_s": profile_s, "train_s": train_s, "interleaved": True, "disk": disk,
        "policies": {p: {"summary": r["summary"], "losses": r["losses"],
                         "steps": [{k: v for k, v in s.items() if k != "occupancy"} for s in r["steps"]]}
                     for p, r in runs.items()},
    }
    result["targets"] = targets(runs, disk)
    if "tencache" in runs:  # process CPU seconds per step: less sensitive to other load on a shared machine
        base = runs["tencache"]["summary"]["cpu_s_median"]
        result["cpu_time_ratios_vs_tencache"] = {p: r["summary"]["cpu_s_median"] / base for p, r in runs.items()}
    result["all_targets_met"] = all(t["met"] for t in result["targets"])
    result["peak_rss"] = peak_rss()  # one process holds every policy's engine: budgets x policies
    result["budgets_all_policies"] = len(runs) * (args.device_mem + args.cpu_mem + args.opt_mem)
    result["total_s"] = time.perf_counter() - t_start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    rows = [(p, r["summary"]["step_s_median"], r["summary"]["cpu_s_median"], r["summary"]["load_avg_1m"],
             r["summary"]["tokens_per_s"], r["summary"]["device_hit_rate"],
             r["summary"]["fetch_wait_s"], r["summary"]["fetch_wait_p99_s"], r["summary"]["allocations_per_step"],
             r["summary"]["optimizer_miss_rate"], r["summary"]["optimizer_wait_s"]) for p, r in runs.items()]
    emit_table(make_table(f"tencache bench: {args.model}, {result['device']}, {args.steps - 1} measured steps; "
                          f"peak RSS of the process (all engines) {format_size(result['peak_rss'])}",
                          ["policy", "median step s", "CPU s", "load", "tokens/s", "hit rate", "param fetch wait s",
                           "wait p99 s", "allocs/step", "opt miss", "opt-state wait s"], rows))
    emit_table(make_table("targets (measured in this run)", ["target", "value", "goal", "met"],
                          [(t["target"], t["value"], t["goal"], "yes" if t["met"] else "NO") for t in result["targets"]]))
    if args.peer == "deepspeed":
        result["peer"] = run_peer(args)
        args.out.write_text(json.dumps(result, indent=2, default=str))
        side_by_side(result, result["peer"])
    err.print(f"wrote {args.out} ({result['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
