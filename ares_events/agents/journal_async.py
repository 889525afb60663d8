"""The asyncio twin of :class:`~ares_events.agents.journal_core.Journal`.

The same decisions (:mod:`.journal_logic`), awaited: over an
:class:`~ares_events.AsyncEventStore` every append and read is a coroutine of the store
(no thread per call); over a blocking :class:`~ares_events.EventStore` (what earlier
releases required, still accepted) each store call runs in a worker thread.
``call``, ``reconcile`` and decorated tools may be coroutine functions.

It may import :mod:`.journal_core`, :mod:`.journal_logic` and this package's leaf modules.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ares_events.agents import runs
from ares_events.agents.journal_decorators import reset_active, set_active, wrap_tool
from ares_events.agents.journal_logic import GatePolicy, JournalLogic, strict_gate
from ares_events.agents.recording import Redactor
from ares_events.core.ports import port_for
from ares_events.core.sansio import arun, maybe_await

if TYPE_CHECKING:
    from ares_events.agents.runs import RunInfo
    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

__all__ = ["AsyncJournal"]


class AsyncJournal(JournalLogic):
    """The asyncio twin of :class:`Journal` (same arguments, same rules): create with
    ``await AsyncJournal.open(store, run_id, ...)``, where ``store`` is an
    :class:`~ares_events.AsyncEventStore` (native) or a blocking store (worker threads).
    """

    def __init__(
        self,
        store: AsyncEventStore | EventStore,
        run_id: str,
        *,
        snapshot_every: int = 100,
        module: str = "journal",
        redact: Redactor | None = None,
        record_prompts: bool = True,
    ) -> None:
        self._setup(
            store,
            run_id,
            snapshot_every=snapshot_every,
            module=module,
            redact=redact,
            record_prompts=record_prompts,
        )
        self._port = port_for(store)

    @classmethod
    async def open(
        cls,
        store: AsyncEventStore | EventStore,
        run_id: str,
        *,
        code_revision: str = "unversioned",
        prompt_hash: str = "",
        gate: GatePolicy = strict_gate,
        snapshot_every: int = 100,
        module: str = "journal",
        redact: Redactor | None = None,
        record_prompts: bool = True,
    ) -> AsyncJournal:
        """Open (recover, gate) the run without blocking the event loop.

        Raises:
            RunRefused: the gate refused to resume.
            ChainIntegrityError: the run's log has integrity findings.
            StoreUnavailable: the store cannot be reached.
        """
        started = time.perf_counter()
        j = cls(
            store,
            run_id,
            snapshot_every=snapshot_every,
            module=module,
            redact=redact,
            record_prompts=record_prompts,
        )
        await arun(j._open_steps(code_revision, prompt_hash, gate), j._port)
        j.stats.resume_seconds = time.perf_counter() - started
        return j

    @staticmethod
    async def inspect(
        store: AsyncEventStore | EventStore, run_id: str, *, requests: bool = True
    ) -> RunInfo:
        """See :meth:`Journal.inspect` (appends nothing).

        Raises:
            RunNotFound: no run ``run_id`` in the store.
            StoreUnavailable: the store cannot be reached.
        """
        from ares_events.core.store_async import AsyncEventStore

        if isinstance(store, AsyncEventStore):
            return await runs.ainspect_run(store, run_id, requests=requests)
        return await asyncio.to_thread(runs.inspect_run, store, run_id, requests=requests)

    async def __aenter__(self) -> AsyncJournal:
        self._token = set_active(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._token is not None:
            reset_active(self._token)
            self._token = None

    async def model_call(
        self,
        messages: Any,
        params: Mapping[str, Any] | None = None,
        *,
        call: Callable[[Any, Mapping[str, Any]], Any | Awaitable[Any]],
    ) -> Any:
        """See :meth:`Journal.model_call` (``call`` may be a coroutine function).

        Raises:
            ReplayDivergence: the messages differ from those recorded at this step.
            RunNotRunnable: the run cannot take new steps.
            ModelCallFailed: replaying an abandoned step's failure.
        """
        step, done, value = await arun(self._model_begin(messages, params), self._port)
        if done:
            return value
        try:
            raw = await maybe_await(call(messages, dict(params or {})))
        except Exception as exc:
            await arun(self._model_failed(step, exc), self._port)
            raise
        return await arun(self._model_end(step, raw), self._port)

    async def tool_call(
        self,
        name: str,
        args: Any,
        *,
        call: Callable[[Any, str], Any | Awaitable[Any]],
        reconcile: Callable[[str], Any] | None = None,
        idempotent: bool = False,
    ) -> Any:
        """See :meth:`Journal.tool_call` (``call`` and ``reconcile`` may be coroutine
        functions).

        Raises:
            InDoubtToolCall: in doubt, no reconciler and not idempotent; run interrupted.
            ReplayDivergence: another tool, or other args, were recorded at this step.
            RunNotRunnable: the run cannot take new steps.
            ToolCallFailed: the step's recorded outcome is an error.
        """
        key, done, value = await arun(
            self._tool_begin(name, args, reconcile, idempotent), self._port
        )
        if done:
            return value
        try:
            result = await maybe_await(call(args, key))
        except Exception as exc:
            await arun(self._tool_failed(key, exc), self._port)
            raise
        return await arun(self._tool_end(key, result), self._port)

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

    async def resolve_tool_call(
        self,
        key: str,
        *,
        result: Any = None,
        error: Any = None,
        by: str = "operator",
        reason: str | None = None,
    ) -> None:
        """See :meth:`Journal.resolve_tool_call`.

        Raises:
            ConfigError: the call is not in doubt.
        """
        await arun(self._resolve_steps(key, result, error, by, reason), self._port)

    async def patch(self, key: str, value: Any) -> None:
        """See :meth:`Journal.patch`.

        Raises:
            ReplayDivergence: the log recorded another kind of step here.
            RunNotRunnable: the run cannot take new steps.
        """
        await arun(self._patch_steps(key, value), self._port)

    async def interrupt(self, reason: str) -> bool:
        """See :meth:`Journal.interrupt`.

        Raises:
            ReplayDivergence: the log recorded another kind of step here.
            RunNotRunnable: the run cannot take new steps.
        """
        return await arun(self._interrupt_steps(reason), self._port)

    async def resume(self, *, by: str, reason: str | None = None) -> None:
        """See :meth:`Journal.resume`.

        Raises:
            RunNotRunnable: the run is not paused.
        """
        await arun(self._resume_steps(by, reason), self._port)

    async def complete(self, result: Any = None) -> None:
        """See :meth:`Journal.complete`.

        Raises:
            RunNotRunnable: the run is paused, failed, cancelled or refused.
        """
        await arun(self._complete_steps(result), self._port)

    async def fail(self, error: str) -> None:
        """See :meth:`Journal.fail`."""
        await arun(self._fail_steps(error), self._port)
