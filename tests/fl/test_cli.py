"""fl-server simulate/report through the CLI, and clear one-line errors for bad input."""
from __future__ import annotations

import json
import warnings

from typer.testing import CliRunner

from mlsyskit.tools.fl.client_cli import app as client_app
from mlsyskit.tools.fl.server_cli import app as server_app

runner = CliRunner()


def simulate(run_dir, strategy):
    return runner.invoke(server_app, ["simulate", "--strategy", strategy, "--clients", "20", "--per-round", "5",
                                      "--rounds", "8", "--malicious", "0.3", "--seed", "2", "--run-dir", str(run_dir),
                                      "--json"])


def test_simulate_then_report_against_the_default(tmp_path):
    tiff, default = simulate(tmp_path / "tiff", "tiff"), simulate(tmp_path / "default", "fedavg")
    assert tiff.exit_code == 0 and default.exit_code == 0, tiff.output + default.output
    summary = json.loads(tiff.stdout)
    assert summary["rounds"] == 8 and summary["malicious_providers"] == 6 and abs(summary["ledger_total"]) < 1e-9
    result = runner.invoke(server_app, ["report", str(tmp_path / "tiff"), "--baseline", str(tmp_path / "default"),
                                        "--plots", str(tmp_path / "plots"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["malicious_tokens_vs_baseline"] < 1.0 < report["honest_tokens_vs_baseline"]
    assert set(report["consumers"]) == {str(i) for i in range(20)}
    assert all(0 <= c["trr"] <= 1 for c in report["consumers"].values())
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "tokens.png").stat().st_size > 1000
    # a second simulate into the same directory with another seed is refused, not mixed in
    other = runner.invoke(server_app, ["simulate", "--strategy", "tiff", "--clients", "20", "--per-round", "5",
                                       "--rounds", "8", "--seed", "3", "--run-dir", str(tmp_path / "tiff")])
    assert other.exit_code == 2 and "different" in other.output
    fresh = runner.invoke(server_app, ["simulate", "--strategy", "tiff", "--clients", "20", "--per-round", "5",
                                       "--rounds", "3", "--seed", "3", "--run-dir", str(tmp_path / "tiff"), "--fresh",
                                       "--json"])
    assert fresh.exit_code == 0 and json.loads(fresh.stdout)["rounds"] == 3


def test_bad_input_gives_one_line_errors(tmp_path):
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    cases = [
        (server_app, ["simulate", "--clients", "10", "--per-round", "20", "--run-dir", str(tmp_path / "a")],
         "per_round must be in [1, clients=10]"),
        (server_app, ["simulate", "--dataset", "cifar", "--run-dir", str(tmp_path / "b")], "dataset must be one of"),
        (server_app, ["simulate", "--clients", "500", "--per-round", "5", "--run-dir", str(tmp_path / "c")],
         "cannot give 500 clients"),
        (server_app, ["report", str(tmp_path / "nothing")], "holds no FL run"),
        (server_app, ["run", "--tls-cert", str(tmp_path / "x.pem"), "--run-dir", str(tmp_path / "d")],
         "--tls-cert and --tls-key go together"),
        (server_app, ["run", "--token-file", str(tmp_path / "missing"), "--run-dir", str(tmp_path / "e")],
         "cannot read token file"),
        (client_app, ["run", "--client-id", "0", "--malicious", "evil"], "--malicious must be one of"),
        (client_app, ["run", "--client-id", "0", "--server", "localhost"], "--server must be HOST:PORT"),
        (server_app, ["run", "--address", "nonsense", "--run-dir", str(tmp_path / "g")], "--address must be HOST:PORT"),
        (server_app, ["run", "--address", "127.0.0.1:99999", "--run-dir", str(tmp_path / "h")], "port in 0..65535"),
        (client_app, ["run", "--client-id", "0", "--token-file", str(empty)], "is empty"),
        (server_app, ["run", "--token-file", str(empty), "--run-dir", str(tmp_path / "f")], "is empty"),
        (server_app, ["run", "--clients", "2", "--per-round", "1", "--address", "127.0.0.1:0", "--run-dir",
                      str(tmp_path / "i"), "--registration-timeout", "0.5"], "only 0 of 2 clients connected"),
        (client_app, ["run", "--client-id", "0", "--tls-ca", str(tmp_path / "no-ca.pem")], "cannot read TLS CA"),
    ]
    for app, args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)  # rich wraps long lines
        assert "Traceback" not in result.output


def test_report_of_a_run_without_rounds_or_attackers_is_strict_json(tmp_path):
    """A server that gave up before round 1 (or a job without attackers) reports null, not NaN."""
    from mlsyskit.core.storage import MetaStore
    from mlsyskit.tools.fl.config import DataSpec, JobConfig
    from mlsyskit.tools.fl.coordinator import Coordinator

    (tmp_path / "run").mkdir()
    with MetaStore(tmp_path / "run" / "fl.db") as store:
        coordinator = Coordinator(JobConfig(rounds=2, per_round=1, data=DataSpec(num_clients=2)), store)
        coordinator.register(0, {"num_samples": 10, "local_only_accuracy": 0.5})

    def no_nan(constant):
        raise AssertionError(f"{constant} in JSON output")

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's "no artists with labels" on empty plots
        result = runner.invoke(server_app, ["report", str(tmp_path / "run"), "--plots", str(tmp_path / "plots"),
                                            "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout, parse_constant=no_nan)
    assert report["rounds"] == 0 and report["final_accuracy"] is None
    assert report["honest_providers"] == 1 and report["tokens_per_honest_provider"] == 0.0
    assert report["tokens_per_malicious_provider"] is None
