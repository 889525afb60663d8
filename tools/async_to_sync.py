#!/usr/bin/env python3
"""Generate the blocking face of ares-events from its asyncio source.

Each ``*_async.py`` module listed in :data:`SOURCES` is the one written by hand; this
script rewrites it into the module without ``_async`` (the psycopg approach,
``tools/async_to_sync.py`` there). The rewrite works on the text, so comments and layout
survive:

- ``async def`` / ``async for`` / ``async with`` lose ``async``; ``await`` goes;
- names are renamed by :data:`RENAMES` and two rules (``AsyncX`` -> ``X``, ``x_async``
  -> ``x``), in code, in docstrings and comments (except inside double backticks, where
  a name means exactly itself) and in strings that are one name (``__all__``);
- ``if ASYNC:`` (:data:`ares_events.core.faces.ASYNC`) keeps its ``else:`` branch (or
  nothing) in the blocking face:
  the way to write what only one face needs (imports, a worker thread, a lock); an
  ``elif`` after it becomes the blocking face's ``if``;
- a line that ends with ``# as is`` is not renamed (a name that means the asyncio face
  on both faces);
- ``await asyncio.to_thread(f, *args)`` becomes ``f(*args)`` (``lambda: x`` becomes
  ``x``), ``maybe_await(x)`` becomes ``x`` and ``Awaitable[X]`` becomes ``X``: work the
  loop must not block on is plain code on the blocking face;
- then ``ruff`` drops the imports left unused and formats the result.

Usage::

    python tools/async_to_sync.py          # regenerate every blocking module
    python tools/async_to_sync.py --check  # exit 1 when one is out of date (CI)

The first line of a generated module says it is generated and from what.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOURCES: tuple[str, ...] = (
    "ares_events/core/iterators_async.py",
    "ares_events/core/recorder_async.py",
    "ares_events/core/snapshots_async.py",
    "ares_events/core/store_async.py",
    "ares_events/stores/memory/recorder_async.py",
    "ares_events/stores/postgres/connection_async.py",
    "ares_events/stores/postgres/listener_async.py",
    "ares_events/stores/postgres/recorder_async.py",
    "ares_events/stores/postgres/snapshots_async.py",
    "ares_events/stores/opening_async.py",
    "ares_events/archive/reader_async.py",
    "ares_events/integrity/verify_async.py",
    "ares_events/projections/recovery_async.py",
    "ares_events/agents/runs_async.py",
    "ares_events/agents/journal_async.py",
    "ares_events/integrations/_langgraph_ops_async.py",
    "ares_events/integrations/_langgraph_saver_async.py",
    "ares_events/integrations/_conversation_async.py",
    "ares_events/integrations/_pydantic_ai_store_async.py",
    "ares_events/integrations/_openai_session_async.py",
    "ares_events/integrations/_google_adk_sessions_async.py",
    "ares_events/stores/cells/recorder_async.py",
)
"""The asyncio modules written by hand, package-relative to the repository root."""

RENAMES: dict[str, str] = {
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "AsyncExitStack": "ExitStack",
    "AbstractAsyncContextManager": "AbstractContextManager",
    "StopAsyncIteration": "StopIteration",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "aclose": "close",
    "aclosing": "closing",
    "anext": "next",
    "aiter": "iter",
    "asynccontextmanager": "contextmanager",
    "open_async_store": "open_store",
    "open_url": "from_url",
    # The blocking saver the public AresSaver (integrations/langgraph.py) extends with
    # its a-methods: one class of that name.
    "AsyncAresSaver": "AresSaverBase",
    # LangGraph's BaseCheckpointSaver names its asyncio methods a<name>.
    "aget_tuple": "get_tuple",
    "alist": "list",
    "aget_delta_channel_history": "get_delta_channel_history",
    "aput": "put",
    "aput_writes": "put_writes",
    "adelete_thread": "delete_thread",
    "adelete_for_runs": "delete_for_runs",
    "acopy_thread": "copy_thread",
    "aprune": "prune",
    "arecover": "recover",
    "areplay": "replay",
    "asnapshot": "snapshot",
    "averify_stream": "verify_stream",
    "achain_start": "chain_start",
    "amake_snapshot": "make_snapshot",
    "aemit": "emit",
    "aclose_iter": "close_iter",
    "aclosing_iter": "closing_iter",
    "afirst": "first",
    "apages": "pages",
    "async_snapshot_store_for": "snapshot_store_for",
}
"""Names renamed in the blocking face, besides the two rules of :func:`rename`."""

KEEP: frozenset[str] = frozenset({"AsyncIO"})
"""Names the rules would rename but must not."""

_ASYNC_CLASS = re.compile(r"^Async([A-Z]\w*)$")
_ASYNC_MODULE = re.compile(r"^(\w+)_async$")
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
_DOUBLED = re.compile(r"\b([A-Z]\w*) \| \1\b")
_LITERAL = re.compile(r"(``[^`]*``)")
_NAME_STRING = re.compile(r"""^(['"])([A-Za-z_]\w*)\1$""")
_PHRASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\ban async iterator\b"), "an iterator"),
    (re.compile(r"\basync iterators?\b"), "iterator"),
)

HEADER = "# Generated from {src} by tools/async_to_sync.py: do not edit.\n"


def rename(name: str) -> str:
    """The blocking face's name for ``name``."""
    if name in KEEP:
        return name
    if name in RENAMES:
        return RENAMES[name]
    m = _ASYNC_CLASS.match(name)
    if m:
        return m.group(1)
    m = _ASYNC_MODULE.match(name)
    if m:
        return m.group(1)
    return name


def _rename_text(text: str) -> str:
    """Rename in prose, except inside ````double backticks````: there a name means
    exactly that name (``ae.open_async_store`` stays itself on the blocking face)."""
    parts = _LITERAL.split(text)
    for i in range(0, len(parts), 2):
        part = parts[i]
        for pattern, repl in _PHRASES:
            part = pattern.sub(repl, part)
        parts[i] = _WORD.sub(lambda m: rename(m.group(0)), part)
    return "".join(parts)


# -- pass 1: ``if ASYNC:`` blocks ----------------------------------------------


def _is_async_block(node: ast.AST, lines: list[str]) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "ASYNC"


def _drop_async_blocks(source: str, where: str) -> str:
    """Replace every ``if ASYNC:`` statement by its dedented ``else`` body."""
    while True:
        lines = source.splitlines(keepends=True)
        tree = ast.parse(source, where)
        block = next((n for n in ast.walk(tree) if _is_async_block(n, lines)), None)
        if block is None:
            return source
        assert isinstance(block, ast.If)
        start, end = block.lineno - 1, block.end_lineno or block.lineno
        first = block.orelse[0] if block.orelse else None
        chained = isinstance(first, ast.If) and lines[first.lineno - 1].lstrip().startswith("elif")
        if lines[start].lstrip().startswith("elif"):
            # ``elif ASYNC:`` inside a chain: drop its branch, keep the rest as is.
            if first is None:
                cut = end
            elif chained:
                cut = first.lineno - 1
            else:
                cut = _else_line(lines, first, start)
            source = "".join(lines[:start] + lines[cut:])
            continue
        if chained:
            # ``elif C:`` becomes ``if C:`` at the same indentation, its chain kept.
            assert first is not None
            lines[first.lineno - 1] = lines[first.lineno - 1].replace("elif", "if", 1)
            source = "".join(lines[:start] + lines[first.lineno - 1 :])
            continue
        kept: list[str] = []
        if first is not None:
            # The else body runs from the line after ``else:`` to the end of the If.
            body = lines[_else_line(lines, first, start) + 1 : end]
            outer = len(lines[start]) - len(lines[start].lstrip())
            inner = len(lines[first.lineno - 1]) - len(lines[first.lineno - 1].lstrip())
            cut = inner - outer
            kept = [ln[cut:] if ln[:cut].strip() == "" else ln for ln in body]
        source = "".join(lines[:start] + kept + lines[end:])


def _else_line(lines: list[str], first: ast.stmt, start: int) -> int:
    """The index of the ``else:`` line before ``first``, the else body's first statement
    (decorators included)."""
    top = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))])
    return next(i for i in range(top - 2, start, -1) if lines[i].strip().startswith("else"))


# -- pass 2: calls that are plain calls on the blocking face ---------------------------


def _is_to_thread(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "to_thread" and isinstance(func.value, ast.Name)
    return isinstance(func, ast.Name) and func.id == "to_thread"


def _unwrap_calls(source: str, where: str) -> str:
    """``await asyncio.to_thread(f, *a)`` -> ``f(*a)``; ``maybe_await(x)`` -> ``x``;
    ``Awaitable[X]`` -> ``X``."""
    tree = ast.parse(source, where)
    edits: list[tuple[int, int, int, int, str]] = []
    for node in ast.walk(tree):
        target: ast.expr | None = None
        if isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
            call = node.value
            if _is_to_thread(call.func):
                target = node
                fn, *args = call.args
                if isinstance(fn, ast.Lambda) and not args and not call.keywords:
                    text = ast.get_source_segment(source, fn.body)
                else:
                    parts = [ast.get_source_segment(source, a) for a in args]
                    parts += [ast.get_source_segment(source, k) for k in call.keywords]
                    text = f"{ast.get_source_segment(source, fn)}({', '.join(map(str, parts))})"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "maybe_await"
        ):
            target = node
            text = ast.get_source_segment(source, node.args[0])
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Awaitable"
        ):
            target = node  # a callback's Awaitable[X] is a plain X on the blocking face
            text = ast.get_source_segment(source, node.slice)
        if target is not None:
            assert text is not None
            edits.append(
                (
                    target.lineno,
                    target.col_offset,
                    target.end_lineno or target.lineno,
                    target.end_col_offset or 0,
                    f"({text})" if "\n" in text else text,
                )
            )
    if not edits:
        return source
    # Nested edits: keep the outermost only (its text is re-read from the source).
    edits.sort()
    outer: list[tuple[int, int, int, int, str]] = []
    for e in edits:
        if outer and (e[0], e[1]) < (outer[-1][2], outer[-1][3]):
            continue
        outer.append(e)
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln.encode()))
    data = source.encode()
    for sl, sc, el, ec, text in reversed(outer):
        a, b = offsets[sl - 1] + sc, offsets[el - 1] + ec
        data = data[:a] + text.encode() + data[b:]
    out = data.decode()
    return _unwrap_calls(out, where) if out != source else out


# -- pass 3: tokens --------------------------------------------------------------------


def _is_docstring(tokens: list[tokenize.TokenInfo], i: int) -> bool:
    prev = next(
        (t for t in reversed(tokens[:i]) if t.type not in (tokenize.NL, tokenize.COMMENT)), None
    )
    nxt = next((t for t in tokens[i + 1 :] if t.type != tokenize.COMMENT), None)
    starts = prev is None or prev.type in (
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
    )
    return starts and (nxt is None or nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER))


def _rewrite_tokens(source: str) -> str:
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    starts = [0]  # character offset of each line (tokenize counts characters)
    for ln in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(ln))

    def at(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    # A line that ends with ``# as is`` means exactly what it says on both faces.
    as_is = {
        t.start[0] for t in tokens if t.type == tokenize.COMMENT and t.string.endswith("as is")
    }
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement)
    for i, tok in enumerate(tokens):
        a, b = at(tok.start), at(tok.end)
        if tok.start[0] in as_is:
            continue
        if tok.type == tokenize.NAME:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if tok.string == "async" and nxt is not None and nxt.string in ("def", "for", "with"):
                edits.append((a, at(nxt.start), ""))
            elif tok.string == "await":
                end = at(nxt.start) if nxt is not None and nxt.start[0] == tok.end[0] else b
                edits.append((a, end, ""))
            elif (new := rename(tok.string)) != tok.string:
                edits.append((a, b, new))
        elif tok.type == tokenize.COMMENT or (
            tok.type == tokenize.STRING and _is_docstring(tokens, i)
        ):
            if (new := _rename_text(tok.string)) != tok.string:
                edits.append((a, b, new))
        elif (
            tok.type == tokenize.STRING
            and (m := _NAME_STRING.match(tok.string))
            and (new := rename(m.group(2))) != m.group(2)
        ):
            # A string that is one name ("__all__" entries, getattr names) is a name.
            edits.append((a, b, f"{m.group(1)}{new}{m.group(1)}"))
    out = source
    for a, b, new in sorted(edits, reverse=True):
        out = out[:a] + new + out[b:]
    return out


# -- the whole conversion --------------------------------------------------------------


def _ruff(args: list[str], text: str, filename: str) -> str:
    proc = subprocess.run(  # noqa: S603 - our own interpreter and arguments
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", filename, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if proc.returncode not in (0, 1) or not proc.stdout:
        raise SystemExit(f"ruff {' '.join(args)} failed on {filename}:\n{proc.stderr}")
    return proc.stdout


def convert(source: str, src_name: str, out_name: str) -> str:
    """The blocking module generated from the asyncio ``source``."""
    text = _drop_async_blocks(source, src_name)
    text = _unwrap_calls(text, src_name)
    text = _rewrite_tokens(text)
    # ``AsyncX | X`` (a callable taking either face) is ``X | X`` now: say it once.
    text = _DOUBLED.sub(r"\1", text)
    ast.parse(text, out_name)  # the result must still be Python
    text = HEADER.format(src=Path(src_name).name) + text
    # Imports only one face used, __all__ order after renames, [x async for x in y]
    # that became [x for x in y], and `x = f(); return x` left by a dropped ASYNC block.
    fixes = ["--select", "F401,I001,RUF022,C416,RET504,UP028", "--unsafe-fixes", "--exit-zero"]
    text = _ruff(["check", "--fix", "--quiet", *fixes], text, out_name)
    return _ruff(["format", "--quiet"], text, out_name)


def target_of(src: str) -> str:
    """``x/y_async.py`` -> ``x/y.py``."""
    path = Path(src)
    if not path.stem.endswith("_async"):
        raise SystemExit(f"{src}: a source module's name ends in _async")
    return str(path.with_name(path.stem[: -len("_async")] + ".py"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when a module is out of date")
    ap.add_argument("files", nargs="*", help="sources to convert (default: all of SOURCES)")
    opts = ap.parse_args(argv)
    stale = []
    for src in opts.files or SOURCES:
        out = target_of(src)
        generated = convert((ROOT / src).read_text(), src, out)
        current = (ROOT / out).read_text() if (ROOT / out).exists() else None
        if generated == current:
            continue
        if opts.check:
            stale.append(out)
        else:
            (ROOT / out).write_text(generated)
            print(f"wrote {out}")
    if stale:
        print(
            "out of date (run python tools/async_to_sync.py): " + ", ".join(stale),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
