"""Anchors: signed checkpoints kept at a location outside the store (a folder or an S3
prefix), and :func:`verify_anchors`, the check that the store still extends every one of
them (findings and location URLs: docs/proofs.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from ares_events.core.events import utc_now_at
from ares_events.core.faces import blocking
from ares_events.core.recorder import system_of_record
from ares_events.core.url import StoreURL
from ares_events.errors import (
    ArchiveError,
    ConfigError,
    MissingDependencyError,
    ProofError,
    StoreUnavailable,
)
from ares_events.integrity import merkle
from ares_events.integrity.checkpoints import SignedCheckpoint, open_checkpoint
from ares_events.integrity.findings import Finding, FindingsReport, report_dict
from ares_events.integrity.notes import VerifierKey, b64
from ares_events.stores.blobs.file import fsync_dir, write_atomic

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = [
    "AnchorCheck",
    "AnchorLocation",
    "RootAccumulator",
    "check_anchors",
    "open_location",
    "recorded_log_keys",
    "roots_at",
    "verify_anchors",
    "write_checkpoint_note",
]

_S3_PARAMS: Final = ("endpoint_url", "region")


class AnchorLocation(Protocol):
    """Where signed checkpoints are kept, outside the store: :meth:`put` stores one note
    and returns where (for display), :meth:`items` yields every note as ``(name, bytes)``
    by name, :meth:`describe` says where the location is (no secrets). ``put`` and
    ``items`` raise :exc:`~ares_events.errors.StoreUnavailable` when it cannot be reached."""

    def put(self, name: str, data: bytes) -> str: ...

    def items(self) -> Iterator[tuple[str, bytes]]: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


class FileAnchors:
    """A folder with one file per signed checkpoint."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def describe(self) -> str:
        return self.folder.absolute().as_uri()

    def put(self, name: str, data: bytes) -> str:
        """Write ``name`` atomically: temporary file, fsync, rename, fsync the folder."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomic(self.folder / name, data, prefix=".checkpoint-")
            with contextlib.suppress(OSError):  # not every platform can fsync a folder
                fsync_dir(self.folder)
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot write anchor to {self.describe()}: {exc.strerror or exc}"
            ) from exc
        return str(self.folder / name)

    def items(self) -> Iterator[tuple[str, bytes]]:
        """Every ``checkpoint-*.note`` in the folder, by name (by size, then time)."""
        if not self.folder.exists():
            return
        try:
            names = sorted(p.name for p in self.folder.glob(f"{NOTE_PREFIX}*{NOTE_SUFFIX}"))
            for n in names:
                p = self.folder / n
                # A folder or a FIFO (whose read would block forever) is no note: empty.
                yield n, p.read_bytes() if stat.S_ISREG(p.stat().st_mode) else b""
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot read anchors from {self.describe()}: {exc.strerror or exc}"
            ) from exc

    def close(self) -> None:
        pass


class S3Anchors:
    """One S3 object per signed checkpoint under ``prefix``."""

    def __init__(self, url: StoreURL) -> None:
        if url.username or url.password:
            raise ConfigError(
                "an s3:// anchor URL takes no credentials (boto3's normal chain provides "
                f"them): {url.redacted()}"
            )
        params = url.check_params(_S3_PARAMS)
        if not url.host:
            raise ConfigError(f"s3 anchor URL needs a bucket: {url.redacted()}")
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError as exc:  # pragma: no cover - only without the extra
            raise MissingDependencyError("an s3:// anchor location", "s3") from exc
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
        return self._url

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def put(self, name: str, data: bytes) -> str:
        """Upload one anchor (a single PUT: S3 objects appear whole or not at all)."""
        key = self._key(name)
        try:
            self._client.put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentType="text/plain"
            )
        except self._boto_errors as exc:
            raise StoreUnavailable(
                f"cannot write anchor to {self._url}: {type(exc).__name__}"
            ) from exc
        return f"s3://{self.bucket}/{key}"

    def items(self) -> Iterator[tuple[str, bytes]]:
        try:
            keys: list[str] = []
            for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._key(NOTE_PREFIX)
            ):
                keys.extend(
                    o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(NOTE_SUFFIX)
                )
            for key in sorted(keys, key=lambda k: k.rsplit("/", 1)[-1]):
                body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
                with contextlib.closing(body):
                    yield key.rsplit("/", 1)[-1], body.read()
        except self._boto_errors as exc:
            raise StoreUnavailable(
                f"cannot read anchors from {self._url}: {type(exc).__name__}"
            ) from exc

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()


def open_location(url: str) -> AnchorLocation:
    """Open the anchor location at ``url`` (``file:///dir``, a plain path, or ``s3://bucket/prefix``).

    Raises:
        ConfigError: an unsupported scheme or bad parameter.
        MissingDependencyError: boto3 is missing for an s3:// location.
    """
    if "://" not in url:
        return FileAnchors(Path(url))
    parsed = StoreURL.parse(url, source="anchor URL")
    if parsed.scheme == "file":
        parsed.check_params(())
        if parsed.host not in (None, "", "localhost"):
            raise ConfigError(f"file:// anchor URLs take no host: {parsed.redacted()}")
        return FileAnchors(Path(parsed.path))
    if parsed.scheme == "s3":
        return S3Anchors(parsed)
    raise ConfigError(
        f"an anchor location must be file:///folder or s3://bucket/prefix, got {parsed.redacted()}"
    )


def write_checkpoint_note(location_url: str, note: str, size: int) -> str:
    """Put a signed checkpoint at the location as ``checkpoint-<size>-<time>.note`` (names
    sort by size, then time). Returns where it went.

    Raises:
        ConfigError: a bad location URL.
        StoreUnavailable: the location cannot be written.
    """
    stamp = utc_now_at().replace("-", "").replace(":", "")
    name = f"{NOTE_PREFIX}{size:020d}-{stamp}{NOTE_SUFFIX}"
    with contextlib.closing(open_location(location_url)) as location:
        where = location.put(name, note.encode("utf-8"))
    logger.info("anchored a checkpoint of size %d to %s", size, where)
    return where


@dataclass(slots=True)
class AnchorCheck(FindingsReport):
    """Result of checking a store against every signed checkpoint of a location."""

    location: str
    anchors_checked: int = 0
    """Signed checkpoints whose signature verified."""
    findings: list[Finding] = field(default_factory=list)
    latest: str | None = None
    """Name of the newest checkpoint checked."""
    keys_from: str | None = None
    """Where the trusted keys came from: ``given`` (``--vkey``) or ``store`` (recorded)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return report_dict(self)


def verify_anchors(
    store: EventStore, location_url: str, *, keys: Sequence[VerifierKey] | None = None
) -> AnchorCheck:
    """Check that ``store`` still extends every signed checkpoint kept at
    ``location_url`` (docs/proofs.md), reading the system of record (never a
    cache; archived events included).

    ``keys`` are the trusted verifier keys (default: the keys the store recorded as its
    log keys, a weaker source: ``keys_from`` says which).

    Raises:
        ConfigError: a bad location URL.
        StoreUnavailable: the store or the location cannot be reached.
    """
    store = blocking(store, "ares_events.integrity.anchors.verify_anchors")
    rec = system_of_record(store.recorder)
    with contextlib.closing(open_location(location_url)) as location:
        report = AnchorCheck(location=location.describe())
        notes = list(location.items())  # one listing and one read per object
    if not notes:
        # Asked to prove the store against its anchors, with none to prove it against:
        # never an "ok" (a wrong URL, or anchors that were deleted).
        detail = (
            f"no signed checkpoint at {report.location}: nothing to check the store "
            "against (write one with `ares-events anchor --key FILE`)"
        )
        report.findings.append(Finding("no_anchor", None, None, detail))
        return report
    report.keys_from = "store" if keys is None else "given"
    keys = recorded_log_keys(rec) if keys is None else keys
    report.anchors_checked, report.findings = check_checkpoint_notes(rec, notes, keys)
    report.latest = notes[-1][0]
    return report


def check_anchors(
    store: EventStore, location_url: str, *, keys: Sequence[VerifierKey] | None = None
) -> list[Finding]:
    """The findings of :func:`verify_anchors`.

    Raises:
        ConfigError: a bad location URL.
        StoreUnavailable: the store or the location cannot be reached.
    """
    store = blocking(store, "ares_events.integrity.anchors.check_anchors")
    return verify_anchors(store, location_url, keys=keys).findings


NOTE_PREFIX = "checkpoint-"
NOTE_SUFFIX = ".note"


class RootAccumulator:
    """RFC 9162 roots of a growing list of leaves with ``O(log n)`` state: the roots of
    the complete subtrees that make up the tree so far, largest first."""

    __slots__ = ("size", "stack")

    def __init__(self) -> None:
        self.size = 0
        self.stack: list[tuple[int, bytes]] = []  # (height, hash)

    def add(self, leaf_data: bytes) -> None:
        """Append one leaf (its data: an event's chain hash)."""
        stack = self.stack
        h, height = merkle.leaf_hash(leaf_data), 0
        while stack and stack[-1][0] == height:
            h = merkle.node_hash(stack.pop()[1], h)
            height += 1
        stack.append((height, h))
        self.size += 1

    def root(self) -> bytes:
        """The root of the leaves added so far."""
        if not self.stack:
            return merkle.EMPTY_ROOT
        r = self.stack[-1][1]
        for _, h in reversed(self.stack[:-1]):
            r = merkle.node_hash(h, r)
        return r


def recorded_log_keys(recorder: Any) -> list[VerifierKey]:
    """The verifier keys the store recorded as having signed its checkpoints (a weaker
    source than keys given from outside: whoever can write the store can change them)."""
    get = getattr(recorder, "meta_get", None)
    raw = get("log_keys") if callable(get) else None
    try:
        texts = json.loads(raw) if raw else []
    except ValueError:
        return []
    if not isinstance(texts, list):  # overwritten by whoever can write the store
        return []
    out: list[VerifierKey] = []
    for text in texts:
        with contextlib.suppress(ValueError):
            out.append(VerifierKey.parse(str(text)))
    return out


def roots_at(recorder: Any, sizes: set[int]) -> tuple[int, dict[int, bytes]]:
    """(number of events visible to ``read_all``, root at each wanted size) recomputed from
    every event's chain hash: the one loop that checks a Merkle tree or a signed root
    against the rows (``anchor --check``, ``audit --anchors``, and the Merkle log before
    its key signs, :meth:`~ares_events.projections.merkle.MerkleLog.verify_rows`). A size
    above the number of events has no root in the result.

    Raises:
        ArchiveError: an archived segment cannot be read.
        StoreUnavailable: the store cannot be read.
    """
    acc = RootAccumulator()
    roots: dict[int, bytes] = {0: merkle.EMPTY_ROOT} if 0 in sizes else {}
    for e in recorder.read_all(0, None):
        h = e.hash
        acc.add(h if isinstance(h, bytes) else repr(h).encode())
        if acc.size in sizes:
            roots[acc.size] = acc.root()
    return acc.size, roots


def check_checkpoint_notes(
    recorder: Any, notes: Iterable[tuple[str, bytes]], keys: Sequence[VerifierKey]
) -> tuple[int, list[Finding]]:
    """Check every ``(name, note bytes)`` against ``keys`` and today's events.

    Returns:
        (checkpoints whose signature verified, findings; events in a damaged archive
        segment are an ``archive_*`` finding, and no checkpoint's root is checked).

    Raises:
        StoreUnavailable: the store cannot be read.
    """
    findings: list[Finding] = []
    good: list[tuple[str, SignedCheckpoint]] = []
    for name, raw in notes:
        kind, why = "anchor_corrupt", "empty, or not a regular file"
        if raw and not keys:
            kind, why = "anchor_unverified", "no trusted verifier key to check its signature"
            why += " (pass --vkey, or sign checkpoints in this store first)"
        elif raw:
            try:
                good.append((name, open_checkpoint(raw, keys)))  # its origin's log key signed it
                continue
            except ProofError as exc:
                why = exc.reason
        findings.append(Finding(kind, None, None, f"checkpoint {name}: {why}"))
    if not good:
        return 0, findings
    try:
        total, roots = roots_at(recorder, {s.checkpoint.size for _, s in good})
    except ArchiveError as exc:  # the events they sign cannot be read: a finding, no verdict
        detail = f"{len(good)} signed checkpoint(s) not checked: {exc}"
        return len(good), [*findings, Finding(f"archive_{exc.kind}", None, None, detail)]
    failed: dict[str, list[tuple[str, SignedCheckpoint]]] = {}
    for name, signed in sorted(good, key=lambda g: g[1].checkpoint.size):
        cp = signed.checkpoint
        if total < cp.size or roots.get(cp.size) != cp.root:
            kind = "anchor_truncated" if total < cp.size else "anchor_rewritten"
            failed.setdefault(kind, []).append((name, signed))
    for kind, items in failed.items():
        name, cp = items[0][0], items[0][1].checkpoint
        more = f" (and {len(items) - 1} later checkpoint(s) likewise)" if len(items) > 1 else ""
        if kind == "anchor_truncated":
            detail = (
                f"checkpoint {name} of {cp.origin} signed {cp.size} events but the log holds "
                f"{total}: events were deleted{more}"
            )
        else:
            now = roots.get(cp.size)
            detail = (
                f"checkpoint {name} of {cp.origin} signed root {b64(cp.root)} for the first "
                f"{cp.size} events; today they hash to {b64(now) if now else '?'}: some of "
                f"those events were rewritten after it was signed{more}"
            )
        findings.append(Finding(kind, None, None, detail))
    return len(good), findings
