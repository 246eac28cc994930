"""Certificates and keys for a secure deployment: a CA, the SuperLink's TLS certificate, SuperNode key pairs.

    python scripts/make_certs.py OUT_DIR --host superlink.example.org --nodes 3

writes, into OUT_DIR:

* ``ca.crt`` / ``ca.key``: a certificate authority (keep ``ca.key`` offline; SuperNodes and ``flwr`` get ``ca.crt``
  as their root certificate);
* ``server.pem`` / ``server.key``: the SuperLink's certificate, signed by the CA, valid for ``--host`` (repeat the
  option for several names or IP addresses; default ``localhost`` and ``127.0.0.1``);
* ``node-<i>`` / ``node-<i>.pub`` for i = 1..nodes: each SuperNode's authentication key pair, ECDSA on the NIST P-384
  curve in OpenSSH format, which is what ``flower-supernode --auth-supernode-private-key/--auth-supernode-public-key``
  and ``flwr supernode register`` read (flwr 1.41).

It uses the ``cryptography`` package (a dependency of flwr), so it needs no openssl or ssh-keygen binaries. Private
keys are written with mode 0600. Existing files are never overwritten: pick a new folder.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write(path: Path, data: bytes, private: bool = False) -> None:
    if path.exists():
        raise SystemExit(f"make_certs: {path} exists; refusing to overwrite it (use a new folder)")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make(out: Path, hosts: list[str], nodes: int, days: int = 365) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsim deployment CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    written = []
    for name, data, private in (
        ("ca.key", _pem_key(ca_key), True),
        ("ca.crt", ca.public_bytes(serialization.Encoding.PEM), False),
        ("server.key", _pem_key(server_key), True),
        ("server.pem", server.public_bytes(serialization.Encoding.PEM), False),
    ):
        _write(out / name, data, private)
        written.append(out / name)
    for i in range(1, nodes + 1):
        key = ec.generate_private_key(ec.SECP384R1())
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        _write(out / f"node-{i}", private, True)
        _write(out / f"node-{i}.pub", public + b"\n")
        written += [out / f"node-{i}", out / f"node-{i}.pub"]
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--host", action="append", default=None, help="name or IP the SuperLink is reached at")
    p.add_argument("--nodes", type=int, default=2, help="SuperNode key pairs to generate")
    p.add_argument("--days", type=int, default=365)
    args = p.parse_args(argv)
    if args.nodes < 0 or args.days < 1:
        p.error("--nodes must be >= 0 and --days >= 1")
    for path in make(args.out, args.host or ["localhost", "127.0.0.1"], args.nodes, args.days):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
