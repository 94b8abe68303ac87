"""Does the server accept this client's own certificate? One TLS handshake with the client's pair, to
name the cause when every connection fails: a certificate signed by another CA than the server's (or
expired, or for another purpose) is refused in the handshake, which gRPC reports only as a closed socket.

The server's certificate is not checked here (only the client's is in question). With TLS 1.3 the server
judges the client's certificate after the handshake: it then sends an alert (refused) or, speaking
HTTP/2, its first SETTINGS frame (accepted).
"""
from __future__ import annotations

import os
import socket
import ssl
import tempfile

from mlsyskit.core.rpc import ClientTls

REFUSALS = ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "UNSUPPORTED_CERTIFICATE",
            "CERTIFICATE_EXPIRED", "CERTIFICATE_REVOKED", "DECRYPT_ERROR", "ACCESS_DENIED")


def refuses_certificate(host: str, port: int, tls: ClientTls, timeout: float = 3.0) -> bool:
    """True when the server at host:port ends the handshake over this client's certificate."""
    if tls.cert_chain is None or tls.private_key is None:
        return False
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory() as folder:  # ssl loads a pair only from files; 0700, gone at once
        cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, blob in ((cert, tls.cert_chain), (key, tls.private_key)):
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(blob)
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError):
            return False
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return False
    with raw:
        try:
            with context.wrap_socket(raw, server_hostname=host) as conn:
                return not conn.recv(1)  # closed without a word after our certificate: refused
        except ssl.SSLError as e:
            return any(r in str(e.reason or e).upper() for r in REFUSALS)
        except TimeoutError:
            return False  # the handshake passed; the server did not speak first
        except OSError:
            return True  # reset right after our certificate
