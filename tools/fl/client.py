"""`fl-client run`: join a server, train on its own data when selected, report update, quality and resources.

The client holds its own data (`--data`, loaded in this process only: local_data.py) and never
sends it anywhere. It asks the server for the job (the task's features and classes, the training
recipe and the model it names; `--model` says where this client finds that model's factory),
checks that its data fit the task, trains its local-only baseline once (the consumer's reference
for the utility ratio) and then follows the server's task stream on one `session` call (reading batch
messages: a round's receipt, its end and the next task come as one). It tells the server its number of
training samples and the shapes of its model, nothing else about its data.

Any transport failure (refused, reset, a stream torn down by a server killed mid-call: UNAVAILABLE,
INTERNAL, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED) sends it back to reconnect, after a capped
exponential backoff with full jitter, and it resumes with whatever server then listens (a server
restarted from its run directory re-opens the uncommitted round). It gives up only after
`reconnect_s` without any message from a server. An answer (bad token, wrong certificate, a
refused request) ends it at once with the server's reason. A TLS mismatch is named as such. A
session refused because this client id already has a live one (ALREADY_EXISTS) is retried for
`reconnect_s` (the old one may be a connection the server has not yet seen die), then given up.
Its token summary is the ledger's: every round_end and the final done carry the balance and the
pay earned over the whole job, so rounds missed while away (a server restart) are not lost.

Each update reports what the client measured (measure.py): `train_time_s` and `cpu_time_s` of the
local training, `cpu_percent` (this process, of one core), `host_cpu_percent` (all cores, psutil) and
`local_s`, task in to update out; the server subtracts `local_s` from the round trip it times itself
to get the communication time. Between tasks the client sends a heartbeat every `heartbeat_s` the
server asks for (host CPU, load, free memory); the server selects only clients whose heartbeat is
fresh. `slowdown=(round, seconds)` makes every local training from that round on take `seconds`
longer, as on a slower or contended device (fault injection for tests and demos).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass

import numpy as np

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.retry import Backoff
from mlsyskit.core.rpc import TRANSPORT_FAILURES, ClientTls, RpcClient, RpcError, StatusCode
from mlsyskit.core.rpc_tls import probe_tls
from mlsyskit.core.sim import Seeds
from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.local_data import check_fits
from mlsyskit.tools.fl.measure import Snapshot, Span, heartbeat_sample
from mlsyskit.tools.fl.model import evaluate, init_weights, shapes
from mlsyskit.tools.fl.plugins import call_user
from mlsyskit.tools.fl.scaling import InputScaling
from mlsyskit.tools.fl.task import ClientData
from mlsyskit.tools.fl.threads import freeze_startup_heap, single_threaded
from mlsyskit.tools.fl.tls_probe import refuses_certificate

log = logging.getLogger("mlsyskit.fl.client")

# sessions in a row that a server accepted and that then failed before any task: a server that answers
# but breaks every session (a bug answered as INTERNAL) must not keep a client retrying forever
MAX_BARREN_SESSIONS = 10


class ClientStopped(Exception):
    """The client cannot continue (refused, misconfigured, no server for too long); the message says why."""


@dataclass
class ClientSummary:
    rounds_trained: int = 0
    accepted: int = 0  # final verdicts after the server's round checks, not provisional receipts
    rejected: int = 0
    tokens_earned: float = 0.0
    balance: float | None = None
    reconnects: int = 0
    evaluated: bool = False
    done: bool = False


class FlClient:
    def __init__(self, address: str, client_id: int, data: ClientData, *, model: str | None = None,
                 data_name: str = "--data", attack: str = "none",
                 token: str | None = None, tls: ClientTls | None = None, reconnect_s: float = 60.0,
                 backoff_initial_s: float = 0.1, backoff_max_s: float = 5.0, jitter_seed: int | None = None,
                 clock: Clock | None = None, freeze_heap: bool = False,
                 slowdown: tuple[int, float] | None = None) -> None:
        self.address = address
        self.client_id = client_id
        self._data = data  # this client's own samples: loaded here, never sent
        self.model = model  # where this client finds the job's model (package.module:factory); None: the job's name
        self.data_name = data_name  # the --data SPEC, for messages
        self.attack = attack
        self.reconnect_s = reconnect_s
        self.tls = tls
        self.clock = clock or RealClock()
        self.backoff = Backoff(backoff_initial_s, backoff_max_s,
                               random.Random(client_id if jitter_seed is None else jitter_seed))
        self.freeze_heap = freeze_heap  # freeze_startup_heap() once ready (the CLI paused GC at start-up)
        self.slowdown = slowdown
        self.rpc = RpcClient(address, token=token, tls=tls, timeout=60.0)
        self.summary = ClientSummary()
        self._job: dict | None = None
        self._local_only: float | None = None
        self._refused_since: float | None = None  # first ALREADY_EXISTS of a row of them
        self._last_contact = self.clock.now()
        self._ever_connected = False  # before the first answer, a refused connection is a server not up yet
        self._tasks_seen = 0  # messages other than the welcome, over all sessions
        self._barren = 0
        self._trained: tuple | None = None  # (task key, its weights, the update): a re-sent task is not retrained

    def _spec(self, train: dict) -> TrainSpec:
        """The job's training recipe, with the model found where this client says (--model)."""
        spec = TrainSpec(**train)
        return spec if self.model is None else TrainSpec(**{**train, "model": self.model})

    async def _prepare(self) -> None:
        job = await self.rpc.call("job", {})
        self._touch()
        if not isinstance(job, dict) or not isinstance(job.get("task"), dict):
            raise ClientStopped(f"the server at {self.address} sent no task (an fl-server from before clients held "
                                "their own data?)")
        mine = {"task": job["task"], "train": job["train"], "seed": job.get("seed")}
        if self._job is not None and mine != self._job:
            raise ClientStopped("the server now runs a different job (its task or training changed); start afresh")
        self.num_features, self.num_classes = int(job["task"]["num_features"]), int(job["task"]["num_classes"])
        if self._job is None:
            check_fits(self._data, self.num_features, self.num_classes, self.data_name)
            try:  # the job's input scaling (the server's root-set statistics), applied once to this client's data
                scaling = InputScaling.from_task(job["task"], self.num_features)
            except ValueError as e:
                raise ClientStopped(str(e)) from None
            if scaling is not None:
                self._data = scaling.applied_to(self._data)
        self._job = mine
        self.train_spec = self._spec(job["train"])
        if self._local_only is None:
            # torch (~3 CPU s to import) once the server has answered, so a client it refuses never loads it;
            # in a thread, as the training, so that the event loop (gRPC's keepalives) runs meanwhile
            training = await asyncio.to_thread(_training)
            seed = Seeds(int(job.get("seed") or 0)).seed(f"local-only:{self.client_id}") % (2**31)
            self._local_only = await asyncio.to_thread(self._user, training.local_only_accuracy, self._data,
                                                       self.train_spec, self.num_features, self.num_classes, seed)
            # before the first task, so the first round's measured train time is the device's, not torch's start-up
            await asyncio.to_thread(self._user, training.warm_up, self.num_features, self.num_classes,
                                    self.train_spec)
            if self.freeze_heap:
                freeze_startup_heap()

    def _touch(self) -> None:
        self._last_contact = self.clock.now()
        self._ever_connected = True
        self.backoff.reset()

    async def run(self) -> ClientSummary:
        single_threaded()
        self._last_contact = self.clock.now()
        try:
            while not self.summary.done:
                answered, seen = False, self._tasks_seen
                try:
                    await self._prepare()
                    answered = True
                    await self._follow()
                    if self.summary.done:
                        break
                    failure = RpcError(StatusCode.UNAVAILABLE, f"{self.address} ended the session")
                except RpcError as e:
                    if e.code == StatusCode.ALREADY_EXISTS:
                        failure, answered = self._refused(e), False  # not a barren session: a refused one
                    elif e.code not in TRANSPORT_FAILURES:
                        raise ClientStopped(e.message) from None
                    else:
                        failure = e
                self._barren = 0 if self._tasks_seen > seen else self._barren + answered
                if self._barren >= MAX_BARREN_SESSIONS:
                    raise ClientStopped(f"the server at {self.address} accepted {self._barren} sessions in a row and "
                                        f"each failed before any task; last error: {failure.message}")
                await self._before_retry(failure)
        finally:
            await self.rpc.close()
        return self.summary

    def _refused(self, error: RpcError) -> RpcError:
        """Another session holds this client id: retry (it may be our own dead one) for reconnect_s, then stop."""
        now = self.clock.now()
        self._last_contact = now  # the server answered: not a silence (the backoff still grows)
        self._refused_since = self._refused_since if self._refused_since is not None else now
        if now - self._refused_since > self.reconnect_s:
            raise ClientStopped(f"{error.message} (still after {now - self._refused_since:.0f}s: another process "
                                f"is using client {self.client_id}'s certificate)")
        log.warning("client %d: %s; retrying", self.client_id, error.message)
        return error

    def _user(self, fn, *args):
        """Run training code; with a custom --model, whatever it raises is one line naming the target."""
        model = self.train_spec.model
        return call_user(fn, f"--model {model!r}", *args) if model else fn(*args)

    async def _before_retry(self, failure: RpcError) -> None:
        """Close the channel, name a TLS mismatch, give up after reconnect_s of silence, else back off."""
        await self.rpc.close()  # a fresh channel: gRPC's own reconnect backoff would otherwise pile on ours
        if "connection refused" not in failure.message:
            await self._check_tls_matches()
        silent = self.clock.now() - self._last_contact
        if silent > self.reconnect_s:
            raise ClientStopped(f"no server at {self.address} for {silent:.0f}s (--reconnect {self.reconnect_s:g}); "
                                f"last error: {failure.message}")
        delay = self.backoff.next_delay()
        self.summary.reconnects += 1
        if self._ever_connected:
            log.warning("client %d lost the server (%s); reconnecting in %.2fs", self.client_id, failure.message, delay)
        else:
            log.debug("client %d: waiting for the server (%s); retrying in %.2fs", self.client_id, failure.message,
                      delay)
        await self.clock.asleep(delay)

    async def _check_tls_matches(self) -> None:
        host, _, port = self.address.rpartition(":")
        speaks = await asyncio.to_thread(probe_tls, host.strip("[]"), int(port))
        if speaks in ("tls", "tls-client-cert") and self.tls is None:
            raise ClientStopped(f"the server at {self.address} expects TLS and this client sent plaintext: give "
                                f"{'--certs DIR (its client certificates)' if speaks == 'tls-client-cert' else '--tls-ca'}")
        if speaks == "tls-client-cert" and self.tls is not None and self.tls.cert_chain is None:
            raise ClientStopped(f"the server at {self.address} asks for a client certificate: give --certs DIR "
                                "(from fl-server certs) or --tls-cert/--tls-key")
        if speaks == "tls-client-cert" and self.tls is not None and await asyncio.to_thread(
                refuses_certificate, host.strip("[]"), int(port), self.tls):
            raise ClientStopped(f"the server at {self.address} refused the client certificate (signed by another "
                                "CA than the server trusts, or expired): use this client's pair from the server's "
                                "`fl-server certs` folder")
        if speaks == "plaintext" and self.tls is not None:
            raise ClientStopped(f"the server at {self.address} does not speak TLS: drop the --tls-*/--certs options "
                                "(or start the server with a certificate)")

    async def _follow(self) -> None:
        hello = {"client_id": self.client_id, "num_samples": self._data.num_samples,
                 "local_only_accuracy": self._local_only, "declared_attack": self.attack,
                 "batches": True,  # several messages queued at once (round end + next task) come as one
                 # the model this client will train: the server refuses it at registration if names or shapes differ
                 "shapes": {name: list(shape) for name, shape in shapes(init_weights(
                     self.num_features, self.num_classes, self.train_spec.hidden, 0, self.train_spec.model)).items()}}
        session = self.rpc.bidi("session", timeout=None)  # tasks in, updates out, one call for the job
        sending = asyncio.Lock()  # updates and heartbeats share the call: one write at a time

        async def send(message: dict) -> None:
            async with sending:
                await session.send(message)

        heartbeat: asyncio.Task | None = None
        try:
            await send(hello)
            async for message in session:
                self._touch()
                self._refused_since = None
                batch = message["messages"] if message.get("type") == "batch" else [message]
                ended = {task.get("round") for task in batch if task.get("type") == "round_end"}
                for task in batch:
                    kind = task.get("type")
                    self._tasks_seen += kind != "welcome"
                    if kind == "welcome" and float(task.get("heartbeat_s") or 0) > 0 and heartbeat is None:
                        heartbeat = asyncio.create_task(self._heartbeats(send, float(task["heartbeat_s"])))
                    if kind == "train":
                        log.info("round %s: selected; training", task["round"])
                        await send(self._train(task))
                    elif kind == "receipt":
                        self._receipt(task, task.get("round") in ended)
                    elif kind == "round_end":
                        self._round_end(task)
                    elif kind == "evaluate":
                        await self._evaluate(task)
                    elif kind == "done":
                        self._books(task)
                        self.summary.done = True
                        return
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            session.cancel()

    async def _heartbeats(self, send, every_s: float) -> None:
        """Resources over each interval, so the server knows this client is alive and how loaded its host is.
        Training runs inline, so no heartbeat goes out while the client trains (the server knows it is busy)."""
        since = Snapshot.take()
        try:
            while True:
                await self.clock.asleep(every_s)
                fields, since = heartbeat_sample(since)
                await send({"type": "heartbeat", "client_id": self.client_id, **fields})
        except RpcError:  # the session ended; the main loop sees why
            return

    def _train(self, task: dict) -> dict:
        key = (task["round"], task["seed"], repr(sorted(task["train"].items())))
        if self._trained is not None and self._trained[0] == key and _same_weights(self._trained[1], task["weights"]):
            log.info("round %s: the same task again (server restarted); re-sending the update", task["round"])
            return self._trained[2]
        spec = self._spec(task["train"])
        start = Snapshot.take()
        # inline, not in a worker thread: the client has nothing else to do meanwhile, and the hop to a
        # thread and back cost ~0.15 ms of CPU per round (gRPC keepalive pings are answered by its core)
        result = self._user(_training().train_local, task["weights"], self._data, spec, self.num_features,
                            self.num_classes, int(task["seed"]), self.attack)
        extra = 0.0
        if self.slowdown is not None and int(task["round"]) >= self.slowdown[0]:
            extra = self.slowdown[1]
            time.sleep(extra)  # the emulated slower device: the whole client is held, as by a longer computation
        span = Span.between(start, Snapshot.take())
        self.summary.rounds_trained += 1
        train_s = result.train_time_s + extra
        metrics = result.metrics() | {
            "train_time_s": train_s, "cpu_percent": 100.0 * result.cpu_time_s / train_s if train_s > 0 else 0.0,
            "host_cpu_percent": span.host_cpu_percent, "local_s": span.wall_s,
            "accuracy": result.consumer_accuracy}  # the received model on this client's data: the schedulers' signal
        update = {"client_id": self.client_id, "round": task["round"], "weights": result.weights,
                  "metrics": metrics}
        self._trained = (key, task["weights"], update)  # the task's arrays: compared only if a task comes again
        return update

    def _receipt(self, receipt: dict, verdict_follows: bool = False) -> None:
        """The server's first answer to an update: received, or refused with a reason (final then). An
        acceptance that came with its round's end (the usual batch) is a debug line: the verdict line follows."""
        if receipt.get("accepted"):
            log.log(logging.DEBUG if verdict_follows else logging.INFO, "round %s: update received; round checks "
                    "pending", receipt.get("round"))
        else:
            log.warning("round %s: update rejected: %s", receipt.get("round"), receipt.get("reason"))

    def _books(self, message: dict) -> None:
        """Balance and pay earned over the job, as the ledger has them (a server from before sends only pay)."""
        if message.get("balance") is not None:
            self.summary.balance = message["balance"]
        if message.get("earned") is not None:
            self.summary.tokens_earned = float(message["earned"])

    def _round_end(self, message: dict) -> None:
        """The round's verdict for this client (after every check) and its balance."""
        status = message.get("status")
        paid = float(message.get("paid", 0.0))
        if message.get("earned") is None:
            self.summary.tokens_earned += paid
        self._books(message)
        if status == "valid":
            self.summary.accepted += 1
            log.info("round %s: update accepted%s; paid %.4g tokens; balance %.6g", message["round"],
                     "" if message.get("aggregated", True) else " but not aggregated", paid, self.summary.balance)
        elif status in ("rejected", "failed"):
            self.summary.rejected += status == "rejected"
            log.warning("round %s: update %s: %s; paid 0; balance %.6g", message["round"], status,
                        message.get("reason"), self.summary.balance)
        else:
            log.info("round %s: not selected; balance %.6g", message["round"], self.summary.balance)

    async def _evaluate(self, task: dict) -> None:
        acc = self._user(evaluate, {k: np.asarray(v) for k, v in task["weights"].items()}, self._data.x_test,
                         self._data.y_test, self.train_spec.model, self.num_classes)["accuracy"]
        await self.rpc.call("evaluate", {"client_id": self.client_id, "accuracy": acc})
        self.summary.evaluated = True
        log.info("final model: accuracy %.4f on this client's test split (reported)", acc)


def _training():
    """The training module (torch): imported by the first _prepare, in a worker thread."""
    from mlsyskit.tools.fl import training

    return training


def _same_weights(a: dict, b: dict) -> bool:
    """The same model, array for array (dtype, shape and values; a NaN never matches)."""
    return a.keys() == b.keys() and all(np.asarray(a[k]).dtype == np.asarray(b[k]).dtype
                                        and np.array_equal(a[k], b[k]) for k in a)
