"""Ansible inventories (INI or YAML) as a gpuctl inventory document (`gpuctl inventory import
ansible`).

Groups become groups (a host in a child group is in its parents too, nearest first; `all` and
`ungrouped` are not groups); `ansible_host`, `ansible_port`, `ansible_user` and
`ansible_ssh_private_key_file` become `host`, `port`, `user` and `key_file` (in `all`'s vars: the
file's `defaults`); every other variable whose value is a string becomes a label (host vars on the
node, group vars on the group, `all`'s vars on every node that does not set the key). Values that
are not strings, and keys that are not label keys, are skipped and listed. Host ranges
(`gpu[01:16]`, `n[1:9:2]`) expand. Every problem is an InventoryError naming the file and line.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from gpuctl.config.hostlist import HostlistError, expand
from gpuctl.errors import InventoryError

CONNECTION = {
    "ansible_host": "host",
    "ansible_ssh_host": "host",
    "ansible_port": "port",
    "ansible_ssh_port": "port",
    "ansible_user": "user",
    "ansible_ssh_user": "user",
    "ansible_ssh_private_key_file": "key_file",
    "ansible_private_key_file": "key_file",
}
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")
_RANGE = re.compile(r"\[(\d+):(\d+)(?::(\d+))?\]")
MAX_BYTES = 4 * 1024 * 1024


@dataclasses.dataclass
class _Group:
    vars: dict[str, Any] = dataclasses.field(default_factory=dict)
    hosts: list[str] = dataclasses.field(default_factory=list)
    children: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Inventory:
    groups: dict[str, _Group] = dataclasses.field(default_factory=dict)
    host_vars: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def group(self, name: str) -> _Group:
        return self.groups.setdefault(name, _Group())


@dataclasses.dataclass(frozen=True, slots=True)
class Imported:
    """The gpuctl inventory document, and what was left out (`where: key (why)`)."""

    document: dict[str, Any]
    skipped: tuple[str, ...]
    nodes: int


def import_ansible(path: Path) -> Imported:
    """Read the Ansible inventory at `path` (YAML when it parses as a mapping, else INI)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InventoryError(
            f"cannot read the Ansible inventory: {exc.strerror}", path=str(path)
        ) from None
    if len(raw) > MAX_BYTES:
        raise InventoryError("the Ansible inventory is over 4 MiB", path=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InventoryError("the Ansible inventory is not UTF-8 text", path=str(path)) from None
    if path.suffix in (".yaml", ".yml") or _looks_like_yaml(text):
        inv = _read_yaml(path, text)
    else:
        inv = _read_ini(path, text)
    return _convert(path, inv)


def _fail(path: Path, line: int | None, message: str) -> InventoryError:
    where = f"{path}:{line}" if line is not None else str(path)
    return InventoryError(f"{where}: {message}")


def _looks_like_yaml(text: str) -> bool:
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and ln[0] not in "#;"), "")
    return not first.startswith("[") and first.endswith(":")


def _hosts_of(path: Path, line: int | None, pattern: str) -> tuple[str, ...]:
    """An Ansible host pattern (`gpu[01:16]`, `n[1:9:2]`) expanded."""
    hostlist = _RANGE.sub(
        lambda m: f"[{m.group(1)}-{m.group(2)}" + (f"/{m.group(3)}]" if m.group(3) else "]"),
        pattern,
    )
    if "[" in hostlist and _RANGE.search(pattern) is None:
        raise _fail(path, line, f"host range {pattern!r}: only numeric ranges [N:M] are read")
    try:
        return expand(hostlist)
    except HostlistError as exc:
        raise _fail(path, line, f"host {pattern!r}: {exc}") from None


# --- INI -----------------------------------------------------------------------------------------


def _read_ini(path: Path, text: str) -> _Inventory:
    inv = _Inventory()
    section, kind = "ungrouped", "hosts"
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("["):
            if not stripped.endswith("]"):
                raise _fail(path, n, f"a section header must end with ']' (got {stripped!r})")
            name, _, kind = stripped[1:-1].partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise _fail(path, n, f"unknown section kind {kind!r} (hosts, vars or children)")
            section = name.strip()
            inv.group(section)
            continue
        if kind == "vars":
            key, eq, value = stripped.partition("=")
            if not eq:
                raise _fail(path, n, f"[{section}:vars]: expected key=value (got {stripped!r})")
            inv.group(section).vars[key.strip()] = _ini_value(value.strip())
        elif kind == "children":
            inv.group(section).children.append(stripped)
            inv.group(stripped)
        else:
            pattern, *pairs = _split(path, n, stripped)
            host_vars: dict[str, Any] = {}
            for pair in pairs:
                key, eq, value = pair.partition("=")
                if not eq:
                    raise _fail(path, n, f"host {pattern!r}: expected key=value (got {pair!r})")
                host_vars[key] = _ini_value(value)
            for host in _hosts_of(path, n, pattern):
                inv.group(section).hosts.append(host)
                inv.host_vars.setdefault(host, {}).update(host_vars)
    return inv


def _split(path: Path, n: int, line: str) -> list[str]:
    import shlex

    try:
        return shlex.split(line, comments=True)
    except ValueError as exc:
        raise _fail(path, n, f"cannot read the host line: {exc}") from None


def _ini_value(value: str) -> Any:
    """As Ansible reads INI values: numbers and booleans are not strings."""
    if re.fullmatch(r"-?\d+(\.\d+)?", value) or value.lower() in ("true", "false"):
        return yaml.safe_load(value)
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


# --- YAML ----------------------------------------------------------------------------------------


def _read_yaml(path: Path, text: str) -> _Inventory:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise _fail(path, None if mark is None else mark.line + 1, str(problem)) from None
    if not isinstance(data, dict):
        raise _fail(path, None, "expected a mapping of groups at the top (all: ...)")
    inv = _Inventory()
    for name, body in data.items():
        _yaml_group(path, inv, str(name), body, f"{name}")
    return inv


def _yaml_group(path: Path, inv: _Inventory, name: str, body: Any, where: str) -> None:
    group = inv.group(name)
    if body is None:
        return
    if not isinstance(body, dict):
        raise _fail(path, None, f"{where}: a group must be a mapping (hosts, vars, children)")
    unknown = set(body) - {"hosts", "vars", "children"}
    if unknown:
        raise _fail(
            path, None, f"{where}: unknown key {sorted(unknown)[0]!r} (hosts, vars, children)"
        )
    for key in ("hosts", "vars", "children"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise _fail(path, None, f"{where}.{key}: must be a mapping")
    group.vars.update(body.get("vars") or {})
    for pattern, host_vars in (body.get("hosts") or {}).items():
        if host_vars is not None and not isinstance(host_vars, dict):
            raise _fail(path, None, f"{where}.hosts.{pattern}: host vars must be a mapping")
        for host in _hosts_of(path, None, str(pattern)):
            group.hosts.append(host)
            inv.host_vars.setdefault(host, {}).update(host_vars or {})
    for child, child_body in (body.get("children") or {}).items():
        group.children.append(str(child))
        _yaml_group(path, inv, str(child), child_body, f"{where}.children.{child}")


# --- to gpuctl -----------------------------------------------------------------------------------


def _convert(path: Path, inv: _Inventory) -> Imported:
    skipped: list[str] = []
    parents: dict[str, list[str]] = {}
    for name, group in inv.groups.items():
        for child in group.children:
            parents.setdefault(child, []).append(name)
    member: dict[str, list[str]] = {}
    for name, group in inv.groups.items():
        for host in group.hosts:
            member.setdefault(host, [])
            if name not in member[host]:
                member[host].append(name)
    hosts = list(inv.host_vars)
    if not hosts:
        raise _fail(path, None, "the Ansible inventory has no hosts")

    def ancestry(host: str) -> list[str]:
        out: list[str] = []
        frontier = list(member.get(host, []))
        while frontier:
            out += [g for g in frontier if g not in out]
            frontier = [p for g in frontier for p in parents.get(g, []) if p not in out]
        return [g for g in out if g not in ("all", "ungrouped")]

    document: dict[str, Any] = {}
    all_vars = inv.groups["all"].vars if "all" in inv.groups else {}
    defaults, all_labels = _split_vars("all.vars", all_vars, skipped, allow_host=False)
    if defaults:
        document["defaults"] = defaults
    groups: dict[str, Any] = {}
    for name, group in inv.groups.items():
        if name in ("all", "ungrouped"):
            continue
        settings, labels = _split_vars(f"{name}.vars", group.vars, skipped, allow_host=False)
        entry = dict(settings)
        if labels:
            entry["labels"] = labels
        groups[name] = entry
    if groups:
        document["groups"] = groups
    nodes = []
    for host in hosts:
        settings, labels = _split_vars(host, inv.host_vars[host], skipped, allow_host=True)
        node: dict[str, Any] = {"name": host, **settings}
        in_groups = ancestry(host)
        if in_groups:
            node["groups"] = in_groups
        set_by_groups = {k for g in in_groups for k in groups[g].get("labels", {})}
        extra = {k: v for k, v in all_labels.items() if k not in set_by_groups and k not in labels}
        if labels or extra:
            node["labels"] = {**extra, **labels}
        nodes.append(node)
    document["nodes"] = nodes
    return Imported(document, tuple(skipped), len(nodes))


def _split_vars(
    where: str, variables: dict[str, Any], skipped: list[str], *, allow_host: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    settings: dict[str, Any] = {}
    labels: dict[str, str] = {}
    for key, value in variables.items():
        key = str(key)
        field = CONNECTION.get(key)
        if field == "host" and not allow_host:
            skipped.append(f"{where}: {key} (a host address only means something on a host)")
        elif field == "port":
            try:
                settings["port"] = int(value)
            except (TypeError, ValueError):
                skipped.append(f"{where}: {key} (not a port number: {value!r})")
        elif field is not None:
            settings[field] = str(value)
        elif key.startswith("ansible_"):
            skipped.append(f"{where}: {key} (an Ansible setting gpuctl has no use for)")
        elif not isinstance(value, str):
            skipped.append(f"{where}: {key} (not a string: {type(value).__name__})")
        elif not _LABEL_KEY.match(key):
            skipped.append(f"{where}: {key} (not a label key)")
        else:
            labels[key] = value
    return settings, labels
