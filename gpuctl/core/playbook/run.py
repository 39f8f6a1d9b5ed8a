"""A playbook run, pure: what each unit did (`StepResult`, with a `NodeResult` per node of a node
step) and the run's state machine: the journal (`Journal`: which units are done and how, which
nodes failed; what a crashed run resumes from), which nodes are still in play, and when the run
must stop (`max_fail_percentage`). No I/O, no clock: times come in as arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpuctl.core.playbook.model import Settings, Unit

OUTCOMES = ("ok", "changed", "skipped", "failed")
JOURNAL_SCHEMA = 1


# --- results -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class NodeResult:
    node: str
    outcome: str  # ok, changed, skipped, failed
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "outcome": self.outcome, "message": self.message}


@dataclasses.dataclass(frozen=True, slots=True)
class StepResult:
    key: str
    batch: int
    step: int
    kind: str
    title: str
    outcome: str
    message: str
    nodes: tuple[NodeResult, ...] = ()
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    earlier: bool = False  # done by the run this one resumed; skipped now

    @property
    def failed_nodes(self) -> tuple[str, ...]:
        return tuple(r.node for r in self.nodes if r.outcome == "failed")

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "batch": self.batch,
            "step": self.step,
            "kind": self.kind,
            "title": self.title,
            "outcome": self.outcome,
            "message": self.message,
            "earlier": self.earlier,
            "nodes": [r.to_dict() for r in self.nodes],
            "data": dict(self.data),
        }


def aggregate(results: Sequence[NodeResult]) -> str:
    """A node step's outcome: failed if any node failed, changed if any changed, skipped if all
    were skipped (or there were none), else ok."""
    outcomes = {r.outcome for r in results}
    for outcome in ("failed", "changed", "ok"):
        if outcome in outcomes:
            return outcome
    return "skipped"


def step_result(unit: Unit, outcome: str, message: str, **data: Any) -> StepResult:
    """A unit's result as a whole (a fleet step's, or a node step's before its nodes are added)."""
    return StepResult(
        key=unit.key,
        batch=unit.batch,
        step=unit.step.index,
        kind=unit.step.kind,
        title=unit.step.title,
        outcome=outcome,
        message=message,
        data=data,
    )


def node_step_result(
    unit: Unit, results: Sequence[NodeResult], none: str = "no node"
) -> StepResult:
    """A node step's result: its nodes' results, their `aggregate`, and a count of each outcome
    (`none` when there were no nodes)."""
    outcome = aggregate(results)
    counts = {o: sum(1 for r in results if r.outcome == o) for o in OUTCOMES}
    message = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or none
    return dataclasses.replace(step_result(unit, outcome, message), nodes=tuple(results))


# --- the run's journal and state machine ---------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Journal:
    """A run's record: what it planned (the batches), which units are done and how, which nodes
    failed, and its status: running (or crashed), failed (stopped by a failure), done."""

    run_id: str
    playbook: str
    digest: str
    started_at: float
    operator: str
    batches: tuple[tuple[str, ...], ...]
    targets: int
    done: Mapping[str, str] = dataclasses.field(default_factory=dict)  # unit key -> outcome
    failed_nodes: tuple[str, ...] = ()
    health: Mapping[str, str] = dataclasses.field(default_factory=dict)  # node -> verdict
    current: str | None = None  # the unit under way (a crash leaves it set)
    status: str = "running"
    updated_at: float = 0.0

    def start(self, key: str, now: float) -> Journal:
        return dataclasses.replace(self, current=key, updated_at=now)

    def finish(
        self, result: StepResult, now: float, health: Mapping[str, str] | None = None
    ) -> Journal:
        failed = tuple(dict.fromkeys((*self.failed_nodes, *result.failed_nodes)))
        return dataclasses.replace(
            self,
            done={**self.done, result.key: result.outcome},
            failed_nodes=failed,
            health={**self.health, **(health or {})},
            current=None,
            updated_at=now,
        )

    def close(self, status: str, now: float) -> Journal:
        return dataclasses.replace(self, status=status, current=None, updated_at=now)

    def failed_pct(self) -> float:
        return 0.0 if self.targets == 0 else 100.0 * len(self.failed_nodes) / self.targets

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["schema"] = JOURNAL_SCHEMA
        d["batches"] = [list(b) for b in self.batches]
        d["failed_nodes"] = list(self.failed_nodes)
        d["done"], d["health"] = dict(self.done), dict(self.health)
        return d

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Journal:
        """Raises KeyError, TypeError or ValueError on a malformed journal."""
        if data.get("schema") != JOURNAL_SCHEMA:
            raise ValueError(f"not a version {JOURNAL_SCHEMA} journal")
        done = {str(k): str(v) for k, v in dict(data["done"]).items()}
        if any(v not in OUTCOMES for v in done.values()):
            raise ValueError("an outcome is unknown")
        return Journal(
            run_id=str(data["run_id"]),
            playbook=str(data["playbook"]),
            digest=str(data["digest"]),
            started_at=float(data["started_at"]),
            operator=str(data["operator"]),
            batches=tuple(tuple(str(n) for n in b) for b in data["batches"]),
            targets=int(data["targets"]),
            done=done,
            failed_nodes=tuple(str(n) for n in data["failed_nodes"]),
            health={str(k): str(v) for k, v in dict(data.get("health") or {}).items()},
            current=None if data.get("current") is None else str(data["current"]),
            status=str(data["status"]),
            updated_at=float(data.get("updated_at") or 0.0),
        )


def stop_reason(journal: Journal, result: StepResult, settings: Settings) -> str | None:
    """Why the run stops after `result`, or None to go on. A fleet step that failed stops it;
    failed nodes stop it once they are more than `max_fail_percentage` of the targets."""
    if result.outcome != "failed":
        return None
    if not result.nodes:
        return f"step {result.step + 1} ({result.title}) failed: {result.message}"
    pct = journal.failed_pct()
    if pct > settings.max_fail_percentage:
        return (
            f"{len(journal.failed_nodes)} of {journal.targets} target(s) failed "
            f"({pct:.0f}% > max_fail_percentage {settings.max_fail_percentage:g}%)"
        )
    return None


def in_play(nodes: Sequence[str], journal: Journal) -> tuple[str, ...]:
    """A node that failed a step takes no part in the later ones."""
    failed = set(journal.failed_nodes)
    return tuple(n for n in nodes if n not in failed)
