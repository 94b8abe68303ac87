"""Async RPC for the suite: gRPC (grpc.aio) with generic method handlers and msgpack payloads.

No code generation: a handler is an async function registered by name that takes the decoded
payload (dicts, lists, scalars, numpy arrays, torch tensors; see core.rpc_codec) and returns one
(unary) or yields several (server streaming); a bidirectional handler takes the async iterator of
the client's decoded messages and yields its own (one long-lived call, no per-message call set-up:
about half the CPU of a unary call per exchange). Every call carries the shared-secret token as
`authorization: Bearer <token>` metadata and the server checks it (constant-time) before it
decodes anything; a wrong or missing token is UNAUTHENTICATED. TLS is optional (server cert
and key; the client trusts a CA; mutual TLS when the server is given a client CA).

Errors come back as `RpcError(code, message)` with messages written for people, e.g.
"cannot reach 127.0.0.1:5000: connection refused" or "train on 127.0.0.1:5000 timed out after 2s".
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# gRPC's C core prints info lines of its own on stderr (e.g. "Handshake failed ... WRONG_VERSION_NUMBER"
# for every plaintext client at a TLS port), without the peer's address; our own messages say what
# happened. Errors still show; a user who wants its traces sets GRPC_VERBOSITY/GRPC_TRACE explicitly.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
import grpc  # noqa: E402 (after the environment above)

from mlsyskit.core.rpc_codec import CodecError, decode, encode

log = logging.getLogger("mlsyskit.rpc")

StatusCode = grpc.StatusCode
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_TOKEN_KEY = "authorization"
# codes a lost or restarted peer produces (refused, reset, torn-down stream, a server killed mid-call):
# worth reconnecting after; anything else is an answer that a retry would only repeat
TRANSPORT_FAILURES = frozenset({StatusCode.UNAVAILABLE, StatusCode.INTERNAL, StatusCode.CANCELLED,
                                StatusCode.DEADLINE_EXCEEDED, StatusCode.UNKNOWN, StatusCode.ABORTED})


class RpcError(Exception):
    """A failed call: `code` is a grpc.StatusCode, `message` says what happened in plain words."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.code.name}]"


@dataclass(frozen=True)
class KeepAlive:
    """HTTP/2 pings that detect a dead peer on an idle connection."""

    interval_s: float = 30.0
    timeout_s: float = 10.0

    def options(self) -> list[tuple[str, int]]:
        return [("grpc.keepalive_time_ms", int(self.interval_s * 1000)),
                ("grpc.keepalive_timeout_ms", int(self.timeout_s * 1000)),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0)]


@dataclass(frozen=True)
class ServerTls:
    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None  # set -> clients must present a certificate signed by it

    @classmethod
    def from_files(cls, cert: str | Path, key: str | Path, client_ca: str | Path | None = None) -> ServerTls:
        return cls(_read(cert, "TLS certificate"), _read(key, "TLS key"),
                   _read(client_ca, "client CA") if client_ca else None)


@dataclass(frozen=True)
class ClientTls:
    ca: bytes | None = None  # None -> the system trust store
    cert_chain: bytes | None = None
    private_key: bytes | None = None
    server_name: str | None = None  # override the name checked against the server certificate

    @classmethod
    def from_files(cls, ca: str | Path | None = None, cert: str | Path | None = None,
                   key: str | Path | None = None, server_name: str | None = None) -> ClientTls:
        return cls(_read(ca, "TLS CA") if ca else None, _read(cert, "TLS certificate") if cert else None,
                   _read(key, "TLS key") if key else None, server_name)


def _read(path: str | Path | None, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"cannot read {what} {path}: {e.strerror}") from None


def _message_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


@dataclass(frozen=True)
class CallContext:
    """What a handler may want to know about the call it serves.

    `identity` is the common name (CN) of the client certificate that the TLS handshake verified
    against the server's client CA, or None without mutual TLS: a name the caller proved, not one
    it claims in a payload.
    """

    method: str
    peer: str
    identity: str | None = None


def _identity(context: grpc.aio.ServicerContext) -> str | None:
    auth = context.auth_context() or {}
    names = auth.get("x509_common_name") or []
    return names[0].decode("utf-8", "replace") if len(names) == 1 else None


UnaryHandler = Callable[[Any, CallContext], Awaitable[Any]]
StreamHandler = Callable[[Any, CallContext], AsyncIterator[Any]]
BidiHandler = Callable[[AsyncIterator[Any], CallContext], AsyncIterator[Any]]


class RpcServer:
    """Register handlers by name, then `await start()`; `port` is the bound port (address may use :0)."""

    def __init__(self, address: str = "127.0.0.1:0", *, token: str | None = None, tls: ServerTls | None = None,
                 service: str = "mlsyskit", max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 keepalive: KeepAlive = KeepAlive()) -> None:
        self.address = address
        self.service = service
        self._token = token.encode() if token else None
        self._tls = tls
        self._max_message_bytes = max_message_bytes
        self._keepalive = keepalive
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._server: grpc.aio.Server | None = None
        self.port: int | None = None

    def unary(self, name: str, fn: UnaryHandler) -> None:
        self._check_name(name)
        self._handlers[name] = grpc.unary_unary_rpc_method_handler(self._wrap_unary(name, fn))

    def stream(self, name: str, fn: StreamHandler) -> None:
        self._check_name(name)
        self._handlers[name] = grpc.unary_stream_rpc_method_handler(self._wrap_stream(name, fn))

    def bidi(self, name: str, fn: BidiHandler) -> None:
        self._check_name(name)
        self._handlers[name] = grpc.stream_stream_rpc_method_handler(self._wrap_bidi(name, fn))

    def _check_name(self, name: str) -> None:
        if self._server is not None:
            raise RuntimeError("register handlers before start()")
        if name in self._handlers:
            raise ValueError(f"handler {name!r} is already registered")

    async def start(self) -> int:
        options = _message_options(self._max_message_bytes) + self._keepalive.options() + [
            ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
            ("grpc.http2.min_ping_interval_without_data_ms", int(self._keepalive.interval_s * 500)),
        ]
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(self.service, self._handlers),))
        try:
            if self._tls is None:
                port = server.add_insecure_port(self.address)
            else:
                creds = grpc.ssl_server_credentials([(self._tls.private_key, self._tls.cert_chain)],
                                                    root_certificates=self._tls.client_ca,
                                                    require_client_auth=self._tls.client_ca is not None)
                port = server.add_secure_port(self.address, creds)
        except RuntimeError as e:
            raise RpcError(StatusCode.UNAVAILABLE, f"cannot listen on {self.address}: {e}") from None
        if not port:
            raise RpcError(StatusCode.UNAVAILABLE, f"cannot listen on {self.address}: address in use or invalid")
        await server.start()
        self._server, self.port = server, port
        return port

    async def stop(self, grace: float | None = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def _authorize(self, method: str, context: grpc.aio.ServicerContext) -> None:
        if self._token is not None:
            sent = dict(context.invocation_metadata() or ()).get(_TOKEN_KEY, "")
            if not hmac.compare_digest(sent.encode(), b"Bearer " + self._token):
                log.warning("refused %s from %s: bad or missing token", method, context.peer())
                await context.abort(StatusCode.UNAUTHENTICATED, "bad or missing token")

    async def _admit(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> tuple[Any, CallContext]:
        await self._authorize(method, context)
        try:
            payload = decode(request)
        except CodecError as e:
            log.warning("refused %s from %s: %s", method, context.peer(), e)
            await context.abort(StatusCode.INVALID_ARGUMENT, str(e))
        return payload, CallContext(method, context.peer(), _identity(context))

    def _wrap_unary(self, method: str, fn: UnaryHandler):
        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            payload, call = await self._admit(method, request, context)
            try:
                return encode(await fn(payload, call))
            except Exception as e:
                await context.abort(*_failure(method, e))

        return handle

    def _wrap_stream(self, method: str, fn: StreamHandler):
        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            payload, call = await self._admit(method, request, context)
            async for reply in _relay(method, fn(payload, call), context):
                yield reply

        return handle

    def _wrap_bidi(self, method: str, fn: BidiHandler):
        async def handle(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            await self._authorize(method, context)  # before anything the client sent is decoded
            call = CallContext(method, context.peer(), _identity(context))

            async def decoded() -> AsyncIterator[Any]:
                async for request in requests:
                    try:
                        yield decode(request)
                    except CodecError as e:
                        log.warning("refused a %s message from %s: %s", method, call.peer, e)
                        raise RpcError(StatusCode.INVALID_ARGUMENT, str(e)) from None

            async for reply in _relay(method, fn(decoded(), call), context):
                yield reply

        return handle


def _failure(method: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status a failed handler answers with: its own RpcError, or INTERNAL for a bug.

    A handler bug must not take the server down; the caller learns why and the log keeps the traceback.
    """
    if isinstance(exc, RpcError):
        return exc.code, exc.message
    log.error("handler %s failed", method, exc_info=exc)
    return StatusCode.INTERNAL, f"{method} failed: {type(exc).__name__}: {exc}"


async def _relay(method: str, items: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    """Encode a streaming handler's replies; abort the call with `_failure`'s status if it raises."""
    failure = None
    try:
        async for item in items:
            yield encode(item)
    except Exception as e:
        failure = _failure(method, e)
    if failure is not None:  # abort outside the except block: it raises to end the call
        await context.abort(*failure)


class BidiCall:
    """A bidirectional call: `await send(payload)` any time, `async for reply in call` for the server's."""

    def __init__(self, client: RpcClient, method: str, call: grpc.aio.StreamStreamCall, timeout: float | None) -> None:
        self._client, self._method, self._call, self._timeout = client, method, call, timeout

    async def send(self, payload: Any) -> None:
        request = _encode_request(self._method, payload)
        try:
            await self._call.write(request)
        except grpc.aio.AioRpcError as e:
            raise self._client._translate(self._method, e, self._timeout) from None
        except asyncio.InvalidStateError:  # the call already ended; its status says why
            raise RpcError(StatusCode.CANCELLED, f"{self._method} on {self._client.address} has ended") from None

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            async for reply in self._call:
                yield _decode_reply(self._method, reply)
        except grpc.aio.AioRpcError as e:
            raise self._client._translate(self._method, e, self._timeout) from None

    async def done_writing(self) -> None:
        await self._call.done_writing()

    def cancel(self) -> None:
        self._call.cancel()


class RpcClient:
    """One channel to one server; `call` for unary, `stream` for server streaming. Use `async with`."""

    def __init__(self, address: str, *, token: str | None = None, tls: ClientTls | None = None,
                 service: str = "mlsyskit", timeout: float | None = 30.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, keepalive: KeepAlive = KeepAlive()) -> None:
        self.address = address
        self.service = service
        self.timeout = timeout
        self._metadata = ((_TOKEN_KEY, f"Bearer {token}"),) if token else ()
        self._tls = tls
        self._options = _message_options(max_message_bytes) + keepalive.options()
        self._channel: grpc.aio.Channel | None = None

    def _get_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            if self._tls is None:
                self._channel = grpc.aio.insecure_channel(self.address, options=self._options)
            else:
                creds = grpc.ssl_channel_credentials(self._tls.ca, self._tls.private_key, self._tls.cert_chain)
                options = list(self._options)
                if self._tls.server_name:
                    options.append(("grpc.ssl_target_name_override", self._tls.server_name))
                self._channel = grpc.aio.secure_channel(self.address, creds, options=options)
        return self._channel

    async def connect(self, timeout: float = 10.0) -> None:
        """Wait until the server accepts connections (retrying), or raise UNAVAILABLE after `timeout`."""
        channel = self._get_channel()
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout)
        except TimeoutError:
            raise RpcError(StatusCode.UNAVAILABLE,
                           f"cannot reach {self.address}: no server answered within {timeout:g}s") from None

    async def call(self, method: str, payload: Any = None, *, timeout: float | None = ...) -> Any:
        timeout = self.timeout if timeout is ... else timeout
        stub = self._get_channel().unary_unary(f"/{self.service}/{method}")
        request = _encode_request(method, payload)
        try:
            reply = await stub(request, timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise self._translate(method, e, timeout) from None
        return _decode_reply(method, reply)

    async def stream(self, method: str, payload: Any = None, *, timeout: float | None = ...) -> AsyncIterator[Any]:
        """Yield each message of a server stream; `timeout` bounds the whole stream."""
        timeout = self.timeout if timeout is ... else timeout
        stub = self._get_channel().unary_stream(f"/{self.service}/{method}")
        call = stub(_encode_request(method, payload), timeout=timeout, metadata=self._metadata)
        try:
            async for reply in call:
                yield _decode_reply(method, reply)
        except grpc.aio.AioRpcError as e:
            raise self._translate(method, e, timeout) from None
        finally:
            call.cancel()

    def bidi(self, method: str, *, timeout: float | None = ...) -> BidiCall:
        """Open a bidirectional call; `timeout` bounds the whole call. Cancel it when done."""
        timeout = self.timeout if timeout is ... else timeout
        stub = self._get_channel().stream_stream(f"/{self.service}/{method}")
        return BidiCall(self, method, stub(timeout=timeout, metadata=self._metadata), timeout)

    def _translate(self, method: str, error: grpc.aio.AioRpcError, timeout: float | None) -> RpcError:
        code, details = error.code(), error.details() or ""
        if code == StatusCode.UNAVAILABLE:
            return RpcError(code, f"cannot reach {self.address}: {_unreachable_reason(details)}")
        if code == StatusCode.DEADLINE_EXCEEDED:
            return RpcError(code, f"{method} on {self.address} timed out after {timeout:g}s")
        if code == StatusCode.UNAUTHENTICATED:
            return RpcError(code, f"{self.address} refused {method}: {details}")
        if code == StatusCode.UNIMPLEMENTED:
            return RpcError(code, f"{self.address} has no method {method!r}")
        return RpcError(code, f"{method} on {self.address}: {details}")

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _encode_request(method: str, payload: Any) -> bytes:
    try:
        return encode(payload)
    except CodecError as e:
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"cannot send {method}: {e}") from None


def _decode_reply(method: str, reply: bytes) -> Any:
    try:
        return decode(reply)
    except CodecError as e:
        raise RpcError(StatusCode.DATA_LOSS, f"bad reply to {method}: {e}") from None


def _unreachable_reason(details: str) -> str:
    lowered = details.lower()
    if "connection refused" in lowered:
        return "connection refused"
    if "handshake" in lowered or "ssl" in lowered or "certificate" in lowered:
        return f"TLS handshake failed ({details.strip()})"
    if "dns" in lowered or "resolve" in lowered:
        return f"cannot resolve the address ({details.strip()})"
    return details.strip() or "unavailable"
