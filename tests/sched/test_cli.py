import json

from typer.testing import CliRunner

from mlsyskit.tools.sched.cli import app

runner = CliRunner()


def test_sim_writes_json_plots_and_a_deterministic_document(tmp_path):
    args = ["sim", "-w", "workload-1", "--policies", "fifo,marble", "--seeds", "2", "--json"]
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert set(doc["policies"]) == {"fifo", "marble"}
    assert set(doc["policies"]["marble"]["seeds"]) == {"0", "1"}
    for name in ("results.json", "timing.json", "jct_cdf.png", "utilisation.png"):
        assert (tmp_path / "a" / name).stat().st_size > 0
    second = runner.invoke(app, [*args, "--out", str(tmp_path / "b")])
    assert second.exit_code == 0 and json.loads(second.stdout) == doc
    assert (tmp_path / "a" / "results.json").read_text() == (tmp_path / "b" / "results.json").read_text()


def test_sim_table_and_event_log(tmp_path):
    res = runner.invoke(app, ["sim", "-w", "synthetic:60@0.7", "--cluster", "4x6", "--policies", "marble-elastic",
                              "--out", str(tmp_path), "--events"])
    assert res.exit_code == 0, res.output
    assert "marble-elastic" in res.stdout
    lines = (tmp_path / "events-marble-elastic-seed0.jsonl").read_text().splitlines()
    assert sum('"kind": "finish"' in line for line in lines) == 60


def test_user_mistakes_are_one_line_errors():
    for args, message in [
        (["sim", "-w", "workload-1", "--cluster", "16by6"], "NODESxGPUS"),
        (["sim", "-w", "workload-1", "--policies", "lsf"], "unknown policy lsf"),
        (["sim", "-w", "nope.csv"], "workload not found"),
        (["sim", "-w", "workload-1", "--cluster", "1x6"], "more GPUs than the cluster has"),
        (["sim", "-w", "workload-1", "--threshold", "7"], "efficiency_threshold"),
        (["sim", "-w", "workload-1", "--pressure-threshold", "-1"], "pressure_threshold"),
        (["curve", "--app", "gpt", "--batch", "8"], "unknown application"),
        (["curve", "--app", "ncf", "--batch", "8", "--threshold", "5"], "efficiency_threshold"),
        (["sim", "-w", "workload-1", "--out", "/proc/no/such/dir"], "cannot create --out"),
    ]:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output and "Traceback" not in res.output


def test_model_and_curve_commands():
    res = runner.invoke(app, ["model", "--json"])
    assert res.exit_code == 0
    rows = json.loads(res.stdout)
    assert {r["app"] for r in rows} == {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}
    res = runner.invoke(app, ["curve", "--app", "ncf", "--batch", "32768", "--json"])
    assert json.loads(res.stdout)["marble_gpus"] == 1
    # yolov3 at batch 64 (measured): gains 1, 0.89, -0.04, 1.15 single GPUs. The envelope from 2
    # GPUs goes to 4 at 0.555 per GPU: kept at threshold 0.5, not at the pressure threshold 0.8.
    res = runner.invoke(app, ["curve", "--app", "yolov3", "--batch", "64", "--max-gpus", "4", "--json"])
    doc = json.loads(res.stdout)
    assert (doc["marble_gpus"], doc["marble_gpus_under_pressure"]) == (4, 2)


def test_policies_lists_every_registered_policy():
    res = runner.invoke(app, ["policies", "--json"])
    assert res.exit_code == 0
    assert sorted(json.loads(res.stdout)) == ["backfill", "fifo", "marble", "marble-elastic", "optimus", "tiresias"]
