"""marble's entry point (the `marble` console script): a plain client command line (`marble status`,
`queue`, `submit ...`) runs without building the typer app (daemon/client_cli.py: ~0.3 s of CPU
instead of ~0.6 at load 24); every other line, help and usage errors included, goes to the typer app in
cli_app.py, which is also `app` here (`from mlsyskit.tools.sched.cli import app`).

`python -X importtime -m mlsyskit.tools.sched.cli queue` shows what a client command loads.
"""
from __future__ import annotations

import sys
from typing import Any

from mlsyskit.tools.sched.daemon import client_cli


def main() -> None:
    if not client_cli.run(sys.argv[1:]):
        from mlsyskit.tools.sched.cli_app import main as run_typer_app

        run_typer_app()


def __getattr__(name: str) -> Any:
    """`app` and the rest of the typer module, imported when first asked for."""
    if name.startswith("__"):
        raise AttributeError(name)
    from mlsyskit.tools.sched import cli_app

    return getattr(cli_app, name)


if __name__ == "__main__":
    main()
