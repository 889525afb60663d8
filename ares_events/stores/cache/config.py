"""The Redis cache URL, parsed once: :func:`parse` (the parameters are documented in
docs/configuration.md).

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ares_events.core.url import StoreURL
from ares_events.errors import ConfigError

__all__ = ["Config", "parse"]

_PARAMS: Final = (
    "connect_timeout",
    "prefix",
    "retry_after",
    "socket_timeout",
    "ssl_ca_certs",
    "ssl_cert_reqs",
    "tail",
    "ttl",
)

_CERT_REQS: Final = ("none", "optional", "required")


@dataclass(frozen=True, slots=True)
class Config:
    """A cache URL, parsed."""

    host: str
    port: int
    db: int
    username: str | None
    password: str | None
    ssl: bool
    prefix: str
    ttl: int
    tail: int
    socket_timeout: float
    connect_timeout: float
    retry_after: float
    ssl_cert_reqs: str | None
    ssl_ca_certs: str | None


def parse(url: str) -> tuple[Config, str]:
    """The cache URL's settings and its redacted form.

    Raises:
        ConfigError: a bad URL or parameter (the message never holds a password).
    """
    parsed = StoreURL.parse(url, source="cache URL")
    redacted = parsed.redacted()
    if parsed.scheme not in ("redis", "rediss"):
        raise ConfigError(f"cache URL must be redis:// or rediss://, got {redacted}")
    p = parsed.check_params(_PARAMS)
    try:
        db = int(parsed.path.strip("/") or "0")
        ttl = int(p.get("ttl", "300"))
        tail = int(p.get("tail", "100"))
        socket_timeout = float(p.get("socket_timeout", "0.2"))
        connect_timeout = float(p.get("connect_timeout", str(socket_timeout)))
        retry_after = float(p.get("retry_after", "1"))
    except ValueError:
        raise ConfigError(f"invalid number in cache URL {redacted}") from None
    if db < 0 or ttl <= 0 or not 1 <= tail <= 100_000:
        raise ConfigError(
            f"cache URL {redacted}: database must be >= 0, ttl > 0 and tail in 1..100000"
        )
    if socket_timeout <= 0 or connect_timeout <= 0 or retry_after <= 0:
        raise ConfigError(
            f"cache URL {redacted}: socket_timeout, connect_timeout and retry_after "
            "must be positive"
        )
    ssl = parsed.scheme == "rediss"
    reqs = p.get("ssl_cert_reqs")
    cas = p.get("ssl_ca_certs")
    if not ssl and (reqs is not None or cas is not None):
        raise ConfigError(f"ssl_cert_reqs and ssl_ca_certs need rediss://, got {redacted}")
    if reqs is not None and reqs not in _CERT_REQS:
        raise ConfigError(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)} in {redacted}")
    cfg = Config(
        host=parsed.host or "localhost",
        port=parsed.port or 6379,
        db=db,
        username=parsed.username,
        password=parsed.password,
        ssl=ssl,
        prefix=p.get("prefix", "ares:"),
        ttl=ttl,
        tail=tail,
        socket_timeout=socket_timeout,
        connect_timeout=connect_timeout,
        retry_after=retry_after,
        ssl_cert_reqs=reqs,
        ssl_ca_certs=cas,
    )
    return cfg, redacted
