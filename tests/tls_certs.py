"""Throwaway certificate authorities for the TLS tests, made with ``cryptography`` in a temporary folder.

Each test gets a fresh CA that signs a server certificate (for localhost and 127.0.0.1, the addresses the
tests dial) and a client certificate, plus a second, unrelated CA with a client of its own: a certificate
that is well formed but signed by someone the servers do not trust.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_NAMES = ("localhost", "127.0.0.1")


@dataclass(frozen=True, slots=True)
class Issued:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class Pki:
    ca: Path  # the CA certificate both sides trust
    server: Issued
    client: Issued
    rogue_client: Issued  # signed by another CA


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return Issued(cert_path, key_path)


def _builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
    )


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(common_name, _name(common_name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], common_name: str, *, server: bool
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _builder(common_name, ca_cert.subject, key).add_extension(
        x509.BasicConstraints(ca=False, path_length=None), critical=True
    )
    if server:
        sans: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        usage = ExtendedKeyUsageOID.SERVER_AUTH
    else:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_pki(folder: Path) -> Pki:
    """A CA, its server and client certificates and an unrelated CA's client, as PEM files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca("chimera test CA")
    rogue = _ca("someone else's CA")
    ca_path = folder / "ca.crt"
    ca_path.write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    return Pki(
        ca=ca_path,
        server=_write(folder, "server", *_leaf(ca, "chimera-server", server=True)),
        client=_write(folder, "client", *_leaf(ca, "dispatcher", server=False)),
        rogue_client=_write(folder, "rogue", *_leaf(rogue, "dispatcher", server=False)),
    )
