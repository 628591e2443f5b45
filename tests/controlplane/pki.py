"""Certificates and keys for a test control plane: one CA, the API server's
serving pair, client certificates, and the service-account signing key."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook import tls

PEM = serialization.Encoding.PEM


def _name(common: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


class Authority:
    """A CA that signs the API server's certificate and every client's."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        # The project's own CA maker: the same kind of CA the webhook issues itself.
        self.key, self.cert = tls.create_ca(common_name="control-plane-ca", days=30)
        self.pem = self.cert.public_bytes(PEM)
        self.path = folder / "ca.crt"
        self.path.write_bytes(self.pem)

    def issue(
        self,
        name: str,
        *,
        organization: str | None = None,
        server: bool = False,
        dns: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """A pair signed by this CA, written as ``name.crt`` and ``name.key``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name, organization))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            alternatives: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            alternatives.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
            builder = builder.add_extension(
                x509.SubjectAlternativeName(alternatives), critical=False
            )
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(PEM))
        key_path.write_bytes(_key_pem(key))
        key_path.chmod(0o600)
        return cert_path, key_path


def service_account_keys(folder: Path) -> tuple[Path, Path]:
    """The key the API server signs service-account tokens with, and its public half."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = folder / "sa.key", folder / "sa.pub"
    private.write_bytes(_key_pem(key))
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public
