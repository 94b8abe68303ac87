"""Redis's glob patterns (stringmatchlen: KEYS, SCAN's and HSCAN's MATCH) as compiled regular
expressions over bytes.

Python's fnmatch is a different dialect: it negates a class with `[!...]` where Redis uses `[^...]`,
and it has no backslash escape (Redis: `\\*` is a literal star). `*` and `?` match any bytes,
newlines included.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable


def _byte(b: int) -> bytes:
    return b"\\x%02x" % b


def _class(pattern: bytes, i: int) -> tuple[bytes, int]:
    """The regular expression of the class opening at pattern[i] ('['), and the index after it. An
    unterminated class ends with the pattern, as in Redis."""
    j, n, negate, spans = i + 1, len(pattern), False, []
    if pattern[j:j + 1] == b"^":
        negate, j = True, j + 1
    while j < n and pattern[j] != ord("]"):
        if pattern[j] == ord("\\") and j + 1 < n:
            spans.append((pattern[j + 1], pattern[j + 1]))
            j += 2
        elif pattern[j + 1:j + 2] == b"-" and j + 2 < n:
            low, high = sorted((pattern[j], pattern[j + 2]))  # Redis accepts z-a as a-z
            spans.append((low, high))
            j += 3
        else:
            spans.append((pattern[j], pattern[j]))
            j += 1
    if not spans:
        return (b"." if negate else b"(?!)"), j + 1
    body = b"".join(_byte(a) if a == b else _byte(a) + b"-" + _byte(b) for a, b in spans)
    return b"[" + (b"^" if negate else b"") + body + b"]", j + 1


@functools.lru_cache(maxsize=256)
def matcher(pattern: bytes) -> Callable[[bytes], bool]:
    """A function telling whether a whole byte string matches `pattern` as Redis matches it."""
    if pattern == b"*":
        return lambda _: True
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == ord("*"):
            out.append(b".*")
            i += 1
        elif c == ord("?"):
            out.append(b".")
            i += 1
        elif c == ord("["):
            part, i = _class(pattern, i)
            out.append(part)
        elif c == ord("\\") and i + 1 < n:
            out.append(_byte(pattern[i + 1]))
            i += 2
        else:
            out.append(_byte(c))
            i += 1
    compiled = re.compile(b"".join(out), re.DOTALL)
    return lambda s: compiled.fullmatch(s) is not None
