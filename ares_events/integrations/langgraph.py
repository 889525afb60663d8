"""A LangGraph checkpointer on ares-events: :class:`AresSaver` (blocking) and
:class:`AsyncAresSaver` (asyncio), each a ``BaseCheckpointSaver`` of
``langgraph-checkpoint`` 4.x (``pip install 'ares-events[langgraph]'``)::

    from ares_events.integrations.langgraph import AresSaver

    with AresSaver.from_url("sqlite:///agents.db") as saver:
        graph = builder.compile(checkpointer=saver)

One thread is one hash-chained stream, ``langgraph/<thread_id>``; the layout, the
encoding and the verification are described in
:mod:`~ares_events.integrations._langgraph_core`, the operations (written once for both
faces) in :mod:`~ares_events.integrations._langgraph_steps`. What a user gets:

- **No forks.** A checkpoint is appended with the stream version at which its parent was
  seen not yet continued; a second writer from the same parent gets
  :class:`StaleWriteError` (``is_stale_write_owner_error = True``) instead of forking the
  thread. Deliberate branches (``update_state``, time travel: sources ``update`` and
  ``fork``) are allowed.
- **Deltas.** A channel value is stored once per thread (content-addressed) and a list
  that grew is stored as the items it added; big values spill to the store's blob store
  (a folder, or S3).
- **Verified before decoded.** Nothing is deserialised before its event's link in the
  chain (a MAC in keyed mode) verified; a thread that does not verify is refused with
  :class:`~ares_events.errors.ChainIntegrityError` and its findings. The default
  serializer is ``JsonPlusSerializer(pickle_fallback=False)``.
- **Retention.** :meth:`AresSaver.prune` (the newest N checkpoints per namespace, or by
  age) and :meth:`AresSaver.delete_thread` erase the payloads and blobs of everything
  dropped, record each erasure in ``ares-events/erasures``, and leave the chain
  verifiable (``ares-events audit`` lists the erasures).

Concurrency: each saver keeps a verified index per thread (at most ``max_threads`` of
them, least recently used evicted) and serialises the operations of one thread; there is
no saver-wide lock, so different threads run in parallel.

It may import anything in the package, and ``langgraph``.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Final, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ares_events.core.events import ERASURE_STREAM, AppendResult, NewEvent, RecordedEvent
from ares_events.core.ports import AsyncStorePort, StorePort
from ares_events.core.sansio import Steps, arun, run
from ares_events.core.store import EventStore
from ares_events.core.store_async import AsyncEventStore
from ares_events.errors import InvalidEvent
from ares_events.integrations import _langgraph_steps as steps
from ares_events.integrations import thread_of
from ares_events.integrations._langgraph_core import (
    MODULE,
    STREAM_PREFIX,
    StaleWriteError,
    ThreadIndex,
    stream_of,
)
from ares_events.integrations._langgraph_plan import ValueCache

__all__ = [
    "MODULE",
    "STREAM_PREFIX",
    "AresSaver",
    "AsyncAresSaver",
    "StaleWriteError",
    "stream_of",
    "thread_of",
]

DEFAULT_MAX_THREADS: Final = 128
_L = TypeVar("_L")


def default_serde() -> SerializerProtocol:
    """The serializer the savers use unless given one: msgpack, never pickle."""
    return JsonPlusSerializer(pickle_fallback=False)


def next_version(current: str | int | float | None) -> str:
    """A channel version above ``current`` with a random tail, so two branches that grow
    from one checkpoint never give different values the same version."""
    if current is None:
        n = 0
    elif isinstance(current, int | float):
        n = int(current)
    else:
        n = int(str(current).split(".")[0])
    return f"{n + 1:032}.{random.random():016}"


def _cutoff(older_than: timedelta | None) -> str | None:
    if older_than is None:
        return None
    if older_than < timedelta(0):
        raise InvalidEvent("older_than", "must not be negative")
    return (datetime.now(UTC) - older_than).isoformat()


def _prune_args(strategy: str, keep_last: int | None, by_age: bool) -> int | None:
    if strategy == "delete":
        return 0
    if strategy != "keep_latest":
        raise InvalidEvent("strategy", f"must be 'keep_latest' or 'delete', got {strategy!r}")
    if keep_last is None:
        return None if by_age else 1
    if type(keep_last) is not int or keep_last < 0:
        raise InvalidEvent("keep_last", f"must be an int >= 0, got {keep_last!r}")
    return keep_last


def _lister(
    serde: SerializerProtocol,
    config: RunnableConfig,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
    cache: ValueCache | None,
) -> Callable[[ThreadIndex], Steps[list[CheckpointTuple]]]:
    return lambda ix: steps.list_steps(ix, serde, config, filter, before, limit, cache)


class _Indexes:
    """The per-thread indexes and locks of one saver (``lock_type``: threading.Lock or
    asyncio.Lock). ``_map`` guards the dictionary only, never I/O."""

    def __init__(self, store: Any, lock_type: type[Any], max_threads: int) -> None:
        if type(max_threads) is not int or max_threads < 1:
            raise InvalidEvent("max_threads", f"must be an int >= 1, got {max_threads!r}")
        self.store = store
        self.lock_type = lock_type
        self.max = max_threads
        self._map: OrderedDict[str, tuple[Any, ThreadIndex]] = OrderedDict()
        self._guard = threading.Lock()

    def get(self, sid: str) -> tuple[Any, ThreadIndex]:
        with self._guard:
            item = self._map.get(sid)
            if item is None:
                item = (self.lock_type(), ThreadIndex(sid, self.store.chain_key))
                self._map[sid] = item
                while len(self._map) > self.max:
                    self._map.popitem(last=False)
            else:
                self._map.move_to_end(sid)
            return item


class _Port(StorePort):
    """The store port plus what the saver needs besides (ranges, erasure)."""

    __slots__ = ()

    def read(self, sid: str, lo: int, hi: int | None) -> list[RecordedEvent]:
        return list(self.store.read(sid, lo, hi))

    def erase(self, sid: str, version: int) -> tuple[RecordedEvent, int | None]:
        return self.store.erase_payload(sid, version)

    def record(self, events: list[NewEvent]) -> AppendResult:
        return self.store.append(ERASURE_STREAM, events)


class _AsyncPort(AsyncStorePort):
    """The asyncio store port plus what the saver needs besides (ranges, erasure)."""

    __slots__ = ()

    async def read(self, sid: str, lo: int, hi: int | None) -> list[RecordedEvent]:
        return [e async for e in self.store.read(sid, lo, hi)]

    async def erase(self, sid: str, version: int) -> tuple[RecordedEvent, int | None]:
        return await self.store.erase_payload(sid, version)

    async def record(self, events: list[NewEvent]) -> AppendResult:
        return await self.store.append(ERASURE_STREAM, events)


def _value_cache(size: object) -> ValueCache | None:
    """The opt-in decoded-value cache of ``size`` entries (0: none).

    Raises:
        InvalidEvent: ``size`` is not an int >= 0.
    """
    if type(size) is not int or size < 0:
        raise InvalidEvent("value_cache", f"must be an int >= 0, got {size!r}")
    return ValueCache(size) if size > 0 else None


class AresSaver(BaseCheckpointSaver[str]):
    """A blocking LangGraph checkpointer over an ares-events store.

    Args:
        store: an open :class:`~ares_events.EventStore` (the saver does not close it,
            unless built by :meth:`from_url`).
        serde: the serializer (default: ``JsonPlusSerializer(pickle_fallback=False)``).
        max_threads: how many threads' verified indexes to keep in memory (an index holds
            the thread's payloads that did not spill: about its stored size).
        by: the name written in erasure records (who pruned or deleted).
        value_cache: keep this many decoded channel values (opt-in; 0: none). A
            ``get_tuple`` then costs the same at turn 500 as at turn 10, but the values
            it returns share their items (messages) with the cache: a caller that
            mutates a returned message in place changes what later reads return.

    The ``a``-methods run the blocking ones in a worker thread (use
    :class:`AsyncAresSaver` in asyncio code).

    Raises:
        StaleWriteError: from ``put``, when the parent checkpoint was already continued.
        ChainIntegrityError: a thread's chain does not verify (nothing was decoded).
        InvalidEvent: a bad thread id or argument.
        StoreUnavailable: the store cannot be reached.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        serde: SerializerProtocol | None = None,
        max_threads: int = DEFAULT_MAX_THREADS,
        by: str = "langgraph",
        value_cache: int = 0,
    ) -> None:
        super().__init__(serde=serde or default_serde())
        self.store = store
        self.by = by
        self._cache = _value_cache(value_cache)
        self._indexes = _Indexes(store, threading.Lock, max_threads)
        self._port = _Port(store)
        self._owns_store = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        serde: SerializerProtocol | None = None,
        value_cache: int = 0,
        **store_options: Any,
    ) -> AresSaver:
        """Open the store at ``url`` (``ae.open_store``'s URLs and options, e.g.
        ``blobs="s3://bucket/prefix"``) and build a saver that closes it on
        :meth:`close`."""
        from ares_events.stores import open_store

        saver = cls(open_store(url, **store_options), serde=serde, value_cache=value_cache)
        saver._owns_store = True
        return saver

    def close(self) -> None:
        """Close the store when the saver opened it."""
        if self._owns_store:
            self.store.close()

    def __repr__(self) -> str:
        return f"AresSaver({self.store!r})"

    def __enter__(self) -> AresSaver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, thread_id: object, make: Callable[[ThreadIndex], Steps[_L]]) -> _L:
        lock, index = self._indexes.get(stream_of(thread_id))
        with lock:
            return run(make(index), self._port)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """See :func:`next_version`."""
        return next_version(current)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (the newest of its namespace without a
        ``checkpoint_id``), verified, then decoded; None when there is none."""
        tid = config["configurable"]["thread_id"]
        return self._run(tid, lambda ix: steps.get_steps(ix, self.serde, config, self._cache))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of one thread (and namespace, when the config names
        one), or of every LangGraph thread when ``config`` is None."""
        if config is not None:
            tid = config["configurable"]["thread_id"]
            yield from self._run(
                tid,
                lambda ix: steps.list_steps(
                    ix, self.serde, config, filter, before, limit, self._cache
                ),
            )
            return
        left = limit
        for sid, _v in list(self.store.streams()):
            tid2 = thread_of(sid)
            if tid2 is None:
                continue
            cfg: RunnableConfig = {"configurable": {"thread_id": tid2}}
            got = self._run(tid2, _lister(self.serde, cfg, filter, before, left, self._cache))
            yield from got
            if left is not None:
                left -= len(got)
                if left <= 0:
                    return

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """The writes of ``channels`` along the parent chain of a checkpoint, and the
        nearest stored value of each (the base class's contract, read from the verified
        index in one pass)."""
        tid = config["configurable"]["thread_id"]
        return self._run(
            tid,
            lambda ix: steps.delta_history_steps(ix, self.serde, config, channels, self._cache),
        )

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Append a checkpoint (and the channel values it changed).

        Raises:
            StaleWriteError: its parent was already continued by another checkpoint.
        """
        tid = config["configurable"]["thread_id"]
        return self._run(
            tid,
            lambda ix: steps.put_steps(ix, self.serde, config, checkpoint, metadata, new_versions),
        )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Append a task's pending writes for the checkpoint ``config`` names."""
        tid = config["configurable"]["thread_id"]
        self._run(
            tid,
            lambda ix: steps.put_writes_steps(ix, self.serde, config, writes, task_id, task_path),
        )

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread: a ``lg.pruned`` record, then every payload and blob erased
        (each erasure recorded)."""
        self._run(thread_id, lambda ix: steps.delete_thread_steps(ix, self.by))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes, and values nothing else needs) that
        the given runs wrote, in every thread."""
        ids = {str(r) for r in run_ids}
        if not ids:
            return
        for sid, _v in list(self.store.streams()):
            tid = thread_of(sid)
            if tid is not None:
                self._run(tid, lambda ix: steps.delete_runs_steps(ix, self.serde, ids, self.by))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Append every live event of one thread to another (read again and verified)."""
        dst = stream_of(target_thread_id)
        self._run(source_thread_id, lambda ix: steps.copy_steps(ix, dst))

    def prune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        keep_last: int | None = None,
        older_than: timedelta | None = None,
    ) -> None:
        """Keep the newest ``keep_last`` checkpoints per namespace (LangGraph's
        ``keep_latest``: 1), and with ``older_than`` drop the checkpoints written before
        that (then ``keep_last=None`` means no count limit; the newest checkpoint of a
        namespace is always kept); ``strategy="delete"`` deletes the threads. What is
        dropped is erased (payloads and blobs), each erasure recorded.

        Raises:
            InvalidEvent: an unknown strategy, or a bad ``keep_last``/``older_than``.
        """
        keep = _prune_args(strategy, keep_last, older_than is not None)
        cutoff = _cutoff(older_than)
        for tid in thread_ids:
            if keep == 0:
                self.delete_thread(tid)
            else:
                self._run(tid, lambda ix: steps.prune_steps(ix, keep, cutoff, self.by))

    # -- the asyncio methods: the blocking ones in a worker thread --------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """:meth:`get_tuple` in a worker thread."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """:meth:`list` in a worker thread."""
        got = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for t in got:
            yield t

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """:meth:`get_delta_channel_history` in a worker thread."""
        return await asyncio.to_thread(
            lambda: self.get_delta_channel_history(config=config, channels=channels)
        )

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """:meth:`put` in a worker thread."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """:meth:`put_writes` in a worker thread."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """:meth:`delete_thread` in a worker thread."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`delete_for_runs` in a worker thread."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """:meth:`copy_thread` in a worker thread."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        keep_last: int | None = None,
        older_than: timedelta | None = None,
    ) -> None:
        """:meth:`prune` in a worker thread."""
        await asyncio.to_thread(
            lambda: self.prune(
                thread_ids, strategy=strategy, keep_last=keep_last, older_than=older_than
            )
        )


class AsyncAresSaver(BaseCheckpointSaver[str]):
    """An asyncio LangGraph checkpointer over an :class:`~ares_events.AsyncEventStore`
    (native async on PostgreSQL and memory; SQLite runs on the store's worker threads).

    Same behaviour and arguments as :class:`AresSaver`; operations of one thread are
    serialised by a per-thread ``asyncio.Lock``, never a saver-wide one. The blocking
    methods are not available (they would block the loop): use :class:`AresSaver`.

    Raises:
        StaleWriteError: from ``aput``, when the parent checkpoint was already continued.
        ChainIntegrityError: a thread's chain does not verify (nothing was decoded).
        InvalidEvent: a bad thread id or argument.
        StoreUnavailable: the store cannot be reached.
    """

    def __init__(
        self,
        store: AsyncEventStore,
        *,
        serde: SerializerProtocol | None = None,
        max_threads: int = DEFAULT_MAX_THREADS,
        by: str = "langgraph",
        value_cache: int = 0,
    ) -> None:
        super().__init__(serde=serde or default_serde())
        self.store = store
        self.by = by
        self._cache = _value_cache(value_cache)
        self._indexes = _Indexes(store, asyncio.Lock, max_threads)
        self._port = _AsyncPort(store)
        self._owns_store = False

    @classmethod
    async def from_url(
        cls,
        url: str,
        *,
        serde: SerializerProtocol | None = None,
        value_cache: int = 0,
        **store_options: Any,
    ) -> AsyncAresSaver:
        """Open the store at ``url`` with ``ae.open_async_store`` and build a saver that
        closes it on :meth:`aclose`."""
        from ares_events.stores import open_async_store

        saver = cls(
            await open_async_store(url, **store_options), serde=serde, value_cache=value_cache
        )
        saver._owns_store = True
        return saver

    async def aclose(self) -> None:
        """Close the store when the saver opened it."""
        if self._owns_store:
            await self.store.close()

    def __repr__(self) -> str:
        return f"AsyncAresSaver({self.store!r})"

    async def __aenter__(self) -> AsyncAresSaver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _run(self, thread_id: object, make: Callable[[ThreadIndex], Steps[_L]]) -> _L:
        lock, index = self._indexes.get(stream_of(thread_id))
        async with lock:
            return await arun(make(index), self._port)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """See :func:`next_version`."""
        return next_version(current)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """See :meth:`AresSaver.get_tuple`."""
        tid = config["configurable"]["thread_id"]
        return await self._run(tid, lambda ix: steps.get_steps(ix, self.serde, config, self._cache))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """See :meth:`AresSaver.list`."""
        if config is not None:
            tid = config["configurable"]["thread_id"]
            got = await self._run(
                tid,
                lambda ix: steps.list_steps(
                    ix, self.serde, config, filter, before, limit, self._cache
                ),
            )
            for t in got:
                yield t
            return
        left = limit
        sids = [sid async for sid, _v in self.store.streams()]
        for sid in sids:
            tid2 = thread_of(sid)
            if tid2 is None:
                continue
            cfg: RunnableConfig = {"configurable": {"thread_id": tid2}}
            got = await self._run(tid2, _lister(self.serde, cfg, filter, before, left, self._cache))
            for t in got:
                yield t
            if left is not None:
                left -= len(got)
                if left <= 0:
                    return

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """See :meth:`AresSaver.get_delta_channel_history`."""
        tid = config["configurable"]["thread_id"]
        return await self._run(
            tid,
            lambda ix: steps.delta_history_steps(ix, self.serde, config, channels, self._cache),
        )

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """See :meth:`AresSaver.put`."""
        tid = config["configurable"]["thread_id"]
        return await self._run(
            tid,
            lambda ix: steps.put_steps(ix, self.serde, config, checkpoint, metadata, new_versions),
        )

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """See :meth:`AresSaver.put_writes`."""
        tid = config["configurable"]["thread_id"]
        await self._run(
            tid,
            lambda ix: steps.put_writes_steps(ix, self.serde, config, writes, task_id, task_path),
        )

    async def adelete_thread(self, thread_id: str) -> None:
        """See :meth:`AresSaver.delete_thread`."""
        await self._run(thread_id, lambda ix: steps.delete_thread_steps(ix, self.by))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """See :meth:`AresSaver.delete_for_runs`."""
        ids = {str(r) for r in run_ids}
        if not ids:
            return
        sids = [sid async for sid, _v in self.store.streams()]
        for sid in sids:
            tid = thread_of(sid)
            if tid is not None:
                await self._run(
                    tid,
                    lambda ix: steps.delete_runs_steps(ix, self.serde, ids, self.by),
                )

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """See :meth:`AresSaver.copy_thread`."""
        dst = stream_of(target_thread_id)
        await self._run(source_thread_id, lambda ix: steps.copy_steps(ix, dst))

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        keep_last: int | None = None,
        older_than: timedelta | None = None,
    ) -> None:
        """See :meth:`AresSaver.prune`."""
        keep = _prune_args(strategy, keep_last, older_than is not None)
        cutoff = _cutoff(older_than)
        for tid in thread_ids:
            if keep == 0:
                await self.adelete_thread(tid)
            else:
                await self._run(
                    tid,
                    lambda ix: steps.prune_steps(ix, keep, cutoff, self.by),
                )
