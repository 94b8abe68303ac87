"""The daemon's client commands run straight from sys.argv, without building the typer app.

Building marble's typer app and parsing a command line with it costs about 0.45 s of CPU (typer's
import, then a pydantic TypeAdapter per parameter); a `marble queue` that then makes one RPC took
0.6-0.8 s. `run` parses a plain client command line itself (`COMMANDS`: the same options, flags,
environment variables and defaults as commands.py gives typer; tests/sched/test_client_cli.py checks
that they agree) and calls the same function in client_commands.py that the typer command calls.

Anything it is not sure of goes to typer unchanged, so help and usage errors stay typer's own:
-h/--help, --version, an unknown or repeated option, a missing value, a value that is empty or
starts with "-", a count that is not a plain whole number or is out of range, `--flag=value`,
joined short options (-G4), a wrong number of arguments, shell completion, and any
MLSYSKIT_MARBLE_<COMMAND>_<OPTION> variable (typer's automatic environment variables).
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# At import, not in run(): `marble` without the sched extra (no grpc) must fail where core.entry turns a
# missing package into its one-line "install the sched extra", as it did when cli.py built the app.
from mlsyskit.core.errors import UserError
from mlsyskit.tools.sched.daemon import client_commands


@dataclass(frozen=True)
class Param:
    name: str                      # the keyword of the client_commands function
    kind: str                      # "str", "int", "path" or "flag"
    flags: tuple[str, ...] = ()    # none: a positional argument
    envvar: str | None = None
    default: Any = None
    required: bool = False         # positional: must be given
    many: bool = False             # positional: any number (a list)
    lo: int | None = None
    hi: int | None = None


_ENDPOINT = (Param("state_dir", "path", ("--state-dir",), "MLSYSKIT_MARBLE_STATE_DIR"),
             Param("addr", "str", ("--addr",), "MLSYSKIT_MARBLE_ADDR"),
             Param("token_file", "path", ("--token-file",)),
             Param("tls_ca", "path", ("--tls-ca",)),
             Param("user_token_file", "path", ("--user-token-file",), "MLSYSKIT_MARBLE_USER_TOKEN_FILE"))
_JSON = Param("as_json", "flag", ("--json",), default=False)

COMMANDS: dict[str, tuple[Param, ...]] = {
    "submit": (Param("job_file", "path"), Param("cmd", "str", ("--cmd",)), Param("app_name", "str", ("--app",)),
               Param("gpus", "str", ("--gpus", "-G")), Param("min_gpus", "str", ("--min-gpus",)),
               Param("max_gpus", "str", ("--max-gpus",)), Param("name", "str", ("--name", "-J")),
               Param("batch_size", "str", ("--batch-size",)), Param("time_limit", "str", ("--time", "-t")),
               Param("dependency", "str", ("--dependency", "-d")), Param("array", "str", ("--array", "-a")),
               Param("nodes", "str", ("--nodes", "-N")), Param("workdir", "path", ("--workdir",)), *_ENDPOINT, _JSON),
    "status": (Param("job", "int"), *_ENDPOINT, _JSON),
    "queue": (*_ENDPOINT, _JSON),
    "history": (Param("user", "str", ("--user", "-u")), Param("every", "flag", ("--all",), default=False),
                Param("limit", "int", ("--limit",), default=1000, lo=1, hi=10_000), *_ENDPOINT, _JSON),
    "cancel": (Param("jobs", "int", many=True), Param("name", "str", ("--name", "-n")),
               Param("user", "str", ("--user", "-u")), *_ENDPOINT, _JSON),
    "logs": (Param("job", "int", required=True), Param("follow", "flag", ("--follow", "-f"), default=False),
             *_ENDPOINT),
    "nodes": (*_ENDPOINT, _JSON),
}

_WHOLE = re.compile(r"(0|[1-9][0-9]{0,17})\Z")


class _Decline(Exception):
    """The command line is not plain enough: typer takes it."""


def _value(p: Param, text: str) -> Any:
    if not text or text.startswith("-"):
        raise _Decline
    if p.kind == "int":
        if not _WHOLE.match(text):
            raise _Decline
        number = int(text)
        if (p.lo is not None and number < p.lo) or (p.hi is not None and number > p.hi):
            raise _Decline
        return number
    return Path(text) if p.kind == "path" else text


def _options(params: Sequence[Param], args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    by_flag = {f: p for p in params for f in p.flags}
    given: dict[str, Any] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            positional.append(arg)
            continue
        p = by_flag.get(arg)
        if p is None or p.name in given:
            raise _Decline
        if p.kind == "flag":
            given[p.name] = True
            continue
        if i >= len(args):
            raise _Decline
        given[p.name] = _value(p, args[i])
        i += 1
    return given, positional


def parse(argv: Sequence[str]) -> tuple[str, dict[str, Any]] | None:
    """(command, the keywords of its client_commands function), or None: typer handles this line."""
    if not argv or argv[0] not in COMMANDS:
        return None
    command = argv[0]
    auto = f"MLSYSKIT_MARBLE_{command.upper()}_"
    if any(k.startswith(auto) or k.endswith("_COMPLETE") for k in os.environ):
        return None
    params = COMMANDS[command]
    try:
        given, positional = _options(params, argv[1:])
        for p in params:
            if p.flags:
                if p.name not in given:
                    text = os.environ.get(p.envvar) if p.envvar else None
                    given[p.name] = p.default if text is None else _value(p, text)
            elif p.many:
                given[p.name] = [_value(p, t) for t in positional] or None
                positional = []
            elif positional:
                given[p.name] = _value(p, positional.pop(0))
            elif p.required:
                raise _Decline
            else:
                given[p.name] = p.default
        if positional:
            raise _Decline
    except _Decline:
        return None
    return command, given


def run(argv: Sequence[str]) -> bool:
    """Run a plain client command line and exit as typer would (0; `error: ...` and 1 or 2); False:
    the line is for typer."""
    parsed = parse(argv)
    if parsed is None:
        return False
    command, kwargs = parsed
    try:
        getattr(client_commands, command)(**kwargs)
        sys.stdout.flush()
    except UserError as e:
        from mlsyskit.core.console import error_line  # rich: only when there is an error to print

        error_line(str(e))
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:      # `marble status | head`: quiet, exit 1, as typer does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    return True
