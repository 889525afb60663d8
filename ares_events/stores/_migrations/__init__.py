"""Ordered, append-only schema migrations for the SQL backends: one list per backend.
Index ``i`` migrates version ``i`` to ``i+1``; never edit a released step.

The lists are plain data: they may import nothing from the package.
"""
