"""Pure SVG chart builders: data in, one self-contained ``<svg>`` string out.

No plotting library, no script, no font fetched: each builder returns a :class:`Chart`
whose ``svg`` is inline SVG 1.1 with its own ``<title>`` (for screen readers), labelled
axes (the caller passes labels *with units*), tick labels and a legend. ``html.py`` puts
the chart in a ``<figure>`` with a visible title and a caption that says what to read
from it. Output is deterministic (same data -> byte-identical SVG) so reports diff cleanly.

Element budget, relied on by the tests and the browser check: a scatter draws one
``<circle>`` (or ``<path>`` for diamond/star markers) per point; a line series is one
``<path>``; a histogram one ``<rect class="bar">`` per bin; a bar chart one
``<rect class="bar">`` per (category, group). Builders thin long series (at most
``MAX_LINE_POINTS`` vertices per line) so a million-step replay still gives a small page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence
from xml.sax.saxutils import escape

import numpy as np

from tuner.units import TICK, cell

#: Chart geometry in SVG user units (the SVG scales to its container's width).
WIDTH, HEIGHT = 640, 360
_M_LEFT, _M_RIGHT, _M_TOP, _M_BOTTOM = 70, 20, 16, 62
#: Vertices kept per line series; longer series are thinned (see :func:`thin`).
MAX_LINE_POINTS = 500
#: Colour-blind-safe palette (Okabe-Ito), in the order series are drawn.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#F0E442")
Marker = Literal["circle", "diamond", "star"]


@dataclass(frozen=True, slots=True)
class Chart:
    """One rendered chart: what ``html.figure`` shows."""

    title: str  # short, shown above the chart
    caption: str  # what to read from it, shown below
    svg: str  # a complete <svg> element


@dataclass(frozen=True, slots=True)
class Series:
    """A line (time series or CDF): ``xs`` and ``ys`` of equal length."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str | None = None  # None = next palette colour
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class PointGroup:
    """Points of one kind on a scatter (e.g. "trials", "Pareto front", "baseline")."""

    label: str
    points: Sequence[tuple[float, float]]
    color: str | None = None
    marker: Marker = "circle"
    radius: float = 3.5
    connect: bool = False  # draw a line through the points in x order (a front)
    hollow: bool = False
    tooltips: Sequence[str] = field(default_factory=tuple)  # one <title> per point


# --------------------------------------------------------------------------- scales


def nice_ticks(lo: float, hi: float, n: int = 5, *, integer: bool = False) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]`` (1, 2, 2.5, 5 x 10^k steps;
    whole-number steps only when ``integer``, e.g. trial numbers)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, float(math.ceil(step)))
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten covering ``[lo, hi]`` (both > 0)."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if a == b:
        b += 1
    return [10.0 ** k for k in range(a, b + 1)]


def fmt_num(v: float) -> str:
    """Compact tick label: 0.25, 12, 1.5k, 2M, 1e-05."""
    return cell(float(v), TICK)


def tick_texts(ticks: Sequence[float], log: bool = False) -> list[str]:
    """Labels for evenly spaced ticks with as many decimals as the step needs, so a narrow
    range (23.015 .. 23.040) never shows the same label twice."""
    if log or len(ticks) < 2:
        return [fmt_num(t) for t in ticks]
    step = min(b - a for a, b in zip(ticks, ticks[1:]))
    if step <= 0 or (step >= 1 and all(float(t).is_integer() for t in ticks)) or \
            max(abs(t) for t in ticks) >= 1e4:
        return [fmt_num(t) for t in ticks]
    exp = math.floor(math.log10(step))
    mant = round(step / 10 ** exp, 6)
    decimals = max(0, -exp + (0 if float(mant).is_integer() else 1))
    return [f"{t:.{decimals}f}" for t in ticks]


@dataclass(frozen=True, slots=True)
class _Axis:
    lo: float
    hi: float
    ticks: list[float]
    log: bool
    pix_lo: float
    pix_hi: float

    @classmethod
    def build(cls, values: Sequence[float], pix_lo: float, pix_hi: float, *, log: bool = False,
              lo: float | None = None, hi: float | None = None,
              integer: bool = False) -> "_Axis":
        finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
        vmin = lo if lo is not None else (min(finite) if finite else 0.0)
        vmax = hi if hi is not None else (max(finite) if finite else 1.0)
        if log:
            vmin, vmax = max(vmin, 1e-12), max(vmax, vmin * 10)
            ticks = log_ticks(vmin, vmax)
        else:
            if vmax == vmin:  # a flat series still needs a visible range
                pad = abs(vmin) * 0.1 or 1.0
                vmin, vmax = vmin - pad, vmax + pad
            ticks = nice_ticks(vmin, vmax, integer=integer)
        t_lo = min(ticks[0], vmin) if lo is None else lo
        t_hi = max(ticks[-1], vmax) if hi is None else hi
        ticks = [t for t in ticks if t_lo - 1e-12 <= t <= t_hi + 1e-12]
        return cls(t_lo, t_hi, ticks, log, pix_lo, pix_hi)

    def __call__(self, v: float) -> float:
        if self.log:
            v = math.log10(max(v, 1e-12))
            lo, hi = math.log10(self.lo), math.log10(self.hi)
        else:
            lo, hi = self.lo, self.hi
        frac = (v - lo) / (hi - lo) if hi > lo else 0.5
        return round(self.pix_lo + frac * (self.pix_hi - self.pix_lo), 2)


# --------------------------------------------------------------------------- frame


def _frame(title: str, x: _Axis, y: _Axis, x_label: str, y_label: str,
           x_tick_labels: Sequence[tuple[float, str]] | None = None,
           y_tick_labels: Sequence[tuple[float, str]] | None = None,
           left: float = _M_LEFT) -> list[str]:
    """Opening tag, title, grid, axes, tick labels and axis labels."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'class="chart" role="img" preserveAspectRatio="xMidYMid meet">',
           f"<title>{escape(title)}</title>"]
    x0, x1 = left, WIDTH - _M_RIGHT
    y0, y1 = HEIGHT - _M_BOTTOM, _M_TOP
    out.append('<g class="grid">')
    for t in y.ticks:
        py = y(t)
        out.append(f'<line x1="{x0}" y1="{py}" x2="{x1}" y2="{py}"/>')
    out.append("</g>")
    out.append(f'<g class="axis"><line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}"/>'
               f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/></g>')
    out.append('<g class="ticks">')
    ylabels = (y_tick_labels if y_tick_labels is not None
               else list(zip(y.ticks, tick_texts(y.ticks, y.log))))
    for t, text in ylabels:
        out.append(f'<text x="{x0 - 6}" y="{y(t) + 4}" text-anchor="end">{escape(text)}</text>')
    labels = (x_tick_labels if x_tick_labels is not None
              else list(zip(x.ticks, tick_texts(x.ticks, x.log))))
    for t, text in labels:
        px = x(t)
        out.append(f'<line x1="{px}" y1="{y0}" x2="{px}" y2="{y0 + 4}"/>'
                   f'<text x="{px}" y="{y0 + 17}" text-anchor="middle">{escape(text)}</text>')
    out.append("</g>")
    out.append(f'<text class="xlabel" x="{(x0 + x1) / 2}" y="{HEIGHT - 26}" '
               f'text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text class="ylabel" transform="translate(16,{(y0 + y1) / 2}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    return out


def _legend(entries: Sequence[tuple[str, str, str]], left: float = _M_LEFT) -> list[str]:
    """One row under the x label: (label, colour, swatch kind: 'line', 'box', or a marker
    'circle'|'diamond'|'star'|'hollow')."""
    if not entries:
        return []
    out, px, py = ['<g class="legend">'], float(left), HEIGHT - 8
    for label, color, kind in entries:
        if kind in ("line", "dash"):
            dash = ' stroke-dasharray="4 3"' if kind == "dash" else ""
            out.append(f'<line x1="{px}" y1="{py - 4}" x2="{px + 16}" y2="{py - 4}" '
                       f'stroke="{color}" stroke-width="2.5"{dash}/>')
        elif kind in ("circle", "diamond", "star", "hollow"):
            shape = "circle" if kind == "hollow" else kind
            out.append(_marker(shape, px + 8, py - 4, 5 if kind == "star" else 4,  # type: ignore[arg-type]
                               color, kind == "hollow", ""))
        else:
            out.append(f'<rect x="{px + 2}" y="{py - 10}" width="12" height="12" '
                       f'fill="{color}"/>')
        out.append(f'<text x="{px + 21}" y="{py}">{escape(label)}</text>')
        px += 36 + 6.2 * len(label)
    out.append("</g>")
    return out


def _path(points: Sequence[tuple[float, float]]) -> str:
    return "M" + " L".join(f"{x},{y}" for x, y in points)


def _marker(kind: Marker, cx: float, cy: float, r: float, color: str, hollow: bool,
            tip: str) -> str:
    fill = "white" if hollow else color
    tip_el = f"<title>{escape(tip)}</title>" if tip else ""
    if kind == "circle":
        return (f'<circle cx="{cx}" cy="{cy}" r="{r}" fill="{fill}" stroke="{color}" '
                f'stroke-width="1.5">{tip_el}</circle>')
    if kind == "diamond":
        pts = [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]
    else:  # five-pointed star
        pts = [(round(cx + (r if i % 2 == 0 else r * 0.45) * math.sin(i * math.pi / 5), 2),
                round(cy - (r if i % 2 == 0 else r * 0.45) * math.cos(i * math.pi / 5), 2))
               for i in range(10)]
    return (f'<path class="marker" d="{_path(pts)} Z" fill="{fill}" stroke="{color}" '
            f'stroke-width="1.5">{tip_el}</path>')


def _color(given: str | None, i: int) -> str:
    return given or PALETTE[i % len(PALETTE)]


# --------------------------------------------------------------------------- builders


def thin(xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_LINE_POINTS
         ) -> tuple[list[float], list[float]]:
    """At most ``max_points`` (x, y) pairs, evenly strided, first and last kept."""
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    idx = sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
    return [xs[i] for i in idx], [ys[i] for i in idx]


def scatter_chart(groups: Sequence[PointGroup], *, title: str, caption: str, x_label: str,
                  y_label: str, log_x: bool = False, integer_x: bool = False) -> Chart:
    """Points by group; later groups draw on top (put highlights last).

    ``integer_x``: whole-number x ticks (trial numbers)."""
    xs = [p[0] for g in groups for p in g.points]
    ys = [p[1] for g in groups for p in g.points]
    if integer_x and xs:  # trial numbers: half a step of room, no negative ticks
        x = _Axis.build(xs, _M_LEFT, WIDTH - _M_RIGHT, lo=min(xs) - 0.5, hi=max(xs) + 0.5,
                        integer=True)
    else:
        x = _Axis.build(_padded(xs), _M_LEFT, WIDTH - _M_RIGHT, log=log_x)
    y = _Axis.build(_padded(ys), HEIGHT - _M_BOTTOM, _M_TOP)
    out = _frame(title, x, y, x_label, y_label)
    legend = []
    for i, g in enumerate(groups):
        color = _color(g.color, i)
        pts = [(px, py) for px, py in g.points if math.isfinite(px) and math.isfinite(py)]
        out.append(f'<g class="series" data-label="{escape(g.label)}">')
        if g.connect and len(pts) > 1:
            line = [(x(px), y(py)) for px, py in sorted(pts)]
            out.append(f'<path class="line" d="{_path(line)}" fill="none" stroke="{color}" '
                       'stroke-width="1.5"/>')
        tips = list(g.tooltips) + [""] * len(pts)
        for (px, py), tip in zip(pts, tips):
            out.append(_marker(g.marker, x(px), y(py), g.radius, color, g.hollow, tip))
        out.append("</g>")
        if not pts:
            continue
        legend.append((g.label, color, "hollow" if g.hollow and g.marker == "circle"
                       else ("line" if g.connect and g.radius < 2 else g.marker)))
    out += _legend(legend)
    out.append("</svg>")
    return Chart(title, caption, "\n".join(out))


def line_chart(series: Sequence[Series], *, title: str, caption: str, x_label: str,
               y_label: str, y_min: float | None = None, y_max: float | None = None,
               log_x: bool = False, ref_y: tuple[float, str] | None = None) -> Chart:
    """One ``<path>`` per series (thinned to ``MAX_LINE_POINTS`` vertices).

    ``ref_y``: a labelled horizontal reference line ``(y, text)``, e.g. ``(0.9, "p90")``.
    """
    thinned = [(s, *thin(s.xs, s.ys)) for s in series]
    xs = [v for _, sx, _ in thinned for v in sx]
    ys = [v for _, _, sy in thinned for v in sy]
    x = _Axis.build(xs, _M_LEFT, WIDTH - _M_RIGHT, log=log_x)
    y = _Axis.build(ys, HEIGHT - _M_BOTTOM, _M_TOP, lo=y_min, hi=y_max)
    out = _frame(title, x, y, x_label, y_label)
    if ref_y is not None:
        ry = y(ref_y[0])
        out.append(f'<g class="ref"><line x1="{_M_LEFT}" y1="{ry}" x2="{WIDTH - _M_RIGHT}" '
                   f'y2="{ry}" stroke="#8c959f" stroke-dasharray="2 3"/>'
                   f'<text x="{_M_LEFT + 4}" y="{ry - 4}" fill="#57606a">{escape(ref_y[1])}'
                   "</text></g>")
    legend = []
    for i, (s, sx, sy) in enumerate(thinned):
        color = _color(s.color, i)
        pts = [(x(a), y(b)) for a, b in zip(sx, sy)
               if math.isfinite(a) and math.isfinite(b) and (a > 0 or not log_x)]
        if pts:
            dash = ' stroke-dasharray="6 4"' if s.dashed else ""
            out.append(f'<path class="line" data-label="{escape(s.label)}" d="{_path(pts)}" '
                       f'fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        legend.append((s.label, color, "dash" if s.dashed else "line"))
    out += _legend(legend)
    out.append("</svg>")
    return Chart(title, caption, "\n".join(out))


def ecdf(values: Sequence[float], weights: Sequence[float] | None = None
         ) -> tuple[list[float], list[float]]:
    """Empirical CDF as step vertices: x sorted, y = fraction of weight <= x (0..1).

    Unweighted numpy values (a replay report's per-engine latencies: one a finished
    request of a day) are sorted by numpy instead of as a list of pairs; the vertices are
    the same floats (y = rank / count, one division each, as the running sum of ones
    gives exactly).
    """
    if weights is None and isinstance(values, np.ndarray):
        xs, ys = _ecdf_array(values)
        return xs.tolist(), ys.tolist()
    pairs = sorted((v, 1.0 if weights is None else float(w))
                   for v, w in zip(values, weights if weights is not None else values)
                   if math.isfinite(v) and (weights is None or w > 0))
    total = sum(w for _, w in pairs)
    xs: list[float] = []
    ys: list[float] = []
    acc = 0.0
    for v, w in pairs:
        acc += w
        if xs and xs[-1] == v:
            ys[-1] = acc / total
        else:
            xs.append(v)
            ys.append(acc / total)
    return xs, ys


def _ecdf_array(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ecdf` of a numpy array, as arrays."""
    # stable, as sorted() is: of equal values (0.0 and -0.0) the first one seen is the x
    finite = np.sort(values[np.isfinite(values)].astype(np.float64), kind="stable")
    if not finite.size:
        return finite, finite
    step = finite[1:] != finite[:-1]
    first = np.flatnonzero(np.concatenate([[True], step]))  # first of each run of equals
    last = np.flatnonzero(np.concatenate([step, [True]]))  # and its last
    ys = (last + 1).astype(np.float64) / float(finite.size)
    return finite[first], ys


def _thin_arrays(xs: np.ndarray, ys: np.ndarray, max_points: int = MAX_LINE_POINTS
                 ) -> tuple[list[float], list[float]]:
    """:func:`thin` on arrays, before any becomes a list: the same indices (numpy's
    float64 division of two exact integers and its half-to-even rounding are Python's
    ``/`` and ``round``), so a day's CDF costs its drawn points, not a float object a
    request."""
    n = len(xs)
    if n > max_points:
        i = np.arange(max_points, dtype=np.int64)
        idx = np.unique(np.round(i * (n - 1) / (max_points - 1)).astype(np.int64))
        xs, ys = xs[idx], ys[idx]
    return xs.tolist(), ys.tolist()


def cdf_chart(samples: Sequence[tuple[str, Sequence[float]]], *, title: str, caption: str,
              x_label: str, log_x: bool = False, dashed: Sequence[bool] = (),
              colors: Sequence[str] = ()) -> Chart:
    """One CDF line per ``(label, values)``; y is the fraction of requests (0-1)."""
    series = []
    for i, (label, values) in enumerate(samples):
        if isinstance(values, np.ndarray):  # thinned first, as line_chart would
            xs, ys = _thin_arrays(*_ecdf_array(values))
        else:
            xs, ys = ecdf(values)
        series.append(Series(label, xs, ys, color=colors[i] if i < len(colors) else None,
                             dashed=bool(dashed[i]) if i < len(dashed) else False))
    return line_chart(series, title=title, caption=caption, x_label=x_label,
                      y_label="fraction of requests (CDF)", y_min=0.0, y_max=1.0, log_x=log_x,
                      ref_y=(0.9, "p90"))


def histogram_bins(values: Sequence[float], n_bins: int = 30, *, log: bool = False
                   ) -> list[float]:
    """``n_bins + 1`` bin edges covering the finite values (log-spaced when ``log``)."""
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return [0.0, 1.0]
    lo, hi = min(finite), max(finite)
    if hi == lo:
        hi = lo + (abs(lo) or 1.0)
    if log:
        a, b = math.log10(lo), math.log10(hi)
        return [10 ** (a + (b - a) * i / n_bins) for i in range(n_bins + 1)]
    return [lo + (hi - lo) * i / n_bins for i in range(n_bins + 1)]


def histogram_chart(values: Sequence[float], *, title: str, caption: str, x_label: str,
                    y_label: str = "requests", n_bins: int = 30, log_x: bool = False,
                    color: str | None = None) -> Chart:
    """Counts per bin, one ``<rect class="bar">`` per bin."""
    edges = histogram_bins(values, n_bins, log=log_x)
    counts = [0] * (len(edges) - 1)
    lo, hi = edges[0], edges[-1]
    for v in values:
        if not math.isfinite(v) or (log_x and v <= 0):
            continue
        if log_x:
            frac = (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        else:
            frac = (v - lo) / (hi - lo)
        counts[min(max(int(frac * len(counts)), 0), len(counts) - 1)] += 1
    x = _Axis.build(edges, _M_LEFT, WIDTH - _M_RIGHT, log=log_x, lo=lo, hi=hi)
    y = _Axis.build([0.0] + [float(c) for c in counts], HEIGHT - _M_BOTTOM, _M_TOP, lo=0.0)
    out = _frame(title, x, y, x_label, y_label)
    fill = _color(color, 0)
    out.append('<g class="series">')
    for (a, b), c in zip(zip(edges, edges[1:]), counts):
        px0, px1, py = x(a), x(b), y(c)
        out.append(f'<rect class="bar" x="{px0}" y="{py}" width="{max(px1 - px0 - 1, 0.5):.2f}" '
                   f'height="{round(y(0) - py, 2)}" fill="{fill}">'
                   f"<title>{fmt_num(a)}-{fmt_num(b)}: {c}</title></rect>")
    out.append("</g>")
    out.append("</svg>")
    return Chart(title, caption, "\n".join(out))


def bar_chart(categories: Sequence[str], groups: Sequence[tuple[str, Sequence[float]]], *,
              title: str, caption: str, y_label: str, x_label: str = "",
              colors: Sequence[str] = ()) -> Chart:
    """Grouped bars: for each category one bar per group (e.g. baseline, tuned)."""
    n_cat, n_grp = len(categories), max(len(groups), 1)
    vals = [v for _, vs in groups for v in vs if math.isfinite(v)]
    y = _Axis.build([0.0] + vals, HEIGHT - _M_BOTTOM, _M_TOP, lo=min([0.0] + vals))
    x = _Axis.build([0.0, float(max(n_cat, 1))], _M_LEFT, WIDTH - _M_RIGHT, lo=0.0,
                    hi=float(max(n_cat, 1)))
    labels = [(i + 0.5, c) for i, c in enumerate(categories)]
    out = _frame(title, x, y, x_label, y_label, x_tick_labels=labels)
    slot = (x(1.0) - x(0.0)) * 0.8 / n_grp

    def place(g: int, i: int, v: float) -> str:
        px = x(float(i)) + (x(1.0) - x(0.0)) * 0.1 + g * slot
        top, base = y(max(v, 0.0)), y(min(v, 0.0))
        return (f'x="{px:.2f}" y="{top}" width="{slot - 2:.2f}" '
                f'height="{max(round(base - top, 2), 0.5)}"')

    bars, legend = _bar_series(categories, groups, colors, place)
    out += bars
    out += _legend(legend)
    out.append("</svg>")
    return Chart(title, caption, "\n".join(out))


def _bar_series(categories: Sequence[str], groups: Sequence[tuple[str, Sequence[float]]],
                colors: Sequence[str], place: Callable[[int, int, float], str],
                ) -> tuple[list[str], list[tuple[str, str, str]]]:
    """One ``<g class="series">`` of ``<rect class="bar">`` per group, and its legend entries.

    Why one function: vertical and horizontal bar charts differ only in where a bar sits;
    ``place(group, category, value)`` returns its ``x``/``y``/``width``/``height``
    attributes. Colours, skipped non-finite values and the hover title are the same.
    """
    out: list[str] = []
    legend: list[tuple[str, str, str]] = []
    for g, (label, values) in enumerate(groups):
        color = colors[g] if g < len(colors) else _color(None, g)
        out.append(f'<g class="series" data-label="{escape(label)}">')
        for i, v in enumerate(values):
            if not math.isfinite(v):
                continue
            out.append(f'<rect class="bar" {place(g, i, v)} fill="{color}">'
                       f"<title>{escape(label)} {escape(categories[i])}: {fmt_num(v)}</title>"
                       "</rect>")
        out.append("</g>")
        legend.append((label, color, "box"))
    return out, legend


def _padded(values: Sequence[float]) -> list[float]:
    """Values plus 4% head-room either side, so markers are not cut by the frame."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return []
    lo, hi = min(finite), max(finite)
    pad = (hi - lo) * 0.04 or abs(hi) * 0.04 or 1.0
    return finite + [lo - pad, hi + pad]


def hbar_chart(categories: Sequence[str], groups: Sequence[tuple[str, Sequence[float]]], *,
               title: str, caption: str, x_label: str, colors: Sequence[str] = ()) -> Chart:
    """Horizontal grouped bars: one row per category (long names stay readable), one
    ``<rect class="bar">`` per (category, group); values are >= 0 (e.g. importances)."""
    n_cat, n_grp = max(len(categories), 1), max(len(groups), 1)
    left = min(max(_M_LEFT, 12 + 6.2 * max((len(c) for c in categories), default=0)), WIDTH / 2)
    vals = [v for _, vs in groups for v in vs if math.isfinite(v)]
    x = _Axis.build([0.0] + vals, left, WIDTH - _M_RIGHT, lo=0.0)
    # Category i occupies [i, i + 1) on a y axis running top (0) to bottom (n_cat).
    y = _Axis.build([0.0, float(n_cat)], _M_TOP, HEIGHT - _M_BOTTOM, lo=0.0, hi=float(n_cat))
    y = _Axis(y.lo, y.hi, [], False, y.pix_lo, y.pix_hi)  # no grid lines across categories
    out = _frame(title, x, y, x_label, "", y_tick_labels=[(i + 0.5, c) for i, c in
                                                          enumerate(categories)], left=left)
    slot = (y(1.0) - y(0.0)) * 0.8 / n_grp

    def place(g: int, i: int, v: float) -> str:
        py = y(float(i)) + (y(1.0) - y(0.0)) * 0.1 + g * slot
        return (f'x="{x(0.0)}" y="{py:.2f}" '
                f'width="{max(round(x(max(v, 0.0)) - x(0.0), 2), 0.5)}" '
                f'height="{max(slot - 1.5, 0.5):.2f}"')

    bars, legend = _bar_series(categories, groups, colors, place)
    out += bars
    out += _legend(legend, left)
    out.append("</svg>")
    return Chart(title, caption, "\n".join(out))
