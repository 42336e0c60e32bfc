"""Pod and container security settings every child pod shares: non-root, read-only root."""

from __future__ import annotations

RUN_AS_USER = 10001


def pod_security_context() -> dict[str, object]:
    """Non-root, with volumes group-writable by the service user."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, object]:
    """No privilege escalation, no capabilities, a read-only root filesystem."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def scratch_volumes() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Writable /tmp (and /dev/shm for tensor sharing) under a read-only root: (volumes, mounts)."""
    volumes = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "dshm", "mountPath": "/dev/shm"}]
    return volumes, mounts
