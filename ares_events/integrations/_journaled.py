"""What the durable runs of the framework adapters share: a tool call through the run
journal, the key of the one running now, and the journal's errors unwrapped.

It may import anything in the package (an integration is top layer), and no framework.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from pydantic_core import to_jsonable_python

from ares_events.agents.journal import AsyncJournal
from ares_events.agents.journal_errors import journal_error_in

__all__ = ["idempotency_key", "journal_errors", "tool_call"]

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ares_tool_key", default=None)


def idempotency_key() -> str | None:
    """The idempotency key (``run_id:step``) of the journaled tool call running now, to
    pass downstream; None outside one."""
    return _KEY.get()


async def tool_call(
    journal: AsyncJournal,
    name: str,
    args: Any,
    run: Callable[[], Awaitable[Any]],
    *,
    idempotent: bool,
    reconcile: Callable[[str, str], Any] | None,
    **options: Any,
) -> Any:
    """``run()`` as the journaled call of the tool ``name``: answered from the log when it
    returned before, else run with :func:`idempotency_key` set, its result recorded as
    JSON (a replayed tool returns that JSON form). ``reconcile(name, key)`` and
    ``options`` are the journal's."""

    async def call(_args: Any, key: str) -> Any:
        token = _KEY.set(key)
        try:
            return to_jsonable_python(await run())
        finally:
            _KEY.reset(token)

    rec = (lambda key: reconcile(name, key)) if reconcile is not None else None
    return await journal.tool_call(
        name, args, call=call, reconcile=rec, idempotent=idempotent, **options
    )


@contextlib.contextmanager
def journal_errors() -> Iterator[None]:
    """The journal's own verdict (in doubt, diverged, not runnable) raised as itself when
    the framework wrapped it in its own error (as the SDKs do with what a tool raised)."""
    try:
        yield
    except Exception as exc:
        cause = journal_error_in(exc)
        if cause is not None and cause is not exc:
            raise cause from exc
        raise
