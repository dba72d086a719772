"""The review page: one self-contained HTML file for the reviewer of a serving change.

``pytest --redline-alpha=0.1 --redline-html=redline.html`` writes it at the end of the session,
partial runs included (marked PARTIAL). It holds, per grid: the verdict in the mode's own terms,
the table of configs (sortable), two inline SVG charts (risk upper bound against gain, with the
alpha line; the gain deployed at each alpha, when the outcomes allow the sweep), every regression
side by side (prompt, both outputs with the extracted answers marked and the rule that decided
each, the gold answer), filterable by config and searchable, and the provenance of the run.

Nothing is fetched: no CDN, no font, no image file. The page is built from the same objects as
the JSON report (:func:`pytest_redline.report.document.grid_report`), plus the prompts of each grid, so it
can never disagree with it. Standard library and numpy only.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pytest_redline.report.files import file_sha256
from pytest_redline.report.text import gain as gain_text

if TYPE_CHECKING:  # annotations only: review.py imports the gate's modules inside the functions that use them
    from pytest_redline.calibration import Calibration
    from pytest_redline.contracts import Prompt
    from pytest_redline.verdict import GridVerdict

SWEEP_ALPHAS = tuple(round(0.01 * k, 2) for k in range(1, 31))


def render(verdicts: Sequence[GridVerdict], provenance: Mapping[str, Any]) -> str:
    """The whole page for the session's grid verdicts."""
    from pytest_redline.report.document import grid_report

    sections = [_grid_section(v, grid_report(v), provenance.get("grids", {}).get(v.cal.label, {}), i)
                for i, v in enumerate(verdicts)]
    required = [v for v in verdicts if not v.cal.advisory]  # an advisory grid fails nothing
    advisory = [v.cal.grid.name for v in verdicts if v.cal.advisory and not v.certified]
    banner = ("PARTIAL" if not all(v.complete for v in required) else
              "CERTIFIED" if all(v.certified for v in required) else "NOT CERTIFIED")
    aside = f" (advisory, not certified: {', '.join(advisory)})" if advisory else ""
    return _PAGE.format(
        title=html.escape(f"redline: {banner}: " + ", ".join(v.cal.grid.name for v in verdicts)),
        style=_STYLE, script=_SCRIPT, banner_class=banner.lower().replace(" ", "-"), banner=html.escape(banner + aside),
        sections="\n".join(sections), provenance=_session_provenance(provenance),
    )


def write_html(path: str | Path, verdicts: Sequence[GridVerdict], provenance: Mapping[str, Any]) -> None:
    from pytest_redline.report.files import atomic_write

    atomic_write(Path(path), render(verdicts, provenance))


# --------------------------------------------------------------------------- one grid


def _grid_section(v: GridVerdict, rep: Mapping[str, Any], prov: Mapping[str, Any], index: int) -> str:
    cal = v.cal
    parts = [f'<section class="grid" id="grid-{index}">',
             f"<h2>{_e(cal.grid.name)} <small>{_e(cal.label)}</small></h2>",
             _verdict_box(v, rep, prov), _config_table(v, rep), *(_slice_table(rep, sl) for sl in rep.get("slices") or ()),
             '<div class="charts">', _risk_chart(v, rep), _sweep_chart(v, rep), "</div>",
             _regressions(v, rep, index), _grid_provenance(cal, rep, prov), "</section>"]
    return "\n".join(parts)


def _slice_table(rep: Mapping[str, Any], slicing: Mapping[str, Any]) -> str:
    """One slicing's table: each config's V, right answers and accuracy per slice (exact counts)."""
    stopped = {c["name"] for c in rep["configs"] if c.get("violations_bound") in ("lower", "upper")}
    body = []
    for row in slicing["rows"]:
        full = row["decoded"] == row["prompts"] and row["accuracy"] is not None
        cells = (row["config"], row["slice"], f"{row['violations']}" + (" (decoded only)" if row["config"] in stopped else ""),
                 f"{row['correct']} / {row['decoded']}", str(row["prompts"]), _num(row["accuracy"]) if full else "–")
        body.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("config", "slice", "V", "correct / decoded", "prompts", "accuracy"))
    return (f'<details class="slices" open><summary>By {_e(slicing["by"])}: {len(slicing["slices"])} slices '
            f'({_e(", ".join(slicing["slices"]))})</summary><table class="slices"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table><p class="note">V: regressions among the slice\'s decoded prompts; '
            f'{_e(slicing["note"])}. A certificate per slice is one grid per slice.</p></details>')


def _verdict_box(v: GridVerdict, rep: Mapping[str, Any], prov: Mapping[str, Any]) -> str:
    from pytest_redline.report.sentences import ADVISORY, best_cost, outcomes_line

    mode = rep["deploy_mode"]
    trade = _trade(v, rep)
    if not rep["complete"]:
        head, cls = "PARTIAL: nothing is certified", "partial"
    elif mode == "gate":
        ok = rep["certified"]
        head = f"{rep['deploy']} is {'CERTIFIED' if ok else 'NOT CERTIFIED'}" + (trade if ok else "")
        cls = "certified" if ok else "not-certified"
    elif mode == "all":
        head = f"every candidate is CERTIFIED; deploy {rep['deployed']}{trade}" if rep["certified"] else (
            "NOT CERTIFIED: " + ", ".join(rep["not_certified"]))
        cls = "certified" if rep["certified"] else "not-certified"
    else:
        head, cls = f"deploy {rep['deployed']}{trade}", "certified" if rep["certified"] else "not-certified"
    if rep.get("advisory"):
        head = f"ADVISORY: {head}"
    facts = [
        ("mode", {"gate": "gate (the pull request's config must be certified)", "all": "all (every candidate must be certified)",
                  "select": f"select (the best-cost valid config is deployed: {best_cost(rep['cost'], rep['direction'])})"}.get(mode, mode)),
        ("alpha", f"{_num(rep['alpha'])} ({rep['alpha_source']})"), ("advisory", ADVISORY if rep.get("advisory") else None),
        ("delta", _num(rep["delta"]) + (
            f" (this grid's share: {_num(rep['delta_share'])})" if rep.get("delta_share") != rep["delta"] else "")),
        ("n prompts", rep["n"]), ("m configs", rep["m"]), ("correction", rep["correction"]),
        ("reference", rep["reference"]), ("deployed", rep["deployed"]),
        ("best valid", _best_valid(rep)), ("alpha_min", _num(rep.get("alpha_min"))),
        ("cost intervals", _settled(rep)),
        ("outcomes", outcomes_line(v).split(": ", 1)[1]),
    ]
    spend = rep.get("spend") or {}
    if spend.get("naive_forwards"):
        facts.append(("spend", f"{spend.get('forwards', 0):,.0f} forwards (model calls) against {spend['naive_forwards']:,.0f} "
                               f"for the full grid ({_num(spend.get('ratio'))}x); {_device_text(v, prov)}"))
    if rep.get("missing"):
        facts.append(("missing items", f"{len(rep['missing'])} (first: {rep['missing'][0]['config']} :: "
                                       f"{rep['missing'][0]['prompt']}, {rep['missing'][0]['reason']})"))
    if rep.get("error"):
        facts.append(("error", rep["error"]))
    if rep.get("poor_trade"):
        facts.append(("trade-off", rep["poor_trade"]))
    if rep.get("slower_than_reference"):
        facts.append(("slower", f"{rep['requested']} is certified but slower than the reference {rep['reference']} "
                                f"on {rep['cost']}; it is still the requested config"))
    if rep.get("min_gain"):
        facts.append(("min_gain", f"{_num(rep['min_gain'])} (select mode only)"))
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts if v not in (None, "", "None"))
    return f'<div class="verdict {cls}"><p class="head">{_e(head)}</p><table class="facts">{rows}</table></div>'


def _best_valid(rep: Mapping[str, Any]) -> str | None:
    """The best-cost valid config; in gate mode, with the valid configs not decoded for cost whose
    interval may still beat it (then the best is one of them)."""
    best, open_ = rep.get("best_valid"), rep.get("best_valid_open") or []
    if not open_:
        return best
    configs = {c["name"]: c for c in rep["configs"]}
    spans = ", ".join(f"{name} {_interval(configs[name]['cost_interval'])}" for name in open_)
    return f"{best}, or one of {spans} (valid, not decoded for cost in gate mode: their all-prompt cost intervals)"


def _settled(rep: Mapping[str, Any]) -> str | None:
    """The valid configs the contenders' cost intervals settled without decoding them on every
    prompt: each one's cost (an interval unless its bounds fix it) and why it was settled."""
    parts = []
    for c in rep["configs"]:
        if c.get("cost_decided"):
            cost = _num(c["cost"]) if c.get("cost") is not None else _interval(c["cost_interval"])
            parts.append(f"{c['name']} {cost} ({c['cost_decided']})")
    return "; ".join(parts) or None


def _interval(span: Sequence[float | None], fmt: Callable[[float], str] = lambda x: _num(x)) -> str:
    """``[low, high]``; an unbounded end (None in the JSON report) reads as -inf / inf."""
    low, high = ("-inf" if span[0] is None else fmt(span[0])), ("inf" if span[1] is None else fmt(span[1]))
    return f"[{low}, {high}]"


def _trade(v: GridVerdict, rep: Mapping[str, Any]) -> str:
    """The deployed config's gain and accuracy cost, as the terminal's verdict line gives them."""
    entry = next((c for c in rep["configs"] if c["name"] == rep.get("deployed")), None)
    if entry is None or v.result is None:
        return ""
    if entry["name"] == rep["reference"]:
        return " (the reference)"
    gain, points = entry.get("gain"), entry.get("net_accuracy_points")
    if gain is None or points is None:
        return ""
    return f": {gain_text(gain, v.result.gain_kind)} {rep['cost']}, {points:+.1f} accuracy points"


def _device_text(v: GridVerdict, prov: Mapping[str, Any]) -> str:
    """Where the forwards were spent: this run's decodes on the device its engines report; a
    replay's forwards are the recorded run's (nothing ran now)."""
    if v.cal.replayed:
        return "replayed: the recorded run's forwards, none decoded now"
    devices = set()
    for known in prov.get("configs", {}).values():
        identity = (known or {}).get("identity") or {}
        runtime = identity.get("runtime") or {}
        device = runtime.get("device") or identity.get("device")
        if device:
            devices.add(str(device))
    where = ", ".join(sorted(devices)) if devices else "the device the engines used (not reported here)"
    decoded = (v.spend.decoded_forwards or 0) if v.spend is not None else 0
    seconds = v.spend.decode_seconds if v.spend is not None else 0.0
    return f"decoded now: {decoded:,.0f} forwards in {seconds:.1f} s on {where}"


COLUMNS = (("config", "name"), ("params", "params"), ("V", "violations"), ("risk upper", "risk_upper"),
           ("p-value", "p_value"), ("Holm p", "p_adjusted"), ("valid", "valid"), ("status", "status"), ("accuracy", "accuracy"),
           ("cost", "cost"), ("gain", "gain"), ("decode s", "decode_seconds"))


def _config_table(v: GridVerdict, rep: Mapping[str, Any]) -> str:
    decoded = {name: 0 for name in v.cal.configs}
    for (config, _), entry in v.record.entries.items():
        decoded[config] += entry.source == "decoded"
    head = "".join(f'<th data-col="{i}">{_e(label)}</th>' for i, (label, _) in enumerate(COLUMNS))
    body = []
    for c in rep["configs"]:
        marks = []
        if c["name"] == rep["reference"]:
            marks.append("reference")
        if c["name"] == rep["deployed"]:
            marks.append("deployed")
        failed = c["name"] in rep.get("not_certified", ()) or (c.get("valid") is False and c["name"] != rep["reference"])
        if failed:  # pink marks a failure: exceeds the budget; an inconclusive config is not shown as one
            marks.append("inconclusive" if c.get("status") == "inconclusive" else "not-valid")
        cells = []
        for _, key in COLUMNS:
            value = c.get(key)
            if key == "params":
                text = json.dumps(value, sort_keys=True)
            elif key == "violations" and c.get("violations_bound") in ("lower", "upper"):
                text = (">= " if c["violations_bound"] == "lower" else "<= ") + str(value)
            elif key == "risk_upper" and value is not None:
                text = f"{value:.4f} {'<=' if value <= rep['alpha'] else '>'} {rep['alpha']}"
            elif key == "valid":
                text = "valid" if value else ("NOT valid" if value is not None else "")
            elif key == "gain" and value is not None:
                text = gain_text(value, _gain_kind(v, rep))
            elif key in ("cost", "gain") and value is None and c.get(f"{key}_interval"):
                span = c[f"{key}_interval"]
                fmt = (lambda x: gain_text(x, _gain_kind(v, rep))) if key == "gain" else (lambda x: _num(x))
                text, value = f"{_interval(span, fmt)} interval", next((x for x in span if x is not None), None)
            elif key == "accuracy" and value is None and c.get("accuracy_on_prompts_run") is not None:
                value = None  # not an all-prompt accuracy: it does not sort among them
                right = c.get("correct_on_prompts_run", round(c["accuracy_on_prompts_run"] * c["prompts_run"]))
                text = f"– ({right} of the {c['prompts_run']} prompts it ran right)"
            elif key == "decode_seconds" and value is not None and not decoded[c["name"]]:
                text, value = "reused", -1.0  # nothing decoded now: the store's (or the replay's) outcomes
            else:
                text = _num(value) if isinstance(value, float) else ("" if value is None else str(value))
            sort = value if isinstance(value, (int, float)) and not isinstance(value, bool) else text
            cells.append(f'<td data-sort="{_e(sort)}">{_e(text)}</td>')
        label = " ".join(marks)
        body.append(f'<tr class="{label}" title="{_e(label)}">{"".join(cells)}</tr>')
    note = ("Marks: reference (R), deployed (*), NOT valid (not certified). Accuracy, cost and gain are "
            "all-prompt figures; decode s is this session's decoding time, 'reused' where every outcome came from "
            "the store; empty where a config was not decoded on every prompt (the JSON report has "
            "the subset figures). '[low, high] interval': a valid config's all-prompt cost (gain) interval, from the "
            "prompts it ran and its engine's declared cost bounds on the rest, which settled the deployment without "
            "decoding it everywhere. '– (K of the N prompts it ran right)': a config not decoded on every prompt has no "
            "accuracy; K counts its right answers on the N prompts the schedule chose (mostly those the reference "
            "answers right), so K / N is not comparable with the all-prompt accuracies. Rows: green deployed, pink "
            "NOT valid and exceeds the budget (a failure), grey NOT valid and inconclusive (too few prompts to tell). "
            "Click a header to sort.")
    return (f'<table class="configs sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
            f'<p class="note">{_e(note)}</p>')


# --------------------------------------------------------------------------- charts (inline SVG: report/charts.py)


def _gain_kind(v: GridVerdict, rep: Mapping[str, Any]) -> str:
    return v.result.gain_kind if v.result is not None else ("factor" if rep.get("direction") == "lower" else "percent")


def _risk_chart(v: GridVerdict, rep: Mapping[str, Any]) -> str:
    from pytest_redline.report.charts import risk_chart

    return risk_chart(rep["configs"], rep["alpha"], rep["deployed"], rep["cost"], _gain_kind(v, rep))


def sweep_points(v: GridVerdict) -> list[tuple[float, str, float]] | None:
    """(alpha, deployed config, its gain) at each alpha of :data:`SWEEP_ALPHAS`, from the
    session's own outcomes; None when they do not allow it (a partial or scheduled live run,
    whose stops were decided at this alpha only)."""
    if v.result is None or v.table is None:
        return None
    from pytest_redline import risk

    r = v.result
    results = risk.sweep(v.table.correct, r.cost, r.reference_index, SWEEP_ALPHAS, v.cal.delta_share,
                         names=r.names, lower_is_better=r.lower_is_better, correction=r.correction,
                         gain=r.gain_kind)
    return [(s.alpha, s.deployed, float(s.gain[s.deployed_index])) for s in results]


def _sweep_chart(v: GridVerdict, rep: Mapping[str, Any]) -> str:
    try:
        points = sweep_points(v)
    except ValueError as e:  # an outcome table the sweep cannot take: say so, never fail the page
        return f'<figure class="chart"><figcaption>The alpha sweep is not available: {_e(e)}</figcaption></figure>'
    if not points:
        why = ("the run was partial" if not rep["complete"] else
               "a scheduled live run decided its early stops at this alpha only; run with --redline-full for the sweep")
        return f'<figure class="chart"><figcaption>The alpha sweep is not shown: {_e(why)}.</figcaption></figure>'
    from pytest_redline.report.charts import sweep_chart

    return sweep_chart(points, rep["alpha"], rep["cost"], _gain_kind(v, rep))


# --------------------------------------------------------------------------- regressions


def _regressions(v: GridVerdict, rep: Mapping[str, Any], index: int) -> str:
    regressions = rep.get("regressions") or []
    prompts = {p.id: p for p in v.cal.prompts}
    first = rep.get("deployed") if rep.get("deploy_mode") != "gate" else rep.get("deploy")
    configs = sorted({r["config"] for r in regressions}, key=lambda c: (c != first, list(v.cal.configs).index(c)))
    options = "".join(f'<option value="{_e(c)}">{_e(c)}</option>' for c in configs)
    head = (f'<h3>Regressions: {len(regressions)}</h3><div class="filters"><label>config <select class="rx-config">'
            f'<option value="">all</option>{options}</select></label> <label>search <input class="rx-search" '
            f'type="search" placeholder="prompt id or text"></label></div>')
    if not regressions:
        return head + "<p>None: no config broke a prompt that the reference answers correctly.</p>"
    blocks = []
    for config in configs:
        items = [r for r in regressions if r["config"] == config]
        cards = "".join(_regression_card(r, prompts.get(r["prompt"]), rep["reference"]) for r in items)
        blocks.append(f'<details class="rx-group" data-config="{_e(config)}"><summary>{_e(config)}: {len(items)} '
                      f'regression{"s" * (len(items) != 1)}</summary>{cards}</details>')
    return head + "".join(blocks)


def _regression_card(r: Mapping[str, Any], prompt: Prompt, reference: str) -> str:
    text = "" if prompt is None else (prompt.text or "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt.messages))
    gold = _gold(prompt)
    replayed = not (r.get("reference_answer") or r.get("candidate_answer"))
    if replayed:
        body = ('<p class="note">A replayed grid records only correctness: there are no outputs to show.</p>')
    else:
        body = ('<div class="side"><div><h5>reference (' + _e(reference) + ')</h5>'
                + _output(r.get("reference_answer", ""), r.get("reference_extracted"), r.get("reference_rule"))
                + '</div><div><h5>candidate (' + _e(r["config"]) + ')</h5>'
                + _output(r.get("candidate_answer", ""), r.get("candidate_extracted"), r.get("candidate_rule"))
                + "</div></div>")
    search = f"{r['prompt']} {text}".lower()
    return (f'<article class="rx" data-search="{_e(search)}"><h4>{_e(r["prompt"])}</h4>'
            + (f"<pre class=\"prompt\">{_e(text)}</pre>" if text else "")
            + (f'<p class="gold">gold: <code>{_e(gold)}</code></p>' if gold else "")
            + body + "</article>")


def _output(text: str, extracted: Any, rule: Any) -> str:
    escaped = _e(text)
    if extracted not in (None, ""):
        needle = _e(str(extracted))
        at = escaped.rfind(needle)
        if at >= 0:
            escaped = escaped[:at] + f"<mark>{needle}</mark>" + escaped[at + len(needle):]
    answer = "no answer" if extracted in (None, "") else str(extracted)
    return (f'<pre class="output">{escaped}</pre><p class="answer">answer: <mark>{_e(answer)}</mark>'
            f' <span class="rule">rule: {_e(rule or "not reported")}</span></p>')


def _gold(prompt: Prompt) -> str:
    if prompt is None:
        return ""
    meta = dict(prompt.meta)
    for key in ("answer", "gold"):
        if meta.get(key) not in (None, ""):
            return str(meta[key])
    if meta.get("test"):
        return str(meta["test"])
    if meta.get("test_list"):
        return "\n".join(map(str, meta["test_list"]))
    return ""


# --------------------------------------------------------------------------- provenance


def _grid_provenance(cal: Calibration, rep: Mapping[str, Any], prov: Mapping[str, Any]) -> str:
    rows = [("grid file", f"{cal.grid.path} (sha256 {file_sha256(cal.grid.path) or 'unreadable'})")]
    suite = getattr(cal, "suite", None)
    if suite is not None:
        rows.append(("suite", f"{cal.grid.suite} {json.dumps(dict(cal.grid.suite_args), sort_keys=True)}; scoring version "
                              f"{getattr(suite, 'version', '') or 'not reported'}"))
    configs = prov.get("configs", {})
    for name in cal.configs:
        engine, args = cal.engines[name]
        known = configs.get(name, {})
        identity = known.get("identity")
        line = f"{engine} {json.dumps(dict(args), sort_keys=True, default=str)}"
        if identity:
            line += f"; fingerprint {identity.get('fingerprint')}; runtime {json.dumps(identity.get('runtime', {}), sort_keys=True)}"
        line += f"; store key {known.get('key') or 'not known here (computed where the config was decoded)'}"
        rows.append((f"config {name}", line))
    if rep.get("checkpoints"):
        rows.append(("checkpoint values used", json.dumps(rep["checkpoints"], sort_keys=True)))
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<details class="provenance"><summary>Provenance</summary><table class="facts">{body}</table></details>'


def _session_provenance(prov: Mapping[str, Any]) -> str:
    rows = [(k, prov[k]) for k in ("command", "versions", "python", "host time") if prov.get(k)]
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v if isinstance(v, str) else json.dumps(v, sort_keys=True))}</td></tr>"
                   for k, v in rows)
    return f'<table class="facts">{body}</table>'


# --------------------------------------------------------------------------- helpers


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _num(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.4g}" if x == x else "nan"
    return str(x)


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{padding:14px 24px;color:#fff}header.certified{background:#1f7a3a}header.not-certified{background:#b3261e}
header.partial{background:#8a5a00}header h1{margin:0;font-size:22px}main{padding:8px 24px 40px}
section.grid{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 16px 16px;margin:16px 0}
.verdict .head{font-size:18px;font-weight:600}.verdict.certified .head{color:#1f7a3a}
.verdict.not-certified .head{color:#b3261e}.verdict.partial .head{color:#8a5a00}
table{border-collapse:collapse}table.facts th{text-align:left;padding:2px 12px 2px 0;font-weight:500;color:#555;vertical-align:top}
table.configs{margin-top:12px;width:100%}table.configs th,table.configs td{border-bottom:1px solid #eee;padding:4px 6px;text-align:right}
table.configs td{white-space:nowrap}table.configs td:nth-child(2){white-space:normal}
table.configs th{cursor:pointer;background:#f2f2f2;user-select:none;white-space:nowrap}table.configs td:first-child,table.configs td:nth-child(2){text-align:left}
table.configs td:nth-child(2){font-family:ui-monospace,monospace;font-size:12px}
tr.deployed td:first-child::after{content:" *";font-weight:700}tr.reference td:first-child::after{content:" R"}
tr.deployed{background:#e8f5ec}tr.not-valid{background:#fdecea}tr.inconclusive{background:#f1f1f4}
table.configs th:nth-child(-n+2){text-align:left}
table.slices td,table.slices th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}table.slices td:nth-child(-n+2),table.slices th:nth-child(-n+2){text-align:left}.note{color:#666;font-size:12px}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:8px 0;max-width:480px}svg{width:100%;height:auto}
.axis{stroke:#444}.tick{font-size:10px;fill:#555}.label{font-size:11px;fill:#333}.alpha{stroke:#b3261e;stroke-dasharray:4 3}
.alpha-label{font-size:10px;fill:#b3261e}.dot.ok{fill:#1f7a3a}.dot.bad{fill:#b3261e}.pt{font-size:9px;fill:#333}
.ring{fill:none;stroke:#111;stroke-width:2}.pt.deployed{font-weight:700;fill:#111}.leader{stroke:#999;stroke-width:.7}
.sweep{fill:none;stroke:#1f5fa8;stroke-width:2}.interval{stroke:#1f7a3a;stroke-width:2}.dot.open{fill:#fff;stroke:#1f7a3a;stroke-width:1.5}details{margin:6px 0}summary{cursor:pointer;font-weight:500}
article.rx{border-top:1px solid #eee;padding:6px 0}.side{display:flex;gap:12px}.side>div{flex:1;min-width:0}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:6px;border-radius:4px;margin:4px 0}
mark{background:#ffe38a}.rule{color:#555;margin-left:8px}.filters{margin:6px 0}
"""

_SCRIPT = """
document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click',function(){
 var table=th.closest('table'),body=table.tBodies[0],col=+th.dataset.col,asc=th.dataset.asc!=='1';
 table.querySelectorAll('th').forEach(function(o){delete o.dataset.asc});th.dataset.asc=asc?'1':'0';
 var rows=Array.prototype.slice.call(body.rows);rows.sort(function(a,b){
  var x=a.cells[col].dataset.sort,y=b.cells[col].dataset.sort,nx=parseFloat(x),ny=parseFloat(y);
  var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:String(x).localeCompare(String(y));return asc?c:-c});
 rows.forEach(function(r){body.appendChild(r)})})});
document.querySelectorAll('section.grid').forEach(function(sec){
 var sel=sec.querySelector('.rx-config'),box=sec.querySelector('.rx-search');if(!sel)return;
 function apply(){var c=sel.value,q=box.value.toLowerCase();
  sec.querySelectorAll('details.rx-group').forEach(function(g){var show=!c||g.dataset.config===c,any=false;
   g.querySelectorAll('article.rx').forEach(function(a){var hit=!q||a.dataset.search.indexOf(q)>=0;a.hidden=!hit;any=any||hit});
   g.hidden=!show||!any;if(q&&any)g.open=true})}
 sel.addEventListener('change',apply);box.addEventListener('input',apply)});
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>{title}</title><style>{style}</style></head>
<body><header class="{banner_class}"><h1 id="verdict">REDLINE {banner}</h1></header>
<main>{sections}
<details class="provenance"><summary>Session</summary>{provenance}</details></main>
<script>{script}</script></body></html>
"""


def summary_lines(verdicts: Sequence[GridVerdict], page: str | Path | None) -> list[str]:
    """HTML lines for another report's summary (pytest-html): the verdict, and the page."""
    from pytest_redline.report.sentences import session_line

    if not verdicts:
        return []
    text, ok = session_line(verdicts)
    lines = [f'<p style="font-weight:600;color:{"#1f7a3a" if ok else "#b3261e"}">{_e(text)}</p>']
    if page is not None:
        lines.append(f'<p>Redline review page: <a href="{_e(Path(page).resolve().as_uri())}">{_e(page)}</a></p>')
    return lines
