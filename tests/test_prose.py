"""The package's prose is true: every module, file and name a docstring or comment names
exists, and the error tree in ``errors.py`` lists every error where it lives."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

import ares_events
from ares_events.errors import AresError

PKG = Path(ares_events.__file__).resolve().parent
ROOT = PKG.parent

# :mod:`~ares_events.x.y`, :class:`ares_events.x.Y`, :func:`.x`, ... (Sphinx roles)
ROLE = re.compile(r":(mod|class|func|meth|attr|data|exc):`~?([A-Za-z_.][\w.]*)`")
# a path inside the package or the repository, as `stores/opening.py` or core/x_async.py
PATH = re.compile(r"(?<![\w/.-])((?:[a-z_][\w]*/)+[a-z_]\w*\.(?:py|md|c|h|js|css))\b")


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _prose(path: Path) -> Iterator[tuple[int, str]]:
    """Every docstring and comment of a module, with its line."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        ) and (doc := ast.get_docstring(node, clean=False)):
            first = node.body[0]
            yield first.lineno, doc
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _resolves(dotted: str, here: str) -> bool:
    """True when ``dotted`` names a module, or an attribute of one (relative names are
    read against the module ``here`` and its package, as Sphinx does)."""
    if dotted.startswith("."):
        package = (
            here
            if (PKG / Path(*here.split(".")[1:]) / "__init__.py").exists()
            else (here.rpartition(".")[0])
        )
        dotted = package + dotted
    candidates = (
        [dotted]
        if dotted.startswith("ares_events")
        else [
            dotted,
            f"{here}.{dotted}",
            f"{here.rpartition('.')[0]}.{dotted}",
        ]
    )
    for cand in candidates:
        parts = cand.split(".")
        for cut in range(len(parts), 0, -1):
            mod = ".".join(parts[:cut])
            if not _module_exists(mod):
                continue
            obj: object = importlib.import_module(mod)
            for attr in parts[cut:]:
                obj = inspect.getattr_static(obj, attr, _MISSING)
                if obj is _MISSING:
                    break
            else:
                return True
            break
    return False


_MISSING = object()


def _named(dotted: str) -> bool:
    """Only names of this package are checked (builtins and other libraries are not)."""
    return dotted.startswith(("ares_events", "."))


def test_every_module_and_name_a_docstring_names_exists() -> None:
    """A ``:mod:``/``:class:``/``:func:`` reference to this package in any docstring or
    comment resolves to a module or a name that exists."""
    wrong: list[str] = []
    for name, path in _modules():
        for line, text in _prose(path):
            for _role, dotted in ROLE.findall(text):
                if _named(dotted) and not _resolves(dotted.rstrip("."), name):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {dotted}")
    assert wrong == []


def test_every_file_a_docstring_names_exists() -> None:
    """A file path in a docstring or comment (``stores/opening.py``, ``docs/cli.md``)
    names a file of the package or the repository."""
    wrong: list[str] = []
    for _name, path in _modules():
        for line, text in _prose(path):
            for found in PATH.findall(text):
                here = path.parent
                places = [ROOT / found, PKG / found, here / found]
                places += [p / found for p in here.parents if PKG in (p, *p.parents)]
                top = found.split("/", 1)[0]
                if not ((ROOT / top).is_dir() or (PKG / top).is_dir()):
                    continue  # another project's path (a framework's source file)
                if not any(p.exists() for p in places):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {found}")
    assert wrong == []


def _errors_in_package() -> dict[str, type[AresError]]:
    found: dict[str, type[AresError]] = {}
    for name, _path in _modules():
        if name.endswith("__main__"):
            continue
        mod = importlib.import_module(name)
        for obj in vars(mod).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, AresError)
                and obj.__module__ in (name, "ares_events")
                and obj is not AresError
            ):
                found[obj.__name__] = obj
    return found


@pytest.mark.parametrize("name", sorted(_errors_in_package()))
def test_errors_py_lists_every_error_and_where_it_lives(name: str) -> None:
    """The tree drawn in ``errors.py``'s docstring names every ``AresError`` subclass of
    the package, under its base, with the module it is defined in when that is not
    ``errors.py``."""
    import ares_events.errors as errors

    cls = _errors_in_package()[name]
    tree = errors.__doc__ or ""
    lines = [ln for ln in tree.splitlines() if re.search(rf"[─└├]\s*{name}\b", ln)]
    assert len(lines) == 1, f"{name} is not in the tree of errors.py (once)"
    homes = [
        mod
        for mod, path in _modules()
        if re.search(rf"^\s*class {name}\b", path.read_text(encoding="utf-8"), flags=re.M)
    ]
    assert homes, cls
    where = homes[0]
    if where != "ares_events.errors":
        assert where.removeprefix("ares_events.") in lines[0], (name, where, lines[0])


@pytest.mark.parametrize("name", sorted(_errors_in_package()))
def test_the_errors_page_draws_every_error(name: str) -> None:
    """docs/errors.md's tree names every ``AresError`` subclass of the package once, so a
    user reading the reference meets every error the package can raise."""
    page = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    tree = page.split("```")[1]
    assert len(re.findall(rf"[─└├]\s*{name}\b", tree)) == 1, f"{name} not drawn once"


# a path of this repository in the user documentation: `ares_events/x.py`, `tests/y/z.py`
DOC_PATH = re.compile(r"(?<![\w/.-])((?:ares_events|tests|bench|tools|scripts)/[\w/.-]*\w)")


def test_every_repository_path_the_docs_name_exists() -> None:
    """A path into the package, the tests, the benchmarks or the tools named in the
    README, CONTRIBUTING or docs/ exists (a moved or deleted file is a stale page)."""
    wrong: list[str] = []
    for page in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(ROOT.glob("docs/*.md"))]:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for found in DOC_PATH.findall(line):
                if not (ROOT / found).exists():
                    wrong.append(f"{page.relative_to(ROOT)}:{n}: {found}")
    assert wrong == []
