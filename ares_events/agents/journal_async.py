"""The asyncio twin of :class:`~ares_events.agents.journal_core.Journal`.

Each method mirrors the sync one step by step (begin, call, failure or end), running the
store I/O in a worker thread, so that moving it onto a native async store later is a
change of those calls only.

It may import :mod:`.journal_core` and this package's leaf modules.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ares_events.agents import runs
from ares_events.agents.journal_core import Journal, JournalStats
from ares_events.agents.journal_decorators import reset_active, set_active, wrap_tool

if TYPE_CHECKING:
    from contextvars import Token

    from ares_events.agents.runs import RunInfo
    from ares_events.core.store import EventStore

__all__ = ["AsyncJournal"]


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class AsyncJournal:
    """The asyncio twin of :class:`Journal`: store I/O runs in a worker thread and
    ``call``/``reconcile`` may be coroutine functions. Create with :meth:`open`."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._token: Token[Any] | None = None

    @classmethod
    async def open(cls, store: EventStore, run_id: str, **kwargs: Any) -> AsyncJournal:
        """Open (recover, gate) the run without blocking the event loop.

        Raises:
            RunRefused: the gate refused to resume.
        """
        return cls(await asyncio.to_thread(Journal, store, run_id, **kwargs))

    @staticmethod
    async def inspect(store: EventStore, run_id: str, *, requests: bool = True) -> RunInfo:
        """See :meth:`Journal.inspect` (appends nothing).

        Raises:
            RunNotFound: no run ``run_id`` in the store.
        """
        return await asyncio.to_thread(runs.inspect_run, store, run_id, requests=requests)

    async def __aenter__(self) -> AsyncJournal:
        self._token = set_active(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._token is not None:
            reset_active(self._token)
            self._token = None

    @property
    def stats(self) -> JournalStats:
        """Counters."""
        return self.journal.stats

    @property
    def status(self) -> str:
        """Run status."""
        return self.journal.status

    @property
    def attempt(self) -> int:
        """See :attr:`Journal.attempt`."""
        return self.journal.attempt

    @property
    def replaying(self) -> bool:
        """See :attr:`Journal.replaying`."""
        return self.journal.replaying

    async def model_call(
        self,
        messages: Any,
        params: Mapping[str, Any] | None = None,
        *,
        call: Callable[[Any, Mapping[str, Any]], Any | Awaitable[Any]],
    ) -> Any:
        """See :meth:`Journal.model_call`."""
        j = self.journal
        step, done, value = await asyncio.to_thread(j._model_begin, messages, params)
        if done:
            return value
        try:
            raw = await _maybe_await(call(messages, dict(params or {})))
        except Exception as exc:
            await asyncio.to_thread(j._model_failed, step, exc)
            raise
        return await asyncio.to_thread(j._model_end, step, raw)

    async def tool_call(
        self,
        name: str,
        args: Any,
        *,
        call: Callable[[Any, str], Any | Awaitable[Any]],
        reconcile: Callable[[str], Any] | None = None,
        idempotent: bool = False,
    ) -> Any:
        """See :meth:`Journal.tool_call`."""
        j = self.journal
        sync_reconcile = None
        if reconcile is not None:
            loop = asyncio.get_running_loop()

            def sync_reconcile(key: str) -> tuple[bool, Any]:
                res = reconcile(key)
                if inspect.isawaitable(res):
                    return asyncio.run_coroutine_threadsafe(_maybe_await(res), loop).result()  # type: ignore[no-any-return]
                return res  # type: ignore[no-any-return]

        key, done, value = await asyncio.to_thread(
            j._tool_begin, name, args, sync_reconcile, idempotent
        )
        if done:
            return value
        try:
            result = await _maybe_await(call(args, key))
        except Exception as exc:
            await asyncio.to_thread(j._tool_failed, key, exc)
            raise
        return await asyncio.to_thread(j._tool_end, key, result)

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        idempotent: bool = False,
        reconcile: Callable[[str], Any] | None = None,
    ) -> Any:
        """See :meth:`Journal.tool` (decorates a coroutine function)."""

        def decorate(f: Callable[..., Any]) -> Any:
            return wrap_tool(lambda: self, f, name=name, idempotent=idempotent, reconcile=reconcile)

        return decorate(fn) if fn is not None else decorate

    def step(self, fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
        """See :meth:`Journal.step`."""
        return self.tool(fn, name=name, idempotent=True)

    async def patch(self, key: str, value: Any) -> None:
        """See :meth:`Journal.patch`."""
        await asyncio.to_thread(self.journal.patch, key, value)

    async def interrupt(self, reason: str) -> bool:
        """See :meth:`Journal.interrupt`."""
        return await asyncio.to_thread(self.journal.interrupt, reason)

    async def resume(self, *, by: str, reason: str | None = None) -> None:
        """See :meth:`Journal.resume`."""
        await asyncio.to_thread(self.journal.resume, by=by, reason=reason)

    async def complete(self, result: Any = None) -> None:
        """See :meth:`Journal.complete`."""
        await asyncio.to_thread(self.journal.complete, result)

    async def fail(self, error: str) -> None:
        """See :meth:`Journal.fail`."""
        await asyncio.to_thread(self.journal.fail, error)
