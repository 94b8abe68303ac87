"""fl-server's TLS door: the public port relays each connection to gRPC's TLS port on loopback and logs,
with the peer's address, every connection whose TLS handshake fails or that is not TLS at all.

gRPC terminates TLS in its C core and gives Python no hook for a handshake that fails there (its own
log lines name no peer). The door does not terminate TLS: it passes the bytes through unchanged (so
gRPC still checks certificates and knows each client by its certificate) and reads only the record
headers until the handshake's outcome is known (tls_watch.py); a plaintext client is refused at
once, without reaching gRPC. Calls then see the door's loopback address as their peer:
`real_peer` maps it back to the client's, for the server's logs.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from mlsyskit.tools.fl.tls_watch import CLIENT, SERVER, HandshakeWatch

log = logging.getLogger("mlsyskit.fl.server")

CHUNK = 256 * 1024
FIRST_BYTES_TIMEOUT_S = 30.0  # a connection that says nothing for this long is closed


def _grpc_peer(host: str, port: int) -> str:
    """gRPC's spelling of an address (what `context.peer()` returns)."""
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


class TlsDoor:
    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self._server: asyncio.Server | None = None
        self._backend_port = 0
        self._peers: dict[str, str] = {}  # the door's own loopback address, as gRPC sees it -> the client's
        self._connections: set[asyncio.Task] = set()
        self.failures = 0

    async def start(self, backend_port: int) -> int:
        """Listen on the public address, relaying to gRPC on 127.0.0.1:backend_port; returns the public port."""
        self._backend_port = backend_port
        self._server = await asyncio.start_server(self._accept, self.host or None, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def real_peer(self, peer: str) -> str:
        return self._peers.get(peer, peer)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        address = writer.get_extra_info("peername")
        peer = _grpc_peer(address[0], address[1]) if address else "unknown peer"
        try:
            await self._relay(reader, writer, peer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # stop() cancels open relays. The task must not end cancelled: asyncio's stream callback calls
            # task.exception() on it, which raises for a cancelled task and was logged as a traceback at exit
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        watch = HandshakeWatch()
        try:
            first = await asyncio.wait_for(reader.read(CHUNK), FIRST_BYTES_TIMEOUT_S)
        except TimeoutError:
            return
        if not first:
            return  # connected and left: a port probe
        if watch.feed(CLIENT, first) is not None:  # not TLS: refused before it reaches gRPC
            self._report(peer, watch)
            return
        back_reader, back_writer = await asyncio.open_connection("127.0.0.1", self._backend_port)
        local = back_writer.get_extra_info("sockname")
        inner = _grpc_peer(local[0], local[1])
        self._peers[inner] = peer
        try:
            back_writer.write(first)
            await back_writer.drain()
            await asyncio.gather(self._pump(reader, back_writer, CLIENT, watch, peer),
                                 self._pump(back_reader, writer, SERVER, watch, peer))
        finally:
            self._peers.pop(inner, None)
            back_writer.close()
            with contextlib.suppress(Exception):
                await back_writer.wait_closed()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, side: str,
                    watch: HandshakeWatch, peer: str) -> None:
        try:
            while data := await source.read(CHUNK):
                if not watch.done and watch.feed(side, data) is not None:
                    self._report(peer, watch)
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        if not watch.done and watch.closed(side) is not None:
            self._report(peer, watch)
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            if sink.can_write_eof():
                sink.write_eof()  # half-close: the other side may still be sending

    def _report(self, peer: str, watch: HandshakeWatch) -> None:
        verdict = watch.verdict
        if verdict is not None and not verdict.ok:
            self.failures += 1
            log.warning("TLS handshake with %s failed: %s", peer, verdict.reason)
