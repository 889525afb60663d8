"""What the run journal records about a call (canonical JSON after the redaction hook, and
its blake3 hash, which a replay compares) and about a failed attempt (type, class path,
message; :func:`rebuild_failure` raises it again as its own class on replay).

It may import the core and the format (canonical JSON); nothing else of the runtime.
"""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any, Final

import blake3

from ares_events.chain import canonical_json
from ares_events.errors import InvalidEvent

__all__ = [
    "MAX_ERROR_CHARS",
    "MISSING",
    "Redactor",
    "class_path",
    "describe",
    "first_difference",
    "hash_of",
    "rebuild_failure",
    "redact_keys",
    "shorten",
]

MAX_ERROR_CHARS: Final = 2000
"""A recorded error message keeps at most this many characters."""
SHOWN_CHARS: Final = 60
"""A value shown in a divergence message keeps at most this many characters."""
ABSENT: Final = "(absent)"

Redactor = Callable[[Any], Any]
"""``redact(value) -> value``: returns the JSON value to record in place of ``value``."""


def hash_of(value: Any, field: str) -> str:
    """blake3 (hex) of ``value``'s canonical JSON.

    Raises:
        InvalidEvent: ``value`` is not canonical-JSON encodable (names ``field``).
    """
    return blake3.blake3(canonical_json(value, field=field)).hexdigest()


def redact_keys(*names: str, replacement: str = "[redacted]") -> Redactor:
    """A redaction hook replacing the value of every object key named in ``names``
    (case-insensitive, at any depth) with ``replacement``.

    >>> redact_keys("api_key")({"api_key": "sk-1", "n": [{"API_KEY": 2}]})
    {'api_key': '[redacted]', 'n': [{'API_KEY': '[redacted]'}]}
    """
    lowered = frozenset(n.lower() for n in names)

    def redact(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: (replacement if isinstance(k, str) and k.lower() in lowered else redact(v))
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [redact(v) for v in value]
        return value

    return redact


class _Absent:
    def __repr__(self) -> str:
        return ABSENT


MISSING: Final = _Absent()


def _key_path(path: str, key: str) -> str:
    if key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{canonical_json(key).decode()}]"


def first_difference(recorded: Any, current: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first place where two JSON values differ, as ``(path, recorded, current)``
    (objects in sorted key order; :data:`MISSING` for a side without that key or item).
    Scalars compare by their canonical JSON (``1`` and ``1.0`` differ, as their hashes do).
    """
    if isinstance(recorded, dict) and isinstance(current, dict):
        for key in sorted(set(recorded) | set(current), key=str):
            sub = _key_path(path, str(key))
            if key not in recorded:
                return sub, MISSING, current[key]
            if key not in current:
                return sub, recorded[key], MISSING
            found = first_difference(recorded[key], current[key], sub)
            if found is not None:
                return found
        return None
    if isinstance(recorded, list | tuple) and isinstance(current, list | tuple):
        for i, (a, b) in enumerate(itertools.zip_longest(recorded, current, fillvalue=MISSING)):
            if a is MISSING or b is MISSING:  # one side is shorter
                return f"{path}[{i}]", a, b
            found = first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    try:
        same = canonical_json(recorded) == canonical_json(current)
    except InvalidEvent:  # a value that is not JSON compares by equality
        same = bool(recorded == current)
    return None if same else (path, recorded, current)


def shorten(text: str, width: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``width`` characters with an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _json_text(value: Any) -> str:
    if value is MISSING:
        return ABSENT
    try:
        return canonical_json(value).decode()
    except InvalidEvent:  # a value that is not JSON is shown by repr
        return repr(value)


def describe(recorded: Any, current: Any, width: int = SHOWN_CHARS) -> tuple[str, str]:
    """Both values as short JSON texts; two strings are cut around their first difference
    so that the part that changed is visible in both."""
    if isinstance(recorded, str) and isinstance(current, str):
        same = os.path.commonprefix([recorded, current])  # noqa: RUF071 - by character, as meant
        start = max(0, len(same) - width // 3)

        def cut(s: str) -> str:
            body = s[start : start + width]
            text = canonical_json(body).decode()
            return ("…" if start > 0 else "") + text + ("…" if start + width < len(s) else "")

        return cut(recorded), cut(current)
    return shorten(_json_text(recorded), width), shorten(_json_text(current), width)


_SEEN: weakref.WeakValueDictionary[str, type[BaseException]] = weakref.WeakValueDictionary()
_REPLAY_CLASSES: weakref.WeakKeyDictionary[type[BaseException], type[BaseException]] = (
    weakref.WeakKeyDictionary()
)


def class_path(exc: BaseException) -> str:
    """``module:qualname`` of ``exc``'s class; remembered so that this process can raise
    the same class again when a replay reproduces the failure."""
    cls = type(exc)
    path = f"{cls.__module__}:{cls.__qualname__}"
    _SEEN[path] = cls
    return path


def _resolve(path: str) -> type[BaseException] | None:
    cls = _SEEN.get(path)
    if cls is not None:
        return cls
    module, _, qualname = path.partition(":")
    # Only modules already imported: a replay never imports code named by the log.
    obj: Any = sys.modules.get(module)
    if obj is None or not qualname or "<" in qualname:
        return None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, type) and issubclass(obj, Exception) else None


class Replayed:
    """Marker base of a failure raised from the log on replay (not by a live call)."""

    ares_message: str = ""

    def __str__(self) -> str:
        return self.ares_message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ares_message!r})"


def _replay_class(cls: type[BaseException]) -> type[BaseException]:
    sub = _REPLAY_CLASSES.get(cls)
    if sub is None:
        sub = type(
            cls.__name__,
            (Replayed, cls),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
        _REPLAY_CLASSES[cls] = sub
    return sub


def rebuild_failure(path: str | None, message: str, note: str) -> BaseException | None:
    """An exception of the recorded class ``path`` whose ``str()`` is the recorded
    ``message`` (its ``__init__`` not called: ``args`` is ``(message,)``), or None when
    that class is not loaded in this process (or cannot be subclassed)."""
    if not path:
        return None
    cls = _resolve(path)
    if cls is None:
        return None
    try:
        sub = _replay_class(cls)
        obj = sub.__new__(sub)
        obj.args = (message,)
        obj.ares_message = message  # type: ignore[attr-defined]
        obj.add_note(note)
    except Exception:  # an exotic class (final, odd __new__): the library error instead
        return None
    return obj
