"""Loopback port picking for every tool, test and script: one picker, outside the ephemeral range.

A port the OS picked with bind(0) lies in the kernel's ephemeral range, and between the pick and
the real bind any connect() on the machine may take it as its source port (CI runs lost ports
so: 'address already in use'). This picker draws from below that range and above Ray's worker
ports (10002-19999), checks the ports are free, and never hands out a port twice in a process.

`MLSYSKIT_PORT_WINDOW="lo-hi"` narrows the window: the test suite gives each pytest-xdist worker
its own slice, and the processes a worker starts inherit it, so parallel workers never race.
"""
from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

WINDOW_ENV = "MLSYSKIT_PORT_WINDOW"
_RAY_WORKERS_END = 20_000  # Ray's worker ports end below this
_given: set[int] = set()
_lock = threading.Lock()
_rng = random.Random(os.getpid() ^ 0x5EED)


def kernel_window() -> tuple[int, int]:
    """The ports [lo, hi) no outgoing connection is given as its source port."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32_768, 60_999  # Linux's default
    return (_RAY_WORKERS_END, low) if low - _RAY_WORKERS_END >= 5_000 else (high + 1, 65_000)


def port_window() -> tuple[int, int]:
    """[lo, hi) to pick from: MLSYSKIT_PORT_WINDOW when set, else the kernel window."""
    raw = os.environ.get(WINDOW_ENV, "").strip()
    if not raw:
        return kernel_window()
    try:
        lo, hi = (int(part) for part in raw.split("-"))
    except ValueError:
        raise ValueError(f"{WINDOW_ENV}={raw!r}: expected 'LOW-HIGH', e.g. 20000-24000") from None
    if not 1024 <= lo < hi <= 65_536:
        raise ValueError(f"{WINDOW_ENV}={raw!r}: need 1024 <= LOW < HIGH <= 65536")
    return lo, hi


def split_window(index: int, count: int) -> str:
    """Slice `index` of `count` equal slices of the kernel window, as a MLSYSKIT_PORT_WINDOW value."""
    if not 0 <= index < count:
        raise ValueError(f"slice {index} of {count}")
    lo, hi = kernel_window()
    width = (hi - lo) // count
    return f"{lo + index * width}-{lo + (index + 1) * width}"


def port_is_free(port: int, host: str = "127.0.0.1", reuse_addr: bool = False) -> bool:
    """Whether a listener could bind host:port now. Without reuse_addr a port in TIME_WAIT counts as
    taken (the picker's strict check); with it, the check matches servers that set SO_REUSEADDR, so
    a port a stopped server just left is free to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse_addr:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def claim_range(base: int, width: int, host: str = "127.0.0.1") -> bool:
    """Claim base..base+width-1 if none was handed out before in this process and all are free."""
    ports = range(base, base + width)
    with _lock:
        if any(p in _given for p in ports) or not all(port_is_free(p, host) for p in ports):
            return False
        _given.update(ports)
        return True


def free_range(width: int, host: str = "127.0.0.1", attempts: int = 2000) -> int:
    """The first of `width` consecutive ports that were free a moment ago, never handed out before."""
    if width < 1:
        raise ValueError(f"width must be >= 1, not {width}")
    lo, hi = port_window()
    if hi - lo < width:
        raise ValueError(f"port window {lo}-{hi} is narrower than {width} ports")
    for _ in range(attempts):
        base = _rng.randrange(lo, hi - width + 1)
        if claim_range(base, width, host):
            return base
    raise RuntimeError(f"no {width} free consecutive port(s) in {lo}-{hi}")


def free_port(host: str = "127.0.0.1") -> int:
    """One port on host that was free a moment ago, outside the ephemeral range."""
    return free_range(1, host)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports (not necessarily consecutive)."""
    return [free_port(host) for _ in range(count)]
