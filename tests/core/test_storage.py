"""MetaStore: typed key/value, append-only logs, transactions, caller tables, clear errors."""
from __future__ import annotations

import threading

import pytest

from mlsyskit.core.storage import MetaStore, MissingDirectoryError, StorageError


@pytest.fixture
def store(tmp_path):
    with MetaStore(tmp_path / "meta.db") as s:
        yield s


def test_typed_values_round_trip(store):
    values = {"none": None, "bool": True, "int": -(2**40), "float": 0.1, "str": "héllo", "bytes": b"\x00\xff",
              "list": [1, "a", [2.5]], "dict": {"a": {"b": [1, 2]}, "3": None}}
    for k, v in values.items():
        store.put("ns", k, v)
    for k, v in values.items():
        assert store.get("ns", k) == v
    assert store.keys("ns") == sorted(values)
    assert store.get("other", "int", default=7) == 7
    with pytest.raises(KeyError, match="no key 'missing' in namespace 'ns'"):
        store.get("ns", "missing")
    assert store.delete("ns", "int") and not store.delete("ns", "int")
    with pytest.raises(TypeError, match="MetaStore stores"):
        store.put("ns", "bad", object())


def test_wal_mode_and_persistence(tmp_path):
    path = tmp_path / "m.db"
    with MetaStore(path) as s:
        assert s.query("PRAGMA journal_mode")[0][0] == "wal"
        s.put("a", "b", [1, 2])
        s.append("log", {"x": 1})
    with MetaStore(path) as s:
        assert s.get("a", "b") == [1, 2]
        assert s.read_log("log") == [(1, {"x": 1})]


def test_append_only_log_sequence_and_paging(store):
    seqs = [store.append("ledger", {"i": i}) for i in range(10)]
    assert seqs == list(range(1, 11))
    assert store.append("other", "x") == 1  # each log numbers its own records
    assert store.log_length("ledger") == 10
    assert [r["i"] for _, r in store.read_log("ledger", after=7)] == [7, 8, 9]
    assert [s for s, _ in store.read_log("ledger", after=2, limit=3)] == [3, 4, 5]


def test_transaction_rolls_back_everything_on_error(store):
    store.put("ns", "kept", 1)
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.put("ns", "kept", 2)
            store.append("log", "lost")
            with store.transaction():  # nested joins the outer transaction
                store.put("ns", "inner", 3)
            raise RuntimeError("boom")
    assert store.get("ns", "kept") == 1
    assert store.get("ns", "inner", None) is None
    assert store.log_length("log") == 0
    with store.transaction():
        store.put("ns", "kept", 4)
        store.append("log", "ok")
    assert store.get("ns", "kept") == 4 and store.log_length("log") == 1


def test_caller_owned_tables(store):
    store.ensure_table("CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, name TEXT, gpus INTEGER)")
    store.ensure_table("CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, name TEXT, gpus INTEGER)")
    assert store.execute("INSERT INTO jobs (name, gpus) VALUES (?, ?)", ("bert", 4)) == 1
    store.execute("INSERT INTO jobs (name, gpus) VALUES (?, ?)", ("ncf", 1))
    assert store.query("SELECT name, gpus FROM jobs ORDER BY id") == [("bert", 4), ("ncf", 1)]
    with pytest.raises(StorageError, match="no such table"):
        store.query("SELECT * FROM nope")


def test_concurrent_appends_from_threads_get_unique_sequence_numbers(store):
    got: list[int] = []
    lock = threading.Lock()

    def worker():
        for _ in range(50):
            seq = store.append("log", "r")
            with lock:
                got.append(seq)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 201))


def test_missing_directory_and_corrupt_file_errors(tmp_path):
    with pytest.raises(MissingDirectoryError, match="does not exist"):
        MetaStore(tmp_path / "nope" / "m.db")
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StorageError, match="corrupt"):
        MetaStore(bad)
