"""Slurm executor: carries out the policy's placement with `sbatch`, follows jobs with `scontrol show
job`, cancels with `scancel`.

The placement becomes `--nodes N --nodelist h1,h2 --gres=gpu:P` (P GPUs on each node); a placement
with different counts per node becomes a heterogeneous job, one component per count. Slurm picks the
device ids and sets CUDA_VISIBLE_DEVICES itself (its gres.conf knows the devices), so the daemon's own
ids only account for how many GPUs each node has in use. Jobs are named `marble-<store>-<id>`, so a
daemon restarted after a crash between `sbatch` and recording its job id finds the job by name
(`squeue --states=all --name`). The daemon assumes the nodes it is given are its own to fill.
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
from collections import defaultdict

from mlsyskit.core.errors import UsageError
from mlsyskit.tools.sched.executors.base import (
    EXITED,
    GONE,
    RUNNING,
    Executor,
    ExecutorError,
    Launch,
    Status,
)

_ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
          "STAGE_OUT", "STOPPED"}
_SLURM_MANAGED = ("CUDA_VISIBLE_DEVICES", "MARBLE_PLACEMENT")


def _run(argv: list[str], timeout: float = 20.0) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ExecutorError(f"{argv[0]} did not answer within {timeout:g}s (is slurmctld up?)") from None
    except OSError as e:
        raise ExecutorError(f"cannot run {argv[0]}: {e.strerror}") from None
    if done.returncode != 0:
        raise ExecutorError(f"{' '.join(argv[:2])} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def parse_show_job(text: str) -> dict[str, str]:
    """`scontrol show job -o` output -> {key: value} (values have no spaces except in Command/Comment)."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def sbatch_argv(launch: Launch, script: str) -> list[str]:
    """The sbatch command for `launch`: one component per distinct per-node GPU count."""
    by_count: dict[int, list[str]] = defaultdict(list)
    for part in launch.nodes:
        by_count[len(part.held)].append(part.host)
    argv = ["sbatch", "--parsable", f"--job-name={launch.tag}", f"--output={launch.log_path}",
            f"--chdir={launch.workdir or launch.run_dir}"]
    for i, (count, hosts) in enumerate(sorted(by_count.items(), reverse=True)):
        if i:
            argv.append(":")
        argv += [f"--nodes={len(hosts)}", f"--nodelist={','.join(hosts)}", f"--gres=gpu:{count}", "--ntasks-per-node=1"]
    return [*argv, script]


class SlurmExecutor(Executor):
    name = "slurm"
    one_machine = False

    def __init__(self) -> None:
        missing = [b for b in ("sbatch", "scontrol", "scancel", "squeue") if shutil.which(b) is None]
        if missing:
            raise UsageError(f"the slurm executor needs {', '.join(missing)} on PATH "
                             "(apt-get install slurm-client, with a running slurmctld)")

    def launch(self, launch: Launch) -> str:
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in launch.job_env().items() if k not in _SLURM_MANAGED}
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
        script = launch.run_dir / "job.sh"
        script.write_text(f"#!/bin/sh\n{exports}{launch.cmd}\n")
        out = _run(sbatch_argv(launch, str(script)))
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise ExecutorError(f"sbatch answered {out.strip()!r}, not a job id")
        return job_id

    def poll(self, launch: Launch, handle: str) -> Status:
        try:
            fields = parse_show_job(_run(["scontrol", "show", "job", "-o", handle]))
        except ExecutorError as e:
            if "invalid job id" in str(e).lower():
                return Status(GONE, reason=f"Slurm no longer knows job {handle} (older than MinJobAge?)")
            raise
        state = fields.get("JobState", "UNKNOWN")
        if state in _ALIVE:
            return Status(RUNNING)
        code = fields.get("ExitCode", "0:0").split(":")
        if state in ("COMPLETED", "FAILED") and code[0].isdigit():
            return Status(EXITED, exit_code=int(code[0]))
        return Status(GONE, reason=f"Slurm ended job {handle} as {state} "
                                   f"(exit {fields.get('ExitCode', '?')}, {fields.get('Reason', 'no reason')})")

    def recover(self, launch: Launch) -> str | None:
        out = _run(["squeue", "-h", "--states=all", f"--name={launch.tag}", "-o", "%i"])
        ids = [line.strip().split("+")[0] for line in out.splitlines() if line.strip()]
        return ids[0] if ids else None

    def cancel(self, launch: Launch, handle: str, force: bool) -> None:
        _run(["scancel", *(["--signal=KILL", "--full"] if force else []), handle])
