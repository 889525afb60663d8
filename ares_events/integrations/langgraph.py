"""A LangGraph checkpointer on ares-events: :class:`AresSaver` (blocking) and
:class:`AsyncAresSaver` (asyncio) (``pip install 'ares-events[langgraph]'``)::

    with AresSaver.from_url("sqlite:///agents.db") as saver:
        graph = builder.compile(checkpointer=saver)

One thread is one stream; a second writer from the same parent gets
:class:`StaleWriteError`. docs/guide-langgraph.md says the rest.

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
from ares_events.integrations._langgraph_saver import BLOCKING_METHODS, AresSaverBase
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


# The other a-methods of BaseCheckpointSaver, each the blocking method in a thread.
for _name in BLOCKING_METHODS:
    setattr(AresSaver, f"a{_name}", _in_thread(getattr(AresSaverBase, _name)))
del _name
