"""Local executor: each job is one process group on this machine.

The job runs under a small `sh` wrapper that first writes its pid (`pid`), then runs the command,
then writes the command's exit status (`exit`, by rename, so it is whole or absent). The group is a
new session, so the job outlives a daemon crash; a restarted daemon re-attaches by pid, checking the
process's command line names this job's run directory (a reused pid is not mistaken for the job).
A process gone without an `exit` file was killed from outside (the wrapper died too): `gone`.
Cancel sends SIGTERM (and SIGCONT, so a stopped job sees it) to the whole group, SIGKILL when forced.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.tools.sched.executors.base import (
    EXITED,
    GONE,
    RUNNING,
    Executor,
    ExecutorError,
    Launch,
    Status,
)

# $0 = tag, $1 = run dir, $2 = command. The exit file is written before the wrapper exits.
_WRAPPER = ('echo $$ > "$1/pid.tmp" && mv "$1/pid.tmp" "$1/pid" || exit 125; '
            '/bin/sh -c "$2"; rc=$?; echo $rc > "$1/exit.tmp"; mv "$1/exit.tmp" "$1/exit"; exit $rc')


def _proc_alive(pid: int, run_dir: Path) -> bool:
    """True while `pid` is our wrapper (not a zombie, not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X") and str(run_dir).encode() in cmdline


def _group_members(pgid: int, run_dir: Path) -> list[int]:
    """Live (non-zombie) processes of process group `pgid` that carry this job's MARBLE_RUN_DIR (a job's
    commands can outlive a killed wrapper; a reused id of an unrelated group is not the job)."""
    mark = b"MARBLE_RUN_DIR=" + str(run_dir).encode() + b"\0"
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
            continue
        try:
            if mark in (entry / "environ").read_bytes() + b"\0":
                members.append(int(entry.name))
        except OSError:
            continue
    return members


class LocalExecutor(Executor):
    name = "local"
    one_machine = True
    restartable = True

    def __init__(self, clock: Clock | None = None, recover_grace_s: float = 5.0) -> None:
        self.clock = clock or RealClock()
        self.recover_grace_s = recover_grace_s
        self._children: dict[int, subprocess.Popen] = {}   # launched by this process: reaped here

    def launch(self, launch: Launch) -> str:
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **launch.job_env(), "MARBLE_RUN_DIR": str(launch.run_dir)}
        try:
            with launch.log_path.open("ab") as log:
                proc = subprocess.Popen(["/bin/sh", "-c", _WRAPPER, launch.tag, str(launch.run_dir), launch.cmd],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        cwd=launch.workdir or None, env=env, start_new_session=True)
        except OSError as e:
            raise ExecutorError(f"cannot start job {launch.job_id}: {e.strerror} ({launch.workdir or os.getcwd()})") \
                from None
        self._children[proc.pid] = proc
        return str(proc.pid)

    def poll(self, launch: Launch, handle: str) -> Status:
        """Running while the wrapper or anything else in its group lives. When the command has ended
        (exit file written), leftovers it started in the background are killed, as Slurm does."""
        pid = int(handle)
        child = self._children.get(pid)
        if child is not None:
            if child.poll() is None:
                return Status(RUNNING)
            del self._children[pid]
        elif _proc_alive(pid, launch.run_dir):
            return Status(RUNNING)
        status = self._ended(launch)
        if _group_members(pid, launch.run_dir):
            if status.kind != EXITED:
                return Status(RUNNING)   # the wrapper was killed but the job's commands still hold its GPUs
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return Status(RUNNING)       # reported ended once the group is gone
        return status

    def _ended(self, launch: Launch) -> Status:
        try:
            text = (launch.run_dir / "exit").read_text().strip()
        except FileNotFoundError:
            return Status(GONE, reason="the job's process group ended without an exit status "
                                       "(killed by a signal from outside marble)")
        try:
            return Status(EXITED, exit_code=int(text))
        except ValueError:
            return Status(GONE, reason=f"unreadable exit status {text!r} in {launch.run_dir / 'exit'}")

    def recover(self, launch: Launch) -> str | None:
        """A wrapper that started writes `pid` as its first act; wait a grace period for it."""
        pid_file = launch.run_dir / "pid"
        deadline = self.clock.now() + self.recover_grace_s
        while True:
            try:
                return str(int(pid_file.read_text().strip()))
            except (FileNotFoundError, ValueError):
                pass
            if (launch.run_dir / "exit").exists():
                raise ExecutorError(f"job {launch.job_id} has an exit status but no pid file")
            if self.clock.now() >= deadline:
                return None
            self.clock.sleep(0.05)

    def cancel(self, launch: Launch, handle: str, force: bool) -> None:
        pid = int(handle)
        if pid not in self._children and not _proc_alive(pid, launch.run_dir) and not _group_members(pid, launch.run_dir):
            return
        try:
            os.killpg(pid, signal.SIGKILL if force else signal.SIGTERM)
            if not force:
                os.killpg(pid, signal.SIGCONT)  # a SIGSTOPped job would hold SIGTERM pending until the kill
        except ProcessLookupError:
            pass
        except PermissionError as e:
            raise ExecutorError(f"cannot signal job {launch.job_id} (pid {pid}): {e.strerror}") from None
