#!/usr/bin/env python3
"""tencache against DeepSpeed ZeRO-3 offload, side by side: the same model (a tencache GPT preset), seed,
batches, sequence length and thread count, every run in its own process, interleaved in rounds.

    .venv/bin/python scripts/bench_offload_deepspeed.py                  # defaults below
    .venv/bin/python scripts/bench_offload_deepspeed.py --dry-run        # the plan, without running anything

Two placements, each a pair with the same placement and the same total memory:
  nvme: ZeRO-3 with parameters and optimizer state offloaded to NVMe (DeepSpeed's async_io op, libaio)
        against tencache with an --nvme-dir;
  cpu:  ZeRO-3 offloading both to the CPU against tencache without NVMe whose device budget is a quarter
        of the bf16 parameters (parameters really move between the CPU and the device).
DeepSpeed runs with its recommended ZeRO-Infinity settings (worker.ds_config: prefetch bucket, persistence
threshold, overlap_comm, contiguous gradients, sub-groups with pipelined optimizer swapping) and, for NVMe,
the aio settings of a reduced ds_nvme_tune sweep on the --nvme-dir (cached in the venv). Equal memory: each
DeepSpeed run measures its training memory (largest RSS sampled during the steps minus the RSS before the
model existed); tencache's device + CPU + optimizer budgets of that placement add up to the first
DeepSpeed run's measurement (the order puts DeepSpeed first in round 0). DeepSpeed runs in its own venv
(--venv, created on first use: torch first, then the pinned DeepSpeed; its JIT-compiled ops are cached in
the venv), with DS_ACCELERATOR=cpu and a one-rank gloo group, since this machine has no GPU. Each round
runs the four configurations once, the order rotating between rounds; the first step of every run is
warm-up. Peak RSS is each process's own (wait4). A part that cannot run here is reported in one line with
the reason, and the rest still runs.

Writes JSON to --out (default runs/bench_offload_deepspeed.json; the same summary fields as
bench_offload.py: step_s_median, cpu_s_median, peak_rss, losses) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "scripts" / "bench_offload_ds" / "worker.py"
DEEPSPEED_VERSION = "0.19.8"
TORCH_VERSION = "2.13.0"
CONFIGS = ("deepspeed-nvme", "tencache-nvme", "deepspeed-cpu", "tencache-cpu")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-50m")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=6, help="steps per run; the first is warm-up")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads of every run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--nvme-budgets", default=None,
                   help="tencache device,cpu,optimizer budgets for the NVMe placement (default: DeepSpeed's measured "
                        "training memory, split by equal_budgets)")
    p.add_argument("--cpu-budgets", default=None,
                   help="tencache device,cpu,optimizer budgets for the CPU placement (default: as for NVMe)")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--nvme-dir", type=Path, default=REPO / "runs" / "bench-ds-nvme")
    p.add_argument("--venv", type=Path, default=REPO / ".bench-venvs" / "deepspeed")
    p.add_argument("--deepspeed-version", default=DEEPSPEED_VERSION)
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run (the first DeepSpeed run "
                   "compiles its ops: ~15 min on a loaded 2-core machine)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench_offload_deepspeed.json")
    args = p.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configs {unknown}; choose from {', '.join(CONFIGS)}")
    if args.steps < 2 or args.rounds < 1 or args.threads < 1:
        p.error("--steps must be >= 2 (the first is warm-up), --rounds and --threads >= 1")
    return args


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the DeepSpeed side: its venv, libaio, its ops ------------------------------------------------------
def ensure_venv(venv: Path, version: str) -> Path:
    """The DeepSpeed venv (torch first, the CPU build this project uses, then the pinned DeepSpeed); it
    also sees mlsyskit's venv (a .pth line) for the model and the corpus."""
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating {venv}: torch=={TORCH_VERSION} (CPU), deepspeed=={version} (one time)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        if subprocess.run([*pip, f"torch=={TORCH_VERSION}"]).returncode != 0:
            subprocess.run([*pip, f"torch=={TORCH_VERSION}", "--index-url", "https://download.pytorch.org/whl/cpu"],
                           check=True)
    installed = subprocess.run([str(python), "-c", "import deepspeed; print(deepspeed.__version__)"],
                               capture_output=True, text=True, env=ds_env(venv, 1))
    if installed.stdout.strip() != version:
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"deepspeed=={version}"], check=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "mlsyskit-host.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return python


def ds_env(venv: Path, threads: int) -> dict[str, str]:
    return {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(venv / "torch_extensions"),
            "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}


def libaio_missing() -> str | None:
    """Why DeepSpeed's NVMe offload cannot run here, or None. Installs Debian libaio-dev when root."""
    if Path("/usr/include/libaio.h").exists():
        return None
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("installing Debian libaio-dev for DeepSpeed's async_io op")
        subprocess.run(["apt-get", "install", "-y", "-q", "libaio-dev"], capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if Path("/usr/include/libaio.h").exists():
            return None
    return "DeepSpeed's NVMe offload needs its async_io op, which needs Debian libaio-dev (apt-get install libaio-dev)"


# -- runs ---------------------------------------------------------------------------------------------------
def equal_budgets(n_params: int, total: int, placement: str) -> tuple[int, int, int]:
    """tencache's device, CPU and optimizer budgets adding up to `total` bytes (DeepSpeed's measured memory).
    The device gets a quarter of the bf16 parameters (2 bytes each), so parameters really move; the CPU
    parameter cache the rest of them (NVMe: in proportion 2:16 with the optimizer, at most all of them; CPU
    placement: all of them plus a quarter to swap through); the optimizer-state cache (16 bytes per
    parameter: fp32 master, m, v, gradient) what remains."""
    params = 2 * n_params
    device = params // 4
    if placement == "nvme":
        cpu = min(params - device, (total - device) * 2 // 18)
    else:
        cpu = params + params // 4
    optimizer = total - device - cpu
    if optimizer <= 0:
        raise ValueError(f"{total} bytes cannot hold the {placement} budgets (device {device}, cpu {cpu})")
    if optimizer > 16 * n_params * 11 // 10:  # more than every state needs: the spare goes to the CPU cache
        spare = optimizer - 16 * n_params * 11 // 10
        cpu, optimizer = cpu + spare, optimizer - spare
    return device, cpu, optimizer


def budgets(args: argparse.Namespace, placement: str, measured: dict[str, int] | None = None) -> list[str]:
    spec = args.nvme_budgets if placement == "nvme" else args.cpu_budgets
    if spec is None:
        from mlsyskit.tools.offload.model import preset

        n = preset(args.model).n_params
        total = (measured or {}).get(placement)
        if total is None:  # before DeepSpeed was measured (--dry-run, or DeepSpeed skipped): 18 bytes/parameter
            total = 18 * n + (64 << 20)
        spec = ",".join(f"{max(1, x >> 20)}MiB" for x in equal_budgets(n, total, placement))
    device, cpu, opt = spec.split(",")
    return ["--device-mem", device, "--cpu-mem", cpu, "--opt-mem", opt]


def command(args: argparse.Namespace, config: str, python: Path | None, out: Path, nvme: Path,
            measured: dict[str, int] | None = None, aio: dict | None = None) -> list[str]:
    system, placement = config.split("-")
    common = ["--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
              "--seed", str(args.seed), "--lr", str(args.lr)]
    if system == "deepspeed":
        extra = ["--aio", json.dumps(aio)] if aio and placement == "nvme" else []
        return [str(python or args.venv / "bin" / "python"), str(WORKER), "--offload", placement, *common,
                "--nvme-dir", str(nvme), *extra, "--out", str(out)]
    where = ["--nvme-dir", str(nvme)] if placement == "nvme" else []
    return [str(Path(sys.executable).with_name("tencache")), "train", *common, *budgets(args, placement, measured),
            *where, "--out", str(out), "-q"]


def tuned_aio(args: argparse.Namespace, python: Path) -> dict | None:
    """The aio section for this disk: a reduced ds_nvme_tune sweep (worker.tune_aio), run once per filesystem
    and cached in the venv."""
    args.nvme_dir.mkdir(parents=True, exist_ok=True)
    cache = args.venv / f"aio-tuned-{os.stat(args.nvme_dir).st_dev}.json"
    if not cache.exists():
        log(f"tuning DeepSpeed's aio settings on {args.nvme_dir} (once; cached in {cache})")
        proc = subprocess.run([str(python), str(WORKER), "--tune-aio", "--nvme-dir", str(args.nvme_dir),
                               "--out", str(cache)], env=ds_env(args.venv, args.threads), capture_output=True,
                              text=True)
        if proc.returncode != 0:
            log(f"aio tuning failed, DeepSpeed's defaults are used: {proc.stderr.strip()[-300:]}")
            return None
    return json.loads(cache.read_text())["aio"]


def run_once(args: argparse.Namespace, config: str, python: Path | None, scratch: Path,
             measured: dict[str, int], aio: dict | None) -> dict:
    """One process: its per-step times and losses, and its own peak RSS from wait4."""
    nvme = args.nvme_dir / config
    shutil.rmtree(nvme, ignore_errors=True)
    nvme.mkdir(parents=True)
    out = scratch / f"{config}.out"
    shutil.rmtree(out, ignore_errors=True)
    cmd = command(args, config, python, out if config.startswith("tencache") else out.with_suffix(".json"), nvme,
                  measured, aio)
    load_before = os.getloadavg()[0]
    env = ds_env(args.venv, args.threads) if config.startswith("deepspeed") else \
        {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    log_path = scratch / f"{config}.log"
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=scratch)
        deadline = time.monotonic() + args.timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)  # polling the child with a deadline (wait4 has no timeout)
    shutil.rmtree(nvme, ignore_errors=True)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = log_path.read_text()[-1500:]
        raise RuntimeError(f"{config} exited {code}: {tail.strip().splitlines()[-1] if tail.strip() else ''}")
    extra: dict = {"load_avg_1m": [load_before, os.getloadavg()[0]], "command": cmd}
    if config.startswith("tencache"):
        steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
        # what tencache really kept on NVMe: with DeepSpeed's memory it may hold everything in its budgets
        steps = [{"step": r["step"], "step_s": r["step_s"], "cpu_s": r["cpu_s"], "loss": r["loss"],
                  "nvme_bytes": r["occupancy"]["bytes"].get("nvme", 0),
                  "optimizer_nvme_tensors": r["occupancy"].get("optimizer_nvme_tensors", 0)}
                 for r in steps if r["kind"] == "step"]
        extra["budgets"] = cmd[cmd.index("--device-mem"):cmd.index("--opt-mem") + 2]
        extra["torch_threads"] = json.loads((out / "summary.json").read_text())["summary"]["torch_threads"]
    else:
        ds = json.loads(out.with_suffix(".json").read_text())
        steps = ds["steps"]
        extra.update(memory_used=ds["training_peak_rss"] - ds["baseline_rss"], config=ds["config"],
                     torch_threads=ds["threads"])  # intra-op threads as each side ran: equal (--threads)
    return {"steps": steps, "losses": [s["loss"] for s in steps], "peak_rss": usage.ru_maxrss * 1024, **extra}


def summarize(runs: list[dict]) -> dict:
    """The same summary fields as bench_offload.py, over every round's measured steps (warm-up dropped)."""
    measured = [s for r in runs for s in r["steps"][1:]]
    return {"step_s_median": statistics.median(s["step_s"] for s in measured),
            "cpu_s_median": statistics.median(s["cpu_s"] for s in measured),
            "peak_rss": max(r["peak_rss"] for r in runs), "measured_steps": len(measured), "rounds": len(runs),
            "final_loss": runs[0]["losses"][-1]}


def targets(peers: dict) -> list[dict]:
    out = []

    def pair(placement: str, goal: float) -> None:
        tc, ds = peers.get(f"tencache-{placement}"), peers.get(f"deepspeed-{placement}")
        if not (tc and ds and "summary" in tc and "summary" in ds):
            return
        ratio = ds["summary"]["step_s_median"] / tc["summary"]["step_s_median"]
        out.append({"target": f"median step: ZeRO-3 {placement} offload / tencache", "value": ratio,
                    "goal": f">= {goal}", "met": ratio >= goal})
        rounds = round_ratios(tc.get("runs", []), ds.get("runs", []))
        if rounds:  # the same ratio within each round (the runs closest in time): robust to load swings
            worst = min(rounds)
            out.append({"target": f"every round's median step ratio ({placement}; lowest of {len(rounds)})",
                        "value": worst, "goal": f">= {goal}", "met": worst >= goal})
        rss = ds["summary"]["peak_rss"] / tc["summary"]["peak_rss"]
        out.append({"target": f"peak RSS: ZeRO-3 {placement} offload / tencache", "value": rss, "goal": "> 1",
                    "met": rss > 1})

    pair("nvme", 1.5)
    pair("cpu", 1.2)
    return out


def round_ratios(tc_runs: list[dict], ds_runs: list[dict]) -> list[float]:
    """Per round: DeepSpeed's median measured step / tencache's (warm-up dropped)."""
    med = lambda run: statistics.median(s["step_s"] for s in run["steps"][1:])  # noqa: E731
    return [med(d) / med(t) for t, d in zip(tc_runs, ds_runs, strict=False)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    skipped: dict[str, str] = {}
    if args.dry_run:
        for config in args.configs:
            print(" ".join(command(args, config, None, Path("OUT"), args.nvme_dir / config)))
        return 0
    measured: dict[str, int] = {}  # placement -> DeepSpeed's training memory (its first run)
    aio = None
    python = None
    if any(c.startswith("deepspeed") for c in args.configs):
        try:
            python = ensure_venv(args.venv, args.deepspeed_version)
        except (subprocess.CalledProcessError, OSError) as e:
            for c in args.configs:
                if c.startswith("deepspeed"):
                    skipped[c] = f"the DeepSpeed venv could not be built ({e})"
        if "deepspeed-nvme" in args.configs and (why := libaio_missing()):
            skipped["deepspeed-nvme"] = why
        if "deepspeed-nvme" in args.configs and "deepspeed-nvme" not in skipped and python is not None:
            aio = tuned_aio(args, python)
    for config, why in skipped.items():
        log(f"skipping {config}: {why}")
    configs = [c for c in args.configs if c not in skipped]
    args.nvme_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-ds-") as tmp:
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)] if configs else []
            for config in order:
                if config in skipped:
                    continue
                t0 = time.perf_counter()
                try:
                    result = run_once(args, config, python, Path(tmp), measured, aio)
                except RuntimeError as e:
                    skipped[config] = str(e)
                    log(f"round {r}: {config} failed, left out of later rounds: {e}")
                    continue
                runs[config].append(result)
                if "memory_used" in result:
                    measured.setdefault(config.split("-")[1], result["memory_used"])
                steps = ", ".join(f"{s['step_s']:.2f}" for s in result["steps"])
                log(f"round {r}: {config} steps [{steps}] s, peak RSS {result['peak_rss'] / 2**30:.2f} GiB, "
                    f"losses {[round(x, 4) for x in result['losses']]} ({time.perf_counter() - t0:.0f} s)")
                write_result(args, runs, skipped, r + 1, time.perf_counter() - t_start, measured, aio)
    result = write_result(args, runs, skipped, args.rounds, time.perf_counter() - t_start, measured, aio)
    print_table(result)
    log(f"wrote {args.out} ({result['total_s']:.0f} s)")
    return 0


def write_result(args: argparse.Namespace, runs: dict[str, list[dict]], skipped: dict[str, str], rounds: int,
                 total_s: float, measured: dict[str, int], aio: dict | None) -> dict:
    """The JSON of the rounds so far (written after every run, so an interrupted benchmark keeps them)."""
    peers = {c: {"summary": summarize(rs), "losses": rs[0]["losses"], "runs": rs} for c, rs in runs.items() if rs}
    result = {"bench": "offload-deepspeed", "model": args.model, "batch": args.batch, "seq": args.seq,
              "steps_per_run": args.steps, "rounds": args.rounds, "rounds_reached": rounds, "threads": args.threads,
              "seed": args.seed, "lr": args.lr, "deepspeed": args.deepspeed_version,
              "device": "cpu (no GPU: emulated device / DeepSpeed CPU accelerator)",
              "deepspeed_memory_used": measured, "deepspeed_aio": aio,
              "tencache_budgets": {p: budgets(args, p, measured) for p in ("nvme", "cpu")},
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                          "load_avg": os.getloadavg()},
              "peers": peers, "skipped": skipped, "targets": targets(peers), "total_s": total_s}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


def print_table(result: dict) -> None:
    from mlsyskit.core.config import format_size
    from mlsyskit.core.console import emit_table, make_table

    def memory(config: str) -> str:
        placement = config.split("-")[1]
        if config.startswith("deepspeed"):
            used = result["deepspeed_memory_used"].get(placement)
            return f"used {format_size(used)}" if used else "-"
        return "budgets " + "+".join(result["tencache_budgets"][placement][1::2])

    rows = [(c, p["summary"]["step_s_median"], p["summary"]["cpu_s_median"], format_size(p["summary"]["peak_rss"]),
             memory(c), " ".join(f"{x:.4f}" for x in p["losses"])) for c, p in result["peers"].items()]
    rows += [(c, "-", "-", "-", "-", f"not run: {why}") for c, why in result["skipped"].items()]
    emit_table(make_table(f"tencache vs DeepSpeed {result['deepspeed']} ZeRO-3: {result['model']}, batch "
                          f"{result['batch']} x seq {result['seq']}, {result['threads']} threads, "
                          f"{result['rounds']} rounds, load {result['machine']['load_avg'][0]:.1f}",
                          ["run", "median step s", "CPU s/step", "peak RSS", "memory", "losses (round 0)"], rows))
    if result["targets"]:
        emit_table(make_table("targets (measured in this run)", ["target", "value", "goal", "met"],
                              [(t["target"], t["value"], t["goal"], "yes" if t["met"] else "NO")
                               for t in result["targets"]]))


if __name__ == "__main__":
    sys.exit(main())
