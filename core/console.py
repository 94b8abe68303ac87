"""One rich Console on stderr for humans; results go to stdout as tables or JSON.

Nothing printed here is parsed as rich markup: messages, table cells and help texts contain
user data (paths, job names, `[...]` syntax) that markup would mangle or crash on. Style is
given with `style=`, never inline.

Verbosity is set once per command (`set_verbosity`): `-q` silences progress and info,
`-v` adds debug lines; warnings and errors always show.
"""
from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.table import Table

# rich (~0.1 s CPU to import) is imported when something is first printed, not at import: a server
# process (a kv node) that only logs when something happens does not pay for it at every start.
# `err` and `out`, the two Consoles, are made then too (module attributes, see __getattr__).


def __getattr__(name: str) -> Any:
    if name in ("err", "out"):
        from rich.console import Console

        made = Console(stderr=True, markup=False, highlight=False) if name == "err" else \
            Console(soft_wrap=True, markup=False, highlight=False)
        globals()[name] = made
        return made
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _console(name: str) -> Console:
    """err or out (as set, e.g. by a test's monkeypatch; made at first use)."""
    return globals().get(name) or __getattr__(name)

_level = {"verbose": False, "quiet": False}


def set_verbosity(verbose: bool = False, quiet: bool = False) -> None:
    """Call first in a command: -v adds debug lines, -q keeps only warnings, errors and results."""
    from mlsyskit.core.errors import UsageError

    if verbose and quiet:
        raise UsageError("--verbose and --quiet exclude each other")
    _level["verbose"], _level["quiet"] = bool(verbose), bool(quiet)


def is_quiet() -> bool:
    return _level["quiet"]


def is_verbose() -> bool:
    return _level["verbose"]


def _plain_line(console: Console, line: str) -> bool:
    """Write one line as it is where nobody looks at a terminal (a log file, a pipe, CI): no style to
    render there, and rich's wrap at 80 columns would only split the line a grep looks for. Rendering
    cost ~0.7 ms of CPU a line, on a server's critical path between rounds. False on a terminal."""
    if console.is_terminal:
        return False
    console.file.write(line + "\n")
    console.file.flush()
    return True


def log(message: str, *, style: str | None = None) -> None:
    """An info line on stderr (silenced by -q)."""
    if not _level["quiet"] and not _plain_line(console := _console("err"), str(message)):
        from rich.text import Text

        console.print(Text(str(message), style=style or ""))


def debug(message: str) -> None:
    """A detail line on stderr, shown only with -v."""
    if _level["verbose"] and not _plain_line(console := _console("err"), str(message)):
        from rich.text import Text

        console.print(Text(str(message), style="dim"))


def warn(message: str) -> None:
    """A warning on stderr; shown even with -q."""
    if not _plain_line(console := _console("err"), f"warning: {message}"):
        from rich.text import Text

        console.print(Text.assemble(("warning: ", "bold yellow"), str(message)))


def error_line(message: str) -> None:
    """One line whatever its length: scripts grep for it and tests match it (no wrap at 80 columns)."""
    from rich.text import Text

    _console("err").print(Text.assemble(("error: ", "bold red"), str(message)), soft_wrap=True)


# ---------------------------------------------------------------- progress

class Reporter:
    """Progress of long work, by phase.

    On a terminal: a rich bar labelled with the current phase. Without one (nohup, CI, a pipe):
    a line when a phase starts and a progress line at least every `interval` seconds, so a log
    shows the work is alive. With -q: nothing.
    """

    def __init__(self, *, terminal: bool | None = None, quiet: bool | None = None, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, console: Console | None = None) -> None:
        self.console = console or _console("err")
        self.quiet = _level["quiet"] if quiet is None else quiet
        self.terminal = self.console.is_terminal if terminal is None else terminal
        self.interval = interval
        self.clock = clock
        self._label = ""
        self._unit = ""
        self._total: float | None = None
        self._completed = 0.0
        self._note = ""
        self._started = clock()
        self._last_line = -math.inf
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    # -- lifecycle
    def __enter__(self) -> Reporter:
        if self.terminal and not self.quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[note]}", markup=False),
                                 console=self.console, transient=False)
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    # -- API
    def phase(self, name: str) -> None:
        """A phase with no count (profiling, populating tiers, loading ...)."""
        self.start(name, total=None)

    def start(self, label: str, total: float | None = None, unit: str = "") -> None:
        self._flush_final()
        self._label, self._unit, self._total, self._completed, self._note = label, unit, total, 0.0, ""
        self._started = self.clock()
        if self.quiet:
            return
        if self._bar is not None:
            if self._task is not None:
                self._bar.update(self._task, visible=False)
            self._task = self._bar.add_task(label, total=total, note="")
        else:
            what = f" ({_count(total)}{' ' + unit if unit else ''})" if total is not None else ""
            self._line(f"{label}{what} ...")

    def advance(self, n: float = 1, note: str = "") -> None:
        self.update(completed=self._completed + n, note=note)

    def update(self, completed: float | None = None, note: str = "") -> None:
        if completed is not None:
            self._completed = completed
        if note:
            self._note = note
        if self.quiet:
            return
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self._completed, note=self._note)
        elif self.clock() - self._last_line >= self.interval:
            self._line(self._status())

    def _flush_final(self) -> None:
        """A last line for a counted phase that ended between two periodic lines."""
        if (not self.quiet and self._bar is None and self._total is not None and self._label
                and self._completed > 0 and self._status() != self._last_status):
            self._line(self._status())

    def _status(self) -> str:
        done = _count(self._completed)
        of = f"/{_count(self._total)}" if self._total else ""
        pct = f" ({100 * self._completed / self._total:.0f}%)" if self._total else ""
        note = f"  {self._note}" if self._note else ""
        unit = f" {self._unit}" if self._unit else ""
        return f"{self._label} {done}{of}{unit}{pct}{note}  [{self.clock() - self._started:.0f} s]"

    _last_status = ""

    def _line(self, text: str) -> None:
        self._last_line = self.clock()
        self._last_status = text
        if not _plain_line(self.console, text):
            from rich.text import Text

            self.console.print(Text(text))


@contextmanager
def reporter(**kwargs: Any) -> Iterator[Reporter]:
    """`with reporter() as rep: rep.phase("profiling"); rep.start("train", total=N, unit="step")`."""
    with Reporter(**kwargs) as rep:
        try:
            yield rep
        finally:
            rep._flush_final()


def _count(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def progress(*, transient: bool = False) -> Progress:
    """A bare rich progress bar on stderr, disabled when stderr is not a terminal or with -q.

    Prefer `reporter()`, which also prints progress lines without a terminal.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = _console("err")
    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=transient,
                    disable=not err.is_terminal or _level["quiet"])


# ---------------------------------------------------------------- tables

SIGNIFICANT_DIGITS = 4


def make_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title) if title else None)
    for i, col in enumerate(columns):
        table.add_column(Text(str(col)), justify="left" if i == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*(v if isinstance(v, Text) else Text(fmt(v)) for v in row))
    return table


def fmt(value: Any) -> str:
    """Numbers with SIGNIFICANT_DIGITS significant digits (integers whole, with separators); a missing
    value (None) as "-"."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0:
            return "0"
        magnitude = math.floor(math.log10(abs(value)))
        if magnitude >= 6 or magnitude < -3:
            return f"{value:.{SIGNIFICANT_DIGITS - 1}e}"
        decimals = max(0, SIGNIFICANT_DIGITS - 1 - magnitude)
        return f"{value:,.{decimals}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def emit_table(table: Table, console: Console | None = None) -> None:
    """Print a table without ever cutting a cell: cells fold; a table too wide for the console
    is printed without borders (a rule under the header, columns two spaces apart, then one) if
    that fits, and as one vertical block per row (column: value) only if even that does not, so a
    status table stays one line per row in an 80-column terminal."""
    from rich import box
    from rich.measure import Measurement

    console = console or _console("out")
    for column in table.columns:
        column.overflow = "fold"
    def fits() -> bool:
        return Measurement.get(console, console.options.update_width(10**6), table).maximum <= console.width

    if len(table.columns) <= 2 or fits():
        console.print(table)
        return
    table.box, table.show_edge, table.pad_edge = box.SIMPLE_HEAD, False, False
    for padding, collapse in (((0, 1), True), ((0, 0), False)):   # two spaces between columns, then one
        table.padding, table.collapse_padding = padding, collapse
        if fits():
            console.print(table)
            return
    console.print(_vertical(table))


def _vertical(table: Table) -> Table:
    from rich.table import Table
    from rich.text import Text

    headers = [Text(c.header) if isinstance(c.header, str) else c.header for c in table.columns]
    cells = [list(c.cells) for c in table.columns]
    block = Table(title=table.title, show_header=False, box=None, padding=(0, 1))
    block.add_column(justify="right", style="bold")
    block.add_column(overflow="fold")
    for r in range(table.row_count):
        if r:
            block.add_row("", "")
        for h, col in zip(headers, cells, strict=True):
            block.add_row(h, col[r] if r < len(col) else "")
    return block


# ---------------------------------------------------------------- JSON

def emit_json(obj: Any) -> None:
    """Machine-readable result on stdout (plain write: no rich markup or wrapping)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")
    sys.stdout.flush()


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(o)
    return str(o)
