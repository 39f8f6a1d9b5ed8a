"""The typer app: one sub-app per noun, the top-level verbs, and the one error boundary."""

from __future__ import annotations

import copy
import logging
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

from gpuctl import __version__
from gpuctl.cli import (
    bench,
    consolidate,
    controller,
    dash,
    db,
    health,
    history,
    hosts,
    inventory_cmd,
    jobs,
    lab,
    metrics,
    nodeops,
    nodes,
    place,
    playbook,
    reconcile,
    report,
    status,
)
from gpuctl.cli.context import AppContext
from gpuctl.errors import ExitCode, GpuctlError, ReadOnlyRole

if TYPE_CHECKING:  # typer vendors click; only its Context type is needed here
    from typer._click.core import Command as ClickCommand
    from typer._click.core import Context as ClickContext
    from typer._click.core import Parameter as ClickParameter


def _report(exc: GpuctlError) -> None:
    from gpuctl.cli.render import safe

    sys.stderr.write(f"error: {safe(exc.message)}\n")
    if exc.hint:
        sys.stderr.write(f"hint: {safe(exc.hint)}\n")


class _Boundary(TyperGroup):
    """The one error boundary: GpuctlError -> one line on stderr and its exit code. Also where
    every command learns the global options (`gpuctl status -i X` as `gpuctl -i X status`) and
    loses `<bool>` on its flags' help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        shared = [p for p in self.params if p.name in _GLOBAL_OPTIONS]
        for p in self.params:
            _bare_flag(p)
        _hide_help_type(self)
        for name, command in self.commands.items():
            _spread(command, shared, name)

    def get_params(self, ctx: ClickContext) -> list[ClickParameter]:
        params = super().get_params(ctx)
        for p in params:  # typer adds the completion options after __init__
            _bare_flag(p)
        return params

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except GpuctlError as exc:
            if _debug(ctx):
                traceback.print_exc()
            if isinstance(exc, ReadOnlyRole) and ctx.invoked_subcommand:
                exc.message = f"{exc.message} ({ctx.invoked_subcommand})"  # the verb refused
            _report(exc)
            ctx.exit(int(exc.exit_code))
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            ctx.exit(int(ExitCode.INTERRUPTED))
        except BrokenPipeError:  # `gpuctl status | head`: the reader left, nothing to report
            _silence_stdout()
            ctx.exit(int(ExitCode.OK))
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except Exception as exc:
            if _debug(ctx):
                raise
            sys.stderr.write(
                f"error: internal error: {type(exc).__name__}: {exc}\n"
                "hint: run again with --debug for a traceback, and report it\n"
            )
            ctx.exit(int(ExitCode.ERROR))


# the root's options accepted after a command too, and the AppContext field each sets
_GLOBAL_OPTIONS = {
    "inventory": "inventory_path",
    "state_dir": "state_dir",
    "state_url": "state_url",
    "debug": "debug",
}


def _spread(command: ClickCommand, shared: list[ClickParameter], path: str) -> None:
    """Give `command` (and each command under it) the root's global options, unless it has an
    option of the same name (`inventory check -i`); flags without `<bool>` in their help; and
    an example under the help of each."""
    for p in command.params:
        _bare_flag(p)
    _hide_help_type(command)
    sub = getattr(command, "commands", None)
    if isinstance(sub, dict):
        for name, child in sub.items():
            _spread(child, shared, f"{path} {name}")
        return
    if path in EXAMPLES and not command.epilog:
        command.epilog = f"Example: gpuctl {EXAMPLES[path]}"
    taken = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    for option in shared:
        if option.name in {p.name for p in command.params} or taken & set(option.opts):
            continue
        after = copy.copy(option)
        after.expose_value = False
        after.callback = _after_command
        command.params.append(after)


EXAMPLES = {  # one typical line per command, shown under its --help
    "status": "status -i fleet.yaml -o wide",
    "health": "health gpu01 -i fleet.yaml",
    "place": "place train.yaml -i fleet.yaml --explain",
    "reconcile": "reconcile -i fleet.yaml --watch --interval 30",
    "submit": "submit train.yaml",
    "logs": "logs train -f",
    "cancel": "cancel train --yes",
    "cordon": "cordon 'gpu[01-04]' --reason 'fan noise' -i fleet.yaml",
    "uncordon": "uncordon -l pool=train -i fleet.yaml",
    "drain": "drain gpu01 --reason 'bios update' -i fleet.yaml --dry-run",
    "consolidate": "consolidate -i fleet.yaml --apply --window 01:00-05:00",
    "dash": "dash -i fleet.yaml",
    "report": "report -i fleet.yaml --window 24h",
    "jobs list": "jobs list",
    "jobs show": "jobs show train",
    "nodes list": "nodes list -i fleet.yaml",
    "nodes show": "nodes show gpu01 -i fleet.yaml",
    "inventory check": "inventory check -i fleet.yaml",
    "inventory list": "inventory list -i fleet.yaml -o json",
    "inventory import ansible": "inventory import ansible hosts.ini --out fleet.yaml",
    "hosts trust": "hosts trust gpu01 -i fleet.yaml",
    "hosts list": "hosts list -i fleet.yaml",
    "lab up": "lab up --dir /tmp/lab --nodes 3",
    "lab down": "lab down --dir /tmp/lab",
    "lab list": "lab list --dir /tmp/lab",
    "lab kill": "lab kill lab-02 --dir /tmp/lab",
    "lab partition": "lab partition lab-02 --dir /tmp/lab",
    "lab heal": "lab heal lab-02 --dir /tmp/lab",
    "lab revive": "lab revive lab-02 --dir /tmp/lab",
    "lab freeze": "lab freeze lab-02 --dir /tmp/lab",
    "lab thaw": "lab thaw lab-02 --dir /tmp/lab",
    "lab inject": "lab inject lab-02 --dir /tmp/lab --gpu 0 --xid 79",
    "bench placement": "bench placement --nodes nodes.csv --pods pods.csv --seeds 42-51",
    "db check": "db check --fleet -i fleet.yaml",
    "db path": "db path",
    "controller run": "controller run -i fleet.yaml --lease 15 --renew 5",
    "controller status": "controller status -o json",
    "db migrate": "db migrate --to postgresql://gpuctl@db.example/gpuctl --dry-run",
    "metrics serve": "metrics serve -i fleet.yaml --port 9400",
    "metrics dump": "metrics dump --from-store",
    "playbook check": "playbook check sweep.yaml -i fleet.yaml",
    "playbook run": "playbook run sweep.yaml -i fleet.yaml --yes",
    "history prune": "history prune --dry-run --retention 30d",
    "history show": "history show --since 6h --node gpu01 --series util_pct -o csv",
}


def _after_command(ctx: ClickContext, param: ClickParameter, value: Any) -> Any:
    """A global option given after the command: it wins over the same before it."""
    if value is None or value is False:
        return value
    obj = ctx.find_root().obj
    if isinstance(obj, AppContext):
        setattr(obj, _GLOBAL_OPTIONS[str(param.name)], value)
        if param.name == "debug":
            _configure_logging(True)
    return value


def _bare_flag(param: ClickParameter) -> None:
    if getattr(param, "is_flag", False) and param.metavar is None:
        param.metavar = ""  # typer's help would say `<bool>`: the flag says it all


def _hide_help_type(command: ClickCommand) -> None:
    made = command.get_help_option

    def get_help_option(ctx: ClickContext) -> Any:
        option = made(ctx)
        if option is not None:
            _bare_flag(option)
        return option

    setattr(command, "get_help_option", get_help_option)  # noqa: B010 (a method of one object)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush raises nothing."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _debug(ctx: ClickContext) -> bool:
    obj = ctx.find_root().obj
    return bool(getattr(obj, "debug", False))


app = typer.Typer(
    cls=_Boundary,
    name="gpuctl",
    help="Keep a GPU fleet busy: status, placement, fragmentation and failover over SSH.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    inventory: Path | None = typer.Option(
        None,
        "-i",
        "--inventory",
        help="Inventory file or folder (default: $GPUCTL_INVENTORY).",
        show_default=False,
    ),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        help="gpuctl's state folder (default: $GPUCTL_STATE_DIR, then $XDG_STATE_HOME/gpuctl).",
        show_default=False,
    ),
    state_url: str | None = typer.Option(
        None,
        "--state-url",
        help="Keep the state in PostgreSQL, e.g. postgresql://gpuctl@db:5432/gpuctl (default: "
        "$GPUCTL_STATE_URL, else SQLite in the state folder). No password in it: libpq reads "
        "~/.pgpass (or $PGPASSFILE) or a service (?service=NAME).",
        show_default=False,
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    if isinstance(ctx.obj, AppContext):  # tests pass a prepared context (injected transport)
        ctx.obj.inventory_path = inventory or ctx.obj.inventory_path
        ctx.obj.state_dir = state_dir or ctx.obj.state_dir
        ctx.obj.state_url = state_url or ctx.obj.state_url
        ctx.obj.debug = debug or ctx.obj.debug
    else:
        ctx.obj = AppContext(
            inventory_path=inventory, state_dir=state_dir, state_url=state_url, debug=debug
        )
    _configure_logging(debug)


def _configure_logging(debug: bool) -> None:
    # paramiko logs tracebacks on its own threads; keep them out of the terminal unless --debug.
    logging.getLogger("paramiko").setLevel(logging.DEBUG if debug else logging.CRITICAL + 1)
    if debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)


status.register(app)
health.register(app)
place.register(app)
reconcile.register(app)
jobs.register(app)
nodeops.register(app)
consolidate.register(app)
dash.register(app)
app.add_typer(nodes.app, name="nodes")
app.add_typer(inventory_cmd.app, name="inventory")
app.add_typer(hosts.app, name="hosts")
app.add_typer(lab.app, name="lab")
app.add_typer(bench.app, name="bench")
app.add_typer(db.app, name="db")
app.add_typer(controller.app, name="controller")
app.add_typer(metrics.app, name="metrics")
app.add_typer(playbook.app, name="playbook")
app.add_typer(history.app, name="history")
report.register(app)


def run() -> None:
    try:
        app()
    except BrokenPipeError:  # raised outside a command too, e.g. `gpuctl --help | head -1`
        _silence_stdout()
        sys.exit(int(ExitCode.OK))
