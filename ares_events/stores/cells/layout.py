"""The cell layout, without I/O: partitions, the cell map, cursors and cell URLs.

It may import the core's events and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlencode, urlsplit

import blake3

from ares_events.core.events import RecordedEvent
from ares_events.core.url import StoreURL
from ares_events.errors import ConfigError, InvalidEvent

__all__ = [
    "CELLS_KEY",
    "MAX_CELLS",
    "SLOT_BITS",
    "CellMap",
    "CellsConfig",
    "pack",
    "parse_cells_url",
    "partition_of",
    "point",
    "unpack",
    "with_position",
]

CELLS_KEY: Final = "ares.cells"
"""The metadata key under which every cell records the cell map."""
SLOT_BITS: Final = 64
"""Bits per cell in a cursor (a cell's positions are below 2**63)."""
MAX_CELLS: Final = 1024
MAX_PARTITIONS: Final = 65536
_PARTITION_DOMAIN: Final = b"ares-events/partition/v1\x00"
_MASK: Final = (1 << SLOT_BITS) - 1
_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,40}")
OWN_PARAMS: Final = ("partitions", "cells", "prefix", "hosts")


def partition_of(stream_id: str, partitions: int) -> int:
    """The partition of ``stream_id``: the first 8 bytes of a domain-separated blake3 of its
    UTF-8 bytes, big-endian, modulo ``partitions``. Part of the on-disk contract of a cell
    store: it never changes (docs/scaling.md)."""
    digest = blake3.blake3(_PARTITION_DOMAIN + stream_id.encode("utf-8")).digest(8)
    return int.from_bytes(digest, "big") % partitions


def pack(parts: Sequence[int]) -> int:
    """One cursor from one position per cell (cell ``i`` in bits ``64*i .. 64*i+63``)."""
    return sum(p << (SLOT_BITS * i) for i, p in enumerate(parts))


def unpack(cursor: int, cells: int, field: str = "after_position") -> list[int]:
    """One position per cell from a cursor (0 is the start of every cell).

    Raises:
        InvalidEvent: not a cursor of a store of ``cells`` cells.
    """
    if type(cursor) is not int or cursor < 0 or cursor >> (SLOT_BITS * cells):
        raise InvalidEvent(
            field, f"must be 0 or a position of this store of {cells} cells, got {cursor!r}"
        )
    return [(cursor >> (SLOT_BITS * i)) & _MASK for i in range(cells)]


def point(cell: int, position: int) -> int:
    """The cursor of one event of cell ``cell`` outside a merge (the other cells' parts 0)."""
    return position << (SLOT_BITS * cell)


def with_position(event: RecordedEvent, position: int) -> RecordedEvent:
    """``event`` with another position (the rest, its lazy-decode cache included, shared)."""
    # RecordedEvent is a tuple whose third item is the position (core/events.py).
    return tuple.__new__(RecordedEvent, (*event[:2], position, *event[3:]))


@dataclass(frozen=True, slots=True)
class CellMap:
    """Which cell holds each partition; recorded in every cell under :data:`CELLS_KEY`.

    Attributes:
        partitions: how many partitions (fixed at init).
        cells: the cells' names (schemas), in cell order.
        assignment: the cell index of each partition.
    """

    partitions: int
    cells: tuple[str, ...]
    assignment: tuple[int, ...]

    @classmethod
    def new(cls, partitions: int, cells: Sequence[str]) -> CellMap:
        """Partition ``p`` in cell ``p % len(cells)``."""
        n = len(cells)
        return cls(partitions, tuple(cells), tuple(p % n for p in range(partitions)))

    def cell_of(self, stream_id: str) -> int:
        """The cell index that holds ``stream_id``."""
        return self.assignment[partition_of(stream_id, self.partitions)]

    def to_json(self) -> str:
        """The recorded form."""
        return json.dumps(
            {
                "v": 1,
                "partitions": self.partitions,
                "cells": list(self.cells),
                "assignment": list(self.assignment),
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str, where: str) -> CellMap:
        """Parse a recorded cell map.

        Raises:
            ConfigError: not a cell map this build reads.
        """
        try:
            d: Any = json.loads(raw)
            m = cls(int(d["partitions"]), tuple(d["cells"]), tuple(d["assignment"]))
            ok = d.get("v") == 1 and len(m.assignment) == m.partitions
            ok = ok and all(type(c) is int and 0 <= c < len(m.cells) for c in m.assignment)
        except (ValueError, TypeError, KeyError):
            ok = False
        if not ok:
            raise ConfigError(f"the cell map recorded in {where} is not one this build reads")
        return m


@dataclass(frozen=True, slots=True)
class CellsConfig:
    """A cell store URL, parsed: what each cell is and how many partitions to create."""

    where: str
    citus: bool
    hosts: tuple[str, ...]
    userinfo: str = field(repr=False)
    """``user[:password]`` as written in the URL (may hold the password: never shown)."""
    path: str
    extra: tuple[tuple[str, str], ...]
    """Parameters passed to every cell's URL."""
    prefix: str
    cells: int | None
    """None: whatever the store recorded (a new store gets :data:`DEFAULT_CELLS`, or one
    per host)."""
    partitions: int | None
    """None: whatever the store recorded (a new store gets :data:`DEFAULT_PARTITIONS`)."""

    def name_of(self, index: int) -> str:
        """The schema of cell ``index`` (0-based) in a new store."""
        return f"{self.prefix}_{index + 1}"

    def url_of(self, index: int, name: str) -> str:
        """The ``postgresql://`` URL of cell ``index`` in schema ``name`` (round-robin
        over the hosts; holds the password when the store URL does: never shown)."""
        q = urlencode([*self.extra, ("schema", name)], quote_via=quote)
        at = f"{self.userinfo}@" if self.userinfo else ""
        return f"postgresql://{at}{self.hosts[index % len(self.hosts)]}{self.path}?{q}"


DEFAULT_PARTITIONS: Final = 64
DEFAULT_CELLS: Final = 3


def parse_cells_url(url: StoreURL) -> CellsConfig:
    """Parse ``citus://`` or ``pgcells://`` (docs/scaling.md gives the parameters); every
    other parameter goes to each cell's ``postgresql://`` URL.

    Raises:
        ConfigError: a bad number of partitions or cells, a bad prefix or host.
    """
    where = url.redacted()
    params = dict(url.query)
    citus = url.scheme == "citus"
    parts = urlsplit(url.raw)
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    hosts: list[str]
    if params.get("hosts"):
        hosts = [h.strip() for h in params["hosts"].split(",") if h.strip()]
        if citus:
            raise ConfigError(f"hosts= is for pgcells:// (Citus places the cells): {where}")
    else:
        host = parts.netloc.rpartition("@")[2]
        if not host:
            raise ConfigError(f"{where} names no server (host:port or hosts=...)")
        hosts = [host]
    for h in hosts:
        if not re.fullmatch(r"[A-Za-z0-9_.\-\[\]:]+", h):
            raise ConfigError(f"bad host {h!r} in {where}")
    partitions = _count(params, "partitions", where, MAX_PARTITIONS)
    cells = _count(params, "cells", where)
    if cells is not None and partitions is not None and cells > partitions:
        raise ConfigError(f"cells ({cells}) must not exceed partitions ({partitions}) in {where}")
    prefix = params.get("prefix", "ares_cell")
    if not _PREFIX.fullmatch(prefix):
        raise ConfigError(
            f"prefix must be lowercase letters, digits or '_' (at most 41), got {prefix!r}"
        )
    rest = [(k, v) for k, v in url.query if k not in OWN_PARAMS and k != "schema"]
    if "schema" in params:
        raise ConfigError(
            f"a cell store names its schemas itself (prefix=...), not schema=: {where}"
        )
    if citus:
        # Schemas created in this session become distributed schemas (Citus's
        # schema-based sharding); the setting also holds for the cells' later sessions.
        # A cell's URL keeps one options= (the last): the user's joined with ours, ours
        # last, so a user's -c can never turn it off.
        ours = "-c citus.enable_schema_based_sharding=on"
        user = params.get("options", "").strip()
        rest = [(k, v) for k, v in rest if k != "options"]
        rest.append(("options", f"{user} {ours}" if user else ours))
    return CellsConfig(
        where=where,
        citus=citus,
        hosts=tuple(hosts),
        userinfo=userinfo,
        path=parts.path or "/",
        extra=tuple(rest),
        prefix=prefix,
        cells=cells,
        partitions=partitions,
    )


def _count(params: dict[str, str], key: str, where: str, top: int = MAX_CELLS) -> int | None:
    raw = params.get(key)
    if raw is None:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= top:
        raise ConfigError(f"{key} must be an integer from 1 to {top}, got {raw!r} in {where}")
    return n
