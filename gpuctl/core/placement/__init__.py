"""Memory-aware placement: the model (`model`), the engine (`engine.plan`) and its explanations.

Pure and deterministic: no I/O, no clock, no randomness. The plan value lives in
`gpuctl.core.plan`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from gpuctl.core.placement.engine import plan as plan

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
    "plan",
]


def __getattr__(name: str) -> Any:
    # The engine imports gpuctl.core.plan, which imports the model above: load it on first use.
    if name == "plan":
        from gpuctl.core.placement.engine import plan

        return plan
    raise AttributeError(name)
