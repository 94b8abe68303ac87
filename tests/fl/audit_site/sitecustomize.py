"""Put on PYTHONPATH of a test's processes: log every open() of a file under $FL_AUDIT_WATCH, with the
opening process's pid and command line, to $FL_AUDIT_LOG (Python's audit hooks see every open of the
interpreter, numpy.load's included). tests/fl/test_real_federation.py reads it to show that the
server's process never opens a file in a client's folder."""
import os
import sys

_LOG, _WATCH = os.environ.get("FL_AUDIT_LOG"), os.environ.get("FL_AUDIT_WATCH")
_busy: list[int] = []


def _hook(event, args):
    if event != "open" or _busy or not args:
        return
    path = args[0]
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):
        return  # a file descriptor
    full = os.path.abspath(path)
    if not full.startswith(_WATCH):
        return
    _busy.append(1)  # os.open below is audited too
    try:
        fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, f"{os.getpid()}\t{' '.join(sys.argv)}\t{full}\n".encode())
        os.close(fd)
    finally:
        _busy.pop()


if _LOG and _WATCH:
    sys.addaudithook(_hook)
