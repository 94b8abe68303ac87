"""`marble profile`: run a job briefly on 1, 2, 4, ... GPUs of one node, measure its throughput,
and fit marble's scaling model (scaling_model.fit, the one the policies use) to the measurements.

The job learns its GPUs as under the daemon (CUDA_VISIBLE_DEVICES, MARBLE_GPUS), and two more
variables: MARBLE_PROFILE_SECONDS (how long to train) and MARBLE_PROFILE_OUT (a file to write one
JSON object to: global_batch, local_bsz, step_time, sync_time and samples_per_s, measured after
warm-up). tools/sched/examples/ddp_train.py is such a job. Each run is a process group of the local
executor, killed if it overruns.

The fit's error is reported two ways: in-sample (fitted on every placement) and leave-one-out (each
placement predicted by a model fitted on the others), which is the honest one. `write_profile`
stores the measurements as a Pollux-format placements.csv, so `marble serve --profiles DIR` can
schedule the application from its own measured curve.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from mlsyskit.core.clock import Clock
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.sched.executors.base import EXITED, RUNNING, Launch, NodeSlice
from mlsyskit.tools.sched.executors.local import LocalExecutor
from mlsyskit.tools.sched.profiles import Row
from mlsyskit.tools.sched.scaling_model import FittedModel, fit

FIELDS = ("global_batch", "local_bsz", "step_time", "sync_time", "samples_per_s")


@dataclass(frozen=True)
class Measurement:
    gpus: int
    global_batch: float
    local_bsz: float
    step_time: float
    sync_time: float
    samples_per_s: float

    def row(self) -> Row:
        return Row((self.gpus,), 1, self.gpus, self.local_bsz, self.step_time, self.sync_time)


def measure(cmd: str, gpus: int, seconds: float, run_dir: Path, workdir: str, clock: Clock,
            timeout_s: float) -> Measurement:
    """Run `cmd` on `gpus` logical GPUs for `seconds`; its measurement, or RuntimeFailure saying why not."""
    out = run_dir / "measurement.json"
    launch = Launch(gpus, f"profile-{gpus}", cmd, run_dir, workdir,
                    {"MARBLE_PROFILE_OUT": str(out), "MARBLE_PROFILE_SECONDS": f"{seconds:g}"},
                    (NodeSlice("local", "local", tuple(range(gpus)), tuple(range(gpus))),), f"marble-profile-{gpus}")
    executor = LocalExecutor(clock=clock)
    handle = executor.launch(launch)
    deadline = clock.now() + timeout_s
    while (status := executor.poll(launch, handle)).kind == RUNNING:
        if clock.now() > deadline:
            executor.cancel(launch, handle, force=True)
            while executor.poll(launch, handle).kind == RUNNING:
                clock.sleep(0.05)
            raise RuntimeFailure(f"the job on {gpus} GPU(s) ran past {timeout_s:g}s; see {launch.log_path}")
        clock.sleep(0.1)
    if status.kind != EXITED or status.exit_code != 0:
        why = f"exit status {status.exit_code}" if status.kind == EXITED else status.reason
        raise RuntimeFailure(f"the job on {gpus} GPU(s) failed ({why}); see {launch.log_path}")
    try:
        doc = json.loads(out.read_text())
        values = {k: float(doc[k]) for k in FIELDS}
    except FileNotFoundError:
        raise RuntimeFailure(f"the job on {gpus} GPU(s) wrote no measurement to MARBLE_PROFILE_OUT ({out}); "
                             "it must write global_batch, local_bsz, step_time, sync_time, samples_per_s") from None
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeFailure(f"bad measurement from the job on {gpus} GPU(s) in {out}: {e!r}") from None
    if not all(math.isfinite(v) and v >= 0 for v in values.values()) or values["step_time"] <= 0:
        raise RuntimeFailure(f"bad measurement from the job on {gpus} GPU(s): {values}")
    return Measurement(gpus, **values)


def _relative_error(model: FittedModel, m: Measurement) -> float:
    return abs(model.step_time(m.gpus, 1, m.local_bsz) - m.step_time) / m.step_time


def fit_report(measurements: list[Measurement]) -> dict:
    """The fitted model, its curve next to the measured one, in-sample and leave-one-out errors."""
    model = fit([m.row() for m in measurements])
    one = next((m for m in measurements if m.gpus == 1), None)
    curve = []
    for m in measurements:
        others = [o.row() for o in measurements if o is not m]
        loo = _relative_error(fit(others), m) if len(others) >= 2 else None
        predicted = m.global_batch / model.step_time(m.gpus, 1, m.local_bsz)
        curve.append({"gpus": m.gpus, "samples_per_s": m.samples_per_s,
                      "speedup": m.samples_per_s / one.samples_per_s if one else None,
                      "efficiency": m.samples_per_s / (m.gpus * one.samples_per_s) if one else None,
                      "step_time": m.step_time, "sync_time": m.sync_time, "model_samples_per_s": predicted,
                      "fit_error": _relative_error(model, m), "leave_one_out_error": loo})
    loo = [c["leave_one_out_error"] for c in curve if c["leave_one_out_error"] is not None]
    return {"model": asdict(model), "curve": curve,
            "mean_fit_error": sum(c["fit_error"] for c in curve) / len(curve),
            "mean_leave_one_out_error": sum(loo) / len(loo) if loo else None}


def write_profile(out_dir: Path, app: str, measurements: list[Measurement], report: dict) -> Path:
    """OUT/<app>/placements.csv (Pollux format, what ThroughputModel loads) and OUT/profile.json."""
    app_dir = out_dir / app
    app_dir.mkdir(parents=True, exist_ok=True)
    with (app_dir / "placements.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["placement", "local_bsz", "step_time", "sync_time"])
        for m in measurements:
            writer.writerow([str(m.gpus), m.local_bsz, m.step_time, m.sync_time])
    (out_dir / "profile.json").write_text(json.dumps({"app": app, "measurements": [asdict(m) for m in measurements],
                                                      **report}, indent=2) + "\n")
    return app_dir
