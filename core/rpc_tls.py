"""Self-signed TLS material for tests, demos and single-machine runs (needs the `cryptography` package).

`make_self_signed(directory)` writes ca.pem (a CA), server.pem/server.key (signed by it, valid
for localhost and 127.0.0.1) and client.pem/client.key (for mutual TLS). Production deployments
bring their own certificates; this exists so loopback runs need no openssl recipe.
"""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_self_signed(directory: str | Path, hostnames: tuple[str, ...] = ("localhost",),
                     ips: tuple[str, ...] = ("127.0.0.1",), days: int = 7) -> TlsFiles:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise RuntimeError("making TLS certificates needs the cryptography package: pip install cryptography") \
            from None

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def base(subject: str, issuer: x509.Name, key) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(issuer)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days)))

    def write(path: Path, cert: x509.Certificate, key=None, key_path: Path | None = None) -> None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        if key is not None and key_path is not None:
            key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
            key_path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (base("mlsyskit test CA", name("mlsyskit test CA"), ca_key)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .sign(ca_key, hashes.SHA256()))
    sans = [x509.DNSName(h) for h in hostnames] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (base(hostnames[0] if hostnames else "server", ca_cert.subject, server_key)
                   .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                   .sign(ca_key, hashes.SHA256()))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = (base("mlsyskit client", ca_cert.subject, client_key)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                   .sign(ca_key, hashes.SHA256()))
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                     directory / "client.pem", directory / "client.key")
    write(files.ca, ca_cert)
    write(files.server_cert, server_cert, server_key, files.server_key)
    write(files.client_cert, client_cert, client_key, files.client_key)
    return files
