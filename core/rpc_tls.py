"""TLS material for the suite's RPC (needs the `cryptography` package), and a probe for what a peer speaks.

`issue_certs(directory, client_ids=("0", "1"))` writes, into one folder:

    ca.pem, ca.key                 a CA (kept, so a later call adds clients signed by the same CA)
    server.pem, server.key         the server pair, valid for --host names and --ip addresses
    client-<ID>.pem, client-<ID>.key   one pair per client, common name (CN) = the client id

Private keys are written 0600. With mutual TLS the server takes each caller's identity from its
verified certificate's CN (core.rpc `CallContext.identity`), so a client id cannot be claimed
without the matching key. `probe_tls(host, port)` tells whether a listener answers a TLS
handshake (and whether it asks for a client certificate), so a client can say "the server expects TLS"
instead of "no server answered".
"""
from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from mlsyskit.core.errors import UsageError


@dataclass(frozen=True)
class CertFiles:
    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path
    clients: dict[str, tuple[Path, Path]] = field(default_factory=dict)  # id -> (cert, key)

    def client(self, client_id: object) -> tuple[Path, Path]:
        return client_paths(self.directory, str(client_id))


def client_paths(directory: str | Path, client_id: str) -> tuple[Path, Path]:
    directory = Path(directory)
    return directory / f"client-{client_id}.pem", directory / f"client-{client_id}.key"


def _crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise UsageError("making TLS certificates needs the cryptography package: pip install 'mlsyskit[fl]'") \
            from None
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def issue_certs(directory: str | Path, client_ids: tuple[str, ...] | list[str] = (),
                hosts: tuple[str, ...] | list[str] | None = None, ips: tuple[str, ...] | list[str] | None = None,
                days: int = 30) -> CertFiles:
    """Write (or extend) a CA, a server pair and one pair per client id into `directory`.

    An existing server pair is kept unless `hosts` or `ips` are given; without them a new pair is valid
    for localhost and 127.0.0.1."""
    keep_server = hosts is None and ips is None and (Path(directory) / "server.pem").exists()
    if hosts is None and ips is None:
        hosts, ips = ("localhost",), ("127.0.0.1",)
    hosts, ips = tuple(hosts or ()), tuple(ips or ())
    x509, hashes, serialization, ec, eku, oid = _crypto()
    if days < 1:
        raise UsageError(f"--days must be at least 1, got {days}")
    for cid in client_ids:
        if not cid or not all(ch.isalnum() or ch in "-_." for ch in cid):
            raise UsageError(f"client id {cid!r} must be letters, digits, '-', '_' or '.'")
    try:
        addresses = [ipaddress.ip_address(i) for i in ips]
    except ValueError as e:
        raise UsageError(f"--ip: {e}") from None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common_name: str):
        return x509.Name([x509.NameAttribute(oid.COMMON_NAME, common_name)])

    def builder(subject: str, issuer, key):
        return (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(issuer)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days)))

    def write_key(path: Path, key) -> None:
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))

    def write_cert(path: Path, cert) -> None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_path, ca_key_path = directory / "ca.pem", directory / "ca.key"
    if ca_path.exists() and ca_key_path.exists():  # extend: same CA, so existing pairs stay valid
        ca_cert = x509.load_pem_x509_certificate(ca_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = (builder("mlsyskit CA", name("mlsyskit CA"), ca_key)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .sign(ca_key, hashes.SHA256()))
        write_key(ca_key_path, ca_key)
        write_cert(ca_path, ca_cert)

    files = CertFiles(directory, ca_path, directory / "server.pem", directory / "server.key")
    if not keep_server:
        server_key = ec.generate_private_key(ec.SECP256R1())
        sans = [x509.DNSName(h) for h in hosts] + [x509.IPAddress(a) for a in addresses]
        server = (builder(hosts[0] if hosts else "fl-server", ca_cert.subject, server_key)
                  .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                  .add_extension(x509.ExtendedKeyUsage([eku.SERVER_AUTH]), critical=False)
                  .sign(ca_key, hashes.SHA256()))
        write_key(files.server_key, server_key)
        write_cert(files.server_cert, server)
    for cid in client_ids:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (builder(cid, ca_cert.subject, key)
                .add_extension(x509.ExtendedKeyUsage([eku.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        cert_path, key_path = client_paths(directory, cid)
        write_key(key_path, key)
        write_cert(cert_path, cert)
        files.clients[cid] = (cert_path, key_path)
    return files


def probe_tls(host: str, port: int, timeout: float = 2.0) -> str | None:
    """What a listener at host:port speaks: "plaintext", "tls", "tls-client-cert" (TLS that asks for a
    client certificate), or None if nothing answers. The server's certificate is not checked: this
    only tells a client which settings it is missing."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    with raw:
        try:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                # TLS 1.3 refuses a missing client certificate only after the handshake: an HTTP/2 server
                # speaks first (its SETTINGS frame), one that wants a certificate just closes
                return "tls" if tls.recv(1) else "tls-client-cert"
        except ssl.SSLError as e:  # a TLS alert is still TLS
            reason = str(e.reason or e).upper()
            if "CERTIFICATE_REQUIRED" in reason or "HANDSHAKE_FAILURE" in reason:
                return "tls-client-cert"
            return "tls" if "ALERT" in reason else "plaintext"
        except TimeoutError:  # handshake done, the server just did not speak first
            return "tls"
        except OSError:  # closed or reset on a plaintext listener
            return "plaintext"
