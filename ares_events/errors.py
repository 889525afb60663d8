"""The whole error hierarchy of ares_events: the classes defined here, and (with the
module they live in) the ones defined beside the code that raises them.

::

    AresError
    ├── ConfigError (ValueError)             bad URL/option/env value; names its source
    │   ├── UnknownSchemeError               lists the known schemes
    │   └── SessionSettingsError (TypeError) integrations.openai_agents: bad session_settings
    ├── MissingDependencyError (ImportError) names the pip extra to install
    ├── InvalidEvent (ValueError)            bad input: not JSON, NaN, bad stream id, too large
    │   └── EventSchemaError                 core.catalog: a payload against its event's schema
    ├── EventNotFound (LookupError)          no event at that stream and version
    ├── PayloadErased                        the event's payload was erased (.stream_id, .version)
    ├── ProofError (ValueError)              a signed note, checkpoint or proof that is malformed,
    │   │                                    does not verify, or cannot be made (.reason)
    │   ├── CheckpointNeeded                 projections.merkle: a proof needs a checkpoint signed
    │   └── WitnessRefused                   a witness would not cosign (.status, .latest_size)
    ├── ConcurrencyError                     expected_version mismatch (.expected, .actual)
    │   ├── SessionConflict                  another run wrote the session since this one read it
    │   │   └── StaleSessionConflict         integrations._google_adk_core: also ADK's own error
    │   ├── ConversationConflict             integrations._pydantic_ai_store_async: the same,
    │   │                                    for a Pydantic AI history
    │   └── StaleWriteError                  integrations._langgraph_core: a checkpoint write
    │                                        from a stale parent
    ├── StoreError                           backend failure; driver error kept as __cause__
    │   ├── StoreUnavailable (ConnectionError)  connect/timeout/pool exhausted/server down
    │   │   └── StoreNotFound                no store at that URL (and creating was not asked)
    │   ├── StoreClosed                      the store was closed (before or during the call)
    │   ├── SchemaVersionError               DB schema behind/ahead of this build
    │   ├── CrossCellError                   one call spans cells of a cell store (.cells)
    │   └── ArchiveError                     an archived segment missing, altered or unreadable
    ├── ChainIntegrityError                  verification failed (.findings)
    │   └── ChainVerificationError           integrations._eventsourcing_store: also
    │                                        eventsourcing's DataError
    ├── RunRefused                           agents.journal_errors: the version gate refused
    ├── RunNotRunnable                       agents.journal_errors: paused, done or refused run
    │   ├── InDoubtToolCall                  agents.journal_errors: an unreconcilable tool call
    │   └── ApprovalRequired                 agents.journal_errors: needs a signed approval
    ├── RunNotFound (LookupError)            agents.journal_errors: no run has this id
    ├── ReplayDivergence                     agents.journal_errors: replay asked for another step
    ├── ReentrantCall (RuntimeError)         agents.journal_errors: re-entrant use
    ├── ModelCallFailed                      agents.journal_errors: a recorded model failure
    ├── ToolCallFailed                       agents.journal_errors: a recorded tool failure
    ├── ApprovalRefused                      a signed approval refused; nothing ran (.run_id, .step)
    │   ├── ApprovalForged                   malformed, bad signature, or not a trusted key
    │   ├── ApprovalExpired                  past its expiry
    │   ├── ApprovalReplayed                 its single-use nonce was used already
    │   ├── ApprovalReused                   issued for another run or another chain head
    │   └── ApprovalWrongCall                names another step, call or outcome
    ├── ReplayCapExceeded                    strict replay hit max_replay (.stream_id, .cap)
    ├── BlobError
    │   ├── BlobMissing
    │   └── BlobCorrupted                    fetched bytes differ from the chained digest
    └── SnapshotMismatch                     snapshot does not match the stream it folds

Constructors take domain values, keep them as attributes and build the message
themselves. No message ever contains a password, token or chain key: callers pass
redacted URLs only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ApprovalExpired",
    "ApprovalForged",
    "ApprovalRefused",
    "ApprovalReplayed",
    "ApprovalReused",
    "ApprovalWrongCall",
    "ArchiveError",
    "AresError",
    "BlobCorrupted",
    "BlobError",
    "BlobMissing",
    "ChainIntegrityError",
    "ConcurrencyError",
    "ConfigError",
    "CrossCellError",
    "EventNotFound",
    "InvalidEvent",
    "MissingDependencyError",
    "PayloadErased",
    "ProofError",
    "ReplayCapExceeded",
    "SchemaVersionError",
    "SessionConflict",
    "SnapshotMismatch",
    "StoreClosed",
    "StoreError",
    "StoreNotFound",
    "StoreUnavailable",
    "UnknownSchemeError",
    "WitnessRefused",
]


def _rebuild(cls: type[AresError], args: tuple[Any, ...], state: dict[str, Any]) -> AresError:
    """Unpickle an error without calling its constructor (whose signature is domain
    values, not the message)."""
    obj = cls.__new__(cls)
    obj.args = args
    obj.__dict__.update(state)
    return obj


class AresError(Exception):
    """Base class of every error raised by ares_events.

    Errors pickle with their attributes (they cross process boundaries in worker pools and
    supervisors), and every public one is importable from the top-level package.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


class ConfigError(AresError, ValueError):
    """A URL, option or environment value is invalid. The message names its source."""


class UnknownSchemeError(ConfigError):
    """A store URL uses a scheme no backend is registered for."""

    def __init__(self, scheme: str, known: Sequence[str]) -> None:
        self.scheme = scheme
        self.known = tuple(known)
        super().__init__(f"unknown store scheme {scheme!r}; known schemes: {', '.join(self.known)}")


class MissingDependencyError(AresError, ImportError):
    """An optional dependency is not installed. The message names the pip extra (or, for a
    third-party plugin, ``extra`` None, the module that is missing)."""

    def __init__(self, what: str, extra: str | None, *, missing: str | None = None) -> None:
        self.extra = extra
        if extra is not None:
            hint = f"pip install 'ares-events[{extra}]'"
        else:
            hint = f"{missing or 'a module'} is not installed (install what the plugin needs)"
        super().__init__(f"{what} needs an optional dependency: {hint}")


class InvalidEvent(AresError, ValueError):
    """An event (or a value inside it) cannot be stored. Names the field and where."""

    def __init__(
        self, field: str, problem: str, *, stream_id: str | None = None, index: int | None = None
    ) -> None:
        self.field = field
        self.problem = problem
        self.stream_id = stream_id
        self.index = index
        where = []
        if stream_id is not None:
            where.append(f"stream {stream_id!r}")
        if index is not None:
            where.append(f"event #{index}")
        loc = f" ({', '.join(where)})" if where else ""
        super().__init__(f"invalid {field}{loc}: {problem}")


class EventNotFound(AresError, LookupError):
    """No event is stored at that stream and version."""

    def __init__(self, stream_id: str, version: int, detail: str = "") -> None:
        self.stream_id = stream_id
        self.version = version
        msg = f"stream {stream_id!r} has no event at version {version}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class PayloadErased(AresError):
    """The event's payload was erased (``ares-events erase``). Its digest and size stay
    (the chain commits to them), the bytes are gone; ``event.payload_erased`` is True."""

    def __init__(self, stream_id: str, version: int) -> None:
        self.stream_id = stream_id
        self.version = version
        super().__init__(
            f"the payload of stream {stream_id!r} version {version} was erased; its digest "
            "and size remain, its content does not"
        )


class ProofError(AresError, ValueError):
    """A signed note, checkpoint or proof that is malformed, does not verify, or cannot be
    made. ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class WitnessRefused(ProofError):
    """A witness refused to cosign a checkpoint: ``status`` is the tlog-witness HTTP status
    (docs/errors.md), ``latest_size`` the size it last cosigned (409)."""

    def __init__(self, status: int, reason: str, latest_size: int | None = None) -> None:
        self.status = status
        self.latest_size = latest_size
        super().__init__(reason)


class ConcurrencyError(AresError):
    """The stream's version is not what the append expected."""

    def __init__(self, stream_id: str, expected: object, actual: int, detail: str = "") -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        msg = f"stream {stream_id!r}: expected version {expected}, actual version {actual}"
        super().__init__(f"{msg}; {detail}" if detail else msg)


class SessionConflict(ConcurrencyError):
    """Another run wrote to the session since this run read it (``.session_id``,
    ``.expected``, ``.actual``); nothing was stored: read it again and run the turn again
    (ADK: :class:`~ares_events.integrations.google_adk.StaleSessionConflict`)."""

    def __init__(
        self, session_id: str, stream_id: str, expected: int, actual: int, detail: str = ""
    ) -> None:
        self.session_id = session_id
        super().__init__(
            stream_id,
            expected,
            actual,
            detail
            or f"session {session_id!r} was written by another run since this run read it "
            f"(version {expected}); nothing was stored: read it again and run the turn again",
        )


class StoreError(AresError):
    """A backend failed. The driver's exception is kept as ``__cause__``."""


class StoreUnavailable(StoreError, ConnectionError):
    """The store cannot be reached (connect, timeout, pool exhausted). Retryable."""


class StoreNotFound(StoreUnavailable):
    """There is no store at the URL, and the caller asked not to create one (a typo'd
    path is reported as missing, never made a new, empty, "clean" store)."""

    def __init__(self, where: str, detail: str) -> None:
        self.where = where
        self.detail = detail
        super().__init__(f"no store at {where}: {detail}")


class StoreClosed(StoreError):
    """The store was closed, before the call or while it ran in another thread (an append
    cut short is committed whole or not at all: re-append the same ids to find out)."""

    def __init__(self, where: str, action: str | None = None) -> None:
        self.where = where
        self.action = action
        what = f"{action}: " if action else ""
        super().__init__(f"{what}store {where} is closed")


class CrossCellError(StoreError):
    """An ``append_many`` spans several cells of a cell store and cannot be atomic there;
    nothing was written (``store.cell_of(stream_id)`` names a stream's cell)."""

    def __init__(self, action: str, where: str, cells: Sequence[str]) -> None:
        self.action = action
        self.where = where
        self.cells = tuple(cells)
        super().__init__(
            f"{action} in {where} spans cells {', '.join(self.cells)}: a cell store is "
            "atomic within one cell only; nothing was written"
        )


class SchemaVersionError(StoreError):
    """The database schema is behind or ahead of this build. Says how to fix it."""

    def __init__(self, found: int, expected: int, where: str) -> None:
        self.found = found
        self.expected = expected
        if found < expected:
            fix = "run `ares-events init` (or open with migrate=True) to migrate it"
        else:
            fix = "upgrade ares-events; this build is older than the schema"
        super().__init__(
            f"schema version of {where} is {found}, this build needs {expected}: {fix}"
        )


class ChainIntegrityError(AresError):
    """Verification of a hash chain failed. ``findings`` lists every problem found."""

    def __init__(self, stream_id: str | None, findings: Sequence[Any]) -> None:
        self.stream_id = stream_id
        self.findings = list(findings)
        first = self.findings[0] if self.findings else None
        where = f"stream {stream_id!r}" if stream_id is not None else "store"
        super().__init__(
            f"chain integrity check failed for {where}: {len(self.findings)} finding(s)"
            + (f"; first: {first}" if first is not None else "")
        )


class ApprovalRefused(AresError):
    """A signed approval of a pending call was refused: the call did not run and nothing
    was written. The subclass says why; ``detail`` says exactly what differed."""

    kind = "refused"

    def __init__(self, run_id: str, step: int | None, detail: str) -> None:
        self.run_id = run_id
        self.step = step
        self.detail = detail
        where = f"step {step} of run {run_id!r}" if step is not None else f"run {run_id!r}"
        super().__init__(f"approval of {where} refused ({self.kind}): {detail}")


class ApprovalForged(ApprovalRefused):
    """Not a signed approval, a signature that does not verify, or a key the journal was
    not told to trust."""

    kind = "forged"


class ApprovalExpired(ApprovalRefused):
    """The approval's expiry has passed."""

    kind = "expired"


class ApprovalReplayed(ApprovalRefused):
    """The approval's single-use nonce already let a call run (or was presented before)."""

    kind = "replayed"


class ApprovalReused(ApprovalRefused):
    """The approval was issued for another run, or against another chain head than the
    one it is presented after (copied from elsewhere)."""

    kind = "reused"


class ApprovalWrongCall(ApprovalRefused):
    """The approval names another step, another call (arguments digest) or another
    outcome than the pending one."""

    kind = "wrong_call"


class ReplayCapExceeded(AresError):
    """A strict replay reached ``max_replay`` events before the end of the stream."""

    def __init__(self, stream_id: str, cap: int, version: int) -> None:
        self.stream_id = stream_id
        self.cap = cap
        self.version = version
        super().__init__(
            f"stream {stream_id!r}: replay cap of {cap} events reached at version {version}"
            " before the end of the stream"
        )


class BlobError(AresError):
    """A spilled payload could not be fetched or verified."""

    def __init__(
        self, key: str, detail: str, *, stream_id: str | None = None, version: int | None = None
    ) -> None:
        self.key = key
        self.detail = detail
        self.stream_id = stream_id
        self.version = version
        where = f" (stream {stream_id!r} version {version})" if stream_id is not None else ""
        super().__init__(f"blob {key}{where}: {detail}")


class BlobMissing(BlobError):
    """A referenced blob is not in the blob store."""


class BlobCorrupted(BlobError):
    """The digest of a fetched blob differs from the digest in the chain."""


class ArchiveError(StoreError):
    """An archived segment (or its manifest) is missing from the archive, differs from the
    digest the store recorded, or cannot be decoded. Nothing is served from it.

    Attributes:
        kind: ``"missing"``, ``"corrupted"`` or ``"unreadable"``.
        segment: the segment's sequence number (1, 2, ...), or None for the segment index.
        key: the archive object's key.
        detail: what was wrong.
    """

    def __init__(self, kind: str, segment: int | None, key: str, detail: str) -> None:
        self.kind = kind
        self.segment = segment
        self.key = key
        self.detail = detail
        which = f"segment {segment}" if segment is not None else "segment index"
        super().__init__(f"archive {which} ({key}) {kind}: {detail}")


class SnapshotMismatch(AresError):
    """A snapshot does not match the stream it claims to fold."""

    def __init__(self, stream_id: str, projection: str, reason: str) -> None:
        self.stream_id = stream_id
        self.projection = projection
        self.reason = reason
        super().__init__(f"snapshot of {projection!r} for stream {stream_id!r}: {reason}")


for _name in __all__:  # every public error is documented as ares_events.<Name>
    globals()[_name].__module__ = "ares_events"
del _name
