"""Every help page of the five CLIs renders: every command and subcommand, at 80 and 200 columns,
with stdout a pipe and with a terminal (a pty). Help text is never parsed as markup, so text such
as `[/GPUS:WEIGHT,...]` shows as written.

The pages render in this process with sys.stdout and sys.stderr on a real pipe or a real pty (what a
process started on one sees: typer builds a rich Console per page, reading COLUMNS and isatty() then);
each installed console script is started once, in a terminal."""
from __future__ import annotations

import contextlib
import importlib
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import typer
from conftest import VENV_BIN

TOOLS = {"tencache": "mlsyskit.tools.offload.cli", "fl-server": "mlsyskit.tools.fl.server_cli",
         "fl-client": "mlsyskit.tools.fl.client_cli", "marble": "mlsyskit.tools.sched.cli",
         "bespokv": "mlsyskit.tools.kv.cli"}


def _env(columns: int) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    return env


@contextlib.contextmanager
def _stdout_on(terminal: bool) -> Iterator[list[bytes]]:
    """sys.stdout and sys.stderr on a pty (terminal) or a pipe whose other end a thread drains; the list
    holds everything written once the block has ended."""
    read_end, write_end = pty.openpty() if terminal else os.pipe()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(read_end, 65536)
            except OSError:  # EIO: the terminal's other side closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    stream = os.fdopen(write_end, "w", encoding="utf-8", errors="replace")
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = stream
    try:
        yield chunks
    finally:
        sys.stdout, sys.stderr = saved
        stream.close()
        reader.join(timeout=30)
        os.close(read_end)


def _paths(cmd, prefix: list[str]) -> Iterator[list[str]]:
    yield prefix
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _paths(sub, prefix + [name])


def _page(root, tool: str, path: list[str], terminal: bool) -> tuple[object, str]:
    """One `--help` page as the console script prints it: (exit code, text)."""
    with _stdout_on(terminal) as chunks:
        code = 0
        try:
            root.main(args=path + ["--help"], prog_name=tool, standalone_mode=True)
        except SystemExit as e:
            code = e.code
    return code, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "tty"])
@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_help_page_renders(tool, columns, terminal, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    for name, value in _env(columns).items():
        monkeypatch.setenv(name, value)
    root = typer.main.get_command(importlib.import_module(TOOLS[tool]).app)
    pages = list(_paths(root, []))
    assert len(pages) >= 2
    for path in pages:
        code, text = _page(root, tool, path, terminal)
        where = f"{tool} {' '.join(path)} --help"
        assert code in (0, None) and "Traceback" not in text and "Usage:" in text, f"{where}: exit {code}\n{text[-3000:]}"
        if columns == 80:
            too_wide = [line for line in text.splitlines() if len(line) > 80 and " " in line.strip()]
            assert not too_wide, (where, too_wide[:5])


def _run_in_terminal(args: list[str], columns: int) -> tuple[int, str]:
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=_env(columns))
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=120)
    finally:
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.slow  # starts the console script
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_console_script_help_in_a_terminal(tool):
    code, text = _run_in_terminal([str(VENV_BIN / tool), "--help"], 80)
    assert code == 0 and "Usage:" in text and "Traceback" not in text, text
