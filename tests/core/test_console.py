"""Console: numbers with fixed significant digits, tables that never cut a number, no markup
parsing of user text, and progress lines when stderr is not a terminal."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from mlsyskit.core import console
from mlsyskit.core.console import Reporter, emit_table, fmt, make_table


def test_fmt_significant_digits():
    assert fmt(268.123456) == "268.1"
    assert fmt(0.012345) == "0.01235"
    assert fmt(12345.6) == "12,346"
    assert fmt(2.5e-7) == "2.500e-07" and fmt(3.2e9) == "3.200e+09"
    assert fmt(None) == "-"   # a missing value in a table, never the word None
    assert fmt(0.0) == "0" and fmt(7) == "7" and fmt(True) == "yes"
    assert fmt(float("nan")) == "nan"


def _render(table, width):
    buf = io.StringIO()
    emit_table(table, Console(file=buf, width=width, markup=False, color_system=None))
    return buf.getvalue()


def test_wide_table_never_cuts_numbers():
    values = [268.123456 + i for i in range(10)]
    table = make_table("ten policies", ["policy", *[f"metric-{i}" for i in range(10)]],
                       [["marble-elastic", *values], ["tiresias", *values]])
    text = _render(table, 80)
    assert "…" not in text
    for v in values:
        assert fmt(v) in text  # every number whole, on one line
    assert max(len(line) for line in text.splitlines()) <= 80


def test_a_table_a_little_too_wide_drops_its_borders_before_going_vertical():
    columns = ["node", "endpoint", "pid", "up", "role", "epoch", "state", "commands", "keys", "restarts"]
    rows = [[f"s0r{i}", f"127.0.0.1:2730{i}", 19_199 + i, "yes", "middle", 1, "ready", 27, 0, 0] for i in range(3)]
    bordered = _render(make_table("bespokv cluster", columns, rows), 120)
    assert "┃" in bordered and max(len(line) for line in bordered.splitlines()) > 80   # 95 wide with borders
    compact = _render(make_table("bespokv cluster", columns, rows), 80).splitlines()
    assert "┃" not in "".join(compact) and max(len(line) for line in compact) <= 80
    assert [line.split() for line in compact[3:]] == [[str(c) if not isinstance(c, int) else f"{c:,}" for c in r]
                                                      for r in rows]   # one line per row, every cell whole
    vertical = _render(make_table("bespokv cluster", columns, rows), 50)
    assert "endpoint  127.0.0.1:27300" in vertical   # too narrow even without borders: column: value


def test_narrow_table_stays_a_table():
    text = _render(make_table("t", ["a", "b"], [["x", 1.5]]), 80)
    assert "1.500" in text and "┃" in text or "│" in text


def test_user_text_is_never_markup(capsys):
    table = make_table("[/GPUS:WEIGHT,...] title", ["[/x]"], [["[bold]not bold[/bold]"], ["[/oops]"]])
    text = _render(table, 80)
    assert "[/oops]" in text and "[bold]not bold[/bold]" in text and "[/GPUS:WEIGHT,...]" in text
    console.log("path [/tmp/x] and [red]")
    console.warn("[/careful]")
    err = capsys.readouterr().err
    assert "[/tmp/x]" in err and "[red]" in err and "[/careful]" in err


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_reporter_without_terminal_prints_phases_and_a_line_every_interval():
    buf = io.StringIO()
    clock = FakeClock()
    rep = Reporter(terminal=False, quiet=False, interval=10.0, clock=clock,
                   console=Console(file=buf, width=200, markup=False))
    with rep:
        rep.phase("profiling")
        clock.t = 3.0
        rep.start("train", total=100, unit="step")
        for step in range(1, 101):
            clock.t += 1.0
            rep.update(completed=step, note=f"loss {1.0 / step:.3f}")
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("profiling") and lines[1].startswith("train (100 step)")
    progress_lines = [line for line in lines[2:] if line.startswith("train ")]
    # 100 s of steps: a line at the first update, then at least one every 10 s, and the final count
    assert 10 <= len(progress_lines) <= 12
    assert "100/100" in progress_lines[-1] and "loss 0.010" in progress_lines[-1]


def test_reporter_quiet_prints_nothing():
    buf = io.StringIO()
    with Reporter(terminal=False, quiet=True, console=Console(file=buf)) as rep:
        rep.phase("profiling")
        rep.start("train", total=3)
        rep.advance()
    assert buf.getvalue() == ""


def test_verbose_and_quiet_exclude_each_other():
    from mlsyskit.core.errors import UsageError

    with pytest.raises(UsageError):
        console.set_verbosity(True, True)
    console.set_verbosity(False, False)


def test_an_error_is_one_line_however_long_and_narrow_the_stream(monkeypatch):
    import io

    from rich.console import Console

    from mlsyskit.core import console

    stream = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=stream, width=40, markup=False, highlight=False))
    console.error_line("requested configuration is not available: 8 GPUs on one node; largest node has 4")
    assert stream.getvalue().count("\n") == 1 and stream.getvalue().startswith("error: requested")
