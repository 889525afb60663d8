"""Old module paths (before the per-layer folders of issue 16) still import, with a warning."""

from __future__ import annotations

import importlib
import sys

import pytest

import ares_events as ae
from ares_events._compat import MOVED


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_old_path_is_the_new_module_with_a_warning(
    old: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing an old path warns (naming the new path) and gives the new module object."""
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated.*moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new]


def test_import_statement_of_old_journal_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import ares_events.journal` is ares_events.agents.journal, with a DeprecationWarning."""
    monkeypatch.delitem(sys.modules, "ares_events.journal", raising=False)
    with pytest.warns(DeprecationWarning, match="ares_events.agents.journal"):
        import ares_events.journal as old_journal  # type: ignore[import-not-found]  # alias
    import ares_events.agents.journal as new_journal

    assert old_journal is new_journal
    assert old_journal.Journal is ae.Journal


def test_old_replay_path_keeps_the_public_replay_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the old module ares_events.replay does not rebind ae.replay (the function)."""
    monkeypatch.delitem(sys.modules, "ares_events.replay", raising=False)
    with pytest.warns(DeprecationWarning):
        from ares_events.replay import (  # type: ignore[import-not-found]  # alias
            ReplayResult,
            replay,
        )
    assert replay is ae.replay
    assert ReplayResult is ae.ReplayResult
    assert callable(ae.replay)


def test_assigning_a_package_attribute_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """The package's import guard lets ordinary assignments (monkeypatching) through."""

    def fake_replay() -> None:
        """A stand-in."""

    monkeypatch.setattr(ae, "replay", fake_replay)
    assert vars(ae)["replay"] is fake_replay


def test_unknown_old_name_is_still_an_import_error() -> None:
    """A name that never existed is ModuleNotFoundError, not an alias."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ares_events.no_such_module")
