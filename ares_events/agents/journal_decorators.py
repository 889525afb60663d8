"""Decorator forms of journaled calls: ``@journal.tool``, ``@journal.step`` and the
module-level ``@journaled_tool`` / ``@journaled_step`` (the journal made current by
``with journal:``), under :meth:`Journal.tool_call`'s rules (docs/guide-journal.md).

It may import the format and this package's leaf modules; the journal passes itself in.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, overload

from ares_events.errors import ConfigError

__all__ = ["ACTIVE", "journaled_step", "journaled_tool", "wrap_tool"]

R = TypeVar("R")
KEY_PARAM = "idempotency_key"

ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("ares_events_journal", default=None)
"""The journal made current by ``with journal:`` / ``async with journal:`` (None outside)."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def wrap_tool(
    get_journal: Callable[[], Any],
    fn: Callable[..., Any] | None,
    *,
    name: str | None,
    idempotent: bool,
    reconcile: Callable[[str], Any] | None,
) -> Any:
    """``fn`` wrapped so that each call is a journaled tool call of ``get_journal()``; with
    ``fn`` None, the decorator that wraps a function so.

    Raises:
        ConfigError: ``fn`` takes ``idempotency_key`` positionally only.
    """
    if fn is None:
        return functools.partial(
            wrap_tool, get_journal, name=name, idempotent=idempotent, reconcile=reconcile
        )
    sig = inspect.signature(fn)
    key_param = sig.parameters.get(KEY_PARAM)
    if key_param is not None and key_param.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise ConfigError(f"{fn.__qualname__}: {KEY_PARAM} must be a keyword parameter")
    recorded = [p for p in sig.parameters.values() if p.name != KEY_PARAM]
    drop_first = bool(recorded) and recorded[0].name in ("self", "cls")
    record_sig = sig.replace(parameters=recorded[1:] if drop_first else recorded)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        journal = get_journal()  # first: no active journal is the error, whatever the args
        bound = record_sig.bind(*(args[1:] if drop_first else args), **kwargs)
        bound.apply_defaults()
        # An async journal awaits what ``call`` returns: the coroutine of an async ``fn``.
        return journal.tool_call(
            name or fn.__name__,
            {k: _jsonable(v) for k, v in bound.arguments.items()},
            call=lambda _, key: fn(*args, **kwargs, **({KEY_PARAM: key} if key_param else {})),
            reconcile=reconcile,
            idempotent=idempotent,
        )

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await wrapper(*args, **kwargs)

        return async_wrapper
    return wrapper


def _current() -> Any:
    journal = ACTIVE.get()
    if journal is None:
        raise ConfigError(
            "no journal is active: call journaled functions inside `with journal:` "
            "(or `async with` an AsyncJournal), or use journal.tool(...) instead"
        )
    return journal


@overload
def journaled_tool(fn: Callable[..., R], /) -> Callable[..., R]: ...


@overload
def journaled_tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    idempotent: bool = False,
    reconcile: Callable[[str], Any] | None = None,
) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


def journaled_tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    idempotent: bool = False,
    reconcile: Callable[[str], Any] | None = None,
) -> Any:
    """Decorate a function so each call is a tool call of the active journal.

    Usable bare (``@journaled_tool``) or with options (``@journaled_tool(name="mail",
    idempotent=True)``). The function may be a coroutine function (then the active journal
    must be an :class:`AsyncJournal`).

    Raises:
        ConfigError: (at call time) no journal is active.
    """
    return wrap_tool(_current, fn, name=name, idempotent=idempotent, reconcile=reconcile)


@overload
def journaled_step(fn: Callable[..., R], /) -> Callable[..., R]: ...


@overload
def journaled_step(
    fn: None = None, /, *, name: str | None = None
) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


def journaled_step(fn: Callable[..., Any] | None = None, /, *, name: str | None = None) -> Any:
    """Decorate a function whose result is recorded once and replayed after; it is run
    again only if the process died while it ran (a tool with ``idempotent=True``).

    Raises:
        ConfigError: (at call time) no journal is active.
    """
    return wrap_tool(_current, fn, name=name, idempotent=True, reconcile=None)
