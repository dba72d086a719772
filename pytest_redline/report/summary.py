"""The pull-request summary: the session's verdicts as GitHub-flavoured Markdown.

``pytest --redline-alpha=0.1 --redline-markdown=redline.md`` writes it at the end of the
session (partial runs included, marked PARTIAL); when ``GITHUB_STEP_SUMMARY`` is set the
same text is appended there, so it shows on the workflow run's page. Per grid: the verdict
in the mode's own terms (the terminal's line), one table row per config (V, n, the risk's
upper bound against alpha, p, the adjusted p, the status, the gain, d_acc), the
regressions collapsed in one ``<details>`` block per config (the deployed or gated config
first), and the provenance (the grid file's sha256, the suite's scoring version, the
package versions).

Privacy (``--redline-markdown-prompts``): a step summary is readable by anyone who can read
the repository, and calibration prompts may be private. ``none`` shows how many prompts
each config broke and the rules that decided, no prompt ids; ``ids`` (the default) adds
the prompt ids and each side's rule, but neither the prompt nor the answers (the
reference's answer is the gold answer of a prompt it got right); ``full`` adds the prompt
text, both extracted answers and both outputs, each clipped to :data:`TEXT_CHARS`.

Size: GitHub refuses a step summary over 1 MiB. The regressions are cut first (the last
ones in display order), and the summary says how many it left out; the JSON report and
the review page keep them all.

Pull-request comment: beside the summary, ``redline.comment.md`` (:func:`comment_path`) is the
same document trimmed the same way to GitHub's 65,536-character limit on a comment. Both start
with the session's hidden :func:`marker` (``<!-- redline: <grid names> -->``), by which a
workflow finds its earlier comment and edits it in place (docs/how-to/ci.md). The gate itself
posts nothing: it holds no token and makes no network call.

:func:`render` works on plain data (:class:`GridSummary`: the JSON report object of a grid
and a few lines of text), so it is tested without running pytest; :func:`grids` builds that
data from the gate's verdicts and :func:`write` is what the session calls.
"""
from __future__ import annotations

import html
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_redline.report import text

if TYPE_CHECKING:  # annotations only: grids() imports the report modules when it runs
    from pytest_redline.verdict import GridVerdict

LIMIT = 1024 * 1024  # bytes: GitHub's limit on one step's summary (over it, GitHub uploads none of it)
COMMENT_LIMIT = 65536  # characters (not bytes): GitHub's limit on one pull-request comment's body
MIN_LIMIT = 16 * 1024  # when an earlier writer left less room than this, write this much anyway
PROMPTS = ("none", "ids", "full")
TEXT_CHARS = 300  # a prompt or an output in a full summary, as the terminal clips answers
STATUS_MARKS = {"certified": "✅", "exceeds budget": "❌", "inconclusive": "❔"}
BIASED = "a biased estimate: the adaptive order ran it first where the others regressed"


@dataclass(frozen=True)
class GridSummary:
    """What the summary shows of one grid.

    ``report`` is the grid's JSON report object (:func:`pytest_redline.report.document.grid_report`);
    ``verdict`` and ``header`` the terminal's verdict and header lines, ``notes`` its other
    lines worth a reviewer's eye (a hint, a poor trade, a partial run's missing items);
    ``settle`` per inconclusive config what would settle it; ``prompts`` the prompt texts by
    id (shown only in a ``full`` summary); ``grid_sha256`` the grid file's hash; ``outcomes``
    the terminal's outcomes line."""

    report: Mapping[str, Any]
    verdict: str
    header: str = ""
    notes: tuple[str, ...] = ()
    settle: Mapping[str, str] = field(default_factory=dict)
    prompts: Mapping[str, str] = field(default_factory=dict)
    grid_sha256: str | None = None
    outcomes: str = ""  # the terminal's outcomes line (a replayed grid says it replayed)


# --------------------------------------------------------------------------- the document


def marker(grids: Sequence[GridSummary]) -> str:
    """The session's hidden marker, the summary's first line: the same grids give the same marker,
    so a workflow finds its earlier pull-request comment by it and edits it in place."""
    names = ", ".join(sorted(g.report["grid"] for g in grids))
    return f"<!-- redline: {names.replace('--', '- -')} -->"


def render_comment(grids: Sequence[GridSummary], provenance: Mapping[str, Any], prompts: str = "ids",
                   limit: int = COMMENT_LIMIT) -> str:
    """The summary as a pull-request comment: under ``limit`` characters, trimmed as :func:`render`
    trims a step summary (regression rows first)."""
    return render(grids, provenance, prompts, limit=limit, size=len, what=COMMENT_WORDS)


STEP_WORDS = "GitHub's 1 MiB limit for a step summary"
COMMENT_WORDS = "GitHub's 65,536-character limit for a comment"


def render(grids: Sequence[GridSummary], provenance: Mapping[str, Any], prompts: str = "ids", limit: int = LIMIT,
           size=None, what: str = STEP_WORDS) -> str:
    """The whole summary, under ``limit`` bytes (UTF-8; or as ``size`` measures, with ``what``
    naming the limit): every regression row that fits, in display order, and a count of those
    left out."""
    if prompts not in PROMPTS:
        raise ValueError(f"prompts: expected one of {', '.join(PROMPTS)}, got {prompts!r}")
    size = size or _size
    rows = sum(len(_regressions(g.report)) for g in grids) if prompts != "none" else 0
    doc = _document(grids, provenance, prompts, rows, what)
    if size(doc) < limit:
        return doc
    low, high = 0, rows  # the most rows that fit: binary search (the rest of the page does not depend on it)
    while low < high:
        mid = (low + high + 1) // 2
        if size(_document(grids, provenance, prompts, mid, what)) < limit:
            low = mid
        else:
            high = mid - 1
    doc = _document(grids, provenance, prompts, low, what)
    return doc if size(doc) < limit else _cut(doc, limit, size, what)


def _document(grids: Sequence[GridSummary], provenance: Mapping[str, Any], prompts: str, keep: int,
              what: str = STEP_WORDS) -> str:
    total = sum(len(_regressions(g.report)) for g in grids) if prompts != "none" else 0
    parts = [marker(grids) + "\n" + _banner(grids)]
    if total > keep:
        parts.append(f"> **{total - keep} of {total} regressions left out** to keep this summary under {what}; "
                     "the JSON report (`--redline-report`) and the review page (`--redline-html`) list them all.")
    for g in grids:
        shown = min(keep, len(_regressions(g.report))) if prompts != "none" else 0
        keep -= shown
        parts.append(_grid(g, prompts, shown))
    parts.append(_session(provenance))
    return "\n\n".join(parts) + "\n"


def _banner(grids: Sequence[GridSummary]) -> str:
    reports = [g.report for g in grids]
    required = [r for r in reports if not r.get("advisory")]  # an advisory grid fails nothing
    if not all(r["complete"] for r in required):
        word, mark = "PARTIAL", "⚠️"
    elif all(r["certified"] for r in required):
        word, mark = "CERTIFIED", "✅"
    else:
        word, mark = "NOT CERTIFIED", "❌"
    advisory = [r["grid"] for r in reports if r.get("advisory") and not r["certified"]]
    aside = f" (advisory, not certified: {', '.join(advisory)})" if advisory else ""
    return f"## {mark} REDLINE {word}: {_inline(', '.join(r['grid'] for r in reports) + aside)}"


def _grid(g: GridSummary, prompts: str, shown: int) -> str:
    r = g.report
    source = "the grid file" if r.get("alpha_source") == "grid file" else r.get("alpha_source")
    parts = [f"### {_inline(r['grid'])} (`{_code(r['grid_file'])}`) · α = {r['alpha']:g} from {_inline(source)}"
             + (" · advisory (required: false): fails nothing" if r.get("advisory") else ""), f"**{_inline(g.verdict)}**"]
    if g.header:
        parts.append(_inline(g.header))
    if r["configs"] and "violations" in r["configs"][0]:  # certified (not a partial run, not an error)
        parts.append(_table(r))
        parts.append(_legend(r))
        settle = [f"- {_inline(name)} ({STATUS_MARKS['inconclusive']} inconclusive): {_inline(line)}"
                  for name, line in g.settle.items()]
        if settle:
            parts.append("\n".join(settle))
        settled = _settled(r)
        if settled:
            parts.append(settled)
    if g.notes:
        parts.append("\n".join(f"- {_inline(note)}" for note in g.notes))
    parts.append(_regression_blocks(g, prompts, shown))
    parts += [_slices(r, sl) for sl in r.get("slices") or ()]
    parts.append(_grid_provenance(g))
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- the table


HEAD = ("", "config", "V", "n", "risk bound", "p", "adjusted p", "status", "gain", "d_acc")
ALIGN = ("---", "---", "--:", "--:", "--:", "--:", "--:", "---", "--:", "--:")


def _table(r: Mapping[str, Any]) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "|".join(ALIGN) + "|"]
    gated = r["deploy"] if r["deploy_mode"] == "gate" else None
    for c in r["configs"]:
        name = c["name"]
        mark = ("R" if name == r["reference"] else "") + ("\\*" if name == r["deployed"] else "") + ("G" if name == gated else "")
        bound = {"lower": "≥ ", "upper": "≤ "}.get(c.get("violations_bound"), "")
        ran = c.get("prompts_run", r["n"])
        upper = c.get("risk_upper")
        status = c.get("status")
        cells = (
            mark, _cell(name), f"{bound}{c['violations']}", f"{r['n']}" + (f" (ran {ran})" if ran != r["n"] else ""),
            "–" if upper is None else f"{upper:.4f} {'≤' if upper <= r['alpha'] else '>'} {r['alpha']:g}",
            _number_text(c.get("p_value")), _number_text(c.get("p_adjusted")),
            "–" if status is None else f"{STATUS_MARKS.get(status, '')} {status}".strip(),
            _gain_cell(c, "factor" if r["direction"] == "lower" else "percent"),
            "–" if c.get("net_accuracy_points") is None else f"{c['net_accuracy_points']:+.1f}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _slices(r: Mapping[str, Any], slicing: Mapping[str, Any]) -> str:
    """One slicing's table: each config's V, correct and accuracy per slice, exact counts."""
    bounded = {c["name"] for c in r["configs"] if c.get("violations_bound") in ("lower", "upper")}
    lines = [f"<details><summary>By {_inline(slicing['by'])}: {len(slicing['slices'])} slices "
             f"({_inline(', '.join(slicing['slices']))}), descriptive counts, not certificates</summary>", "",
             "| config | slice | V | correct / decoded | prompts | accuracy |", "|---|---|--:|--:|--:|--:|"]
    for row in slicing["rows"]:
        mark = " (decoded only: stopped early)" if row["config"] in bounded else ""
        accuracy = "–" if row["decoded"] != row["prompts"] or row["accuracy"] is None else f"{row['accuracy']:.4f}"
        lines.append(f"| {_cell(row['config'])} | {_cell(row['slice'])} | {row['violations']}{mark} | "
                     f"{row['correct']} / {row['decoded']} | {row['prompts']} | {accuracy} |")
    lines += ["", f"V: regressions among the slice's decoded prompts; {_inline(slicing['note'])}. A certificate per "
                  "slice is one grid per slice.", "</details>"]
    return "\n".join(lines)


def _gain_cell(c: Mapping[str, Any], kind: str) -> str:
    """The all-prompt gain; a settled contender's gain interval, labelled; "–" when not comparable."""
    if c.get("gain") is not None:
        return text.gain(c["gain"], kind)
    if c.get("gain_interval"):
        return f"{_span(c['gain_interval'], lambda x: text.gain(x, kind))} (interval)"
    return "–"


def _span(span: Sequence[float | None], fmt) -> str:
    """``[low, high]``; an unbounded end (None in the JSON report) reads as −∞ / ∞."""
    return f"[{'−∞' if span[0] is None else fmt(span[0])}, {'∞' if span[1] is None else fmt(span[1])}]"


def _settled(r: Mapping[str, Any]) -> str:
    """One line per valid config that the contenders' cost intervals settled without decoding it
    on every prompt: its all-prompt cost and gain intervals, why, and its accuracy on what it ran."""
    kind = "factor" if r["direction"] == "lower" else "percent"
    lines = []
    for c in r["configs"]:
        if not c.get("cost_decided") or c.get("cost") is not None:  # a cost fixed by its bounds is in the table
            continue
        accuracy = c.get("accuracy_on_prompts_run")
        ran = "" if accuracy is None else f"; accuracy {accuracy:.4f} on the {c['prompts_run']} prompts it ran"
        lines.append(f"- {_inline(c['name'])}: all-prompt {_inline(r['cost'])} in {_span(c['cost_interval'], lambda x: f'{x:.4g}')}, "
                     f"gain in {_span(c['gain_interval'], lambda x: text.gain(x, kind))} ({_inline(c['cost_decided'])}){ran}")
    return "\n".join(lines)


def _legend(r: Mapping[str, Any]) -> str:
    statuses = r.get("statuses") or {}
    level = statuses.get("family_level", r.get("delta_share"))
    line = (f"R reference, \\* deployed{', G gated (deploy: NAME)' if r['deploy_mode'] == 'gate' else ''}. "
            f"V: prompts the reference answers right and the config wrong, of n; risk bound: the risk's upper "
            f"confidence bound (Clopper-Pearson at 1 − δ) against α; p = P[Bin(n, α) ≤ V], adjusted p: "
            f"{_inline(r['correction'])}; gain and d_acc (accuracy points) against the reference, on all prompts "
            f"(– where a config was not decoded on every prompt; an interval where the contenders' cost "
            f"intervals settled a valid config without decoding it everywhere: its all-prompt gain lies in it). Status: certified (risk ≤ α shown), exceeds "
            f"budget (risk > α shown by the reverse test P[Bin(n, α) ≥ V]) or inconclusive (neither)")
    if level is not None:
        line += f"; each family errs with probability ≤ {level:g}, any status is wrong with probability ≤ {2 * level:g}"
    if any(c.get("violations_bound") in ("lower", "upper") for c in r["configs"]):
        line += "; ≥ / ≤ V: the bound on V at which the schedule stopped the config early"
    return line + "."


# --------------------------------------------------------------------------- regressions


def _regressions(r: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The grid's regressions in display order: the deployed (or gated) config's first, then
    the others in grid order."""
    regressions = r.get("regressions") or []
    first = r["deploy"] if r["deploy_mode"] == "gate" else r.get("deployed")
    return [x for x in regressions if x["config"] == first] + [x for x in regressions if x["config"] != first]


def _regression_blocks(g: GridSummary, prompts: str, shown: int) -> str:
    regressions = _regressions(g.report)
    if not regressions:
        return "Regressions: none (no config broke a prompt that the reference answers right)."
    kept = regressions[:shown] if prompts != "none" else []
    configs = list(dict.fromkeys(x["config"] for x in regressions))
    blocks = [f"Regressions: {len(regressions)} (prompts the reference answers right and the config wrong)"
              + _privacy_note(prompts)]
    for config in configs:
        mine = [x for x in regressions if x["config"] == config]
        rows = [x for x in kept if x["config"] == config]
        role = (" (deployed)" if config == g.report.get("deployed") else
                " (gated)" if g.report["deploy_mode"] == "gate" and config == g.report["deploy"] else "")
        count = f"{len(mine)} regression{'s' * (len(mine) != 1)}"
        if prompts != "none" and len(rows) < len(mine):
            count += f", {len(mine) - len(rows)} left out (size limit)"
        body = _rules(mine) if prompts == "none" else _rows(rows, g, prompts)
        blocks.append(f"<details><summary>{_html(config)}{role}: {count}</summary>\n\n{body}\n\n</details>")
    return "\n\n".join(blocks)


def _privacy_note(prompts: str) -> str:
    return {
        "none": "; prompts not shown (`--redline-markdown-prompts=none`).",
        "ids": ("; prompt ids and rules only: prompts and answers are not shown (`--redline-markdown-prompts=ids`; "
                "`full` shows them)."),
        "full": "; prompts and answers shown, clipped (`--redline-markdown-prompts=full`).",
    }[prompts]


def _rules(regressions: Sequence[Mapping[str, Any]]) -> str:
    rules = Counter(x.get("candidate_rule") or "not recorded" for x in regressions)
    return "Deciding rules (candidate): " + ", ".join(f"{_cell(rule)} {k}" for rule, k in rules.most_common()) + "."


def _rows(rows: Sequence[Mapping[str, Any]], g: GridSummary, prompts: str) -> str:
    if not rows:
        return "Left out: the summary reached its size limit (the count above says how many)."
    if prompts == "ids":
        lines = ["| prompt | deciding rule |", "|---|---|"]
        lines += [f"| {_cell(x['prompt'])} | {_rule(x)} |" for x in rows]
        return "\n".join(lines)
    reference = g.report["reference"]
    lines = [f"| prompt | text | reference answer ({_cell(reference)}) | candidate answer | deciding rule |",
             "|---|---|---|---|---|"]
    for x in rows:
        prompt = g.prompts.get(x["prompt"], "")
        lines.append(f"| {_cell(x['prompt'])} | {_cell(_clip(prompt)) if prompt != x['prompt'] else ''} | "
                     f"{_answer(x.get('reference_extracted'), x.get('reference_answer'))} | "
                     f"{_answer(x.get('candidate_extracted'), x.get('candidate_answer'))} | {_rule(x)} |")
    return "\n".join(lines)


def _rule(x: Mapping[str, Any]) -> str:
    reference, candidate = x.get("reference_rule") or "", x.get("candidate_rule") or ""
    if not (reference or candidate):
        return "not recorded"
    return f"reference: {_cell(reference or '?')}; candidate: {_cell(candidate or '?')}"


def _answer(extracted: Any, output: Any) -> str:
    """An extracted answer in bold over the clipped output; "not recorded" for a replayed grid."""
    if not output and extracted in (None, ""):
        return "not recorded"
    head = "**no answer**" if extracted in (None, "") else f"**{_cell(str(extracted))}**"
    return head + (f"<br>{_cell(_clip(output))}" if output else "")


def _clip(value: str) -> str:
    if len(value) <= TEXT_CHARS:
        return value
    return value[:TEXT_CHARS] + f" … ({len(value) - TEXT_CHARS} more characters)"


# --------------------------------------------------------------------------- provenance


def _grid_provenance(g: GridSummary) -> str:
    r = g.report
    items = [f"grid file `{_code(r['grid_file'])}`, sha256 `{g.grid_sha256 or 'unreadable'}`"]
    if r.get("suite"):
        suite = r["suite"]
        items.append(f"suite {_inline(suite['name'])}, scoring version `{_code(suite.get('version') or 'not reported')}`")
    outcomes = r.get("outcomes") or {}
    line = g.outcomes or f"outcomes: {outcomes.get('reused', 0)} reused from the store, {outcomes.get('decoded', 0)} decoded"
    items.append(f"{_inline(line)}; schedule: {_inline((r.get('schedule') or {}).get('mode', 'full'))}")
    body = "\n".join(f"- {item}" for item in items)
    return f"<details><summary>Provenance of {_html(r['grid'])}</summary>\n\n{body}\n\n</details>"


def _session(provenance: Mapping[str, Any]) -> str:
    versions = provenance.get("versions") or {}
    items = []
    if versions:
        items.append("versions: " + ", ".join(f"{_inline(k)} {_inline(v)}" for k, v in versions.items()))
    if provenance.get("python"):
        items.append(f"python {_inline(provenance['python'])}")
    if provenance.get("command"):
        items.append(f"command: `{_code(provenance['command'])}`")
    body = "\n".join(f"- {item}" for item in items)
    return f"<details><summary>Provenance of this run</summary>\n\n{body}\n\n</details>" if items else ""


# --------------------------------------------------------------------------- escaping and size


_PUNCT = re.compile(r"([\\`*_\[\]|~#!<>&])")


def _cell(value: Any) -> str:
    """Untrusted text (a prompt, a model's output) in a table cell: Markdown and HTML inert,
    on one line (newlines as <br>)."""
    escaped = _PUNCT.sub(lambda m: html.escape(m.group(1)) if m.group(1) in "<>&" else "\\" + m.group(1), str(value))
    return escaped.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "<br>")


def _inline(value: Any) -> str:
    """Our own text (names, verdict lines) in a paragraph: as written, but inert."""
    return _cell(value).replace("<br>", " ")


def _html(value: Any) -> str:
    """Text inside a raw HTML tag (a <summary>), where Markdown is not read."""
    return html.escape(str(value), quote=False)


def _code(value: Any) -> str:
    return str(value).replace("`", "'").replace("\n", " ")


def _number_text(value: Any) -> str:
    return "–" if value is None else text.number(float(value))


def _size(doc: str) -> int:
    return len(doc.encode("utf-8"))


def _cut(doc: str, limit: int, size=None, what: str = STEP_WORDS) -> str:
    """A last resort when even the summary without regressions is over the limit (thousands of
    configs): cut at a line, and say so."""
    size = size or _size
    note = f"\n\n> **Summary cut here:** it reached {what}; the JSON report has everything.\n"
    head = doc
    while head and size(head) + size(note) >= limit:
        head = head[: max(len(head) - max(size(head) + size(note) - limit + 1, 1), 0)]
    return head[: head.rfind("\n") + 1] + note


# --------------------------------------------------------------------------- from the gate


def grids(verdicts: Sequence[GridVerdict]) -> list[GridSummary]:
    """The summary's data for the session's verdicts (the JSON report objects, the terminal's lines)."""
    from pytest_redline.report import sentences
    from pytest_redline.report.document import grid_report
    from pytest_redline.report.files import file_sha256

    out = []
    for v in verdicts:
        notes: list[str] = []
        if not v.complete:
            notes += sentences.missing_lines(v)
        elif v.error:
            notes.append(v.error)
        hint = sentences.hint_line(v)
        notes += ([hint] if hint else []) + sentences.trade_lines(v) + sentences.length_warnings(v)
        settle = {}
        if v.result is not None and v.statuses is not None:
            for i, name in enumerate(v.cal.configs):
                found = v.to_settle(name)
                if found is not None:
                    settle[name] = found.text() + (f" ({BIASED})" if v.estimate_biased(i) else "")
        texts = {p.id: p.text or "\n".join(f"{m.get('role')}: {m.get('content')}" for m in p.messages) for p in v.cal.prompts}
        out.append(GridSummary(grid_report(v), sentences.verdict_line(v), sentences.header(v), tuple(notes), settle,
                               texts, file_sha256(v.cal.grid.path), sentences.outcomes_line(v)))
    return out


def comment_path(path: str | os.PathLike) -> Path:
    """Where the comment goes beside the summary: ``redline.md`` -> ``redline.comment.md``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.comment{path.suffix or '.md'}")


def write(path: str | os.PathLike, verdicts: Sequence[GridVerdict], provenance: Mapping[str, Any], prompts: str = "ids",
          environ: Mapping[str, str] = os.environ) -> list[str]:
    """Write the summary to ``path`` and append it to ``$GITHUB_STEP_SUMMARY`` when that is set;
    returns the terminal's lines saying where it went. GitHub's limit holds for the step's whole
    file, so what an earlier writer in the same step left there is taken off the limit."""
    from pytest_redline.report.files import atomic_write

    step = environ.get("GITHUB_STEP_SUMMARY")
    taken = os.path.getsize(step) + 1 if step and os.path.isfile(step) else 0
    data = grids(verdicts)
    doc = render(data, provenance, prompts, limit=max(LIMIT - taken, MIN_LIMIT))
    atomic_write(Path(path), doc)
    comment = render_comment(data, provenance, prompts)
    atomic_write(comment_path(path), comment)
    notes = [f"Markdown summary: {path} ({_size(doc):,} bytes, prompts: {prompts})",
             f"Markdown summary as a pull-request comment: {comment_path(path)} ({len(comment):,} characters, "
             f"marker {marker(data)})"]
    if step:
        try:
            with open(step, "a", encoding="utf-8") as f:
                f.write(("\n" if f.tell() else "") + doc)
            notes.append(f"Markdown summary appended to $GITHUB_STEP_SUMMARY ({step})")
        except OSError as e:
            notes.append(f"Markdown summary NOT appended to $GITHUB_STEP_SUMMARY ({step}): {e.strerror or e}")
    return notes
