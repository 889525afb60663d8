"""The archive: old events moved out of the database into immutable segment objects on
a blob store (``s3://`` or ``file://``), and read back through the store.

What lives here: the formats (:mod:`.segment`: segments, manifests, the segment index), the
reader side (:mod:`.source`: segment index, manifests and checked blocks, cached;
:mod:`.reader_async` and its generated twin :mod:`.reader`: the recorder that reads
through the archive) and the rewrite of a segment for an erasure (:mod:`.erase`). The
archive *run* (sealing segments, deleting rows) verifies chains and Merkle roots, so it
lives above, in :mod:`ares_events.archive.job`.

It may import the core, :mod:`ares_events.errors`, :mod:`ares_events.chain` and the blob
stores; never verification, projections, the CLI or an integration.
"""
