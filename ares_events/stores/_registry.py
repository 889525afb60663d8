"""Scheme -> backend registry. Built-ins are import strings resolved on first use;
third parties register through the ``ares_events.stores`` entry-point group, discovered
only when a scheme is unknown."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from ares_events.errors import ConfigError, MissingDependencyError, UnknownSchemeError

ENTRY_POINT_GROUP = "ares_events.stores"

_BUILTIN: dict[str, tuple[str, str]] = {
    # scheme: (target, pip extra)
    "memory": ("ares_events.stores.memory:MemoryRecorder", ""),
    "sqlite": ("ares_events.stores.sqlite:SQLiteRecorder", ""),
    "postgresql": ("ares_events.stores.postgres:PostgresRecorder", "postgres"),
    "postgres": ("ares_events.stores.postgres:PostgresRecorder", "postgres"),
    "citus": ("ares_events.stores.cells:CellsRecorder", "postgres"),
    "pgcells": ("ares_events.stores.cells:CellsRecorder", "postgres"),
}
_BUILTIN_ASYNC: dict[str, str] = {
    # blocking class path -> its native asyncio face (the others run on worker threads)
    "ares_events.stores.memory.recorder.MemoryRecorder": (
        "ares_events.stores.memory:AsyncMemoryRecorder"
    ),
    "ares_events.stores.postgres.recorder.PostgresRecorder": (
        "ares_events.stores.postgres:AsyncPostgresRecorder"
    ),
    "ares_events.stores.cells.recorder.CellsRecorder": (
        "ares_events.stores.cells:AsyncCellsRecorder"
    ),
}

_lock = threading.Lock()
_targets: dict[str, str | type[Any]] = {k: v[0] for k, v in _BUILTIN.items()}
_discovered = False


def register_store(scheme: str, target: str | type[Any], *, replace: bool = False) -> None:
    """Register a backend class (or ``"module:Class"``) for a URL scheme; refuses to
    overwrite unless ``replace=True``.

    Raises:
        ConfigError: the scheme is already registered and ``replace`` is False.
    """
    scheme = scheme.lower()
    with _lock:
        if scheme in _targets and not replace:
            raise ConfigError(
                f"store scheme {scheme!r} is already registered; pass replace=True to override it"
            )
        _targets[scheme] = target


def registered_stores() -> Mapping[str, str | type[Any]]:
    """Read-only view of scheme -> backend."""
    return MappingProxyType(_targets)


def available_schemes() -> list[str]:
    """Every registered scheme (installed plugins' entry points included), sorted."""
    _discover()
    return sorted(_targets)


def _discover() -> None:
    """Add the installed plugins' schemes (the entry points), once."""
    global _discovered
    with _lock:
        if not _discovered:
            _discovered = True
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                _targets.setdefault(ep.name.lower(), ep.value)


def resolve(scheme: str) -> type[Any]:
    """The backend class for ``scheme``, importing it on first use.

    Raises:
        UnknownSchemeError: no backend for the scheme.
        MissingDependencyError: the backend's optional dependency is not installed.
    """
    scheme = scheme.lower()
    if scheme not in _targets:
        _discover()
    target = _targets.get(scheme)
    if target is None:
        raise UnknownSchemeError(scheme, sorted(_targets))
    if not isinstance(target, str):
        return target
    # A plugin's dependency is its own package's, not an extra of ours.
    extra = (_BUILTIN[scheme][1] or None) if scheme in _BUILTIN else None
    cls = _load(target, f"the {scheme}:// store", extra)
    with _lock:
        _targets[scheme] = cls
    return cls


def resolve_async(cls: type[Any]) -> type[Any] | None:
    """The native asyncio face of backend ``cls``, or None when it has none: a built-in's
    from the registry, a third party's from its ``async_recorder`` class attribute (a
    ``"module:Class"`` string or a class).

    Raises:
        MissingDependencyError: the asyncio face's dependency is not installed.
    """
    builtin = _BUILTIN_ASYNC.get(f"{cls.__module__}.{cls.__qualname__}")
    target = builtin or getattr(cls, "async_recorder", None)
    if target is None or not isinstance(target, str):
        return target
    return _load(target, f"the asyncio face of {cls.__name__}", "postgres" if builtin else None)


def _load(target: str, what: str, extra: str | None) -> type[Any]:
    """The class ``"module:Class"`` names (MissingDependencyError when not importable)."""
    mod_name, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] == "ares_events":
            raise  # our own module failed: a bug to show, not an extra to install
        raise MissingDependencyError(what, extra, missing=exc.name) from exc
    return getattr(mod, attr)  # type: ignore[no-any-return]
