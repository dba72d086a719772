"""The review page's charts, as inline SVG: round axis ticks, and point labels laid out so that
none overlaps another label, a point or the alpha line's label, and none leaves the figure; a
label sits beside its point only where that point is the nearest one to it (else a leader line
joins them), so no label reads as another point's.

Text is not measured here (no font is loaded): :func:`text_width` is an upper bound on the width
of a label in common sans-serif fonts (tests check it against DejaVu Sans through matplotlib, and
the browser test checks the laid-out labels' real boxes in Chromium). Standard library only.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

W, H, PAD, TOP, RIGHT = 480, 280, 56, 22, 16  # PAD: room for the axes' ticks and titles
LABEL_PX = 9  # the point labels' font size (the .pt class)
DOT_R, DEPLOYED_R = 4, 7


@dataclass(frozen=True)
class Box:
    x0: float
    y0: float
    x1: float
    y1: float

    def meets(self, other: "Box") -> bool:
        return self.x0 < other.x1 and other.x0 < self.x1 and self.y0 < other.y1 and other.y0 < self.y1

    def inside(self, outer: "Box") -> bool:
        return self.x0 >= outer.x0 and self.y0 >= outer.y0 and self.x1 <= outer.x1 and self.y1 <= outer.y1


@dataclass(frozen=True)
class Label:
    name: str
    box: Box  # where the text lies (its baseline is box.y1 - descent)
    anchor: tuple[float, float]  # the point it names
    leader: bool  # drawn away from its point: a line joins them


def text_width(text: str, px: float = LABEL_PX, bold: bool = False) -> float:
    """An upper bound on the rendered width of ``text`` at ``px`` pixels (per-character em widths
    at least DejaVu Sans's, the widest common sans-serif; bold adds 10 %)."""
    em = sum(1.0 if c in "mwMW@%" else 0.8 if c.isupper() else 0.35 if c in "il.,:;'|!I/ " else 0.66 for c in text)
    return em * px * (1.1 if bold else 1.0) + 1


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round ticks (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]."""
    if not hi > lo:
        hi = lo + 1
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(s * power for s in (1, 2, 2.5, 5, 10) if s * power >= raw * 0.999)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def tick_text(value: float, ticks: Sequence[float]) -> str:
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) + (1 if round(step / 10 ** math.floor(math.log10(step)), 6) == 2.5 else 0)
    return f"{value:.{decimals}f}"


def gain_label(cost: str, kind: str) -> str:
    return f"gain over the reference (% {cost})" if kind == "percent" else f"gain over the reference (x, {cost})"


def layout_labels(points: Sequence[tuple[str, float, float, bool]], obstacles: Sequence[Box] = (),
                  frame: Box = Box(PAD + 2, 2, W - 2, H - PAD - 2)) -> list[Label]:
    """Place each point's label (name, x, y, deployed) in ``frame``, clear of every other label,
    every point and ``obstacles``: beside its point where there is room (the deployed point's
    first), else farther out with a leader line, else stacked along the frame's free rows."""
    placed: list[Label] = []
    dots = [Box(x - r, y - r, x + r, y + r) for _, x, y, d in points for r in [(DEPLOYED_R if d else DOT_R) + 1]]
    taken = list(obstacles) + dots
    order = sorted(range(len(points)), key=lambda i: (not points[i][3], points[i][1], points[i][2]))
    for i in order:
        name, x, y, deployed = points[i]
        text = _label_text(name, deployed)
        w, h = text_width(text, bold=deployed), LABEL_PX + 3
        free = lambda b: b.inside(frame) and not any(b.meets(t) for t in taken)  # noqa: E731
        box, beside = None, None  # beside: the first free place whose nearest point is its own (no leader)
        for reach in (6, 14, 26, 42):
            for dx, dy in ((1, -1), (1, 1), (-1, -1), (-1, 1), (0, -1), (0, 1)):
                cx = x + dx * reach if dx else x
                cy = y + dy * reach * 0.6
                bx0 = cx if dx > 0 else cx - w if dx < 0 else cx - w / 2
                by0 = cy - h if dy < 0 else cy
                candidate = Box(bx0, by0, bx0 + w, by0 + h)
                if not free(candidate):
                    continue
                box = box or candidate
                if reach <= 14 and nearest_point(candidate, points) == i:
                    beside = candidate
                    break
            if beside is not None:
                break
        box = beside or box
        leader = beside is None
        if box is None:  # crowded: the free slot of the frame nearest the point (a leader line joins them)
            slots = [Box(bx0, by0, bx0 + w, by0 + h) for by0 in _steps(frame.y0, frame.y1 - h, h / 2)
                     for bx0 in _steps(frame.x0, frame.x1 - w, 6)]
            slots.sort(key=lambda b: math.hypot((b.x0 + b.x1) / 2 - x, (b.y0 + b.y1) / 2 - y))
            box = next((b for b in slots if free(b)), None)
        if box is None:  # no room anywhere: the point's tooltip still names it
            continue
        placed.append(Label(text, box, (x, y), leader))
        taken.append(box)
    return placed


def nearest_point(box: Box, points: Sequence[tuple[str, float, float, bool]]) -> int | None:
    """The index of the point nearest to ``box`` (distance from the point to the box's edge);
    None on a tie, where a reader could not tell which point the label names."""
    distances = sorted((box_distance(box, x, y), k) for k, (_, x, y, _) in enumerate(points))
    if len(distances) > 1 and distances[1][0] - distances[0][0] < 1.0:
        return None
    return distances[0][1]


def box_distance(box: Box, x: float, y: float) -> float:
    """How far the point (x, y) lies from ``box`` (0 inside it)."""
    return math.hypot(max(box.x0 - x, 0, x - box.x1), max(box.y0 - y, 0, y - box.y1))


def _steps(lo: float, hi: float, step: float) -> list[float]:
    return [lo + k * step for k in range(int((hi - lo) // step) + 1)] if hi >= lo else []


def _label_text(name: str, deployed: bool) -> str:
    return f"{name} (deployed)" if deployed else name


def axes(xs: tuple[float, float], ys: tuple[float, float], xlabel: str, ylabel: str,
         xfmt: Callable[[float, Sequence[float]], str] = tick_text) -> tuple[Any, Any, str]:
    """Scales and the frame's SVG (its tick labels lie outside the plot, where no point label goes)."""
    xt, yt = nice_ticks(*xs), nice_ticks(*ys)
    xmin, xmax, ymin, ymax = xt[0], xt[-1], yt[0], yt[-1]
    sx = lambda x: PAD + (x - xmin) / (xmax - xmin) * (W - PAD - RIGHT)  # noqa: E731
    sy = lambda y: H - PAD - (y - ymin) / (ymax - ymin) * (H - PAD - TOP)  # noqa: E731
    parts = []
    for x in xt:
        parts.append(f'<line x1="{sx(x):.1f}" y1="{H - PAD}" x2="{sx(x):.1f}" y2="{H - PAD + 4}" class="axis"/>'
                     f'<text x="{sx(x):.1f}" y="{H - PAD + 16}" class="tick" text-anchor="middle">{_e(xfmt(x, xt))}</text>')
    for y in yt:
        parts.append(f'<line x1="{PAD - 4}" y1="{sy(y):.1f}" x2="{PAD}" y2="{sy(y):.1f}" class="axis"/>'
                     f'<text x="{PAD - 6}" y="{sy(y) + 4:.1f}" class="tick" text-anchor="end">{_e(tick_text(y, yt))}</text>')
    frame = (f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - RIGHT}" y2="{H - PAD}" class="axis"/>'
             f'<line x1="{PAD}" y1="{TOP}" x2="{PAD}" y2="{H - PAD}" class="axis"/>'
             f'<text x="{(PAD + W - RIGHT) / 2}" y="{H - 14}" text-anchor="middle" class="label">{_e(xlabel)}</text>'
             f'<text x="14" y="{H / 2}" text-anchor="middle" class="label" transform="rotate(-90 14 {H / 2})">{_e(ylabel)}</text>'
             + "".join(parts))
    return sx, sy, frame


def risk_chart(configs: Sequence[dict], alpha: float, deployed: str | None, cost: str, kind: str) -> str:
    """Each config's risk upper bound against its gain, the alpha line, the deployed point ringed."""
    points, spans = [], {}
    for c in configs:
        g, r, span = c.get("gain"), c.get("risk_upper"), c.get("gain_interval") or ()
        ends = [x for x in span if _finite(x)]
        if not _finite(g) and ends:  # settled by the cost intervals: its gain is an interval
            g, spans[c["name"]] = sum(ends) / len(ends), tuple(span)
        if _finite(g) and _finite(r):
            points.append((c["name"], g, r))
    if not points:
        return '<figure class="chart"><figcaption>Risk against gain: no config has both figures.</figcaption></figure>'
    gains, risks = [g for _, g, _ in points], [r for _, _, r in points]
    gains += [x for span in spans.values() for x in span if _finite(x)]
    base = 0.0 if kind == "percent" else 1.0
    fmt = (lambda x, t: f"{tick_text(x, t)}%") if kind == "percent" else (lambda x, t: f"{tick_text(x, t)}x")
    sx, sy, frame = axes((min(gains + [base]), max(gains + [base])), (0.0, max(risks + [alpha]) * 1.05),
                            gain_label(cost, kind), "risk upper bound", fmt)
    alpha_text = f"alpha = {alpha:g}"
    alpha_box = Box(W - RIGHT - text_width(alpha_text, 10), sy(alpha) - 13, W - RIGHT, sy(alpha) - 1)
    marks = [(n, sx(g), sy(r), n == deployed) for n, g, r in points]
    alpha_line = Box(PAD, sy(alpha) - 1, W - RIGHT, sy(alpha) + 1)  # no label across the line
    bars = {name: (PAD if low is None else sx(low), W - RIGHT if high is None else sx(high)) for name, (low, high) in spans.items()}
    bar_boxes = [Box(x0, sy(r) - 1, x1, sy(r) + 1) for n, _, r in points if n in bars for x0, x1 in [bars[n]]]
    labels = {label.anchor: label for label in layout_labels(marks, [alpha_box, alpha_line, *bar_boxes])}
    dots, texts = [], []
    for (name, g, r), (_, x, y, is_deployed) in zip(points, marks):
        cls = ("dot ok" if r <= alpha else "dot bad") + (" deployed" if is_deployed else "")
        tip = f"{_e(name)}: gain {g:.3g}, risk upper {r:.4f}" + (" (deployed)" if is_deployed else "")
        if name in spans:  # a bar across the interval (an unbounded end runs to the frame), an open dot at its middle
            low, high = spans[name]
            x0, x1 = bars[name]
            dots.append(f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" class="interval"/>')
            cls += " open"
            tip = (f"{_e(name)}: gain in [{_end(low, '-inf', kind)}, {_end(high, 'inf', kind)}] (an interval: not decoded on every prompt), "
                   f"risk upper {r:.4f}")
        ring = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{DEPLOYED_R}" class="ring"/>' if is_deployed else ""
        dots.append(f'{ring}<circle cx="{x:.1f}" cy="{y:.1f}" r="{DOT_R}" class="{cls}"><title>{tip}</title></circle>')
    for label in labels.values():
        b, (x, y) = label.box, label.anchor
        if label.leader:
            texts.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{min(max(x, b.x0), b.x1):.1f}" '
                         f'y2="{b.y1 if b.y1 <= y else b.y0:.1f}" class="leader"/>')
        cls = "pt deployed" if label.name.endswith("(deployed)") else "pt"
        left = b.x1 <= x  # left of its point: the text ends at the box's right edge, nearest the point
        texts.append(f'<text x="{b.x1 if left else b.x0:.1f}" y="{b.y1 - 3:.1f}" class="{cls}"'
                     f'{" text-anchor=" + chr(34) + "end" + chr(34) if left else ""}>{_e(label.name)}</text>')
    line = (f'<line x1="{PAD}" y1="{sy(alpha):.1f}" x2="{W - RIGHT}" y2="{sy(alpha):.1f}" class="alpha"/>'
            f'<text x="{W - RIGHT}" y="{sy(alpha) - 4:.1f}" text-anchor="end" class="alpha-label">{_e(alpha_text)}</text>')
    return (f'<figure class="chart"><svg viewBox="0 0 {W} {H}" role="img" aria-label="risk against gain">{frame}{line}'
            f'{"".join(dots)}{"".join(texts)}</svg><figcaption>Each config\'s risk upper bound (Clopper-Pearson, 1 - delta) '
            f'against its gain over the reference; the dashed line is alpha; the ringed point is the deployed config.'
            f'{INTERVAL_CAPTION if spans else ""}</figcaption></figure>')


INTERVAL_CAPTION = (" A bar with an open dot (at its middle, or at its finite end when the other is unbounded) is a valid "
                    "config's gain interval: the contenders' cost intervals settled the deployment without decoding it "
                    "on every prompt.")


def _end(x: float | None, unbounded: str, kind: str) -> str:
    return unbounded if x is None else f"{x:.3g}{'%' if kind == 'percent' else 'x'}"


def sweep_chart(points: Sequence[tuple[float, str, float]], alpha: float, cost: str, kind: str) -> str:
    """The gain deployed at each alpha of the sweep, and this run's alpha."""
    gains = [g for _, _, g in points]
    base = 0.0 if kind == "percent" else 1.0
    sx, sy, frame = axes((0.0, max(a for a, _, _ in points)), (min(gains + [base]), max(gains + [base])),
                            "alpha", gain_label(cost, kind).replace("gain", "gain deployed", 1))
    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(a):.1f},{sy(g):.1f}" for i, (a, _, g) in enumerate(points))
    marks = "".join(f'<circle cx="{sx(a):.1f}" cy="{sy(g):.1f}" r="2.5" class="dot ok"><title>alpha {a}: deploy {_e(d)} '
                    f'({g:.3g})</title></circle>' for a, d, g in points)
    now = (f'<line x1="{sx(alpha):.1f}" y1="{TOP}" x2="{sx(alpha):.1f}" y2="{H - PAD}" class="alpha"/>'
           if alpha <= points[-1][0] else "")
    return (f'<figure class="chart"><svg viewBox="0 0 {W} {H}" role="img" aria-label="alpha sweep">{frame}{now}'
            f'<path d="{path}" class="sweep"/>{marks}</svg><figcaption>The gain of the config deployed at each alpha '
            f'from 0.01 to 0.30, from this run\'s outcomes (no decoding); the dashed line is this run\'s alpha.'
            f'</figcaption></figure>')


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
