"""The LangGraph savers, one face written, the other generated: :class:`AsyncAresSaver`
(``AresSaverBase`` on the blocking face; :mod:`.langgraph` adds its ``a``-methods).

It may import the package below ``integrations`` and ``langgraph``.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Self

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

from ares_events.core.faces import ASYNC, blocking, on_asyncio
from ares_events.core.store_async import AsyncEventStore
from ares_events.errors import InvalidEvent
from ares_events.integrations import _langgraph_ops_async as ops
from ares_events.integrations import thread_of
from ares_events.integrations._faces import Table
from ares_events.integrations._langgraph_core import ThreadIndex, stream_of
from ares_events.integrations._langgraph_plan import ValueCache

if ASYNC:
    import asyncio
    from asyncio import Lock
    from collections.abc import Callable, Coroutine, Iterator
    from typing import ParamSpec, TypeVar

    P = ParamSpec("P")
    T = TypeVar("T")

    async def _step(items: AsyncIterator[T]) -> T:
        return await anext(items)
else:
    from threading import Lock

__all__ = ["DEFAULT_MAX_THREADS", "AsyncAresSaver", "default_serde", "next_version"]

DEFAULT_MAX_THREADS: Final = 128


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


def _keep(strategy: str, keep_last: int | None, by_age: bool) -> int | None:
    """How many checkpoints per namespace a prune keeps (0: delete the thread)."""
    if strategy == "delete":
        return 0
    if strategy != "keep_latest":
        raise InvalidEvent("strategy", f"must be 'keep_latest' or 'delete', got {strategy!r}")
    if keep_last is None:
        return None if by_age else 1
    if type(keep_last) is not int or keep_last < 0:
        raise InvalidEvent("keep_last", f"must be an int >= 0, got {keep_last!r}")
    return keep_last


def _value_cache(size: object) -> ValueCache | None:
    """The opt-in decoded-value cache of ``size`` entries (0: none)."""
    if type(size) is not int or size < 0:
        raise InvalidEvent("value_cache", f"must be an int >= 0, got {size!r}")
    return ValueCache(size=size) if size > 0 else None


class AsyncAresSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over an ares-events store (left open unless the saver was
    built by :meth:`from_url`). The ``asyncio`` saver's blocking methods run its
    ``a``-methods on its event loop, for code in another thread (as ``AsyncSqliteSaver``).

    Args:
        max_threads: how many threads' verified indexes to keep in memory (an index holds
            the thread's payloads that did not spill: about its stored size).
        by: the name written in erasure records (who pruned or deleted).
        value_cache: keep this many decoded channel values (opt-in): a ``get_tuple`` then
            costs the same at turn 500 as at turn 10, but the values it returns share
            their items with the cache (mutating one changes what later reads return).

    Raises:
        StaleWriteError: from ``put``, when the parent checkpoint was already continued.
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
        if type(max_threads) is not int or max_threads < 1:
            raise InvalidEvent("max_threads", f"must be an int >= 1, got {max_threads!r}")
        # Per thread, its verified index and its lock (no saver-wide lock).
        self._indexes = Table(lambda sid: (Lock(), ThreadIndex(sid, store.chain_key)), max_threads)
        self._owns_store = False
        if ASYNC:
            on_asyncio(store, "AsyncAresSaver", "AresSaver (its a-methods run in threads)")
            # The loop the blocking methods run on: the last one that used the saver (see
            # _thread; a saver may be built outside asyncio, or move to a new loop), and
            # before any use the one it was built on.
            try:
                self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                self._loop = None
        else:
            blocking(store, "AresSaver", "ares_events.integrations.langgraph.AsyncAresSaver")

    @classmethod
    async def from_url(
        cls,
        url: str,
        *,
        serde: SerializerProtocol | None = None,
        value_cache: int = 0,
        **store_options: Any,
    ) -> Self:
        """Open the store at ``url`` (:func:`~ares_events.open_async_store`'s URLs and
        options, e.g. ``blobs="s3://bucket/prefix"``) and build a saver that closes it
        when the saver is closed."""
        from ares_events.stores import open_async_store

        store = await open_async_store(url, **store_options)
        saver = cls(store, serde=serde, value_cache=value_cache)
        saver._owns_store = True
        return saver

    async def aclose(self) -> None:
        """Close the store when the saver opened it."""
        if self._owns_store:
            await self.store.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @contextlib.asynccontextmanager
    async def _thread(self, thread_id: object) -> AsyncIterator[ops.Job]:
        """The thread's verified index, its lock held for the block."""
        lock, index = self._indexes.get(stream_of(thread_id))
        if ASYNC:
            self._loop = asyncio.get_running_loop()  # where the blocking methods run
        async with lock:
            yield ops.Job(self.store, index, self.serde, self._cache, self.by)

    async def _thread_ids(self) -> list[str]:
        """Every LangGraph thread of the store (listed before any is locked)."""
        return [tid async for sid, _v in self.store.streams() if (tid := thread_of(sid))]

    def get_next_version(self, current: str | None, channel: None) -> str:
        """See :func:`next_version`."""
        return next_version(current)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (the newest of its namespace without a
        ``checkpoint_id``), verified, then decoded; None when there is none."""
        async with self._thread(config["configurable"]["thread_id"]) as job:
            return await ops.get_checkpoint(job, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first: of one thread (and namespace, when the config names
        one), or of every LangGraph thread when ``config`` is None."""
        if limit is not None and limit <= 0:
            return  # none, as InMemorySaver (and no thread read for it)
        configs: list[RunnableConfig] = (
            [config]
            if config is not None
            else [{"configurable": {"thread_id": tid}} for tid in await self._thread_ids()]
        )
        left = limit
        for cfg in configs:
            async with self._thread(cfg["configurable"]["thread_id"]) as job:
                got = await ops.list_checkpoints(job, cfg, filter, before, left)
            for t in got:
                yield t
            if left is not None:
                left -= len(got)
                if left <= 0:
                    return

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """The writes of ``channels`` along the parent chain of a checkpoint, and the
        nearest stored value of each (the base class's contract, read from the verified
        index in one pass)."""
        async with self._thread(config["configurable"]["thread_id"]) as job:
            return await ops.delta_history(job, config, channels)

    async def aput(
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
        async with self._thread(config["configurable"]["thread_id"]) as job:
            return await ops.put_checkpoint(job, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Append a task's pending writes for the checkpoint ``config`` names."""
        async with self._thread(config["configurable"]["thread_id"]) as job:
            await ops.put_writes(job, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread: a ``lg.pruned`` record, then every payload and blob erased
        (each erasure recorded)."""
        async with self._thread(thread_id) as job:
            await ops.delete_thread(job)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes, and values nothing else needs) that
        the given runs wrote, in every thread."""
        ids = {str(r) for r in run_ids}
        if not ids:
            return
        for tid in await self._thread_ids():
            async with self._thread(tid) as job:
                await ops.delete_runs(job, ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Append every live event of one thread to another (read again and verified)."""
        dst = stream_of(target_thread_id)
        async with self._thread(source_thread_id) as job:
            await ops.copy_thread(job, dst)

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        keep_last: int | None = None,
        older_than: timedelta | None = None,
    ) -> None:
        """Keep the newest ``keep_last`` checkpoints per namespace (default 1, or no limit
        with ``older_than``, which drops the ones written before it but the newest);
        ``strategy="delete"`` deletes the threads. What is dropped is erased, each
        erasure recorded.

        Raises:
            InvalidEvent: an unknown strategy, or a bad ``keep_last``/``older_than``.
        """
        keep = _keep(strategy, keep_last, older_than is not None)
        cutoff = _cutoff(older_than)
        for tid in thread_ids:
            if keep == 0:
                await self.adelete_thread(tid)
            else:
                async with self._thread(tid) as job:
                    await ops.prune(job, keep, cutoff)

    if ASYNC:
        # The blocking methods, as AsyncSqliteSaver has them: each runs its a-method on the
        # saver's loop and waits, so they serve code in another thread (a graph's
        # get_state from a worker); on the loop's own thread the wait would never end.

        def _on_loop(
            self,
            name: str,
            method: Callable[P, Coroutine[Any, Any, T]],
            *args: P.args,
            **kwargs: P.kwargs,
        ) -> T:
            """``method(*args, **kwargs)`` run on the saver's loop, waited for, for the
            blocking method ``name`` (what an error names).

            Raises:
                asyncio.InvalidStateError: called from the loop's own thread, or the saver
                    has no running loop (not used from asyncio yet, or its loop ended).
            """
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            loop = self._loop
            if running is not None and running is loop:
                raise asyncio.InvalidStateError(
                    f"Synchronous calls to {type(self).__name__} are only allowed from a "
                    "different thread. From the event loop's thread, use the async "
                    f"interface: `await checkpointer.a{name}(...)` or `await graph.ainvoke(...)`."
                )
            if loop is None or not loop.is_running():
                raise asyncio.InvalidStateError(
                    f"{type(self).__name__}.{name} runs on the saver's event loop, and "
                    "none is running (the saver was not used from asyncio yet, or its loop "
                    "ended): in blocking code use AresSaver."
                )
            return asyncio.run_coroutine_threadsafe(method(*args, **kwargs), loop).result()

        def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
            """:meth:`aget_tuple` on the saver's loop (from another thread)."""
            return self._on_loop("get_tuple", self.aget_tuple, config)

        def list(
            self,
            config: RunnableConfig | None,
            *,
            filter: dict[str, Any] | None = None,
            before: RunnableConfig | None = None,
            limit: int | None = None,
        ) -> Iterator[CheckpointTuple]:
            """:meth:`alist` on the saver's loop (from another thread), one item a call."""
            items = self.alist(config, filter=filter, before=before, limit=limit)
            while True:
                try:
                    yield self._on_loop("list", _step, items)
                except StopAsyncIteration:
                    return

        def get_delta_channel_history(
            self, *, config: RunnableConfig, channels: Sequence[str]
        ) -> Mapping[str, DeltaChannelHistory]:
            """:meth:`aget_delta_channel_history` on the saver's loop (from another thread)."""
            return self._on_loop(
                "get_delta_channel_history",
                self.aget_delta_channel_history,
                config=config,
                channels=channels,
            )

        def put(
            self,
            config: RunnableConfig,
            checkpoint: Checkpoint,
            metadata: CheckpointMetadata,
            new_versions: ChannelVersions,
        ) -> RunnableConfig:
            """:meth:`aput` on the saver's loop (from another thread)."""
            return self._on_loop("put", self.aput, config, checkpoint, metadata, new_versions)

        def put_writes(
            self,
            config: RunnableConfig,
            writes: Sequence[tuple[str, Any]],
            task_id: str,
            task_path: str = "",
        ) -> None:
            """:meth:`aput_writes` on the saver's loop (from another thread)."""
            self._on_loop("put_writes", self.aput_writes, config, writes, task_id, task_path)

        def delete_thread(self, thread_id: str) -> None:
            """:meth:`adelete_thread` on the saver's loop (from another thread)."""
            self._on_loop("delete_thread", self.adelete_thread, thread_id)

        def delete_for_runs(self, run_ids: Sequence[str]) -> None:
            """:meth:`adelete_for_runs` on the saver's loop (from another thread)."""
            self._on_loop("delete_for_runs", self.adelete_for_runs, run_ids)

        def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
            """:meth:`acopy_thread` on the saver's loop (from another thread)."""
            self._on_loop("copy_thread", self.acopy_thread, source_thread_id, target_thread_id)

        def prune(
            self,
            thread_ids: Sequence[str],
            *,
            strategy: str = "keep_latest",
            keep_last: int | None = None,
            older_than: timedelta | None = None,
        ) -> None:
            """:meth:`aprune` on the saver's loop (from another thread)."""
            self._on_loop(
                "prune",
                self.aprune,
                thread_ids,
                strategy=strategy,
                keep_last=keep_last,
                older_than=older_than,
            )


BLOCKING_METHODS: Final = (
    "get_tuple",
    "get_delta_channel_history",
    "put",
    "put_writes",
    "delete_thread",
    "delete_for_runs",
    "copy_thread",
    "prune",
)
"""The methods of ``BaseCheckpointSaver`` (``list`` aside) each face also has as the other
face's: the asyncio saver's blocking ones, the blocking saver's ``a``-methods."""
