"""`gpuctl report -o html|csv`: the fleet's history over a window as one self-contained HTML page
of inline SVG charts (matplotlib's SVG backend: static, no JavaScript, no display), or the series
as one CSV table.

Charts: fragmentation % and stranded GiB over the window; utilization heatmap, node × hour;
queue-wait histogram; checkpoint age per job (a sawtooth: a stuck checkpointer's line keeps
climbing); failovers over time; allocated vs observed vs ghost memory per node (the newest
sample); consolidation moves (or "no consolidation in the window"). matplotlib is imported here
only, when a chart is drawn.
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Sequence
from typing import Any

from gpuctl.adapters.protocols import Store
from gpuctl.core import timefmt
from gpuctl.core.history import FleetSample, NodeSample
from gpuctl.core.jobs.figures import FAILOVER_REASONS
from gpuctl.ops.history import CSV_COLUMNS, series_rows, window

CONSOLIDATION_KINDS = ("consolidate", "migrate", "migrated")


def csv_text(store: Store, now: float, window_s: float) -> str:
    """One table, long form (`ops.history.series_rows`): at (ISO 8601, UTC), step_s, series (a
    fleet number or a node column), node (empty for the fleet), value (empty: undefined)."""
    return csv_of(*window(store, now, window_s, until=now))


def csv_of(
    fleet: Sequence[FleetSample], nodes: Sequence[NodeSample], name: str | None = None
) -> str:
    """The samples as `report -o csv` writes them (`gpuctl history show -o csv` too)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for at, step_s, series, node, value in series_rows(fleet, nodes, name):
        w.writerow((_iso(at), step_s, series, node, _num(value)))
    return out.getvalue()


def _iso(at: float) -> str:
    return timefmt.rfc3339(at) or ""


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:g}"


def html_page(
    store: Store, now: float, window_s: float, title: str = "gpuctl report", offset_s: int = 0
) -> str:
    """The page: one heading, then a section per chart, each an inline <svg>. Times are shown
    at `offset_s` east of UTC (the reader's local time), the zone named on each time axis."""
    since = now - window_s
    zone = _Zone(offset_s)
    fleet, nodes = window(store, now, window_s, until=now)
    sections = [
        ("Fragmentation and stranded memory", _fragmentation(fleet, zone)),
        ("Utilization by node and hour", _heatmap(nodes, zone)),
        ("Queue wait", _queue_wait(store, since)),
        ("Checkpoint age per job", _checkpoint_age(store, since, now, zone)),
        ("Failovers", _failovers(store, since, zone)),
        ("Memory per node: allocated, observed, ghost", _memory(nodes)),
        ("Consolidation", _consolidation(store, since, zone)),
    ]
    body = "\n".join(
        f'<section><h2>{html.escape(name)}</h2>\n<div class="chart">{chart}</div></section>'
        for name, chart in sections
    )
    head = (
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:1em 2em;background:#fff}"
        "section{margin-bottom:1.5em}.none{color:#666;font-style:italic}</style>"
    )
    span = f"{timefmt.stamp(since, offset_s)} to {timefmt.stamp(now, offset_s)}"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{head}</head><body>'
        f"<h1>{html.escape(title)}</h1><p>{span}</p>\n{body}\n</body></html>\n"
    )


def _none(text: str) -> str:
    return f'<p class="none">{html.escape(text)}</p>'


def _figure(width: float = 8.0, height: float = 3.0) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("svg")  # no display, whatever the environment says
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    return fig, ax


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # the XML declaration and doctype stay out of the page


class _Zone:
    """Where the charts' times are shown: `offset_s` east of UTC, named on each time axis."""

    def __init__(self, offset_s: int) -> None:
        import datetime

        self.offset_s = offset_s
        self.tz = datetime.timezone(datetime.timedelta(seconds=offset_s))
        self.name = "UTC" + timefmt.stamp(0, offset_s).rsplit(" ", 1)[1]

    def times(self, ats: Sequence[int]) -> list[Any]:
        import datetime

        return [datetime.datetime.fromtimestamp(a, self.tz) for a in ats]

    def axis(self, ax: Any, what: str = "local time") -> None:
        """Date ticks in this zone (matplotlib labels dates in UTC unless told), and its name."""
        ax.xaxis_date(self.tz)
        ax.set_xlabel(f"{what} ({self.name})")


def _fragmentation(fleet: Sequence[FleetSample], zone: _Zone) -> str:
    pts = [(s.at, s.get("fragmentation_pct"), s.get("stranded_gib")) for s in fleet]
    if not pts:
        return _none("no history in the window (gpuctl reconcile --watch records it)")
    fig, ax = _figure()
    ats = zone.times([p[0] for p in pts])
    ax.plot(ats, [p[1] for p in pts], color="tab:red", label="fragmentation %")
    ax.set_ylabel("fragmentation %")
    zone.axis(ax)
    ax2 = ax.twinx()
    ax2.plot(ats, [p[2] for p in pts], color="tab:blue", label="stranded GiB")
    ax2.set_ylabel("stranded GiB")
    fig.legend(loc="upper left")
    return _svg(fig)


def _heatmap(nodes: Sequence[NodeSample], zone: _Zone) -> str:
    if not nodes:
        return _none("no node samples in the window")
    names = sorted({n.node for n in nodes})
    hours = sorted({n.at // 3600 for n in nodes})
    col = {h: i for i, h in enumerate(hours)}
    row = {name: i for i, name in enumerate(names)}
    sums = [[0.0] * len(hours) for _ in names]
    counts = [[0] * len(hours) for _ in names]
    for n in nodes:
        if n.util_pct is not None:
            r, c = row[n.node], col[n.at // 3600]
            sums[r][c] += n.util_pct
            counts[r][c] += 1
    grid = [
        [s / k if k else float("nan") for s, k in zip(sr, kr, strict=True)]
        for sr, kr in zip(sums, counts, strict=True)
    ]
    fig, ax = _figure(8.0, max(2.0, 0.25 * len(names) + 1.2))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=100, interpolation="nearest")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    step = max(1, len(hours) // 12)
    ax.set_xticks(
        range(0, len(hours), step),
        [timefmt.stamp(h * 3600, zone.offset_s)[5:16] for h in hours[::step]],
        fontsize=7,
    )
    ax.set_xlabel(f"hour, local time ({zone.name})")
    fig.colorbar(im, ax=ax, label="SM utilization %")
    return _svg(fig)


def _queue_wait(store: Store, since: float) -> str:
    waits = [
        j.first_started_at - j.submitted_at
        for j in store.jobs()
        if j.first_started_at is not None and j.first_started_at >= since
    ]
    if not waits:
        return _none("no job started in the window")
    fig, ax = _figure()
    ax.hist([max(0.0, w) / 60 for w in waits], bins=20, color="tab:purple")
    ax.set_xlabel("minutes from submit to first start")
    ax.set_ylabel("jobs")
    return _svg(fig)


def _checkpoint_age(store: Store, since: float, now: float, zone: _Zone) -> str:
    lines: list[tuple[str, list[float], list[float]]] = []
    for inc in store.incarnations():
        if inc.ended_at is not None and inc.ended_at < since:
            continue
        start = max(since, inc.started_at)
        end = now if inc.ended_at is None else inc.ended_at
        commits = sorted(
            c.committed_at
            for c in store.checkpoints(inc.job_id)
            if c.incarnation == inc.n and start <= c.committed_at <= end
        )
        xs, ys = [start], [0.0]
        last = inc.started_at
        for t in [*commits, end]:
            xs.append(t)
            ys.append((t - last) / 60)
            if t != end:
                xs.append(t)
                ys.append(0.0)
                last = t
        lines.append((f"{inc.job_id}#{inc.n}", xs, ys))
    if not lines:
        return _none("no job ran in the window")
    fig, ax = _figure()
    for label, xs, ys in lines[:20]:
        ax.plot(zone.times([int(x) for x in xs]), ys, label=label)
    ax.set_ylabel("minutes since the last checkpoint")
    zone.axis(ax)
    ax.legend(fontsize=7, loc="upper left")
    return _svg(fig)


def _failovers(store: Store, since: float, zone: _Zone) -> str:
    ended = [
        i
        for i in store.incarnations()
        if i.ended_at is not None and i.ended_at >= since and i.end_reason in FAILOVER_REASONS
    ]
    if not ended:
        return _none("no failover in the window")
    fig, ax = _figure(8.0, 2.5)
    jobs = sorted({i.job_id for i in ended})
    y = {j: k for k, j in enumerate(jobs)}
    assert all(i.ended_at is not None for i in ended)
    ax.scatter(
        zone.times([int(i.ended_at or 0) for i in ended]),
        [y[i.job_id] for i in ended],
        color="tab:orange",
        marker="x",
    )
    ax.set_yticks(range(len(jobs)), jobs, fontsize=7)
    zone.axis(ax)
    return _svg(fig)


def _memory(nodes: Sequence[NodeSample]) -> str:
    newest: dict[str, NodeSample] = {}
    for n in nodes:
        newest[n.node] = n
    if not newest:
        return _none("no node samples in the window")
    names = sorted(newest)
    gib = [
        [(getattr(newest[name], k) or 0) / 1024 for name in names]
        for k in ("mem_allocated_mib", "mem_used_mib", "mem_ghost_mib")
    ]
    fig, ax = _figure(8.0, 3.0)
    width = 0.27
    xs = range(len(names))
    colours = ("tab:blue", "tab:green", "tab:red")
    labels = ("allocated", "observed", "ghost")
    for k, (vals, colour, label) in enumerate(zip(gib, colours, labels, strict=True)):
        ax.bar([x + (k - 1) * width for x in xs], vals, width, color=colour, label=label)
    ax.set_xticks(list(xs), names, fontsize=7, rotation=45)
    ax.set_ylabel("GiB")
    ax.legend(fontsize=7)
    return _svg(fig)


def _consolidation(store: Store, since: float, zone: _Zone) -> str:
    moves = [e for e in store.events(since=since) if e.kind in CONSOLIDATION_KINDS]
    if not moves:
        return _none("no consolidation in the window")
    fig, ax = _figure(8.0, 2.5)
    ax.scatter(zone.times([int(e.at) for e in moves]), [1] * len(moves), color="tab:green")
    ax.set_yticks([])
    zone.axis(ax)
    ax.set_title(f"{len(moves)} consolidation move(s)", fontsize=9)
    return _svg(fig)
