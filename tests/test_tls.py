"""Certificates: creation, renewal, CA rotation, refusal of broken pairs, hot reload."""

from __future__ import annotations

import datetime as dt
import shutil
import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509

from tests.conftest import Server, free_port, start_server
from webhook import tls
from webhook.errors import CertificateError

NAMES = ["svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local"]
NOW = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)


def test_create_has_the_service_names_and_a_private_key(tmp_path: Path) -> None:
    issued = tls.ensure_certificates(tmp_path, dns_names=NAMES, ips=["10.0.0.1"])
    cert = tls.load_certs(issued.cert)[0]
    assert set(tls.subject_names(cert)) == {*NAMES, "10.0.0.1"}
    assert oct(issued.key.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "ca.key").stat().st_mode & 0o777) == "0o600"
    cert.verify_directly_issued_by(tls.load_certs(issued.ca)[0])
    assert isinstance(tls.load_key(issued.key).public_key(), type(cert.public_key()))


@pytest.mark.parametrize("key_type", ["ecdsa", "rsa"])
def test_key_types(tmp_path: Path, key_type: tls.KeyType) -> None:
    issued = tls.ensure_certificates(tmp_path, dns_names=["x"], key_type=key_type)
    tls.check_pair(issued.cert, issued.key)


def test_rerun_keeps_a_valid_pair_and_renews_near_expiry(tmp_path: Path) -> None:
    first = tls.ensure_certificates(tmp_path, dns_names=NAMES, days=90, now=NOW)
    assert first.ca_created
    assert first.serving_created
    again = tls.ensure_certificates(
        tmp_path, dns_names=NAMES, days=90, now=NOW + dt.timedelta(days=10)
    )
    assert not again.ca_created
    assert not again.serving_created
    late = tls.ensure_certificates(
        tmp_path, dns_names=NAMES, days=90, now=NOW + dt.timedelta(days=70)
    )
    assert not late.ca_created
    assert late.serving_created
    more = tls.ensure_certificates(
        tmp_path, dns_names=[*NAMES, "extra"], days=90, now=NOW + dt.timedelta(days=71)
    )
    assert more.serving_created


def test_ca_rotates_ahead_of_time_and_both_stay_trusted() -> None:
    key, ca = tls.create_ca(days=400, now=NOW)
    s_key, s_cert = tls.issue_serving(key, ca, dns_names=NAMES, days=30, now=NOW)
    # 300 days on: the CA has 100 days left, less than 30 days' lifetime + 90 days' margin.
    later = NOW + dt.timedelta(days=300)
    result = tls.rotate(
        ca_certs=[ca],
        ca_key=key,
        cert=s_cert,
        key=s_key,
        dns_names=NAMES,
        days=30,
        renew_before=dt.timedelta(days=90),
        now=later,
    )
    assert result.ca_rotated
    assert result.serving_renewed
    assert result.bundle[0] == result.ca_cert
    assert ca in result.bundle  # the old CA is still trusted during the overlap
    result.cert.verify_directly_issued_by(result.ca_cert)
    # Once the old CA expires it leaves the bundle.
    after = tls.rotate(
        ca_certs=list(result.bundle),
        ca_key=result.ca_key,
        cert=result.cert,
        key=result.key,
        dns_names=NAMES,
        days=30,
        renew_before=dt.timedelta(days=1),
        now=NOW + dt.timedelta(days=410),
    )
    assert not after.ca_rotated
    assert ca not in after.bundle


def test_rotate_replaces_a_pair_whose_key_does_not_match() -> None:
    key, ca = tls.create_ca(now=NOW)
    _, cert = tls.issue_serving(key, ca, dns_names=NAMES, now=NOW)
    other, _ = tls.issue_serving(key, ca, dns_names=NAMES, now=NOW)
    result = tls.rotate(ca_certs=[ca], ca_key=key, cert=cert, key=other, dns_names=NAMES, now=NOW)
    assert result.serving_renewed
    assert not result.ca_rotated


def write_pair(directory: Path, key: tls.PrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(tls.pem_cert(cert))
    (directory / "tls.key").write_bytes(tls.pem_key(key))
    return directory / "tls.crt", directory / "tls.key"


def test_check_pair_refuses_expired_mismatched_and_garbage(tmp_path: Path) -> None:
    key, ca = tls.create_ca()
    s_key, s_cert = tls.issue_serving(
        key, ca, dns_names=["x"], days=1, now=NOW - dt.timedelta(days=400)
    )
    cert, pkey = write_pair(tmp_path / "old", s_key, s_cert)
    with pytest.raises(CertificateError, match="expired on"):
        tls.check_pair(cert, pkey)
    a_key, a_cert = tls.issue_serving(key, ca, dns_names=["x"])
    b_key, _ = tls.issue_serving(key, ca, dns_names=["x"])
    cert, _ = write_pair(tmp_path / "a", a_key, a_cert)
    _, other = write_pair(tmp_path / "b", b_key, a_cert)
    with pytest.raises(CertificateError, match="does not match"):
        tls.check_pair(cert, other)
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(CertificateError, match="not a PEM certificate"):
        tls.check_pair(junk, pkey)
    with pytest.raises(CertificateError, match="not an unencrypted PEM private key"):
        tls.check_pair(cert, junk)


@pytest.mark.parametrize("problem", ["expired", "mismatched"])
def test_serve_refuses_a_broken_pair(tmp_path: Path, problem: str) -> None:
    import subprocess
    import sys

    key, ca = tls.create_ca()
    if problem == "expired":
        s_key, s_cert = tls.issue_serving(
            key, ca, dns_names=["x"], days=1, now=NOW - dt.timedelta(days=400)
        )
    else:
        _, s_cert = tls.issue_serving(key, ca, dns_names=["x"])
        s_key, _ = tls.issue_serving(key, ca, dns_names=["x"])
    cert, pkey = write_pair(tmp_path, s_key, s_cert)
    pair = ["--cert", str(cert), "--key", str(pkey)]
    bind = ["--bind", f"127.0.0.1:{free_port()}"]  # README command 1 may hold the default port
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", *pair, *bind],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert ("expired on" if problem == "expired" else "does not match") in done.stderr


def served_serial(server: Server, ca: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    import socket

    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der
    return x509.load_der_x509_certificate(der).serial_number


def test_server_picks_up_rotated_files_without_restart(tmp_path: Path) -> None:
    live = tmp_path / "live"
    issued = tls.ensure_certificates(tmp_path / "pki", dns_names=["localhost"])
    shutil.copytree(tmp_path / "pki", live)
    with start_server(
        ["--cert", str(live / "tls.crt"), "--key", str(live / "tls.key"), "--workers", "1"],
        ca=issued.ca,
        log=tmp_path / "log",
        port=free_port(),
    ) as server:
        before = served_serial(server, issued.ca)
        keep = server.connect()
        keep.request("GET", "/healthz")
        assert keep.getresponse().read()
        # Rotate: a new serving pair from the same CA, swapped in as the kubelet
        # does it (new files, then an atomic rename over the old ones).
        ca_key = tls.load_key(tmp_path / "pki" / "ca.key")
        new_key, new_cert = tls.issue_serving(
            ca_key, tls.load_certs(issued.ca)[0], dns_names=["localhost"]
        )
        staging = tmp_path / "staging"
        write_pair(staging, new_key, new_cert)
        (staging / "tls.key").replace(live / "tls.key")
        (staging / "tls.crt").replace(live / "tls.crt")
        deadline = time.monotonic() + 10
        while served_serial(server, issued.ca) == before:
            assert time.monotonic() < deadline, "the new certificate was never served"
            time.sleep(0.2)
        assert served_serial(server, issued.ca) == new_cert.serial_number
        # The connection opened before the swap still works.
        keep.request("GET", "/healthz")
        assert keep.getresponse().status == 200
        keep.close()
        # A pair briefly missing keeps the last good one in service.
        (live / "tls.crt").unlink()
        time.sleep(1.5)
        assert served_serial(server, issued.ca) == new_cert.serial_number
