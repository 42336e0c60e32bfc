"""Shared test settings and fixtures: torch kept to one thread so parallel CI jobs on 2 cores
stay fast; a self-signed certificate for the TLS tests of every area."""

import os
import subprocess

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def certificate(tmp_path):
    """(certificate, key) PEM files for localhost / 127.0.0.1, made by openssl for one test."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key
