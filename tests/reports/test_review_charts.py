"""The review page's charts (pytest_redline.report.charts): round ticks, a gain axis that says
what it shows, the deployed point ringed, and point labels that neither overlap nor leave the
figure, checked geometrically with the boxes matplotlib's renderer gives the labels' text
(DejaVu Sans, the sans-serif Chromium uses here) at the positions the layout chose."""
from __future__ import annotations

import html
import re

import pytest

from pytest_redline.report import charts as rc
from pytest_redline.report.charts import Box

# The published llada2_math grid at alpha 0.1: (name, gain %, risk upper); five points within
# 30 % and 0.006 of each other, where the old labels overlapped and one was clipped.
PUBLISHED = [("acc85/semi70", 37.5, 0.0837), ("acc85/semi90", 32.9, 0.0868), ("acc90/semi70", 24.0, 0.0858),
             ("acc90/semi90", 17.4, 0.0889), ("acc95/semi70", 3.9, 0.0879), ("acc95/semi90", 0.0, 0.0023),
             ("acc99/semi90", -25.3, 0.0753)]
# The embedded grid (redline.yaml) at alpha 0.1, scheduled (the configs stopped early have no gain):
# the deployed acc70/semi70's bold label once sat over the acc80/semi70 dot, with no leader line.
EMBEDDED_GRID = [("acc95/semi90", 0.0, 0.0045), ("acc95/semi70", 0.59, 0.0229), ("acc90/semi90", 4.53, 0.0322),
                 ("acc90/semi70", 5.03, 0.0436), ("acc80/semi90", 8.93, 0.0547), ("acc80/semi70", 9.27, 0.0612),
                 ("acc70/semi90", 12.15, 0.0807), ("acc70/semi70", 12.43, 0.0849)]
CROWDED = [(f"cc{80 + k}/semi{90 - k}", 1.0 + 0.2 * k, 0.05 + 0.001 * k) for k in range(12)]  # one clump


def _chart(points, deployed, alpha=0.1, kind="percent", cost="tpf"):
    configs = [{"name": n, "gain": g, "risk_upper": r} for n, g, r in points]
    return rc.risk_chart(configs, alpha, deployed, cost, kind)


def _text_boxes(svg: str) -> list[tuple[str, Box]]:
    """Each point label's box as matplotlib renders its text (1 px = 1 pt at 72 dpi)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(rc.W / 72, rc.H / 72), dpi=72)
    canvas = FigureCanvasAgg(fig)
    texts = []
    for x, y, cls, end, name in re.findall(
            r'<text x="([\d.]+)" y="([\d.]+)" class="(pt(?: deployed)?)"( text-anchor="end")?>([^<]*)</text>', svg):
        t = fig.text(float(x) / rc.W, 1 - float(y) / rc.H, name.replace("&#x27;", "'"), fontsize=rc.LABEL_PX,
                     family="DejaVu Sans", weight="bold" if "deployed" in cls else "normal", va="baseline",
                     ha="right" if end else "left")
        texts.append((name, t))
    renderer = canvas.get_renderer()
    out = []
    for name, t in texts:
        e = t.get_window_extent(renderer)  # display coordinates: y up from the bottom
        out.append((name, Box(e.x0, rc.H - e.y1, e.x1, rc.H - e.y0)))
    return out


def _dots(svg: str) -> list[tuple[float, float, float]]:
    return [(float(x), float(y), float(r)) for x, y, r in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="([\d.]+)"', svg)]


@pytest.mark.parametrize("points, deployed", [(PUBLISHED, "acc85/semi70"), (CROWDED, "cc85/semi85"),
                                              (PUBLISHED + CROWDED, "acc85/semi70")])
@pytest.mark.slow  # renders charts with matplotlib: 1.15 s CPU, over the inner loop's 50 s budget (issue 25)
def test_labels_rendered_by_matplotlib_neither_overlap_nor_leave_the_figure(points, deployed):
    svg = _chart(points, deployed)
    boxes = _text_boxes(svg)
    assert {name for name, _ in boxes} == {n for n, _, _ in points if n != deployed} | {f"{deployed} (deployed)"}
    figure = Box(0, 0, rc.W, rc.H)
    for name, box in boxes:
        assert box.inside(figure), (name, box)
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            assert not box_a.meets(box_b), (a, b, box_a, box_b)
        for x, y, r in _dots(svg):  # nor over a point (the deployed one's ring included)
            assert not box_a.meets(Box(x - r, y - r, x + r, y + r)), (a, x, y)


@pytest.mark.slow  # renders charts with matplotlib: 0.44 s CPU, over the inner loop's 50 s budget (issue 25)
def test_the_width_bound_holds_for_dejavu_sans():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 2), dpi=72)
    renderer = FigureCanvasAgg(fig).get_renderer()
    names = [n for n, _, _ in PUBLISHED + CROWDED] + ["MMMM wide/WW", "gemma-2b@int4 %", "i.l|!", "Qwen2.5-0.5B (deployed)"]
    for name in names:
        for bold in (False, True):
            t = fig.text(0, 0, name, fontsize=rc.LABEL_PX, family="DejaVu Sans", weight="bold" if bold else "normal")
            assert t.get_window_extent(renderer).width <= rc.text_width(name, bold=bold), name


def test_round_ticks_and_a_gain_axis_that_says_percent():
    assert rc.nice_ticks(-25.3, 37.5) == [-40.0, -20.0, 0.0, 20.0, 40.0]
    assert rc.nice_ticks(0.0, 9.32) == [0.0, 2.5, 5.0, 7.5, 10.0]  # not 3.11 / 6.21 / 9.32
    assert rc.nice_ticks(0.0, 0.30) == [0.0, 0.1, 0.2, 0.3]
    svg = _chart([("ref", 0.0, 0.01), ("a", 9.32, 0.05), ("b", 4.0, 0.2)], "a")
    ticks = re.findall(r'class="tick" text-anchor="middle">([^<]*)<', svg)
    assert ticks == ["0.0%", "2.5%", "5.0%", "7.5%", "10.0%"]
    assert "gain over the reference (% tpf)" in svg and "gain (tpf)" not in svg
    factor = _chart([("ref", 1.0, 0.01), ("small", 2.81, 0.05)], "small", kind="factor", cost="memory_gb")
    assert "gain over the reference (x, memory_gb)" in factor
    assert re.findall(r'class="tick" text-anchor="middle">([^<]*)<', factor)[-1].endswith("x")


def test_the_deployed_point_is_ringed_and_its_label_bold():
    svg = _chart(PUBLISHED, "acc85/semi70")
    assert svg.count('class="ring"') == 1
    assert re.search(r'class="dot ok deployed"><title>acc85/semi70: [^<]*\(deployed\)</title>', svg)
    assert re.search(r'class="pt deployed"( text-anchor="end")?>acc85/semi70 \(deployed\)</text>', svg)


@pytest.mark.slow  # renders the labels with matplotlib
def test_settled_contenders_are_bars_across_their_gain_interval():
    """A config with a gain interval instead of a gain (the cost intervals settled it) is a bar
    from one end to the other with an open dot at its middle; an unbounded end runs to the
    frame; no label lies across a bar."""
    configs = [{"name": n, "gain": g, "risk_upper": r} for n, g, r in PUBLISHED]
    configs += [{"name": "eps0.4", "gain": None, "gain_interval": [-7.1, 10.7], "risk_upper": 0.0781},
                {"name": "open", "gain": None, "gain_interval": [22.2, None], "risk_upper": 0.0784}]
    # acc95/semi70's label would lie across eps0.4's bar if the bars were not obstacles to the layout
    svg = rc.risk_chart(configs, 0.1, "acc85/semi70", "tpf", "percent")
    bars = [tuple(map(float, m)) for m in re.findall(
        r'<line x1="([\d.]+)" y1="([\d.]+)" x2="([\d.]+)" y2="([\d.]+)" class="interval"/>', svg)]
    assert len(bars) == 2
    (x0, y0, x1, _), (u0, v0, u1, _) = bars
    mid = next((x, y) for x, y, _ in _dots(svg) if y == y0 and x0 < x < x1)
    assert mid[0] == pytest.approx((x0 + x1) / 2, abs=0.1)
    assert u1 == rc.W - rc.RIGHT and u0 < u1  # [22.2, inf): to the frame's right edge
    assert 'class="dot ok open"><title>eps0.4: gain in [-7.1%, 10.7%] (an interval' in svg
    assert "open: gain in [22.2%, inf]" in svg and "A bar with an open dot (at its middle, or at its finite end" in svg
    for name, box in _text_boxes(svg):
        for bx0, by, bx1 in ((x0, y0, x1), (u0, v0, u1)):
            assert not box.meets(Box(bx0, by - 1, bx1, by + 1)), (name, box)
    assert "A bar" not in _chart(PUBLISHED, "acc85/semi70")  # no interval, no caption for one


def own_dots(svg: str) -> dict[str, tuple[float, float]]:
    """Each point's centre by the name in its tooltip."""
    return {html.unescape(name): (float(x), float(y)) for x, y, name in
            re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="[\d.]+" class="dot[^"]*"><title>([^<]*?): ', svg)}


def leaders(svg: str) -> set[tuple[float, float]]:
    """The points that a leader line starts from."""
    return {(float(x), float(y)) for x, y in re.findall(r'<line x1="([\d.]+)" y1="([\d.]+)" x2="[\d.]+" y2="[\d.]+" class="leader"/>', svg)}


def check_each_label_names_its_own_point(boxes, dots, leads) -> None:
    """Each label's nearest point, measured to its rendered box, is its own; or a leader line joins them."""
    for label, box in boxes:
        name = html.unescape(label).removesuffix(" (deployed)")
        own = dots[name]
        if own in leads:
            continue
        distance = {other: rc.box_distance(box, *xy) for other, xy in dots.items()}
        nearest = min(distance, key=distance.get)
        assert nearest == name, (name, box, f"nearest dot is {nearest}'s", distance[nearest], distance[name])


@pytest.mark.parametrize("points, deployed", [(PUBLISHED, "acc85/semi70"), (CROWDED, "cc85/semi85"),
                                              (PUBLISHED + CROWDED, "acc85/semi70"), (EMBEDDED_GRID, "acc70/semi70")])
@pytest.mark.slow  # renders charts with matplotlib: about 1 s CPU
def test_each_label_rendered_by_matplotlib_is_nearest_its_own_point_or_has_a_leader(points, deployed):
    svg = _chart(points, deployed)
    check_each_label_names_its_own_point(_text_boxes(svg), own_dots(svg), leaders(svg))
