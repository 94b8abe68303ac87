"""Live switch: the planner's rules (pure), and switches under load on real node processes with
the embedded coordinator: no lost acknowledged write, only retriable errors, linearizable from
each switch to a strong mode on (check/switchcheck.py), and the CLI's refusals."""
from __future__ import annotations

import asyncio
import json

import pytest

from mlsyskit.core.net import free_range
from mlsyskit.tools.kv.check.switchcheck import run_switches
from mlsyskit.tools.kv.coord.failover import PlanError, plan_switch
from mlsyskit.tools.kv.shardmap import layout
from tests.kv.conftest import down_if_recorded
from tests.kv.test_cli import cli


def test_plan_switch_keeps_replicas_and_bumps_the_epoch() -> None:
    m = layout("ms-ec", "memory", 2, 3, "127.0.0.1", list(range(7001, 7007)))
    s = plan_switch(m, "ms-sc")
    assert s.controlet == "ms-sc" and s.epoch == m.epoch + 1 and s.shards == m.shards and s.nodes == m.nodes
    with pytest.raises(PlanError, match="already runs ms-ec"):
        plan_switch(m, "ms-ec")
    assert plan_switch(m, "aa-ec").controlet == "aa-ec"
    assert plan_switch(layout("aa-ec", "memory", 1, 2, "127.0.0.1", [7001, 7002]), "ms-sc").controlet == "ms-sc"
    with pytest.raises(PlanError, match="unknown controlet"):
        plan_switch(m, "ms-xx")


# Two paths, four switches: ms-ec <-> ms-sc (positions carried, a lagging slave confirmed), and into
# and out of aa-ec ending in aa-sc (aligned, then gathered; checked linearizable). The tour of all 12
# transitions is scripts/bench_kv_faults.py --switch (too long for CI's budget).
@pytest.mark.slow
@pytest.mark.parametrize("modes", [["ms-ec", "ms-sc", "ms-ec"], ["ms-sc", "aa-ec", "aa-sc"]])
def test_switches_under_load_lose_nothing_and_are_linearizable_after_a_strong_switch(modes, tmp_path) -> None:
    result = asyncio.run(asyncio.wait_for(run_switches(modes, tmp_path, seed=1, segment_s=1.5), 180))
    assert [s["after"] for s in result["switches"]] == modes[1:]
    assert result["ops_ok"] >= 500  # the load really ran through the switches
    assert all(v is True for v in result["linearizable_after_switch"].values())
    assert len(result["linearizable_after_switch"]) == sum(m.endswith("-sc") for m in modes[1:])
    assert result["lost_acked_writes"] == 0 and result["phantoms"] == 0, result["lost"]
    assert result["non_retriable_errors"] == 0, result["error_samples"]
    assert result["valid"]


@pytest.mark.slow
def test_switch_cli_switches_a_cluster_and_refuses_what_it_cannot(tmp_path) -> None:
    d = str(tmp_path / "c")
    base = free_range(1 + 2)
    cli("up", "--replicas", "2", "--consistency", "eventual", "--base-port", str(base), "--data-dir", d, "-q")
    try:
        cli("put", "k", "v", "--data-dir", d)
        out = cli("switch", "--topology", "ms", "--consistency", "strong", "--data-dir", d, "--json")
        assert '"after": "ms-sc"' in out.stdout
        assert cli("get", "k", "--data-dir", d).stdout.strip() == "v"
        rows = json.loads(cli("status", "--data-dir", d, "--json").stdout)
        assert [(r["role"], r["epoch"], r["state"]) for r in rows] == [
            ("head", "2", "ready"), ("tail", "2", "ready"), ("proxy", "2", "ready")]
        cli("switch", "--topology", "aa", "--consistency", "eventual", "--data-dir", d)
        cli("put", "k2", "v2", "--data-dir", d)
        cli("switch", "--topology", "ms", "--consistency", "strong", "--data-dir", d)
        assert [cli("get", k, "--data-dir", d).stdout.strip() for k in ("k", "k2")] == ["v", "v2"]
        same = cli("switch", "--topology", "ms", "--consistency", "strong", "--data-dir", d, check=False)
        assert same.returncode == 2 and "already runs ms-sc" in same.stderr
    finally:
        down_if_recorded(d)


def test_the_strong_claim_ends_where_the_next_switch_begins() -> None:
    """A strong segment is checked only up to the start of the next switch: past it the store may already
    serve the next (eventual) mode. A write in flight at that moment becomes info, a read in flight is dropped;
    a stale read before the cutoff is still caught."""
    from mlsyskit.tools.kv.check.linearizability import check_history
    from mlsyskit.tools.kv.check.switchcheck import _until
    from mlsyskit.tools.kv.client.history import Event, History

    def ev(p, t, f, v, time):
        return Event(p, t, f, "s1k0", v, time)
    base = [ev(0, "invoke", "put", "a", 1.0), ev(0, "ok", "put", "a", 1.1),
            ev(1, "invoke", "put", "b", 2.0), ev(1, "ok", "put", "b", 2.1),
            ev(2, "invoke", "put", "c", 2.9)]  # in flight at the cutoff (3.0)
    stale_after = [ev(0, "invoke", "get", None, 3.2), ev(0, "ok", "get", "a", 3.3),  # the next mode's stale read
                   ev(2, "ok", "put", "c", 3.4)]
    kept = _until(base + stale_after, 3.0)
    assert [(e.process, e.type) for e in kept] == [(0, "invoke"), (0, "ok"), (1, "invoke"), (1, "ok"), (2, "invoke"),
                                                   (2, "info")]

    def linearizable(events):
        h = History(None)
        h.events = events
        return check_history(h).linearizable
    assert linearizable(kept)
    assert not linearizable(base[:4] + [ev(0, "invoke", "get", None, 2.5), ev(0, "ok", "get", "a", 2.6)])
    assert not linearizable(_until(base[:4] + [ev(0, "invoke", "get", None, 2.5), ev(0, "ok", "get", "a", 2.6)], 3.0))
