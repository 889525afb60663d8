"""Projections: folds of the log and what serves them.

What lives here: :mod:`~ares_events.projections.base` (the ``Projection`` protocol,
``fold``), :mod:`~ares_events.projections.builtin` (the built-in folds),
:mod:`~ares_events.projections.runner` and :mod:`~ares_events.projections.tables` (the
catch-up runner, read-model tables, rebuilds), :mod:`~ares_events.projections.recovery`
(verified replay, and recovery: snapshot first, then the tail), :mod:`.merkle` (the
verifiable log) and :mod:`.erasure`.

It may import the core, the stores and integrity (replay checks the chain as it folds);
never the agent runtime, the CLI or an integration.
"""

from __future__ import annotations

from ares_events.projections.base import FoldResult, Projection, SkippedEvent, fold
from ares_events.projections.builtin import (
    AgentStateProjection,
    GenealogyProjection,
    RecoveryStateProjection,
    RunStateProjection,
)
from ares_events.projections.runner import (
    DiffReport,
    ProjectionRunner,
    RebuildReport,
    read_model,
    rebuild,
    verify_rebuild,
)

BUILTIN: dict[str, type] = {
    "agent_state": AgentStateProjection,
    "recovery_state": RecoveryStateProjection,
    "genealogy": GenealogyProjection,
    "run_state": RunStateProjection,
}

__all__ = [
    "BUILTIN",
    "AgentStateProjection",
    "DiffReport",
    "FoldResult",
    "GenealogyProjection",
    "Projection",
    "ProjectionRunner",
    "RebuildReport",
    "RecoveryStateProjection",
    "RunStateProjection",
    "SkippedEvent",
    "fold",
    "read_model",
    "rebuild",
    "verify_rebuild",
]
