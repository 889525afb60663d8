"""The store's identity: how it was written (chain keyed or not, key ids, blob location),
recorded in the store itself, written at the first write and checked on every open
(the document and its rules: docs/security.md).

A difference is a :class:`~ares_events.errors.ConfigError` naming what differs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

import orjson

from ares_events.chain import FORMAT_VERSION, ChainKey, canonical_json
from ares_events.core.events import utc_now_at
from ares_events.errors import ConfigError, StoreError

__all__ = ["BLOBS_OWNER_KEY", "IDENTITY_KEY", "BlobsIdentity", "KeyRange", "StoreIdentity"]

IDENTITY_KEY: Final = "identity"
BLOBS_OWNER_KEY: Final = "blobs/owner"
"""The metadata row holding the store's owner token (32 hex digits), the one its blob
location's owner marker names (docs/blobs.md, "One location, one store")."""
DEFAULT_BLOBS: Final = "default"


@dataclass(frozen=True, slots=True)
class KeyRange:
    """A chain key id and the first global position whose links it signs."""

    id: str
    from_position: int


@dataclass(frozen=True, slots=True)
class BlobsIdentity:
    """Where spilled payloads live: ``location`` is compared, ``url`` reopens them."""

    location: str
    url: str


@dataclass(frozen=True, slots=True)
class StoreIdentity:
    """The identity document (its fields and rules: docs/security.md)."""

    format: int
    keys: tuple[KeyRange, ...]
    blobs: BlobsIdentity | str | None
    created_at: str
    archive: BlobsIdentity | None = None
    """Where old events were archived (``ares-events archive --to``), once they were."""

    @property
    def keyed(self) -> bool:
        """True when the chain's links are keyed MACs."""
        return bool(self.keys)

    @property
    def key_id(self) -> str | None:
        """The id of the key that signs new links (None: unkeyed)."""
        return self.keys[-1].id if self.keys else None

    @classmethod
    def new(
        cls, chain_key: ChainKey | None, blobs: BlobsIdentity | str | None, *, from_position: int
    ) -> StoreIdentity:
        """The identity of a store written with ``chain_key`` and ``blobs`` from now on."""
        keys = () if chain_key is None else (KeyRange(chain_key.fingerprint(), from_position),)
        return cls(FORMAT_VERSION, keys, blobs, utc_now_at())

    def to_json(self) -> str:
        """The stored form (canonical JSON)."""
        blobs = asdict(self.blobs) if isinstance(self.blobs, BlobsIdentity) else self.blobs
        doc: dict[str, Any] = {
            "format": self.format,
            "chain": "keyed" if self.keys else "unkeyed",
            "keys": [{"id": k.id, "from_position": k.from_position} for k in self.keys],
            "blobs": blobs,
            "created_at": self.created_at,
        }
        if self.archive is not None:  # absent until the first archive run: older readers agree
            doc["archive"] = asdict(self.archive)
        return canonical_json(doc, field="identity").decode()

    @classmethod
    def from_json(cls, text: str, where: str) -> StoreIdentity:
        """Parse the stored form.

        Raises:
            StoreError: the record is unreadable (names the store).
        """
        try:
            doc = orjson.loads(text)
            keys = tuple(
                KeyRange(str(k["id"]), int(k["from_position"])) for k in doc.get("keys") or ()
            )
            blobs = doc.get("blobs")
            if blobs is not None and blobs != DEFAULT_BLOBS:
                blobs = _blobs_of(blobs)
            chain = doc.get("chain")
            if chain not in ("keyed", "unkeyed") or (chain == "keyed") != bool(keys):
                raise ValueError(f"chain {chain!r} does not match its keys")
            archive = None if doc.get("archive") is None else _blobs_of(doc["archive"])
            return cls(int(doc["format"]), keys, blobs, str(doc.get("created_at", "")), archive)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StoreError(
                f"the identity record of store {where} is unreadable ({type(exc).__name__}: "
                f"{exc}); it says how the store was written (chain key id, blob location)"
            ) from exc

    def describe_chain(self) -> str:
        """``keyed (key id ...)`` or ``unkeyed``, for messages."""
        return f"keyed (key id {self.key_id})" if self.keys else "unkeyed"

    def chain_problem(self, chain_key: ChainKey | None) -> str | None:
        """Why ``chain_key`` may not write to (or verify) this store, or None."""
        if self.format != FORMAT_VERSION:
            return (
                f"it is written in hash-chain format {self.format}; this build writes "
                f"format {FORMAT_VERSION}"
            )
        if chain_key is None:
            if self.keys:
                return (
                    f"its chain is keyed (key id {self.key_id}) but no chain key is "
                    "configured (set ARES_EVENTS_CHAIN_KEY or pass chain_key=)"
                )
            return None
        fp = chain_key.fingerprint()
        if not self.keys:
            return (
                f"its chain is unkeyed but a chain key (key id {fp}) is configured; "
                "open it without a chain key"
            )
        if fp != self.key_id:
            return (
                f"its chain is keyed with key id {self.key_id} but the configured chain key "
                f"has key id {fp}"
            )
        return None

    def blobs_problem(self, blobs: BlobsIdentity | str | None) -> str | None:
        """Why a store opened with blob location ``blobs`` would look in the wrong place."""
        mine = self.blobs
        if mine is None or blobs is None or mine == blobs:
            return None
        if (
            isinstance(mine, BlobsIdentity)
            and isinstance(blobs, BlobsIdentity)
            and mine.location == blobs.location
        ):
            return None
        return (
            f"its spilled payloads live at {_show(mine)} but it was opened with blobs at "
            f"{_show(blobs)} (omit blobs= to use the recorded location, or record a new one "
            "with `ares-events init --relocate-blobs` after moving them)"
        )


def _blobs_of(doc: Any) -> BlobsIdentity:
    return BlobsIdentity(str(doc["location"]), str(doc["url"]))


def _show(blobs: BlobsIdentity | str) -> str:
    if isinstance(blobs, BlobsIdentity):
        return blobs.location
    return "the folder next to the SQLite file" if blobs == DEFAULT_BLOBS else blobs


def check_configured(
    identity: StoreIdentity,
    chain_key: ChainKey | None,
    blobs: BlobsIdentity | str | None,
    where: str,
) -> None:
    """Raise :class:`ConfigError` when the configuration differs from ``identity``.

    Raises:
        ConfigError: names the store and what differs (never a key, only key ids).
    """
    problem = identity.chain_problem(chain_key) or identity.blobs_problem(blobs)
    if problem is not None:
        raise ConfigError(f"store {where}: {problem}")
