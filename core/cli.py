"""Shared shape of the suite's typer apps: a callback (so subcommands can be added without
changing how the command is called), --version, and one-paragraph help."""
from __future__ import annotations

import typer

from mlsyskit.core import __version__
from mlsyskit.core.config import ConfigError


def make_app(name: str, help_text: str) -> typer.Typer:
    app = typer.Typer(name=name, help=help_text, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]})

    def _version(value: bool) -> None:
        if value:
            typer.echo(f"{name} (mlsyskit) {__version__}")
            raise typer.Exit()

    @app.callback()
    def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit.")) -> None:
        pass

    _root.__doc__ = help_text
    return app


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a clear error on stderr and return the Exit to raise."""
    from mlsyskit.core.console import err

    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def run_app(app: typer.Typer) -> None:
    """Entry point wrapper: config errors become one-line messages instead of tracebacks."""
    try:
        app()
    except ConfigError as e:
        raise SystemExit(fail(str(e)).exit_code) from None
