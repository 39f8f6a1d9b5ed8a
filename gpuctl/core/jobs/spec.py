"""A job's spec as the core knows it: frozen and typed, built once from a spec file by
`gpuctl.config.jobspec` at submit, stored through `to_dict` / `from_dict`.

- `request`: what placement is asked (shape, constraints, tier, priority; its name is the spec's
  name, a stored job's placement request is named by the job's id);
- `policy`: how gpuctl treats it (stop grace, restart budget, checkpoints, slice enforcement,
  whether and how often consolidation may move it);
- how it runs: argv, workdir, plain env, and the secrets it needs, by name and source (a value
  is read at every launch and never stored).

`from_dict` is strict: a missing key, an unknown key or a value of the wrong type raises
`SpecDataError` naming the field (`request.shape.gpus`), so a spec another gpuctl wrote fails
loudly instead of running with a default.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpuctl.core.placement.model import JobRequest, JobShape, LabelRequirement, Tier
from gpuctl.core.units import MemPerCard

JOB_ID_PLACEHOLDER = "{job_id}"
DEFAULT_CHECKPOINT_DIR = "~/.gpuctl/checkpoints/" + JOB_ID_PLACEHOLDER
DEFAULT_RESTART_BUDGET = 3
DEFAULT_GRACE_S = 30.0
DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S = 1800.0


class CheckpointSync(enum.StrEnum):
    SHARED = "shared"  # the checkpoint dir is on storage every node sees
    PULL = "pull"  # gpuctl copies committed checkpoints to its own store and ships them


class SliceEnforcement(enum.StrEnum):
    OBSERVE = "observe"  # over-slice jobs raise an event
    STOP = "stop"  # ... and are stopped with a checkpoint request


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """Where the job writes checkpoints on its node (`{job_id}` filled in at launch; None: the
    default folder in the node's home), and how they survive the node."""

    dir: str | None = None
    sync: CheckpointSync = CheckpointSync.PULL

    def dir_for(self, job_id: str) -> str:
        return (self.dir or DEFAULT_CHECKPOINT_DIR).replace(JOB_ID_PLACEHOLDER, job_id)


@dataclasses.dataclass(frozen=True, slots=True)
class JobPolicy:
    grace_s: float = DEFAULT_GRACE_S  # SIGTERM -> SIGKILL
    restart_budget: int = DEFAULT_RESTART_BUDGET  # restarts after the job's own failures
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    slice_enforcement: SliceEnforcement = SliceEnforcement.OBSERVE
    disruptible: bool = True  # False: consolidation never moves it
    # consolidation leaves it alone this long after a (re)start
    min_runtime_between_moves_s: float = DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S


@dataclasses.dataclass(frozen=True, slots=True)
class SecretRef:
    """A secret the job needs: its name (the variable it gets) and where its value is read at
    each launch: a file on the operator's machine, or (None) the variable of that name there."""

    name: str
    file: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Backend:
    """Who runs a job other than gpuctl's control loop: `kind` "slurm", the scheduler's own job id
    (Slurm keeps it across requeues), its cluster, and `run_dir`, the folder on the cluster's
    shared file system holding the job's output and exit marker (`output.log`, `exit`)."""

    kind: str
    id: str
    run_dir: str
    cluster: str | None = None

    @property
    def output(self) -> str:
        return f"{self.run_dir}/output.log"


@dataclasses.dataclass(frozen=True, slots=True)
class JobSpec:
    request: JobRequest
    policy: JobPolicy = JobPolicy()
    command: tuple[str, ...] = ()  # argv; empty: a spec for `gpuctl place` only
    workdir: str | None = None  # on the node
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    secrets: tuple[SecretRef, ...] = ()
    backend: Backend | None = None  # None: gpuctl's control loop runs it

    @property
    def name(self) -> str:
        return self.request.name

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (what the state store keeps): secret names and files, never a value.
        `backend` only when another scheduler runs the job (older rows have none)."""
        data: dict[str, Any] = {
            "name": self.name,
            "request": _request_dict(self.request),
            "policy": _policy_dict(self.policy),
            "command": list(self.command),
            "workdir": self.workdir,
            "env": dict(self.env),
            "secrets": [{"name": s.name, "file": s.file} for s in self.secrets],
        }
        if self.backend is not None:
            data["backend"] = dataclasses.asdict(self.backend)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        """The inverse of `to_dict`; `SpecDataError` naming the field for anything else.

        The store reads every job's spec at every read of its jobs (a pass reads them several
        times), so what `to_dict` wrote is read in one straight pass over the data; only
        something else is walked key by key to say where it is wrong."""
        try:
            return _read_fast(data)
        except (_NotAsWritten, KeyError, TypeError, ValueError):
            return _read_slow(data)


class SpecDataError(ValueError):
    """A stored spec that `JobSpec.from_dict` cannot read; `field` is where (`policy.grace_s`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.problem = message


# --- to plain data ------------------------------------------------------------------------------


def _mem_dict(mem: MemPerCard) -> dict[str, Any]:
    if mem.whole:
        return {"whole": True}
    if mem.fraction is not None:
        return {"fraction": mem.fraction}
    return {"mib": mem.mib}


def _requirements_list(reqs: tuple[LabelRequirement, ...]) -> list[dict[str, Any]]:
    return [{"key": r.key, "values": list(r.values)} for r in reqs]


def _request_dict(r: JobRequest) -> dict[str, Any]:
    s = r.shape
    return {
        "shape": {
            "gpus": s.gpus,
            "mem_per_card": _mem_dict(s.mem_per_card),
            "gpu_models": list(s.gpu_models),
            "cpu_milli": s.cpu_milli,
            "host_mem_mib": s.host_mem_mib,
        },
        "tier": r.tier.value,
        "priority": r.priority,
        "labels": dict(r.labels),
        "node_affinity": _requirements_list(r.node_affinity),
        "node_anti_affinity": _requirements_list(r.node_anti_affinity),
        "group": r.group,
        "avoid_jobs": list(r.avoid_jobs),
        "avoid_groups": list(r.avoid_groups),
    }


def _policy_dict(p: JobPolicy) -> dict[str, Any]:
    return {
        "grace_s": p.grace_s,
        "restart_budget": p.restart_budget,
        "checkpoint": {"dir": p.checkpoint.dir, "sync": p.checkpoint.sync.value},
        "slice_enforcement": p.slice_enforcement.value,
        "disruptible": p.disruptible,
        "min_runtime_between_moves_s": p.min_runtime_between_moves_s,
    }


# --- from plain data: what to_dict wrote ---------------------------------------------------------


class _NotAsWritten(Exception):
    """Not `to_dict`'s output: read it again slowly, to name the field."""


_BACKEND_KEYS = frozenset(("kind", "id", "run_dir", "cluster"))
_TOP_KEYS = frozenset(("name", "request", "policy", "command", "workdir", "env", "secrets"))
_REQUEST_KEYS = frozenset(
    (
        "shape",
        "tier",
        "priority",
        "labels",
        "node_affinity",
        "node_anti_affinity",
        "group",
        "avoid_jobs",
        "avoid_groups",
    )
)
_SHAPE_KEYS = frozenset(("gpus", "mem_per_card", "gpu_models", "cpu_milli", "host_mem_mib"))
_POLICY_KEYS = frozenset(
    (
        "grace_s",
        "restart_budget",
        "checkpoint",
        "slice_enforcement",
        "disruptible",
        "min_runtime_between_moves_s",
    )
)
_CHECKPOINT_KEYS = frozenset(("dir", "sync"))
_REQUIREMENT_KEYS = frozenset(("key", "values"))
_SECRET_KEYS = frozenset(("name", "file"))
_TIERS = {t.value: t for t in Tier}
_SYNCS = {s.value: s for s in CheckpointSync}
_ENFORCEMENTS = {e.value: e for e in SliceEnforcement}


def _m(value: Any, keys: frozenset[str]) -> dict[str, Any]:
    if type(value) is not dict or value.keys() != keys:
        raise _NotAsWritten
    return value


def _i(value: Any) -> int:
    if type(value) is not int:
        raise _NotAsWritten
    return value


def _f(value: Any) -> float:
    if type(value) is float:
        return value
    return float(_i(value))


def _s(value: Any) -> str:
    if type(value) is not str:
        raise _NotAsWritten
    return value


def _so(value: Any) -> str | None:
    return None if value is None else _s(value)


def _ss(value: Any) -> tuple[str, ...]:
    if type(value) is not list or any(type(v) is not str for v in value):
        raise _NotAsWritten
    return tuple(value)


def _sm(value: Any) -> dict[str, str]:
    if type(value) is not dict or any(
        type(k) is not str or type(v) is not str for k, v in value.items()
    ):
        raise _NotAsWritten
    return value


def _mem_fast(value: Any) -> MemPerCard:
    if type(value) is not dict or len(value) != 1:
        raise _NotAsWritten
    if value.get("whole") is True:
        return MemPerCard(whole=True)
    if "fraction" in value:
        return MemPerCard(fraction=_f(value["fraction"]))
    return MemPerCard(mib=_i(value["mib"]))


def _reqs_fast(value: Any) -> tuple[LabelRequirement, ...]:
    if type(value) is not list:
        raise _NotAsWritten
    out = []
    for item in value:
        r = _m(item, _REQUIREMENT_KEYS)
        out.append(LabelRequirement(_s(r["key"]), _ss(r["values"])))
    return tuple(out)


def _read_fast(data: Any) -> JobSpec:
    backend = None
    if type(data) is dict and "backend" in data:
        data = dict(data)
        b = _m(data.pop("backend"), _BACKEND_KEYS)
        backend = Backend(_s(b["kind"]), _s(b["id"]), _s(b["run_dir"]), _so(b["cluster"]))
    d = _m(data, _TOP_KEYS)
    r = _m(d["request"], _REQUEST_KEYS)
    s = _m(r["shape"], _SHAPE_KEYS)
    p = _m(d["policy"], _POLICY_KEYS)
    c = _m(p["checkpoint"], _CHECKPOINT_KEYS)
    disruptible = p["disruptible"]
    if type(disruptible) is not bool or type(d["secrets"]) is not list:
        raise _NotAsWritten
    request = JobRequest(
        name=_s(d["name"]),
        shape=JobShape(
            _i(s["gpus"]),
            _mem_fast(s["mem_per_card"]),
            _ss(s["gpu_models"]),
            _i(s["cpu_milli"]),
            _i(s["host_mem_mib"]),
        ),
        tier=_TIERS[r["tier"]],
        priority=_i(r["priority"]),
        labels=dict(_sm(r["labels"])),
        node_affinity=_reqs_fast(r["node_affinity"]),
        node_anti_affinity=_reqs_fast(r["node_anti_affinity"]),
        group=_so(r["group"]),
        avoid_jobs=_ss(r["avoid_jobs"]),
        avoid_groups=_ss(r["avoid_groups"]),
    )
    policy = JobPolicy(
        _f(p["grace_s"]),
        _i(p["restart_budget"]),
        CheckpointPolicy(_so(c["dir"]), _SYNCS[c["sync"]]),
        _ENFORCEMENTS[p["slice_enforcement"]],
        disruptible,
        _f(p["min_runtime_between_moves_s"]),
    )
    secrets = []
    for item in d["secrets"]:
        sec = _m(item, _SECRET_KEYS)
        secrets.append(SecretRef(_s(sec["name"]), _so(sec["file"])))
    return JobSpec(
        request,
        policy,
        _ss(d["command"]),
        _so(d["workdir"]),
        dict(_sm(d["env"])),
        tuple(secrets),
        backend,
    )


# --- from plain data: anything else, key by key ---------------------------------------------------

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)
_KINDS: dict[type, str] = {
    str: "text",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "a mapping",
    list: "a list",
}


class _Fields:
    """One mapping being read: each key taken once, its type checked; `done` refuses what is
    left. Errors name the key by its path from the spec's top (`request.shape.gpus`)."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise SpecDataError(where or "spec", f"must be a mapping, got {_kind(data)}")
        self.data: dict[str, Any] = data
        self.where = where
        self.seen: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str) -> Any:
        if key not in self.data:
            raise SpecDataError(self.path(key), "missing")
        self.seen.add(key)
        return self.data[key]

    def take(self, key: str, kind: type[T]) -> T:
        return _check(self._get(key), kind, self.path(key))

    def take_opt(self, key: str, kind: type[T]) -> T | None:
        value = self._get(key)
        return None if value is None else _check(value, kind, self.path(key), optional=True)

    def take_enum(self, key: str, kind: type[E]) -> E:
        value = self.take(key, str)
        try:
            return kind(value)
        except ValueError:
            known = ", ".join(str(m.value) for m in kind)
            raise SpecDataError(self.path(key), f"{value!r} is not one of {known}") from None

    def take_list(self, key: str, kind: type[T]) -> list[T]:
        where = self.path(key)
        items = _check(self._get(key), list, where)
        return [_check(v, kind, f"{where}[{i}]") for i, v in enumerate(items)]

    def take_map(self, key: str) -> dict[str, str]:
        where = self.path(key)
        found = _check(self._get(key), dict, where)
        return {_check(k, str, where): _check(v, str, f"{where}.{k}") for k, v in found.items()}

    def sub(self, key: str) -> _Fields:
        return _Fields(self._get(key), self.path(key))

    def items(self, key: str) -> list[_Fields]:
        return [_Fields(v, f"{self.path(key)}[{i}]") for i, v in enumerate(self.take(key, list))]

    def done(self) -> None:
        extra = sorted(set(self.data) - self.seen)
        if extra:
            raise SpecDataError(self.path(str(extra[0])), "unknown key")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check(value: Any, kind: type[T], where: str, *, optional: bool = False) -> T:
    if isinstance(value, bool) and kind is not bool:
        ok = False
    else:
        ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
    if not ok:
        want = _KINDS.get(kind, kind.__name__) + (" or null" if optional else "")
        raise SpecDataError(where, f"must be {want}, got {_kind(value)}")
    return float(value) if kind is float else value  # type: ignore[return-value]


def _build(d: _Fields, make: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`make(...)` once every key of `d` was taken; a core type refusing a value (ValueError)
    is an error at `d`."""
    d.done()
    try:
        return make(*args, **kwargs)
    except ValueError as exc:
        raise SpecDataError(d.where or "spec", str(exc)) from None


def _mem(d: _Fields) -> MemPerCard:
    if len(d.data) != 1 or not {"mib", "fraction", "whole"} & set(d.data):
        raise SpecDataError(d.where, "must hold one of mib, fraction or whole")
    if "whole" in d.data:
        return _build(d, MemPerCard, whole=d.take("whole", bool))
    if "fraction" in d.data:
        return _build(d, MemPerCard, fraction=d.take("fraction", float))
    return _build(d, MemPerCard, mib=d.take("mib", int))


def _requirements(d: _Fields, key: str) -> tuple[LabelRequirement, ...]:
    return tuple(
        _build(r, LabelRequirement, r.take("key", str), tuple(r.take_list("values", str)))
        for r in d.items(key)
    )


def _shape(d: _Fields) -> JobShape:
    return _build(
        d,
        JobShape,
        gpus=d.take("gpus", int),
        mem_per_card=_mem(d.sub("mem_per_card")),
        gpu_models=tuple(d.take_list("gpu_models", str)),
        cpu_milli=d.take("cpu_milli", int),
        host_mem_mib=d.take("host_mem_mib", int),
    )


def _request(d: _Fields, name: str) -> JobRequest:
    return _build(
        d,
        JobRequest,
        name=name,
        shape=_shape(d.sub("shape")),
        tier=d.take_enum("tier", Tier),
        priority=d.take("priority", int),
        labels=d.take_map("labels"),
        node_affinity=_requirements(d, "node_affinity"),
        node_anti_affinity=_requirements(d, "node_anti_affinity"),
        group=d.take_opt("group", str),
        avoid_jobs=tuple(d.take_list("avoid_jobs", str)),
        avoid_groups=tuple(d.take_list("avoid_groups", str)),
    )


def _policy(d: _Fields) -> JobPolicy:
    ckpt = d.sub("checkpoint")
    checkpoint = _build(
        ckpt,
        CheckpointPolicy,
        dir=ckpt.take_opt("dir", str),
        sync=ckpt.take_enum("sync", CheckpointSync),
    )
    return _build(
        d,
        JobPolicy,
        grace_s=d.take("grace_s", float),
        restart_budget=d.take("restart_budget", int),
        checkpoint=checkpoint,
        slice_enforcement=d.take_enum("slice_enforcement", SliceEnforcement),
        disruptible=d.take("disruptible", bool),
        min_runtime_between_moves_s=d.take("min_runtime_between_moves_s", float),
    )


def _read_slow(data: Any) -> JobSpec:
    d = _Fields(data, "")
    return _build(
        d,
        JobSpec,
        request=_request(d.sub("request"), d.take("name", str)),
        policy=_policy(d.sub("policy")),
        command=tuple(d.take_list("command", str)),
        workdir=d.take_opt("workdir", str),
        env=d.take_map("env"),
        secrets=tuple(_secret(s) for s in d.items("secrets")),
        backend=_backend(d.sub("backend")) if "backend" in d.data else None,
    )


def _backend(d: _Fields) -> Backend:
    return _build(
        d,
        Backend,
        d.take("kind", str),
        d.take("id", str),
        d.take("run_dir", str),
        d.take_opt("cluster", str),
    )


def _secret(d: _Fields) -> SecretRef:
    return _build(d, SecretRef, d.take("name", str), d.take_opt("file", str))
