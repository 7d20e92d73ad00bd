"""TLS for the External Metrics API: certificate files, or a self-signed one for development."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import tempfile
from pathlib import Path


def self_signed(directory: str | Path | None = None, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> tuple[Path, Path]:
    """Writes cert.pem and key.pem (EC P-256, valid one year, SANs = hosts) and returns their paths.

    The certificate is its own CA (basicConstraints CA=true), so a client can trust exactly it
    (ssl_ca_cert = cert.pem), which is what development and the tests do.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = Path(directory or tempfile.mkdtemp(prefix="goodput-forecaster-tls-"))
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "goodput-forecaster")])
    sans = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def server_context(cert_file: str | Path, key_file: str | Path, client_ca_file: str | Path | None = None) -> ssl.SSLContext:
    """TLS 1.2+ with this certificate. With `client_ca_file`, clients must present a certificate
    signed by that CA (kube-apiserver's aggregation layer does, with its
    --proxy-client-cert-file, signed by the requestheader client CA); others fail the handshake."""
    for label, path in (("--tls-cert-file", cert_file), ("--tls-private-key-file", key_file)):
        if not Path(path).is_file():
            raise ValueError(f"{label} {path} does not exist; pass a PEM file, or use --self-signed for development")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    if client_ca_file is not None:
        if not Path(client_ca_file).is_file():
            raise ValueError(f"--tls-client-ca-file {client_ca_file} does not exist; pass the PEM CA bundle that signs "
                             "the clients' certificates (in Kubernetes: the requestheader client CA)")
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=str(client_ca_file))
    return ctx
