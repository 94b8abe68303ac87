"""The one command-line surface of the suite's five typer apps.

Every tool builds its app with `make_app` and starts it with `run_app`, and takes its common
options from the factories below, so `--json`, `--out DIR`, `--config FILE.toml`, `--seed`,
`-v` and `-q` mean the same everywhere:

    @app.command()
    def sim(..., out: Path | None = out_option("results.json, timing.json and plots"),
            config: Path | None = config_option(), as_json: bool = json_option(),
            verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
        set_verbosity(verbose, quiet)
        cfg = load_command_config(SimConfig, config, {"seeds": seeds, ...})

Exit codes: 0 success, 1 runtime failure (`RuntimeFailure`), 2 usage error (`UsageError`,
`ConfigError`, and click's own usage errors). Every option can also be set from the
environment as MLSYSKIT_<TOOL>_<COMMAND>_<OPTION> (e.g. MLSYSKIT_MARBLE_SIM_SEEDS=5).
Help texts are never parsed as markup (`rich_markup_mode=None`), so `[...]` is safe in them.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import typer

from mlsyskit.core import __version__
from mlsyskit.core.errors import UsageError, UserError

T = TypeVar("T")


def env_prefix(name: str) -> str:
    return "MLSYSKIT_" + name.upper().replace("-", "_")


def make_app(name: str, help_text: str) -> typer.Typer:
    app = typer.Typer(name=name, help=help_text, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False, rich_markup_mode=None,
                      context_settings={"help_option_names": ["-h", "--help"],
                                        "auto_envvar_prefix": env_prefix(name)})

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


# ---------------------------------------------------------------- shared options

def json_option() -> Any:
    return typer.Option(False, "--json", help="Print the result as JSON on stdout instead of tables.")


def out_option(contents: str) -> Any:
    return typer.Option(None, "--out", file_okay=False,
                        help=f"Folder for the outputs (created if missing): {contents}.")


def config_option() -> Any:
    return typer.Option(None, "--config", exists=False, dir_okay=False,
                        help="TOML file with this command's settings; flags given here override it, "
                             "and it overrides the defaults.")


def seed_option(default: int | None = 0,
                help_text: str = "Master seed; every random choice derives from it.") -> Any:
    """--seed; default None when a --config file may set it (None means not given)."""
    return typer.Option(default, "--seed", help=help_text)


def verbose_option() -> Any:
    return typer.Option(False, "--verbose", "-v", help="Also print details (debug lines) on stderr.")


def quiet_option() -> Any:
    return typer.Option(False, "--quiet", "-q", help="Print no progress or info on stderr; results and errors only.")


def ensure_out_dir(path: Path | str) -> Path:
    """Create the --out folder, or a one-line usage error saying why it cannot be."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path} is a file; it must be a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create --out folder {path}: {e.strerror}") from None
    return path


def load_command_config(cls: type[T], config_path: Path | str | None, overrides: Mapping[str, Any],
                        section: str | None = None) -> T:
    """Defaults, then --config FILE (optionally one [section] of it), then the flags that were given
    (None means not given)."""
    from mlsyskit.core.config import load_config  # pydantic: only commands that read a config pay for it

    return load_config(cls, config_path, overrides, section=section)


# ---------------------------------------------------------------- errors and exit codes

def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a one-line error and return the Exit to raise (code 2 usage, 1 runtime failure).

    Prefer raising UsageError / RuntimeFailure, which say which kind of error it is."""
    from mlsyskit.core.console import error_line

    error_line(message)
    return typer.Exit(code)


def run_app(app: typer.Typer) -> None:
    """Entry point wrapper: any UserError becomes one line on stderr and its exit code."""
    try:
        app()
    except UserError as e:
        from mlsyskit.core.console import error_line  # rich: only when there is an error to print

        error_line(str(e))
        sys.exit(e.exit_code)
