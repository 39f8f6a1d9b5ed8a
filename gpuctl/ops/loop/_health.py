"""The control loop's health step: judge every node from the pass's gather (and the samples of
earlier passes), then cordon, drain and lift gpuctl's own cordons as `gpuctl.core.health.autodrain`
decides: cordon at first sight, unknown health cordons only, drains after a verdict persisted
(hysteresis) and within a rate limit, never while most of the fleet looks unhealthy at once, and
a health cordon lifted only after a cool-down, never a person's cordon. A node that keeps dropping
off and coming back (counted from the store's `node_recovered` / `node_back` events, so a one-shot
run from cron sees them too) is cordoned the same way, its jobs left running. The step also
alerts on running jobs that stopped committing checkpoints (`gpuctl.ops.loop._stall`).

A drained node's running jobs are moved with the migration primitive (`gpuctl.ops.moves.migrate`):
each gets a target reserved here; the loop's migration step takes them further every pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuctl.core.health import evaluate_fleet
from gpuctl.core.health.autodrain import (
    HEALTH_SOURCE,
    HealthPlan,
    NodeHealth,
    NodeStep,
    changed,
    decide,
    flapping,
    track,
)
from gpuctl.core.health.model import Action, HealthRules
from gpuctl.core.jobs.model import Cordon, Incarnation, IncarnationState, Job, is_slurm_run
from gpuctl.errors import GpuctlError, StateError
from gpuctl.ops.loop import _stall, migrations
from gpuctl.ops.loop.model import Target
from gpuctl.ops.slurm import SlurmDrains, slurm_drains_due

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import Pass

ACTOR = "gpuctl"
HOUR_S = 3600.0


def rules(p: Pass) -> HealthRules:
    if p.loop.health_rules is None:
        from gpuctl.config.health_rules import load_rules

        p.loop.health_rules = load_rules()
    return p.loop.health_rules


def health(p: Pass) -> None:
    _stall.stalls(p)  # jobs that stopped committing checkpoints: an alert, no action
    policy = p.settings.health
    if not policy.enabled or not p.snapshot.nodes:
        return
    try:
        earlier = p.loop.health_history.record(p.snapshot.nodes)
    except StateError as exc:  # a sample file that cannot be read must not stop the pass
        hint = f"; {exc.hint}" if exc.hint else ""
        p.note("error", f"health judged on this poll alone: {exc.message}{hint}", outcome="failed")
        earlier = {}
    expected = {name: spec.expected_gpus for name, spec in p.specs.items()}
    verdicts = evaluate_fleet(p.snapshot, earlier, expected_gpus=expected, rules=rules(p))
    prev = p.store.node_health()
    tracked: dict[str, NodeHealth] = {}
    for verdict in verdicts:
        reachable = verdict.name in p.answering
        now = track(
            prev.get(verdict.name),
            verdict,
            reachable=reachable,
            now=p.now,
            cap=policy.drain_after_passes,
        )
        tracked[verdict.name] = now
        if not p.dry and changed(prev.get(verdict.name), now):
            p.store.set_node_health(now)
        report = p.node_reports.get(verdict.name)
        if report is not None:
            p.node_reports[verdict.name] = dataclasses.replace(
                report, health=verdict.verdict.value, health_action=now.action.value
            )
    plan = decide(
        tracked,
        {c.node: c for c in p.store.cordons()},
        drains_last_hour=_drains_last_hour(p),
        policy=policy,
        now=p.now,
        nodes=sorted(tracked),
        loaded=_loaded(p),
        flaps=flapping(_outages(p), policy),
    )
    _suspect(p, plan)
    for step in plan.cordon:
        p.guard(_cordon, p, step, tracked[step.node])
    for step in plan.quarantine:
        p.guard(_quarantine, p, step)
    for step in plan.uncordon:
        p.guard(_uncordon, p, step)
    for step in plan.held:
        p.note("drain", f"{step.node}: not drained yet: {step.why}", node=step.node)
    for step in plan.drain:
        start = step.node in plan.start_drain
        free = step.node in plan.free_drain
        p.guard(_drain, p, step, tracked[step.node], start=start, counted=start and not free)
    for cordon in slurm_drains_due(p.store.cordons(), p.snapshot.scheduler, p.loop.inventory):
        p.guard(_slurm_drain, p, cordon)


def _outages(p: Pass) -> dict[str, int]:
    """Per node: how many times it stopped answering and answered again (within the grace or
    after being down) within the flapping window."""
    since = p.now - p.settings.health.flap_window_s
    counts: dict[str, int] = {}
    for e in p.store.events(since=since, kinds=["node_recovered", "node_back"]):
        if e.actor == ACTOR and e.node is not None:
            counts[e.node] = counts.get(e.node, 0) + 1
    return counts


def _loaded(p: Pass) -> set[str]:
    """Nodes holding jobs a drain would move (launching or running there)."""
    active = (IncarnationState.LAUNCHING, IncarnationState.RUNNING)
    return {
        i.node
        for i in p.store.incarnations(holding=True)
        if i.state in active and not is_slurm_run(p.store.job(i.job_id))
    }


def _drains_last_hour(p: Pass) -> int:
    """Nodes gpuctl began draining for health within the last hour that had jobs to move: a
    drain of an empty node is a cordon and costs the fleet nothing."""
    found = p.store.events(since=p.now - HOUR_S, kinds=["drain"])
    return len(
        {
            e.node
            for e in found
            if e.actor == ACTOR and e.data.get("source") == "health" and _counted(e.data)
        }
    )


def _counted(data: Mapping[str, object]) -> bool:
    counted = data.get("counted")
    if isinstance(counted, bool):
        return counted
    return data.get("jobs") != 0  # written before `counted` was: an empty node moved nothing


def _suspect(p: Pass, plan: HealthPlan) -> None:
    """One event when most of the fleet starts looking unhealthy, one when that ends."""
    was = p.loop.health_suspect
    if was is None:  # read the log once per loop, not at every pass
        last = p.store.events(kinds=["suspect_health"], limit=1)
        was = bool(last) and last[-1].outcome == "waiting"
    if not p.dry:
        p.loop.health_suspect = plan.suspect
    if plan.suspect and not was:
        p.act(
            "suspect_health",
            f"{plan.unhealthy} of {plan.total} nodes look unhealthy at once: suspecting a "
            "fleet-wide cause (a driver rollout, the probe) rather than failing GPUs; nodes are "
            "cordoned, but none is drained until most look healthy again",
            outcome="waiting",
            data={"unhealthy": plan.unhealthy, "total": plan.total},
        )
    elif was and not plan.suspect:
        p.act(
            "suspect_health",
            f"most nodes look healthy again ({plan.unhealthy} of {plan.total} do not): "
            "health drains resume",
            outcome="ok",
        )


def _cordon(p: Pass, step: NodeStep, h: NodeHealth) -> None:
    untouched = "; running jobs are left alone" if h.action is Action.CORDON else ""
    message = f"{step.node} cordoned by health ({h.action.value}): {step.why}{untouched}"
    _write_cordon(p, step, message, h.action)


def _quarantine(p: Pass, step: NodeStep) -> None:
    """Cordon a flapping node: no new work; its running jobs stay (sshd dropping is not a job
    dying)."""
    message = f"{step.node} cordoned by health: {step.why}; running jobs are left alone"
    _write_cordon(p, step, message, Action.CORDON)


def _write_cordon(p: Pass, step: NodeStep, message: str, action: Action) -> None:
    if p.dry:
        p.record("cordon", message, node=step.node)
        return
    written = p.store.cordon(
        Cordon(step.node, step.why, ACTOR, HEALTH_SOURCE, p.now),
        p.event(
            "cordon",
            message,
            node=step.node,
            data={"source": HEALTH_SOURCE, "reason": step.why, "action": action.value},
        ),
        keep_existing=True,
    )
    if written:
        p.record("cordon", message, node=step.node)


def _slurm_drain(p: Pass, cordon: Cordon) -> None:
    """A health cordon of a Slurm node that Slurm does not drain yet: drain it there too (the
    first pass after the cordon, or the next one after Slurm could not be reached)."""
    message = f"{cordon.node}: drain in Slurm (gpuctl: {cordon.reason})"
    if p.dry:
        p.record("slurm_drain", message, node=cordon.node)
        return
    done = SlurmDrains(p.loop.inventory).drain(cordon.node, cordon.reason)
    if done is not None:
        p.act("slurm_drain", done, node=cordon.node, data={"reason": cordon.reason})


def _uncordon(p: Pass, step: NodeStep) -> None:
    message = f"{step.node} uncordoned: gpuctl's own health cordon lifted, {step.why}"
    if p.dry:
        p.record("uncordon", message, node=step.node)
        return
    try:
        resumed = SlurmDrains(p.loop.inventory).resume(step.node)
    except GpuctlError as exc:  # an operator's own drain in Slurm stays; gpuctl's cordon goes
        resumed = None
        p.note("slurm_resume", exc.message, node=step.node, outcome="skipped")
    if resumed is not None:
        message += f"; {resumed}"
    p.store.uncordon(
        step.node,
        p.event("uncordon", message, node=step.node, data={"source": HEALTH_SOURCE}),
        expect_source=HEALTH_SOURCE,
    )
    p.record("uncordon", message, node=step.node)


def _drain(p: Pass, step: NodeStep, h: NodeHealth, *, start: bool, counted: bool) -> None:
    """Start (or go on) moving every running job off the node, each to a reserved target.
    `counted`: the drain counts against the hour's rate limit (it has jobs to move)."""
    moving = {r.job_id for r in p.store.reservations()}
    incs = [
        i
        for i in p.store.incarnations(node=step.node, holding=True)
        if i.state is IncarnationState.RUNNING
        and i.job_id not in moving
        and not is_slurm_run(p.store.job(i.job_id))  # Slurm's drain lets it end
    ]
    if start:
        what = (
            f"{len(incs)} job(s) to move, each from a fresh checkpoint to a reserved target"
            if counted
            else "no job runs there: nothing to move, not counted by the rate limit"
        )
        p.act(
            "drain",
            f"draining {step.node}: {step.why} ({what})",
            node=step.node,
            data={
                "source": HEALTH_SOURCE,
                "reason": step.why,
                "jobs": len(incs),
                "counted": counted,
            },
        )
        if not p.dry:
            p.store.set_node_health(dataclasses.replace(h, drain_started_at=p.now))
    policy = p.settings.health
    for inc in incs:
        job = p.store.job(inc.job_id)
        if job is None or job.cancel_requested:
            continue
        chosen = migrations.choose_target(p, job, inc)
        if isinstance(chosen, str):
            p.note(
                "drain",
                f"{job.id}: no room elsewhere ({chosen}); it keeps running on {step.node}",
                job=job.id,
                node=step.node,
            )
            continue
        target, capacity = chosen

        def hold(
            job: Job = job,
            inc: Incarnation = inc,
            target: Target = target,
            capacity: dict[tuple[str, int], int] = capacity,
        ) -> None:
            migrations.reserve(
                p,
                job,
                inc,
                target,
                capacity,
                reason=f"{step.node} is unhealthy: {step.why}",
                source=HEALTH_SOURCE,
                actor=ACTOR,
                timeout_s=policy.migration_timeout_s,
            )

        p.guard(hold)
