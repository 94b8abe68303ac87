"""`fl-server simulate --backend ray`: simulated clients train as Ray tasks (a cluster, or a local Ray it starts).

The simulator still decides everything (who trains, with which model, seed and attack, and when
each update arrives on the virtual clock); Ray only runs `backends.run_train_task`, the function
the in-process backend runs, on whichever node is free. So a job gives the same result on both
backends for the same seed (tested): the tasks are pure functions of plain data, every worker
runs torch and BLAS single-threaded as the simulator does, and results come back in task order
whatever order the tasks finish in.

A round's global model is put in the object store once and shared by all its tasks; tasks are
sent in chunks (a few per worker CPU) because one client's training (tens of milliseconds) is
comparable to a Ray task's own overhead. Ray retries a task whose worker died (the work is pure,
so a retry is safe); a task that raises stops the job with the remote error.

Without `--ray-address` it joins a Ray already running on this machine (RAY_ADDRESS, or one started
by `ray start`), else starts a local Ray for the run (all CPUs, no dashboard) and stops it at the
end, as Flower's simulation does (a start that misses Ray's fixed 30 s wait for its node on a busy
host is tried again). For several machines start a cluster first (`ray start --head` on
one, `ray start --address HEAD:PORT` on the others, each with this project installed) and pass its
address. Needs the optional extra: pip install 'mlsyskit[fl-ray]'.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.core.retry import retry_call
from mlsyskit.tools.fl.backends import BaselineTask, RoundJob, TrainTask, run_baseline_tasks, run_train_task
from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.training import LocalResult

LOCAL_OBJECT_STORE = 256 * 1024 * 1024  # bytes, for a Ray this backend starts (round models are small)
CHUNKS_PER_CPU = 2  # enough chunks to balance uneven clients, few enough to amortise each task's overhead
# Ray waits a fixed 30 s for a new node to register, and the raylet registers only once its dashboard
# agent has imported (~9 s at load 14 on 2 cores): a busy host can miss it. A second start usually
# makes it; past this deadline (3 tries: each takes >= 30 s) the last error stands.
LOCAL_START_DEADLINE_S = 75.0


def _ray_start_timed_out(error: BaseException) -> bool:
    return "timed out during startup" in str(error)


def _stop_new_ray_children(before: set[int]) -> None:
    """Kill the Ray daemons a failed start left running (children of this process it did not have
    before), so a retry does not leave a half-started cluster beside the new one."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        if child.pid in before:
            continue
        try:
            if "ray" in " ".join(child.cmdline()):
                child.kill()
        except psutil.Error:
            pass  # already gone


def _train_chunk(job: RoundJob, tasks: list[TrainTask]) -> list[LocalResult]:
    from mlsyskit.tools.fl.threads import single_threaded

    single_threaded()  # the same arithmetic as the in-process backend: one torch/BLAS thread
    return [run_train_task(job, task) for task in tasks]


def _baseline_chunk(spec: TrainSpec, num_features: int, num_classes: int, tasks: list[BaselineTask]) -> list[float]:
    from mlsyskit.tools.fl.threads import single_threaded

    single_threaded()
    return run_baseline_tasks(spec, num_features, num_classes, tasks)


def _chunks(items: Sequence[Any], count: int) -> list[list[Any]]:
    """`items` in order, cut into at most `count` contiguous chunks of near-equal size."""
    count = max(1, min(count, len(items)))
    size, extra = divmod(len(items), count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        out.append(list(items[start:end]))
        start = end
    return out


class RayBackend:
    name = "ray"

    def __init__(self, address: str | None = None, clock: Clock | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeFailure("--backend ray needs Ray: pip install 'mlsyskit[fl-ray]'") from None
        self._ray = ray
        self._clock = clock or RealClock()
        self._owns_connection = not ray.is_initialized()
        self.started_local = False  # True: this backend started a local Ray and stops it at close()
        if self._owns_connection:
            self._connect(address)
        self.chunks_sent = 0  # remote tasks submitted (what a test checks to know Ray did the work)
        self._train = ray.remote(_train_chunk).options(num_cpus=1, max_retries=3)
        self._baseline = ray.remote(_baseline_chunk).options(num_cpus=1, max_retries=3)

    def _connect(self, address: str | None) -> None:
        """Join `address`; without one, a Ray already running on this machine (RAY_ADDRESS or `ray start`),
        else start a local one for this run, as Flower's simulation does."""
        common = {"namespace": "mlsyskit-fl", "log_to_driver": False, "configure_logging": False}
        try:
            self._ray.init(address=address or "auto", **common)
            return
        except ConnectionError as e:  # "auto" found no running Ray
            if address is not None:
                raise RuntimeFailure(f"cannot join the Ray cluster at {address} ({e}); start one with "
                                     "`ray start --head` and pass its address, or leave out --ray-address to "
                                     "start a local Ray") from None
        except Exception as e:  # noqa: BLE001 (Ray raises bare Exceptions; the user gets one line)
            raise RuntimeFailure(f"cannot join the Ray cluster at {address or 'auto'} ({e})") from None
        try:
            retry_call(lambda: self._start_local(common), retriable=_ray_start_timed_out,
                       deadline_s=LOCAL_START_DEADLINE_S, clock=self._clock)
        except Exception as e:  # noqa: BLE001 (Ray raises bare Exceptions; the user gets one line)
            raise RuntimeFailure(f"cannot start a local Ray ({e})") from None
        self.started_local = True

    def _start_local(self, common: dict[str, Any]) -> None:
        import psutil

        before = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            self._ray.init(address="local", include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE,
                           **common)
        except Exception as e:
            if _ray_start_timed_out(e):
                self._ray.shutdown()
                _stop_new_ray_children(before)
            raise

    def _chunk_count(self, tasks: int) -> int:
        cpus = int(self._ray.cluster_resources().get("CPU", 1))
        return max(1, min(tasks, CHUNKS_PER_CPU * cpus))

    def _gather(self, refs: list[Any]) -> list[Any]:
        self.chunks_sent += len(refs)
        try:
            chunks = self._ray.get(refs)
        except self._ray.exceptions.RayError as e:
            raise RuntimeFailure(f"a Ray training task failed: {e}") from None
        return [result for chunk in chunks for result in chunk]

    def train(self, job: RoundJob, tasks: Sequence[TrainTask]) -> list[LocalResult]:
        if not tasks:
            return []
        shared = self._ray.put(job)  # the round's model once, not once per task
        return self._gather([self._train.remote(shared, chunk)
                             for chunk in _chunks(tasks, self._chunk_count(len(tasks)))])

    def local_only(self, spec: TrainSpec, num_features: int, num_classes: int,
                   tasks: Sequence[BaselineTask]) -> list[float]:
        if not tasks:
            return []
        return self._gather([self._baseline.remote(spec, num_features, num_classes, chunk)
                             for chunk in _chunks(tasks, self._chunk_count(len(tasks)))])

    def close(self) -> None:
        if self._owns_connection and self._ray.is_initialized():
            self._ray.shutdown()
