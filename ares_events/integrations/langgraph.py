"""A LangGraph checkpointer on ares-events: :class:`AresSaver` (blocking) and
:class:`AsyncAresSaver` (asyncio), each a ``BaseCheckpointSaver`` of
``langgraph-checkpoint`` 4.x (``pip install 'ares-events[langgraph]'``)::

    from ares_events.integrations.langgraph import AresSaver

    with AresSaver.from_url("sqlite:///agents.db") as saver:
        graph = builder.compile(checkpointer=saver)

One thread is one hash-chained stream, ``langgraph/<thread_id>``; the layout, the
encoding and the verification are described in
:mod:`~ares_events.integrations._langgraph_core`, the operations in
:mod:`~ares_events.integrations._langgraph_ops_async` and the saver in
:mod:`~ares_events.integrations._langgraph_saver_async` (each written once; the blocking
modules are generated from them). What a user gets:

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

Approvals: :class:`ApprovalGate` (:mod:`~ares_events.integrations.langgraph_approvals`)
lets a node go on only under an approver's signed approval, recorded on the thread.

Concurrency: each saver keeps a verified index per thread (at most ``max_threads`` of
them, least recently used evicted) and serialises the operations of one thread; there is
no saver-wide lock, so different threads run in parallel.

It may import anything in the package, and ``langgraph``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from ares_events.integrations import thread_of
from ares_events.integrations._langgraph_core import (
    MODULE,
    STREAM_PREFIX,
    StaleWriteError,
    stream_of,
)
from ares_events.integrations._langgraph_saver import AresSaverBase
from ares_events.integrations._langgraph_saver_async import (
    DEFAULT_MAX_THREADS,
    AsyncAresSaver,
    default_serde,
    next_version,
)
from ares_events.integrations.langgraph_approvals import ApprovalGate

__all__ = [
    "DEFAULT_MAX_THREADS",
    "MODULE",
    "STREAM_PREFIX",
    "ApprovalGate",
    "AresSaver",
    "AsyncAresSaver",
    "StaleWriteError",
    "default_serde",
    "next_version",
    "stream_of",
    "thread_of",
]


def _in_thread(method: Callable[..., Any]) -> Callable[..., Any]:
    """An ``a``-method that runs the blocking ``method`` in a worker thread."""

    @functools.wraps(method)
    async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(method, self, *args, **kwargs)

    run.__doc__ = f":meth:`{method.__name__}` in a worker thread."
    return run


class AresSaver(AresSaverBase):
    """A blocking LangGraph checkpointer over an ares-events store (see
    :class:`AsyncAresSaver` for the arguments and guarantees: the same code).

    Its ``a``-methods run the blocking ones in a worker thread, for graphs that call them
    from asyncio code; asyncio programs should use :class:`AsyncAresSaver`.
    """

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


# The other a-methods of BaseCheckpointSaver, each the blocking method in a thread (the
# base class declares their signatures; restating them here would be a hand-kept twin).
for _name in (
    "get_tuple",
    "get_delta_channel_history",
    "put",
    "put_writes",
    "delete_thread",
    "delete_for_runs",
    "copy_thread",
    "prune",
):
    setattr(AresSaver, f"a{_name}", _in_thread(getattr(AresSaverBase, _name)))
del _name
