"""INCRBYFLOAT's and HINCRBYFLOAT's arithmetic, done as Redis does it: in C's long double, through libc.

Redis parses both numbers with strtold, adds them in long double (80-bit x87 on x86-64, 64-bit
mantissa) and writes the sum with "%.17Lf", trailing zeros cut. A Python float differs where users
look: 0.1 + 0.2 is "0.30000000000000004" in doubles and "0.3" in Redis. So the same libc calls are
made here through ctypes: strtold to parse, fmal(a, 1, b) to add (one correctly rounded long-double
addition, as the x87 `+` is), snprintf to print. A ctypes subclass of c_longdouble is never turned
into a Python float, so no precision is lost between the calls.

The write point computes the result once and replicates it as stored bytes (INCRBYFLOAT) or as
HSET of the result (HINCRBYFLOAT, rmw.delta_of), as Redis replicates both: replicas never redo the
arithmetic, so they agree even on machines whose long double differs.
"""
from __future__ import annotations

import ctypes
import ctypes.util

_libc = ctypes.CDLL(None, use_errno=True)
_libm = ctypes.CDLL(ctypes.util.find_library("m"))
MAX_CHARS = 5 * 1024  # Redis's MAX_LONG_DOUBLE_CHARS: a longer number is not a float to it
ERANGE = 34


class LongDouble(ctypes.c_longdouble):
    """A long double kept as ctypes memory (a subclass is not converted to a Python float)."""


_strtold = _libc.strtold
_strtold.restype = LongDouble
_strtold.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
_fmal = _libm.fmal
_fmal.restype = LongDouble
_fmal.argtypes = [LongDouble, LongDouble, LongDouble]
_snprintf = _libc.snprintf
_ONE: LongDouble | None = None


def parse(raw: bytes) -> LongDouble | None:
    """Redis's string2ld: the whole of `raw` as a long double, or None (not a float to Redis: empty,
    too long, leading space, trailing junk, NaN, or out of range)."""
    if not raw or len(raw) >= MAX_CHARS or raw[:1].isspace() or b"\x00" in raw:
        return None
    buf = ctypes.create_string_buffer(raw)
    end = ctypes.c_char_p()
    ctypes.set_errno(0)
    value = _strtold(buf, ctypes.byref(end))
    errno = ctypes.get_errno()
    consumed = ctypes.cast(end, ctypes.c_void_p).value - ctypes.addressof(buf)
    if consumed != len(raw):
        return None
    text = _print(value, b"%Lg")
    if text in (b"nan", b"-nan"):
        return None
    if errno == ERANGE and text in (b"inf", b"-inf", b"0", b"-0"):
        return None
    return value


def add(a: LongDouble, b: LongDouble) -> LongDouble:
    global _ONE
    if _ONE is None:
        _ONE = parse(b"1")
    return _fmal(a, _ONE, b)


def _print(value: LongDouble, fmt: bytes) -> bytes:
    buf = ctypes.create_string_buffer(MAX_CHARS)
    n = _snprintf(buf, MAX_CHARS, fmt, value)
    return buf.raw[:min(n, MAX_CHARS - 1)]


def human(value: LongDouble) -> bytes | None:
    """Redis's ld2string(LD_STR_HUMAN): "%.17Lf" without trailing zeros ("-0" is "0"); None for a
    NaN or an infinity (INCRBYFLOAT refuses to store one)."""
    text = _print(value, b"%.17Lf")
    if text.lstrip(b"-") in (b"inf", b"nan"):
        return None
    if b"." in text:
        text = text.rstrip(b"0").rstrip(b".")
    return b"0" if text == b"-0" else text
