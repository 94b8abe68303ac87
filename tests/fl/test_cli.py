"""fl-server simulate/report/certs through the CLI; one-line errors, exit 2 for usage errors and 1 for
runtime failures."""
from __future__ import annotations

import json
import warnings

import pytest
from conftest import invoke_cli

from mlsyskit.tools.fl.client_cli import app as client_app
from mlsyskit.tools.fl.config import DataSpec
from mlsyskit.tools.fl.partition import write_partition
from mlsyskit.tools.fl.server_cli import app as server_app


def parts(tmp_path):
    """A digits partition for 2 clients: server/ (validation, test) and client-0/, client-1/."""
    out = tmp_path / "parts"
    if not out.exists():
        write_partition(DataSpec(num_clients=2), out)
    return out


def simulate(run_dir, strategy):
    return invoke_cli(server_app, ["simulate", "--strategy", strategy, "--clients", "20", "--per-round", "5",
                                      "--rounds", "8", "--malicious-fraction", "0.3", "--seed", "2", "--run-dir", str(run_dir),
                                      "--json"])


def test_simulate_then_report_against_the_default(tmp_path):
    tiff, default = simulate(tmp_path / "tiff", "tiff"), simulate(tmp_path / "default", "fedavg")
    assert tiff.exit_code == 0 and default.exit_code == 0, tiff.output + default.output
    summary = json.loads(tiff.stdout)
    assert summary["rounds"] == 8 and summary["malicious_providers"] == 6 and abs(summary["ledger_total"]) < 1e-9
    result = invoke_cli(server_app, ["report", "--run-dir", str(tmp_path / "tiff"), "--baseline",
                                        str(tmp_path / "default"), "--out", str(tmp_path / "plots"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["malicious_tokens_vs_baseline"] < 1.0 < report["honest_tokens_vs_baseline"]
    assert set(report["consumers"]) == {str(i) for i in range(20)}
    assert all(0 <= c["trr"] <= 1 for c in report["consumers"].values())
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "tokens.png").stat().st_size > 1000
    # a second simulate into the same directory with another seed is refused, not mixed in
    other = invoke_cli(server_app, ["simulate", "--strategy", "tiff", "--clients", "20", "--per-round", "5",
                                       "--rounds", "8", "--seed", "3", "--run-dir", str(tmp_path / "tiff")])
    assert other.exit_code == 2 and "different" in other.output
    fresh = invoke_cli(server_app, ["simulate", "--strategy", "tiff", "--clients", "20", "--per-round", "5",
                                       "--rounds", "3", "--seed", "3", "--run-dir", str(tmp_path / "tiff"), "--fresh",
                                       "--json"])
    assert fresh.exit_code == 0 and json.loads(fresh.stdout)["rounds"] == 3


def test_bad_input_gives_one_line_errors(tmp_path):
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    val = ["--validation", str(parts(tmp_path) / "server")]
    data = ["--data", str(parts(tmp_path) / "client-0")]
    (tmp_path / "client.toml").write_text(f'client_id = 1\nattack = "evil"\ndata = "{data[1]}"\n')
    (tmp_path / "typo.toml").write_text(f'client_id = 1\nreconect_s = 5\ndata = "{data[1]}"\n')
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    cases = [
        (server_app, ["simulate", "--clients", "10", "--per-round", "20", "--run-dir", str(tmp_path / "a")],
         "per_round must be in [1, clients=10]"),
        (server_app, ["simulate", "--dataset", "cifar", "--run-dir", str(tmp_path / "b")], "dataset must be one of"),
        (server_app, ["simulate", "--clients", "500", "--per-round", "5", "--run-dir", str(tmp_path / "c")],
         "cannot give 500 clients"),
        (server_app, ["report", "--run-dir", str(tmp_path / "nothing")], "holds no FL run"),
        (server_app, ["run", *val, "--tls-cert", str(tmp_path / "x.pem"), "--run-dir", str(tmp_path / "d")],
         "--tls-cert and --tls-key go together"),
        (server_app, ["run", *val, "--token-file", str(tmp_path / "missing"), "--run-dir", str(tmp_path / "e")],
         "cannot read token file"),
        (client_app, ["run", "--client-id", "0", *data, "--attack", "evil"], "--attack must be one of"),
        (client_app, ["run", "--server", "127.0.0.1:1"], "--client-id is required"),
        (client_app, ["run", "--config", str(tmp_path / "client.toml")], "--attack must be one of"),
        (client_app, ["run", "--config", str(tmp_path / "typo.toml")], "reconect_s"),
        (client_app, ["run", "--client-id", "0", *data, "--certs", str(tmp_path / "no-certs")], "fl-server certs"),
        (server_app, ["run", *val, "--certs", str(tmp_path / "no-certs"), "--run-dir", str(tmp_path / "j")],
         "fl-server certs"),
        (server_app, ["simulate", "--strategy", "nope", "--run-dir", str(tmp_path / "k")], "fedavg"),
        (server_app, ["simulate", "--malicious-fraction", "1.5", "--run-dir", str(tmp_path / "l")],
         "--malicious-fraction and --dropout must be in [0, 1)"),
        (server_app, ["certs", str(tmp_path / "certs"), "--clients", "2", "--client", "7"], "not both"),
        (server_app, ["certs", str(tmp_path / "certs"), "--ip", "not-an-ip"], "--ip"),
        (client_app, ["run", "--client-id", "0", *data, "--server", "localhost"], "--server must be HOST:PORT"),
        (server_app, ["run", *val, "--address", "nonsense", "--run-dir", str(tmp_path / "g")],
         "--address must be HOST:PORT"),
        (server_app, ["run", *val, "--address", "127.0.0.1:99999", "--run-dir", str(tmp_path / "h")],
         "port in 0..65535"),
        (client_app, ["run", "--client-id", "0", *data, "--token-file", str(empty)], "is empty"),
        (server_app, ["run", *val, "--token-file", str(empty), "--run-dir", str(tmp_path / "f")], "is empty"),
        (client_app, ["run", "--client-id", "0", *data, "--tls-ca", str(tmp_path / "no-ca.pem")],
         "cannot read TLS CA"),
        # a party's own data and model (issue 21): bad specs are usage errors naming the flag and target
        (client_app, ["run", "--client-id", "0"], "--data is required"),
        (client_app, ["run", "--client-id", "0", "--data", str(tmp_path / "nowhere")], "no such file or folder"),
        (client_app, ["run", "--client-id", "0", "--data", str(tmp_path / "bad.npz")], "cannot read it as .npz"),
        (client_app, ["run", "--client-id", "0", "--data", "no_such_module:load"], "cannot import no_such_module"),
        (client_app, ["run", "--client-id", "0", *data, "--model", "no_such_module:net"],
         "--model 'no_such_module:net': cannot import"),
        (server_app, ["run", "--validation", str(tmp_path / "nowhere"), "--run-dir", str(tmp_path / "n")],
         "--validation"),
        (server_app, ["run", *val, "--classes", "3", "--run-dir", str(tmp_path / "o")], "--classes 3 is fewer"),
        (server_app, ["partition", "--dataset", "digits", "--clients", "900", "--out", str(tmp_path / "p")],
         "cannot give 900 clients"),
    ]
    for app, args, message in cases:
        result = invoke_cli(app, args)
        assert result.exit_code == 2, (args, result.output)  # usage errors
        assert message in " ".join(result.output.split()), (args, result.output)  # rich wraps long lines
        assert "Traceback" not in result.output


def test_errors_in_user_code_are_one_line_naming_the_target_exit_1_and_v_shows_the_traceback(tmp_path):
    cases = [
        (server_app, ["simulate", "--dataset", "tests.fl.user_code:raising_loader", "--run-dir", str(tmp_path / "a")],
         "--dataset 'tests.fl.user_code:raising_loader' raised RuntimeError: the dataset server is down"),
        (server_app, ["simulate", "--model", "tests.fl.user_code:raising_model", "--clients", "4", "--per-round",
                      "2", "--rounds", "1", "--run-dir", str(tmp_path / "b")],
         "--model 'tests.fl.user_code:raising_model' raised TypeError: unsupported layer"),
        (client_app, ["run", "--client-id", "0", "--data", "tests.fl.user_code:raising_client_data"],
         "--data 'tests.fl.user_code:raising_client_data' raised KeyError: 'y'"),
    ]
    for app, args, message in cases:
        result = invoke_cli(app, args)
        assert result.exit_code == 1, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)
        assert "Traceback" not in result.output
        verbose = invoke_cli(app, [*args, "-v"])
        assert verbose.exit_code == 1 and "Traceback" in verbose.output, verbose.output
    # a loader's arrays that do not fit the task are refused before any connection: the data, not the code
    result = invoke_cli(client_app, ["run", "--client-id", "0", "--data", "tests.fl.user_code:own_arrays",
                                     "--model", "tests.fl.user_code:nothing_here"])
    assert result.exit_code == 2 and "has no attribute 'nothing_here'" in result.output


@pytest.mark.slow
def test_runtime_failures_exit_1(tmp_path):
    """Valid requests that cannot be carried out: too few clients, no server, a server that refuses."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        (tmp_path / "token").write_text("secret")
        cases = [
            (server_app, ["run", "--validation", str(parts(tmp_path) / "server"), "--clients", "2", "--per-round",
                          "1", "--address", "127.0.0.1:0", "--run-dir", str(tmp_path / "i"),
                          "--registration-timeout", "0.5"],
             "only 0 of the 2 clients a round needs were available"),
            (server_app, ["run", "--validation", str(parts(tmp_path) / "server"), "--address", f"127.0.0.1:{taken}",
                          "--run-dir", str(tmp_path / "m")],
             "cannot listen"),
            (client_app, ["run", "--client-id", "0", "--data", str(parts(tmp_path) / "client-0"), "--server",
                          f"127.0.0.1:{_free_port()}", "--reconnect", "0.3"],
             "no server at"),
        ]
        for app, args, message in cases:
            result = invoke_cli(app, args)
            assert result.exit_code == 1, (args, result.output)
            assert message in " ".join(result.output.split()), (args, result.output)
            assert "Traceback" not in result.output


def _free_port() -> int:
    from tests.conftest import free_port

    return free_port()


def test_certs_writes_a_ca_server_and_client_pairs_and_extends_them(tmp_path):
    result = invoke_cli(server_app, ["certs", str(tmp_path / "c"), "--clients", "2", "--host", "fl.local",
                                        "--ip", "10.0.0.5", "--days", "3", "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(result.stdout)
    assert set(written["clients"]) == {"0", "1"}
    again = invoke_cli(server_app, ["certs", str(tmp_path / "c"), "--client", "7", "--json"])
    assert again.exit_code == 0 and set(json.loads(again.stdout)["clients"]) == {"7"}
    assert {p.name for p in (tmp_path / "c").iterdir()} == {
        "ca.pem", "ca.key", "server.pem", "server.key", "client-0.pem", "client-0.key", "client-1.pem",
        "client-1.key", "client-7.pem", "client-7.key"}
    from cryptography import x509

    server = x509.load_pem_x509_certificate((tmp_path / "c" / "server.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["fl.local"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]


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
        result = invoke_cli(server_app, ["report", "--run-dir", str(tmp_path / "run"), "--out",
                                            str(tmp_path / "plots"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout, parse_constant=no_nan)
    assert report["rounds"] == 0 and report["final_accuracy"] is None
    assert report["honest_providers"] == 1 and report["tokens_per_honest_provider"] == 0.0
    assert report["tokens_per_malicious_provider"] is None
