"""A blocking face over an asyncio store (:class:`BlockingStore`, for tests), so the
blocking conformance suites run unchanged on it.

It is the top layer: it may import anything in the package.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import ares_events as ae

__all__ = ["BlockingProxy", "BlockingStore", "LoopThread", "open_blocking"]

T = TypeVar("T")


class LoopThread:
    """An event loop running forever in a daemon thread; :meth:`run` waits for a
    coroutine scheduled on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="ares-events-test-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (exceptions propagate)."""
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("the test event loop is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def iterate(self, ait: AsyncIterator[T]) -> Iterator[T]:
        """``ait`` as a blocking iterator: one ``__anext__`` on the loop per item."""
        try:
            while True:
                try:
                    yield self.run(_anext(ait))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(ait, "aclose", None)
            if aclose is not None and not self.loop.is_closed():
                with contextlib.suppress(Exception):
                    self.run(aclose())

    def stop(self) -> None:
        """Stop the loop and its thread (pending tasks are cancelled first)."""
        if self.loop.is_closed():
            return

        async def cancel_rest() -> None:
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        with contextlib.suppress(Exception):
            self.run(cancel_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def _anext(ait: AsyncIterator[T]) -> T:
    return await ait.__anext__()


class BlockingProxy:
    """A blocking face over any object of the async API: attribute reads pass through;
    a method call that returns a coroutine waits for it on the loop, one that returns
    an async iterator becomes a blocking iterator."""

    def __init__(self, target: Any, loop: LoopThread) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    @property
    def target(self) -> Any:
        """The async object behind this face."""
        return self._target

    def _convert(self, value: Any) -> Any:
        if inspect.iscoroutine(value):
            return self._convert(self._loop.run(value))
        if hasattr(value, "__anext__"):
            return self._loop.iterate(value)
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr) or inspect.isclass(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._convert(attr(*args, **kwargs))

        return call

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._target!r})"


class _BlockingRecorder(BlockingProxy):
    """The async recorder's blocking face; ``uncached()`` is the system of record under a
    cache (what integrity checks read), as on a blocking store's cached recorder."""

    def uncached(self) -> Any:
        """The blocking face of the recorder under any cache."""
        from ares_events.core.recorder_async import system_of_record

        target = system_of_record(self._target)
        return self if target is self._target else _BlockingRecorder(target, self._loop)


class BlockingStore(BlockingProxy):
    """The blocking face of an :class:`~ares_events.AsyncEventStore` (for tests).

    ``BlockingStore(recorder_face, **kwargs)`` opens another async store over the same
    async recorder (what ``ae.EventStore(store.recorder, chain_key=...)`` does for a
    blocking store), on the same loop.
    """

    def __init__(self, recorder: Any, **kwargs: Any) -> None:
        if not isinstance(recorder, BlockingProxy):
            raise TypeError("BlockingStore(recorder) takes the .recorder of a BlockingStore")
        loop = recorder._loop
        store = loop.run(ae.AsyncEventStore.open(recorder.target, **kwargs))
        super().__init__(store, loop)

    @classmethod
    def of(cls, store: ae.AsyncEventStore, loop: LoopThread) -> BlockingStore:
        """The blocking face of ``store``, whose loop is ``loop``."""
        face = object.__new__(cls)
        BlockingProxy.__init__(face, store, loop)
        return face

    @property
    def recorder(self) -> Any:
        """The async recorder's blocking face."""
        return _BlockingRecorder(self._target.recorder, self._loop)

    @property
    def snapshots(self) -> Any:
        """The async snapshot store's blocking face (one per store, as ``snapshots`` is)."""
        target = self._target.snapshots
        face = self.__dict__.get("_snapshots")
        if face is None or face.target is not target:
            face = BlockingProxy(target, self._loop)
            object.__setattr__(self, "_snapshots", face)
        return face

    def __enter__(self) -> BlockingStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def open_blocking(url: str, **kwargs: Any) -> Iterator[BlockingStore]:
    """``ae.open_async_store(url, **kwargs)`` on a private loop, as a blocking store;
    closed (and the loop stopped) at the end of the block.

    Raises:
        AresError: what ``open_async_store`` raises.
    """
    loop = LoopThread()
    try:
        store = loop.run(ae.open_async_store(url, **kwargs))
        face = BlockingStore.of(store, loop)
        try:
            yield face
        finally:
            face.close()
    finally:
        loop.stop()
