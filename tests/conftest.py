"""Shared test settings and fixtures: torch kept to one thread so parallel CI jobs on 2 cores
stay fast; the thread-leak check (thread_leaks.py); a self-signed certificate for the TLS tests
of every area."""

import gc
import os
import subprocess

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
# The operator's timer tick, read once when its handlers module is imported: one value for
# every suite that runs the operator (kmock and the API-server kit), set before any imports it.
os.environ.setdefault("KVFLEET_OPERATOR_TICK_SECONDS", "0.5")

pytest_plugins = ["thread_leaks"]


def pytest_collection_finish(session):
    """Move what the imports made (torch, transformers, kopf: millions of objects that live for
    the run) out of the garbage collector's sight, so its full collections stay short pauses
    instead of seconds that make a healthy rank miss its heartbeat."""
    gc.collect()
    gc.freeze()


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
