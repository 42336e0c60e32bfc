"""The key that authenticates disk-tier block files, so that only this fleet's ranks can write
blocks its ranks will read.

The shared disk is a volume every engine pod mounts; a file with a valid unkeyed checksum could
be written by anyone who can write there, and would change every rank's outputs. Each file
therefore carries a keyed BLAKE3 hash under a 32-byte key derived from the fleet secret
(`KVFLEET_FLEET_SECRET`, which the operator mounts from a Kubernetes Secret). Without it (a
local run) the key is a random one kept in the folder itself, `.kvfleet-disk-key`, created once
by whichever process gets there first; ranks sharing the folder share it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path

import blake3

SECRET_ENV = "KVFLEET_FLEET_SECRET"
KEY_FILE = ".kvfleet-disk-key"
KEY_CONTEXT = "kvfleet disk tier block files v2"  # BLAKE3 derive_key context, never reused
KEY_BYTES = 32


def disk_key(root: str | os.PathLike, environ: dict[str, str] | None = None) -> bytes:
    """The block-file key of the folder `root`: from the fleet secret, else the folder's own."""
    secret = (os.environ if environ is None else environ).get(SECRET_ENV, "")
    if secret:
        return blake3.blake3(secret.encode(), derive_key_context=KEY_CONTEXT).digest()
    return folder_key(Path(root))


def folder_key(root: Path) -> bytes:
    """The key kept in `root/.kvfleet-disk-key`, made (atomically, mode 0600) if missing."""
    path = root / KEY_FILE
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    root.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=root, prefix=".key.")  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(KEY_BYTES))
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            os.link(temp, path)
    finally:
        os.unlink(temp)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise OSError(f"{path}: {len(key)} bytes, a disk-tier key has {KEY_BYTES}")
    return key
