"""`gpuctl hosts trust|list`: host key trust is an explicit operator action."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpuctl.cli import context
from gpuctl.cli.confirm import answer
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.core.model import Inventory, NodeSpec
from gpuctl.errors import ExitCode, UsageError, exit_for_poll

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpuctl.adapters.ssh import Leg, SshTransport
    from gpuctl.adapters.ssh.known_hosts import KnownKey

app = typer.Typer(
    help="SSH host keys: trust a node's key, list what is trusted.", no_args_is_help=True
)

NAMES_ARG = typer.Argument(None, help="Nodes of the inventory.", metavar="NODE...")
KNOWN_HOSTS_OPTION = typer.Option(
    None,
    "--known-hosts",
    help="Record in this file instead of gpuctl's own known_hosts.",
    show_default=False,
)


def _note(text: str) -> None:
    sys.stderr.write(safe(text) + "\n")


def _nodes(ctx: typer.Context, names: list[str] | None, all_nodes: bool) -> tuple[NodeSpec, ...]:
    """The nodes to trust: the file's, and its Slurm cluster's (read only when the names are
    not all in the file, so a login node's key can be trusted before Slurm is read through it)."""
    from gpuctl.cli import fleet
    from gpuctl.config.inventory import load_inventory

    inventory: Inventory = load_inventory(context.get(ctx).resolve_inventory_path())
    listed = inventory.by_name()
    if inventory.slurm is not None and (all_nodes or any(n not in listed for n in names or ())):
        inventory = fleet.load_inventory(ctx)
    if all_nodes:
        return tuple(n for n in inventory.nodes if n.transport == "ssh")
    if not names:
        raise UsageError("name the nodes to trust", hint="gpuctl hosts trust NODE... (or --all)")
    by_name = inventory.by_name()
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise UsageError(
            f"unknown node {unknown[0]!r}",
            hint=f"the inventory has {len(by_name)} node(s); see `gpuctl inventory list`",
        )
    return tuple(by_name[n] for n in dict.fromkeys(names))


def _transport(ctx: typer.Context, known_hosts: Path | None) -> tuple[SshTransport, Path]:
    from gpuctl.adapters.ssh import SshTransport
    from gpuctl.config import paths

    env = context.get(ctx).env
    own = known_hosts or paths.own_known_hosts(env)
    transport = SshTransport(
        own_known_hosts=own,
        system_known_hosts=paths.system_known_hosts(env),
        ssh_config=paths.ssh_config(env),
    )
    return transport, own


@app.command("trust")
def trust(
    ctx: typer.Context,
    names: list[str] = NAMES_ARG,
    all_nodes: bool = typer.Option(False, "--all", help="Every SSH node of the inventory."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Record without asking."),
    replace: bool = typer.Option(
        False, "--replace", help="Replace a key that changed (after checking the new one)."
    ),
    known_hosts: Path | None = KNOWN_HOSTS_OPTION,
) -> None:
    """Fetch each node's host key, show its fingerprint, and record it after confirmation.

    A node behind jump hosts (ssh_config's ProxyJump, the inventory's jump:) has each jump
    host's key shown and recorded first, then its own, fetched through them.

    Exit 0 when every key is trusted, 1 when one was declined, 5 when a changed key was refused
    (needs --replace), 3/4 when some/all nodes could not be reached.
    """
    from gpuctl.errors import TransportError
    from gpuctl.ops.fanout import fanout

    nodes = _nodes(ctx, names, all_nodes)
    transport, target = _transport(ctx, known_hosts)
    outcomes: list[str] = []  # per node, for exit_for_poll
    trust = _Trust(target, yes=yes, replace=replace)
    with transport:
        offered = fanout(nodes, transport.fetch_route_keys)
        for node in nodes:
            got = offered[node.name]
            for _ in range(len(transport.route(node).legs)):
                if isinstance(got, TransportError):
                    _note(f"error: {got.message}")
                    outcome = "unreachable"
                    break
                if isinstance(got, Exception):
                    raise got
                outcome = trust.legs(got)
                if outcome != "ok" or got[-1][0] == transport.route(node).target:
                    break
                # a jump host was just trusted: the next leg can be reached now
                try:
                    got = transport.fetch_route_keys(node)
                except TransportError as exc:
                    got = exc
            outcomes.append(outcome)
    raise typer.Exit(int(exit_for_poll(outcomes)))


class _Trust:
    """Shows and records the keys of each leg of a node's route (its jump hosts, then itself);
    a jump host shared by several nodes is shown once."""

    def __init__(self, target: Path, *, yes: bool, replace: bool) -> None:
        self.target, self.yes, self.replace = target, yes, replace
        self.shown: dict[tuple[str, str], str] = {}  # (known_hosts name, fingerprint) -> outcome

    def legs(self, found: Sequence[tuple[Leg, str, str, Any, tuple[KnownKey, ...]]]) -> str:
        for leg, key_type, fp, key, recorded in found:
            outcome = self.leg(leg, key_type, fp, key, recorded)
            if outcome != "ok":
                return outcome
        return "ok"

    def leg(
        self,
        leg: Leg,
        key_type: str,
        fp: str,
        key: Any,
        recorded: tuple[KnownKey, ...],
    ) -> str:
        from gpuctl.adapters.ssh import known_hosts as kh
        from gpuctl.adapters.ssh.known_hosts import record_host_key

        node, trust = leg.node, leg.trust
        host = leg.key_name  # ssh_config's HostKeyAlias when it sets one, as OpenSSH records it
        if (host, fp) in self.shown:
            return self.shown[(host, fp)]
        where = kh.node_where(node, leg.key_alias)
        typer.echo(f"{safe(node.name)}\t{host}\t{key_type}\t{fp}")
        verdict = kh.verdict(recorded, key_type, key.asbytes())
        outcome = "ok"
        if verdict.trusted is not None:
            _note(f"{where}: already trusted ({verdict.trusted.where})")
            self.shown[(host, fp)] = outcome
            return outcome
        changed = bool(verdict.recorded)
        if changed:
            old = verdict.recorded[0]
            _note(
                f"{where}: HOST KEY CHANGED: {old.where} holds {old.key_type} {old.fingerprint}, "
                f"the node now offers {key_type} {fp}"
            )
            if not self.replace:
                _note(f"refused: check the new key, then: gpuctl hosts trust --replace {trust}")
                self.shown[(host, fp)] = "host_key"
                return "host_key"
        question = f"{'Replace the key of' if changed else 'Trust'} {node.name} ({key_type} {fp})?"
        if not self.yes and not answer(question):
            _note(f"{where}: not recorded")
            self.shown[(host, fp)] = "failed"
            return "failed"  # declined: not recorded
        record_host_key(self.target, node, key, replace=changed, alias=leg.key_alias)
        _note(f"{where}: recorded in {self.target}")
        stale = [k for k in verdict.recorded if k.path != str(self.target)]
        if stale:
            _note(f"note: {stale[0].where} still holds the old key; remove it there")
        self.shown[(host, fp)] = outcome
        return outcome


@app.command("list")
def list_keys(
    ctx: typer.Context,
    names: list[str] = NAMES_ARG,
    known_hosts: Path | None = KNOWN_HOSTS_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """The keys recorded for each node and where, and for the jump hosts it is reached through
    (no network). Exit 1 when a node or one of its jump hosts has none."""
    nodes = _nodes(ctx, names, all_nodes=not names)
    transport, _ = _transport(ctx, known_hosts)
    rows: list[dict[str, object]] = []
    missing = False
    with transport:
        for node in nodes:
            *hops, (target, keys) = transport.recorded_route_keys(node)
            jumps = []
            for leg, leg_keys in hops:
                where = leg.key_name
                jumps.append({"host": where, "keys": _key_docs(leg_keys)})
                missing = missing or not leg_keys
                _print_keys(output, node.name, f"via {where}", _key_docs(leg_keys))
            host = target.key_name  # ssh_config's names: HostName and Port, or HostKeyAlias
            missing = missing or not keys
            rows.append({"name": node.name, "host": host, "keys": _key_docs(keys), "jumps": jumps})
            _print_keys(output, node.name, host, _key_docs(keys))
    if output in (Output.JSON, Output.YAML):
        emit_document({"nodes": rows}, output)
    raise typer.Exit(int(ExitCode.ERROR if missing else ExitCode.OK))


def _key_docs(keys: Sequence[KnownKey]) -> list[dict[str, str]]:
    return [{"type": k.key_type, "fingerprint": k.fingerprint, "where": k.where} for k in keys]


def _print_keys(output: Output, name: str, host: str, found: list[dict[str, str]]) -> None:
    if output in (Output.JSON, Output.YAML):
        return
    for k in found or [{"type": "-", "fingerprint": "(none)", "where": "-"}]:
        typer.echo(f"{safe(name)}\t{host}\t{k['type']}\t{k['fingerprint']}\t{safe(k['where'])}")
