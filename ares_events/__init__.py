"""ares-events: a hash-chained, append-only event store for long-running LLM agents.

Agents are disposable; their history is not.

This module re-exports the public API from the modules that define it (``__all__``,
sorted). Its only import-time action is :func:`ares_events._compat.install`, which keeps
the module paths of the previous release importable, with a ``DeprecationWarning``.
As the top of the package it may import anything.
"""

from __future__ import annotations

from ares_events import _compat, errors, integrity, projections
from ares_events.agents.journal import (
    ApprovalRequired,
    AsyncJournal,
    InDoubtToolCall,
    Journal,
    JournalStats,
    ModelCallFailed,
    ModelReply,
    ReplayDivergence,
    RunNotFound,
    RunNotRunnable,
    RunRefused,
    ToolCallFailed,
    migrating_gate,
    strict_gate,
)
from ares_events.core import catalog, telemetry
from ares_events.core.catalog import EventSchemaError
from ares_events.core.events import (
    ANY,
    ERASURE_STREAM,
    NO_STREAM,
    STREAM_EXISTS,
    AppendResult,
    Expect,
    NewEvent,
    PayloadRef,
    RecordedEvent,
)
from ares_events.core.store import EventStore, emit
from ares_events.errors import (
    ApprovalExpired,
    ApprovalForged,
    ApprovalRefused,
    ApprovalReplayed,
    ApprovalReused,
    ApprovalWrongCall,
    ArchiveError,
    AresError,
    BlobCorrupted,
    BlobError,
    BlobMissing,
    ChainIntegrityError,
    ConcurrencyError,
    ConfigError,
    CrossCellError,
    EventNotFound,
    InvalidEvent,
    MissingDependencyError,
    PayloadErased,
    ProofError,
    ReplayCapExceeded,
    SchemaVersionError,
    SnapshotMismatch,
    StoreClosed,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
    UnknownSchemeError,
    WitnessRefused,
)
from ares_events.projections.erasure import ErasureReport, erase, salted
from ares_events.projections.merkle import MerkleLog
from ares_events.projections.recovery import Snapshotter, recover, replay, snapshot
from ares_events.projections.recovery_async import arecover, areplay, asnapshot
from ares_events.projections.results import RecoveryReport, RecoverySource, ReplayResult
from ares_events.stores import (
    AsyncEventStore,
    Capability,
    available_schemes,
    open_async_store,
    open_store,
    register_store,
)
from ares_events.stores.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "ANY",
    "ERASURE_STREAM",
    "NO_STREAM",
    "STREAM_EXISTS",
    "AppendResult",
    "ApprovalExpired",
    "ApprovalForged",
    "ApprovalRefused",
    "ApprovalReplayed",
    "ApprovalRequired",
    "ApprovalReused",
    "ApprovalWrongCall",
    "ArchiveError",
    "AresError",
    "AsyncEventStore",
    "AsyncJournal",
    "BlobCorrupted",
    "BlobError",
    "BlobMissing",
    "Capability",
    "ChainIntegrityError",
    "ConcurrencyError",
    "ConfigError",
    "CrossCellError",
    "ErasureReport",
    "EventNotFound",
    "EventSchemaError",
    "EventStore",
    "Expect",
    "InDoubtToolCall",
    "InvalidEvent",
    "Journal",
    "JournalStats",
    "MerkleLog",
    "MissingDependencyError",
    "ModelCallFailed",
    "ModelReply",
    "NewEvent",
    "PayloadErased",
    "PayloadRef",
    "ProofError",
    "RecordedEvent",
    "RecoveryReport",
    "RecoverySource",
    "ReplayCapExceeded",
    "ReplayDivergence",
    "ReplayResult",
    "RunNotFound",
    "RunNotRunnable",
    "RunRefused",
    "SchemaVersionError",
    "Settings",
    "SnapshotMismatch",
    "Snapshotter",
    "StoreClosed",
    "StoreError",
    "StoreNotFound",
    "StoreUnavailable",
    "ToolCallFailed",
    "UnknownSchemeError",
    "WitnessRefused",
    "__version__",
    "arecover",
    "areplay",
    "asnapshot",
    "available_schemes",
    "catalog",
    "emit",
    "erase",
    "errors",
    "integrity",
    "migrating_gate",
    "open_async_store",
    "open_store",
    "projections",
    "recover",
    "register_store",
    "replay",
    "salted",
    "snapshot",
    "strict_gate",
    "telemetry",
]

_compat.install()
