"""fl-server with TLS logs the peer address and the reason of every failed TLS handshake (issue 11 item 6):
real handshakes against a mutual-TLS FlServer from raw sockets bound to known ports, each an attacker
or a misconfigured client; a good client is not reported, and is known by its certificate as before."""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl

import pytest

from mlsyskit.core.rpc import ClientTls, RpcClient, ServerTls
from mlsyskit.core.rpc_tls import client_paths, issue_certs
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig
from mlsyskit.tools.fl.server import FlServer


def _connect(port: int) -> socket.socket:
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.bind(("127.0.0.1", 0))  # a known local port: the one the server must name
    raw.settimeout(10)
    raw.connect(("127.0.0.1", port))
    return raw


def plaintext_grpc(port: int, payload: bytes) -> int:
    with _connect(port) as raw:
        local = raw.getsockname()[1]
        raw.sendall(payload)
        try:
            raw.recv(1)  # the door closes it
        except OSError:
            pass
        return local


def tls_attempt(port: int, ca, cert=None, key=None) -> int:
    """A TLS 1.3 handshake with these files; reads until the server closes or answers. Returns the local port."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    raw = _connect(port)
    local = raw.getsockname()[1]
    try:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.recv(1)
    except (ssl.SSLError, OSError):
        pass
    finally:
        raw.close()
    return local


@pytest.mark.slow
def test_failed_tls_handshakes_are_logged_with_the_peer_address_and_the_reason(tmp_path, caplog):
    files = issue_certs(tmp_path / "certs", client_ids=["0"])
    stranger = issue_certs(tmp_path / "other", client_ids=["0"])  # another CA, its own client pair
    config = JobConfig(strategy="fedavg", rounds=1, per_round=1, data=DataSpec(num_clients=2))
    tls = ServerTls.from_files(files.server_cert, files.server_key, client_ca=files.ca)
    caplog.set_level(logging.WARNING, logger="mlsyskit.fl.server")
    expected: list[tuple[int, str]] = []

    async def reported(local: int, reason: str) -> None:
        peer = f"ipv4:127.0.0.1:{local}"
        deadline = asyncio.get_running_loop().time() + 20
        while not any(peer in r.getMessage() and reason in r.getMessage() for r in caplog.records):
            assert asyncio.get_running_loop().time() < deadline, \
                f"no log naming {peer} with {reason!r}: {[r.getMessage() for r in caplog.records]}"
            await asyncio.sleep(0.02)  # polling the log for a condition, with a deadline

    async def main():
        store = MetaStore(tmp_path / "fl.db")
        server = FlServer(config, store, tls=tls)
        port = await server.start()
        try:
            attempts = [
                (lambda: plaintext_grpc(port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), "plaintext HTTP/2"),
                (lambda: plaintext_grpc(port, b"\x00\x01garbage"), "not TLS"),
                (lambda: tls_attempt(port, files.ca), "the client sent no certificate and the server requires one"),
                (lambda: tls_attempt(port, files.ca, *client_paths(stranger.directory, "0")),
                 "the server refused the client's certificate"),
                (lambda: tls_attempt(port, stranger.ca, *client_paths(files.directory, "0")),
                 "(it does not trust the server's certificate"),  # same CA name, another key: decrypt_error
            ]
            for attempt, reason in attempts:
                local = await asyncio.to_thread(attempt)
                expected.append((local, reason))
                await reported(local, reason)
            # a good client with its certificate gets through the door and is not reported
            before = server.door.failures
            cert, key = client_paths(files.directory, "0")
            async with RpcClient(f"localhost:{port}", tls=ClientTls.from_files(files.ca, cert, key)) as rpc:
                status = await rpc.call("status", {}, timeout=20)
            assert status["round"] == 0 and server.door.failures == before
        finally:
            await server.stop()
            store.close()

    asyncio.run(asyncio.wait_for(main(), 120))
    assert len(expected) == 5
    assert not any("Handshake failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("records,closes,ok,reason", [
    # TLS 1.3 success: ServerHello, CCS, the server's encrypted flight; the client's flight; the server's settings
    ([("client", b"\x16\x03\x01\x00\x05hello"), ("server", b"\x16\x03\x03\x00\x02hi\x14\x03\x03\x00\x01\x01"
                                                           b"\x17\x03\x03\x00\x03abc"),
      ("client", b"\x14\x03\x03\x00\x01\x01\x17\x03\x03\x00\x31" + b"f" * 49),
      ("server", b"\x17\x03\x03\x00\x2c" + b"s" * 44)], [], True, ""),
    # TLS 1.2 plaintext alert from the server: its description is named
    ([("client", b"\x16\x03\x01\x00\x01h"), ("server", b"\x15\x03\x03\x00\x02\x02\x74")], [], False,
     "certificate_required"),
    # a record header split across reads is still parsed
    ([("client", b"\x16\x03\x01\x00\x01h"), ("server", b"\x16\x03"), ("server", b"\x03\x00\x01x\x15\x03\x03"),
      ("server", b"\x00\x02\x02\x30")], [], False, "unknown_ca"),
    # the client leaves after the server's hello without a word: it distrusted the server
    ([("client", b"\x16\x03\x01\x00\x01h"), ("server", b"\x16\x03\x03\x00\x01x")], ["client"], False,
     "during the handshake"),
    # a port probe (connect, close) is not reported
    ([], ["client"], None, ""),
])
def test_handshake_watch_reads_record_headers_only(records, closes, ok, reason):
    from mlsyskit.tools.fl.tls_watch import HandshakeWatch

    watch = HandshakeWatch()
    for side, data in records:
        watch.feed(side, data)
    for side in closes:
        watch.closed(side)
    if ok is None:
        assert watch.verdict is None
    else:
        assert watch.verdict is not None and watch.verdict.ok is ok and reason in watch.verdict.reason
