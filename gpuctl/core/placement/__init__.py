"""Memory-aware placement: the model (`model`, re-exported here), the engine (`engine.plan`), the
plan it returns (`plan`: a value to print, save, diff and apply later) and its text (`render`),
the fit primitives (`fit`), the scoring policies (`policies`) and the fragmentation measure
(`fragmentation`) they and consolidation share.

Pure and deterministic: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from gpuctl.core.placement.model import (
    Allocation,
    Card,
    FleetState,
    JobRequest,
    JobShape,
    LabelRequirement,
    PlacementNode,
    Settings,
    Tier,
    model_matches,
)

__all__ = [
    "Allocation",
    "Card",
    "FleetState",
    "JobRequest",
    "JobShape",
    "LabelRequirement",
    "PlacementNode",
    "Settings",
    "Tier",
    "model_matches",
]
