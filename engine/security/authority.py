"""A small certificate authority for a cluster on one machine (``cluster start``), made
with ``cryptography``: a key and a self-signed CA certificate, and the certificates it signs.

Keys are EC P-256 in PKCS#8 PEM, written for their owner only (0600 from the first byte);
certificates are PEM and public. A server's certificate names the addresses it is reached at
(subjectAltName: IP 127.0.0.1 and ``localhost``) and serves both TLS ends, as etcd's members
use one certificate as servers and as each other's clients; a client's names its user in its
common name (the name the store's ACL and the audit log give it), or, for etcd, in its
organizational unit: etcd (3.4 on) refuses on its JSON gateway, once its auth is on, every client
certificate with a common name (it would take the name for its user, which the gateway cannot
pass on), so the certificates for etcd carry none.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

AUTHORITY_DAYS = 3650  # the CA's certificate; what it signs lasts CERTIFICATE_DAYS
CERTIFICATE_DAYS = 825  # the longest a browser-trusted server certificate could last; renew by re-issuing
LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Issued:
    cert_file: Path
    key_file: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never another's key overwritten
    with os.fdopen(fd, "wb") as out:
        out.write(pem)


def _name(name: str, *, common: bool = True) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME if common else NameOID.ORGANIZATIONAL_UNIT_NAME, name)])


def _alternative_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


class Authority:
    """The CA in ``directory`` (``ca.pem``, ``ca.key``): ``create`` makes it, ``open`` reads it back
    (``cluster add`` signs the new engines' certificates with the one ``cluster start`` made)."""

    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate) -> None:
        self.directory = directory
        self.key = key
        self.certificate = certificate

    @property
    def cert_file(self) -> Path:
        return self.directory / "ca.pem"

    @classmethod
    def create(cls, directory: Path, name: str) -> Authority:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        certificate = (x509.CertificateBuilder()
                       .subject_name(_name(name)).issuer_name(_name(name))
                       .public_key(key.public_key()).serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(minutes=5))  # a clock a little behind ours
                       .not_valid_after(now + datetime.timedelta(days=AUTHORITY_DAYS))
                       .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                       .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                    content_commitment=False, key_encipherment=False,
                                                    data_encipherment=False, key_agreement=False,
                                                    encipher_only=False, decipher_only=False), critical=True)
                       .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                       .sign(key, hashes.SHA256()))
        _write_key(directory / "ca.key", key)
        (directory / "ca.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return cls(directory, key, certificate)

    @classmethod
    def open(cls, directory: Path) -> Authority:
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey), "the CA's key is EC P-256 (Authority.create)"
        return cls(directory, key, x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes()))

    def issue(self, name: str, *, hosts: tuple[str, ...] = (), file_name: str = "", common_name: bool = True) -> Issued:
        """A certificate for CN=``name`` (OU=``name`` without ``common_name``) in ``directory``
        (``<file_name>.pem`` and ``.key``); with ``hosts`` a server's (its subjectAltName; also a
        client, as etcd's peers are), else a client's."""
        stem = file_name or name
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if hosts else [])
        builder = (x509.CertificateBuilder()
                   .subject_name(_name(name, common=common_name)).issuer_name(self.certificate.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=CERTIFICATE_DAYS))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                                  critical=False))
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName([_alternative_name(h) for h in hosts]),
                                            critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.directory / f"{stem}.pem", self.directory / f"{stem}.key")
        _write_key(issued.key_file, key)
        issued.cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return issued
