"""A self-signed certificate for localhost / 127.0.0.1, made by openssl for one test."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) PEM files in `folder`."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key
