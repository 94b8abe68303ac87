"""ops/entry.py, the entry of the node, proxy and supervisor processes (in-process: no process is
started here; every cluster test starts its nodes through it): it takes the command lines that
record.process_argv writes and reports errors as the CLI does."""
from __future__ import annotations

import sys

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.kv.ops import entry, launcher
from mlsyskit.tools.kv.ops.record import process_argv


def test_the_recorded_command_lines_start_through_the_entry_and_parse(tmp_path) -> None:
    record = {"data_dir": str(tmp_path), "map": {"nodes": {"s0r0": {}}}}
    for name, command in (("node:s0r0", "node"), ("proxy", "proxy"), ("supervisor", "supervise")):
        argv = process_argv(record, name)
        assert argv[:len(launcher.ENTRY)] == launcher.ENTRY
        args = entry._parser().parse_args(argv[len(launcher.ENTRY):])
        assert args.command == command and str(args.data_dir) == str(tmp_path)
    assert entry._parser().parse_args(["node", "s0r0", "--data-dir", "d"]).node_id == "s0r0"


def test_errors_are_one_line_with_the_cli_exit_codes(tmp_path, monkeypatch, capsys) -> None:
    with pytest.raises(ConfigError, match="no cluster recorded"):
        entry.run(["node", "s0r0", "--data-dir", str(tmp_path)])
    monkeypatch.setattr(sys, "argv", ["entry", "proxy", "--data-dir", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        entry.main()
    assert exit_.value.code == 2 and "error: no cluster recorded" in capsys.readouterr().err
    for bad in (["frob"], ["supervise", "--data-dir", str(tmp_path)], ["node"]):  # usage: argparse's exit 2
        with pytest.raises(SystemExit) as exit_:
            entry.run(bad)
        assert exit_.value.code == 2
