"""Certificates: the only module that imports ``cryptography``.

Owns making a CA and a serving certificate, reading and checking a key
pair before it is served, and renewing what is near expiry. Serving them
is ``webhook.serving.context``'s; publishing them, ``webhook.cluster.certs``'s.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.errors import CertificateError

__all__ = ["CertificateError"]

KeyType = Literal["ecdsa", "rsa"]
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
CA_KEY_FILE = "ca.key"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Issued:
    """What ``ensure_certificates`` did."""

    directory: Path
    ca_created: bool
    serving_created: bool
    not_after: dt.datetime

    @property
    def ca(self) -> Path:
        return self.directory / CA_FILE

    @property
    def cert(self) -> Path:
        return self.directory / CERT_FILE

    @property
    def key(self) -> Path:
        return self.directory / KEY_FILE


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_key(key_type: KeyType = "ecdsa") -> PrivateKey:
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def create_ca(
    *,
    common_name: str = "gpushare-webhook CA",
    days: int = 3650,
    key_type: KeyType = "ecdsa",
    now: dt.datetime | None = None,
) -> tuple[PrivateKey, x509.Certificate]:
    key = new_key(key_type)
    start = (now or _now()) - dt.timedelta(minutes=5)  # tolerate clock skew
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue_serving(
    ca_key: PrivateKey,
    ca_cert: x509.Certificate,
    *,
    dns_names: Sequence[str],
    ips: Sequence[str] = (),
    days: int = 365,
    key_type: KeyType = "ecdsa",
    now: dt.datetime | None = None,
) -> tuple[PrivateKey, x509.Certificate]:
    if not dns_names and not ips:
        raise CertificateError("a serving certificate needs at least one DNS name or IP address")
    key = new_key(key_type)
    start = (now or _now()) - dt.timedelta(minutes=5)
    end = min(start + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    try:
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    except ValueError as error:
        raise CertificateError(f"not an IP address: {error}") from None
    subject = dns_names[0] if dns_names else ips[0]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def pem_key(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    # Write then rename, so a reader (a running server) never sees half a file.
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def parse_certs(data: bytes, *, source: str = "data") -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertificateError(f"{source} is not a PEM certificate") from None


def parse_key(data: bytes, *, source: str = "data") -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise CertificateError(f"{source} is not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertificateError(f"{source}: only ECDSA and RSA keys are supported")
    return key


def load_certs(path: Path) -> list[x509.Certificate]:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CertificateError(f"cannot read certificate {path}: {error.strerror}") from None
    return parse_certs(data, source=str(path))


def load_key(path: Path) -> PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CertificateError(f"cannot read private key {path}: {error.strerror}") from None
    return parse_key(data, source=str(path))


def check_pair(
    cert_path: Path, key_path: Path, *, now: dt.datetime | None = None
) -> x509.Certificate:
    """Refuse a serving pair that is missing, unreadable, expired or mismatched."""
    cert = load_certs(cert_path)[0]
    key = load_key(key_path)
    moment = now or _now()
    if cert.not_valid_after_utc <= moment:
        raise CertificateError(
            f"certificate {cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
            "renew it (gpushare-webhook certs create, or certs install --renew-before 30d)"
        )
    if cert.not_valid_before_utc > moment + dt.timedelta(minutes=5):
        raise CertificateError(
            f"certificate {cert_path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d} "
            "UTC; check the clock"
        )
    if _public_der(cert.public_key()) != _public_der(key.public_key()):
        raise CertificateError(f"private key {key_path} does not match certificate {cert_path}")
    return cert


def _public_der(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass(frozen=True)
class Rotation:
    """The certificates to keep after a renewal check, and what changed."""

    ca_key: PrivateKey
    ca_cert: x509.Certificate
    bundle: tuple[x509.Certificate, ...]  # every CA to trust, newest first
    key: PrivateKey
    cert: x509.Certificate
    ca_rotated: bool
    serving_renewed: bool

    @property
    def changed(self) -> bool:
        return self.ca_rotated or self.serving_renewed

    def bundle_pem(self) -> bytes:
        return b"".join(pem_cert(cert) for cert in self.bundle)


def rotate(
    *,
    ca_certs: Sequence[x509.Certificate] = (),
    ca_key: PrivateKey | None = None,
    cert: x509.Certificate | None = None,
    key: PrivateKey | None = None,
    dns_names: Sequence[str],
    ips: Sequence[str] = (),
    days: int = 365,
    renew_before: dt.timedelta = dt.timedelta(days=30),
    key_type: KeyType = "ecdsa",
    now: dt.datetime | None = None,
    ca_days: int = 3650,
) -> Rotation:
    """Decide which CA and serving pair to keep, renewing what is near expiry.

    The CA is replaced ahead of time: once it has less than one serving
    lifetime plus ``renew_before`` left. The old CA stays in the bundle until
    it expires, so a client that still holds the old bundle, or a server
    still presenting a certificate signed by the old CA, keeps working
    through the switch. Pure apart from key generation.
    """
    moment = now or _now()
    kept_ca = _usable_ca(ca_certs, ca_key, moment, dt.timedelta(days=days) + renew_before)
    new_ca_key, new_ca = kept_ca or create_ca(
        days=max(ca_days, 2 * days), key_type=key_type, now=moment
    )
    bundle = [new_ca]
    for old in ca_certs:
        if old.not_valid_after_utc > moment and old.fingerprint(hashes.SHA256()) not in {
            c.fingerprint(hashes.SHA256()) for c in bundle
        }:
            bundle.append(old)
    # A new CA has signed nothing yet, so no serving pair on hand can chain to it.
    kept = None
    if kept_ca is not None:
        wanted = set(dns_names) | set(ips)
        kept = _usable_serving(cert, key, new_ca, wanted, moment=moment, renew_before=renew_before)
    serving_key, serving = kept or issue_serving(
        new_ca_key, new_ca, dns_names=dns_names, ips=ips, days=days, key_type=key_type, now=moment
    )
    return Rotation(
        ca_key=new_ca_key,
        ca_cert=new_ca,
        bundle=tuple(bundle[:3]),
        key=serving_key,
        cert=serving,
        ca_rotated=kept_ca is None,
        serving_renewed=kept is None,
    )


def _usable_ca(
    ca_certs: Sequence[x509.Certificate],
    ca_key: PrivateKey | None,
    moment: dt.datetime,
    needed: dt.timedelta,
) -> tuple[PrivateKey, x509.Certificate] | None:
    """The current CA pair, or None when it is unusable or will not outlive ``needed``."""
    current = ca_certs[0] if ca_certs else None
    if (
        current is not None
        and ca_key is not None
        and _public_der(current.public_key()) == _public_der(ca_key.public_key())
        and current.not_valid_after_utc - moment > needed
    ):
        return ca_key, current
    return None


def _usable_serving(
    cert: x509.Certificate | None,
    key: PrivateKey | None,
    ca: x509.Certificate,
    wanted: set[str],
    *,
    moment: dt.datetime,
    renew_before: dt.timedelta,
) -> tuple[PrivateKey, x509.Certificate] | None:
    """The current serving pair, or None when it must be issued again."""
    if (
        cert is not None
        and key is not None
        and _public_der(cert.public_key()) == _public_der(key.public_key())
        and cert.not_valid_after_utc - renew_before > moment
        and wanted <= set(subject_names(cert))
        and _issued_by(cert, ca)
    ):
        return key, cert
    return None


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _optional(load: Callable[[], _T]) -> _T | None:
    try:
        return load()
    except CertificateError:
        return None


def ensure_certificates(
    directory: Path,
    *,
    dns_names: Sequence[str],
    ips: Sequence[str] = (),
    days: int = 365,
    key_type: KeyType = "ecdsa",
    renew_before: dt.timedelta = dt.timedelta(days=30),
    now: dt.datetime | None = None,
) -> Issued:
    """Make or renew a CA and serving certificate in ``directory``; idempotent.

    A valid CA is kept. The serving pair is issued again only when it is
    missing, invalid, expires within ``renew_before``, or lacks a wanted name.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_path, ca_key_path = directory / CA_FILE, directory / CA_KEY_FILE
    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    result = rotate(
        ca_certs=_optional(lambda: load_certs(ca_path)) or (),
        ca_key=_optional(lambda: load_key(ca_key_path)),
        cert=_optional(lambda: load_certs(cert_path)[0]),
        key=_optional(lambda: load_key(key_path)),
        dns_names=dns_names,
        ips=ips,
        days=days,
        renew_before=renew_before,
        key_type=key_type,
        now=now,
    )
    if result.ca_rotated:
        _write(ca_key_path, pem_key(result.ca_key), 0o600)
        _write(ca_path, result.bundle_pem(), 0o644)
    if result.serving_renewed:
        _write(key_path, pem_key(result.key), 0o600)
        _write(cert_path, pem_cert(result.cert), 0o644)
    return Issued(
        directory, result.ca_rotated, result.serving_renewed, result.cert.not_valid_after_utc
    )


def subject_names(cert: x509.Certificate) -> list[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    names: list[str] = list(sans.get_values_for_type(x509.DNSName))
    names += [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    return names


def not_after(cert_path: Path) -> dt.datetime:
    return load_certs(cert_path)[0].not_valid_after_utc
