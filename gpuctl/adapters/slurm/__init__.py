"""Slurm: its commands run locally or on a login node (`SlurmCommands`), their JSON read across
releases (`_parse`), into one `core.scheduler.SchedulerView` per read (`SlurmReader`).

Which command lists the nodes depends on the release: 22.05's `scontrol` has no `--json`, so
`sinfo --json` (its nodes carry state, reason, who and when); from 23.02 `scontrol show nodes
--json` (`sinfo --json` there lists partition groups, not nodes). Jobs come from `squeue --json`
in every release. From 23.11 the reader pins the data_parser of their `--json` to the newest
one the release ships that gpuctl reads (`_pin`); the parser reads every shape all the same
(`_parse`), for 22.05, 23.02, a release newer than gpuctl knows, and a pin the command refused.
"""

from __future__ import annotations

from typing import Any

from gpuctl.adapters.slurm import _pin
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
    """Reads the cluster: `sinfo --version` once, then per `read()` the nodes and the jobs,
    their `--json` pinned to one data_parser (`_pin`) while the commands take it."""

    def __init__(self, commands: SlurmCommands) -> None:
        self.commands = commands
        self._version: tuple[int, int, int] | None = None
        self._pin: str | None = None
        self._notes: list[str] = []  # this reader's own, carried by each view it reads

    def version(self) -> tuple[int, int, int]:
        if self._version is None:
            text = self.commands.run(["sinfo", "--version"])
            found = version_of(text)
            if found is None:
                raise SlurmParseError(f"`sinfo --version`: no version in {text.strip()[:80]!r}")
            self._version = found
            self._pin, note = _pin.pin_for(found)
            if note:
                self._notes.append(note)
        return self._version

    def node_command(self) -> list[str]:
        if self.version() >= SCONTROL_JSON_SINCE:
            return ["scontrol", "show", "nodes", "--json"]
        return ["sinfo", "--json"]

    def json_command(self, argv: list[str]) -> list[str]:
        """`argv` (its `--json` plain) as this reader runs it: pinned where the release takes it."""
        self.version()
        return _pin.pinned(argv, self._pin) if self._pin else argv

    def _json(self, argv: list[str], key: str) -> tuple[list[Any], str | None, list[str], str]:
        """`document()` of `argv`'s output, and the command line its notes name. A pinned
        plugin the command refuses is dropped: the command runs once more with plain `--json`,
        and so does every later one of this reader (noted)."""
        run = self.json_command(argv)
        try:
            text = self.commands.run(run)
        except SlurmError as exc:
            if self._pin is None or run == argv or not _pin.refused(exc.stderr, self._pin):
                raise
            said = next(ln for ln in exc.stderr.splitlines() if self._pin in ln)
            said = "".join(c for c in said if c.isprintable()).strip()
            self._notes.append(
                f"`{' '.join(run)}` refused data_parser {self._pin} (Slurm says: {said[:200]}): "
                "reading Slurm's default JSON"
            )
            self._pin, run = None, argv
            text = self.commands.run(run)
        shown = " ".join(run)
        items, release, errs = document(text, shown, key)
        return items, release, errs, shown

    def nodes(self) -> tuple[SchedNode, ...]:
        """Slurm's nodes now (their state, reason, who and when), without the jobs."""
        items, _, _, shown = self._json(self.node_command(), "nodes")
        return parse_nodes(items, shown, [])

    def read(self, now: float | None = None) -> SchedulerView:
        """Nodes and running jobs. Raises SlurmError / SlurmParseError (or a TransportError
        from the login node) when the cluster cannot be read at all; unreadable fields are
        the view's notes."""
        source = self.commands.source
        items, release, errs, shown = self._json(self.node_command(), "nodes")
        notes = list(errs)
        nodes = parse_nodes(items, shown, notes)
        if source.partitions:
            keep = set(source.partitions)
            nodes = tuple(n for n in nodes if keep.intersection(n.partitions))
        items, _, errs, shown = self._json(["squeue", "--json"], "jobs")
        notes += errs
        names = {n.name for n in nodes}
        jobs = tuple(j for j in parse_jobs(items, shown, notes) if j.node in names)
        queue, others = parse_queue(items, shown, notes, {j.job_id for j in jobs})
        return SchedulerView(
            cluster=source.cluster,
            version=release or ".".join(str(v) for v in self.version()),
            taken_at=now,
            nodes=nodes,
            jobs=jobs,
            notes=(*self._notes, *notes),
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
