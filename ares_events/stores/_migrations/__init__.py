"""Ordered, append-only schema migrations for the SQL backends.

Never edit a released step; add a new one. Index ``i`` migrates version ``i`` to ``i+1``.
"""
