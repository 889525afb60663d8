"""Anchors: checkpoints of the store kept by a witness outside it.

Two kinds live in a witness: *signed checkpoints* of the Merkle log
(``checkpoint-<size>-<time>.note``, written by ``ares-events anchor --key FILE``; checked by
:mod:`~ares_events.integrity.checkpoint_anchors`), which nobody without the log key can
forge, and the older *JSON anchors* of every stream head (``anchor-*.json``, written by
:func:`write_anchor`, i.e. ``ares-events anchor`` without a key), described below and
still read and checked. :func:`verify_anchors` checks both.

A hash chain proves that a stream's events are consistent with each other, not that they
are the events that were written: whoever can write the database can delete a stream's
tail and rewrite its head row to match, or rewrite a whole chain with recomputed
(unkeyed) hashes, and a bare chain verification passes. An anchor closes that gap:
:func:`write_anchor` records every stream's version and head hash, the last global
position and a timestamp in a witness the store's writers cannot touch, and
:func:`check_anchors` later proves the store still *extends* each anchor.

Witness URLs:

``file:///abs/path/anchors/`` (or a plain path)
    one JSON file per anchor, written atomically (temporary file, fsync, rename).
``s3://bucket/prefix?endpoint_url=...&region=...``
    one object per anchor, through boto3; credentials only from boto3's normal chain
    (a URL with a user or password is refused).

Anchor document (UTF-8 JSON; ``digest`` covers every other field but ``mac``)::

    {"format": "ares-events/anchor/v1", "created_at": "YYYY-MM-DDTHH:MM:SS.ffffffZ",
     "store": "<redacted store URL>", "last_position": 1234,
     "streams": [{"stream_id": "agent-7", "version": 42, "hash": "<64 hex>"}, ...],
     "key_id": "<chain key id>",                      # keyed stores only
     "digest": hex(blake3(body)),
     "mac": hex(blake3_keyed(subkey("anchor"), body))} # keyed stores only

where ``body = canonical_json(document without "digest" and "mac")``. In a keyed store
the MAC is what is trusted: an anchor file edited with its unkeyed digest recomputed, or
one without a MAC, is ``anchor_corrupt``, so forging an anchor needs the chain key. In an
unkeyed store the digest only catches accidental damage: whoever can write the witness can
rewrite an anchor (see docs/security.md; signed checkpoints are the stronger tool).

Findings of :func:`check_anchors` (each names the anchor in its detail):

``anchor_truncated``
    the stream is shorter than anchored (its head is behind the anchored version, or the
    event at that version is gone), or the global log ends before the anchored position.
    Catches a deleted tail even when the head row was rewritten to match.
``anchor_rewritten``
    the event at the anchored version has a different hash: history was rewritten.
``anchor_missing_stream``
    an anchored stream no longer exists.
``anchor_corrupt``
    the anchor document is unreadable or its own digest does not match.
``no_anchor``
    the witness holds no anchor at all: nothing was checked (never reported as clean).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import blake3
import orjson

from ares_events.chain import ChainKey, canonical_json
from ares_events.core.backend import Capability
from ares_events.core.events import utc_now_at
from ares_events.core.recorder import system_of_record
from ares_events.core.url import StoreURL
from ares_events.errors import ConfigError, MissingDependencyError, StoreUnavailable
from ares_events.integrity.checkpoint_anchors import (
    NOTE_PREFIX,
    NOTE_SUFFIX,
    check_checkpoint_notes,
    recorded_log_keys,
)
from ares_events.integrity.findings import Finding
from ares_events.integrity.notes import VerifierKey

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = [
    "ANCHOR_FORMAT",
    "Anchor",
    "AnchorCheck",
    "AnchorHead",
    "check_anchors",
    "load_anchors",
    "open_witness",
    "verify_anchors",
    "write_anchor",
    "write_checkpoint_note",
]

ANCHOR_FORMAT: Final = "ares-events/anchor/v1"
_S3_PARAMS: Final = ("endpoint_url", "region")


@dataclass(frozen=True, slots=True)
class AnchorHead:
    """One anchored stream head."""

    stream_id: str
    version: int
    hash: bytes


@dataclass(frozen=True, slots=True)
class Anchor:
    """A checkpoint of every stream head at one moment."""

    created_at: str
    store: str
    last_position: int
    heads: tuple[AnchorHead, ...]
    digest: bytes
    name: str = ""
    """Where the witness keeps it (file or object name); set once written or loaded."""
    key_id: str | None = None
    """Id of the chain key whose subkey made ``mac`` (keyed stores)."""
    mac: bytes | None = None

    def body(self) -> dict[str, Any]:
        """The document without its digest and MAC (what both cover)."""
        body: dict[str, Any] = {
            "format": ANCHOR_FORMAT,
            "created_at": self.created_at,
            "store": self.store,
            "last_position": self.last_position,
            "streams": [
                {"stream_id": h.stream_id, "version": h.version, "hash": h.hash.hex()}
                for h in self.heads
            ],
        }
        if self.key_id is not None:
            body["key_id"] = self.key_id
        return body

    def to_dict(self) -> dict[str, Any]:
        """The full document (JSON-ready)."""
        doc = {**self.body(), "digest": self.digest.hex()}
        if self.mac is not None:
            doc["mac"] = self.mac.hex()
        return doc

    def to_json(self) -> bytes:
        """The bytes the witness stores."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2)


def _digest(body: dict[str, Any]) -> bytes:
    return blake3.blake3(canonical_json(body, field="anchor")).digest()


def _mac(body: dict[str, Any], key: ChainKey) -> bytes:
    return key.mac("anchor", canonical_json(body, field="anchor"))


class _Corrupt(Exception):
    """An anchor document that cannot be trusted (internal)."""


def _parse_anchor(name: str, raw: bytes, key: ChainKey | None = None) -> Anchor:
    """Parse and check one anchor document (its MAC too, with ``key``).

    Raises:
        _Corrupt: unreadable, wrong format, digest or MAC mismatch, or a MAC missing in
            a keyed store (or present in an unkeyed one).
    """
    try:
        doc = orjson.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != ANCHOR_FORMAT:
            raise _Corrupt(f"not an {ANCHOR_FORMAT} document")
        digest = bytes.fromhex(doc.pop("digest"))
        mac_hex = doc.pop("mac", None)
        key_id = doc.get("key_id")
        if key is None and (mac_hex is not None or key_id is not None):
            raise _Corrupt(f"it is sealed with chain key id {key_id}, but this store is unkeyed")
        if key is not None:
            if mac_hex is None:
                raise _Corrupt(
                    "it carries no MAC under the store's chain key (written without the key, "
                    "or edited)"
                )
            if key_id != key.fingerprint() or _mac(doc, key) != bytes.fromhex(mac_hex):
                raise _Corrupt("its MAC does not verify under the store's chain key (forged?)")
        heads = tuple(
            AnchorHead(str(s["stream_id"]), int(s["version"]), bytes.fromhex(s["hash"]))
            for s in doc["streams"]
        )
        anchor = Anchor(
            created_at=str(doc["created_at"]),
            store=str(doc["store"]),
            last_position=int(doc["last_position"]),
            heads=heads,
            digest=digest,
            name=name,
            key_id=None if key_id is None else str(key_id),
            mac=None if mac_hex is None else bytes.fromhex(mac_hex),
        )
        if _digest(doc) != digest:
            raise _Corrupt("its digest does not match its content")
    except _Corrupt:
        raise
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _Corrupt(f"unreadable ({type(exc).__name__})") from None
    return anchor


# -- witnesses ----------------------------------------------------------------------------


class Witness(Protocol):
    """Where anchors are kept."""

    def put(self, name: str, data: bytes) -> str:
        """Store one anchor document; return where (for display)."""
        ...

    def items(self) -> Iterator[tuple[str, bytes]]:
        """Every stored anchor document as ``(name, bytes)``, oldest first."""
        ...

    def describe(self) -> str:
        """Where this witness is (no secrets)."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


class FileWitness:
    """A folder with one JSON file per anchor."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def describe(self) -> str:
        """``file://`` URL of the folder."""
        return self.folder.absolute().as_uri()

    def put(self, name: str, data: bytes) -> str:
        """Write ``name`` atomically: temporary file, fsync, rename, fsync the folder.

        Raises:
            StoreUnavailable: the folder cannot be written.
        """
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".anchor-", suffix=".tmp", dir=self.folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.folder / name)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            with contextlib.suppress(OSError):  # not every platform can fsync a folder
                dfd = os.open(self.folder, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot write anchor to {self.describe()}: {exc.strerror or exc}"
            ) from exc
        return str(self.folder / name)

    def items(self) -> Iterator[tuple[str, bytes]]:
        """Every ``anchor-*.json`` and ``checkpoint-*.note`` in the folder, by name
        (names sort by time, and checkpoints by size).

        Raises:
            StoreUnavailable: the folder cannot be read.
        """
        if not self.folder.exists():
            return
        try:
            names = sorted(
                p.name
                for pattern in ("anchor-*.json", f"{NOTE_PREFIX}*{NOTE_SUFFIX}")
                for p in self.folder.glob(pattern)
            )
            for n in names:
                yield n, (self.folder / n).read_bytes()
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot read anchors from {self.describe()}: {exc.strerror or exc}"
            ) from exc

    def close(self) -> None:
        """Nothing to release."""


class S3Witness:
    """One S3 object per anchor under ``prefix``."""

    def __init__(self, url: StoreURL) -> None:
        if url.username or url.password:
            raise ConfigError(
                "an s3:// witness URL takes no credentials (boto3's normal chain provides "
                f"them): {url.redacted()}"
            )
        params = url.check_params(_S3_PARAMS)
        if not url.host:
            raise ConfigError(f"s3 witness URL needs a bucket: {url.redacted()}")
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError as exc:  # pragma: no cover - only without the extra
            raise MissingDependencyError("an s3:// anchor witness", "s3") from exc
        self._boto_errors: tuple[type[BaseException], ...] = (
            botocore.exceptions.BotoCoreError,
            botocore.exceptions.ClientError,
        )
        self.bucket = url.host
        self.prefix = url.path.strip("/")
        self._url = url.redacted()
        endpoint = params.get("endpoint_url")
        config = botocore.config.Config(
            s3={"addressing_style": "path" if endpoint else "auto"},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
        )
        session = boto3.session.Session()
        self._client = session.client(
            "s3", endpoint_url=endpoint, region_name=params.get("region"), config=config
        )

    def describe(self) -> str:
        """The witness URL (redacted)."""
        return self._url

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def put(self, name: str, data: bytes) -> str:
        """Upload one anchor (a single PUT: S3 objects appear whole or not at all).

        Raises:
            StoreUnavailable: the bucket cannot be written.
        """
        key = self._key(name)
        try:
            self._client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=data,
                ContentType="application/json" if name.endswith(".json") else "text/plain",
            )
        except self._boto_errors as exc:
            raise StoreUnavailable(
                f"cannot write anchor to {self._url}: {type(exc).__name__}"
            ) from exc
        return f"s3://{self.bucket}/{key}"

    def items(self) -> Iterator[tuple[str, bytes]]:
        """Every ``anchor-*.json`` and ``checkpoint-*.note`` object under the prefix,
        by name.

        Raises:
            StoreUnavailable: the bucket cannot be listed or read.
        """
        try:
            keys: list[str] = []
            for start, suffix in (("anchor-", ".json"), (NOTE_PREFIX, NOTE_SUFFIX)):
                for page in self._client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self._key(start)
                ):
                    keys.extend(
                        o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(suffix)
                    )
            for key in sorted(keys, key=lambda k: k.rsplit("/", 1)[-1]):
                body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
                try:
                    yield key.rsplit("/", 1)[-1], body.read()
                finally:
                    body.close()
        except self._boto_errors as exc:
            raise StoreUnavailable(
                f"cannot read anchors from {self._url}: {type(exc).__name__}"
            ) from exc

    def close(self) -> None:
        """Close the boto3 client's connections."""
        with contextlib.suppress(Exception):
            self._client.close()


def open_witness(url: str) -> Witness:
    """Open the witness at ``url`` (``file:///dir``, a plain path, or ``s3://bucket/prefix``).

    Raises:
        ConfigError: an unsupported scheme or bad parameter.
        MissingDependencyError: boto3 is missing for an s3:// witness.
    """
    if "://" not in url:
        return FileWitness(Path(url))
    parsed = StoreURL.parse(url, source="anchor witness URL")
    if parsed.scheme == "file":
        parsed.check_params(())
        if parsed.host not in (None, "", "localhost"):
            raise ConfigError(f"file:// witness URLs take no host: {parsed.redacted()}")
        return FileWitness(Path(parsed.path))
    if parsed.scheme == "s3":
        return S3Witness(parsed)
    raise ConfigError(
        f"anchor witness must be file:///folder or s3://bucket/prefix, got {parsed.redacted()}"
    )


# -- writing and checking -----------------------------------------------------------------


def _system_of_record(store: EventStore) -> Any:
    """The recorder under any cache wrapper: anchors never trust a cache. (Not merely
    ``.inner``: under the cache, the archive reader must stay, or the archived events
    would be missing from the roots recomputed here.)"""
    return system_of_record(store.recorder)


def write_anchor(store: EventStore, witness_url: str) -> Anchor:
    """Checkpoint every stream head of ``store`` to the witness at ``witness_url``.

    The last position is read before the heads, so every event it counts is covered
    by a head at least as new.

    Returns:
        The anchor written, with ``name`` set to where the witness put it.

    Raises:
        ConfigError: a bad witness URL.
        StoreUnavailable: the store or the witness cannot be reached.
    """
    rec = _system_of_record(store)
    if Capability.CELL_CURSORS in store.capabilities:
        raise ConfigError(
            f"anchors of {store.url}: cells on separate servers have per-cell cursors, not "
            "64-bit positions; anchor each cell's own store, or use Citus (docs/scaling.md)"
        )
    last_position = int(rec.last_position())
    heads = tuple(AnchorHead(sid, h.version, h.hash) for sid, h in rec.heads())
    created = utc_now_at()
    key = store.chain_key
    key_id = key.fingerprint() if key is not None else None
    draft = Anchor(created, store.url, last_position, heads, b"", key_id=key_id)
    body = draft.body()
    digest = _digest(body)
    mac = _mac(body, key) if key is not None else None
    stamp = created.replace("-", "").replace(":", "")
    name = f"anchor-{stamp}-{digest.hex()[:12]}.json"
    anchor = dataclasses.replace(draft, digest=digest, mac=mac)
    witness = open_witness(witness_url)
    try:
        where = witness.put(name, anchor.to_json())
    finally:
        witness.close()
    logger.info("anchored %d stream(s) at position %d to %s", len(heads), last_position, where)
    return dataclasses.replace(anchor, name=where)


@dataclass(slots=True)
class AnchorCheck:
    """Result of checking a store against every anchor of a witness."""

    witness: str
    anchors_checked: int = 0
    streams_checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    latest: str | None = None
    """Name of the newest anchor checked."""
    checkpoints_checked: int = 0
    """Signed checkpoints whose signature verified (counted in ``anchors_checked`` too)."""
    keys_from: str | None = None
    """Where the trusted keys came from: ``given`` (``--vkey``) or ``store`` (recorded)."""

    @property
    def ok(self) -> bool:
        """True when there are no findings."""
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "witness": self.witness,
            "anchors_checked": self.anchors_checked,
            "streams_checked": self.streams_checked,
            "latest": self.latest,
            "checkpoints_checked": self.checkpoints_checked,
            "keys_from": self.keys_from,
            "findings": [f.to_dict() for f in self.findings],
        }


def load_anchors(witness_url: str, key: ChainKey | None = None) -> list[Anchor | Finding]:
    """Every anchor of a witness, oldest first; a corrupt one (or, with ``key``, one whose
    MAC does not verify) is an ``anchor_corrupt`` finding in its place.

    Raises:
        ConfigError: a bad witness URL.
        StoreUnavailable: the witness cannot be read.
    """
    witness = open_witness(witness_url)
    try:
        return _parse_anchors(witness.items(), key)
    finally:
        witness.close()


def _parse_anchors(
    items: Iterable[tuple[str, bytes]], key: ChainKey | None
) -> list[Anchor | Finding]:
    """The legacy JSON anchors among a witness's objects (signed checkpoints skipped)."""
    out: list[Anchor | Finding] = []
    for name, raw in items:
        if name.endswith(NOTE_SUFFIX):
            continue  # a signed checkpoint (checkpoint_anchors checks those)
        try:
            out.append(_parse_anchor(name, raw, key))
        except _Corrupt as exc:
            out.append(Finding("anchor_corrupt", None, None, f"anchor {name}: {exc}"))
    return out


def verify_anchors(
    store: EventStore, witness_url: str, *, keys: Sequence[VerifierKey] | None = None
) -> AnchorCheck:
    """Check that ``store`` still extends every anchor kept at ``witness_url``: signed
    checkpoints (``checkpoint-*.note``, see
    :mod:`~ares_events.integrity.checkpoint_anchors`) and legacy JSON anchors.

    For a signed checkpoint: its signature verifies under ``keys`` (default: the keys the
    store recorded as its log keys; ``keys_from`` says which), and the root of today's
    first ``size`` events is its root. For a legacy anchor, each anchored stream: it still
    exists, its head is at or past the anchored version, and the event at the anchored
    version still has the anchored hash. Reads go to the system of record (never through a
    cache). A problem seen in several anchors is reported once, from the newest of them.

    Raises:
        ConfigError: a bad witness URL.
        StoreUnavailable: the store or the witness cannot be reached.
    """
    rec = _system_of_record(store)
    witness = open_witness(witness_url)
    report = AnchorCheck(witness=witness.describe())
    try:
        items = list(witness.items())  # one listing and one read per object
    finally:
        witness.close()
    notes = [(n, raw) for n, raw in items if n.endswith(NOTE_SUFFIX)]
    if notes:
        if keys is None:
            keys, report.keys_from = recorded_log_keys(rec), "store"
        else:
            report.keys_from = "given"
        n, note_findings = check_checkpoint_notes(rec, notes, keys)
        report.checkpoints_checked = n
        report.anchors_checked += n
        report.findings.extend(note_findings)
        report.latest = notes[-1][0]
    seen: set[tuple[str, str | None, int | None]] = set()
    checked_streams: set[str] = set()
    last_position = int(rec.last_position())
    heads_cache: dict[str, Any] = {}
    hash_cache: dict[tuple[str, int], bytes | None] = {}
    for item in reversed(_parse_anchors(items, store.chain_key)):  # newest first
        if isinstance(item, Finding):
            report.findings.append(item)
            continue
        report.anchors_checked += 1
        if report.latest is None:
            report.latest = item.name
        found: list[Finding] = []
        if last_position < item.last_position:
            found.append(
                Finding(
                    "anchor_truncated",
                    None,
                    None,
                    f"the global log ends at position {last_position} but anchor {item.name} "
                    f"recorded position {item.last_position}",
                )
            )
        for ah in item.heads:
            checked_streams.add(ah.stream_id)
            found.extend(_check_head(rec, item.name, ah, heads_cache, hash_cache))
        for f in found:
            k = (f.kind, f.stream_id, f.version)
            if k not in seen:
                seen.add(k)
                report.findings.append(f)
    report.streams_checked = len(checked_streams)
    if report.anchors_checked == 0 and not report.findings and not notes:
        # Asked to prove the store against its anchors, with none to prove it against:
        # never an "ok" (a wrong witness URL, or anchors that were deleted).
        report.findings.append(
            Finding(
                "no_anchor",
                None,
                None,
                f"no anchor at {report.witness}: nothing to check the store against "
                "(write one with `ares-events anchor`)",
            )
        )
    return report


def _check_head(
    rec: Any,
    name: str,
    ah: AnchorHead,
    heads_cache: dict[str, Any],
    hash_cache: dict[tuple[str, int], bytes | None],
) -> list[Finding]:
    sid, v = ah.stream_id, ah.version
    if sid not in heads_cache:
        heads_cache[sid] = rec.head(sid)
    head = heads_cache[sid]
    if (sid, v) not in hash_cache:
        at = next(iter(rec.read(sid, v, v, 1)), None)
        hash_cache[(sid, v)] = at.hash if at is not None and at.version == v else None
    stored = hash_cache[(sid, v)]
    out: list[Finding] = []
    if head is None and stored is None:
        first = next(iter(rec.read(sid, 1, None, 1)), None)
        if first is None:
            return [
                Finding(
                    "anchor_missing_stream",
                    sid,
                    v,
                    f"anchor {name} recorded version {v} but the stream no longer exists",
                )
            ]
    if head is None or head.version < v or stored is None:
        now = "no head row" if head is None else f"its head is at version {head.version}"
        gone = "" if stored is not None else f" and version {v} is gone"
        out.append(
            Finding(
                "anchor_truncated",
                sid,
                v,
                f"anchor {name} recorded version {v} but {now}{gone}",
            )
        )
    if stored is not None and stored != ah.hash:
        out.append(
            Finding(
                "anchor_rewritten",
                sid,
                v,
                f"the event at version {v} no longer has the hash anchor {name} recorded "
                f"({ah.hash.hex()[:16]}…, now {stored.hex()[:16]}…)",
            )
        )
    return out


def check_anchors(
    store: EventStore, witness_url: str, *, keys: Sequence[VerifierKey] | None = None
) -> list[Finding]:
    """The findings of :func:`verify_anchors`.

    Raises:
        ConfigError: a bad witness URL.
        StoreUnavailable: the store or the witness cannot be reached.
    """
    return verify_anchors(store, witness_url, keys=keys).findings


def write_checkpoint_note(witness_url: str, note: str, size: int) -> str:
    """Put a signed checkpoint into the witness as ``checkpoint-<size>-<time>.note``
    (names sort by size, then time). Returns where it went.

    Raises:
        ConfigError: a bad witness URL.
        StoreUnavailable: the witness cannot be written.
    """
    stamp = utc_now_at().replace("-", "").replace(":", "")
    name = f"{NOTE_PREFIX}{size:020d}-{stamp}{NOTE_SUFFIX}"
    witness = open_witness(witness_url)
    try:
        where = witness.put(name, note.encode("utf-8"))
    finally:
        witness.close()
    logger.info("wrote signed checkpoint of size %d to %s", size, where)
    return where
