"""`marble profile`: measure a job's throughput on several GPU counts and fit the scaling model
(daemon/profiler.py does the work; imported when the command runs, so other commands stay fast)."""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from mlsyskit.core.cli import ensure_out_dir, json_option, out_option, quiet_option, verbose_option
from mlsyskit.core.errors import UsageError


def register_profile(app: typer.Typer) -> None:
    @app.command()
    def profile(
        cmd: str = typer.Option(..., "--cmd", help="The job to measure (it must honour MARBLE_PROFILE_OUT; see "
                                                   "tools/sched/examples/ddp_train.py)."),
        gpus: str = typer.Option("1,2,4", "--gpus", help="GPU counts to run it on, one node (1..9 each)."),
        seconds: float = typer.Option(5.0, "--seconds", min=0.5, max=3600.0, help="Measuring time per run, after warm-up."),
        timeout: float = typer.Option(300.0, "--timeout", min=1.0, help="Kill a run that takes longer than this."),
        app_name: str = typer.Option("myjob", "--app", help="Name of the application profile written to --out."),
        out: Path | None = out_option("profile.json, APP/placements.csv (for marble serve --profiles OUT), "
                                      "runs/GPUS/output.log"),
        as_json: bool = json_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option(),
    ) -> None:
        """Measure a job's throughput on several GPU counts and fit marble's scaling model to it."""
        import tempfile

        from mlsyskit.core.clock import RealClock
        from mlsyskit.core.console import emit_json, emit_table, log, make_table, reporter, set_verbosity
        from mlsyskit.tools.sched.daemon import profiler

        set_verbosity(verbose, quiet)
        counts = _gpu_counts(gpus)
        if not app_name.replace("-", "").replace("_", "").isalnum():
            raise UsageError(f"--app {app_name!r}: use letters, digits, - and _")
        root = ensure_out_dir(out) if out else Path(tempfile.mkdtemp(prefix="marble-profile-"))
        measurements = []
        with reporter() as rep:
            rep.start("profiling", total=len(counts), unit="placements")
            for k in counts:
                m = profiler.measure(cmd, k, seconds, (root / "runs" / str(k)).absolute(), str(Path.cwd()),
                                     RealClock(), timeout)
                measurements.append(m)
                rep.advance(note=f"{k} GPU(s): {m.samples_per_s:,.0f} samples/s")
        report = profiler.fit_report(measurements)
        if out:
            profiler.write_profile(root, app_name, measurements, report)
            log(f"wrote {root / 'profile.json'} and {root / app_name / 'placements.csv'}")
        if as_json:
            emit_json({"app": app_name, **report})
            return
        emit_table(make_table(f"{app_name}: measured throughput and the fitted model (one node)",
                              ["GPUs", "samples/s", "speedup", "efficiency", "model samples/s", "fit error",
                               "leave-one-out error"],
                              [[c["gpus"], c["samples_per_s"], c["speedup"], c["efficiency"], c["model_samples_per_s"],
                                _pct(c["fit_error"]), _pct(c["leave_one_out_error"])] for c in report["curve"]]))
        coef = report["model"]
        sys.stdout.write(f"model: compute(m) = {coef['c0']:.4g} + {coef['c1']:.4g} m s; sync(K) = "
                         f"{coef['l0']:.4g} + {coef['l1']:.4g} (K - 2) s on one node; mean error "
                         f"{_pct(report['mean_fit_error'])} in-sample, "
                         f"{_pct(report['mean_leave_one_out_error'])} leave-one-out\n")


    del profile


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _gpu_counts(text: str) -> list[int]:
    try:
        counts = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"--gpus {text!r}: expected comma-separated counts like 1,2,4") from None
    if not counts or any(not 1 <= k <= 9 for k in counts) or len(set(counts)) != len(counts):
        raise UsageError(f"--gpus {text!r}: distinct counts in 1..9 (one node) expected")
    return sorted(counts)



__all__ = ["register_profile"]
