"""The control loop's checkpoint steps: record each running job's newest committed checkpoint
(copying it into gpuctl's own store for `checkpoint.sync: pull`), and choose the one a new
incarnation resumes from (shipping it to the new node for `pull`), or say why the job must wait
for a person: it committed checkpoints and none is usable now."""

from __future__ import annotations

import dataclasses
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING

from gpuctl.core.jobs.checkpoints import choose_resume, clock_correction_s, unusable_committed
from gpuctl.core.jobs.model import (
    Checkpoint,
    CheckpointMarker,
    CommitSeen,
    Incarnation,
    IncarnationState,
    Job,
)
from gpuctl.core.jobs.spec import CheckpointSync
from gpuctl.errors import ConfigError

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import Pass


def sync_checkpoints(p: Pass) -> None:
    """Record each running job's newest committed checkpoint; for `sync: pull`, copy it into
    gpuctl's own checkpoint store first. The node's observe of this pass says what its newest
    commit is (`RunStatus.commit`): the markers are read only when that changed since they were
    last read, so a commit is recorded at the next pass without an exec per job per pass. A run
    the observe says nothing of (launched before gpuctl recorded checkpoint dirs) is read every
    `checkpoint_scan_s`."""
    running: set[tuple[str, int]] = set()
    for inc in p.store.incarnations(holding=True):
        if inc.state is not IncarnationState.RUNNING or inc.node not in p.observed:
            continue
        running.add((inc.job_id, inc.n))
        run = p.observed[inc.node].get((inc.job_id, inc.n))
        seen = None if run is None else run.commit
        if seen is not None:
            if seen.step is None or p.loop.commits_read.get((inc.job_id, inc.n)) == seen:
                continue  # nothing committed, or nothing since the markers were last read
        else:
            last = p.loop.scanned_at.get(inc.job_id)
            if last is not None and p.now - last < p.settings.checkpoint_scan_s:
                continue
        job = p.store.job(inc.job_id)
        if job is None:
            continue
        p.guard(sync_one, p, job, inc, seen)
    if not p.dry:  # forget the incarnations that stopped running (or whose node went quiet)
        for key in set(p.loop.commits_read) - running:
            del p.loop.commits_read[key]


def sync_one(p: Pass, job: Job, inc: Incarnation, seen: CommitSeen | None = None) -> None:
    """Record the newest committed checkpoint of `inc` on its node (pulled first for `sync:
    pull`), if it is newer than the newest recorded. `seen`: the newest commit the observe
    reported, remembered once the markers were read."""
    folder = job.spec.policy.checkpoint.dir_for(job.id)
    markers = p.runner.checkpoints(p.spec(inc.node), folder)
    if not p.dry:
        p.loop.scanned_at[job.id] = p.now
        if seen is not None:
            p.loop.commits_read[(job.id, inc.n)] = seen
    mine = [
        m
        for m in markers
        if m.valid and m.incarnation == inc.n and m.step is not None and m.committed_at is not None
    ]
    if not mine:
        return
    newest = max(mine, key=lambda m: (m.step or 0, m.path))
    known = [c.step for c in p.store.checkpoints(job.id) if c.incarnation == inc.n]
    if known and (newest.step or 0) <= max(known):
        return
    step = newest.step or 0
    committed_at = (newest.committed_at or 0.0) - clock_correction_s(inc)  # gpuctl's clock
    if job.spec.policy.checkpoint.sync is CheckpointSync.PULL:
        if p.loop.state_dir is None:
            raise ConfigError(f"job {job.id}: checkpoint.sync is pull but gpuctl has no state dir")
        local = str(
            Path(p.loop.state_dir) / "checkpoints" / job.id / posixpath.basename(newest.path)
        )
        if not p.dry:
            p.runner.pull_checkpoint(p.spec(inc.node), newest.path, local)
            p.store.add_checkpoint(Checkpoint(job.id, inc.n, step, local, committed_at, "store"))
        where = "copied to gpuctl's checkpoint store"
    else:
        if not p.dry:
            p.store.add_checkpoint(
                Checkpoint(job.id, inc.n, step, newest.path, committed_at, "shared")
            )
        where = "on shared storage"
    p.act(
        "checkpoint",
        f"{job.id}: step {step} committed by incarnation {inc.n} ({where})",
        job=job.id,
        node=inc.node,
        inc=inc.n,
        data={"step": step, "committed_at": committed_at},
    )


FRESH_START_HINT = (
    "to start it fresh, submit its spec again with `gpuctl submit --replace` "
    "(a new job; this one is cancelled)"
)
LISTED = 4  # refused checkpoints named in a hold's reason; older ones are counted


@dataclasses.dataclass(frozen=True, slots=True)
class Resume:
    """Where an incarnation starts: `path` on its node and `step` (a fresh start: "" and None),
    or `held`: the reason to hold the job instead (it committed checkpoints, none is usable)."""

    path: str = ""
    step: int | None = None
    held: str | None = None


def held_reason(refused: list[str]) -> str:
    """A hold's reason naming the refused checkpoints (newest first) and how to start afresh."""
    named = "; ".join(refused[:LISTED])
    if len(refused) > LISTED:
        named += f"; and {len(refused) - LISTED} older"
    return f"no usable checkpoint: {named}; {FRESH_START_HINT}"


def resume_point(p: Pass, job: Job, n: int, node: str) -> Resume:
    """The checkpoint incarnation `n` resumes from (shipped to `node` for `sync: pull`). Skipped
    newer ones are events. A fresh start only when the job never committed a checkpoint: when it
    did and none is usable (all damaged, gone), `held` says why and nothing is shipped."""
    if n == 1:
        return Resume()
    history = p.store.incarnations(job.id)
    sync = job.spec.policy.checkpoint.sync
    if sync is CheckpointSync.SHARED:
        markers = p.runner.checkpoints(p.spec(node), job.spec.policy.checkpoint.dir_for(job.id))
    else:
        markers = [  # gpuctl's own copies, verified again: a damaged one is skipped loudly
            _local_marker(c) for c in p.store.checkpoints(job.id) if c.location == "store"
        ]
        # their times were recorded on gpuctl's clock already: nothing to correct
        history = [dataclasses.replace(i, clock_offset_s=None) for i in history]
    chosen, warnings = choose_resume(markers, history=history, next_incarnation=n)
    for w in warnings:
        p.act("checkpoint_skipped", f"{job.id}: {w}", job=job.id, node=node, outcome="failed")
    refused = unusable_committed(
        markers, recorded=p.store.checkpoints(job.id), history=history, next_incarnation=n
    )
    floor = -1 if chosen is None or chosen.step is None else chosen.step
    # the committed checkpoints newer than the choice that are unusable now (damaged, or gone
    # though the store recorded them): events, which the invariants allow for
    unusable = {
        (m.incarnation, m.step): m.problem or "invalid"
        for m in markers
        if not m.valid and m.step is not None and m.incarnation is not None
    }
    unusable.update({(r.incarnation, r.step): r.why for r in refused})
    for (i, step), why in sorted(unusable.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if step > floor:
            p.act(
                "checkpoint_invalid",
                f"{job.id}: step {step} of incarnation {i} is not usable: {why}",
                job=job.id,
                node=node,
                outcome="failed",
                data={"incarnation": i, "step": step},
            )
    if chosen is None:
        return Resume(held=held_reason([str(r) for r in refused])) if refused else Resume()
    if sync is CheckpointSync.PULL:
        remote = f"{job.spec.policy.checkpoint.dir_for(job.id)}/{posixpath.basename(chosen.path)}"
        if not p.dry:
            p.runner.push_checkpoint(p.spec(node), chosen.path, remote)
        return Resume(remote, chosen.step)
    known = {(c.incarnation, c.step) for c in p.store.checkpoints(job.id)}
    key = (chosen.incarnation, chosen.step)
    if key[0] is not None and key[1] is not None and key not in known and not p.dry:
        # committed since the last scan: the store records what each incarnation resumed from
        writer = next(i for i in history if i.n == key[0])  # choose_resume checked it is there
        at = (chosen.committed_at or 0.0) - clock_correction_s(writer)
        ckpt = Checkpoint(job.id, key[0], key[1], chosen.path, at, "shared")
        p.store.add_checkpoint(ckpt)
    return Resume(chosen.path, chosen.step)


def _local_marker(c: Checkpoint) -> CheckpointMarker:
    from gpuctl.adapters.node import verify_local

    problem = verify_local(Path(c.path))
    return CheckpointMarker(c.path, c.incarnation, c.step, c.committed_at, problem is None, problem)
