"""aa-sc on a busy host (issue 22 item 3): a request waiting on replicas that keep speaking is not
failed at write_timeout (a long pipelined queue still drains), while one waiting on a silent
replica is, and nothing waits past 8x write_timeout. Pure controlet, virtual time, no sockets."""
from __future__ import annotations

from types import SimpleNamespace

from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.controlets.base import GET, PUT, ControletOptions, Fail

WAIT = 1.0
OPTIONS = ControletOptions(write_timeout=WAIT, sync_timeout=0.1)


def replica_r1():
    return controlet_class("aa-sc")("r1", ["r0", "r1", "r2"], 1, OPTIONS)


def failed(actions) -> list:
    return [a.req for a in actions if isinstance(a, Fail)]


def test_a_read_waits_while_the_sequencer_keeps_speaking_and_fails_once_it_is_silent() -> None:
    c = replica_r1()
    read = SimpleNamespace(op=GET, key=b"k", value=None)
    c.on_client(read)
    for step in range(1, 6):  # the sequencer answers others (a stream it keeps sending), not us yet
        c.on_peer("r0", b"AT", (0,))
        assert failed(c.on_tick(step * 0.5)) == []
    assert failed(c.on_tick(2.5 + WAIT)) == [read]  # silent for write_timeout: -TRYAGAIN


def test_a_write_waits_on_every_replica_so_one_silent_replica_fails_it_on_time() -> None:
    c = replica_r1()
    write = SimpleNamespace(op=PUT, key=b"k", value=b"v")
    c.on_client(write)
    c.on_peer("r0", b"AT", (0,))
    c.on_peer("r2", b"AT", (0,))
    assert failed(c.on_tick(0.5)) == []
    c.on_peer("r0", b"AT", (0,))  # r2 says nothing more
    assert failed(c.on_tick(WAIT + 0.5)) == [write]


def test_nothing_waits_past_eight_write_timeouts_even_while_peers_speak() -> None:
    c = replica_r1()
    read = SimpleNamespace(op=GET, key=b"k", value=None)
    c.on_client(read)
    t = 0.0
    while t < 8 * WAIT - 0.25:
        t += 0.25
        c.on_peer("r0", b"AT", (0,))
        c.on_peer("r2", b"AT", (0,))
        assert failed(c.on_tick(t)) == [], t
    assert failed(c.on_tick(8 * WAIT)) == [read]
