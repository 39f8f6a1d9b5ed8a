"""The small, safe expression language of playbook conditions (`when:`, `assert:`, `wait:`): the
names a condition may read and their kinds, the tree, and its evaluation.

    fragmentation_pct > 20
    utilization_pct < 80 and band != "over"
    node.health == "unhealthy" or node.state in ["down", "unknown"]

Names are the fleet numbers (`FLEET_NAMES`) and the facts of a node (`NODE_NAMES`, plus
`node.labels.KEY`). Evaluation: an unknown value (null) makes `<`, `<=`, `>`, `>=` false, so a
condition on a number gpuctl could not measure never fires.

Text becomes a checked `Expr` through the package's `parse` (`_parse`: the grammar, tokenizer and
parser), which type-checks the tree with `_check`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any


class Kind(enum.StrEnum):
    NUMBER = "number"
    TEXT = "text"
    BOOL = "true/false"
    LIST = "list"
    NULL = "null"


@dataclasses.dataclass(frozen=True, slots=True)
class NameInfo:
    kind: Kind
    values: tuple[str, ...] = ()  # the texts a TEXT name may take (empty: any)
    doc: str = ""


_N = NameInfo(Kind.NUMBER)
BANDS = ("idle", "low", "target", "over")
NODE_STATES = ("ready", "cordoned", "draining", "down", "unknown")
HEALTH = ("healthy", "degraded", "unhealthy", "unknown")
REACH = ("ok", "refused", "unreachable", "auth_failed", "host_key", "timeout", "error")

# The fleet numbers (`gpuctl status -o json` "numbers") and the node counts a playbook adds.
FLEET_NAMES: Mapping[str, NameInfo] = {
    "utilization_pct": _N,
    "band": NameInfo(Kind.TEXT, BANDS),
    "allocated_mib": _N,
    "capacity_mib": _N,
    "observed_util_pct": _N,
    "fragmentation_pct": _N,
    "stranded_gib": _N,
    "now": _N,
    "window_s": _N,
    "restart_budget_s": _N,
    "queue_started": _N,
    "queue_wait_p50_s": _N,
    "queue_wait_p95_s": _N,
    "queue_waiting": _N,
    "queue_oldest_wait_s": _N,
    "queue_oldest_job": NameInfo(Kind.TEXT),
    "checkpoint_running_jobs": _N,
    "checkpoint_missing": _N,
    "checkpoint_age_max_s": _N,
    "checkpoint_age_p95_s": _N,
    "checkpoint_oldest_job": NameInfo(Kind.TEXT),
    "failovers_attempted": _N,
    "failovers_succeeded": _N,
    "failovers_pending": _N,
    "failover_success_pct": _N,
    "drain_moves": _N,
    "drain_moves_restarted": _N,
    "preemptions": _N,
    "preemptions_per_hour": _N,
    "spot_jobs": _N,
    "spot_jobs_preempted": _N,
    "spot_preempted_pct": _N,
    "nodes": _N,
    "nodes_ready": _N,
    "nodes_cordoned": _N,
    "nodes_down": _N,
    "nodes_unhealthy": _N,  # null until a health step of this run
    "targets": _N,
}

NODE_NAMES: Mapping[str, NameInfo] = {
    "node.name": NameInfo(Kind.TEXT),
    "node.state": NameInfo(Kind.TEXT, NODE_STATES),
    "node.reach": NameInfo(Kind.TEXT, REACH),
    "node.health": NameInfo(Kind.TEXT, HEALTH),  # null until a health step of this run
    "node.cordoned": NameInfo(Kind.BOOL),
    "node.gpus": _N,
    "node.jobs": _N,
    "node.mem_used_mib": _N,
    "node.mem_total_mib": _N,
    "node.allocated_mib": _N,
    "node.util_pct": _N,
    "node.temp_c": _N,
    "node.groups": NameInfo(Kind.LIST),
}
LABEL_PREFIX = "node.labels."


def name_info(name: str, *, node_facts: bool) -> NameInfo | None:
    if name in FLEET_NAMES:
        return FLEET_NAMES[name]
    if node_facts and name in NODE_NAMES:
        return NODE_NAMES[name]
    if node_facts and name.startswith(LABEL_PREFIX) and len(name) > len(LABEL_PREFIX):
        return NameInfo(Kind.TEXT)
    return None


class ExprError(ValueError):
    """A condition that cannot be read or makes no sense; `column` is 1-based."""

    def __init__(self, message: str, column: int) -> None:
        super().__init__(f"{message} (column {column})")
        self.column = column


# --- the tree ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Lit:
    value: Any  # float, str, bool, None, or a tuple of those


@dataclasses.dataclass(frozen=True, slots=True)
class Name:
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclasses.dataclass(frozen=True, slots=True)
class BoolOp:
    op: str  # "and" | "or"
    operands: tuple[Node, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Compare:
    op: str
    left: Node
    right: Node


Node = Lit | Name | Not | BoolOp | Compare


@dataclasses.dataclass(frozen=True, slots=True)
class Expr:
    """A checked condition: its text, its tree, and whether it reads a node's facts."""

    text: str
    tree: Node
    uses_node: bool

    def __str__(self) -> str:
        return self.text

    def evaluate(self, env: Mapping[str, Any]) -> bool:
        """True or false for `env` (name -> value; a missing name is null)."""
        return _truth(_eval(self.tree, env))

    def names(self) -> tuple[str, ...]:
        out: list[str] = []
        collect_names(self.tree, out)
        return tuple(dict.fromkeys(out))


def collect_names(node: Node, out: list[str]) -> None:
    if isinstance(node, Name):
        out.append(node.name)
    elif isinstance(node, Not):
        collect_names(node.operand, out)
    elif isinstance(node, BoolOp):
        for part in node.operands:
            collect_names(part, out)
    elif isinstance(node, Compare):
        collect_names(node.left, out)
        collect_names(node.right, out)


def show_value(value: Any) -> str:
    """A value as an expression would write it: 20, 12.5, "text", true, null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float | int):
        return f"{value:g}"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    return str(value)


# --- evaluating ----------------------------------------------------------------------------------


def _eval(node: Node, env: Mapping[str, Any]) -> Any:
    if isinstance(node, Lit):
        return node.value
    if isinstance(node, Name):
        value = env.get(node.name)
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, list):
            return tuple(value)
        return value
    if isinstance(node, Not):
        return not _truth(_eval(node.operand, env))
    if isinstance(node, BoolOp):
        if node.op == "and":
            return all(_truth(_eval(p, env)) for p in node.operands)
        return any(_truth(_eval(p, env)) for p in node.operands)
    return _compare(node.op, _eval(node.left, env), _eval(node.right, env))


def _compare(op: str, a: Any, b: Any) -> bool:
    if op == "==":
        return bool(a == b)
    if op == "!=":
        return bool(a != b)
    if op in ("in", "not in"):
        found = isinstance(b, Sequence) and a is not None and a in b
        return found if op == "in" else not found
    if not isinstance(a, float | int) or not isinstance(b, float | int):
        return False  # unknown (null) never satisfies an ordering
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def _truth(value: Any) -> bool:
    return value is True
