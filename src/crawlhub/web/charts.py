"""Charts as inline SVG, drawn on the server: a line chart of values over time and a
bar chart of values per category. No script, no library, no style attribute (the CSP
allows neither): colours come from ``crawlhub.css`` by class (``s0`` ... ``s7``).

Every label (a series' name, a category, a title) is user text - an outbound's or an
agent's name - and is escaped here, in text and in attributes alike. Each point is a
``<circle>`` and each bar a ``<rect>`` with ``data-series`` and ``data-value`` (what a
browser test reads) and a ``<title>`` (what a pointer over it shows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape

from markupsafe import Markup

#: Colours in the stylesheet (``.chart .s0`` ... ``.s7``); more series reuse them.
COLOURS = 8
WIDTH, HEIGHT = 640, 200
#: Room for the axes' labels: left, right, top, bottom.
PAD_L, PAD_R, PAD_T, PAD_B = 56, 12, 10, 24


@dataclass(slots=True)
class Line:
    """One series of a line chart: its label and its (epoch seconds, value) points."""

    label: str
    points: list[tuple[float, float]] = field(default_factory=list)


def _a(text: object) -> str:
    """Escaped for text and for a double-quoted attribute."""
    return escape(str(text), quote=True)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:60] or "chart"


def short(value: float) -> str:
    """``950``, ``12.5``, ``3.4k``, ``2.1M``, ``1.5G``: an axis' or a point's figure."""
    size = abs(value)
    for limit, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= limit:
            return f"{value / limit:.3g}{unit}"
    if value == int(value):
        return f"{int(value)}"
    return f"{value:.3g}"


def nice_top(value: float) -> float:
    """The round number at or above ``value`` an axis ends at (1, 2, 2.5, 5 x 10^n)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power:
            return step * power
    return 10 * power  # pragma: no cover - the loop returns


def hhmm(ts: float, *, day: bool = False) -> str:
    """``14:05`` (UTC); ``11-28 14:05`` with ``day`` (a chart spanning days)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M" if day else "%H:%M")


def _frame(chart_id: str, title: str, body: list[str], legend: Sequence[str], *,
           kind: str, count: int, note: str = "") -> Markup:
    items = "".join(f'<li class="s{i % COLOURS}"><span class="key"></span>{_a(label)}</li>'
                    for i, label in enumerate(legend))
    empty = '<p class="muted chart-empty">no data yet</p>' if not count else ""
    legend_html = f'<ul class="legend">{items}</ul>' if items and count else ""
    note_html = f'<p class="muted chart-note">{_a(note)}</p>' if note else ""
    svg = (f'<svg class="chart-svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img"'
           f' aria-label="{_a(title)}" xmlns="http://www.w3.org/2000/svg">'
           f'<title>{_a(title)}</title>{"".join(body)}</svg>') if count else ""
    return Markup(
        f'<figure class="chart" id="chart-{_a(_slug(chart_id))}" data-chart="{_a(chart_id)}"'
        f' data-kind="{kind}" data-count="{count}">'
        f'<figcaption>{_a(title)}</figcaption>{svg}{empty}'
        f"{legend_html}{note_html}</figure>")


def _y_axis(top: float, fmt: Callable[[float], str]) -> list[str]:
    out = []
    plot_h = HEIGHT - PAD_T - PAD_B
    for frac in (0.0, 0.5, 1.0):
        y = PAD_T + plot_h * (1 - frac)
        out.append(f'<line class="grid-line" x1="{PAD_L}" x2="{WIDTH - PAD_R}"'
                   f' y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{PAD_L - 6}" y="{y + 4:.1f}"'
                   f' text-anchor="end">{_a(fmt(top * frac))}</text>')
    return out


def line_chart(chart_id: str, title: str, lines: Sequence[Line], *, start: float,
               end: float, fmt: Callable[[float], str] = short, unit: str = "",
               note: str = "") -> Markup:
    """Values over time from ``start`` to ``end`` (epoch seconds): one polyline and its
    points per series, the y axis from 0 to a round number over the highest value."""
    end = max(end, start + 60)
    values = [v for line in lines for _, v in line.points]
    top = nice_top(max(values, default=0.0))
    plot_w, plot_h = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B

    def x(ts: float) -> float:
        return PAD_L + plot_w * min(max((ts - start) / (end - start), 0.0), 1.0)

    def y(value: float) -> float:
        return PAD_T + plot_h * (1 - min(max(value / top, 0.0), 1.0))

    body = _y_axis(top, fmt)
    days = end - start > 86400  # a job's runs a day apart: the axis names the day
    for ts, anchor in ((start, "start"), ((start + end) / 2, "middle"), (end, "end")):
        body.append(f'<text class="tick" x="{x(ts):.1f}" y="{HEIGHT - 6}"'
                    f' text-anchor="{anchor}">{hhmm(ts, day=days)}</text>')
    for i, line in enumerate(lines):
        cls = f"s{i % COLOURS}"
        coords = " ".join(f"{x(ts):.1f},{y(v):.1f}" for ts, v in line.points)
        body.append(f'<g class="series {cls}" data-series="{_a(line.label)}"'
                    f' data-points="{len(line.points)}">')
        if len(line.points) > 1:
            body.append(f'<polyline class="line" points="{coords}"/>')
        for ts, v in line.points:
            tip = f"{line.label} {hhmm(ts, day=days)}: {fmt(v)}{unit}"
            body.append(f'<circle class="pt" cx="{x(ts):.1f}" cy="{y(v):.1f}" r="2.5"'
                        f' data-ts="{int(ts)}" data-value="{v:.12g}"><title>{_a(tip)}</title>'
                        "</circle>")
        body.append("</g>")
    return _frame(chart_id, title, body, [line.label for line in lines], kind="line",
                  count=len(values), note=note)


def bar_chart(chart_id: str, title: str, categories: Sequence[str],
              series: Sequence[tuple[str, Sequence[float]]], *,
              fmt: Callable[[float], str] = short, note: str = "") -> Markup:
    """Grouped bars: for each category (left to right) one bar per series;
    ``series`` is ``(label, one value per category)``."""
    values = [v for _, vals in series for v in vals]
    top = nice_top(max(values, default=0.0))
    plot_w, plot_h = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B
    body = _y_axis(top, fmt)
    group = plot_w / max(len(categories), 1)
    bar = group * 0.8 / max(len(series), 1)
    for c, category in enumerate(categories):
        left = PAD_L + c * group + group * 0.1
        body.append(f'<text class="tick" x="{left + group * 0.4:.1f}" y="{HEIGHT - 6}"'
                    f' text-anchor="middle">{_a(category)}</text>')
        for s, (label, vals) in enumerate(series):
            v = float(vals[c]) if c < len(vals) else 0.0
            h = plot_h * min(max(v / top, 0.0), 1.0)
            body.append(
                f'<rect class="bar s{s % COLOURS}" x="{left + s * bar:.1f}"'
                f' y="{PAD_T + plot_h - h:.1f}" width="{max(bar - 1, 1):.1f}"'
                f' height="{h:.1f}" data-series="{_a(label)}" data-category="{_a(category)}"'
                f' data-value="{v:.12g}"><title>{_a(f"{label} {category}: {fmt(v)}")}</title>'
                "</rect>")
    return _frame(chart_id, title, body, [label for label, _ in series], kind="bar",
                  count=len(values) if categories else 0, note=note)
