"""Projections: folds of the log (:mod:`~ares_events.projections.base`, the built-in
ones), the catch-up runner and read models, verified replay and recovery, the verifiable
log (:mod:`.merkle`) and :mod:`.erasure`.

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
