"""The archive (docs/archive.md): the formats (:mod:`.segment`), the reader side
(:mod:`.source`, :mod:`.reader_async`), the rewrite for an erasure (:mod:`.erase`) and,
above, the archive run (:mod:`ares_events.archive.job`).

It may import the core, :mod:`ares_events.errors`, :mod:`ares_events.chain` and the blob
stores; never verification, projections, the CLI or an integration.
"""
