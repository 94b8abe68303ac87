"""The client side of core.rpc: one channel to one server, unary, server-streaming and bidi calls."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from mlsyskit.core.rpc_base import (
    _TOKEN_KEY,
    DEFAULT_MAX_MESSAGE_BYTES,
    ClientTls,
    KeepAlive,
    RpcError,
    StatusCode,
    _decode_reply,
    _encode_request,
    _message_options,
    _unreachable_reason,
)


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
