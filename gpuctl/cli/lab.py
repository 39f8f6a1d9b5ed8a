"""`gpuctl lab ...`: a local fleet of real sshd on loopback with simulated GPUs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.errors import UsageError

if TYPE_CHECKING:
    from gpuctl.lab.fleet import NodeStatus

app = typer.Typer(
    help="A local fleet of real sshd nodes with simulated GPUs, for demos and tests.",
    no_args_is_help=True,
)

DIR_OPTION = typer.Option(
    ..., "--dir", envvar="GPUCTL_LAB_DIR", help="The lab's folder ($GPUCTL_LAB_DIR)."
)
SSHD_OPTION = typer.Option(
    Path("/usr/sbin/sshd"), "--sshd", envvar="GPUCTL_SSHD", help="OpenSSH server binary."
)
NODE_ARG = typer.Argument(..., help="Lab node name, e.g. lab-01.")


def _note(text: str) -> None:
    sys.stderr.write(text + "\n")


@app.command("up")
def up(
    nodes: int = typer.Option(3, "--nodes", "-n", help="How many nodes."),
    gpus: int = typer.Option(8, "--gpus", help="Simulated GPUs per node."),
    gpu_model: str = typer.Option("NVIDIA H100 80GB HBM3", "--gpu-model", help="GPU model name."),
    gpu_mem_gib: int = typer.Option(80, "--gpu-mem-gib", help="Memory per GPU in GiB."),
    lab_dir: Path = DIR_OPTION,
    sshd: Path = SSHD_OPTION,
) -> None:
    """Start N nodes; write DIR/inventory.yaml and DIR/known_hosts."""
    from gpuctl.lab import fleet

    lab = fleet.up(
        lab_dir, nodes=nodes, gpus=gpus, gpu_model=gpu_model, gpu_mem_gib=gpu_mem_gib, sshd=sshd
    )
    for node in lab.nodes:
        typer.echo(f"{node.name}\t{node.host}:{node.port}\t{node.gpus} x {safe(node.gpu_model)}")
    _note(f"lab up: {len(lab.nodes)} node(s), user {lab.user}")
    _note(f"next: gpuctl -i {lab.inventory_path} status")


@app.command("down")
def down(lab_dir: Path = DIR_OPTION) -> None:
    """Stop every sshd and node process the lab started (safe to repeat)."""
    from gpuctl.lab import fleet

    stopped = fleet.down(lab_dir)
    _note(f"lab down: stopped {stopped} process(es)")


def _state(s: NodeStatus) -> str:
    if s.partitioned:
        return "partitioned"
    return "frozen" if s.frozen else "up" if s.running else "down"


@app.command("list")
def list_nodes(lab_dir: Path = DIR_OPTION, output: Output = OUTPUT_OPTION) -> None:
    """The lab's nodes and whether each sshd runs."""
    from gpuctl.lab import fleet

    rows = [
        {
            "name": s.node.name,
            "address": f"{s.node.host}:{s.node.port}",
            "state": _state(s),
            "pid": s.node.pid if s.running else None,
            "gpus": s.node.gpus,
            "gpu_model": s.node.gpu_model,
        }
        for s in fleet.status(lab_dir)
    ]
    if output in (Output.JSON, Output.YAML):
        emit_document({"nodes": rows}, output)
        return
    typer.echo("NAME\tADDRESS\tSTATE\tGPUS")
    for r in rows:
        typer.echo(f"{r['name']}\t{r['address']}\t{r['state']}\t{r['gpus']}")


@app.command("kill")
def kill(
    node: str = NODE_ARG,
    lab_dir: Path = DIR_OPTION,
    sshd_only: bool = typer.Option(
        False, "--sshd-only", help="Kill only its sshd and SSH sessions; its jobs run on."
    ),
) -> None:
    """Simulate node death: SIGKILL its sshd and all its processes."""
    from gpuctl.lab import faults, fleet

    if sshd_only:
        stopped = faults.kill_sshd(lab_dir, node)
        _note(f"{node}: sshd killed ({stopped} process(es)); its jobs run on")
        return
    stopped = fleet.kill(lab_dir, node)
    _note(f"{node}: killed ({stopped} process(es))")


@app.command("partition")
def partition(node: str = NODE_ARG, lab_dir: Path = DIR_OPTION) -> None:
    """Cut the node off the network (its link goes down); its jobs run on. Needs root."""
    from gpuctl.lab import faults

    faults.partition(lab_dir, node)
    _note(f"{node}: partitioned (undo with gpuctl lab heal {node})")


@app.command("heal")
def heal(node: str = NODE_ARG, lab_dir: Path = DIR_OPTION) -> None:
    """Bring a partitioned node's link back up."""
    from gpuctl.lab import faults

    faults.heal(lab_dir, node)
    _note(f"{node}: link up again")


@app.command("revive")
def revive(node: str = NODE_ARG, lab_dir: Path = DIR_OPTION) -> None:
    """Bring a killed node back (same host key, same port)."""
    from gpuctl.lab import fleet

    lab_node = fleet.revive(lab_dir, node)
    _note(f"{node}: up on {lab_node.host}:{lab_node.port}")


@app.command("freeze")
def freeze(node: str = NODE_ARG, lab_dir: Path = DIR_OPTION) -> None:
    """SIGSTOP the node: it accepts connections but never answers (a hung host)."""
    from gpuctl.lab import fleet

    fleet.freeze(lab_dir, node)
    _note(f"{node}: frozen (undo with gpuctl lab thaw {node})")


@app.command("thaw")
def thaw(node: str = NODE_ARG, lab_dir: Path = DIR_OPTION) -> None:
    """Undo freeze."""
    from gpuctl.lab import fleet

    fleet.thaw(lab_dir, node)
    _note(f"{node}: thawed")


@app.command("inject")
def inject(
    node: str = NODE_ARG,
    lab_dir: Path = DIR_OPTION,
    gpu: int | None = typer.Option(None, "--gpu", help="GPU index (default: all GPUs)."),
    ecc_uncorrected: int | None = typer.Option(
        None, "--ecc-uncorrected", help="Set volatile uncorrected ECC errors."
    ),
    xid: int | None = typer.Option(None, "--xid", help="Add an XID event to the kernel log."),
    temp: int | None = typer.Option(None, "--temp", help="Pin the temperature (°C)."),
    missing: bool = typer.Option(False, "--missing", help="The GPU drops out of nvidia-smi."),
    garbage: bool = typer.Option(False, "--garbage", help="Every nvidia-smi call prints garbage."),
    hang: bool = typer.Option(False, "--hang", help="Every nvidia-smi call hangs."),
    clear: bool = typer.Option(
        False, "--clear", help="Reset the faults first (the GPU's, or all)."
    ),
) -> None:
    """Inject a GPU fault into a lab node's simulated state."""
    from gpuctl.lab import fleet

    chosen = (
        ecc_uncorrected,
        xid,
        temp,
        missing or None,
        garbage or None,
        hang or None,
        clear or None,
    )
    if all(v is None for v in chosen):
        raise UsageError(
            "nothing to inject",
            hint="pass --ecc-uncorrected N, --xid N, --temp C, --missing, --garbage, "
            "--hang or --clear",
        )
    fleet.inject(
        lab_dir,
        node,
        gpu=gpu,
        ecc_uncorrected=ecc_uncorrected,
        xid=xid,
        temp_c=temp,
        missing=missing,
        garbage=garbage,
        hang=hang,
        clear=clear,
    )
    _note(f"{node}: injected")
