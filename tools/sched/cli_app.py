"""marble's typer app: simulate policies on workloads, inspect the scalability model, and the
scheduler daemon's commands (daemon/commands.py). cli.py is the entry point: it runs plain client
command lines (status, queue, submit, ...) without building this app (daemon/client_cli.py).

Only what every command needs is imported here; each command imports its own machinery (the
simulator, the policies, the model) when it runs (`python -X importtime -m mlsyskit.tools.sched.cli
sim --help` shows what loads).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from mlsyskit.core.cli import (
    config_option,
    ensure_out_dir,
    json_option,
    make_app,
    out_option,
    quiet_option,
    run_app,
    seed_option,
    verbose_option,
)
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.sched.daemon.commands import register as register_daemon_commands

app = make_app(
    "marble",
    "Multi-GPU-aware DL job scheduler (after MARBLE, CCGrid'20): gives each job the GPUs per node where "
    "its training is still efficient, packs jobs onto shared nodes and keeps FIFO fairness; includes a "
    "trace-driven cluster simulator.",
)

# (column, JSON key); times shown in hours. "eff" = effective (throughput-weighted) utilisation.
# Short headers (explained in the title) so 10 columns fit 80 characters.
SUMMARY_COLUMNS = [("policy", "policy"), ("JCT", "avg_jct_s"), ("p50", "median_jct_s"),
                   ("p99", "p99_jct_s"), ("span", "makespan_s"), ("wait", "avg_queue_delay_s"),
                   ("util", "alloc_util"), ("eff", "effective_util"), ("pre", "preemptions"),
                   ("rsz", "resizes")]


def _cell(key: str, value) -> str:
    """Compact cells so the table fits 80 columns: hours and ratios with 2 decimals, counts whole."""
    if key.endswith("_s"):
        return f"{value / 3600.0:.2f}"
    if key.endswith("_util"):
        return f"{value:.2f}"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _model():
    from mlsyskit.tools.sched.throughput import ThroughputModel

    try:
        return ThroughputModel()
    except FileNotFoundError as e:  # a broken install, not a bad flag
        raise RuntimeFailure(str(e)) from None


@app.command()
def sim(
    workload: str | None = typer.Option(None, "--workload", "-w", help="workload-1..4, a Pollux/Philly CSV path, or synthetic:JOBS[@LOAD][/GPUS:WEIGHT,...] (Poisson arrivals at LOAD x cluster capacity, default 0.9; optional job-size mix)"),
    cluster: str | None = typer.Option(None, help="NODESxGPUS_PER_NODE (default 16x6), or nodes of mixed sizes: 8x4+4x8"),
    policies: str | None = typer.Option(None, help="comma-separated policies (`marble policies` lists them; default "
                                        "fifo,backfill,optimus,tiresias and the default policy)"),
    seeds: int | None = typer.Option(None, help="how many seeds (seed, seed+1, ...; default 1)"),
    seed: int | None = seed_option(None, "first seed (default 0); every random choice derives from it"),
    restart_cost: float | None = typer.Option(None, help="checkpoint-restart cost in seconds (default 30)"),
    model_error: float | None = typer.Option(None, help="mean relative error of the fitted throughput model the policies start from (default 0.1 = 10%, a realistic fit; they then correct it online from measured throughput); the simulator keeps the true one"),
    efficiency_threshold: float | None = typer.Option(None, "--efficiency-threshold", help="marble-fifo and marble-las: least gain per added GPU, in single-GPU throughputs (default 0.5; the default policy sizes by goodput and reads neither threshold)"),
    pressure_threshold: float | None = typer.Option(None, help="marble-fifo: the same while waiting jobs want more GPUs than are free (default 0.8)"),
    out: Path | None = out_option("results.json, timing.json, jct_cdf.png, utilisation.png, events-POLICY-seedN.jsonl"),
    events: bool | None = typer.Option(None, "--events/--no-events", help="also write a JSONL event log per run under --out"),
    config: Path | None = config_option(),
    as_json: bool = json_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option(),
) -> None:
    """Replay a workload under several policies and seeds; tables (or --json) on stdout."""
    from rich import box

    from mlsyskit.core.console import emit_json, emit_table, make_table, reporter, set_verbosity
    from mlsyskit.tools.sched.cluster import ClusterSpec
    from mlsyskit.tools.sched.experiment import WorkloadSource, parse_policies, report, run_one
    from mlsyskit.tools.sched.policies import DEFAULT_POLICY, PolicyOptions
    from mlsyskit.tools.sched.policies.option_readers import unread_options
    from mlsyskit.tools.sched.sim_settings import sim_settings
    from mlsyskit.tools.sched.simulator import PolicyError
    from mlsyskit.tools.sched.workloads import WorkloadError

    set_verbosity(verbose, quiet)
    cfg = sim_settings(config, {"workload": workload, "cluster": cluster, "policies": policies, "seeds": seeds,
                                 "seed": seed, "restart_cost": restart_cost, "model_error": model_error,
                                 "efficiency_threshold": efficiency_threshold,
                                 "pressure_threshold": pressure_threshold, "events": events})
    try:
        spec = ClusterSpec.parse(cfg.cluster)
    except ValueError as e:
        raise UsageError(str(e)) from None
    options = PolicyOptions(efficiency_threshold=cfg.efficiency_threshold, pressure_threshold=cfg.pressure_threshold)
    names = parse_policies(cfg.policies or ",".join(dict.fromkeys(["fifo", "backfill", "optimus", "tiresias",
                                                                    DEFAULT_POLICY])))   # unknown/repeated: exit 2
    unread = unread_options(names, options)
    if unread:
        raise UsageError("; ".join(unread))
    if not math.isfinite(cfg.restart_cost):
        raise UsageError(f"--restart-cost must be a finite number of seconds, got {cfg.restart_cost}")
    if cfg.events and out is None:
        raise UsageError("--events needs --out")
    source = WorkloadSource(cfg.workload)
    model = _model()
    runs: list = []
    if out is not None:
        ensure_out_dir(out)
    with reporter() as rep:
        for s in range(cfg.seed, cfg.seed + cfg.seeds):
            rep.phase(f"loading {source.label}, seed {s}")
            try:
                jobs = source.load(model, s, spec)
            except (WorkloadError, ValueError) as e:
                raise UsageError(str(e)) from None
            for name in names:
                rep.start(f"{name} seed {s}: replayed", total=len(jobs), unit="jobs")
                events_path = out / f"events-{name}-seed{s}.jsonl" if cfg.events and out else None
                try:
                    run = run_one(source, spec, name, s, model, options, cfg.restart_cost, events_path,
                                  on_finish=lambda n: rep.update(completed=n) if n % 50 == 0 else None,
                                  jobs=jobs, model_error=cfg.model_error)
                except ValueError as e:
                    raise UsageError(f"{name}, seed {s}: {e}") from None
                except PolicyError as e:  # a policy bug: the request was fine
                    raise RuntimeFailure(f"{name}, seed {s}: {e}") from None
                rep.update(completed=len(jobs))
                runs.append(run)
    doc = report(runs, source, spec, options, cfg.restart_cost, cfg.model_error)
    if out is not None:
        _write_outputs(out, doc, runs, spec)
    if as_json:
        emit_json(doc)
        return
    rows = [[name] + [_cell(k, doc["policies"][name]["mean"][k]) for _, k in SUMMARY_COLUMNS[1:]] for name in names]
    table = make_table(f"marble sim: {source.label} on {spec}, mean of {cfg.seeds} seed(s)\n"
                       "JCT/p50/p99/span/wait in hours; util/eff = allocated/effective GPU utilisation; "
                       "pre/rsz = preemptions/resizes",
                       [c for c, _ in SUMMARY_COLUMNS], rows)
    table.columns[0].no_wrap = True  # policy names stay whole on narrow terminals
    table.box = box.SIMPLE_HEAD
    table.pad_edge = False
    emit_table(table)


def _write_outputs(out: Path, doc: dict, runs: list, spec) -> None:
    from mlsyskit.core.console import log
    from mlsyskit.tools.sched import plots
    from mlsyskit.tools.sched.metrics import downsample, jcts

    (out / "results.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    timing = {f"{r.policy}/seed{r.seed}": r.timing for r in runs}
    (out / "timing.json").write_text(json.dumps(timing, indent=2, sort_keys=True) + "\n")
    first = min(r.seed for r in runs)
    chosen = [r for r in runs if r.seed == first]
    title = f"{doc['workload']} on {spec}, seed {first}"
    plots.jct_cdf({r.policy: jcts(r.result) for r in chosen}, out / "jct_cdf.png", title)
    plots.utilisation({r.policy: downsample(r.result.timeline) for r in chosen}, spec.total_gpus,
                      out / "utilisation.png", title)
    log(f"wrote {out / 'results.json'}, timing.json, jct_cdf.png, utilisation.png")


@app.command()
def model(
    holdout: float = typer.Option(0.2, min=0.05, max=0.9, help="share of measured placements held out"),
    seed: int = typer.Option(0, help="seed of the held-out split"),
    as_json: bool = json_option(),
) -> None:
    """The fitted scalability model per application and its error on held-out placements."""
    from rich import box

    from mlsyskit.core.console import emit_json, emit_table, make_table
    from mlsyskit.tools.sched.scaling_model import held_out_error

    tm = _model()
    rows = []
    for name, profile in tm.profiles.items():
        err = held_out_error(profile, holdout, seed)
        rows.append({**err, **{k: round(v, 6) for k, v in vars(tm.fits[name]).items()}})
    if as_json:
        emit_json(rows)
        return
    table = make_table(f"fitted model, error on {holdout:.0%} held-out placements (coefficients: --json)",
                       ["app", "held-out rows", "mean abs % error", "p90 abs % error"],
                       [[r["app"], r["test_rows"], f"{100 * r['mape']:.1f}%", f"{100 * r['p90_ape']:.1f}%"]
                        for r in rows])
    table.columns[0].no_wrap = True
    table.box, table.pad_edge = box.SIMPLE_HEAD, False
    emit_table(table)


@app.command()
def curve(
    app_name: str = typer.Option(..., "--app", help="bert, cifar10, deepspeech2, imagenet, ncf or yolov3"),
    batch: int = typer.Option(..., min=1, help="global batch size"),
    max_gpus: int = typer.Option(12, min=1, max=512, help="largest GPU count to show"),
    gpus_per_node: int = typer.Option(6, min=1, max=64),
    efficiency_threshold: float = typer.Option(0.5, "--efficiency-threshold", help="marble's least gain per added GPU"),
    pressure_threshold: float = typer.Option(0.8, help="the same under queue pressure"),
    as_json: bool = json_option(),
) -> None:
    """Efficiency curve E(p) = T(p) / (p T(1)) of one application and marble's GPU count for it.

    The job is taken to ask for --max-gpus GPUs; marble's size is shown for a quiet cluster
    (--efficiency-threshold) and under queue pressure (--pressure-threshold)."""
    from mlsyskit.core.console import emit_json, emit_table, make_table
    from mlsyskit.tools.sched.policies import PolicyOptions
    from mlsyskit.tools.sched.policies.sizing import sized_shapes

    threshold = efficiency_threshold
    PolicyOptions(efficiency_threshold=threshold, pressure_threshold=pressure_threshold)  # ConfigError: exit 2
    tm = _model()
    try:
        tm.check_app(app_name)
    except KeyError as e:
        raise UsageError(str(e.args[0])) from None
    rows = tm.efficiency_curve(app_name, batch, max_gpus, gpus_per_node)
    size = sized_shapes(tm, app_name, batch, max_gpus, gpus_per_node, threshold)[-1]
    busy = sized_shapes(tm, app_name, batch, max_gpus, gpus_per_node, max(threshold, pressure_threshold))[-1]
    doc = {"app": app_name, "batch": batch, "curve": rows, "marble_shape": list(size), "marble_gpus": sum(size),
           "marble_shape_under_pressure": list(busy), "marble_gpus_under_pressure": sum(busy)}
    if as_json:
        emit_json(doc)
        return
    emit_table(make_table(f"{app_name}, global batch {batch}: marble picks {sum(size)} GPUs as "
                          f"{''.join(map(str, size))} ({sum(busy)} as {''.join(map(str, busy))} under queue pressure); "
                          "extrapolated = shape never measured (model, kept monotone)",
                          ["GPUs", "shape", "samples/s", "efficiency", "source"],
                          [[r["gpus"], r["shape"], r["throughput"], r["efficiency"],
                            "measured" if r["measured"] else "extrapolated"] for r in rows]))


@app.command("policies")
def list_policies(as_json: bool = json_option()) -> None:
    """The registered scheduling policies (names for sim --policies and serve --policy)."""
    from mlsyskit.core.console import emit_json, emit_table, make_table
    from mlsyskit.tools.sched.policies import DEFAULT_POLICY, POLICIES

    described = {name: POLICIES[name].description for name in sorted(POLICIES)}
    if as_json:
        emit_json(described)
        return
    table = make_table(f"policies (default for sim and serve: {DEFAULT_POLICY})", ["name", "what it does"],
                       described.items())
    table.columns[1].justify = "left"
    emit_table(table)


register_daemon_commands(app)


def main() -> None:
    run_app(app)
