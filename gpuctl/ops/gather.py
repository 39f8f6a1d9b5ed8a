"""Fleet gather: one probe per node per poll, fanned out, one `NodeSnapshot` per node.

Over a transport that keeps answering sessions (`SessionTransport`: SSH), the probe runs in each
node's session: a warm poll writes one request line and reads one framed answer, no channel
opened and no remote shell started (about 6x less of gpuctl's CPU than an exec per poll, see
benchmarks/README.md). Other transports run the probe as one exec per poll.

Partial failure is a value: a node that refuses, times out or fails auth becomes a snapshot with its
`reach` code and an error line, never an exception that stops the scan.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.probe import MAX_PROBE_BYTES, parse_probe, probe_command, probe_program
from gpuctl.adapters.protocols import Clock, ExecResult, SessionTransport, Transport
from gpuctl.core.model import (
    FleetSnapshot,
    Inventory,
    NodeFacts,
    NodeSnapshot,
    NodeSpec,
    NodeState,
    Observation,
    Reach,
)
from gpuctl.errors import TransportError, TransportTimeout
from gpuctl.ops.fanout import Fanout
from gpuctl.ops.slurm import SlurmPoll

log = logging.getLogger(__name__)

LocalProbe = Callable[[], Observation]
Progress = Callable[[NodeSnapshot, int, int], None]  # (snapshot, done, total)

MAX_PROBE_OUTPUT_BYTES = MAX_PROBE_BYTES


class Gatherer:
    """Polls nodes through a transport. Keep one for the life of a command or the TUI: the
    transport's connections and the worker pool are reused between polls."""

    def __init__(
        self,
        transport: Transport,
        *,
        local_probe: LocalProbe | None = None,
        clock: Clock | None = None,
        max_workers: int = 32,
    ) -> None:
        self._transport = transport
        self._local_probe = local_probe
        self._clock = clock or SystemClock()
        self._fanout: Fanout[NodeSnapshot] = Fanout(max_workers=max_workers)
        self._full = probe_command()
        self._light = probe_command(static_facts=False)
        self._sessions = transport if isinstance(transport, SessionTransport) else None
        self._program = probe_program()
        # per node: facts that do not change between polls (driver, CUDA, CPUs), once read in
        # full; later polls skip reading them again (one nvidia-smi run fewer per poll)
        self._static: dict[str, NodeFacts] = {}
        self._static_lock = threading.Lock()
        self._slurm = SlurmPoll(transport)  # Slurm's nodes and jobs, for nodes of a cluster

    def poll_node(self, spec: NodeSpec) -> NodeSnapshot:
        start = self._clock.monotonic()
        taken_at = self._clock.now()
        if spec.transport == "local":
            return self._snapshot(
                spec, start, taken_at, lambda: self._probe_local(spec.command_timeout_s)
            )
        with self._static_lock:
            known = self._static.get(spec.name)
        return self._snapshot(
            spec,
            start,
            taken_at,
            lambda: self._observed(spec, self._probe(spec, full=known is None), known),
        )

    def _snapshot(
        self, spec: NodeSpec, start: float, taken_at: float, observe: Callable[[], Observation]
    ) -> NodeSnapshot:
        """The node's snapshot from `observe()`, its failure a snapshot too."""
        try:
            observation = observe()
        except TransportError as exc:
            reach, error = Reach(exc.reach), exc.message
        except Exception as exc:  # one node's surprise must not stop the fleet scan
            log.debug("poll of %s failed", spec.name, exc_info=True)
            reach, error = Reach.ERROR, f"{type(exc).__name__}: {exc}"
        else:
            return self._answered(spec, observation, start, taken_at)
        return NodeSnapshot(
            name=spec.name,
            reach=reach,
            state=NodeState.DOWN,
            error=error,
            latency_s=self._clock.monotonic() - start,
            taken_at=taken_at,
            labels=dict(spec.labels),
        )

    def _observed(
        self, spec: NodeSpec, result: ExecResult | TransportError, known: NodeFacts | None
    ) -> Observation:
        if isinstance(result, TransportError):
            raise result
        observation = self._with_static(
            spec.name, parse_probe(result.stdout, result.exit_code), known
        )
        if result.exit_code is None and not observation.nvml_ok:
            # cut mid-probe (sshd or the node went away): the node did not answer this
            # poll, and its liveness decides down; its GPUs were not found unreadable
            raise TransportError(
                f"{spec.name}: the session was cut before the probe finished"
                f" (no exit status, {len(result.stdout)} bytes of output)"
            )
        return observation

    def _warm_round(
        self, specs: Sequence[NodeSpec], progress: Progress | None
    ) -> dict[str, NodeSnapshot]:
        """The nodes whose answering session is up, asked together from this thread (no
        worker per node: less CPU per poll); the rest are left to the pool."""
        sessions = self._sessions
        remote = [s for s in specs if s.transport != "local"]
        if sessions is None or not remote or len({s.name for s in specs}) != len(specs):
            return {}
        with self._static_lock:
            known = [self._static.get(s.name) for s in remote]
        asks = [(s, "full" if k is None else "light") for s, k in zip(remote, known, strict=True)]
        start, taken_at = self._clock.monotonic(), self._clock.now()
        answers = sessions.ask_warm(asks, self._program, max_output_bytes=MAX_PROBE_OUTPUT_BYTES)
        out: dict[str, NodeSnapshot] = {}
        for i, result in sorted(answers.items()):
            spec = remote[i]
            out[spec.name] = snapshot = self._snapshot(
                spec, start, taken_at, functools.partial(self._observed, spec, result, known[i])
            )
            if progress is not None:
                progress(snapshot, len(out), len(specs))
        return out

    def _probe(self, spec: NodeSpec, *, full: bool) -> ExecResult:
        if self._sessions is not None:
            return self._sessions.ask(
                spec,
                self._program,
                "full" if full else "light",
                timeout_s=spec.command_timeout_s,
                max_output_bytes=MAX_PROBE_OUTPUT_BYTES,
            )
        return self._transport.run(
            spec,
            self._full if full else self._light,
            timeout_s=spec.command_timeout_s,
            max_output_bytes=MAX_PROBE_OUTPUT_BYTES,
        )

    def _with_static(
        self, name: str, observation: Observation, known: NodeFacts | None
    ) -> Observation:
        facts = observation.facts
        if known is None:  # a full probe: remember what it read, when it read it all
            if observation.nvml_ok and facts.cuda_version and facts.driver_version:
                with self._static_lock:
                    self._static[name] = facts
            return observation
        if facts.driver_version and facts.driver_version != known.driver_version:
            with self._static_lock:  # a new driver: read everything again at the next poll
                self._static.pop(name, None)
            return observation
        return dataclasses.replace(
            observation,
            facts=dataclasses.replace(
                facts,
                driver_version=facts.driver_version or known.driver_version,
                cuda_version=known.cuda_version,
                cpu_count=known.cpu_count,
            ),
        )

    def _answered(
        self, spec: NodeSpec, observation: Observation, start: float, taken_at: float
    ) -> NodeSnapshot:
        state = NodeState.READY if observation.nvml_ok else NodeState.UNKNOWN
        error = None
        if not observation.nvml_ok:
            error = observation.notes[0] if observation.notes else "GPU state could not be read"
        return NodeSnapshot(
            name=spec.name,
            reach=Reach.OK,
            state=state,
            error=error,
            observation=observation,
            latency_s=self._clock.monotonic() - start,
            taken_at=taken_at,
            labels=dict(spec.labels),
        )

    def _probe_local(self, timeout_s: float) -> Observation:
        """NVML on this machine, under a deadline: a hung driver must not hang the scan.

        The probe runs in a daemon thread of its own; past the deadline it is abandoned (NVML
        calls cannot be interrupted) and the node reports a timeout.
        """
        probe = self._local_probe
        if probe is None:
            from gpuctl.adapters.probe.local import probe_local

            probe = probe_local
        box: list[Observation | BaseException] = []

        def work() -> None:
            try:
                box.append(probe())
            except BaseException as exc:  # handed to the caller's thread
                box.append(exc)

        worker = threading.Thread(target=work, name="gpuctl-local-probe", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if not box:
            raise TransportTimeout(f"local NVML probe did not answer within {timeout_s:g}s")
        result = box[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def gather(
        self, nodes: Inventory | Iterable[NodeSpec], *, progress: Progress | None = None
    ) -> FleetSnapshot:
        specs: Sequence[NodeSpec] = nodes.nodes if isinstance(nodes, Inventory) else tuple(nodes)
        taken_at = self._clock.now()

        def report(name: str, result: NodeSnapshot | Exception, done: int, total: int) -> None:
            if progress is not None and isinstance(result, NodeSnapshot):
                progress(result, len(warm) + done, len(warm) + total)

        self._slurm.start(specs, taken_at)  # read while the nodes are probed
        warm = self._warm_round(specs, progress)
        # poll_node turns every failure into a snapshot, so every result is a NodeSnapshot.
        results: dict[str, NodeSnapshot | Exception] = {**warm}
        results.update(
            self._fanout.map(
                [s for s in specs if s.name not in warm], self.poll_node, progress=report
            )
        )
        return FleetSnapshot(
            taken_at=taken_at,
            nodes=tuple(r for s in specs if isinstance(r := results[s.name], NodeSnapshot)),
            scheduler=self._slurm.result(),
        )

    def close(self) -> None:
        self._fanout.close()
        self._transport.close()

    def __enter__(self) -> Gatherer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def default_transport() -> Transport:
    """SSH with gpuctl's own known_hosts, the operator's OpenSSH ones and ssh_config
    (`gpuctl.config.paths`)."""
    from gpuctl.adapters.ssh import SshTransport
    from gpuctl.config import paths

    return SshTransport(
        own_known_hosts=paths.own_known_hosts(),
        system_known_hosts=paths.system_known_hosts(),
        ssh_config=paths.ssh_config(),
    )


def gather_fleet(
    inventory: Inventory,
    *,
    transport: Transport | None = None,
    progress: Progress | None = None,
) -> FleetSnapshot:
    """One poll of the whole inventory (opens and closes its own connections)."""
    with Gatherer(transport or default_transport()) as gatherer:
        return gatherer.gather(inventory, progress=progress)
