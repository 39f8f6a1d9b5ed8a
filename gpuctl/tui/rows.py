"""Table rows for each screen, from one `DashData`: (stable key, cells) pairs. Pure formatting;
the widgets only sync them into keyed tables, and `--once` prints them as text."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuctl.core.jobs.model import Event, Incarnation, JobState
from gpuctl.core.model import GpuSnapshot
from gpuctl.core.placement.model import Card
from gpuctl.ops.dashboard import NOT_GPUCTL, Alert, DashData, HistoryView, JobLine, NodeView
from gpuctl.ops.jobs import placed
from gpuctl.tui import format as fmt
from gpuctl.tui.format import DASH, Cell

Row = tuple[str, tuple[Cell, ...]]

FLEET_COLUMNS = (
    ("node", "NODE"),
    ("state", "STATE"),
    ("gpus", "GPUS"),
    ("mem", "ALLOC/USED/TOTAL GiB"),
    ("bar", "MEMORY alloc|used"),
    ("strip", "PER GPU"),
    ("util", "UTIL"),
    ("temp", "TEMP"),
    ("health", "HEALTH"),
    ("jobs", "JOBS"),
    ("util_hist", "UTIL history"),
    ("notes", "NOTES"),
)
NODE_BAR_WIDTH = 16
NODE_SPARK_WIDTH = 12  # a node's utilization over the history window (or its last polls)
GPU_COLUMNS = (
    ("gpu", "GPU"),
    ("model", "MODEL"),
    ("bar", "MEMORY alloc|used"),
    ("mem", "ALLOC/USED/TOTAL GiB"),
    ("util", "UTIL"),
    ("temp", "TEMP"),
    ("power", "POWER"),
    ("health", "HEALTH"),
    ("util_hist", "UTIL history"),
    ("mem_hist", "MEM history"),
    ("reasons", "REASONS"),
)
GPU_BAR_WIDTH = 24
GPU_SPARK_WIDTH = 20  # polls shown of a GPU's history
PROCESS_COLUMNS = (
    ("pid", "PID"),
    ("gpu", "GPU"),
    ("mem", "MiB"),
    ("name", "PROCESS"),
    ("job", "JOB"),
)
QUEUE_COLUMNS = (
    ("id", "JOB"),
    ("name", "NAME"),
    ("tier", "TIER"),
    ("prio", "PRIO"),
    ("wait", "WAITING"),
    ("why", "WHY IT WAITS"),
)
JOB_COLUMNS = (
    ("id", "JOB"),
    ("name", "NAME"),
    ("state", "STATE"),
    ("node", "NODE"),
    ("cards", "CARDS"),
    ("tier", "TIER"),
    ("ckpt", "CKPT AGE"),
    ("inc", "INC"),
    ("restarts", "RESTARTS"),
)
EVENT_COLUMNS = (("time", "TIME"), ("kind", "KIND"), ("message", "MESSAGE"))
EMPTY = Cell(())
ALERT_KINDS = frozenset(
    {"failover", "preempt", "drain", "over_slice", "node_down", "hold", "suspect_network", "fence"}
)


def matches(needle: str, cells: Iterable[Cell]) -> bool:
    """A row matches a `/` filter when any cell contains it (case-insensitive)."""
    if not needle:
        return True
    low = needle.lower()
    return any(low in c.plain.lower() for c in cells)


def _filtered(rows: Iterable[Row], needle: str) -> list[Row]:
    return [r for r in rows if matches(needle, r[1])]


# --- the fleet -----------------------------------------------------------------------------------


def card_style(card: Card | None, severity: str | None) -> str:
    if severity in ("critical", "unknown"):
        return fmt.SEVERITY_BADGE[severity][1]
    if severity == "warn":
        return "yellow"
    if card is not None and card.ghost_mib > 0:
        return "red"
    if card is not None and card.allocated_mib > 0:
        return "green"
    return "grey62"


def _cards(node: NodeView) -> dict[int, Card]:
    return {c.index: c for c in node.placement.cards} if node.placement else {}


def _gpu_severity(node: NodeView) -> dict[int, str]:
    if node.verdict is None:
        return {}
    return {g.index: g.severity.value for g in node.verdict.gpus}


def fleet_row(node: NodeView, history: HistoryView | None = None) -> tuple[Cell, ...]:
    """One node's row; `history`: the sparklines' points (its utilization over the window)."""
    gpus = node.snapshot.gpus
    cards = _cards(node)
    severity = _gpu_severity(node)
    count = "-" if node.snapshot.observation is None else str(len(gpus))
    if node.expected_gpus is not None and node.snapshot.observation is not None:
        count = f"{len(gpus)}/{node.expected_gpus}"
    totals = [g.mem_total_mib for g in gpus if g.mem_total_mib is not None]
    used = [g.mem_used_mib for g in gpus if g.mem_used_mib is not None]
    allocated = sum(min(c.allocated_mib, c.capacity_mib) for c in cards.values())
    total = sum(totals) if totals else None
    used_sum = sum(used) if used else None
    utils = [g.util_pct for g in gpus if g.util_pct is not None]
    temps = [g.temp_c for g in gpus if g.temp_c is not None]
    strip = fmt.gpu_strip(
        (_fraction(g), card_style(cards.get(g.index), severity.get(g.index)))
        for g in sorted(gpus, key=lambda g: g.index)
    )
    verdict = node.verdict
    health = fmt.badge(None if verdict is None else verdict.severity.value)
    notes = _node_notes(node)
    mem = "-"
    if total is not None:
        mem = f"{fmt.gib(allocated, 0)}/{fmt.gib(used_sum, 0)}/{fmt.gib(total, 0)}"
    return (
        fmt.plain(node.name),
        fmt.state_text(node.state, node.reach),
        Cell.of(count),
        Cell.of(mem),
        fmt.mem_bar(allocated, used_sum, total, NODE_BAR_WIDTH) if total else DASH,
        strip if gpus else DASH,
        fmt.util_text(sum(utils) / len(utils) if utils else None),
        fmt.temp_text(max(temps) if temps else None),
        health,
        Cell.of(str(len(node.jobs))) if node.jobs else DASH,
        _node_spark(history, node.name),
        notes,
    )


def _node_spark(history: HistoryView | None, name: str) -> Cell:
    if history is None:
        return DASH
    points = history.node(name)
    if history.stored:
        points = tuple(fmt.squeeze(points, NODE_SPARK_WIDTH))
    return Cell.of(fmt.sparkline(points, NODE_SPARK_WIDTH, lo=0.0, hi=100.0), "cyan")


def _fraction(g: GpuSnapshot) -> float | None:
    if not g.mem_total_mib or g.mem_used_mib is None:
        return None
    return g.mem_used_mib / g.mem_total_mib


def _node_notes(node: NodeView) -> Cell:
    if node.snapshot.error:
        return fmt.plain(node.snapshot.error)
    if node.cordon is not None:
        return fmt.plain(f"cordoned by {node.cordon.operator}: {node.cordon.reason}")
    v = node.verdict
    if v is not None and v.reasons:
        return fmt.plain(v.reasons[0].text)
    return EMPTY


def fleet_rows(data: DashData, needle: str = "") -> list[Row]:
    return _filtered(((n.name, fleet_row(n, data.history)) for n in data.nodes), needle)


# --- one node ------------------------------------------------------------------------------------


def _spark(values: Sequence[float | None] | None) -> Cell:
    if not values:
        return DASH
    return Cell.of(fmt.sparkline(values, GPU_SPARK_WIDTH, lo=0.0, hi=100.0), "cyan")


def gpu_rows(
    node: NodeView,
    history: Mapping[int, tuple[Sequence[float | None], Sequence[float | None]]] | None = None,
) -> list[Row]:
    """One row per GPU; `history`: each GPU's utilization and memory-in-use % at the last polls
    (`ops.dashboard.GpuHistory.series`), drawn as sparklines from 0 to 100%."""
    cards = _cards(node)
    history = history or {}
    verdicts = {g.index: g for g in node.verdict.gpus} if node.verdict else {}
    out: list[Row] = []
    for g in sorted(node.snapshot.gpus, key=lambda g: g.index):
        card = cards.get(g.index)
        alloc = 0 if card is None else min(card.allocated_mib, card.capacity_mib)
        gv = verdicts.get(g.index)
        reasons = "; ".join(r.text for r in gv.reasons) if gv else ""
        power = "-" if g.power_w is None else f"{g.power_w:.0f}W"
        mem = f"{fmt.gib(alloc)}/{fmt.gib(g.mem_used_mib)}/{fmt.gib(g.mem_total_mib)}"
        utils, mems = history.get(g.index, ((), ()))
        out.append(
            (
                str(g.index),
                (
                    Cell.of(str(g.index)),
                    fmt.plain(g.model or "-"),
                    fmt.mem_bar(alloc, g.mem_used_mib, g.mem_total_mib, GPU_BAR_WIDTH),
                    Cell.of(mem),
                    fmt.util_text(g.util_pct),
                    fmt.temp_text(g.temp_c),
                    Cell.of(power),
                    fmt.badge(None if gv is None else gv.severity.value),
                    _spark(utils),
                    _spark(mems),
                    fmt.plain(reasons),
                ),
            )
        )
    return out


def _owner_cell(owner: str | None) -> Cell:
    if owner is None:
        return Cell.of("…", "grey50")  # being read
    if owner == NOT_GPUCTL:
        return Cell.of(owner, "red")
    if owner.endswith("(stray)"):
        return fmt.plain(owner, "bold red")
    return fmt.plain(owner, "grey50" if owner == "?" else "")


def process_rows(node: NodeView, owners: Mapping[int, str] | None = None) -> list[Row]:
    """The probe's GPU processes; JOB: whose each is (`ops.dashboard.read_owners`), `…` until
    read."""
    obs = node.snapshot.observation
    if obs is None:
        return []
    index = {g.uuid: g.index for g in obs.gpus if g.uuid}
    out: list[Row] = []
    for p in obs.processes:
        gpu = index.get(p.gpu_uuid) if p.gpu_uuid else None
        out.append(
            (
                f"{p.pid}:{p.gpu_uuid}",
                (
                    Cell.of(str(p.pid)),
                    Cell.of("?" if gpu is None else str(gpu)),
                    Cell.of("-" if p.used_mib is None else str(p.used_mib)),
                    fmt.plain(p.name or "-"),
                    _owner_cell(None if owners is None else owners.get(p.pid)),
                ),
            )
        )
    return out


def node_reasons(node: NodeView) -> list[str]:
    """The node's health reasons, worst first, as lines."""
    if node.verdict is None:
        return []
    return [
        f"{r.severity.value:<8} {'GPU ' + str(r.gpu) if r.gpu is not None else 'node':<6} "
        f"{fmt.safe(r.text)} -> {r.action.value}"
        for r in node.verdict.reasons
    ]


def cordon_history(data: DashData, node: str, offset_s: float) -> list[str]:
    return [
        f"{fmt.clock_hms(e.at, offset_s)}  {e.kind:<9} {fmt.safe(e.actor)}: {fmt.safe(e.message)}"
        for e in data.node_events
        if e.node == node
    ]


# --- jobs ----------------------------------------------------------------------------------------


def queue_rows(data: DashData, needle: str = "") -> list[Row]:
    rows: list[Row] = []
    for line in data.jobs:
        job = line.view.job
        if job.state is not JobState.QUEUED:
            continue
        rows.append(
            (
                job.id,
                (
                    fmt.plain(job.id),
                    fmt.plain(job.name),
                    Cell.of(job.tier),
                    Cell.of(str(job.priority)),
                    Cell.of(fmt.duration(data.now - job.submitted_at)),
                    fmt.plain(line.why or ("-" if data.reasons else "working it out ...")),
                ),
            )
        )
    return _filtered(rows, needle)


def job_row(line: JobLine, now: float) -> tuple[Cell, ...]:
    view = line.view
    job, inc, ckpt = view.job, placed(view), view.checkpoint
    age = DASH
    if job.state is JobState.RUNNING:
        since = ckpt.committed_at if ckpt else job.first_started_at
        words = fmt.duration(None if since is None else now - since)
        age = Cell(((words, ""), (" (none)", "yellow"))) if ckpt is None else Cell.of(words)
    state = Cell.of(job.state.value, "yellow" if job.state is JobState.HELD else "")
    if job.cancel_requested and not job.state.terminal:  # as `gpuctl jobs list` says it
        state = Cell.of(f"{job.state.value} (cancelling)", "yellow")
    return (
        fmt.plain(job.id),
        fmt.plain(job.name),
        state,
        fmt.plain("-" if inc is None else inc.node),
        Cell.of("-" if inc is None else ",".join(str(c) for c in inc.cards)),
        Cell.of(job.tier),
        age,
        Cell.of(str(job.incarnation)),
        Cell.of(str(job.restarts)),
    )


def job_rows(data: DashData, needle: str = "") -> list[Row]:
    """Running and held jobs (queued ones are on the queue screen)."""
    rows = [
        (line.view.job.id, job_row(line, data.now))
        for line in data.jobs
        if line.view.job.state is not JobState.QUEUED
    ]
    return _filtered(rows, needle)


def incarnation_lines(incs: Sequence[Incarnation], offset_s: float) -> list[str]:
    out = []
    for i in incs:
        end = "" if i.end_reason is None else f" ended {i.end_reason.value}"
        code = "" if i.exit_code is None else f" exit {i.exit_code}"
        cards = ",".join(str(c) for c in i.cards)
        out.append(
            f"#{i.n} {i.state.value:<9} {fmt.safe(i.node)} cards {cards} "
            f"{fmt.gib(i.mib_per_card)} GiB/card since {fmt.clock_hms(i.started_at, offset_s)}"
            f"{end}{code}"
        )
    return out


# --- events and alerts ---------------------------------------------------------------------------


def alert_row(alert: Alert) -> Row:
    style = "bold red" if alert.severity == "critical" else "yellow"
    return (
        f"alert:{alert.key}",
        (Cell.of("now", style), Cell.of(alert.severity, style), fmt.plain(alert.text)),
    )


def event_row(e: Event, offset_s: float) -> Row:
    style = "bold" if e.kind in ALERT_KINDS else ""
    failed = e.outcome not in (None, "ok")
    return (
        f"event:{e.id if e.id is not None else f'{e.at}:{e.kind}:{e.job_id}'}",
        (
            Cell.of(fmt.clock_hms(e.at, offset_s)),
            Cell.of(e.kind, "red" if failed else style),
            fmt.plain(e.message),
        ),
    )


def event_rows(data: DashData, offset_s: float, needle: str = "") -> list[Row]:
    rows = [alert_row(a) for a in data.alerts] + [event_row(e, offset_s) for e in data.events]
    return _filtered(rows, needle)


# --- --once ----------------------------------------------------------------------------------


def _fleet_text(data: DashData) -> str:
    """The fleet table as text; the UTIL history column only with the store's history (one
    refresh alone has none)."""
    keep = [
        i
        for i, (key, _) in enumerate(FLEET_COLUMNS)
        if key != "util_hist" or (data.history is not None and data.history.stored)
    ]
    return fmt.table_text(
        [FLEET_COLUMNS[i][1] for i in keep],
        [[cells[i] for i in keep] for _, cells in fleet_rows(data)],
    )


def once_text(data: DashData) -> str:
    """What `gpuctl dash --once` prints: the numbers, then the fleet table, then alerts."""
    parts = [
        f"gpuctl dash · {data.source} · {len(data.nodes)} node(s)",
        "",
        fmt.numbers_text(data.numbers),
        "",
        _fleet_text(data),
    ]
    if data.alerts:
        parts += ["", "alerts:"] + [f"  {a.severity:<8} {fmt.safe(a.text)}" for a in data.alerts]
    return "\n".join(parts) + "\n"
