"""The package layout (issue 16): imports point down the layers, no import circles, modules
stay under ~800 lines, and every package says what it may import.

The import graph is computed from the source with ``ast``: absolute ``ares_events...``
imports and relative imports, at module level, inside functions and inside
``if TYPE_CHECKING:`` blocks (a type-level circle is still a circle to a reader); the
``else`` branch of an ``if ASYNC:`` block is the generated module's code and is checked
there. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg``; a package stands for its ``__init__``. Importing ``pkg.mod`` is an edge to
``pkg.mod`` only (not to every parent package's ``__init__``, which Python runs too, but
which would make every module depend on the top package). Imports by string
(``importlib.import_module``: the store registry, the old-path aliases,
``ares_events.testing``'s lazy names) are not edges; the registry's strings are checked
below instead.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import ares_events

ROOT = Path(ares_events.__file__).resolve().parent
PACKAGE = "ares_events"
MAX_LINES = 800
WAIVER = "over 800 lines because"

# Bottom to top: a module may import its own layer and the layers below it. A module
# belongs to the layer of its longest matching prefix. The bare package name
# "ares_events" matches only its own __init__.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("format", ("ares_events.errors", "ares_events.chain")),
    ("core", ("ares_events.core",)),
    # A feature's folder holds a module in each layer it reaches (the archive's reader is
    # composed at open; its job verifies chains and Merkle roots; its CLI is the CLI's).
    (
        "stores",
        (
            "ares_events.stores",
            "ares_events.archive.erase",
            "ares_events.archive.reader",
            "ares_events.archive.reader_async",
            "ares_events.archive.segment",
            "ares_events.archive.source",
        ),
    ),
    ("integrity", ("ares_events.integrity", "ares_events.archive.check")),
    ("projections", ("ares_events.projections",)),
    ("features", ("ares_events.archive",)),
    ("records", ("ares_events.records",)),
    ("agents", ("ares_events.agents",)),
    (
        "top",
        (
            "ares_events.cli",
            "ares_events.archive.cli",
            "ares_events.integrations",
            "ares_events.ui",
            "ares_events.testing",
            "ares_events.__main__",
            "ares_events",
        ),
    ),
)
LAYER_NAMES = [name for name, _ in LAYERS]


@dataclass(frozen=True)
class Module:
    """One module of the package, by dotted name."""

    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int


def _name_of(path: Path, root: Path, package: str) -> Module:
    rel = path.relative_to(root).with_suffix("")
    parts = [package, *rel.parts]
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return Module(".".join(parts), path, is_package)


def discover(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Module]:
    """Every module under ``root``, by dotted name."""
    mods = (_name_of(p, root, package) for p in sorted(root.rglob("*.py")))
    return {m.name: m for m in mods}


def _is_async_block(node: ast.If, source: str) -> bool:
    """``if ASYNC:``: its else branch is the blocking face's code, which the generated
    module holds (and is checked there), not this one's."""
    return isinstance(node.test, ast.Name) and node.test.id == "ASYNC"


class _Imports(ast.NodeVisitor):
    """Collects import statements, those under ``if TYPE_CHECKING:`` included (the else
    branch of an ``if ASYNC:`` block excepted: see :func:`_is_async_block`)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.found: list[ast.Import | ast.ImportFrom] = []

    def visit_If(self, node: ast.If) -> None:
        if _is_async_block(node, self.source):
            self.visit(node.test)
            for child in node.body:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append(node)


def _nearest(name: str, known: dict[str, Module] | set[str]) -> str | None:
    """``name`` itself if it is a module, else its closest parent that is."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def imports_of(
    source: str, module: str, is_package: bool, known: dict[str, Module] | set[str]
) -> list[Edge]:
    """The package-internal import edges of one module's source."""
    collector = _Imports(source)
    collector.visit(ast.parse(source))
    edges: list[Edge] = []
    for node in collector.found:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    target = _nearest(alias.name, known)
                    if target is not None:
                        edges.append(Edge(module, target, node.lineno))
            continue
        if node.level:
            # Relative: level 1 is this package (for a package's __init__, itself).
            base_parts = module.split(".") if is_package else module.split(".")[:-1]
            base_parts = base_parts[: len(base_parts) - (node.level - 1)]
            base = ".".join([*base_parts, node.module] if node.module else base_parts)
        else:
            base = node.module or ""
        if not (base == PACKAGE or base.startswith(PACKAGE + ".")):
            continue
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            target = sub if sub in known else _nearest(base, known)
            if target is not None:
                edges.append(Edge(module, target, node.lineno))
    return edges


@cache
def graph() -> tuple[Edge, ...]:
    """Every import edge among the package's modules."""
    mods = discover()
    edges: list[Edge] = []
    for m in mods.values():
        edges += imports_of(m.path.read_text(encoding="utf-8"), m.name, m.is_package, mods)
    return tuple(edges)


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of ``module``'s layer (None: in no layer)."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact_only = prefix == PACKAGE
            matches = module == prefix or (not exact_only and module.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def upward(edges: tuple[Edge, ...] | list[Edge]) -> list[str]:
    """One line per import of a higher layer: module, target and both layers."""
    out = []
    for e in edges:
        src, dst = layer_of(e.source), layer_of(e.target)
        if src is not None and dst is not None and dst > src:
            out.append(
                f"{e.source} (layer {LAYER_NAMES[src]}) imports {e.target} "
                f"(layer {LAYER_NAMES[dst]}) at line {e.line}"
            )
    return out


def cycles(edges: tuple[Edge, ...] | list[Edge]) -> list[list[str]]:
    """One cycle (as a path that ends where it starts) per strongly connected component."""
    succ: dict[str, list[str]] = {}
    for e in edges:
        succ.setdefault(e.source, []).append(e.target)
        succ.setdefault(e.target, [])
    # Tarjan's algorithm, iterative (no recursion limit on deep graphs).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(succ):
        if start in index:
            continue
        work = [(start, iter(sorted(set(succ[start]))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(set(succ[nxt])))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1 or node in succ[node]:
                    components.append(sorted(comp))
    return [_cycle_in(comp, succ) for comp in components]


def _cycle_in(component: list[str], succ: dict[str, list[str]]) -> list[str]:
    """A concrete cycle through the first module of a strongly connected component."""
    members = set(component)
    start = component[0]
    # Breadth-first search back to start, inside the component.
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(set(succ[node])):
                if nxt not in members:
                    continue
                if nxt == start:
                    path = [start]
                    back = node
                    while back != start:
                        path.append(back)
                        back = parents[back]
                    path.append(start)
                    return [path[0], *reversed(path[1:-1]), start]
                if nxt not in parents:
                    parents[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return component  # pragma: no cover - a component always has a cycle


def _first_line(path: Path) -> str:
    """The module docstring's first paragraph (its lines joined), else the file's first
    comment line."""
    source = path.read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source))
    if doc:
        return " ".join(doc.strip().split("\n\n")[0].split())
    for line in source.splitlines():
        if line.strip().startswith("#"):
            return line.strip()
    return ""


# -- the package ------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    """Each module of the package belongs to one of the layers in LAYERS."""
    assert [m for m in discover() if layer_of(m) is None] == []


def test_no_import_cycles() -> None:
    """The package's module import graph has no cycle."""
    found = [" -> ".join(c) for c in cycles(graph())]
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_imports_point_down_the_layers() -> None:
    """No module imports a module of a higher layer."""
    found = upward(graph())
    assert found == [], "upward imports:\n" + "\n".join(found)


def test_modules_stay_under_800_lines() -> None:
    """A module over 800 lines says why in its first docstring or comment line."""
    too_long = []
    for m in discover().values():
        n = len(m.path.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES and WAIVER not in _first_line(m.path):
            too_long.append(f"{m.name}: {n} lines")
    assert too_long == []


def test_every_package_says_what_it_may_import() -> None:
    """Each package's __init__ docstring says what lives there and what it may import."""
    missing = []
    for m in discover().values():
        if not m.is_package:
            continue
        doc = ast.get_docstring(ast.parse(m.path.read_text(encoding="utf-8"))) or ""
        if "may import" not in doc or len(doc.split()) < 12:
            missing.append(m.name)
    assert missing == []


def test_graph_sees_known_edges() -> None:
    """The graph holds edges the code is known to have (the parser is not blind)."""
    pairs = {(e.source, e.target) for e in graph()}
    assert ("ares_events.stores", "ares_events.core.store") in pairs  # module level
    assert ("ares_events.core.store", "ares_events.core.snapshots") in pairs  # in a function
    assert ("ares_events.cli", "ares_events.cli.inspect") in pairs  # from pkg import module
    assert ("ares_events.integrity.verify", "ares_events.integrity.findings") in pairs
    assert ("ares_events.core.store", "ares_events.core.recorder") in pairs  # the faces pair
    # The core never names a store's type, not even for type checking.
    assert not any(s.startswith("ares_events.core") and ".stores" in t for s, t in pairs)


# -- the checker itself ---------------------------------------------------------------------------

_FAKE = {
    "ares_events",
    "ares_events.errors",
    "ares_events.core",
    "ares_events.core.events",
    "ares_events.core.store",
    "ares_events.stores",
    "ares_events.stores.memory",
    "ares_events.cli",
}


def test_checker_reports_an_upward_import() -> None:
    """A core module importing the CLI (even inside a function) is reported with layers."""
    source = "def f():\n    from ares_events.cli import main\n"
    edges = imports_of(source, "ares_events.core.events", False, _FAKE)
    assert edges == [Edge("ares_events.core.events", "ares_events.cli", 2)]
    assert upward(edges) == [
        "ares_events.core.events (layer core) imports ares_events.cli (layer top) at line 2"
    ]


def test_checker_counts_type_checking_imports() -> None:
    """Imports under `if TYPE_CHECKING:` are edges too: a circle of types is a circle."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ares_events.stores.memory import MemoryRecorder\n"
        "else:\n"
        "    import ares_events.errors\n"
    )
    edges = imports_of(source, "ares_events.core.store", False, _FAKE)
    assert [e.target for e in edges] == ["ares_events.stores.memory", "ares_events.errors"]


def test_checker_skips_the_blocking_branch_of_an_async_block() -> None:
    """The else branch of `if ASYNC:` belongs to the generated module."""
    source = (
        "if ASYNC:\n"
        "    import ares_events.errors\n"
        "else:\n"
        "    from ares_events.stores.memory import MemoryRecorder\n"
    )
    edges = imports_of(source, "ares_events.core.store", False, _FAKE)
    assert [e.target for e in edges] == ["ares_events.errors"]


def test_checker_resolves_relative_imports() -> None:
    """`from . import x` and `from .x import y` resolve against the module's package."""
    source = "from . import events\nfrom ..stores import memory\nfrom .store import EventStore\n"
    edges = imports_of(source, "ares_events.core.snapshots", False, _FAKE)
    assert [e.target for e in edges] == [
        "ares_events.core.events",
        "ares_events.stores.memory",
        "ares_events.core.store",
    ]
    edges = imports_of("from . import events\n", "ares_events.core", True, _FAKE)
    assert [e.target for e in edges] == ["ares_events.core.events"]


def test_checker_reports_a_cycle() -> None:
    """A circle of imports is reported as a path that returns to its start."""
    edges = [
        Edge("ares_events.core.store", "ares_events.stores", 1),
        Edge("ares_events.stores", "ares_events.stores.memory", 1),
        Edge("ares_events.stores.memory", "ares_events.core.store", 1),
        Edge("ares_events.stores.memory", "ares_events.errors", 1),
    ]
    assert cycles(edges) == [
        [
            "ares_events.core.store",
            "ares_events.stores",
            "ares_events.stores.memory",
            "ares_events.core.store",
        ]
    ]


# -- paths other programs depend on -----------------------------------------------------------


def test_registry_import_strings_point_at_real_classes() -> None:
    """Each built-in scheme's "module:Class" string imports and names a recorder class."""
    from ares_events.stores import _registry

    for scheme, (target, _extra) in _registry._BUILTIN.items():
        module, _, attr = target.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        assert scheme in cls.scheme, target


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("ares_events.core.backend", ("Batch", "Head", "Capability")),
        ("ares_events.core.recorder", ("Recorder",)),
        ("ares_events.stores.postgres", ("PostgresRecorder", "SCHEMA_VERSION")),
        ("ares_events.stores.sqlite", ("SQLiteRecorder",)),
        ("ares_events.stores.memory", ("MemoryRecorder",)),
        ("ares_events.stores", ("open_store", "register_store", "available_schemes")),
        ("ares_events.chain", ("canonical_json", "link_hash", "ChainKey")),
        ("ares_events.integrations.eventsourcing", ("Factory",)),
        ("ares_events.testing.contract", ("StoreContract", "run_concurrent_appenders")),
        ("ares_events.testing", ("StoreContract", "SnapshotContract", "store_state")),
        ("ares_events.cli", ("main", "cli")),
    ],
)
def test_documented_import_paths_still_work(module: str, names: tuple[str, ...]) -> None:
    """Module paths that plugin authors, eventsourcing and the docs use keep their names."""
    mod = importlib.import_module(module)
    for name in names:
        assert hasattr(mod, name), f"{module}.{name}"


def test_console_script_points_at_the_cli() -> None:
    """The `ares-events` console script resolves to ares_events.cli.main."""
    from ares_events.cli import main

    scripts = importlib.metadata.entry_points(group="console_scripts")
    (script,) = [ep for ep in scripts if ep.name == "ares-events"]
    assert script.value == "ares_events.cli:main"
    assert script.load() is main
