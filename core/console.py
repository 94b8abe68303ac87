"""One rich Console on stderr for humans; results go to stdout as tables or JSON.

Progress bars are shown only when stderr is a terminal, so logs and CI stay clean.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

err = Console(stderr=True)
out = Console(soft_wrap=True)


def log(message: str, *, style: str | None = None) -> None:
    err.print(message, style=style, highlight=False)


def progress(*, transient: bool = False) -> Progress:
    """A progress bar on stderr, disabled when stderr is not a terminal."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=transient,
        disable=not err.is_terminal,
    )


def make_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(fmt(v) for v in row))
    return table


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:,.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def emit_json(obj: Any) -> None:
    """Machine-readable result on stdout (plain print: no rich markup or wrapping)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")
    sys.stdout.flush()


def emit_table(table: Table) -> None:
    out.print(table)


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(o)
    return str(o)
