"""One run's share of an --nvme-dir: locked, namespaced, removed at exit.

`NvmeRun.open(base)` takes an exclusive flock on `base/.tencache.lock` (a second run on the same folder
is refused at once, in one line naming the holder's pid; the kernel drops the lock when a run dies,
even by kill -9), removes block folders that crashed runs left behind (no live run can own them while we
hold the lock), and makes `base/run-<pid>-<n>/` for this run's blocks. `close()` removes that folder and
releases the lock. Nothing needs to survive a run: checkpoints hold everything `--resume` needs.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from pathlib import Path

from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.core.storage_errors import MissingDirectoryError, StoragePermissionError

LOCK_NAME = ".tencache.lock"


class NvmeDirBusyError(RuntimeFailure):
    """Another run holds the --nvme-dir."""


class NvmeRun:
    def __init__(self, base: Path, path: Path, lock_fd: int, stale_removed: int) -> None:
        self.base, self.path, self._fd, self.stale_removed = base, path, lock_fd, stale_removed

    @classmethod
    def open(cls, base: str | Path) -> NvmeRun:
        base = Path(base)
        if not base.is_dir():
            raise MissingDirectoryError(f"--nvme-dir {base} does not exist (create it first)")
        if not os.access(base, os.W_OK | os.X_OK):
            raise StoragePermissionError(f"--nvme-dir {base} is not writable")
        fd = os.open(base / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise NvmeDirBusyError(f"--nvme-dir {base} is in use by another tencache run (pid {holder}); "
                                   f"give each run its own folder") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            stale = [p for p in base.iterdir() if p.is_dir() and p.name.startswith("run-")]
            for p in stale:
                shutil.rmtree(p, ignore_errors=True)
            path = base / f"run-{os.getpid()}-{time.monotonic_ns()}"
            path.mkdir()
        except BaseException:
            os.close(fd)
            raise
        return cls(base, path, fd, len(stale))

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            shutil.rmtree(self.path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # releases the flock
            self._fd = -1

    def __enter__(self) -> NvmeRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
