"""The agent runtime: the write-ahead run journal (``journal``), looking at and operating runs
(``runs``), process supervision (``supervision``), their telemetry and the demos
(docs/architecture.md maps the modules).

It may import the core, the stores, integrity and projections (everything below it). The
core never imports the runtime; the CLI and integrations sit above it.
"""
