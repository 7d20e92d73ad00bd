"""The External Metrics API with --tls-client-ca-file: real TLS, real certificates.

Refused: a client without a certificate, and one whose certificate another CA signed. Served: a
client whose certificate the configured CA signed. A client that opens a connection and never
finishes the handshake does not stop others from being served.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import ssl
import time
import urllib.request

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from forecaster.server import ExternalMetricsAPI, ForecastState, api_routes, start_server
from forecaster.tls import self_signed, server_context
from tests.support import free_port

PATH = "/apis/external.metrics.k8s.io/v1beta1"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(tmp, cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    path = tmp / f"{cn}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def make_client(tmp, ca_cert, ca_key, cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = tmp / f"{cn}.crt", tmp / f"{cn}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def api(tmp_path):
    server_cert, server_key = self_signed(tmp_path / "server")
    ca_cert, ca_key, ca_path = make_ca(tmp_path, "aggregator-ca")
    port = free_port()
    server = start_server(api_routes(ExternalMetricsAPI(ForecastState(180.0))), "127.0.0.1", port,
                          server_context(server_cert, server_key, ca_path))
    yield port, server_cert, (ca_cert, ca_key)
    server.shutdown()
    server.server_close()


def _get(port, server_cert, client=None, timeout=5.0):
    ctx = ssl.create_default_context(cafile=str(server_cert))
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{PATH}", context=ctx, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def test_client_signed_by_the_configured_ca_is_served(api, tmp_path):
    port, server_cert, (ca_cert, ca_key) = api
    status, doc = _get(port, server_cert, make_client(tmp_path, ca_cert, ca_key, "front-proxy-client"))
    assert status == 200 and doc["kind"] == "APIResourceList"


def test_client_without_a_certificate_is_refused(api):
    port, server_cert, _ = api
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        _get(port, server_cert)


def test_client_signed_by_another_ca_is_refused(api, tmp_path):
    port, server_cert, _ = api
    other_cert, other_key, _ = make_ca(tmp_path, "other-ca")
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        _get(port, server_cert, make_client(tmp_path, other_cert, other_key, "intruder"))


def test_a_stalled_handshake_does_not_block_other_clients(api, tmp_path):
    port, server_cert, (ca_cert, ca_key) = api
    client = make_client(tmp_path, ca_cert, ca_key, "front-proxy-client")
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]   # TCP only, no ClientHello
    try:
        started = time.monotonic()
        assert _get(port, server_cert, client, timeout=3)[0] == 200
        assert time.monotonic() - started < 2
    finally:
        for s in stalled:
            s.close()


def test_missing_client_ca_file_is_a_clear_error(tmp_path):
    cert, key = self_signed(tmp_path)
    with pytest.raises(ValueError, match="--tls-client-ca-file"):
        server_context(cert, key, tmp_path / "nope.pem")
