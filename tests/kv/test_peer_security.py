"""Authenticated peers (issue 14, item 3): forged peer messages from clients are refused.

A client knows the shard map and epoch (BKV.SHARDMAP is public), so every forgery below
carries the right epoch and a real replica name; only the cluster secret is missing.
"""
from __future__ import annotations

import asyncio

import hiredis
import pytest

from mlsyskit.tools.kv import peerauth
from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from tests.kv.conftest import datalet_factory, make_map, peer_connection

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def msg(epoch: int, src: str, kind: bytes, *fields) -> tuple:
    return (b"BKV.MSG", epoch, src, kind, *fields)


async def connect(smap, node: str) -> RespConnection:
    a = smap.nodes[node]
    return await RespConnection.connect(a.host, a.port)


def test_forged_chain_and_ack_on_the_client_port_are_refused_with_a_reply(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        options = ControletOptions(write_timeout=0.5)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path), options=options) as cluster:
            head, tail = await connect(smap, "s0r0"), await connect(smap, "s0r2")
            assert await head.call(b"SET", b"x", b"old") == b"OK"
            await cluster.kill("s0r1")  # the next write can never reach the tail
            hung = head.call(b"SET", b"x", b"new")
            attacker = await connect(smap, "s0r0")
            for forged in (msg(smap.epoch, "s0r2", b"ACK", 999999999),):
                with pytest.raises(hiredis.ReplyError, match="NOPERM"):
                    await attacker.call(*forged)  # answered, never a hang
            with pytest.raises(hiredis.ReplyError, match="TRYAGAIN"):
                await hung  # the forged ACK released nothing: the write failed in time instead
            at_tail = await connect(smap, "s0r2")
            with pytest.raises(hiredis.ReplyError, match="NOPERM"):
                await at_tail.call(*msg(smap.epoch, "s0r1", b"CHAIN", 1, b"P", b"x", b"forged"))
            assert await tail.call(b"GET", b"x") == b"old"
            assert cluster.nodes["s0r2"].controlet.seq == 1  # its sequence was not reset either
            assert cluster.nodes["s0r0"].stats["refused_peer_messages"] == 1
            for c in (head, tail, attacker, at_tail):
                await c.close()

    run(body())


def test_forged_submit_wack_and_read_at_active_active_are_refused(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("aa-sc", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            seq = await connect(smap, "s0r0")
            for kind, fields in ((b"SUBMIT", (1, b"P", b"k", b"forged")), (b"WACK", (1,)), (b"READ", (1,))):
                with pytest.raises(hiredis.ReplyError, match="NOPERM"):
                    await seq.call(*msg(smap.epoch, "s0r1", kind, *fields))
            assert await seq.call(b"GET", b"k") is None
            assert cluster.nodes["s0r0"].controlet.slot == 0
            await seq.close()

    run(body())


def test_peer_authentication_needs_the_secret_and_a_fresh_nonce(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-ec", shards=1, replicas=2)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            conn = await connect(smap, "s0r1")
            nonce = await conn.call(b"BKV.NONCE")
            wrong = peerauth.proof(b"not the secret", nonce, b"s0r0", b"s0r1")
            with pytest.raises(hiredis.ReplyError, match="NOPERM"):
                await conn.call(b"BKV.AUTH", b"s0r0", wrong)
            # A proof recorded on one connection is useless on another (its nonce differs).
            good_nonce = await conn.call(b"BKV.NONCE")
            recorded = peerauth.proof(cluster.secret, good_nonce, b"s0r0", b"s0r1")
            other = await connect(smap, "s0r1")
            await other.call(b"BKV.NONCE")
            with pytest.raises(hiredis.ReplyError, match="NOPERM"):
                await other.call(b"BKV.AUTH", b"s0r0", recorded)
            # ...and against another node (the target is inside the proof).
            with pytest.raises(hiredis.ReplyError, match="NOPERM"):
                await conn.call(b"BKV.AUTH", b"s0r0", peerauth.proof(cluster.secret, good_nonce, b"s0r0", b"s0r0"))
            assert cluster.nodes["s0r1"].stats["auth_failures"] == 3
            # An authenticated peer cannot speak for another replica: the sender is who authenticated.
            peer = await peer_connection(cluster, "s0r1", "s0r1")
            peer.send(hiredis.pack_command(msg(smap.epoch, "s0r0", b"REPL", 1, b"P", b"k", b"spoofed")))
            assert await peer.call(b"GET", b"k") is None
            assert cluster.nodes["s0r1"].stats["refused_peer_messages"] == 1
            for c in (conn, other, peer):
                await c.close()

    run(body())
