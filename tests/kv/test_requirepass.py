"""`bespokv up --requirepass`: real processes refuse clients until AUTH; the CLI's own calls authenticate."""
from __future__ import annotations

import json
import socket
import stat

import hiredis
import psutil
import pytest

from mlsyskit.core.cli import load_command_config
from mlsyskit.core.config import ConfigError
from mlsyskit.core.net import free_range
from mlsyskit.tools.kv.client.call import call
from mlsyskit.tools.kv.ops.processes import ClusterSpec, read_password
from tests.kv.conftest import down_if_recorded
from tests.kv.test_cli import cli

PASSWORD = "s3cret pass-é"  # a space and a non-ASCII letter: bytes on the wire as in the file


def raw(port: int, *commands: tuple[bytes, ...]) -> list:
    """Send the commands on one fresh connection; the replies in order (errors as ReplyError)."""
    reader = hiredis.Reader()
    replies: list = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"".join(hiredis.pack_command(c) for c in commands))
        while len(replies) < len(commands):
            while (reply := reader.gets()) is False:
                data = s.recv(65536)
                assert data, "the server closed the connection"
                reader.feed(data)
            replies.append(reply)
    return replies


@pytest.fixture
def cluster_dir(tmp_path):
    yield tmp_path / "cluster"
    down_if_recorded(tmp_path / "cluster")


@pytest.mark.slow
def test_requirepass_cluster_refuses_until_auth_and_the_cli_authenticates(cluster_dir) -> None:
    d = str(cluster_dir)
    base = free_range(1 + 2)
    # Through the shared CLI surface's env var: the password is on no command line at all.
    cli("up", "--replicas", "2", "--base-port", str(base), "--data-dir", d,
        env={"MLSYSKIT_BESPOKV_UP_REQUIREPASS": PASSWORD})
    secret_file = cluster_dir / "requirepass"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert read_password(cluster_dir) == PASSWORD.encode()
    assert PASSWORD not in (cluster_dir / "cluster.json").read_text()
    record = json.loads((cluster_dir / "cluster.json").read_text())
    for p in record["processes"]:
        assert not any(PASSWORD in arg for arg in psutil.Process(p["pid"]).cmdline()), p["name"]

    node_port = base + 1
    for port in (base, node_port):  # the proxy and a node
        refused, = raw(port, (b"SET", b"k", b"v"))
        assert isinstance(refused, hiredis.ReplyError) and str(refused).startswith("NOAUTH")
        wrong, after = raw(port, (b"AUTH", b"not-it"), (b"GET", b"k"))
        assert str(wrong).startswith("WRONGPASS") and str(after).startswith("NOAUTH")
        ok, written, read = raw(port, (b"AUTH", PASSWORD.encode()), (b"SET", b"k", b"v"), (b"GET", b"k"))
        assert (ok, written, read) == (b"OK", b"OK", b"v")
    with pytest.raises(ConnectionError, match="NOAUTH"):
        call("127.0.0.1", node_port, "INFO")

    # The CLI reads the password file of --data-dir ...
    assert cli("put", "city", "Lyon", "--data-dir", d).stdout.strip() == "OK"
    assert cli("get", "city", "--data-dir", d).stdout.strip() == "Lyon"
    status = json.loads(cli("status", "--data-dir", d, "--json").stdout)
    assert len(status) == 3 and all(row["up"] for row in status)
    bench = json.loads(cli("bench", "--keys", "50", "--ops", "200", "--clients", "2", "--data-dir", d,
                           "--json").stdout)
    assert bench["errors"] == 0 and bench["ops_per_s"] > 0
    # ... or takes --password / the env var when it finds the cluster by address.
    addr = ["--host", "127.0.0.1", "--port", str(base), "--data-dir", str(cluster_dir.parent / "elsewhere")]
    assert cli("get", "city", *addr, env={"MLSYSKIT_BESPOKV_PASSWORD": PASSWORD}).stdout.strip() == "Lyon"
    assert cli("get", "city", *addr, "--password", PASSWORD).stdout.strip() == "Lyon"
    wrong = cli("get", "city", *addr, "--password", "not-it", check=False)
    assert wrong.returncode == 1 and "WRONGPASS" in wrong.stderr and "Traceback" not in wrong.stderr
    missing = cli("put", "city", "Paris", *addr, check=False)
    assert missing.returncode == 1 and "NOAUTH" in missing.stderr
    assert cli("get", "city", "--data-dir", d).stdout.strip() == "Lyon"


def test_requirepass_config_key_and_validation(tmp_path) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text(f'requirepass = "{PASSWORD}"\nreplicas = 2\n', encoding="utf-8")
    spec = load_command_config(ClusterSpec, config, {"requirepass": None})
    assert spec.requirepass == PASSWORD and spec.replicas == 2
    for bad in ("", "two\nlines", "x" * 513):
        with pytest.raises(ConfigError, match="requirepass"):
            ClusterSpec(requirepass=bad)
