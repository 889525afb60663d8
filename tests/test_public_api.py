"""The public surface: ae.__all__, the error tree and typing marker."""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
import types
from pathlib import Path

import pytest

import ares_events as ae
from ares_events import errors


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 "isort-style" order: CONSTANTS, then Classes, then everything else.
    group = 0 if name.isupper() else 1 if name[0].isupper() else 2
    return group, name


def test_all_is_sorted_and_unique() -> None:
    """ae.__all__ is sorted (isort-style, as ruff's RUF022 keeps it) without duplicates."""
    assert list(ae.__all__) == sorted(ae.__all__, key=_isort_key)
    assert len(set(ae.__all__)) == len(ae.__all__)


@pytest.mark.parametrize("name", ae.__all__)
def test_every_public_name_is_importable(name: str) -> None:
    """Each name in ae.__all__ exists and can be imported with from-import."""
    assert hasattr(ae, name)
    ns: dict[str, object] = {}
    exec(f"from ares_events import {name}", ns)
    assert ns[name] is getattr(ae, name)


def test_all_is_complete() -> None:
    """Every public, non-module attribute of ares_events is listed in __all__."""
    missing = [
        name
        for name, obj in vars(ae).items()
        if not name.startswith("_")
        and name != "annotations"  # the __future__ feature, not API
        and not isinstance(obj, types.ModuleType)
        and name not in ae.__all__
    ]
    assert missing == []


def test_public_callables_have_docstrings() -> None:
    """Every public class and function has a docstring."""
    undocumented = [
        name
        for name in ae.__all__
        if (inspect.isclass(getattr(ae, name)) or inspect.isfunction(getattr(ae, name)))
        and not inspect.getdoc(getattr(ae, name))
    ]
    assert undocumented == []


@pytest.mark.parametrize("sub", ["errors", "integrity", "stores"])
def test_subpackage_all_sorted_and_importable(sub: str) -> None:
    """Subpackages' __all__ are sorted and every listed name exists."""
    mod = importlib.import_module(f"ares_events.{sub}")
    names = list(mod.__all__)
    assert names == sorted(names, key=_isort_key)
    for name in names:
        assert hasattr(mod, name), f"ares_events.{sub}.{name}"


@pytest.mark.parametrize("name", errors.__all__)
def test_public_errors_module_and_base(name: str) -> None:
    """Each public error has __module__ 'ares_events' and derives from AresError."""
    cls = getattr(errors, name)
    assert inspect.isclass(cls)
    assert cls.__module__ == "ares_events"
    assert issubclass(cls, errors.AresError)


def test_every_error_class_is_listed() -> None:
    """Every AresError subclass defined in ares_events.errors is in errors.__all__."""
    defined = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, errors.AresError)
    }
    assert defined == set(errors.__all__)


@pytest.mark.parametrize(
    ("child", "parent"),
    [
        ("ConfigError", ValueError),
        ("UnknownSchemeError", errors.ConfigError),
        ("MissingDependencyError", ImportError),
        ("InvalidEvent", ValueError),
        ("StoreUnavailable", errors.StoreError),
        ("StoreUnavailable", ConnectionError),
        ("SchemaVersionError", errors.StoreError),
        ("BlobMissing", errors.BlobError),
        ("BlobCorrupted", errors.BlobError),
    ],
)
def test_error_tree(child: str, parent: type[BaseException]) -> None:
    """The error hierarchy matches the documented tree."""
    assert issubclass(getattr(errors, child), parent)


def test_error_attributes() -> None:
    """Errors built from domain values keep them as attributes and name them."""
    c = errors.ConcurrencyError("s1", 3, 5)
    assert (c.stream_id, c.expected, c.actual) == ("s1", 3, 5)
    assert "'s1'" in str(c)
    r = errors.ReplayCapExceeded("s2", 10, 10)
    assert (r.stream_id, r.cap) == ("s2", 10)
    i = errors.InvalidEvent("payload.x", "is NaN", stream_id="s3", index=2)
    assert (i.field, i.stream_id, i.index) == ("payload.x", "s3", 2)
    assert "payload.x" in str(i)
    assert "'s3'" in str(i)
    u = errors.UnknownSchemeError("nosuch", ["memory", "sqlite"])
    assert "memory" in str(u)


def test_py_typed_ships() -> None:
    """The package carries the PEP 561 py.typed marker."""
    assert importlib.resources.files("ares_events").joinpath("py.typed").is_file()


def test_version() -> None:
    """ae.__version__ is a non-empty string."""
    assert isinstance(ae.__version__, str)
    assert ae.__version__


def test_testing_helpers_are_public() -> None:
    """ares_events.testing exposes StoreContract, which pytest does not collect by name."""
    from ares_events import testing

    assert inspect.isclass(testing.StoreContract)
    assert not testing.StoreContract.__name__.startswith("Test")
    assert any(n.startswith("test_") for n in dir(testing.StoreContract))
    assert callable(testing.run_concurrent_appenders)
    with pytest.raises(AttributeError):
        testing.NoSuchThing  # noqa: B018


def test_import_has_no_side_effects_on_logging() -> None:
    """Importing the package adds no handlers to its loggers."""
    import logging

    for name in ("ares_events", "ares_events.core.store", "ares_events.stores.sqlite"):
        assert not any(
            not isinstance(h, logging.NullHandler) for h in logging.getLogger(name).handlers
        )


def _error_samples() -> list[Exception]:
    from ares_events.agents.journal import (
        InDoubtToolCall,
        ModelCallFailed,
        ReplayDivergence,
        RunNotFound,
        RunNotRunnable,
        RunRefused,
        ToolCallFailed,
    )
    from ares_events.core.catalog import EventSchemaError
    from ares_events.integrity.findings import Finding

    e = ae.errors
    return [
        e.AresError("plain"),
        e.ConfigError("bad option"),
        e.UnknownSchemeError("nope", ["memory", "sqlite"]),
        e.MissingDependencyError("the s3 blob store", "s3"),
        e.InvalidEvent("payload", "NaN", stream_id="s", index=2),
        e.ConcurrencyError("s", 3, 5, "detail"),
        e.StoreError("down"),
        e.StoreUnavailable("gone"),
        e.SchemaVersionError(1, 3, "sqlite:///x.db"),
        e.ChainIntegrityError("s", [Finding("gap", "s", 4, "versions 3..3 are missing")]),
        e.ReplayCapExceeded("s", 10, 10),
        e.BlobMissing("ab" * 32, "not found", stream_id="s", version=1),
        e.BlobCorrupted("ab" * 32, "digest differs"),
        e.SnapshotMismatch("s", "run_state", "state digest mismatch"),
        EventSchemaError("task.created", "task_id: Field required", stream_id="s", version=7),
        RunRefused("run-1", ("r1", "p1"), ("r2", "p2")),
        RunNotRunnable("run-1", "paused", "interrupted"),
        InDoubtToolCall("run-1", "run-1:4", "create_ticket"),
        ReplayDivergence(
            "run-1", 3, "messages differ", path="messages[0]", recorded='"a"', current='"b"'
        ),
        ToolCallFailed("run-1", "run-1:2", "boom", step=2, attempt=1, error_type="Timeout"),
        ModelCallFailed("run-1", 3, 2, "RateLimited", "429"),
        RunNotFound("run-9"),
    ]


@pytest.mark.parametrize("error", _error_samples(), ids=lambda e: type(e).__name__)
def test_errors_pickle_with_their_attributes_and_live_in_the_package(error: Exception) -> None:
    """Every public error is importable from ares_events and survives pickling (worker
    pools, supervisors) with its message and attributes."""
    import pickle

    assert getattr(ae, type(error).__name__) is type(error)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.__dict__ == error.__dict__


def test_every_module_of_the_conformance_suite_gets_pytests_assert_messages(
    tmp_path: Path,
) -> None:
    """The suite is assembled from several modules; each is registered for pytest's
    assertion rewriting before its first import, so a user's failing contract test shows
    the compared values, not a bare AssertionError (run in a fresh pytest process: this
    one may have imported the suite otherwise)."""
    import subprocess
    import sys

    import ares_events.testing as suite_package

    homes = {m for ms in suite_package._REWRITE.values() for m in ms}
    found = {p.stem for p in Path(suite_package.__file__).parent.glob("*.py")}
    assert found - {"__init__", "blocking"} == homes
    test = tmp_path / "test_rewritten.py"
    test.write_text(
        "import sys\n"
        "def test_rewritten():\n"
        "    from ares_events import testing\n"
        "    testing.StoreContract, testing.SnapshotContract\n"
        f"    for m in {sorted(homes)!r}:\n"
        "        loader = sys.modules[f'ares_events.testing.{m}'].__loader__\n"
        "        assert type(loader).__name__ == 'AssertionRewritingHook', m\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
