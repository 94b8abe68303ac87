"""The suite's xdist plan: costliest work first, the demo spread per test, the Ray files on one worker."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import xdist_plan


class FakeWorker:
    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def plan(collection: list[str], workers: int, monkeypatch, cost: dict[str, float]) -> list[list[list[str]]]:
    """Which tests each worker is sent at the start, unit by unit."""
    monkeypatch.setattr(xdist_plan, "COST_S", cost)
    config = SimpleNamespace(option=SimpleNamespace(tx=[f"{workers}*popen"], loadscopereorder=True, dist="loadfile"))
    config.getvalue = lambda name: getattr(config.option, name)
    sched = xdist_plan.make_scheduler(config, None)
    nodes = [FakeWorker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    return [[[collection[i] for i in unit] for unit in node.sent] for node in nodes]


def test_the_costliest_file_goes_first_whatever_its_number_of_tests(monkeypatch):
    collection = [f"tests/a.py::t{i}" for i in range(6)] + ["tests/b.py::slow"] + ["tests/c.py::x", "tests/c.py::y"]
    sent = plan(collection, 2, monkeypatch, {"tests/b.py": 200.0})
    assert sent[0][0] == ["tests/b.py::slow"]        # one 200 s test before six cheap ones
    assert sent[1][0] == [f"tests/a.py::t{i}" for i in range(6)]
    assert xdist_plan.make_scheduler(SimpleNamespace(getvalue=lambda name: "load"), None) is None


def test_demo_sections_spread_and_ray_files_share_a_worker(monkeypatch):
    demo = [f"tests/demo/test_demo.py::test_each[{s}]" for s in ("00", "10", "20")]
    ray = ["tests/fl/test_ray_backend.py::a", "tests/fl/test_ray_backend.py::b", "tests/fl/test_ray_local.py::c"]
    sent = plan([*demo, *ray], 4, monkeypatch, {"tests/demo/test_demo.py": 300.0, "tests/fl/test_ray_local.py": 90.0})
    units = [unit for node in sent for unit in node]
    assert sorted(units) == sorted([[d] for d in demo] + [ray])  # each section alone; the Ray files together
    assert all(len(node) == 1 for node in sent)                  # four workers, four units: one each


@pytest.mark.parametrize("nodeid", ["tests/x.py::t[a::b]", "tests/x.py::K::t"])
def test_a_plain_file_is_one_unit_whatever_its_node_ids(nodeid):
    sched = xdist_plan.CostFirstScheduling(SimpleNamespace(getvalue=lambda name: ["1*popen"]), None)
    assert sched._split_scope(nodeid) == "tests/x.py"
