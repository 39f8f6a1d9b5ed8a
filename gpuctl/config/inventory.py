"""The inventory: YAML files naming the nodes gpuctl reaches, resolved into `core.model.Inventory`.

A file has four optional sections: `defaults` (for the nodes of that file), `groups` (named
settings and labels, shared by every file of the inventory), `nodes` and `slurm` (the nodes
also come from a Slurm cluster: `gpuctl.ops.slurm` reads them; docs/slurm.md). Precedence, highest
first: the node, its groups in the order listed, the file's defaults, the built-ins (port 22,
the current user, timeouts 5 s / 10 s, transport ssh). A node name (and host) may hold hostlist
ranges, `gpu[01-16]` or `rack[1-2]-gpu[01-04]` (ClusterShell's NodeSet, through
`gpuctl.config.hostlist`), which expand to one node per name. Every problem is an
`InventoryError` (exit 2) naming file, line and field; docs/inventory.md lists them.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field

from gpuctl.config.document import Document, Loc
from gpuctl.config.hostlist import HostlistError, expand
from gpuctl.config.loader import load_document, validate_data
from gpuctl.core.history import parse_retention
from gpuctl.core.model import Inventory, NodeSpec, SlurmSource, parse_jump
from gpuctl.errors import ConfigError, InventoryError

KIND = "inventory"
MAX_NODES = 100_000  # nodes in a whole inventory

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
HOST_RE = re.compile(r"^[A-Za-z0-9_.:%-]{1,253}$")
USER_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


# --- value rules ---------------------------------------------------------------------------------


def name_problem(value: str) -> str | None:
    """Why `value` is not a valid node or group name, or None."""
    if value.startswith("-"):
        return f"must not start with '-' (got {value!r})"
    if not NAME_RE.match(value):
        return (
            "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit "
            f"(got {value!r})"
        )
    return None


def host_problem(value: str) -> str | None:
    if value.startswith("-"):
        return f"must not start with '-' (got {value!r})"
    if not HOST_RE.match(value):
        return (
            "must be a host name or IP address: letters, digits, '.', '-', '_', ':' or '%' "
            f"(got {value!r})"
        )
    return None


def _rule(check: Any) -> AfterValidator:
    def validate(value: str) -> str:
        problem = check(value)
        if problem:
            raise ValueError(problem)
        return value

    return AfterValidator(validate)


def _user_problem(value: str) -> str | None:
    if value.startswith("-"):
        return f"must not start with '-' (got {value!r})"
    if not USER_RE.match(value):
        return f"must be a user name: letters, digits, '.', '_', '-' or '@' (got {value!r})"
    return None


def _label_key_problem(value: str) -> str | None:
    if not LABEL_KEY_RE.match(value):
        return (
            "must be 1-63 letters, digits, '.', '_', '/' or '-', starting with a letter or digit "
            f"(got {value!r})"
        )
    return None


def _text_problem(value: str) -> str | None:
    if _CONTROL.search(value):
        return "must not contain control characters"
    return None


def _jump_problem(value: str) -> str | None:
    try:
        parse_jump(value)
    except ValueError as exc:
        return str(exc)
    return None


def _retention_problem(value: str) -> str | None:
    try:
        parse_retention(value)
    except ValueError as exc:
        return str(exc)
    return None


def _as_list(value: object) -> object:
    return [value] if isinstance(value, str) else value


Name = Annotated[str, _rule(name_problem)]
User = Annotated[str, _rule(_user_problem)]
Text = Annotated[str, Field(max_length=128), _rule(_text_problem)]
FilePath = Annotated[str, Field(min_length=1, max_length=4096), _rule(_text_problem)]
LabelKey = Annotated[str, _rule(_label_key_problem)]
Port = Annotated[int, Field(ge=1, le=65535)]
Jump = Annotated[str, Field(min_length=1, max_length=1024), _rule(_jump_problem)]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
GpuCount = Annotated[int, Field(ge=0, le=1024)]
Retention = Annotated[str, Field(max_length=32), _rule(_retention_problem)]


# --- the file schema -----------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Defaults(_Model):
    """Connection settings for every node of the file. None: not set here."""

    user: User | None = None
    allow_root: bool | None = None  # `user: root` is refused unless this says so
    port: Port | None = None
    key_file: FilePath | None = None
    known_hosts: Annotated[list[FilePath] | None, BeforeValidator(_as_list)] = None
    connect_timeout_s: Seconds | None = None
    command_timeout_s: Seconds | None = None
    transport: Literal["ssh", "local"] | None = None
    # jump hosts, as ssh_config's ProxyJump: `[user@]host[:port]`, comma-separated, or `none`
    jump: Jump | None = Field(None, validation_alias=AliasChoices("jump", "proxy_jump"))
    ssh_config: FilePath | None = None  # the operator's ssh_config to read; `none`: read none


class FileDefaults(Defaults):
    """`defaults:`: every node's settings, and the fleet's own (not for a group or a node)."""

    history_retention: Retention | None = None  # how long the fleet's history is kept: 30d


class Group(Defaults):
    """A named set of settings and labels that nodes join with `group:` or `groups:`."""

    labels: dict[LabelKey, Text] = Field(default_factory=dict)
    gpus: GpuCount | None = None
    gpu_model: Text | None = None


class NodeEntry(Group):
    """One `nodes:` entry: one node, or one per value of a hostlist range in `name`."""

    name: str = Field(min_length=1, max_length=256)
    host: str | None = Field(None, min_length=1, max_length=512)
    group: Name | None = None
    groups: list[Name] | None = None


class SlurmSection(_Model):
    """`slurm:`: read the nodes from a Slurm cluster, its commands run `local`ly or over SSH on
    `login` (a `nodes:` entry's name, or a host reached with the file's defaults)."""

    cluster: Name | None = None
    via: Literal["local", "ssh"] = "local"
    login: str | None = Field(None, min_length=1, max_length=253)
    partitions: Annotated[list[Text] | None, BeforeValidator(_as_list)] = None
    address: Literal["NodeAddr", "NodeHostName", "name"] = "NodeAddr"
    conf: FilePath | None = None  # SLURM_CONF for the commands (on the login node with ssh)


class InventoryFile(_Model):
    defaults: FileDefaults = Field(default_factory=FileDefaults)
    groups: dict[Name, Group] = Field(default_factory=dict)
    nodes: list[NodeEntry] = Field(default_factory=list)
    slurm: SlurmSection | None = None


# --- loading -------------------------------------------------------------------------------------


def inventory_files(path: Path) -> tuple[Path, ...]:
    """The file itself, or a folder's `*.yaml` / `*.yml` (sorted, not recursive, no dot files)."""
    if not path.exists():
        raise InventoryError("inventory not found", path=str(path))
    if not path.is_dir():
        return (path,)
    files = sorted(
        p
        for p in path.iterdir()
        if p.suffix in (".yaml", ".yml") and not p.name.startswith(".") and p.is_file()
    )
    if not files:
        raise InventoryError(
            "no *.yaml or *.yml files in the inventory folder",
            path=str(path),
            hint="add a file such as nodes.yaml, or pass a file with -i",
        )
    return tuple(files)


@dataclass(frozen=True, slots=True)
class _Source:
    doc: Document
    spec: InventoryFile


@dataclass(frozen=True, slots=True)
class _Layer:
    """One level of settings, the folder its relative paths resolve against, and where it is."""

    settings: Defaults
    base: Path
    doc: Document
    loc: Loc


def load_inventory(path: Path) -> Inventory:
    """Read, validate and resolve an inventory file or folder. Raises InventoryError."""
    sources = []
    for file in inventory_files(path):
        doc = load_document(file, kind=KIND, error=InventoryError)
        spec = validate_data(
            doc.data, InventoryFile, path=doc.path, lines=doc.lines, error=InventoryError
        )
        sources.append(_Source(doc, spec))
    groups = _collect_groups(sources)
    nodes: list[NodeSpec] = []
    names: dict[str, NodeSpec] = {}
    addresses: dict[str, NodeSpec] = {}
    for src in sources:
        for i, entry in enumerate(src.spec.nodes):
            for node in _resolve_entry(src, i, entry, groups):
                _check_unique(src.doc, i, node, names, addresses)
                nodes.append(node)
                if len(nodes) > MAX_NODES:
                    raise src.doc.error(
                        ("nodes", i), f"more than {MAX_NODES:,} nodes", error=InventoryError
                    )
    slurm = _slurm_source(sources, groups, nodes)
    if not nodes and slurm is None:
        raise InventoryError(
            "the inventory has no nodes",
            path=str(path),
            hint="add a `nodes:` list; see inventory/example.yaml",
        )
    return Inventory(
        nodes=tuple(nodes),
        sources=tuple(str(s.doc.path) for s in sources),
        slurm=slurm,
        history_retention_s=_history_retention(sources),
    )


def _history_retention(sources: Sequence[_Source]) -> int | None:
    """`defaults: history_retention:` in seconds; set in one file of a folder at most."""
    found = [s for s in sources if s.spec.defaults.history_retention is not None]
    if len(found) > 1:
        first = found[0].doc.where(("defaults", "history_retention"))
        raise found[1].doc.error(
            ("defaults", "history_retention"),
            f"is set a second time (first at {first})",
            error=InventoryError,
        )
    text = found[0].spec.defaults.history_retention if found else None
    return None if text is None else parse_retention(text)


def _slurm_source(
    sources: Sequence[_Source], groups: dict[str, tuple[Group, _Source]], nodes: list[NodeSpec]
) -> SlurmSource | None:
    """The one `slurm:` section of the inventory, resolved: its login node (a `nodes:` entry by
    name, else a host with the file's defaults) and the defaults as a template for the nodes
    only Slurm names."""
    found = [s for s in sources if s.spec.slurm is not None]
    if not found:
        return None
    if len(found) > 1:
        first = found[0].doc.where(("slurm",))
        raise found[1].doc.error(
            ("slurm",), f"a second slurm: section (first at {first})", error=InventoryError
        )
    src = found[0]
    section = src.spec.slurm
    assert section is not None
    template = next(iter(_resolve_entry(src, -1, NodeEntry(name="slurm-node"), groups)))
    login = None
    if section.via == "ssh":
        if section.login is None:
            raise src.doc.error(
                ("slurm", "via"),
                "is ssh: name the login node with slurm: login: (a node or a host)",
                error=InventoryError,
            )
        login = next((n for n in nodes if n.name == section.login), None)
        if login is None:
            problem = host_problem(section.login)
            if problem:
                raise src.doc.error(("slurm", "login"), problem, error=InventoryError)
            login = dataclasses.replace(template, name=section.login, host=section.login)
    elif section.login is not None:
        raise src.doc.error(
            ("slurm", "login"), "is set but via is local: set via: ssh", error=InventoryError
        )
    return SlurmSource(
        via=section.via,
        login=login,
        cluster=section.cluster,
        partitions=tuple(section.partitions or ()),
        address=section.address,
        conf=section.conf,
        template=template,
        source=src.doc.where(("slurm",)),
    )


def _collect_groups(sources: Sequence[_Source]) -> dict[str, tuple[Group, _Source]]:
    groups: dict[str, tuple[Group, _Source]] = {}
    for src in sources:
        for name, group in src.spec.groups.items():
            if name in groups:
                first = groups[name][1].doc.where(("groups", name))
                raise src.doc.error(
                    ("groups", name),
                    f"duplicate group {name!r} (first at {first})",
                    error=InventoryError,
                )
            groups[name] = (group, src)
    return groups


def _resolve_entry(
    src: _Source, i: int, entry: NodeEntry, groups: dict[str, tuple[Group, _Source]]
) -> Iterator[NodeSpec]:
    doc = src.doc
    loc: Loc = ("nodes", i)

    def fail(where: str | Loc, message: str, hint: str | None = None) -> ConfigError:
        field = (where,) if isinstance(where, str) else where
        return doc.error((*loc, *field), message, hint=hint, error=InventoryError)

    if entry.group is not None and entry.groups is not None:
        raise fail("groups", "use either 'group' or 'groups', not both")
    group_names = [entry.group] if entry.group is not None else list(entry.groups or ())
    layers = [_Layer(entry, doc.path.parent, doc, loc)]
    member_of: list[Group] = []
    for g, gname in enumerate(group_names):
        where: str | Loc = "group" if entry.group is not None else ("groups", g)
        if gname not in groups:
            raise fail(where, f"unknown group {gname!r}", _group_hint(gname, groups))
        if gname in group_names[:g]:
            raise fail(where, f"group {gname!r} is listed twice")
        group, gsrc = groups[gname]
        layers.append(_Layer(group, gsrc.doc.path.parent, gsrc.doc, ("groups", gname)))
        member_of.append(group)
    layers.append(_Layer(src.spec.defaults, doc.path.parent, doc, ("defaults",)))
    _check_root(layers, entry.name)

    try:
        names = expand(entry.name)
    except HostlistError as exc:
        raise fail("name", str(exc)) from None
    if entry.host is None:
        hosts = names
    else:
        try:
            hosts = expand(entry.host)
        except HostlistError as exc:
            raise fail("host", str(exc)) from None
        if len(hosts) != len(names):
            if len(hosts) == 1:
                message = f"one host for {len(names)} names: give host a range too, or drop it"
            else:
                message = f"the range gives {len(hosts)} hosts but name gives {len(names)} names"
            raise fail("host", message)

    def pick(key: str) -> tuple[Any, Path]:
        for layer in layers:
            value = getattr(layer.settings, key)
            if value is not None:
                return value, layer.base
        return None, doc.path.parent

    key_file, key_base = pick("key_file")
    known_hosts, kh_base = pick("known_hosts")
    jump, ssh_config = pick("jump")[0], pick("ssh_config")
    labels: dict[str, str] = {}
    for group in reversed(member_of):  # the first group listed wins
        labels.update(group.labels)
    labels.update(entry.labels)
    labels = dict(sorted(labels.items()))
    settings = {
        "port": pick("port")[0] or 22,
        "port_set": pick("port")[0] is not None,  # else ssh_config's Port may apply
        "jump": None if jump is None else parse_jump(jump),
        "ssh_config": (
            ssh_config[0]
            if ssh_config[0] in (None, "none")
            else _local_path(ssh_config[0], ssh_config[1])
        ),
        "user": pick("user")[0],
        "allow_root": pick("allow_root")[0] is True,
        "key_file": _local_path(key_file, key_base) if key_file is not None else None,
        "known_hosts": tuple(_local_path(p, kh_base) for p in known_hosts or ()),
        "groups": tuple(group_names),
        "expected_gpus": _first(entry.gpus, *(g.gpus for g in member_of)),
        "expected_model": _first(entry.gpu_model, *(g.gpu_model for g in member_of)),
        "transport": pick("transport")[0] or "ssh",
        "connect_timeout_s": float(pick("connect_timeout_s")[0] or 5.0),
        "command_timeout_s": float(pick("command_timeout_s")[0] or 10.0),
        "source": doc.where(loc),
    }
    for name, host in zip(names, hosts, strict=True):
        problem = name_problem(name)
        if problem:
            raise fail("name", problem)
        problem = host_problem(host)
        if problem:
            raise fail("host" if entry.host is not None else "name", problem)
        yield NodeSpec(name=name, host=host, **{**settings, "labels": dict(labels)})


def _check_root(layers: Sequence[_Layer], name: str) -> None:
    """`user: root` needs `allow_root: true` (nearest setting wins, as for every other key): an
    inventory never logs in as root by accident."""
    user = next((layer for layer in layers if layer.settings.user is not None), None)
    if user is None or user.settings.user != "root":
        return
    if _first(*(layer.settings.allow_root for layer in layers)) is True:
        return
    raise user.doc.error(
        (*user.loc, "user"),
        f"is root: gpuctl would log in to {name} as root and run jobs there as root; set "
        "allow_root: true to mean it",
        hint="use a dedicated unprivileged account on the nodes (README: the inventory)",
        error=InventoryError,
    )


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _local_path(value: str, base: Path) -> str:
    """`~` expanded; a relative path resolves against the folder of the file that set it."""
    expanded = Path(os.path.expanduser(value))  # noqa: PTH111 - also expands ~user
    return str(expanded if expanded.is_absolute() else (base / expanded).absolute())


def _group_hint(name: str, groups: dict[str, tuple[Group, _Source]]) -> str:
    if not groups:
        return "no groups are defined: add a top-level `groups:` section"
    close = difflib.get_close_matches(name, list(groups), n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return "defined groups: " + ", ".join(sorted(groups))


def _check_unique(
    doc: Document,
    i: int,
    node: NodeSpec,
    names: dict[str, NodeSpec],
    addresses: dict[str, NodeSpec],
) -> None:
    first = names.get(node.name)
    if first is not None:
        raise doc.error(
            ("nodes", i, "name"),
            f"duplicate node name {node.name!r} (first at {first.source})",
            error=InventoryError,
        )
    names[node.name] = node
    if node.transport != "ssh":
        return
    address = f"{node.host.lower()}:{node.port}"
    other = addresses.get(address)
    if other is not None:
        raise doc.error(
            ("nodes", i, "host" if doc.lines.exact(("nodes", i, "host")) else "name"),
            f"duplicate address {node.host}:{node.port} "
            f"(node {other.name!r} at {other.source} has it too)",
            error=InventoryError,
        )
    addresses[address] = node
