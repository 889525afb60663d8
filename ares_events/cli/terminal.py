"""What the CLI writes to a terminal: store content made visible (``⟨U+202E⟩``) and
tables that never cut an id (docs/cli.md).

It may import the standard library and rich only.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any, Final

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

__all__ = ["VisibleFormatter", "VisibleHook", "dumps", "fitted", "text", "visible"]

HIDDEN: Final = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})
"""The categories the console's pages spell out (control, format such as bidi overrides
and zero-width characters, private use, surrogates, unassigned, line/paragraph separators)."""
WIDE: Final = 10_000
"""A width no table reaches: to measure a table's least width unclamped."""


def _hidden(ch: str, keep: str) -> bool:
    return ch not in keep and unicodedata.category(ch) in HIDDEN


def visible(value: object, *, keep: str = "") -> str:
    """``value`` as text with every hidden character spelled ``⟨U+XXXX⟩`` (those in
    ``keep``, e.g. ``"\\n"`` for a multi-line block, stay)."""
    s = value if isinstance(value, str) else str(value)
    if s.isprintable():
        return s
    return "".join(f"⟨U+{ord(c):04X}⟩" if _hidden(c, keep) else c for c in s)


def text(value: object, style: str = "") -> Text:
    """A rich ``Text`` of ``value`` made visible (never read as rich markup)."""
    return Text(visible(value), style=style)


def dumps(data: Any) -> str:
    """``data`` as one line of JSON whose strings parse back exactly, with no hidden
    character written raw (``json.dumps`` leaves DEL, C1 controls and bidi overrides raw
    with ``ensure_ascii=False``; outside strings JSON has only ASCII, so escaping every
    such character of the text is escaping inside strings)."""
    s = json.dumps(data, ensure_ascii=False, default=str)
    if s.isprintable():
        return s
    # json.dumps escapes one such character as JSON does (a surrogate pair beyond the BMP).
    return "".join(json.dumps(c)[1:-1] if _hidden(c, "") else c for c in s)


class _Visible:
    """A renderable whose text segments are made visible (rich's own control segments,
    such as a progress bar's cursor moves, pass as they are)."""

    def __init__(self, inner: ConsoleRenderable) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for seg in console.render(self.inner, options):
            if seg.control is None and not seg.text.isprintable():
                yield Segment(visible(seg.text, keep="\n"), seg.style)
            else:
                yield seg

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.inner)


class VisibleHook(RenderHook):
    """Installed on the CLI's consoles: whatever a command prints, no hidden character
    reaches the terminal (the last line of defence; values are escaped before layout)."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Visible(r) for r in renderables]


class VisibleFormatter(logging.Formatter):
    """Log lines with hidden characters spelled out: a message is one line; a traceback
    keeps its own newlines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return visible(super().formatException(ei), keep="\n")

    def formatStack(self, stack_info: str) -> str:
        return visible(super().formatStack(stack_info), keep="\n")


class _Stacked:
    """A table too wide for the terminal, one block per row: ``column: value`` lines.
    Values of no-wrap columns (ids) stay whole on their line; others wrap."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        cols = self.table.columns
        heads = [str(c.header) for c in cols]
        pad = max(map(len, heads), default=0)
        wrapping = options.update(no_wrap=False, overflow="fold")
        if self.table.title:
            yield from console.render(Text.assemble(self.table.title), options)
            yield Segment.line()
        for i, row in enumerate(zip(*(list(c.cells) for c in cols), strict=True)):
            if i:
                yield Segment.line()
            for col, head, cell in zip(cols, heads, row, strict=True):
                line = Text(f"{head:>{pad}}: ", style="dim")
                line.append_text(cell if isinstance(cell, Text) else Text(str(cell)))
                yield from console.render(line, options if col.no_wrap else wrapping)
        if self.table.caption:
            yield from console.render(Text.assemble(self.table.caption), wrapping)


def _natural(console: Console, renderables: Iterable[Any]) -> int:
    opts = console.options.update(width=WIDE)
    return max((Measurement.get(console, opts, r).maximum for r in renderables), default=1)


def fitted(console: Console, table: Table, optional: Sequence[str] = ()) -> Table | _Stacked:
    """``table`` laid out for ``console``'s width without cutting a no-wrap column (ids,
    hashes, numbers): the columns named in ``optional`` are dropped, first named first,
    while the table cannot fit; the wrapping columns then share what is left (never less
    than their ``min_width`` or header); a table that still cannot fit is printed as one
    block of ``column: value`` lines per row."""
    width = console.width
    for name in (None, *optional):
        if name is not None:
            table.columns[:] = [c for c in table.columns if c.header != name]
            for i, c in enumerate(table.columns):
                # rich pads and collapses by a column's index (set by add_column).
                c._index = i
        cols = table.columns
        natural = [_natural(console, [c.header, *c.cells]) for c in cols]
        overhead = _natural(console, [table]) - sum(natural)
        floor = [
            n if c.no_wrap else min(n, max(c.min_width or 0, _natural(console, [c.header]), 6))
            for c, n in zip(cols, natural, strict=True)
        ]
        if overhead + sum(floor) <= width:
            break
    else:
        return _Stacked(table)
    if overhead + sum(natural) > width:
        # Share the room left by the no-wrap columns among the wrapping ones, by how much
        # each would like beyond its floor.
        room = width - overhead - sum(floor)
        want = [n - f for n, f in zip(natural, floor, strict=True)]
        total = sum(want) or 1
        for c, f, w in zip(cols, floor, want, strict=True):
            if not c.no_wrap:
                c.width = f + room * w // total
    return table
