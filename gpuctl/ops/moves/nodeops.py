"""Cordon, uncordon and drain a node.

- `cordon`: no new work lands on the node (the store refuses to grant its cards from the moment
  the cordon commits); running jobs stay. Records reason, operator, time and source.
- `uncordon`: lifts it. With `source="health"` (gpuctl itself, after a cool-down) only a cordon
  whose source is `health` is lifted, never one a person put there.
- `plan_drain`: each job on the node -> a target (node and cards), or why none; a value that
  prints as a table or JSON, computed without changing anything. The jobs Slurm runs there
  (`submit --backend slurm`) are Slurm's to move: listed apart, never moved (the node's drain in
  Slurm lets them finish).
- `drain`: cordon, then move each job with the migration primitive (`gpuctl.ops.moves.migrate`),
  a few at a time, within an overall timeout.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuctl.adapters.protocols import Clock, Store
from gpuctl.core.health.autodrain import HEALTH_SOURCE
from gpuctl.core.jobs.migration import DEFAULT_TIMEOUT_S, Source
from gpuctl.core.jobs.model import Cordon, Event, IncarnationState, JobState, is_slurm_run
from gpuctl.core.model import FleetSnapshot, Reach
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.model import Allocation, FleetState
from gpuctl.core.placement.plan import apply_plan
from gpuctl.errors import PlanError, UsageError
from gpuctl.ops.loop.launch import fleet_state, placement_request
from gpuctl.ops.loop.model import Pass
from gpuctl.ops.moves import migrate
from gpuctl.ops.moves.migrate import MigrationRequest, MigrationResult, Target
from gpuctl.ops.slurm import SlurmDrains

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import LoopState

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_REASON = 500


def _check(node: str, reason: str | None = None) -> None:
    if not NAME.match(node):
        raise UsageError(f"{node!r} is not a node name (letters, digits, . _ -; 64 at most)")
    if reason is not None and not reason.strip():
        raise UsageError("--reason must say why (it is recorded with the cordon)")
    if reason is not None and len(reason) > MAX_REASON:
        raise UsageError(f"--reason is {len(reason)} characters; {MAX_REASON} at most")


def cordon(
    store: Store,
    node: str,
    *,
    reason: str,
    operator: str,
    clock: Clock,
    source: str = Source.OPERATOR.value,
    expect_version: int | None = None,
    slurm: SlurmDrains | None = None,
) -> Cordon:
    """Cordon `node` (a cordon already there is replaced: the newest reason, operator and source
    win). Returns the cordon written. `expect_version`: the node's cordon version the plan saw
    (StoreConflict saying what changed, and nothing written, when it is not the store's now).
    `slurm`: a Slurm-managed node is drained in Slurm too, once the store holds the cordon
    (SlurmError when Slurm refuses: the cordon stays)."""
    _check(node, reason)
    now = clock.now()
    written = Cordon(node, reason.strip(), operator, source, now)
    store.cordon(
        written,
        Event(
            now,
            operator,
            "cordon",
            f"{node} cordoned by {operator}: {written.reason}; no new work lands there",
            node=node,
            data={"source": source, "reason": written.reason},
        ),
        expect_version=expect_version,
    )
    if slurm is not None:
        slurm.drain(node, written.reason)
    return written


def uncordon(
    store: Store,
    node: str,
    *,
    operator: str,
    clock: Clock,
    source: str = Source.OPERATOR.value,
    expect_version: int | None = None,
    slurm: SlurmDrains | None = None,
) -> Cordon | None:
    """Lift `node`'s cordon; the cordon lifted (None: there was none). With source `health`
    only a health cordon is lifted (`StoreConflict` for a person's). `expect_version`: as
    `cordon`'s. `slurm`: a Slurm-managed node is resumed in Slurm too, only while the drain
    Slurm holds is gpuctl's (SlurmError naming the operator's drain, and nothing lifted)."""
    _check(node)
    if slurm is not None:
        slurm.check_resume(node)
    now = clock.now()
    before = {c.node: c for c in store.cordons()}.get(node)
    what = f" ({before.reason}, by {before.operator})" if before is not None else ""
    lifted = store.uncordon(
        node,
        Event(
            now,
            operator,
            "uncordon",
            f"{node} uncordoned by {operator}{what}",
            node=node,
            data={"source": source},
        ),
        expect_source=HEALTH_SOURCE if source == HEALTH_SOURCE else None,
        expect_version=expect_version,
    )
    if slurm is not None:
        slurm.resume(node)  # the reason read again, at the moment of the resume
    return lifted


# --- the drain plan ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Move:
    """One job on the node, and where it goes (or why it cannot)."""

    job_id: str
    job_name: str
    incarnation: int
    cards: tuple[int, ...]
    mib_per_card: int
    whole: bool
    to_node: str | None = None
    to_cards: tuple[int, ...] = ()
    to_mib_per_card: int = 0  # the slice there (a whole card: that card's capacity)
    why_not: str | None = None
    checkpoint_step: int | None = None
    checkpoint_age_s: float | None = None
    job_version: int | None = None  # the job's version the plan saw (a move refuses a newer one)

    @property
    def target(self) -> Target | None:
        if self.to_node is None:
            return None
        mib = self.to_mib_per_card or self.mib_per_card
        return Target(Allocation(self.job_id, self.to_node, self.to_cards, mib, self.whole))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cards"], d["to_cards"] = list(self.cards), list(self.to_cards)
        return d


@dataclasses.dataclass(frozen=True, slots=True)
class DrainPlan:
    node: str
    reason: str
    moves: tuple[Move, ...]
    cordon: Cordon | None  # the node's cordon when the plan was made (None: not cordoned)
    taken_at: float
    version: str
    node_version: int = 0  # the node's cordon version the plan saw (the drain's cordon expects it)
    # the jobs Slurm runs on the node (job id, Slurm job id): Slurm's to move, not in `moves`
    left_to_slurm: tuple[tuple[str, str], ...] = ()

    @property
    def movable(self) -> tuple[Move, ...]:
        return tuple(m for m in self.moves if m.to_node is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "reason": self.reason,
            "taken_at": self.taken_at,
            "version": self.version,
            "node_version": self.node_version,
            "cordon": None if self.cordon is None else dataclasses.asdict(self.cordon),
            "moves": [m.to_dict() for m in self.moves],
            "movable": len(self.movable),
            "stuck": len(self.moves) - len(self.movable),
            "left_to_slurm": [{"job_id": j, "slurm_job_id": s} for j, s in self.left_to_slurm],
        }


def plan_drain(p: Pass, node: str, *, reason: str) -> DrainPlan:
    """Each job holding cards on `node` -> a target, as if the node were cordoned already.
    Changes nothing. `p` carries the gather (`p.snapshot`) and the store."""
    return plan_drains(p, (node,), reason=reason)[0]


def plan_drains(p: Pass, nodes: Sequence[str], *, reason: str) -> tuple[DrainPlan, ...]:
    """One plan per node of `nodes`, made together: every one of them is taken as cordoned, so
    no job moves onto another node being drained, and the moves planned for one node take their
    room before the next node's jobs are placed. Changes nothing."""
    for node in nodes:
        _check(node, reason)
        if node not in p.specs:
            raise UsageError(f"unknown node {node!r}", hint="see `gpuctl inventory list`")
    if len(set(nodes)) != len(nodes):
        raise UsageError("a node is listed twice")
    draining = set(nodes)
    state, _ = fleet_state(p)
    state = dataclasses.replace(
        state,
        nodes=tuple(
            dataclasses.replace(n, schedulable=False, reason="being drained")
            if n.name in draining
            else n
            for n in state.nodes
        ),
    )
    plans = []
    cordons = {c.node: c for c in p.store.cordons()}
    versions = p.store.node_versions()
    for node in nodes:
        moves, slurms, state = _plan_moves(p, node, state)
        seen = versions[node].version if node in versions else 0
        cordon = cordons.get(node)
        version = p.snapshot.version
        plans.append(DrainPlan(node, reason, tuple(moves), cordon, p.now, version, seen, slurms))
    return tuple(plans)


def _plan_moves(
    p: Pass, node: str, state: FleetState
) -> tuple[list[Move], tuple[tuple[str, str], ...], FleetState]:
    """The moves of `node`'s jobs on `state`, the jobs Slurm runs there (left to Slurm), and
    `state` with the moves' targets taken."""
    jobs = {j.id: j for j in p.store.jobs()}
    moving = {r.job_id: r for r in p.store.reservations()}
    settings = dataclasses.replace(p.settings.placement, band_max=1.0, headroom=0.0)
    moves: list[Move] = []
    incs = sorted(
        p.store.incarnations(node=node, holding=True),
        key=lambda i: (-(jobs[i.job_id].priority if i.job_id in jobs else 0), i.job_id),
    )
    seen = p.snapshot.node(node)
    silent = None
    if seen is None or seen.reach is not Reach.OK:
        how = "did not answer" if seen is None else f"did not answer ({seen.reach.value})"
        silent = f"{node} {how}: its jobs cannot be asked to checkpoint; failover restarts them"
    slurms: list[tuple[str, str]] = []
    for inc in incs:
        job = jobs.get(inc.job_id)
        if job is None:
            continue
        if is_slurm_run(job):  # Slurm's drain of the node lets it finish; gpuctl moves none
            slurms.append((job.id, job.spec.backend.id if job.spec.backend else "?"))
            continue
        ckpts = [c for c in p.store.checkpoints(job.id) if c.incarnation == inc.n]
        step = ckpts[0].step if ckpts else None
        age = p.now - max(c.committed_at for c in ckpts) if ckpts else None
        base = Move(
            job.id, job.name, inc.n, inc.cards, inc.mib_per_card, inc.whole,
            checkpoint_step=step, checkpoint_age_s=age, job_version=job.version,
        )  # fmt: skip
        why = _not_movable(inc.state, job.state, job.cancel_requested)
        if job.id in moving:
            why = f"being moved to {moving[job.id].node} already"
        if why is None and silent is not None:
            why = silent + " once the node is down"
        if why is not None:
            moves.append(dataclasses.replace(base, why_not=why))
            continue
        moving_state = dataclasses.replace(state, allocations=migrate.moving_off(state, job.id))
        request = placement_request(job, jobs)
        result = plan(moving_state, [request], settings)
        if not result.placed:
            moves.append(dataclasses.replace(base, why_not=result.unplaced[0].reason))
            continue
        placed = result.placed[0]
        try:
            state = apply_plan(moving_state, result)
        except PlanError as exc:  # pragma: no cover - a fresh plan always applies
            moves.append(dataclasses.replace(base, why_not=exc.message))
            continue
        moves.append(
            dataclasses.replace(
                base,
                to_node=placed.node,
                to_cards=placed.cards,
                to_mib_per_card=placed.allocation.mib_per_card,
            )
        )
    return moves, tuple(sorted(slurms)), state


def _not_movable(state: IncarnationState, job: JobState, cancelling: bool) -> str | None:
    if cancelling:
        return "being cancelled"
    if state is IncarnationState.LAUNCHING:
        return "still launching: drain again once it runs (nothing new starts here meanwhile)"
    if state is IncarnationState.STOPPING:
        return "stopping already"
    if state is IncarnationState.LOST:
        return "lost with its node: failover restarts it"
    if job is not JobState.RUNNING:
        return f"the job is {job.value}"
    return None


# --- the drain -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class DrainResult:
    plan: DrainPlan
    cordon: Cordon
    results: tuple[MigrationResult, ...]

    @property
    def complete(self) -> bool:
        """Every job that was on the node runs elsewhere now."""
        return len(self.results) == len(self.plan.moves) and all(r.moved for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.plan.node,
            "cordon": dataclasses.asdict(self.cordon),
            "complete": self.complete,
            "moved": sum(1 for r in self.results if r.moved),
            "jobs": len(self.plan.moves),
            "results": [r.to_dict() for r in self.results],
            "plan": self.plan.to_dict(),
        }


def tick(loop: LoopState, snapshot: FleetSnapshot | None = None) -> Pass:
    """A pass that only carries the gather and the store (for planning outside the loop)."""
    p = Pass(loop, None)
    p.snapshot = snapshot if snapshot is not None else loop.fleet.gather(loop.inventory)
    return p


def drain(
    loop: LoopState,
    drain_plan: DrainPlan,
    *,
    operator: str,
    grace_s: float | None = None,
    checkpoint_wait_s: float | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    parallel: int = 2,
    poll_s: float = 1.0,
    lock_wait_s: float = 30.0,
    snapshot: FleetSnapshot | None = None,
    on_result: Callable[[MigrationResult], None] | None = None,
    sleep: Callable[[float], None] | None = None,
    cordoned: Cordon | None = None,
) -> DrainResult:
    """Cordon the plan's node, then move each movable job to its planned target (or, when that
    was taken meanwhile, wherever placement finds room), at most `parallel` at a time. Jobs that
    cannot move keep running on the cordoned node; each has a result saying why. `cordoned`:
    the cordon the caller wrote already (a drain of several nodes cordons them all first)."""
    node = drain_plan.node
    written = cordoned or cordon(
        loop.store,
        node,
        reason=drain_plan.reason,
        operator=operator,
        clock=loop.clock,
        expect_version=drain_plan.node_version,
        slurm=SlurmDrains.of(loop.inventory),
    )
    loop.store.append_event(
        Event(
            loop.clock.now(),
            operator,
            "drain",
            f"draining {node}: {drain_plan.reason} ({len(drain_plan.movable)} of "
            f"{len(drain_plan.moves)} job(s) have a target)",
            node=node,
            data={"source": Source.OPERATOR.value, "reason": drain_plan.reason},
        )
    )
    requests = [
        MigrationRequest(
            m.job_id,
            m.target,
            drain_plan.reason,
            grace_s,
            checkpoint_wait_s,
            Source.OPERATOR.value,
            m.job_version,
        )
        for m in drain_plan.moves
        if m.to_node is not None
    ]
    driver: dict[str, Any] = {}
    if sleep is not None:
        driver["sleep"] = sleep
    done = migrate.run_migrations(
        loop,
        requests,
        actor=operator,
        parallel=parallel,
        timeout_s=timeout_s,
        poll_s=poll_s,
        lock_wait_s=lock_wait_s,
        snapshot=snapshot,
        on_result=on_result,
        **driver,
    )
    by_job = {r.job_id: r for r in done}
    results = []
    for m in drain_plan.moves:
        found = by_job.get(m.job_id)
        if found is None:
            found = MigrationResult(
                m.job_id, "not_started", f"not moved: {m.why_not}", node, None, (), m.incarnation
            )
        results.append(found)
    return DrainResult(drain_plan, written, tuple(results))
