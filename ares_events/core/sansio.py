"""One algorithm, two faces: logic written once as a generator of I/O requests.

Every algorithm that both :class:`~ares_events.core.store.EventStore` (blocking) and
:class:`~ares_events.core.store_async.AsyncEventStore` (asyncio) need, and that does
I/O in the middle of its decisions (recording the store identity, checking a snapshot
against its stream, replay with its head re-reads, the PostgreSQL append protocol, the
run journal), is written ONCE as a generator that ``yield``\\s a :class:`Call` each
time it needs the outside world and receives the answer back::

    def _version_steps(stream_id):                  # the logic, no I/O of its own
        head = yield Call("head", stream_id)
        return head.version if head else 0

    run(_version_steps("s"), port)                 # blocking: port.head("s")
    await arun(_version_steps("s"), aport)         # asyncio: await aport.head("s")

A *port* is any object with a method per call name: a blocking port returns the answer,
an async port returns an awaitable of it. An exception raised by the port is thrown
into the generator at its ``yield`` (so its ``try``/``except`` see it, as if the call had
been made inline). This is how psycopg writes its protocol once for both of its
connection classes (``psycopg.generators``); the cost is one generator step per I/O
call, which is nothing beside the I/O itself.

It may import nothing from the package.
"""

from __future__ import annotations

import inspect
from collections.abc import Generator
from typing import Any, TypeVar

__all__ = ["Call", "Steps", "arun", "maybe_await", "run"]

T = TypeVar("T")


class Call:
    """A request for I/O: call ``port.<name>(*args)`` and send the answer back."""

    __slots__ = ("args", "name")

    def __init__(self, name: str, *args: Any) -> None:
        self.name = name
        self.args = args

    def __repr__(self) -> str:
        return f"Call({self.name!r}, {len(self.args)} args)"


Steps = Generator[Call, Any, T]
"""A generator of :class:`Call` requests that returns a ``T``."""


def run(steps: Steps[T], port: object) -> T:
    """Drive ``steps`` with a blocking ``port`` and return its result.

    Raises:
        Exception: whatever the steps raise, including a port's exception they let
            through.
    """
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            call = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value = error = None
        try:
            value = getattr(port, call.name)(*call.args)
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as exc:
            error = exc


async def arun(steps: Steps[T], port: object) -> T:
    """Drive ``steps`` with an async ``port`` (each method returns an awaitable).

    Raises:
        Exception: whatever the steps raise, including a port's exception they let
            through (a cancellation too: the steps see ``CancelledError`` at their
            ``yield`` and may clean up before it propagates).
    """
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            call = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value = error = None
        try:
            value = await getattr(port, call.name)(*call.args)
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as exc:
            error = exc


async def maybe_await(value: Any) -> Any:
    """``await value`` when it is awaitable, else ``value`` (a user callback that may be
    a plain function or a coroutine function)."""
    if inspect.isawaitable(value):
        return await value
    return value
