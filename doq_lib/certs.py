"""Throwaway TLS certificates for a local cluster (L6): ``doq certs``.

Makes a certificate authority and, signed by it, one server certificate for every node (its
names and addresses as subject alternative names, usable as a TLS client certificate too, for
requests between nodes under mutual TLS) and one client certificate. Meant for trying TLS
out and for tests; a production cluster uses certificates from its own CA.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "DOQ local cluster"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(path: str, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _sign(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
          issuer_key: ec.EllipticCurvePrivateKey, days: int,
          extensions: list[tuple[x509.ExtensionType, bool]]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days)))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(out: str, nodes: dict[str, Sequence[str]], days: int = 30) -> list[str]:
    """Write ``ca.pem`` (+ ``ca-key.pem``), ``<node>.pem`` / ``<node>-key.pem`` for every
    node (``nodes``: name -> host names and addresses) and ``client.pem`` / ``client-key.pem``
    into ``out``; returns the paths written."""
    os.makedirs(out, exist_ok=True)
    ca_key = _key()
    ca_name = _name("DOQ local CA")
    ca = _sign(ca_name, ca_key, ca_name, ca_key, days, [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                       content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, encipher_only=False,
                       decipher_only=False), True)])
    written = []

    def save(stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        cert_path, key_path = os.path.join(out, f"{stem}.pem"), os.path.join(out, f"{stem}-key.pem")
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        _write(key_path, _pem_key(key), private=True)
        written.extend([cert_path, key_path])

    save("ca", ca, ca_key)
    leaf = [(x509.BasicConstraints(ca=False, path_length=None), True)]
    for node, hosts in nodes.items():
        key = _key()
        cert = _sign(_name(node), key, ca_name, ca_key, days, leaf + [
            (_san(list(hosts) + list(DEFAULT_HOSTS)), False),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                    ExtendedKeyUsageOID.CLIENT_AUTH]), False)])
        save(node, cert, key)
    client_key = _key()
    client = _sign(_name("doq-client"), client_key, ca_name, ca_key, days, leaf + [
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)])
    save("client", client, client_key)
    return written
