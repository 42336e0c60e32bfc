"""The key that authenticates disk-tier block files, so that only this fleet's ranks can write
blocks its ranks will read.

The shared disk is a volume every engine pod mounts; a file with a valid unkeyed checksum could
be written by anyone who can write there, and would change every rank's outputs. Each file
therefore carries a keyed BLAKE3 hash under a 32-byte key derived (BLAKE3's key derivation,
under a context string of its own) from the fleet secret `KVFLEET_FLEET_SECRET`, which the
operator mounts from a Kubernetes Secret and `kvfleet engine --fleet-secret-file` exports.

NOTE: the key is never written anywhere, least of all to the shared volume: a key kept beside
the data is a key every writer of the volume can read, and forge with. Without a fleet secret
(a local run) each process makes a random key of its own, so its blocks are its own: ranks of
one process share them, separate processes need a fleet secret to.
"""

from __future__ import annotations

import logging
import os
import secrets

import blake3

log = logging.getLogger(__name__)

SECRET_ENV = "KVFLEET_FLEET_SECRET"
KEY_CONTEXT = "kvfleet disk tier block files v2"  # BLAKE3 derive_key context, never reused
KEY_BYTES = 32
_PROCESS_KEY = secrets.token_bytes(KEY_BYTES)  # this process's, when there is no fleet secret


def disk_key(environ: dict[str, str] | None = None) -> bytes:
    """The block-file key: derived from the fleet secret, else this process's random one."""
    secret = (os.environ if environ is None else environ).get(SECRET_ENV, "")
    if secret:
        return fleet_key(secret)
    log.warning(
        "disk tier: no fleet secret ($%s): its block files are readable by this process only",
        SECRET_ENV,
    )
    return _PROCESS_KEY


def fleet_key(secret: str) -> bytes:
    """The key every rank holding `secret` derives alike."""
    return blake3.blake3(secret.encode(), derive_key_context=KEY_CONTEXT).digest()
