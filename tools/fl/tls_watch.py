"""Tell from the TLS record headers of one connection whether its handshake succeeded, failed, or was
never TLS at all: pure, fed the bytes each side sends, no decryption.

gRPC gives Python no hook for a failed handshake (it happens in its C core before any call), so
fl-server's TLS door (tls_door.py) relays each connection's bytes and lets this watcher read the
5-byte record headers (type, version, length) until the outcome is known:

* the client's first bytes are not a TLS handshake record: a plaintext (or garbage) client;
* a plaintext alert record (type 21, TLS 1.2 or before encryption) from either side: that side
  refused, and the alert's description says why (e.g. 48 unknown_ca: a client that does not trust
  the server's certificate);
* TLS 1.3 encrypts the rest of the handshake, but lengths still tell: once the client has sent its
  encrypted flight, a server that closes (gRPC's sends no alert; any alert is a 19-byte record: 2
  bytes of alert, 1 of inner type, a 16-byte AEAD tag) before any longer record refused the client.
  If the client's first encrypted record is 25 bytes, it was an empty Certificate message (8 bytes
  + 1 + 16): the client has no certificate; a client whose first encrypted record is a 19-byte
  alert, then closes, refused the server's certificate;
* established: after the client's encrypted flight, the server sends a longer encrypted record (its
  HTTP/2 settings); in TLS 1.2, the server's ChangeCipherSpec after the client's. From then on
  nothing is parsed.
"""
from __future__ import annotations

from dataclasses import dataclass

HANDSHAKE, CHANGE_CIPHER_SPEC, ALERT, APPLICATION_DATA = 22, 20, 21, 23
ENCRYPTED_ALERT_LENGTH = 19  # TLS 1.3: alert (2) + inner content type (1) + AEAD tag (16)
EMPTY_CERTIFICATE_LENGTH = 25  # TLS 1.3: Certificate message with no certificate (8) + inner type (1) + tag (16)
CERTIFICATE_ALERTS = {42, 43, 44, 45, 46, 48, 51}  # 51 decrypt_error: a signature in its chain did not verify
ALERTS = {0: "close_notify", 10: "unexpected_message", 20: "bad_record_mac", 40: "handshake_failure",
          42: "bad_certificate", 43: "unsupported_certificate", 44: "certificate_revoked", 45: "certificate_expired",
          46: "certificate_unknown", 47: "illegal_parameter", 48: "unknown_ca", 49: "access_denied",
          50: "decode_error", 51: "decrypt_error", 70: "protocol_version", 71: "insufficient_security",
          80: "internal_error", 112: "unrecognized_name", 116: "certificate_required", 120: "no_application_protocol"}
CLIENT, SERVER = "client", "server"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str  # for a failure: what went wrong, in words a person can act on


class _Records:
    """Splits one direction's byte stream into (type, length, second payload byte or None) record headers:
    the second byte of an alert is its description (the first is its level)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.skip = 0  # payload bytes of the current record still to pass

    def feed(self, data: bytes) -> list[tuple[int, int, int | None]]:
        out = []
        self.buffer += data
        while True:
            if self.skip:
                taken = min(self.skip, len(self.buffer))
                self.buffer, self.skip = self.buffer[taken:], self.skip - taken
                if self.skip:
                    return out
            if len(self.buffer) < 5:
                return out
            kind, length = self.buffer[0], int.from_bytes(self.buffer[3:5], "big")
            first = self.buffer[6] if len(self.buffer) > 6 and length >= 2 else None
            out.append((kind, length, first))
            self.buffer, self.skip = self.buffer[5:], length


class HandshakeWatch:
    def __init__(self) -> None:
        self.verdict: Verdict | None = None
        self._records = {CLIENT: _Records(), SERVER: _Records()}
        self._first = True  # nothing seen from the client yet
        self._server_hello = False
        self._client_encrypted: int | None = None  # length of the client's first encrypted record
        self._client_ccs = False

    @property
    def done(self) -> bool:
        return self.verdict is not None

    def feed(self, side: str, data: bytes) -> Verdict | None:
        if self.verdict is not None or not data:
            return self.verdict
        if side == CLIENT and self._first:
            self._first = False
            if data[0] != HANDSHAKE or (len(data) > 1 and data[1] != 3):
                plaintext = data.startswith(b"PRI * HTTP/2.0") or data[:4] in (b"GET ", b"POST")
                return self._fail("it sent plaintext" + (" HTTP/2 (a gRPC client without TLS)" if plaintext else
                                                          f" bytes that are not TLS ({data[:8]!r})"))
        for kind, length, first in self._records[side].feed(data):
            self._record(side, kind, length, first)
            if self.verdict is not None:
                break
        return self.verdict

    def closed(self, side: str) -> Verdict | None:
        """`side` closed its half of the connection (or it was reset)."""
        if self.verdict is not None:
            return self.verdict
        if side == SERVER and self._client_encrypted == EMPTY_CERTIFICATE_LENGTH:
            return self._fail("the client sent no certificate and the server requires one (mutual TLS: give the "
                              "client its pair from fl-server certs)")
        if side == SERVER and self._client_encrypted is not None:
            return self._fail("the server refused the client's certificate (mutual TLS needs one signed by the "
                              "server's client CA, as fl-server certs issues)")
        if side == CLIENT and self._client_encrypted == ENCRYPTED_ALERT_LENGTH:
            return self._fail("the client refused the server's certificate (it trusts another CA, or the name it "
                              "dialled is not in the certificate)")
        if side == CLIENT and self._server_hello and self._client_encrypted is None:
            return self._fail("the client closed the connection during the handshake (it may distrust the "
                              "server's certificate)")
        if not self._first:
            return self._fail(f"the {side} closed the connection before the handshake completed")
        return None  # connected and left without a byte: a port probe, nothing to report

    def _record(self, side: str, kind: int, length: int, first: int | None) -> None:
        if kind == ALERT:
            name = ALERTS.get(first, f"alert {first}") if length == 2 and first is not None else "an alert"
            who = "the server refused the client" if side == SERVER else "the client refused the server"
            why = ""
            if side == CLIENT and first in CERTIFICATE_ALERTS:
                why = " (it does not trust the server's certificate: another CA, or the name it dialled is not in it)"
            self._fail(f"{who}: TLS {name}{why}")
        elif side == SERVER and kind == HANDSHAKE:
            self._server_hello = True
        elif side == CLIENT and kind == CHANGE_CIPHER_SPEC:
            self._client_ccs = True
        elif side == SERVER and kind == CHANGE_CIPHER_SPEC and self._client_ccs:
            self.verdict = Verdict(True, "")  # TLS 1.2: the server's ChangeCipherSpec after the client's
        elif side == CLIENT and kind == APPLICATION_DATA and self._client_encrypted is None:
            self._client_encrypted = length
        elif side == SERVER and kind == APPLICATION_DATA and self._client_encrypted is not None \
                and length != ENCRYPTED_ALERT_LENGTH:
            self.verdict = Verdict(True, "")  # TLS 1.3: the server speaks (HTTP/2 settings) after the client's flight

    def _fail(self, reason: str) -> Verdict:
        self.verdict = Verdict(False, reason)
        return self.verdict
