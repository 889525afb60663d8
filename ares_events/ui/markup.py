"""Safe HTML by construction: every value is text unless it is :class:`Markup` made here.

It may import the standard library only.
"""

from __future__ import annotations

import html
import json
import unicodedata
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final
from urllib.parse import urlencode

__all__ = ["Markup", "el", "esc", "join", "json_text", "link", "url", "visible"]

_KEEP: Final = frozenset("\n\t")
_HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})
_VOID: Final = frozenset({"br", "hr", "img", "input", "link", "meta"})


class Markup(str):
    """A string that is already HTML (made by this module; never from store content)."""

    __slots__ = ()


def visible(text: str, *, keep: Collection[str] = _KEEP) -> str:
    """``text`` with invisible and direction-changing characters spelled out, except
    those in ``keep`` (newline and tab, for a page; ``keep=""`` for one log line, where
    a raw escape sequence would drive the operator's terminal)."""
    if text.isprintable():
        return text
    return "".join(
        f"⟨U+{ord(c):04X}⟩"
        if c not in keep and unicodedata.category(c) in _HIDDEN_CATEGORIES
        else c
        for c in text
    )


def esc(value: Any) -> Markup:
    """``value`` as HTML text (Markup passes through)."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return Markup("")
    return Markup(html.escape(visible(str(value)), quote=True))


def _attr(name: str) -> str:
    return "class" if name == "cls" else name.rstrip("_").replace("_", "-")


def el(tag: str, *children: Any, **attrs: Any) -> Markup:
    """``<tag attrs>children</tag>``; children may be nested iterables, None is skipped;
    an attribute set to True is written bare, False or None is left out."""
    start = f"<{tag}" + "".join(
        f" {_attr(k)}" if v is True else f' {_attr(k)}="{html.escape(str(v), quote=True)}"'
        for k, v in attrs.items()
        if v is not None and v is not False
    )
    return Markup(f"{start}>" if tag in _VOID else f"{start}>{join(children)}</{tag}>")


def join(children: Iterable[Any]) -> Markup:
    """Children concatenated, each escaped unless Markup."""
    # A string is iterable too, but it is one child.
    nested = (
        join(c) if isinstance(c, Iterable) and not isinstance(c, str) else esc(c)
        for c in children
        if c is not None
    )
    return Markup("".join(nested))


def url(path: str, query: Mapping[str, Any] | None = None) -> str:
    """A same-origin URL relative to the console's root: ``path`` (a literal of this code,
    ``"/stream"``) and an encoded query, as ``./stream?id=...``. Every page sits one level
    under the root, so the console works wherever it is mounted without knowing where."""
    rel = "./" + path.lstrip("/")
    q = {k: v for k, v in (query or {}).items() if v is not None and v != ""}
    return f"{rel}?{urlencode(q)}" if q else rel


def link(text: Any, path: str, query: Mapping[str, Any] | None = None, **attrs: Any) -> Markup:
    """An ``<a>`` to a same-origin URL."""
    return el("a", text, href=url(path, query), **attrs)


def json_text(value: Any, *, limit: int | None = None) -> str:
    """``value`` as indented JSON text (not markup: escape it), cut at ``limit`` chars."""
    text = json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)
    if limit is not None and len(text) > limit:
        return text[:limit] + f"\n… ({len(text) - limit} more characters)"
    return text
