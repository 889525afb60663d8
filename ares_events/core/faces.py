"""Which face a module is: ``if ASYNC:`` marks what only the asyncio face does;
``tools/async_to_sync.py`` keeps the ``else`` branch in the generated blocking module.

It may import nothing from the package.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ASYNC"]

ASYNC: Final = True
"""True in the asyncio sources; the generated blocking modules have no such test."""
