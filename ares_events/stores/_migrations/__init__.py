"""Ordered, append-only schema migrations for the SQL backends.

What lives here: one list per backend (:mod:`~ares_events.stores._migrations.sqlite`,
:mod:`~ares_events.stores._migrations.postgres`). Never edit a released step; add a new
one. Index ``i`` migrates version ``i`` to ``i+1``.

The lists are plain data: they may import nothing from the package.
"""
