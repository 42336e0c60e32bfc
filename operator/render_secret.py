"""The fleet's shared secret: a Secret the operator fills once with random bytes, read by the
router and the engines (KVFLEET_FLEET_SECRET) to authenticate the rank-facing services and
the disk tier's block files. Its value is made on create only and never compared or patched,
so a reconcile keeps it; a deleted Secret comes back with a new value."""

from __future__ import annotations

import base64
import secrets

from .names import FleetRef
from .spec import FleetSpec

SECRET_KEY = "fleet-secret"
SECRET_ENV = "KVFLEET_FLEET_SECRET"
# The managed Redis's password (requirepass), in the same Secret.
REDIS_PASSWORD_KEY = "redis-password"
REDIS_PASSWORD_ENV = "KVFLEET_REDIS_PASSWORD"
SECRET_BYTES = 32


def render_fleet_secret(fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]) -> list[dict]:
    """The Secret `<fleet>-secret`, without its value (filled in by `with_new_secret`)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": fleet.metadata("secret", "secret"),
            "type": "Opaque",
        }
    ]


def with_new_secret(manifest: dict) -> dict:
    """The Secret manifest as first created: fresh random values (URL-safe characters, so the
    Redis password can stand in a redis:// URL)."""

    def fresh() -> str:
        return base64.b64encode(secrets.token_urlsafe(SECRET_BYTES).encode()).decode()

    return {**manifest, "data": {SECRET_KEY: fresh(), REDIS_PASSWORD_KEY: fresh()}}


def secret_env(fleet: FleetRef, name: str, key: str) -> dict:
    """One env var read from the fleet Secret."""
    ref = {"name": fleet.child_name("secret"), "key": key}
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def fleet_env(fleet: FleetRef) -> list[dict]:
    """Env of every router and engine container: its pod name and the fleet secret."""
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        secret_env(fleet, SECRET_ENV, SECRET_KEY),
    ]
