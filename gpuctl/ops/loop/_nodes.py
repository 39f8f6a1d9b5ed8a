"""The control loop's node steps: one gather and the liveness it implies (failing, down, back;
mass-failure suspicion), the runs each answering node reports, and fencing: a node that answers
again has its lost incarnations killed, or adopted when their job was not restarted elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuctl.core.jobs.liveness import LivenessChange, suspect_own_network, update_liveness
from gpuctl.core.jobs.model import (
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    NodeLiveness,
    RunStatus,
)
from gpuctl.core.model import Reach
from gpuctl.core.timefmt import duration
from gpuctl.errors import StoreConflict, TransportError
from gpuctl.ops.loop import _jobs
from gpuctl.ops.loop.model import NodeReport

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import Pass

LIVENESS_REFRESH_S = 60.0


def gather(p: Pass) -> None:
    """One poll; liveness per node; mass-failure suspicion."""
    p.snapshot = p.loop.fleet.gather(p.loop.inventory)
    prev = p.store.liveness()
    answered = {n.name: n.reach is Reach.OK for n in p.snapshot.nodes}
    total = len(answered)
    prev_failing = sum(
        1 for name in answered if name in prev and prev[name].failing_since is not None
    )
    failing = sum(1 for ok in answered.values() if not ok)
    p.suspect = suspect_own_network(failing, total, p.settings.mass_failure_fraction)
    if p.suspect:
        message = (
            f"{failing} of {total} nodes do not answer at once: suspecting gpuctl's own "
            "network; no job is requeued until most nodes answer again"
        )
        if not suspect_own_network(prev_failing, total, p.settings.mass_failure_fraction):
            data = {"failing": failing, "total": total}
            p.act("suspect_network", message, outcome="waiting", data=data)  # the event, once
        else:  # still suspect: reported every pass (so a watch does not say it cleared)
            p.note("suspect_network", message)
    ups = [
        update_liveness(
            prev.get(node.name),
            node.name,
            answered=answered[node.name],
            now=p.now,
            grace_s=p.settings.grace_s,
        )
        for node in p.snapshot.nodes
    ]
    if not p.dry:  # in one transaction, before the events that say what changed
        changed = [u.liveness for u in ups if _worth_writing(prev.get(u.liveness.node), u.liveness)]
        if changed:
            p.store.set_liveness(*changed)
    for node, up in zip(p.snapshot.nodes, ups, strict=True):
        live = up.liveness
        p.liveness[node.name] = live
        if live.down:
            p.down.add(node.name)
        elif answered[node.name]:
            p.answering.add(node.name)
        _liveness_event(p, node.name, up.change, live, node.error)
        state = "down" if live.down else "failing" if live.failing_since is not None else "ok"
        since = live.failing_since
        p.node_reports[node.name] = NodeReport(
            node.name,
            node.reach.value,
            state,
            failing_for_s=None if since is None else p.now - since,
        )


def _worth_writing(before: NodeLiveness | None, after: NodeLiveness) -> bool:
    """A change of state, or a last answer older than a minute: not a write per node per pass."""
    if before is None or (before.failing_since, before.down) != (after.failing_since, after.down):
        return True
    last, now = before.last_ok_at, after.last_ok_at
    return last is None or (now is not None and now - last >= LIVENESS_REFRESH_S)


def _liveness_event(
    p: Pass, node: str, change: LivenessChange, live: NodeLiveness, error: str | None
) -> None:
    why = f": {error}" if error else ""
    if change is LivenessChange.FAILING:
        p.act(
            "node_failing",
            f"{node} did not answer{why}; down after {duration(p.settings.grace_s)} without an "
            "answer",
            node=node,
        )
    elif change is LivenessChange.RECOVERED:
        p.act("node_recovered", f"{node} answers again (within the grace)", node=node)
    elif change is LivenessChange.DOWN:
        silent = p.now - (live.failing_since or p.now)
        p.act("node_down", f"{node} is down: no answer for {duration(silent)}{why}", node=node)
    elif change is LivenessChange.BACK:
        p.act("node_back", f"{node} answers again after being down", node=node)


def observe(p: Pass) -> None:
    """Ask each answering node that holds incarnations what runs there."""
    nodes = sorted({i.node for i in p.store.incarnations(holding=True)} & p.answering)
    for name in nodes:
        spec = p.specs.get(name)
        if spec is None:
            continue
        try:
            runs = p.runner.observe(spec)
        except TransportError as exc:
            p.note("observe", f"{name}: could not list its runs: {exc}", node=name)
            continue
        p.observed[name] = {(r.job_id, r.incarnation): r for r in runs}


def fence(p: Pass) -> None:
    """Nodes that answer again: kill their lost incarnations, or adopt one whose job has not
    been started anywhere else yet."""
    for inc in p.store.incarnations(holding=True):
        if inc.state is not IncarnationState.LOST or inc.node not in p.observed:
            continue
        run = p.observed[inc.node].get((inc.job_id, inc.n))
        job = p.store.job(inc.job_id)
        if (
            job is not None
            and job.state is JobState.QUEUED
            and job.incarnation == inc.n
            and not job.cancel_requested
            and run is not None
            and run.alive
        ):
            adopt(p, job, inc, run)
            continue
        p.guard(_fence_one, p, inc, run)


def _fence_one(p: Pass, inc: Incarnation, run: RunStatus | None) -> None:
    fenced = _jobs.confirm_gone(p, inc)
    if fenced is None:
        return  # not known to be gone: it stays lost, holding its cards, until it is
    alive = fenced.killed > 0 or (p.dry and run is not None and run.alive)
    state = IncarnationState.KILLED if alive else IncarnationState.EXITED
    what = "killed the stale copy" if alive else "the stale copy had already ended"
    p.update_inc(
        inc,
        IncarnationState.LOST,
        "fence",
        f"{inc.node} is back: {what} (incarnation {inc.n} of {inc.job_id}); its cards are free",
        state=state,
        exit_code=None if run is None else run.exit_code,
    )


def adopt(p: Pass, job: Job, inc: Incarnation, run: RunStatus) -> None:
    msg = f"{inc.node} is back and incarnation {inc.n} still runs: adopted, not restarted"
    if p.dry:
        p.act("adopt", msg, job=job.id, node=inc.node, inc=inc.n, outcome="would")
        return
    try:  # the job first: a crash between the two leaves a running job whose latest
        # incarnation is lost, which the next pass requeues and adopts again
        p.store.update_job(
            job.id,
            expect=JobState.QUEUED,
            event=p.event("adopt", msg, job=job.id, node=inc.node, inc=inc.n),
            state=JobState.RUNNING,
            reason=None,
            updated_at=p.now,
        )
        p.store.update_incarnation(
            inc.job_id,
            inc.n,
            expect=IncarnationState.LOST,
            state=IncarnationState.RUNNING,
            end_reason=None,
            ended_at=None,
            pid=run.pid if run.pid is not None else inc.pid,
        )
    except StoreConflict as exc:
        p.note("adopt", f"{job.id}: {exc}", job=job.id)
        return
    p.record("adopt", msg, job=job.id, node=inc.node, inc=inc.n)
