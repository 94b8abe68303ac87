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

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mlsyskit.core.rpc_base import (  # noqa: F401 (re-exported: core.rpc is the public surface)
    _TOKEN_KEY,
    DEFAULT_MAX_MESSAGE_BYTES,
    TRANSPORT_FAILURES,
    ClientTls,
    KeepAlive,
    RpcError,
    ServerTls,
    StatusCode,
    _encode_request,
    _message_options,
    grpc,
)
from mlsyskit.core.rpc_client import BidiCall, RpcClient  # noqa: F401 (re-exported)
from mlsyskit.core.rpc_codec import CodecError, decode, encode

log = logging.getLogger("mlsyskit.rpc")


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
