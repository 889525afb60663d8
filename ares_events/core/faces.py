"""Which face a module is: ``if ASYNC:`` marks what only the asyncio face does.

An asyncio source module (``x_async.py``) writes what differs between the faces as::

    if ASYNC:
        ...              # the asyncio face
    else:
        ...              # the blocking face

``tools/async_to_sync.py`` keeps the ``else`` branch (or nothing) in the generated
blocking module, and mypy (``always_true = ["ASYNC"]``) checks each branch in its own
module only.

It may import nothing from the package.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ASYNC"]

ASYNC: Final = True
"""True in the asyncio sources; the generated blocking modules have no such test."""
