"""Redaction that keeps proof: JSONPath selections of event payloads become salted digests
(the subset and the digest: docs/records.md).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ares_events.errors import ConfigError
from ares_events.records.verify import REDACTED, parse_path, redaction_digest

__all__ = ["Redaction", "compile_paths", "normalized", "redact"]

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_STAR: Final = object()


@dataclass(frozen=True, slots=True)
class _Sel:
    """One segment: a member name, an index or ``*``; ``deep`` for ``..``."""

    key: Any
    deep: bool = False


@dataclass(frozen=True, slots=True)
class Redaction:
    """One redacted value: where (normalized path), its salt and the value itself."""

    path: str
    salt: bytes
    value: Any


def _compile(expr: str) -> list[_Sel]:
    if not isinstance(expr, str) or not expr.startswith("$"):
        raise ConfigError(f"--redact {expr!r}: a JSONPath starts with $")
    sels: list[_Sel] = []
    i, n = 1, len(expr)
    while i < n:
        deep = expr.startswith("..", i)
        if deep or expr[i] == ".":
            i += 2 if deep else 1
            if expr.startswith("*", i):
                sels.append(_Sel(_STAR, deep))
                i += 1
                continue
            m = _NAME.match(expr, i)
            if m is None:
                raise ConfigError(f"--redact {expr!r}: expected a member name at {i}")
            sels.append(_Sel(m.group(), deep))
            i = m.end()
        elif expr.startswith(("['", '["'), i):
            # A quoted name, escapes and all (a name may hold ' or ]): read up to its
            # closing quote, then unescape as the normalized paths the tool prints.
            q, j = expr[i + 1], i + 2
            while j < n and expr[j] != q:
                j += 2 if expr[j] == "\\" else 1
            body = expr[i + 2 : j]
            try:
                if not expr.startswith(q + "]", j):
                    raise ValueError("unterminated")
                name = json.loads(f'"{body}"') if q == '"' else parse_path(f"$['{body}']")[0]
            except ValueError:
                raise ConfigError(f"--redact {expr!r}: bad quoted name at {i}") from None
            sels.append(_Sel(name))
            i = j + 2
        elif expr[i] == "[":
            j = expr.find("]", i)
            inner = expr[i + 1 : j] if j > 0 else ""
            if inner == "*":
                sels.append(_Sel(_STAR))
            elif re.fullmatch(r"0|[1-9][0-9]*", inner):
                sels.append(_Sel(int(inner)))
            else:
                raise ConfigError(f"--redact {expr!r}: unsupported selector [{inner}]")
            i = j + 1
        else:
            raise ConfigError(f"--redact {expr!r}: unexpected {expr[i]!r} at {i}")
    return sels


def compile_paths(exprs: Sequence[str]) -> list[list[Any]]:
    """Parse ``--redact`` expressions (the subset: docs/records.md).

    Raises:
        ConfigError: an expression outside the supported subset.
    """
    return [_compile(e) for e in exprs]


def _children(value: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(value, dict):
        yield from value.items()
    elif isinstance(value, list):
        yield from enumerate(value)


def _select(value: Any, sels: Sequence[_Sel], at: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    if not sels:
        yield at
        return
    sel, rest = sels[0], sels[1:]
    for k, v in _children(value):
        if sel.key is _STAR or (k == sel.key and type(k) is type(sel.key)):
            yield from _select(v, rest, (*at, k))
        if sel.deep:  # ``..``: the same selectors again, one level down
            yield from _select(v, sels, (*at, k))


def normalized(steps: Sequence[Any]) -> str:
    """The RFC 9535 normalized path of ``steps`` (``$['a'][0]``)."""
    out = ["$"]
    for s in steps:
        if isinstance(s, int):
            out.append(f"[{s}]")
        else:
            text = json.dumps(s, ensure_ascii=False)[1:-1].replace('\\"', '"').replace("'", "\\'")
            out.append(f"['{text}']")
    return "".join(out)


def redact(payload: Any, compiled: Sequence[Sequence[Any]]) -> tuple[Any, list[Redaction]]:
    """``payload`` with every selected value replaced by its salted digest, and the
    redactions made (none: ``payload`` is returned as is)."""
    found: set[tuple[Any, ...]] = set()
    for sels in compiled:
        found.update(_select(payload, sels, ()))
    if not found:
        return payload, []
    # The outermost selection covers what is inside it.
    chosen = [p for p in found if not any(p[: len(q)] == q for q in found if len(q) < len(p))]
    out = json.loads(json.dumps(payload))  # a deep copy of plain JSON
    made = []
    for steps in sorted(chosen, key=normalized):
        salt = secrets.token_bytes(16)
        if not steps:
            value, out = out, {REDACTED: redaction_digest(salt, out)}
        else:
            parent = out
            for s in steps[:-1]:
                parent = parent[s]
            value = parent[steps[-1]]
            parent[steps[-1]] = {REDACTED: redaction_digest(salt, value)}
        made.append(Redaction(normalized(steps), salt, value))
    return out, made
