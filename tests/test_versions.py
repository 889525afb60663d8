"""Every supported Python: what the package promises and what differs between versions."""

from __future__ import annotations

import inspect
import re
import sys
import tomllib
from pathlib import Path

import pytest

from ares_events.archive.reader import ArchiveRecorder
from ares_events.archive.reader_async import AsyncArchiveRecorder
from ares_events.core import recorder, recorder_async
from ares_events.stores.cache import CachedRecorder
from ares_events.stores.threaded import ThreadedRecorder

ROOT = Path(__file__).resolve().parent.parent


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def test_classifiers_name_every_supported_python_and_only_those() -> None:
    """The trove classifiers list 3.11 and every minor version after it up to the newest
    listed, with no gap, and requires-python starts at the oldest."""
    project = _project()
    minors = sorted(
        int(m.group(1))
        for c in project["classifiers"]  # type: ignore[attr-defined]
        if (m := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c))
    )
    assert minors[0] == 11
    assert minors == list(range(minors[0], minors[-1] + 1))
    assert project["requires-python"] == f">=3.{minors[0]}"
    assert minors[-1] >= 13


def test_the_readme_says_which_pythons_are_supported() -> None:
    """The README names the supported range the classifiers give."""
    minors = [
        c.rsplit(".", 1)[1]
        for c in _project()["classifiers"]  # type: ignore[attr-defined]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    text = (ROOT / "README.md").read_text()
    assert f"CPython 3.{minors[0]} to 3.{minors[-1]}" in text


def _protocol_methods(module: object) -> set[str]:
    names: set[str] = set()
    for proto in [module.AsyncRecorder if module is recorder_async else module.Recorder]:  # type: ignore[attr-defined]
        names |= {n for n in vars(proto) if not n.startswith("_")}
    for proto in module.REQUIRES.values():  # type: ignore[attr-defined]
        names |= {n for n in vars(proto) if not n.startswith("_")}
    return names


@pytest.mark.parametrize(
    ("wrapper", "face"),
    [
        (ArchiveRecorder, recorder),
        (CachedRecorder, recorder),
        (AsyncArchiveRecorder, recorder_async),
        (ThreadedRecorder, recorder_async),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_a_wrapper_defines_every_method_it_forwards(wrapper: type, face: object) -> None:
    """A recorder wrapper defines each method of the recorder protocols on its class (no
    ``__getattr__`` forwarding): from Python 3.12 on, ``isinstance`` against a
    runtime-checkable protocol looks methods up statically, so a forwarded method is
    invisible to the capability check and the store does not open."""
    assert "__getattr__" not in vars(wrapper)
    missing = sorted(
        n
        for n in _protocol_methods(face)
        if n != "capabilities" and inspect.getattr_static(wrapper, n, None) is None
    )
    assert missing == []


def test_this_interpreter_is_a_supported_one() -> None:
    """The suite runs on a Python the package supports (CI runs it on both ends)."""
    assert sys.version_info >= (3, 11)
