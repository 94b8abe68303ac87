"""core.rpc over real loopback sockets: echo (unary + stream), TLS, token auth, deadlines, clear errors."""
from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
import torch

from mlsyskit.core.errors import UsageError
from mlsyskit.core.rpc import ClientTls, RpcClient, RpcError, RpcServer, ServerTls, StatusCode
from mlsyskit.core.rpc_tls import issue_certs
from tests.conftest import free_port

pytestmark = pytest.mark.slow  # starts servers or subprocesses


def make_echo_server(**kwargs) -> RpcServer:
    server = RpcServer(**kwargs)

    async def echo(payload, call):
        return {"echo": payload, "method": call.method, "identity": call.identity}

    async def count(payload, call):
        for i in range(payload["n"]):
            yield {"i": i, "w": np.full(3, i, dtype=np.int16)}

    async def slow(payload, call):
        await asyncio.Event().wait()  # never answers: only the deadline ends the call

    async def broken(payload, call):
        raise KeyError("missing")

    async def refuse(payload, call):
        raise RpcError(StatusCode.FAILED_PRECONDITION, "round 3 is closed")

    async def chat(requests, call):  # answers each message, then says how many it got
        n = 0
        async for message in requests:
            n += 1
            yield {"echo": message, "n": n}
        yield {"total": n}

    server.unary("echo", echo)
    server.stream("count", count)
    server.bidi("chat", chat)
    server.unary("slow", slow)
    server.unary("broken", broken)
    server.unary("refuse", refuse)
    return server


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_echo_unary_and_stream_with_arrays_and_tensors():
    async def main():
        server = make_echo_server(token="s3cret")
        port = await server.start()
        try:
            async with RpcClient(f"127.0.0.1:{port}", token="s3cret") as client:
                weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.float64)}
                reply = await client.call("echo", weights, timeout=5)
                assert reply["method"] == "echo"
                assert np.array_equal(reply["echo"]["w"], weights["w"])
                assert torch.equal(reply["echo"]["b"], weights["b"])
                items = [m async for m in client.stream("count", {"n": 4}, timeout=5)]
                assert [m["i"] for m in items] == [0, 1, 2, 3]
                assert items[3]["w"].tolist() == [3, 3, 3]
        finally:
            await server.stop()

    run(main())


def test_bidirectional_call_interleaves_and_refuses_garbage_and_bad_tokens():
    async def main():
        server = make_echo_server(token="s3cret")
        port = await server.start()
        try:
            async with RpcClient(f"127.0.0.1:{port}", token="s3cret") as client:
                chat = client.bidi("chat", timeout=5)
                replies = aiter(chat)
                for i in range(3):  # each reply arrives before the next message is sent
                    await chat.send({"w": np.full(2, i, dtype=np.float32)})
                    reply = await anext(replies)
                    assert reply["n"] == i + 1 and reply["echo"]["w"].tolist() == [i, i]
                await chat.done_writing()
                assert [m async for m in replies] == [{"total": 3}]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.stream_stream("/mlsyskit/chat")(metadata=(("authorization", "Bearer s3cret"),))
                await call.write(b"\x93garbage")
                with pytest.raises(grpc.aio.AioRpcError) as raw:
                    await call.read()
                assert raw.value.code() == StatusCode.INVALID_ARGUMENT
            async with RpcClient(f"127.0.0.1:{port}", token="wrong") as client:
                chat = client.bidi("chat", timeout=5)
                with pytest.raises(RpcError) as info:  # the refusal may already fail the send (seen in CI)
                    await chat.send({"x": 1})
                    _ = [m async for m in chat]
                assert info.value.code == StatusCode.UNAUTHENTICATED
        finally:
            await server.stop()

    run(main())


def test_echo_over_tls_with_token(tmp_path):
    files = issue_certs(tmp_path)

    async def main():
        server = make_echo_server(token="t", tls=ServerTls.from_files(files.server_cert, files.server_key))
        port = await server.start()
        try:
            async with RpcClient(f"127.0.0.1:{port}", token="t", tls=ClientTls.from_files(files.ca)) as client:
                reply = await client.call("echo", {"x": 1}, timeout=5)
                assert reply["echo"] == {"x": 1} and reply["identity"] is None  # no client certificate asked
            # a client that does not trust the server's CA cannot connect at all
            other = issue_certs(tmp_path / "other")
            async with RpcClient(f"127.0.0.1:{port}", token="t", tls=ClientTls.from_files(other.ca)) as client:
                with pytest.raises(RpcError) as info:
                    await client.call("echo", {}, timeout=5)
                assert info.value.code == StatusCode.UNAVAILABLE
                assert f"cannot reach 127.0.0.1:{port}" in info.value.message
        finally:
            await server.stop()

    run(main())


def test_mutual_tls_requires_a_client_certificate_and_names_the_caller(tmp_path):
    files = issue_certs(tmp_path, client_ids=["7"])

    async def main():
        tls = ServerTls.from_files(files.server_cert, files.server_key, client_ca=files.ca)
        server = make_echo_server(tls=tls)
        port = await server.start()
        try:
            with_cert = ClientTls.from_files(files.ca, *files.client("7"))
            async with RpcClient(f"localhost:{port}", tls=with_cert) as client:
                reply = await client.call("echo", 7, timeout=5)
                assert reply["echo"] == 7 and reply["identity"] == "7"  # the certificate's CN, not a claim
            async with RpcClient(f"localhost:{port}", tls=ClientTls.from_files(files.ca)) as client:
                with pytest.raises(RpcError) as info:
                    await client.call("echo", 7, timeout=5)
                assert info.value.code == StatusCode.UNAVAILABLE
        finally:
            await server.stop()

    run(main())


def test_wrong_or_missing_token_is_unauthenticated():
    async def main():
        server = make_echo_server(token="right")
        port = await server.start()
        try:
            for token in ("wrong", None):
                async with RpcClient(f"127.0.0.1:{port}", token=token) as client:
                    with pytest.raises(RpcError) as info:
                        await client.call("echo", {"x": 1}, timeout=5)
                    assert info.value.code == StatusCode.UNAUTHENTICATED
                    assert "bad or missing token" in info.value.message
                    with pytest.raises(RpcError) as info:
                        _ = [m async for m in client.stream("count", {"n": 2}, timeout=5)]
                    assert info.value.code == StatusCode.UNAUTHENTICATED
        finally:
            await server.stop()

    run(main())


def test_unreachable_peer_has_a_clear_message():
    port = free_port()

    async def main():
        async with RpcClient(f"127.0.0.1:{port}") as client:
            with pytest.raises(RpcError) as info:
                await client.call("echo", {}, timeout=5)
            assert info.value.code == StatusCode.UNAVAILABLE
            assert info.value.message == f"cannot reach 127.0.0.1:{port}: connection refused"
            with pytest.raises(RpcError, match="no server answered within 0.3s"):
                await client.connect(timeout=0.3)

    run(main())


def test_deadline_handler_errors_and_unknown_method():
    async def main():
        server = make_echo_server()
        port = await server.start()
        try:
            async with RpcClient(f"127.0.0.1:{port}") as client:
                with pytest.raises(RpcError) as info:
                    await client.call("slow", {}, timeout=0.3)
                assert info.value.code == StatusCode.DEADLINE_EXCEEDED
                assert info.value.message == f"slow on 127.0.0.1:{port} timed out after 0.3s"
                with pytest.raises(RpcError) as info:
                    await client.call("broken", {})
                assert info.value.code == StatusCode.INTERNAL and "KeyError" in info.value.message
                with pytest.raises(RpcError) as info:
                    await client.call("refuse", {})
                assert info.value.code == StatusCode.FAILED_PRECONDITION
                assert info.value.message.endswith("round 3 is closed")
                with pytest.raises(RpcError) as info:
                    await client.call("nope", {})
                assert info.value.code == StatusCode.UNIMPLEMENTED
                # the server is still healthy after all of that
                assert (await client.call("echo", "ok"))["echo"] == "ok"
        finally:
            await server.stop()

    run(main())


def test_garbage_bytes_and_oversized_messages_are_rejected_not_fatal():
    async def main():
        server = make_echo_server(max_message_bytes=64 * 1024)
        port = await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                raw = channel.unary_unary("/mlsyskit/echo")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await raw(b"\xc1\xc1 not msgpack", timeout=5)
                assert info.value.code() == StatusCode.INVALID_ARGUMENT
                assert "cannot decode payload" in info.value.details()
            async with RpcClient(f"127.0.0.1:{port}") as client:
                with pytest.raises(RpcError) as info:
                    await client.call("echo", {"big": np.zeros(100_000, dtype=np.float32)}, timeout=5)
                assert info.value.code == StatusCode.RESOURCE_EXHAUSTED
                assert (await client.call("echo", 1))["echo"] == 1
        finally:
            await server.stop()

    run(main())


def test_port_in_use_fails_clearly():
    async def main():
        first = make_echo_server()
        port = await first.start()
        try:
            second = make_echo_server(address=f"127.0.0.1:{port}")
            with pytest.raises(RpcError, match=f"cannot listen on 127.0.0.1:{port}"):
                await second.start()
        finally:
            await first.stop()

    run(main())


def test_issue_certs_extends_the_same_ca_and_keeps_keys_private(tmp_path):
    first = issue_certs(tmp_path, client_ids=["0"], hosts=["fl.example"], ips=["127.0.0.1", "::1"], days=2)
    ca = first.ca.read_bytes()
    second = issue_certs(tmp_path, client_ids=["1"])
    assert second.ca.read_bytes() == ca  # client 0's pair stays valid
    for path in (first.server_key, *first.client("0"), *second.client("1"), tmp_path / "ca.key"):
        assert path.exists()
    for key in tmp_path.glob("*.key"):
        assert key.stat().st_mode & 0o777 == 0o600
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(second.client("1")[0].read_bytes())
    assert cert.subject.rfc4514_string() == "CN=1"
    with pytest.raises(UsageError, match="client id"):
        issue_certs(tmp_path, client_ids=["a/b"])
    with pytest.raises(UsageError, match="--days"):
        issue_certs(tmp_path, days=0)


def test_probe_tls_tells_plaintext_tls_and_client_certificates_apart(tmp_path):
    from mlsyskit.core.rpc_tls import probe_tls

    files = issue_certs(tmp_path, client_ids=["0"])

    async def main():
        plain = make_echo_server()
        tls = make_echo_server(tls=ServerTls.from_files(files.server_cert, files.server_key))
        mutual = make_echo_server(tls=ServerTls.from_files(files.server_cert, files.server_key, client_ca=files.ca))
        ports = [await s.start() for s in (plain, tls, mutual)]
        try:
            return [await asyncio.to_thread(probe_tls, "127.0.0.1", p) for p in ports]
        finally:
            for s in (plain, tls, mutual):
                await s.stop()

    assert run(main()) == ["plaintext", "tls", "tls-client-cert"]
    assert probe_tls("127.0.0.1", free_port()) is None
