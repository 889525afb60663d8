"""The scheme registry: registering a backend, and what a backend that cannot be imported
raises (advice to install an extra only when a dependency is what is missing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.errors import ConfigError, MissingDependencyError, UnknownSchemeError
from ares_events.stores import _registry
from ares_events.stores.memory import MemoryRecorder
from ares_events.stores.sqlite import SQLiteRecorder


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for backend modules; the registry is as it was afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = dict(_registry._targets)
    yield tmp_path
    _registry._targets.clear()
    _registry._targets.update(saved)


def test_a_scheme_is_registered_once_unless_replaced(registry: Path) -> None:
    """register_store refuses to overwrite a scheme without replace=True; with it, the
    scheme resolves to the new target; an unknown scheme names the known ones."""
    ae.register_store("regtest", MemoryRecorder)
    with pytest.raises(ConfigError, match="already registered"):
        ae.register_store("REGTEST", "x:Y")
    ae.register_store("regtest", "ares_events.stores.sqlite:SQLiteRecorder", replace=True)
    assert _registry.resolve("regtest") is SQLiteRecorder
    assert "regtest" in ae.available_schemes()
    with pytest.raises(UnknownSchemeError, match="regtest"):
        _registry.resolve("nosuchscheme")


def test_a_missing_dependency_of_a_plugin_names_the_module_not_an_extra(registry: Path) -> None:
    """A third-party backend module that imports a package which is not installed is a
    MissingDependencyError naming that module: ares-events has no extra for it."""
    (registry / "regtest_needs_dep.py").write_text("import not_installed_pkg_9f1c\n")
    ae.register_store("regdep", "regtest_needs_dep:Recorder")
    with pytest.raises(MissingDependencyError, match="not_installed_pkg_9f1c") as exc:
        _registry.resolve("regdep")
    assert "ares-events[" not in str(exc.value) and exc.value.extra is None
    assert isinstance(exc.value.__cause__, ModuleNotFoundError)


def test_an_installed_plugin_scheme_is_listed_before_any_lookup(
    registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin's entry point (an installed distribution's ``ares_events.stores`` group)
    is in available_schemes() from the start, and resolves."""
    dist = registry / "regplugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: regplugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[ares_events.stores]\nregplug = ares_events.stores.memory:MemoryRecorder\n"
    )
    monkeypatch.setattr(_registry, "_discovered", False)
    assert "regplug" in ae.available_schemes()
    assert _registry.resolve("regplug") is MemoryRecorder


def test_a_broken_import_of_the_package_itself_is_not_advice_to_install(
    registry: Path,
) -> None:
    """When the failing import is of ares_events itself (a bug, a half-upgraded install),
    the ImportError surfaces as it is: telling the user to install an extra they already
    have would send them the wrong way."""
    (registry / "regtest_broken.py").write_text(
        "from ares_events.core.events import no_such_name_9f1c\n"
    )
    ae.register_store("regbroken", "regtest_broken:Recorder")
    with pytest.raises(ImportError, match="no_such_name_9f1c") as exc:
        _registry.resolve("regbroken")
    assert not isinstance(exc.value, MissingDependencyError)
