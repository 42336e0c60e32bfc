"""How a router reaches Redis: a URL (`redis://`, `rediss://` for TLS) or Sentinel, with AUTH.

| setting            | from                                                             |
|--------------------|------------------------------------------------------------------|
| address            | `--redis-url` or `$KVFLEET_REDIS_URL` (keeps a password in the   |
|                    | URL off the command line), or `--redis-sentinel host:port,...` with |
|                    | `--redis-sentinel-master NAME` (redis-py's own Sentinel support) |
| password           | in the URL, else `--redis-password-file`, else                   |
|                    | `$KVFLEET_REDIS_PASSWORD` (a Kubernetes Secret fills either)     |
| TLS                | `rediss://` (Sentinel: `--redis-tls`); `--redis-ca-file` to trust |
|                    | a private CA                                                     |

Short timeouts throughout, so an outage is noticed, not waited on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import redis
from redis.sentinel import Sentinel

PASSWORD_ENV = "KVFLEET_REDIS_PASSWORD"
URL_ENV = "KVFLEET_REDIS_URL"  # the URL (with its password) where `ps` cannot show it


@dataclass(frozen=True)
class RedisSettings:
    """Where the shared Redis is and how to log in; `configured` is False for no Redis."""

    url: str | None = None
    password: str | None = None
    ca_file: str | None = None
    sentinels: tuple[str, ...] = ()  # "host:port" of each Sentinel
    sentinel_master: str | None = None
    tls: bool = False  # Sentinel only: TLS to the master (a URL says it with rediss://)

    def __post_init__(self) -> None:
        if self.sentinels and not self.sentinel_master:
            raise ValueError("redis_sentinel_master: required with redis_sentinels")
        if self.sentinels and self.url:
            raise ValueError("redis_url and redis_sentinels: give one")

    @property
    def configured(self) -> bool:
        return bool(self.url or self.sentinels)


def load_password(path: str | None) -> str | None:
    """The Redis password from a file (whitespace dropped), else from the environment."""
    if path:
        return Path(path).read_text().strip() or None
    return os.environ.get(PASSWORD_ENV) or None


def connect(settings: RedisSettings, timeout: float) -> redis.Redis:
    """A client for the shared Redis (the Sentinel's current master when given Sentinels)."""
    common = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    tls = {"ssl_ca_certs": settings.ca_file} if settings.ca_file else {}
    if settings.sentinels:
        sentinel = Sentinel(
            [_host_port(address) for address in settings.sentinels],
            sentinel_kwargs={**common, "password": settings.password},
            password=settings.password,
            ssl=settings.tls,
            **tls,
            **common,
        )
        return sentinel.master_for(settings.sentinel_master, decode_responses=True, **common)
    url = settings.url
    assert url is not None
    password = {} if urlparse(url).password or not settings.password else {
        "password": settings.password
    }  # fmt: skip
    secure = tls if url.startswith("rediss://") else {}
    return redis.Redis.from_url(url, decode_responses=True, **password, **secure, **common)


def redacted(url: str) -> str:
    """The URL as logs may show it: any password replaced by `***`."""
    parts = urlparse(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return parts._replace(netloc=f"{user}:***@{host}{port}").geturl()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"redis_sentinels: {address!r} is not host:port")
    return host, int(port)
