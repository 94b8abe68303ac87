"""Storage: a SQLite (WAL) metadata store.

    store = MetaStore("run/meta.db")
    store.put("config", "rounds", 10)                 # typed values (msgpack): None/bool/int/float/str/bytes/list/dict
    store.get("config", "rounds")                     # -> 10
    seq = store.append("ledger", {"client": 3, "tokens": 1.5})   # append-only log, seq = 1, 2, ...
    for seq, record in store.read_log("ledger", after=0): ...
    with store.transaction():                         # all-or-nothing (BEGIN IMMEDIATE ... COMMIT)
        store.put(...); store.append(...)
    store.ensure_table("CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, name TEXT)")
    store.execute("INSERT INTO jobs (name) VALUES (?)", ("bert",)); store.query("SELECT * FROM jobs")

Storage errors live in `mlsyskit.core.storage_errors` and are importable from this module. (tencache's
file tier for tensor blocks is `mlsyskit.tools.offload.filetier`: only tencache uses it.)
"""
from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack

from mlsyskit.core.storage_errors import (  # noqa: F401 (re-export)
    BlockNotFoundError,
    BufferTooSmallError,
    CorruptBlockError,
    DiskFullError,
    MissingDirectoryError,
    StorageError,
    StoragePermissionError,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (ns, key));
CREATE TABLE IF NOT EXISTS logs (log TEXT NOT NULL, seq INTEGER NOT NULL, record BLOB NOT NULL,
                                 PRIMARY KEY (log, seq));
"""
_MISSING = object()


def _encode(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except TypeError as e:
        raise TypeError(f"MetaStore stores None/bool/int/float/str/bytes/list/dict values: {e}") from None


def _decode(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


def _sqlite_error(exc: sqlite3.Error, path: Path, what: str) -> StorageError:
    text = str(exc).lower()
    if "disk is full" in text or "disk i/o" in text and "full" in text:
        return DiskFullError(f"{path}: database or disk is full while {what}")
    if "readonly" in text or "read-only" in text or "permission" in text:
        return StoragePermissionError(f"{path}: read-only database or directory while {what}")
    if "unable to open" in text:
        if not path.parent.is_dir():
            return MissingDirectoryError(f"{path}: directory {path.parent} does not exist")
        return StoragePermissionError(f"{path}: cannot open the database file while {what} ({exc})")
    if "not a database" in text or "malformed" in text:
        return StorageError(f"{path}: the database file is corrupt ({exc})")
    return StorageError(f"{path}: SQLite error while {what}: {exc}")


class MetaStore:
    """Typed key/value metadata and append-only logs in one SQLite file (WAL, one connection, thread-safe)."""

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL") -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise MissingDirectoryError(f"{self.path}: directory {self.path.parent} does not exist")
        self._lock = threading.RLock()
        self._depth = 0
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as e:
            raise _sqlite_error(e, self.path, "opening the store") from None

    # -- plumbing ---------------------------------------------------------------------------------
    def _run(self, what: str, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.Error as e:
            raise _sqlite_error(e, self.path, what) from None

    @contextmanager
    def transaction(self) -> Iterator[MetaStore]:
        """All writes inside commit together or not at all; nested blocks join the outer one."""
        with self._lock:
            if self._depth == 0:
                self._run("beginning a transaction", "BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield self
            except BaseException:
                self._depth -= 1
                if self._depth == 0:
                    self._db.rollback()
                raise
            self._depth -= 1
            if self._depth == 0:
                self._run("committing", "COMMIT")

    # -- typed key/value --------------------------------------------------------------------------
    def put(self, ns: str, key: str, value: Any) -> None:
        blob = _encode(value)
        with self._lock:
            self._run(f"writing {ns}/{key}", "INSERT OR REPLACE INTO kv (ns, key, value) VALUES (?, ?, ?)",
                      (ns, key, blob))

    def get(self, ns: str, key: str, default: Any = _MISSING) -> Any:
        with self._lock:
            row = self._run(f"reading {ns}/{key}", "SELECT value FROM kv WHERE ns=? AND key=?", (ns, key)).fetchone()
        if row is None:
            if default is _MISSING:
                raise KeyError(f"no key {key!r} in namespace {ns!r} of {self.path}")
            return default
        return _decode(row[0])

    def delete(self, ns: str, key: str) -> bool:
        with self._lock:
            return self._run(f"deleting {ns}/{key}", "DELETE FROM kv WHERE ns=? AND key=?", (ns, key)).rowcount > 0

    def items(self, ns: str) -> list[tuple[str, Any]]:
        with self._lock:
            rows = self._run(f"listing {ns}", "SELECT key, value FROM kv WHERE ns=? ORDER BY key", (ns,)).fetchall()
        return [(k, _decode(v)) for k, v in rows]

    def keys(self, ns: str) -> list[str]:
        return [k for k, _ in self.items(ns)]

    # -- append-only logs -------------------------------------------------------------------------
    def append(self, log: str, record: Any) -> int:
        """Append a record; returns its sequence number (1, 2, ... per log)."""
        blob = _encode(record)
        with self.transaction():
            seq = self._run(f"appending to {log}", "SELECT COALESCE(MAX(seq), 0) + 1 FROM logs WHERE log=?",
                            (log,)).fetchone()[0]
            self._run(f"appending to {log}", "INSERT INTO logs (log, seq, record) VALUES (?, ?, ?)", (log, seq, blob))
        return seq

    def read_log(self, log: str, after: int = 0, limit: int | None = None) -> list[tuple[int, Any]]:
        """Records with seq > `after`, oldest first."""
        sql = "SELECT seq, record FROM logs WHERE log=? AND seq>? ORDER BY seq"
        params: tuple[Any, ...] = (log, after)
        if limit is not None:
            sql += " LIMIT ?"
            params += (limit,)
        with self._lock:
            rows = self._run(f"reading {log}", sql, params).fetchall()
        return [(seq, _decode(blob)) for seq, blob in rows]

    def log_length(self, log: str) -> int:
        with self._lock:
            return self._run(f"counting {log}", "SELECT COUNT(*) FROM logs WHERE log=?", (log,)).fetchone()[0]

    # -- caller-owned tables ----------------------------------------------------------------------
    def ensure_table(self, ddl: str) -> None:
        """Create a caller-owned table/index (pass `CREATE TABLE IF NOT EXISTS ...`)."""
        with self._lock:
            self._run("creating a table", ddl)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one write statement; returns the number of rows changed."""
        with self._lock:
            return self._run("executing SQL", sql, params).rowcount

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._run("querying", sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> MetaStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
