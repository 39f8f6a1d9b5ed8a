"""Slurm: its commands run locally or on a login node (`SlurmCommands`), their JSON read across
releases (`_parse`), into one `core.scheduler.SchedulerView` per read (`SlurmReader`).

Which command lists the nodes depends on the release: 22.05's `scontrol` has no `--json`, so
`sinfo --json` (its nodes carry state, reason, who and when); from 23.02 `scontrol show nodes
--json` (`sinfo --json` there lists partition groups, not nodes). Jobs come from `squeue --json`
in every release. The data_parser version is not pinned: each release drops old ones, so the
parser reads every shape instead (`_parse`).
"""

from __future__ import annotations

from gpuctl.adapters.slurm._jobs import (
    SlurmJobState,
    Submitted,
    batch_script,
    exit_marker,
    job_states,
    read_output,
    sbatch,
    scancel,
)
from gpuctl.adapters.slurm._parse import (
    SlurmParseError,
    document,
    parse_jobs,
    parse_nodes,
    parse_queue,
    version_of,
)
from gpuctl.adapters.slurm._run import SlurmCommands, SlurmError
from gpuctl.core.scheduler import SchedNode, SchedulerView
from gpuctl.errors import GpuctlError

__all__ = [
    "SlurmCommands",
    "SlurmError",
    "SlurmJobState",
    "SlurmParseError",
    "SlurmReader",
    "Submitted",
    "batch_script",
    "document",
    "exit_marker",
    "job_states",
    "parse_jobs",
    "parse_nodes",
    "parse_queue",
    "read_output",
    "sbatch",
    "scancel",
    "update_node",
    "version_of",
]

SCONTROL_JSON_SINCE = (23, 2, 0)


class SlurmReader:
    """Reads the cluster: `sinfo --version` once, then per `read()` the nodes and the jobs."""

    def __init__(self, commands: SlurmCommands) -> None:
        self.commands = commands
        self._version: tuple[int, int, int] | None = None

    def version(self) -> tuple[int, int, int]:
        if self._version is None:
            text = self.commands.run(["sinfo", "--version"])
            found = version_of(text)
            if found is None:
                raise SlurmParseError(f"`sinfo --version`: no version in {text.strip()[:80]!r}")
            self._version = found
        return self._version

    def node_command(self) -> list[str]:
        if self.version() >= SCONTROL_JSON_SINCE:
            return ["scontrol", "show", "nodes", "--json"]
        return ["sinfo", "--json"]

    def nodes(self) -> tuple[SchedNode, ...]:
        """Slurm's nodes now (their state, reason, who and when), without the jobs."""
        argv = self.node_command()
        items, _, _ = document(self.commands.run(argv), " ".join(argv), "nodes")
        return parse_nodes(items, " ".join(argv), [])

    def read(self, now: float | None = None) -> SchedulerView:
        """Nodes and running jobs. Raises SlurmError / SlurmParseError (or a TransportError
        from the login node) when the cluster cannot be read at all; unreadable fields are
        the view's notes."""
        source = self.commands.source
        notes: list[str] = []
        argv = self.node_command()
        items, release, errs = document(self.commands.run(argv), " ".join(argv), "nodes")
        notes += errs
        nodes = parse_nodes(items, " ".join(argv), notes)
        if source.partitions:
            keep = set(source.partitions)
            nodes = tuple(n for n in nodes if keep.intersection(n.partitions))
        jobs_text = self.commands.run(["squeue", "--json"])
        items, _, errs = document(jobs_text, "squeue --json", "jobs")
        notes += errs
        names = {n.name for n in nodes}
        jobs = tuple(j for j in parse_jobs(items, "squeue --json", notes) if j.node in names)
        queue, others = parse_queue(items, "squeue --json", notes, {j.job_id for j in jobs})
        return SchedulerView(
            cluster=source.cluster,
            version=release or ".".join(str(v) for v in self.version()),
            taken_at=now,
            nodes=nodes,
            jobs=jobs,
            notes=tuple(notes),
            queue=queue,
            queue_others=others,
        )

    def read_or_error(self, now: float | None = None) -> SchedulerView:
        """`read()`, or a view carrying the one-line error instead of raising: a poll of the
        fleet goes on without Slurm's view (nodes still answer over SSH)."""
        try:
            return self.read(now)
        except GpuctlError as exc:
            return SchedulerView(
                cluster=self.commands.source.cluster, taken_at=now, error=exc.message
            )


def update_node(commands: SlurmCommands, node: str, *, state: str, reason: str = "") -> None:
    """`scontrol update nodename=NODE state=STATE [reason=REASON]` (an operator's or Slurm
    administrator's account: a user's is refused, and that refusal is the SlurmError)."""
    argv = ["scontrol", "update", f"nodename={node}", f"state={state}"]
    if reason:
        argv.append(f"reason={reason}")
    commands.run(argv)
