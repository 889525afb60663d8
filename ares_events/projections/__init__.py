"""Projections: the protocol, built-in folds, the catch-up runner and rebuilds."""

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
