"""marble command line: simulate policies on workloads, inspect the scalability model."""
from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich import box

from mlsyskit.core.cli import fail, make_app, run_app
from mlsyskit.core.config import ConfigError
from mlsyskit.core.console import emit_json, emit_table, log, make_table, progress
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.daemon.commands import register as register_daemon_commands
from mlsyskit.tools.sched.experiment import Run, WorkloadSource, parse_policies, report, run_one
from mlsyskit.tools.sched.metrics import downsample, jcts
from mlsyskit.tools.sched.policies import POLICIES, PolicyOptions
from mlsyskit.tools.sched.policies.marble import sized_shapes
from mlsyskit.tools.sched.scaling_model import held_out_error
from mlsyskit.tools.sched.simulator import PolicyError
from mlsyskit.tools.sched.throughput import ThroughputModel
from mlsyskit.tools.sched.workloads import WorkloadError

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


def _model() -> ThroughputModel:
    try:
        return ThroughputModel()
    except FileNotFoundError as e:
        raise fail(str(e)) from None


def _parse_policies(text: str) -> list[str]:
    try:
        return parse_policies(text)   # unknown or repeated names are usage errors
    except UsageError as e:
        raise fail(str(e)) from None


@app.command()
def sim(
    workload: str = typer.Option(..., "--workload", "-w", help="workload-1..4, a Pollux/Philly CSV path, or synthetic:JOBS[@LOAD][/GPUS:WEIGHT,...] (Poisson arrivals at LOAD x cluster capacity, default 0.9; optional job-size mix)"),
    cluster: str = typer.Option("16x6", help="NODESxGPUS_PER_NODE"),
    policies: str = typer.Option("fifo,backfill,optimus,tiresias,marble", help="comma-separated policies"),
    seeds: int = typer.Option(1, min=1, help="how many seeds (seed, seed+1, ...)"),
    seed: int = typer.Option(0, help="first seed"),
    restart_cost: float = typer.Option(30.0, min=0.0, help="checkpoint-restart cost in seconds"),
    model_error: float = typer.Option(0.0, min=0.0, max=0.9, help="mean relative error of the throughput model the policies get (0.1 = 10%); the simulator keeps the true one"),
    threshold: float = typer.Option(0.5, help="marble: least gain per added GPU, in single-GPU throughputs"),
    pressure_threshold: float = typer.Option(0.8, help="marble: the same while waiting jobs want more GPUs than are free"),
    out: Path | None = typer.Option(None, help="directory for results.json, timing.json and PNG plots"),
    events: bool = typer.Option(False, help="also write a JSONL event log per run under --out"),
    as_json: bool = typer.Option(False, "--json", help="print the JSON document instead of tables"),
) -> None:
    """Replay a workload under several policies and seeds; tables (or --json) on stdout."""
    try:
        spec = ClusterSpec.parse(cluster)
        options = PolicyOptions(efficiency_threshold=threshold, pressure_threshold=pressure_threshold)
    except (ValueError, ConfigError) as e:
        raise fail(str(e)) from None
    names = _parse_policies(policies)
    if not math.isfinite(restart_cost):
        raise fail(f"--restart-cost must be a finite number of seconds, got {restart_cost}")
    if events and out is None:
        raise fail("--events needs --out")
    source = WorkloadSource(workload)
    model = _model()
    runs: list[Run] = []
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise fail(f"cannot create --out {out}: {e.strerror}") from None
    with progress() as bar:
        for s in range(seed, seed + seeds):
            try:
                jobs = source.load(model, s, spec)
            except (WorkloadError, ValueError) as e:
                raise fail(str(e)) from None
            for name in names:
                task = bar.add_task(f"{name} seed {s}", total=len(jobs))
                events_path = out / f"events-{name}-seed{s}.jsonl" if events and out else None
                try:
                    run = run_one(source, spec, name, s, model, options, restart_cost, events_path,
                                  on_finish=lambda n, t=task: bar.update(t, completed=n) if n % 50 == 0 else None,
                                  jobs=jobs, model_error=model_error)
                except (ValueError, PolicyError) as e:
                    raise fail(f"{name}, seed {s}: {e}") from None
                bar.update(task, completed=len(jobs))
                runs.append(run)
    doc = report(runs, source, spec, options, restart_cost, model_error)
    if out is not None:
        _write_outputs(out, doc, runs, spec)
    if as_json:
        emit_json(doc)
        return
    rows = [[name] + [_cell(k, doc["policies"][name]["mean"][k]) for _, k in SUMMARY_COLUMNS[1:]] for name in names]
    table = make_table(f"marble sim: {source.label} on {spec}, mean of {seeds} seed(s)\n"
                       "JCT/p50/p99/span/wait in hours; util/eff = allocated/effective GPU utilisation; "
                       "pre/rsz = preemptions/resizes",
                       [c for c, _ in SUMMARY_COLUMNS], rows)
    table.columns[0].no_wrap = True  # policy names stay whole on narrow terminals
    table.box = box.SIMPLE_HEAD
    table.pad_edge = False
    emit_table(table)


def _write_outputs(out: Path, doc: dict, runs: list[Run], spec: ClusterSpec) -> None:
    from mlsyskit.tools.sched import plots

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
    as_json: bool = typer.Option(False, "--json", help="JSON instead of a table"),
) -> None:
    """The fitted scalability model per application and its error on held-out placements."""
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
    threshold: float = typer.Option(0.5, help="marble's least gain per added GPU"),
    pressure_threshold: float = typer.Option(0.8, help="the same under queue pressure"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Efficiency curve E(p) = T(p) / (p T(1)) of one application and marble's GPU count for it.

    The job is taken to ask for --max-gpus GPUs; marble's size is shown for a quiet cluster
    (--threshold) and under queue pressure (--pressure-threshold)."""
    try:
        PolicyOptions(efficiency_threshold=threshold, pressure_threshold=pressure_threshold)
    except ConfigError as e:
        raise fail(str(e)) from None
    tm = _model()
    try:
        tm.check_app(app_name)
    except KeyError as e:
        raise fail(str(e.args[0])) from None
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
def list_policies(as_json: bool = typer.Option(False, "--json", help="JSON instead of a table")) -> None:
    """The registered scheduling policies (names for sim --policies)."""
    described = {name: POLICIES[name].description for name in sorted(POLICIES)}
    if as_json:
        emit_json(described)
        return
    table = make_table("policies", ["name", "what it does"], described.items())
    table.columns[1].justify = "left"
    emit_table(table)


register_daemon_commands(app)


def main() -> None:
    run_app(app)
