"""The blocking face is generated from the asyncio one (tools/async_to_sync.py): every
generated module is current, says so in its first line, and the rewrite does what its
docstring promises."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "async_to_sync", ROOT / "tools" / "async_to_sync.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("async_to_sync", mod)
    spec.loader.exec_module(mod)
    return mod


TOOL = _tool()


def _convert(source: str) -> str:
    out: str = TOOL.convert(source, "ares_events/x_async.py", "ares_events/x.py")
    return out


def test_generated_modules_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    """Regenerating every blocking module changes nothing (CI runs the same check)."""
    assert TOOL.main(["--check"]) == 0, capsys.readouterr().err


def test_every_generated_module_names_its_source() -> None:
    """Each generated module's first line says it is generated and from which source; every
    source is listed in SOURCES and every module with the header has a listed source."""
    listed = {ROOT / s for s in TOOL.SOURCES}
    for src in listed:
        out = ROOT / TOOL.target_of(str(src.relative_to(ROOT)))
        first = out.read_text().splitlines()[0]
        assert first == f"# Generated from {src.name} by tools/async_to_sync.py: do not edit."
    for path in (ROOT / "ares_events").rglob("*.py"):
        if path.read_text().startswith("# Generated from "):
            assert path.with_name(path.stem + "_async.py") in listed, path


def test_async_keywords_go_and_names_follow_the_faces() -> None:
    """async def/for/with lose async, await goes, AsyncX names become X."""
    out = _convert(
        "from __future__ import annotations\n"
        "from collections.abc import AsyncIterator\n\n\n"
        "class AsyncThing:\n"
        '    """Uses :class:`AsyncThing` and ``AsyncThing``."""\n\n'
        "    async def __aenter__(self) -> AsyncThing:\n"
        "        return self\n\n"
        "    async def items(self, src: AsyncIterator[int]) -> list[int]:\n"
        "        async with self:\n"
        "            return [x async for x in src]\n\n"
        "    async def go(self) -> None:\n"
        "        await self.items(aiter([]))\n"
    )
    assert "async def" not in out and "async with" not in out and "async for" not in out
    assert "await" not in out
    assert "class Thing:" in out
    assert "def __enter__(self) -> Thing:" in out
    assert "def items(self, src: Iterator[int]) -> list[int]:" in out
    assert "return list(src)" in out  # [x for x in src], simplified
    assert "self.items(iter([]))" in out
    # In prose a name follows the face; inside double backticks it means itself.
    assert ":class:`Thing` and ``AsyncThing``" in out


def test_async_blocks_keep_the_blocking_branch() -> None:
    """if ASYNC: keeps its else branch dedented, or nothing; an elif becomes the if."""
    out = _convert(
        "from __future__ import annotations\n"
        "from ares_events.core.faces import ASYNC\n\n"
        "if ASYNC:\n"
        "    import asyncio\n"
        "else:\n"
        "    import threading  # the blocking face\n\n\n"
        "def f(x: int) -> int:\n"
        "    if ASYNC:\n"
        "        return 1\n"
        "    elif x > 2:\n"
        "        return 2\n"
        "    else:\n"
        "        return 3\n\n\n"
        "def g() -> None:\n"
        "    if ASYNC:\n"
        "        asyncio.get_running_loop()\n"
        "    threading.get_ident()\n"
    )
    assert "ASYNC" not in out and "asyncio" not in out
    assert "import threading  # the blocking face\n" in out
    assert "    if x > 2:\n        return 2\n    else:\n        return 3\n" in out
    assert "def g() -> None:\n    threading.get_ident()\n" in out


def test_worker_threads_and_awaitables_become_plain_calls() -> None:
    """await asyncio.to_thread(f, a, k=b) -> f(a, k=b); lambda bodies; maybe_await(x) ->
    x; Awaitable[X] -> X."""
    out = _convert(
        "from __future__ import annotations\n"
        "import asyncio\n"
        "from collections.abc import Awaitable, Callable\n\n\n"
        "async def f(cb: Callable[[], Awaitable[int]], g: Callable[..., int]) -> int:\n"
        "    a = await asyncio.to_thread(g, 1, k=2)\n"
        "    b = await asyncio.to_thread(lambda: g(3))\n"
        "    return a + b + await maybe_await(cb())\n"
    )
    assert "def f(cb: Callable[[], int], g: Callable[..., int]) -> int:" in out
    assert "a = g(1, k=2)" in out
    assert "b = g(3)" in out
    assert "return a + b + cb()" in out
    assert "asyncio" not in out


def test_strings_that_are_one_name_are_renamed_and_as_is_lines_are_kept() -> None:
    """__all__ entries follow the names; a line ending in `# as is` is not renamed."""
    out = _convert(
        "from __future__ import annotations\n\n"
        '__all__ = ["AsyncThing"]\n'
        'LABEL = "AsyncThing is here"\n\n\n'
        "class AsyncThing:\n"
        "    pass\n\n\n"
        "OTHER = AsyncThing  # as is\n"
    )
    assert '__all__ = ["Thing"]' in out
    assert 'LABEL = "AsyncThing is here"' in out  # prose strings keep their words
    assert "OTHER = AsyncThing  # as is" in out


def test_a_source_must_end_in_async() -> None:
    """Only *_async.py modules are sources; the target drops the suffix."""
    assert TOOL.target_of("ares_events/core/store_async.py") == "ares_events/core/store.py"
    with pytest.raises(SystemExit):
        TOOL.target_of("ares_events/core/store.py")


def test_a_generated_docstring_is_true_on_its_face() -> None:
    """A source's docstrings say nothing that is false once renamed for the other face
    ("``x`` is generated from this module", "written here"): the first line of the
    generated module is what says it is generated."""
    import ast
    import re

    wrong: list[str] = []
    for src in TOOL.SOURCES:
        out = ROOT / TOOL.target_of(src)
        for node in ast.walk(ast.parse(out.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and (
                doc := ast.get_docstring(node)
            ):
                for bad in re.findall(r"is generated\b[^.]*|written here\b[^.]*", doc):
                    wrong.append(f"{out.relative_to(ROOT)}: {bad}")
    assert wrong == []
