"""Every help page of the five CLIs renders: every command and subcommand, at 80 and 200 columns,
with stdout a pipe and with a terminal (a pty). Help text is never parsed as markup, so text such
as `[/GPUS:WEIGHT,...]` shows as written."""
from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest
from conftest import VENV_BIN

TOOLS = {"tencache": "mlsyskit.tools.offload.cli", "fl-server": "mlsyskit.tools.fl.server_cli",
         "fl-client": "mlsyskit.tools.fl.client_cli", "marble": "mlsyskit.tools.sched.cli",
         "bespokv": "mlsyskit.tools.kv.cli"}

# Renders `--help` for every command path of one tool in this process and prints a separator
# after each page; exit code != 0 on any failure.
DRIVER = r'''
import importlib, sys, typer
module, tool = sys.argv[1], sys.argv[2]
root = typer.main.get_command(importlib.import_module(module).app)
def paths(cmd, prefix):
    yield prefix
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from paths(sub, prefix + [name])
count = 0
for path in paths(root, []):
    try:
        root.main(args=path + ["--help"], prog_name=tool, standalone_mode=True)
    except SystemExit as e:
        if e.code not in (0, None):
            print(f"@@FAILED {' '.join(path)} exit {e.code}", flush=True)
            sys.exit(1)
    count += 1
    print(f"@@PAGE {' '.join(path) or '(root)'}", flush=True)
print(f"@@PAGES {count}", flush=True)
'''


def _run(args: list[str], columns: int, terminal: bool) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    if not terminal:
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
        return r.returncode, r.stdout + r.stderr
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env)
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


@pytest.mark.slow  # one subprocess per page
@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "tty"])
@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_help_page_renders(tool, columns, terminal):
    code, text = _run([sys.executable, "-c", DRIVER, TOOLS[tool], tool], columns, terminal)
    assert code == 0 and "Traceback" not in text, text[-3000:]
    pages = int(text.rsplit("@@PAGES ", 1)[1].split()[0])
    assert pages >= 2 and text.count("Usage:") >= pages, text[-2000:]
    if columns == 80:
        too_wide = [line for line in text.splitlines() if len(line) > 80 and " " in line.strip()]
        assert not too_wide, too_wide[:5]


@pytest.mark.slow
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_console_script_help_in_a_terminal(tool):
    code, text = _run([str(VENV_BIN / tool), "--help"], 80, terminal=True)
    assert code == 0 and "Usage:" in text and "Traceback" not in text, text
