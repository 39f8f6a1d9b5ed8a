"""Job specs as stores before schema v4 kept them: the spec file's keys, as the spec file's model
dumped them after validation (`mem_per_gpu: 24GiB`, `cpu: 500m`, `secret_env` names and
`secret_files`), read into the core's `JobSpec`.

This format is frozen: it is what older gpuctl versions wrote, so it is read here on its own terms
and never follows the spec file's schema as that evolves. The v4 migration rewrites every such row
with `JobSpec.to_dict`; a store opened read-only at an older version reads them through this too.
A key unknown to the format, or a value it cannot hold, is a `SpecDataError` naming the field; a
key missing takes the default the spec file had (a row written before that key existed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gpuctl.core.jobs.spec import (
    DEFAULT_GRACE_S,
    DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S,
    DEFAULT_RESTART_BUDGET,
    CheckpointPolicy,
    CheckpointSync,
    JobPolicy,
    JobSpec,
    SecretRef,
    SliceEnforcement,
    SpecDataError,
)
from gpuctl.core.placement.model import JobRequest, JobShape, LabelRequirement, Tier
from gpuctl.core.units import UnitError, parse_cpu_milli, parse_mem_mib, parse_mem_per_card

ANY_VALUE = "*"  # an affinity value matching any value of its label
T = TypeVar("T")

_TOP = frozenset(
    {
        "name",
        "command",
        "resources",
        "tier",
        "priority",
        "group",
        "labels",
        "affinity",
        "workdir",
        "env",
        "secret_env",
        "secret_files",
        "checkpoint",
        "restart_budget",
        "grace_s",
        "slice_enforcement",
        "disruptible",
        "min_runtime_between_moves",
    }
)
_RESOURCES = frozenset({"gpus", "mem_per_gpu", "gpu_models", "cpu", "host_mem"})
_AFFINITY = frozenset({"nodes", "avoid_nodes", "avoid_jobs", "avoid_groups"})
_CHECKPOINT = frozenset({"dir", "sync"})


def is_legacy(data: Any) -> bool:
    """A spec in the pre-v4 form (the new one holds `request` and `policy`)."""
    return isinstance(data, dict) and "request" not in data and "policy" not in data


def spec_from_legacy(data: Any) -> JobSpec:
    top = _mapping(data, "spec", _TOP)
    if "name" not in top:
        raise SpecDataError("name", "missing")
    if "resources" not in top:
        raise SpecDataError("resources", "missing")
    res = _mapping(top["resources"], "resources", _RESOURCES)
    aff = _mapping(top.get("affinity", {}), "affinity", _AFFINITY)
    ckpt = _mapping(top.get("checkpoint", {}), "checkpoint", _CHECKPOINT)
    files = _mapping(top.get("secret_files", {}), "secret_files", None)
    mem = res.get("mem_per_gpu", "whole")
    try:
        shape = JobShape(
            gpus=_int(res.get("gpus", 1), "resources.gpus"),
            mem_per_card=_unit(parse_mem_per_card, mem, "mem_per_gpu"),
            gpu_models=_strings(res.get("gpu_models", []), "resources.gpu_models"),
            cpu_milli=0 if res.get("cpu") is None else _unit(parse_cpu_milli, res["cpu"], "cpu"),
            host_mem_mib=(
                0
                if res.get("host_mem") is None
                else _unit(parse_mem_mib, res["host_mem"], "host_mem")
            ),
        )
        request = JobRequest(
            name=_str(top["name"], "name"),
            shape=shape,
            tier=Tier(top.get("tier", Tier.STANDARD.value)),
            priority=_int(top.get("priority", 0), "priority"),
            labels=_string_map(top.get("labels", {}), "labels"),
            node_affinity=_requirements(aff.get("nodes", {}), "affinity.nodes"),
            node_anti_affinity=_requirements(aff.get("avoid_nodes", {}), "affinity.avoid_nodes"),
            group=_optional_str(top.get("group"), "group"),
            avoid_jobs=_strings(aff.get("avoid_jobs", []), "affinity.avoid_jobs"),
            avoid_groups=_strings(aff.get("avoid_groups", []), "affinity.avoid_groups"),
        )
        policy = JobPolicy(
            grace_s=_number(top.get("grace_s", DEFAULT_GRACE_S), "grace_s"),
            restart_budget=_int(
                top.get("restart_budget", DEFAULT_RESTART_BUDGET), "restart_budget"
            ),
            checkpoint=CheckpointPolicy(
                _optional_str(ckpt.get("dir"), "checkpoint.dir"),
                CheckpointSync(ckpt.get("sync", CheckpointSync.PULL.value)),
            ),
            slice_enforcement=SliceEnforcement(
                top.get("slice_enforcement", SliceEnforcement.OBSERVE.value)
            ),
            disruptible=_bool(top.get("disruptible", True), "disruptible"),
            min_runtime_between_moves_s=_number(
                top.get("min_runtime_between_moves", DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S),
                "min_runtime_between_moves",
            ),
        )
        names = _strings(top.get("secret_env", []), "secret_env")
        command = top.get("command")
        return JobSpec(
            request=request,
            policy=policy,
            command=() if command is None else _strings(command, "command"),
            workdir=_optional_str(top.get("workdir"), "workdir"),
            env=_string_map(top.get("env", {}), "env"),
            secrets=tuple(
                SecretRef(n, _optional_str(files.get(n), f"secret_files.{n}")) for n in names
            ),
        )
    except SpecDataError:
        raise
    except ValueError as exc:  # an enum or a core type refusing a value
        raise SpecDataError("spec", str(exc)) from None


def _mapping(value: Any, where: str, keys: frozenset[str] | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecDataError(where, "must be a mapping")
    if keys is not None:
        extra = sorted(set(value) - keys)
        if extra:
            field = extra[0] if where == "spec" else f"{where}.{extra[0]}"
            raise SpecDataError(field, "unknown key")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SpecDataError(where, "must be text")
    return value


def _optional_str(value: Any, where: str) -> str | None:
    return None if value is None else _str(value, where)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecDataError(where, "must be an integer")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecDataError(where, "must be a number")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SpecDataError(where, "must be true or false")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise SpecDataError(where, "must be a list")
    return tuple(_str(v, f"{where}[{i}]") for i, v in enumerate(value))


def _string_map(value: Any, where: str) -> dict[str, str]:
    found = _mapping(value, where, None)
    return {k: _str(v, f"{where}.{k}") for k, v in found.items()}


def _unit(parse: Callable[[Any], T], value: Any, key: str) -> T:
    try:
        return parse(value)
    except UnitError as exc:
        raise SpecDataError(f"resources.{key}", str(exc)) from None


def _requirements(value: Any, where: str) -> tuple[LabelRequirement, ...]:
    match = _mapping(value, where, None)
    out = []
    for key in sorted(match):
        v = match[key]
        values = (_str(v, f"{where}.{key}"),) if isinstance(v, str) else _strings(v, where)
        out.append(LabelRequirement(key, () if ANY_VALUE in values else values))
    return tuple(out)
