"""Cordon, uncordon and drain of several nodes at once: one plan for the lot (`NodeBatch`, the
value of an `ActionPlan`), one confirmation, then each node in turn, its outcome a value
(`NodeOutcome`): a node that fails does not stop the others, and the result says which did what.
Node lists in the text are folded (`gpu[01-04,07]`). With one node the text and the messages
are what the single node did."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuctl.config.hostlist import fold
from gpuctl.core.jobs.migration import DEFAULT_TIMEOUT_S
from gpuctl.core.jobs.model import Cordon
from gpuctl.core.timefmt import duration
from gpuctl.errors import GpuctlError, StalePlan
from gpuctl.ops.action_plans import ActionPlan, ActionRefused, Applied, Progress
from gpuctl.ops.slurm import SlurmDrains

if TYPE_CHECKING:
    from gpuctl.ops.actions._fleet import FleetActions
    from gpuctl.ops.moves.nodeops import DrainPlan, DrainResult


@dataclasses.dataclass(frozen=True, slots=True)
class DrainOrder:
    """A drain plan and how to carry it out (`nodeops.drain`'s waits and pace)."""

    plan: DrainPlan
    grace_s: float | None = None  # None: each job's own grace
    checkpoint_wait_s: float | None = None  # None: the grace
    timeout_s: float = DEFAULT_TIMEOUT_S
    parallel: int = 2


@dataclasses.dataclass(frozen=True, slots=True)
class NodeOutcome:
    """What the action did on one node: `outcome` is cordoned, uncordoned, drained, left_jobs
    (a drain left some there) or failed; `ok` False for the last two."""

    node: str
    outcome: str
    message: str
    ok: bool
    drain: DrainResult | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "node": self.node,
            "outcome": self.outcome,
            "ok": self.ok,
            "message": self.message,
        }
        if self.drain is not None:
            d.update({k: v for k, v in self.drain.to_dict().items() if k != "node"})
        return d


@dataclasses.dataclass(frozen=True, slots=True)
class NodeBatch:
    """The plan of one action over `nodes`: the cordons there now (uncordon lifts them, cordon
    replaces them), the nodes an uncordon skips (not cordoned), a drain's orders."""

    action: str
    nodes: tuple[str, ...]
    cordons: tuple[Cordon, ...] = ()
    skipped: tuple[str, ...] = ()
    drains: tuple[DrainOrder, ...] = ()
    versions: Mapping[str, int] = dataclasses.field(default_factory=dict)  # cordon versions seen

    def version(self, node: str) -> int:
        return self.versions.get(node, 0)


def plan_batch(
    actions: FleetActions,
    action: str,
    nodes: Sequence[str],
    reason: str | None = None,
    *,
    grace_s: float | None = None,
    checkpoint_wait_s: float | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    parallel: int = 2,
) -> ActionPlan:
    names = tuple(nodes)
    if not names:
        raise ActionRefused(f"{action} needs a node")
    for node in names:
        actions.known(node)
    with actions.open_store(False) as store:
        seen = {n: v.version for n, v in store.node_versions().items() if n in names}
        there = {c.node: c for c in store.cordons()}
    cordons = tuple(there[n] for n in names if n in there)
    target = fold(names)
    if action == "cordon":
        text = _cordon_text(actions, names, reason or "", cordons)
        batch = NodeBatch("cordon", names, cordons, versions=seen)
        return ActionPlan("cordon", target, text, reason, batch)
    if action == "uncordon":
        skipped = tuple(n for n in names if n not in there)
        batch = NodeBatch(
            "uncordon", tuple(c.node for c in cordons), cordons, skipped, versions=seen
        )
        return ActionPlan(
            "uncordon", target, _uncordon_text(names, batch), None, batch, bool(cordons)
        )
    if action == "drain":
        from gpuctl.ops.moves import nodeops

        snapshot = actions.fleet_reader().gather(actions.inventory)
        with actions.open_store(False) as store:
            loop = actions.loop(store, dry_run=True)
            plans = nodeops.plan_drains(nodeops.tick(loop, snapshot), names, reason=reason or "")
        orders = tuple(
            DrainOrder(p, grace_s, checkpoint_wait_s, timeout_s, parallel) for p in plans
        )
        texts = [drain_text(p) for p in plans]
        if len(plans) > 1:
            movable = sum(len(p.movable) for p in plans)
            jobs = sum(len(p.moves) for p in plans)
            slurms = sum(len(p.left_to_slurm) for p in plans)
            theirs = f" ({slurms} of Slurm's left to Slurm)" if slurms else ""
            texts.insert(
                0,
                f"drain {target} ({len(names)} nodes): {reason}\n"
                f"cordon them all, then move {movable} of {jobs} job(s) off them, node by node"
                + theirs,
            )
        batch = NodeBatch("drain", names, cordons, drains=orders, versions=seen)
        return ActionPlan("drain", target, "\n\n".join(texts), reason, batch)
    raise ActionRefused(f"unknown action {action!r}")


def carry_out_batch(
    actions: FleetActions, plan: ActionPlan, progress: Progress | None = None
) -> Applied:
    from gpuctl.ops.moves import nodeops

    batch: NodeBatch = plan.value
    outcomes: list[NodeOutcome] = []
    with actions.open_store(True) as store:
        if batch.action == "cordon":
            for node in batch.nodes:
                try:
                    done = nodeops.cordon(
                        store, node, reason=plan.reason or "", operator=actions.operator,
                        clock=actions.clock, expect_version=batch.version(node),
                        slurm=SlurmDrains.of(actions.inventory),
                    )  # fmt: skip
                    said = f"{node} cordoned by {done.operator}: {done.reason}"
                    outcomes.append(NodeOutcome(node, "cordoned", said, True))
                except GpuctlError as exc:
                    outcomes.append(NodeOutcome(node, "failed", exc.message, False))
            ok = [o.node for o in outcomes if o.ok]
            said = f"{fold(ok)} cordoned by {actions.operator}: {plan.reason}" if ok else ""
            return _applied(said, outcomes)
        if batch.action == "uncordon":
            was = {c.node: c for c in batch.cordons}
            for node in batch.nodes:
                try:
                    lifted = nodeops.uncordon(
                        store,
                        node,
                        operator=actions.operator,
                        clock=actions.clock,
                        expect_version=batch.version(node),
                        slurm=SlurmDrains.of(actions.inventory),
                    )
                    before = lifted or was.get(node)
                    what = (
                        "" if before is None else f" (was: {before.reason}, by {before.operator})"
                    )
                    outcomes.append(
                        NodeOutcome(node, "uncordoned", f"{node} uncordoned{what}", True)
                    )
                except GpuctlError as exc:
                    outcomes.append(NodeOutcome(node, "failed", exc.message, False))
            ok = [o.node for o in outcomes if o.ok]
            if len(outcomes) == 1:
                return _applied(outcomes[0].message if ok else "", outcomes)
            return _applied(f"{fold(ok)} uncordoned" if ok else "", outcomes)
        return _drain(actions, store, batch, progress)


def _drain(
    actions: FleetActions, store: Any, batch: NodeBatch, progress: Progress | None
) -> Applied:
    from gpuctl.ops.actions._fleet import reporter
    from gpuctl.ops.moves import nodeops
    from gpuctl.ops.parts import sleep_of

    loop = actions.loop(store, dry_run=False)
    written = {}  # every node first: no job moves onto a node drained after it
    outcomes: list[NodeOutcome] = []
    for order in batch.drains:
        node = order.plan.node
        try:
            written[node] = nodeops.cordon(
                store, node, reason=order.plan.reason, operator=actions.operator,
                clock=actions.clock, expect_version=order.plan.node_version,
                slurm=SlurmDrains.of(actions.inventory),
            )  # fmt: skip
        except StalePlan as exc:  # another operator's cordon since the plan: not drained here
            outcomes.append(NodeOutcome(node, "failed", exc.message, False))
    moved = total = 0
    for order in batch.drains:
        node = order.plan.node
        if node not in written:
            continue
        try:
            result = nodeops.drain(
                loop,
                order.plan,
                operator=actions.operator,
                grace_s=order.grace_s,
                checkpoint_wait_s=order.checkpoint_wait_s,
                timeout_s=order.timeout_s,
                parallel=order.parallel,
                on_result=reporter(progress),
                sleep=sleep_of(actions.clock),
                cordoned=written[node],
            )
        except GpuctlError as exc:
            outcome = NodeOutcome(node, "failed", f"{node}: {exc.message}", False)
        else:
            n = sum(1 for r in result.results if r.moved)
            moved, total = moved + n, total + len(result.results)
            said = f"{node}: {n} of {len(result.results)} job(s) moved; cordoned"
            what = "drained" if result.complete else "left_jobs"
            outcome = NodeOutcome(node, what, said, result.complete, result)
        outcomes.append(outcome)
        if progress is not None and len(batch.drains) > 1:
            progress(outcome.message)
    if len(outcomes) == 1:  # one node: what it did, or why not
        return _applied(outcomes[0].message, outcomes)
    said = f"{fold(list(written))}: {moved} of {total} job(s) moved; cordoned" if written else ""
    failed = [o.node for o in outcomes if o.outcome == "failed"]
    if failed and said:
        said += f"; failed on {fold(failed)}"
    left = [o.node for o in outcomes if o.outcome == "left_jobs"]
    if left:
        said += f"; jobs left on {fold(left)}"
    return _applied(said, outcomes)


def _applied(said: str, outcomes: list[NodeOutcome]) -> Applied:
    bad = [o for o in outcomes if not o.ok]
    if bad and not said:
        said = "; ".join(o.message for o in bad)
    return Applied(said, tuple(outcomes), complete=not bad)


def _cordon_text(
    actions: FleetActions, names: tuple[str, ...], reason: str, cordons: tuple[Cordon, ...]
) -> str:
    one = len(names) == 1
    which = names[0] if one else f"{fold(names)} ({len(names)} nodes)"
    lines = [
        f"cordon {which}: no new work lands there; running jobs stay.",
        f"  reason:   {reason}",
        f"  operator: {actions.operator} (source: operator)",
    ]
    lines += [
        f"  replaces: {'' if one else f'{c.node}: '}the cordon by {c.operator} ({c.source}): "
        f"{c.reason}"
        for c in cordons
    ]
    return "\n".join(lines)


def _uncordon_text(names: tuple[str, ...], batch: NodeBatch) -> str:
    if not batch.cordons:
        if len(names) == 1:
            return f"uncordon {names[0]}: it is not cordoned; nothing to do."
        return f"uncordon {fold(names)}: none is cordoned; nothing to do."
    if len(names) == 1:
        c = batch.cordons[0]
        return (
            f"uncordon {c.node}: new work may land there again.\n"
            f"  lifts:    the cordon by {c.operator} ({c.source}): {c.reason}"
        )
    lines = [f"uncordon {fold(batch.nodes)}: new work may land there again."]
    lines += [
        f"  lifts:    {c.node}: the cordon by {c.operator} ({c.source}): {c.reason}"
        for c in batch.cordons
    ]
    if batch.skipped:
        lines.append(f"  skips:    {fold(batch.skipped)} (not cordoned)")
    return "\n".join(lines)


def drain_text(plan: DrainPlan) -> str:
    """The drain plan as `gpuctl drain` prints it and the dashboard's confirm dialog shows it:
    each job on the node and where it goes; the jobs Slurm runs there are Slurm's."""
    cordon = (
        "not cordoned yet"
        if plan.cordon is None
        else f"cordoned by {plan.cordon.operator} ({plan.cordon.source}): {plan.cordon.reason}"
    )
    slurms = ""
    if plan.left_to_slurm:
        jobs = ", ".join(f"{j} (Slurm job {s})" for j, s in plan.left_to_slurm)
        slurms = (
            f"\nleft to Slurm: {jobs}: Slurm's jobs are Slurm's to move (its drain of the node "
            "lets them finish); gpuctl moves none"
        )
    if not plan.moves:
        none = "no jobs gpuctl runs" if plan.left_to_slurm else "no jobs"
        return f"drain {plan.node}: {plan.reason} ({cordon})\n{none} on the node{slurms}"
    head = (
        f"drain {plan.node}: {plan.reason} ({cordon})\n"
        f"cordon it, then move {len(plan.movable)} of {len(plan.moves)} job(s) off it "
        "(checkpoint, stop, restart there from the checkpoint)"
    )
    rows = []
    for m in plan.moves:
        ckpt = "none"
        if m.checkpoint_step is not None:
            age = "" if m.checkpoint_age_s is None else f", {duration(m.checkpoint_age_s)} old"
            ckpt = f"step {m.checkpoint_step}{age}"
        to = m.to_node or f"stays: {m.why_not}"
        cards = ",".join(str(c) for c in m.to_cards) or "-"
        rows.append([m.job_id, str(m.incarnation), ",".join(map(str, m.cards)), to, cards, ckpt])
    table = _table(["JOB", "INC", "CARDS", "TO", "CARDS", "CHECKPOINT"], rows)
    return f"{head}\n{table}{slurms}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: columns padded to their widest cell, trailing blanks stripped."""
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in (head, *rows)
    )
