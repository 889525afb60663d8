"""Old module paths, kept working for one release after the modules moved (issue 16).

``import ares_events.journal`` (or any old path in :data:`MOVED`) imports the module's
new home, registers it under the old name too (the same module object, so
``ares_events.journal is ares_events.agents.journal``) and emits a
:class:`DeprecationWarning` naming the new path. Nothing is imported until an old path
is used. ``ares_events/__init__.py`` calls :func:`install` once; the old paths go away in
the next release.

It imports nothing from the package at import time (targets are imported by name when an
old path is used); as part of the top layer it may import anything.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

__all__ = ["MOVED", "install"]

MOVED: Final[Mapping[str, str]] = MappingProxyType(
    {
        "ares_events.benchmark": "ares_events.cli.bench",
        "ares_events.catalog": "ares_events.core.catalog",
        "ares_events.cli_demo": "ares_events.cli.demo",
        "ares_events.cli_state": "ares_events.cli.state",
        "ares_events.demo": "ares_events.agents.demo",
        "ares_events.events": "ares_events.core.events",
        "ares_events.journal": "ares_events.agents.journal",
        "ares_events.recovery": "ares_events.projections.recovery",
        "ares_events.projections.replay": "ares_events.projections.recovery",
        "ares_events.replay": "ares_events.projections.recovery",
        "ares_events.resurrection": "ares_events.agents.resurrection",
        "ares_events.settings": "ares_events.stores.settings",
        "ares_events.integrity.chain": "ares_events.chain",
        "ares_events.snapshots": "ares_events.core.snapshots",
        "ares_events.store": "ares_events.core.store",
        "ares_events.stores.s3": "ares_events.stores.blobs.s3",
        "ares_events.stores.snapshots": "ares_events.core.snapshots",
        "ares_events.supervision": "ares_events.agents.supervision",
    }
)
"""Old module path -> new module path."""


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path by importing its new home and registering it under both names."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        """Use the default module object; :meth:`exec_module` replaces it."""

    def exec_module(self, module: types.ModuleType) -> None:
        """Warn, import the new module, and put it in ``sys.modules`` under the old name.

        The import system returns whatever ``sys.modules`` holds under the name once this
        returns, so the importer gets the new module itself, not a copy.
        """
        old = module.__name__
        # stacklevel=2 names the importing line: warnings skips importlib's own frames.
        warnings.warn(
            f"{old} is deprecated: the module moved to {self.target}; import it from there "
            "(the old path goes away in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        sys.modules[old] = importlib.import_module(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` (and nothing else)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path, None for every other name."""
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


class _Package(types.ModuleType):
    """Module type of ``ares_events``: loading an old path never rebinds a public name.

    After loading ``ares_events.X`` the import system sets attribute ``X`` on the package
    to the module. For ``ares_events.replay`` that would replace the public function
    ``ae.replay`` with the module ``projections.replay``; that one binding is skipped.
    Every other assignment (a test's monkeypatch, say) goes through.
    """

    def __setattr__(self, name: str, value: object) -> None:
        target = MOVED.get(f"{self.__name__}.{name}")
        if (
            target is not None
            and value is sys.modules.get(target)
            and not isinstance(self.__dict__.get(name, value), types.ModuleType)
        ):
            return
        super().__setattr__(name, value)


def install() -> None:
    """Put the old-path finder first on ``sys.meta_path`` (once) and guard the package."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
    package = sys.modules[__name__.rpartition(".")[0]]
    if not isinstance(package, _Package):
        package.__class__ = _Package
