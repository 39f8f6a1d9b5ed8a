"""`gpuctl inventory check`, `gpuctl inventory list` and `gpuctl inventory import ansible`."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import typer

from gpuctl.cli import context
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.config.inventory import load_inventory
from gpuctl.core.model import Inventory, NodeSpec
from gpuctl.errors import InventoryError

app = typer.Typer(
    help="Validate and show the inventory (the nodes gpuctl reaches).", no_args_is_help=True
)

INVENTORY_OPTION = typer.Option(
    None,
    "-i",
    "--inventory",
    help="Inventory file or folder (default: gpuctl -i, then $GPUCTL_INVENTORY).",
    show_default=False,
)


def _load(ctx: typer.Context, inventory: Path | None) -> Inventory:
    """The inventory, with its Slurm cluster's nodes when it has a `slurm:` section."""
    from gpuctl.ops.slurm import with_slurm_nodes

    loaded = load_inventory(inventory or context.get(ctx).resolve_inventory_path())
    return with_slurm_nodes(loaded, context.root(ctx).transport)


@app.command("check")
def check(ctx: typer.Context, inventory: Path | None = INVENTORY_OPTION) -> None:
    """Validate the inventory: exit 0 when it is valid, 2 with file:line: field: error when not."""
    inv = _load(ctx, inventory)
    groups = Counter(g for node in inv.nodes for g in node.groups)
    files = len(inv.sources)
    line = (
        f"ok: {len(inv.nodes)} node{'s' * (len(inv.nodes) != 1)} "
        f"in {files} file{'s' * (files != 1)}, {len(groups)} group{'s' * (len(groups) != 1)}"
    )
    if groups:
        line += " (" + ", ".join(f"{g}: {n}" for g, n in sorted(groups.items())) + ")"
    sys.stdout.write(safe(line) + "\n")


@app.command("list")
def list_nodes(
    ctx: typer.Context,
    inventory: Path | None = INVENTORY_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show every node as gpuctl resolved it: ranges expanded, groups and defaults applied."""
    inv = _load(ctx, inventory)
    if output in (Output.JSON, Output.YAML):
        emit_document(inventory_document(inv), output)
        return
    wide = output is Output.WIDE
    rows = [_row(node, wide) for node in inv.nodes]
    sys.stdout.write(_table(rows))


def node_document(node: NodeSpec) -> dict[str, Any]:
    doc = dataclasses.asdict(node)
    doc["labels"] = dict(node.labels)
    doc["known_hosts"] = list(node.known_hosts)
    doc["groups"] = list(node.groups)
    doc["jump"] = None if node.jump is None else [str(hop) for hop in node.jump]
    return doc


def inventory_document(inv: Inventory) -> dict[str, Any]:
    return {"sources": list(inv.sources), "nodes": [node_document(n) for n in inv.nodes]}


def _row(node: NodeSpec, wide: bool) -> dict[str, str]:
    row = {
        "NAME": node.name,
        "ADDRESS": node.address if node.transport == "ssh" else "local",
        "USER": node.user or "-",
        "GROUPS": ",".join(node.groups) or "-",
        "GPUS": "-" if node.expected_gpus is None else str(node.expected_gpus),
        "MODEL": node.expected_model or "-",
        "LABELS": ",".join(f"{k}={v}" for k, v in node.labels.items()) or "-",
    }
    if wide:
        row["KEY FILE"] = node.key_file or "-"
        row["TIMEOUTS"] = f"{node.connect_timeout_s:g}s/{node.command_timeout_s:g}s"
        row["SOURCE"] = node.source or "-"
    return row


def _table(rows: list[dict[str, str]]) -> str:
    headers = list(rows[0])
    cells = [[safe(r[h]) for h in headers] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for c in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
    return "\n".join(lines) + "\n"


import_app = typer.Typer(help="Write a gpuctl inventory from another tool's.", no_args_is_help=True)
app.add_typer(import_app, name="import")


@import_app.command("ansible")
def import_ansible(
    source: Path = typer.Argument(..., metavar="FILE", help="An Ansible inventory, INI or YAML."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Write the gpuctl inventory here (default: stdout).",
        show_default=False,
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check and summarise; write nothing."),
) -> None:
    """Groups become groups, ansible_host/port/user/ssh_private_key_file the node's host, port,
    user and key_file, other string vars labels (the rest listed on stderr as skipped); host
    ranges gpu[01:16] expand. The result is checked as `inventory check` would."""
    import tempfile

    import yaml

    from gpuctl.config.ansible import import_ansible as convert

    imported = convert(source)
    text = yaml.safe_dump(imported.document, sort_keys=False, allow_unicode=True)
    with tempfile.TemporaryDirectory() as folder:
        check = Path(folder) / "inventory.yaml"
        check.write_text(text, encoding="utf-8")
        try:
            load_inventory(check)
        except InventoryError as exc:
            raise InventoryError(
                f"{source}: the imported inventory is not valid: {exc.message}"
            ) from None
    for line in imported.skipped:
        sys.stderr.write(f"skipped: {safe(line)}\n")
    groups = len(imported.document.get("groups", {}))
    said = f"{imported.nodes} node(s), {groups} group(s) from {source}"
    if dry_run:
        sys.stderr.write(f"dry run: {said}; nothing written\n")
        return
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
    sys.stderr.write(f"imported {said}" + ("" if out is None else f" into {out}") + "\n")
