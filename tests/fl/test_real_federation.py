"""README "Run a real federation", run as written with real processes: `fl-server partition`, `fl-server
certs`, `fl-server run` and three `fl-client run --data fed/client-K` over mutual TLS, then `fl-server report`.
Every process runs with an audit hook (audit_site/sitecustomize.py) that logs each file opened under the
federation's folder: the server's process opens its validation set and never a file in a client's folder,
and each client opens only its own folder."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.incentive.ledger import Ledger
from tests.conftest import VENV_BIN, free_port

pytestmark = pytest.mark.slow  # real server and client processes

REPO = Path(__file__).resolve().parents[2]


def readme_block(title: str) -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index(f"### {title}"):]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_readme_federation_runs_and_the_server_never_opens_a_clients_data(tmp_path):
    script = readme_block("Run a real federation")
    assert "fl-server partition" in script and "--data fed/client-$k" in script
    port = free_port()
    audit = tmp_path / "opened.tsv"
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "audit_site"), os.environ.get("PYTHONPATH", "")]),
           "FL_AUDIT_LOG": str(audit), "FL_AUDIT_WATCH": str(tmp_path / "fed"),
           # the README's commands use the default address; the test's server listens on a free port instead
           "MLSYSKIT_FL_SERVER_RUN_ADDRESS": f"127.0.0.1:{port}", "MLSYSKIT_FL_CLIENT_RUN_SERVER": f"127.0.0.1:{port}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240, start_new_session=True)
    assert done.returncode == 0, done.stderr[-3000:]
    at = done.stderr.find("Traceback")
    assert at < 0, done.stderr[max(0, at - 400):at + 3000]
    assert "final_accuracy" in done.stdout  # the report's table

    with MetaStore(tmp_path / "fed" / "run" / "fl.db") as store:
        rounds = [r for _, r in store.read_log("fl_rounds")]
        total = Ledger(store).total()
        assert store.get("fl", "config")["data"]["dataset"] == "own"
    assert [r["round"] for r in rounds] == [1, 2, 3] and abs(total) < 1e-9
    assert all(r["reports"][c]["status"] == "valid" for r in rounds for c in r["reports"])
    assert rounds[-1]["global"]["accuracy"] > 0.5

    opened = [line.split("\t") for line in audit.read_text().splitlines()]
    server = [(cmd, path) for _, cmd, path in opened if " run " in f"{cmd} " and "fl-server" in cmd]
    assert any(path.endswith("server/validation.npz") for _, path in server), "the audit hook saw the server"
    assert not [path for _, path in server if "/client-" in path], "the server opened a client's file"
    for k in range(3):
        mine = {path for _, cmd, path in opened if "fl-client" in cmd and f"fed/client-{k}" in cmd
                and "/fed/client-" in path}  # data folders only (its certificate is in fed/certs)
        assert any(p.endswith(f"client-{k}/train.npz") for p in mine)
        assert all(f"/fed/client-{k}/" in p for p in mine), f"client {k} opened another client's file: {mine}"
