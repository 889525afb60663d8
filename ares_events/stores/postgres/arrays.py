"""Binary ``text[]`` and ``bytea[]`` parameters built in one pass (psycopg's generic list
dumper works element by element).

It may import psycopg only.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

__all__ = ["ByteaArray", "TextArray"]

_HEADER: Final = struct.Struct("!iiIii")
_NULL: Final = b"\xff\xff\xff\xff"
_TEXT_OID: Final = 25
_BYTEA_OID: Final = 17


class TextArray(list):  # type: ignore[type-arg]
    """A list of ``str`` (or None) sent as a binary ``text[]``."""

    __slots__ = ()


class ByteaArray(list):  # type: ignore[type-arg]
    """A list of ``bytes`` (or None) sent as a binary ``bytea[]``."""

    __slots__ = ()


def encode_array(element_oid: int, items: list[bytes | None]) -> bytes:
    """The binary array of ``items`` (already encoded elements, None for NULL)."""
    parts = [b""]
    add = parts.append
    nulls = 0
    for b in items:
        if b is None:
            add(_NULL)
            nulls = 1
        else:
            add(len(b).to_bytes(4, "big"))
            add(b)
    parts[0] = _HEADER.pack(1, nulls, element_oid, len(items), 1)
    return b"".join(parts)


class _TextArrayDumper(Dumper):
    format = Format.BINARY
    oid = psycopg.postgres.types["text"].array_oid

    def dump(self, obj: Any) -> bytes:
        return encode_array(_TEXT_OID, [None if s is None else s.encode() for s in obj])


class _ByteaArrayDumper(Dumper):
    format = Format.BINARY
    oid = psycopg.postgres.types["bytea"].array_oid

    def dump(self, obj: Any) -> bytes:
        return encode_array(_BYTEA_OID, obj)


psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)
psycopg.adapters.register_dumper(ByteaArray, _ByteaArrayDumper)
