"""What the supervisor does about one process of a cluster: the pure decision, on an injected clock.

Each poll the supervisor observes every supervised process (running, stopped by SIGSTOP, or
gone) and, for a node, whether the coordinator's current map holds it (None: the coordinator did
not answer). `RestartPolicy.decide` answers with an `Action`:

  node gone, absent from the map     RESTART_EMPTY: failed over, so the survivors hold the state;
                                     the replacement starts empty and copies it (recovery mode);
                                     WAIT while no other replica of its shard runs (nothing to copy
                                     from: the last one is restarted with its data first, see below)
  node gone, still in the map        WAIT until it has been gone for `grace_s` (its failover is
                                     pending), then RESTART_KEEP: the coordinator kept it (the last
                                     replica of its shard), so its own data is the state
  node gone, map unknown             WAIT (the coordinator is unreachable; a node cannot start)
  node stopped, absent > grace_s     KILL_RESTART: its place was taken; it must not resume as an
                                     old incarnation holding the port
  node stopped, in the map / < grace LEAVE (a pause the coordinator has not acted on, or a short one)
  node running, absent               LEAVE: partitioned or rejoining; it rejoins by itself
  proxy or coordinator gone          RESTART_KEEP at once (no data of their own to recover)
  node whose redis-server is down    WAIT: the store is restarted first (a node cannot start without it)
  redis-server gone                  RESTART_KEEP at once; its node fail-stopped when it went (see
                                     datalets/redis_store.py), and a replacement flushes it anyway
  redis-server stopped, node gone    KILL_RESTART: the node fail-stopped on it, and a replacement
                                     cannot start against a stopped store

Crash-loop protection: at most `max_restarts` restarts of one process per `window_s`; the next
restart it needs is refused with GIVE_UP (once; GIVEN_UP afterwards). Between restarts of one
process it backs off: the k-th restart within the window waits backoff_s x 2^(k-1) (capped at
backoff_max_s) after the previous one; the first is immediate.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from mlsyskit.core.config import require


class Seen(Enum):
    RUNNING = "running"
    STOPPED = "stopped"  # SIGSTOPped (psutil status 'stopped')
    GONE = "gone"  # exited, killed, a zombie, or the pid now belongs to another process


class Action(Enum):
    LEAVE = "leave"
    WAIT = "wait"
    RESTART_EMPTY = "restart-empty"
    RESTART_KEEP = "restart-keep"
    KILL_RESTART = "kill-restart"
    GIVE_UP = "give-up"
    GIVEN_UP = "given-up"

    @property
    def restarts(self) -> bool:
        return self in (Action.RESTART_EMPTY, Action.RESTART_KEEP, Action.KILL_RESTART)


@dataclass(frozen=True)
class Decision:
    action: Action
    why: str


@dataclass(frozen=True)
class PolicyConfig:
    grace_s: float  # 2 x the failure timeout
    max_restarts: int = 5
    window_s: float = 60.0
    backoff_s: float = 1.0
    backoff_max_s: float = 16.0

    def __post_init__(self) -> None:
        require(self.grace_s > 0, "the supervisor's grace must be positive")
        require(self.max_restarts >= 1 and self.window_s > 0, "--max-restarts >= 1 and --restart-window > 0")
        require(0 <= self.backoff_s <= self.backoff_max_s, "0 <= backoff <= backoff max")


@dataclass
class _Track:
    restarts: deque = field(default_factory=deque)  # times of restarts within the window
    gone_since: float | None = None
    absent_since: float | None = None
    given_up: bool = False


class RestartPolicy:
    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._tracks: dict[str, _Track] = {}

    def given_up(self, name: str) -> bool:
        return self._tracks.get(name, _Track()).given_up

    def decide(self, name: str, seen: Seen, in_map: bool | None, now: float, is_node: bool = True,
               survivor: bool = True, partner_running: bool = True) -> Decision:
        """The action for process `name` observed as `seen` at `now` (in_map: None = unknown;
        survivor: another replica of its shard in the map has a running process; partner_running: for
        a node, its redis-server runs (True without one); for a redis-server, its node runs)."""
        t = self._tracks.setdefault(name, _Track())
        t.gone_since = (t.gone_since if t.gone_since is not None else now) if seen is Seen.GONE else None
        if in_map is False:
            t.absent_since = t.absent_since if t.absent_since is not None else now
        elif in_map is True:
            t.absent_since = None
        if not is_node and name.startswith("redis:") and seen is Seen.STOPPED and not partner_running:
            want = Decision(Action.KILL_RESTART, "stopped while its node is gone (the node fail-stopped on it)")
        else:
            want = self._wanted(t, seen, in_map, now, is_node)
        if want.action in (Action.RESTART_EMPTY, Action.KILL_RESTART) and is_node and not survivor:
            return Decision(Action.WAIT, "no other replica of its shard runs: nothing to copy the state from")
        if want.action.restarts and is_node and not partner_running:
            return Decision(Action.WAIT, "its redis-server is not running: it is restarted first")
        if not want.action.restarts:
            return want
        if t.given_up:
            return Decision(Action.GIVEN_UP, "gave up earlier (crash loop)")
        while t.restarts and now - t.restarts[0] >= self.config.window_s:
            t.restarts.popleft()
        if len(t.restarts) >= self.config.max_restarts:
            t.given_up = True
            return Decision(Action.GIVE_UP, f"{len(t.restarts)} restarts within {self.config.window_s:g} s "
                                            f"(crash loop); not restarting it again")
        if t.restarts:
            wait = min(self.config.backoff_s * 2 ** (len(t.restarts) - 1), self.config.backoff_max_s)
            if now < t.restarts[-1] + wait:
                return Decision(Action.WAIT, f"backing off {wait:g} s after restart {len(t.restarts)}")
        return want

    def restarted(self, name: str, now: float) -> None:
        """Record a restart made at `now` (the caller acted on a restarting decision)."""
        t = self._tracks.setdefault(name, _Track())
        t.restarts.append(now)
        t.gone_since = t.absent_since = None

    def _wanted(self, t: _Track, seen: Seen, in_map: bool | None, now: float, is_node: bool) -> Decision:
        grace = self.config.grace_s
        if not is_node:
            return (Decision(Action.RESTART_KEEP, "process gone") if seen is Seen.GONE
                    else Decision(Action.LEAVE, seen.value))
        absent_for = now - t.absent_since if t.absent_since is not None else 0.0
        if seen is Seen.RUNNING:
            return Decision(Action.LEAVE, "running" if in_map is not False else
                            "running but absent from the map (partitioned or rejoining: it rejoins by itself)")
        if seen is Seen.STOPPED:
            if in_map is False and absent_for >= grace:
                return Decision(Action.KILL_RESTART, f"stopped and absent from the map for {absent_for:.1f} s "
                                                     f"(its place was taken)")
            return Decision(Action.LEAVE, "stopped (paused), not yet replaced")
        if in_map is False:
            return Decision(Action.RESTART_EMPTY, "process gone and failed over")
        if in_map is None:
            return Decision(Action.WAIT, "process gone; the coordinator does not answer")
        gone_for = now - t.gone_since
        if gone_for >= grace:
            return Decision(Action.RESTART_KEEP, f"process gone for {gone_for:.1f} s and still in the map "
                                                 f"(not failed over: it keeps its data)")
        return Decision(Action.WAIT, "process gone; waiting for its failover")
