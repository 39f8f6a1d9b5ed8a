"""Playbook files: validated like the inventory (exit 2 with file, line and field), resolved into
`gpuctl.core.playbook.Playbook`.

    name: nightly-consolidation
    targets: all               # or {names: [gpu0*], groups: [a100], labels: {..}, states: [..]}
    settings: {serial: 2, max_fail_percentage: 25, window: "22:00-04:00"}
    privileged: [[systemctl, restart, nvidia-persistenced]]
    steps:
      - consolidate: {max_moves: 4}
        when: fragmentation_pct > 20

Every problem is a `PlaybookError` (exit 2): unknown keys and unknown step kinds (with the
closest valid one), a step with no kind or two, a condition that does not parse or names an
unknown number, a `sudo: true` command no `privileged:` prefix allows, a job spec that does not
load, and (given an inventory) a target node or group the inventory does not define.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from gpuctl.config.document import Document, Loc
from gpuctl.config.loader import load_document, validate_data
from gpuctl.core import playbook as core
from gpuctl.core.model import Inventory
from gpuctl.core.playbook_expr import Expr, ExprError
from gpuctl.core.playbook_expr_parse import parse
from gpuctl.errors import ConfigError

KIND = "playbook"
COMMON_KEYS = ("name", "when")
STEP_KEYS = (*COMMON_KEYS, *core.STEP_KINDS)
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
GLOB_RE = re.compile(r"^[A-Za-z0-9*?\[][A-Za-z0-9._*?\[\]!-]{0,127}$")
_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")
_SERIAL_PCT = re.compile(r"^(\d{1,3}(?:\.\d+)?)%$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class PlaybookError(ConfigError):
    pass


# --- the file schema -----------------------------------------------------------------------------


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _listed(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _plain(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters")
    return value


Text = Annotated[str, Field(min_length=1, max_length=500), pydantic.AfterValidator(_plain)]
Name = Annotated[str, Field(pattern=NAME_RE)]
Seconds = Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)]
Listed = pydantic.BeforeValidator(_listed)


class SelectorModel(_M):
    names: Annotated[list[Annotated[str, Field(pattern=GLOB_RE.pattern)]], Listed] = []
    groups: Annotated[list[Name], Listed] = []
    labels: dict[Annotated[str, Field(min_length=1, max_length=63)], Text] = {}
    states: Annotated[
        list[Literal["ready", "cordoned", "draining", "down", "unknown"]], Listed
    ] = []


class SettingsModel(_M):
    serial: int | str | None = None
    max_fail_percentage: Annotated[float, Field(ge=0, le=100)] = 0.0
    window: str | None = None


class _OneTarget(_M):
    targets: SelectorModel


class _ManyTargets(_M):
    targets: Annotated[list[SelectorModel], Field(min_length=1)]


class StatusOptions(_M):
    pass


class HealthOptions(_M):
    samples: Annotated[int, Field(ge=1, le=100)] = 1
    interval_s: Annotated[float, Field(ge=0, le=3600)] | None = None
    fail_on: Annotated[list[Literal["degraded", "unhealthy", "unknown"]], Listed] = []


class CordonOptions(_M):
    reason: Text


class UncordonOptions(_M):
    pass


class DrainOptions(_M):
    reason: Text
    grace_s: Annotated[float, Field(ge=0, le=3600)] | None = None
    checkpoint_wait_s: Annotated[float, Field(ge=0, le=3600)] | None = None
    timeout_s: Seconds = 600.0
    parallel: Annotated[int, Field(ge=1, le=64)] = 2


class ConsolidateOptions(_M):
    max_moves: Annotated[int, Field(ge=0, le=1000)] = 10
    parallel: Annotated[int, Field(ge=1, le=64)] = 1
    timeout_s: Seconds | None = None


class SubmitOptions(_M):
    files: Annotated[list[Annotated[str, Field(min_length=1, max_length=4096)]], Listed] = Field(
        min_length=1
    )


class CancelOptions(_M):
    jobs: Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]], Listed] = []
    tier: Literal["standard", "spot"] | None = None
    max: Annotated[int, Field(ge=1, le=10000)] | None = None
    target_utilization_pct: Annotated[float, Field(ge=0, le=100)] | None = None
    force: bool = False

    @pydantic.model_validator(mode="after")
    def _something(self) -> CancelOptions:
        if not self.jobs and self.tier is None:
            raise ValueError("name the jobs to cancel (jobs:) or a tier (tier: spot)")
        if self.target_utilization_pct is not None and self.tier is None:
            raise ValueError("target_utilization_pct needs a tier to pick jobs from")
        return self


class ReconcileOptions(_M):
    passes: Annotated[int, Field(ge=1, le=1000)] = 1
    interval_s: Annotated[float, Field(ge=0, le=3600)] = 0.0


class WaitOptions(_M):
    until: Text
    timeout_s: Seconds = 300.0
    interval_s: Annotated[float, Field(gt=0, le=3600)] = 5.0
    reconcile: bool = False


class RunOptions(_M):
    argv: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(min_length=1)]
    sudo: bool = False
    timeout_s: Seconds = 60.0


class AssertOptions(_M):
    that: Text
    message: Text | None = None


_SHORTHAND = {"wait": "until", "assert": "that", "run": "argv", "submit": "files", "cancel": "jobs"}


class StepModel(_M):
    name: Text | None = None
    when: Text | None = None
    status: StatusOptions | None = None
    health: HealthOptions | None = None
    cordon: CordonOptions | None = None
    uncordon: UncordonOptions | None = None
    drain: DrainOptions | None = None
    consolidate: ConsolidateOptions | None = None
    submit: SubmitOptions | None = None
    cancel: CancelOptions | None = None
    reconcile: ReconcileOptions | None = None
    wait: WaitOptions | None = None
    run: RunOptions | None = None
    assert_: AssertOptions | None = Field(None, alias="assert")

    @pydantic.model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data: Any) -> Any:
        """`- status:` means `status: {}`; `wait: COND`, `assert: COND`, `run: [argv]`,
        `submit: FILE`, `cancel: [JOB]` and `reconcile: N` are short for their main option."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for kind in core.STEP_KINDS:
            if kind not in out:
                continue
            value = out[kind]
            if value is None:
                out[kind] = {}
            elif kind in _SHORTHAND and not isinstance(value, dict):
                out[kind] = {_SHORTHAND[kind]: value}
            elif kind == "reconcile" and isinstance(value, int) and not isinstance(value, bool):
                out[kind] = {"passes": value}
        return out

    @property
    def kinds(self) -> list[str]:
        return [k for k in core.STEP_KINDS if getattr(self, _attr(k)) is not None]


def _attr(kind: str) -> str:
    return "assert_" if kind == "assert" else kind


class PlaybookFile(_M):
    name: Name
    description: Annotated[str, Field(max_length=2000)] = ""
    targets: Any  # `all`, one selector or a list of them: validated by `_selectors`
    settings: SettingsModel = SettingsModel()
    privileged: list[Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]] = []
    steps: Annotated[list[StepModel], Field(min_length=1)]


# --- loading -------------------------------------------------------------------------------------


def load_playbook(path: Path, *, inventory: Inventory | None = None) -> core.Playbook:
    """Read, validate and resolve a playbook; with `inventory`, check its targets against it.
    Raises PlaybookError (exit 2) naming the file, the line and the field."""
    doc = load_document(path, kind=KIND, error=PlaybookError)
    _check_step_keys(doc)
    model = validate_data(
        doc.data, PlaybookFile, path=doc.path, lines=doc.lines, error=PlaybookError
    )
    selectors, listed = _selectors(doc)
    steps = tuple(_step(doc, i, s, model) for i, s in enumerate(model.steps))
    if inventory is not None:
        check_targets(doc, selectors, listed, inventory)
    return core.Playbook(
        name=model.name,
        description=model.description,
        targets=tuple(_selector(s) for s in selectors),
        steps=steps,
        settings=_settings(doc, model.settings),
        privileged=tuple(tuple(p) for p in model.privileged),
        source=str(path),
        digest=hashlib.sha256(path.read_bytes()).hexdigest(),
    )


def _fail(doc: Document, loc: Loc, message: str, hint: str | None = None) -> ConfigError:
    return doc.error(loc, message, hint=hint, error=PlaybookError)


def _check_step_keys(doc: Document) -> None:
    """An unknown key in a step is an unknown step kind: say so, with the closest kind."""
    steps = doc.data.get("steps")
    if not isinstance(steps, list):
        return
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        for key in step:
            if key not in STEP_KEYS:
                close = difflib.get_close_matches(key, STEP_KEYS, n=1, cutoff=0.6)
                hint = (
                    f"did you mean {close[0]!r}?"
                    if close
                    else "step kinds: " + ", ".join(core.STEP_KINDS)
                )
                raise _fail(doc, ("steps", i, key), f"unknown step {key!r}", hint)


def _step(doc: Document, i: int, step: StepModel, model: PlaybookFile) -> core.Step:
    kinds = step.kinds
    if len(kinds) != 1:
        found = " and ".join(kinds) if kinds else "none"
        raise _fail(
            doc,
            ("steps", i),
            f"a step has exactly one kind (found {found})",
            "step kinds: " + ", ".join(core.STEP_KINDS),
        )
    kind = kinds[0]
    raw: BaseModel = getattr(step, _attr(kind))
    options: dict[str, Any] = raw.model_dump()
    node_step = kind in core.NODE_KINDS or kind in ("wait", "assert")  # these judge each node
    when = None
    if step.when is not None:
        when = _expr(doc, ("steps", i, "when"), step.when, node_step, kind)
    if kind in ("wait", "assert"):
        key = "until" if kind == "wait" else "that"
        options[key] = _expr(doc, ("steps", i, kind, key), options[key], True, kind)
    if kind == "run":
        _check_run(doc, i, options, model)
    if kind == "submit":
        options["files"] = _job_files(doc, i, options["files"])
    return core.Step(
        index=i,
        kind=kind,
        options=options,
        name=step.name,
        when=when,
        source=doc.where(("steps", i)),
    )


def _expr(doc: Document, loc: Loc, text: str, node_facts: bool, kind: str) -> Expr:
    try:
        return parse(text, node_facts=node_facts, where=f"{kind} does not")
    except ExprError as exc:
        raise _fail(doc, loc, f"bad expression {text!r}: {exc}") from None


def _check_run(doc: Document, i: int, options: dict[str, Any], model: PlaybookFile) -> None:
    argv: list[str] = options["argv"]
    loc: Loc = ("steps", i, "run")
    if any("\x00" in a for a in argv) or not argv[0]:
        raise _fail(doc, (*loc, "argv"), "argv items are non-empty commands without NUL characters")
    if Path(argv[0]).name in ("sudo", "su", "doas", "pkexec"):
        raise _fail(
            doc,
            (*loc, "argv"),
            f"do not call {argv[0]} yourself: write the command and `sudo: true`",
            "privileged commands run through `sudo -n` and must be listed in `privileged:`",
        )
    if not options["sudo"]:
        return
    allowed = [tuple(p) for p in model.privileged]
    if not any(tuple(argv[: len(p)]) == p for p in allowed):
        declared = "; ".join(" ".join(p) for p in allowed) or "none"
        raise _fail(
            doc,
            (*loc, "sudo"),
            f"undeclared privileged command {' '.join(argv)!r}: no `privileged:` entry "
            "is a prefix of it",
            f"add [{', '.join(argv)}] (or a prefix of it) to `privileged:` (declared: {declared})",
        )


def _job_files(doc: Document, i: int, files: list[str]) -> list[str]:
    from gpuctl.config.jobspec_files import load_specs

    base = doc.path.parent
    out = []
    for k, name in enumerate(files):
        path = Path(name) if Path(name).is_absolute() else base / name
        if not path.is_file():
            raise _fail(doc, ("steps", i, "submit", "files", k), f"job spec {name!r} not found")
        out.append(str(path))
    load_specs([Path(f) for f in out], require_command=True)  # a bad spec: its own file:line
    return out


def _settings(doc: Document, s: SettingsModel) -> core.Settings:
    serial: int | None = None
    serial_pct: float | None = None
    if isinstance(s.serial, bool):
        raise _fail(doc, ("settings", "serial"), "must be a number of nodes or a percentage")
    if isinstance(s.serial, int):
        if s.serial < 1:
            raise _fail(doc, ("settings", "serial"), f"must be 1 or more (got {s.serial})")
        serial = s.serial
    elif isinstance(s.serial, str):
        m = _SERIAL_PCT.match(s.serial.strip())
        if m is None or not 0 < float(m.group(1)) <= 100:
            raise _fail(
                doc,
                ("settings", "serial"),
                f"must be a number of nodes or a percentage such as 25% (got {s.serial!r})",
            )
        serial_pct = float(m.group(1))
    return core.Settings(
        serial=serial,
        serial_pct=serial_pct,
        max_fail_percentage=s.max_fail_percentage,
        window=_window(doc, s.window),
    )


def parse_window(text: str) -> core.TimeWindow | None:
    """`HH:MM-HH:MM` -> a window; `always` -> None. Raises ValueError."""
    if text.strip() == "always":
        return None
    m = _WINDOW.match(text.strip())
    if m is None:
        raise ValueError(f"must be HH:MM-HH:MM (e.g. 22:00-04:00) or always (got {text!r})")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    window = core.TimeWindow(h1 * 60 + m1, h2 * 60 + m2)
    if window.start_min == window.end_min:
        raise ValueError(f"{text} is empty: write always for any time")
    return window


def _window(doc: Document, text: str | None) -> core.TimeWindow | None:
    if text is None:
        return None
    try:
        return parse_window(text)
    except ValueError as exc:
        raise _fail(doc, ("settings", "window"), str(exc)) from None


def _selectors(doc: Document) -> tuple[list[SelectorModel], bool]:
    """The target selectors as written, and whether they were written as a list."""
    raw = doc.data.get("targets")
    if raw == "all":
        return [SelectorModel()], False
    many = isinstance(raw, list)
    if not (many or isinstance(raw, dict)):
        raise _fail(
            doc,
            ("targets",),
            "must be all, a selector (names, groups, labels, states) or a list of selectors",
        )
    shape: type[_OneTarget | _ManyTargets] = _ManyTargets if many else _OneTarget
    checked = validate_data(
        {"targets": raw}, shape, path=doc.path, lines=doc.lines, error=PlaybookError
    )
    return (checked.targets if isinstance(checked, _ManyTargets) else [checked.targets]), many


def _selector(s: SelectorModel) -> core.Selector:
    return core.Selector(
        names=tuple(s.names), groups=tuple(s.groups), labels=dict(s.labels), states=tuple(s.states)
    )


def check_targets(
    doc: Document, items: list[SelectorModel], listed: bool, inventory: Inventory
) -> None:
    """Every node name and group a selector writes must exist in the inventory (a glob must
    match a node): an undefined target is an error, not an empty run."""
    names = [n.name for n in inventory.nodes]
    groups = sorted({g for n in inventory.nodes for g in n.groups})
    for j, sel in enumerate(items):
        base: Loc = ("targets", j) if listed else ("targets",)
        for k, pattern in enumerate(sel.names):
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                close = difflib.get_close_matches(pattern, names, n=1, cutoff=0.6)
                what = "matches no node" if _is_glob(pattern) else "is no node"
                raise _fail(
                    doc,
                    (*base, "names", k),
                    f"undefined target: {pattern!r} {what} of the inventory",
                    f"did you mean {close[0]!r}?" if close else "see `gpuctl inventory list`",
                )
        for k, group in enumerate(sel.groups):
            if group not in groups:
                close = difflib.get_close_matches(group, groups, n=1, cutoff=0.6)
                hint = (
                    f"did you mean {close[0]!r}?"
                    if close
                    else ("groups in the inventory: " + (", ".join(groups) or "none"))
                )
                raise _fail(
                    doc,
                    (*base, "groups", k),
                    f"undefined target: no node of the inventory is in group {group!r}",
                    hint,
                )


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


__all__ = ["PlaybookError", "load_playbook", "parse_window"]
