"""Certificates for gpuslice's mutual TLS, made and read with ``cryptography`` (pure: no I/O, no clock).

A CA signs two leaves: the extender's serving certificate (its Service's DNS names) and
kube-scheduler's client certificate (``CN=gpuslice-scheduler``). Keys are ECDSA P-256: small, fast,
and accepted by Go's TLS (kube-apiserver, kube-scheduler) and by Python's ``ssl`` (the extender).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BACKDATE = timedelta(minutes=5)  # a peer whose clock is a little behind still accepts a new certificate


class PkiError(ValueError):
    """A PEM that is not a certificate or key we can use."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, PEM."""

    cert: bytes
    key: bytes


@dataclass(frozen=True, slots=True)
class CertInfo:
    """What gpuslice checks of a certificate."""

    common_name: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    not_before: datetime
    not_after: datetime
    is_ca: bool
    serial: int


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load_cert(pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as e:
        raise PkiError(f"not a PEM certificate: {e}") from None


def _load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise PkiError(f"not an unencrypted PEM private key: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"expected an ECDSA key, got {type(key).__name__}")
    return key


def new_ca(common_name: str, days: int, now: datetime) -> KeyPair:
    """A self-signed CA valid for ``days`` from ``now`` (which must be timezone-aware)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(ca: KeyPair, common_name: str, *, server: bool, days: int, now: datetime,
          names: Sequence[str] = ()) -> KeyPair:
    """A leaf signed by ``ca``: a server certificate for ``names`` (DNS names or IP addresses), or a
    client certificate. It never outlives its CA."""
    ca_cert, ca_key = _load_cert(ca.cert), _load_key(ca.key)
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + timedelta(days=days), ca_cert.not_valid_after_utc)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                     crl_sign=False, content_commitment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]),
                                        critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def inspect(pem: bytes) -> CertInfo:
    """The fields of a PEM certificate (PkiError when it is not one)."""
    cert = _load_cert(pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(sans.get_values_for_type(x509.DNSName))
        ips = tuple(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns, ips = (), ()
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    return CertInfo(str(cns[0].value) if cns else "", dns, ips, cert.not_valid_before_utc,
                    cert.not_valid_after_utc, is_ca, cert.serial_number)


def signed_by(pem: bytes, ca_pem: bytes) -> bool:
    """Whether ``ca_pem`` issued ``pem`` (its name and signature)."""
    try:
        _load_cert(pem).verify_directly_issued_by(_load_cert(ca_pem))
    except (ValueError, TypeError, InvalidSignature, PkiError):
        return False
    return True


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """Whether ``key_pem`` is the private key of ``cert_pem``."""
    try:
        public = _load_cert(cert_pem).public_key()
        return public == _load_key(key_pem).public_key()
    except PkiError:
        return False


def split_bundle(pem: bytes) -> list[bytes]:
    """The certificates of a PEM bundle, each as PEM (PkiError when one does not parse)."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as e:
        raise PkiError(f"not a PEM certificate bundle: {e}") from None
    return [c.public_bytes(serialization.Encoding.PEM) for c in certs]
