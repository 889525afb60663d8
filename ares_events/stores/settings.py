"""Settings parsed once, at the edge (docs/configuration.md lists them): with the CLI, the
only place that reads the environment. Precedence: argument > URL parameter > env var >
default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ares_events.chain import ChainKey
from ares_events.errors import ConfigError

__all__ = ["Settings"]

DEFAULT_CLI_STORE = "sqlite:///ares-events.db"


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Typed configuration. ``repr`` never shows the chain key or URL passwords."""

    store_url: str | None = None
    blobs_url: str | None = None
    cache_url: str | None = None
    spill_threshold_bytes: int = 256 * 1024
    snapshot_every: int = 100
    chain_key: ChainKey | None = None
    anchor_url: str | None = None
    log_key_file: str | None = None
    """Path of the log's signing key file (the path only: the CLI reads the file)."""
    log_vkeys: tuple[str, ...] = ()
    """Verifier keys trusted for signed checkpoints (their text form)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """Read ``ARES_*`` variables.

        Raises:
            ConfigError: a value is malformed (names the variable, never echoes a key).
        """
        key_hex = env.get("ARES_EVENTS_CHAIN_KEY")
        return cls(
            store_url=env.get("ARES_STORE_URL") or None,
            blobs_url=env.get("ARES_BLOBS_URL") or None,
            cache_url=env.get("ARES_CACHE_URL") or None,
            spill_threshold_bytes=_positive_int(env, "ARES_SPILL_THRESHOLD_BYTES", 256 * 1024),
            snapshot_every=_positive_int(env, "ARES_SNAPSHOT_EVERY", 100),
            chain_key=ChainKey.from_hex(key_hex, source="ARES_EVENTS_CHAIN_KEY")
            if key_hex
            else None,
            anchor_url=env.get("ARES_ANCHOR_URL") or None,
            log_key_file=env.get("ARES_LOG_KEY_FILE") or None,
            log_vkeys=tuple((env.get("ARES_LOG_VKEY") or "").split()),
        )

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with every non-None keyword applied (explicit arguments win)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def __repr__(self) -> str:
        from ares_events.core.url import redact_url

        parts = [
            f"store_url={redact_url(self.store_url) if self.store_url else None!r}",
            f"blobs_url={redact_url(self.blobs_url) if self.blobs_url else None!r}",
            f"cache_url={redact_url(self.cache_url) if self.cache_url else None!r}",
            f"spill_threshold_bytes={self.spill_threshold_bytes}",
            f"snapshot_every={self.snapshot_every}",
            f"chain_key={'set' if self.chain_key else None}",
            f"anchor_url={redact_url(self.anchor_url) if self.anchor_url else None!r}",
            f"log_key_file={self.log_key_file!r}",
            f"log_vkeys={len(self.log_vkeys)}",
        ]
        return f"Settings({', '.join(parts)})"

    def open_store(self, **options: Any) -> Any:
        """Open the configured store (``store_url`` is required).

        Raises:
            ConfigError: no store URL configured.
        """
        from ares_events.stores import open_store

        if not self.store_url:
            raise ConfigError("no store URL: set ARES_STORE_URL or pass store_url")
        return open_store(
            self.store_url,
            blobs=self.blobs_url,
            cache=self.cache_url,
            spill_threshold=self.spill_threshold_bytes,
            chain_key=self.chain_key,
            **options,
        )
