"""marble's client commands without the typer app (daemon/client_cli.py): its option table is the
typer app's, and every command line it takes reaches the command with exactly the options typer
would give it; every line it leaves (help, usage errors, anything unusual) goes to typer unchanged.
In-process: no daemon (the commands are replaced by recorders)."""
from __future__ import annotations

import inspect
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import typer

from mlsyskit.tools.sched.cli import app
from mlsyskit.tools.sched.daemon import client_cli, client_commands

ROOT = typer.main.get_command(app)
KINDS = {int: "int", str: "str", Path: "path", bool: "flag"}
CALLBACKS = {info.callback.__name__: info.callback for info in app.registered_commands}


def _kind(annotation) -> tuple[str, bool]:
    """(kind, many) of an annotation (X | None, list[X] | None)."""
    args = [a for a in typing.get_args(annotation) or (annotation,) if a is not type(None)]
    assert len(args) == 1, annotation
    many = typing.get_origin(args[0]) is list
    return KINDS[typing.get_args(args[0])[0] if many else args[0]], many


@pytest.mark.parametrize("command", sorted(client_cli.COMMANDS))
def test_the_option_table_is_the_typer_apps(command):
    """Against the typer command's own declaration (its signature: typer.Option/Argument and annotations)."""
    callback = CALLBACKS[command]
    hints = typing.get_type_hints(callback)
    declared = inspect.signature(callback).parameters
    table = {p.name: p for p in client_cli.COMMANDS[command]}
    assert list(declared) == list(table), "same parameters in the same order"
    assert [p.name for p in ROOT.commands[command].params if p.name != "help"] == list(table)
    for name, parameter in declared.items():
        info, p = parameter.default, table[name]
        positional = isinstance(info, typer.models.ArgumentInfo)
        assert (p.kind, p.many) == _kind(hints[name]), name
        assert p.flags == (() if positional else tuple(info.param_decls)), name
        assert p.envvar == info.envvar, name
        required = info.default is ...
        assert p.required == required and (required or p.default == info.default), name
        assert (p.lo, p.hi) == (info.min, info.max), name


def test_every_client_command_of_the_app_has_a_row_or_is_left_to_typer():
    left = set(ROOT.commands) - set(client_cli.COMMANDS)
    assert left == {"sim", "model", "curve", "policies", "adduser", "serve", "profile"}
    assert all(hasattr(client_commands, name) for name in client_cli.COMMANDS)


@pytest.fixture
def recorded(monkeypatch):
    """Replaces each client command by a recorder of what it was called with."""
    calls: list[tuple[str, dict]] = []
    for name in client_cli.COMMANDS:
        monkeypatch.setattr(client_commands, name, lambda _n=name, **kw: calls.append((_n, kw)))
    for key in [k for k in __import__("os").environ if k.startswith("MLSYSKIT_MARBLE")]:
        monkeypatch.delenv(key)
    return calls


def _typer_call(calls, argv) -> tuple[str, dict]:
    calls.clear()
    ROOT.main(args=list(argv), prog_name="marble", standalone_mode=False)
    assert len(calls) == 1
    return calls[0]


TAKEN = [
    ["queue"], ["queue", "--json"], ["status"], ["status", "7"], ["status", "--json", "7", "--state-dir", "/s"],
    ["nodes", "--addr", "127.0.0.1:5", "--token-file", "t", "--tls-ca", "ca.pem"],
    ["history"], ["history", "-u", "bob", "--all", "--limit", "10000", "--json"], ["history", "--limit", "1"],
    ["cancel", "3"], ["cancel", "3", "4", "5", "--json"], ["cancel", "--name", "sweep"], ["cancel", "-u", "bob"],
    ["cancel"],                                     # the command's own error (no ids), not a usage error
    ["logs", "12"], ["logs", "-f", "12", "--user-token-file", "/home/a/token"],
    ["submit", "--cmd", "python train.py --lr 0.1", "--app", "ncf", "--gpus", "8", "--min-gpus", "2",
     "--max-gpus", "8", "--name", "a b", "--batch-size", "512", "--time", "1:00:00", "--dependency", "afterok:3",
     "--array", "0-9", "--nodes", "2", "--workdir", "/w"],
    ["submit", "job.toml", "-G", "2.5", "-J", "x", "-t", "5", "-d", "afterok:1:2", "-a", "1,3", "-N", "1"],
    ["submit", "job.toml", "--json"],
]


@pytest.mark.parametrize("argv", TAKEN, ids=" ".join)
def test_a_plain_line_reaches_the_command_as_typer_would_pass_it(recorded, argv):
    parsed = client_cli.parse(argv)
    assert parsed is not None, "a plain client command line is run without typer"
    assert parsed == _typer_call(recorded, argv)


@pytest.mark.parametrize("env", [{"MLSYSKIT_MARBLE_STATE_DIR": "/from/env"},
                                 {"MLSYSKIT_MARBLE_ADDR": "h:1", "MLSYSKIT_MARBLE_USER_TOKEN_FILE": "/tok"}])
def test_environment_variables_as_typer_reads_them(recorded, monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for argv in (["queue"], ["status", "--state-dir", "/flag", "--addr", "x:2"], ["logs", "1"]):
        parsed = client_cli.parse(argv)
        assert parsed is not None and parsed == _typer_call(recorded, argv)


LEFT_TO_TYPER = [
    [], ["--help"], ["--version"], ["queue", "--help"], ["queue", "-h"], ["status", "--help", "3"], ["sim"],
    ["queue", "--bogus"], ["queue", "extra"], ["status", "abc"], ["status", "1", "2"], ["status", "-1"],
    ["status", "1.5"], ["status", "+3"], ["status", ""], ["logs"], ["logs", "x"], ["history", "--limit", "0"],
    ["history", "--limit", "10001"], ["history", "--limit"], ["history", "--limit=5"], ["queue", "--json=1"],
    ["queue", "--json", "--json"], ["submit", "--cmd"], ["submit", "--cmd", "-x"], ["submit", "-G4"],
    ["submit", "--name", ""], ["cancel", "1", "x"], ["queue", "--state-dir"], ["status", "--", "1"],
]


@pytest.mark.parametrize("argv", LEFT_TO_TYPER, ids=lambda a: " ".join(a) or "(none)")
def test_help_errors_and_anything_unusual_go_to_typer(recorded, argv):
    assert client_cli.parse(argv) is None
    assert client_cli.run(argv) is False and not recorded


def test_typers_own_environment_variables_and_completion_go_to_typer(recorded, monkeypatch):
    monkeypatch.setenv("MLSYSKIT_MARBLE_QUEUE_AS_JSON", "1")
    assert client_cli.parse(["queue"]) is None and client_cli.parse(["status"]) is not None
    assert _typer_call(recorded, ["queue"])[1]["as_json"] is True, "typer's automatic variable is honoured"
    monkeypatch.delenv("MLSYSKIT_MARBLE_QUEUE_AS_JSON")
    monkeypatch.setenv("MLSYSKIT_MARBLE_STATE_DIR", "")
    assert client_cli.parse(["queue"]) is None
    monkeypatch.delenv("MLSYSKIT_MARBLE_STATE_DIR")
    monkeypatch.setenv("_MARBLE_COMPLETE", "bash_source")
    assert client_cli.parse(["queue"]) is None


def test_errors_are_one_line_with_the_suites_exit_codes(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MLSYSKIT_MARBLE_STATE_DIR", str(tmp_path / "none"))
    with pytest.raises(SystemExit) as exit_:
        client_cli.run(["queue"])
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip().startswith("error: no marble daemon found")
    with pytest.raises(SystemExit) as exit_:
        client_cli.run(["cancel"])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip() == "error: cancel: give job ids, --name or --user"


@pytest.mark.slow   # a subprocess
def test_a_client_command_loads_neither_typer_nor_the_daemon():
    code = ("import sys; sys.argv = ['marble', 'queue', '--state-dir', sys.argv[1]]\n"
            "from mlsyskit.tools.sched.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 1, e.code\n"
            "print(','.join(m for m in ('typer', 'pydantic', 'rich', 'numpy', 'mlsyskit.tools.sched.cli_app', "
            "'mlsyskit.tools.sched.policies', 'mlsyskit.tools.sched.daemon.scheduler', "
            "'mlsyskit.tools.sched.daemon.specs') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code, "/nonexistent-marble-state"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "rich", "only the error line (rich) is loaded, as run_app does: " + res.stdout
