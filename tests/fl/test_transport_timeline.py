"""bench_fl_transport --timeline: the per-round medians it reports come from the marks as written."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "flbench" / "timeline.py"


@pytest.fixture(scope="module")
def timeline():
    return load_script(SCRIPT, "flbench_timeline")


def _write(folder: Path, role: str, marks: list[tuple[float, str, float]]) -> None:
    with (folder / f"{role}.tsv").open("a") as f:
        for t, name, cpu in marks:
            f.write(f"{t:.6f}\t{role}\t{name}\t{cpu:.6f}\n")


def test_the_rounds_steps_and_client_cpu_are_the_marks_medians(tmp_path, timeline):
    rounds = 6  # rounds 3..5 are summarised (each from its start to the next one's)
    _write(tmp_path, "ours-server", [(r * 1.0, "begin_round>", 0.0) for r in range(1, rounds + 1)]
           + [(r * 1.0 + 0.5 + 0.01 * r, "submit<", 0.0) for r in range(1, rounds + 1)])
    for cid, delay in ((0, 0.001), (1, 0.020)):  # client 1 gets its task 20 ms in, trains 10 ms
        role, cpu, marks = f"ours-client{cid}", 0.0, []
        for r in range(1, rounds + 1):
            t = r * 1.0 + delay
            marks += [(t, "c.decode<", cpu), (t + 0.001, "train>", cpu), (t + 0.011, "train<", cpu + 0.004),
                      (t + 0.012, "c.update<", cpu + 0.0045)]
            cpu += 0.006  # 1.5 ms more before the next training
        _write(tmp_path, role, marks)
    got = timeline.summarise(tmp_path, "ours")
    assert got["first client has its task"] == pytest.approx(1.0)
    assert got["last client has its task"] == pytest.approx(20.0)
    assert got["last training ends"] == pytest.approx(31.0)
    assert got["server has the last update"] == pytest.approx(540.0)  # rounds 3, 4, 5: 530, 540, 550 ms
    assert got["next round starts"] == pytest.approx(1000.0)
    assert got["client CPU: train_local"] == pytest.approx(4.0)
    assert got["client CPU: update out"] == pytest.approx(0.5)
    assert got["client CPU: waiting, round end, next task in"] == pytest.approx(1.5)


def test_a_process_runs_under_the_marks_with_its_own_interpreter(timeline):
    ours = timeline.launcher("/venv/bin/python", "ours-server", Path("/m"), ["/venv/bin/fl-server", "run"])
    flower = timeline.launcher("/venv/bin/python", "flower-client3", Path("/m"), ["/flwr/bin/python", "c.py", "x"])
    assert ours == ["/venv/bin/python", str(SCRIPT), "ours-server", "/m", "/venv/bin/fl-server", "run"]
    assert flower == ["/flwr/bin/python", str(SCRIPT), "flower-client3", "/m", "c.py", "x"]
