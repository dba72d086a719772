"""The terminal summary of a gate run: pytest's header lines, and per grid its table, schedule,
regressions and verdict (the shared sentences: :mod:`pytest_redline.report.sentences`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from pytest_redline.report import text
from pytest_redline.report.document import interval_gain
from pytest_redline.report.sentences import (header, hint_line, length_stop_lines, missing_lines, outcomes_line, trade_lines,
                                             verdict_line)
from pytest_redline.spend import Spend
from pytest_redline.verdict import PROMPTS_LIMIT, GridVerdict

if TYPE_CHECKING:  # the statistics load scipy: imported when a grid is certified (verdict.decide)
    from pytest_redline.risk import RedlineResult

ANSWER_CHARS = 300


def session_header(labels: Sequence[str], only_grids: bool) -> list[str]:
    """pytest's header lines of a gate run: what is collected, and what the progress marks mean."""
    what = " (only the grids are collected, not testpaths)" if only_grids else ""
    return [part for line in _header(labels, what) for part in text.wrapped(line)]


def _header(labels: Sequence[str], what: str) -> list[str]:
    return [f"redline: gating {', '.join(labels)}{what}",
            "redline marks: . no regression (or the reference's own item); R regressed: the reference answers "
            "correctly and this config does not; s skipped by the schedule (the reference is wrong there, or the "
            "config stopped early); E/F no outcome (nothing is certified)"]



def table_lines(v: GridVerdict) -> list[str]:
    """The per-config table: R marks the reference, * the deployed config, G the config a
    gate names. Only figures comparable across rows are shown: accuracy, cost, gain and
    d_acc on all n prompts ("-" for a config a scheduled run did not decode on every
    prompt), acc_rc on the reference-correct prompts for every row."""
    r, sched = v.result, v.scheduled
    gated = v.cal.deploy if v.cal.mode == "gate" else None
    kept = v.on_reference_correct()
    rows = [("", "config", "run", "accuracy", "acc_rc", "V", "risk", "risk_up", "p_value", "p_adj", "valid", "status", "cost", "gain",
             "d_acc")]
    notes = []
    for i, name in enumerate(r.names):
        mark = ("R" if i == r.reference_index else " ") + ("*" if i == v.deployed_index else " ") + (("G" if name == gated else " ") if gated else "")
        bound = {"lower": ">=", "upper": "<="}.get(sched.bounds[i], "") if sched else ""
        run = int(sched.ran[i].sum()) if sched else v.cal.n
        full, cost, gain = v.comparable(i), *_cost_cells(v, i)
        rows.append((
            mark, name, str(run), f"{r.accuracy[i]:.4f}" if full else "-", f"{kept[i]:.4f}", f"{bound}{int(r.violations[i])}",
            f"{r.risk[i]:.4f}", f"{r.risk_upper[i]:.4f}", text.number(r.p_values[i]), text.number(r.p_adjusted[i]),
            "valid" if r.valid[i] else "NOT valid", v.statuses[i], cost, gain,
            f"{r.net_accuracy[i]:+.1f}" if full else "-",
        ))
        note = _note(v, i)
        if note:
            notes.append(f"  {name}: {note}")
    blocks = text.fitted_table(rows, keys=2, groups=(range(2, 10), range(10, 15)), left=(1, 14))
    lines = [line for block in blocks for line in block]
    if notes:
        lines += ["notes:"] + notes
    lines.append("R reference, * deployed" + (", G gated (deploy: NAME)" if gated else "") + "; run: prompts decoded; "
                 "accuracy, cost, gain, d_acc (accuracy points vs the reference): on all prompts; acc_rc: accuracy on the "
                 "reference-correct prompts" + (" it ran on" if sched else "") + "; risk: V / n (V as in the V column); "
                 "risk_up: Clopper-Pearson upper bound at 1 - delta")
    if sched:
        lines.append(_basis_line(v))
    lines.append(_status_line(v))
    return lines



def _status_line(v: GridVerdict) -> str:
    """What the statuses claim, at which level; and a scheduled run's lower bounds."""
    level = v.cal.delta_share
    line = (f"status: certified (risk <= alpha shown) / exceeds budget (risk > alpha shown: P[Bin(n, alpha) >= V], "
            f"{v.cal.correction} over the {v.cal.m - 1} candidates) / inconclusive; each family errs with "
            f"probability <= {level:g}, any status is wrong with probability <= {2 * level:g}")
    if v.status_bounded:
        line += ("; a config stopped early is tested on the V it reached (a lower bound), so this scheduled run may say "
                 "inconclusive where --redline-full says exceeds budget")
    return line



def _basis_line(v: GridVerdict) -> str:
    line = (">= / <=: the bound on V that decided an early stop (risk, risk_up and p-values follow it); in a note, "
            "'risk on all prompts' is a replay's V on every prompt / n, 'the rate the stop used' is V / prompts run, "
            "scaled to all n")
    if all(v.comparable(i) for i in range(v.cal.m)):
        return line + "; every config's figures on all prompts"
    line += "; -: not decoded on every prompt (stopped early or skipped where the reference is wrong), so not comparable"
    if not v.decided:
        return line + "; the valid configs were decoded on every prompt, so the deployment uses costs on all of them"
    return (line + "; [low, high]: a valid config's all-prompt cost (and gain) interval from the prompts it ran and its "
            "engine's declared cost bounds on the rest, which settled the deployment without decoding it everywhere")



def _note(v: GridVerdict, i: int) -> str:
    r, sched = v.result, v.scheduled
    stop = sched.stops[i] if sched else None
    notes = [f"stopped early: {stop}"] if stop else []
    if v.estimate_biased(i):
        notes.append("acc_rc and its risk estimate are biased: the adaptive order ran it first where others regressed")
    if not r.valid[i] and i != r.reference_index:
        needed = v.prompts_needed(r.names[i])
        risk = _estimate(v, i)
        if v.needs_over_limit(r.names[i]):
            notes.append(f"over {PROMPTS_LIMIT} prompts would be needed to certify it at {risk}")
        elif needed is None:
            notes.append(f"no n would certify it: {risk} >= alpha")
        else:
            notes.append(f"n={needed} prompts would certify it with 80% power at {risk}")
    settle = v.to_settle(r.names[i])
    if settle is not None and settle.test != "certify":  # the certify direction is said above
        notes.append(settle.text())
    return "; ".join(notes)



def _estimate(v: GridVerdict, i: int) -> str:
    """The risk a note reasons from, named where it is not the row's risk column (V / n with the
    V an early stop reached): a replay knows V on all prompts; a live stop used the rate on the
    prompts it ran, scaled to all n (the legend says so)."""
    risk, sched = v.risk_estimate(i), v.scheduled
    if sched is None or sched.bounds[i] == "exact" or risk == v.result.risk[i]:
        return f"risk {risk:.4f}"
    if sched.seen is not None and abs(risk * v.cal.n - sched.seen[i]) < 1e-6:  # replayed: V on all prompts
        return f"risk on all prompts {risk:.4f}"
    return f"the rate the stop used {risk:.4f}" + (" (biased)" if v.estimate_biased(i) else "")



def slice_lines(v: GridVerdict) -> list[str]:
    """Each config's V, accuracy and decoded prompts per slice (:mod:`pytest_redline.slices`):
    descriptive exact counts, one table per slicing."""
    from pytest_redline.slices import slicings

    lines = []
    for slicing in slicings(v):
        rows = [("config", "slice", "prompts", "decoded", "V", "correct", "accuracy")]
        for row in slicing.rows:
            i = v.cal.configs.index(row.config)
            stopped = bool(v.scheduled and v.scheduled.stops[i])
            rows.append((row.config, row.slice, str(row.prompts), str(row.decoded),
                         f"{row.violations}{' (decoded)' if stopped else ''}", str(row.correct),
                         f"{row.accuracy:.4f}" if row.complete else "-"))
        lines.append(f"slices by {slicing.by} ({len(slicing.names)}: {', '.join(slicing.names)}): descriptive exact "
                     "counts, not certificates (the certificate is the grid's; one grid per slice certifies a slice)")
        blocks = text.fitted_table(rows, keys=2, groups=(range(2, 7),), left=(0, 1))
        lines += [f"  {line}" for block in blocks for line in block]
        lines.append("  V: regressions (the reference right, the config wrong) among the slice's decoded prompts; "
                     "correct of the decoded; accuracy: correct / prompts, '-' where not decoded on every prompt of "
                     "the slice" + ("; (decoded): a config stopped early, whose grid V is a bound that does not "
                                    "split: its slices count only what was decoded" if v.scheduled else ""))
    return lines


def schedule_lines(v: GridVerdict) -> list[str]:
    """How the grid was run, and what it spent against the full grid."""
    cal, record = v.cal, v.record
    if v.how_run == "scheduled":
        from pytest_redline.schedule import CANNOT, CERTAIN, REFERENCE_WRONG

        stops = {reason: sum(s == reason for s in record.stops()) for reason in (CANNOT, CERTAIN)}
        early = len(record.skips) - record.skipped(REFERENCE_WRONG)
        lines = [
            f"schedule: reference first, candidates in a seeded order (seed {cal.seed}), batches where earlier "
            f"candidates regressed first; skipped "
            f"{record.skipped(REFERENCE_WRONG)} items where the reference is wrong and {early} after early stops "
            f"({stops[CANNOT]} {CANNOT}, {stops[CERTAIN]} {CERTAIN})"
        ]
    else:
        lines = [f"schedule: {v.how_run}"]
    if v.spend is not None:
        lines.append(_spend_line(v.spend, "replayed now" if cal.replayed else "decoded now"))
        if v.spend.config_seconds:
            lines.append(_decode_line(v))
    if v.cal.cost_estimated:
        lines.append(f"note: the cost {v.cal.grid.cost} is a measured wall time, so the cost ranking (and the deployed "
                     "config) is an estimate; the certificate, which concerns correctness only, is exact")
    return lines



def _decode_line(v: GridVerdict) -> str:
    """Decoding time per config. pytest's durations and timeouts charge it to the items that
    trigger decoding (docs/explanation/session.md): the reference's first item, then the first candidate
    item, which runs every candidate's schedule (a full run: each config's first item)."""
    seconds = v.spend.config_seconds
    shown = ", ".join(f"{name} {seconds[name]:.1f} s" for name in v.cal.configs if name in seconds)
    return f"decoding per config: {shown} (pytest's durations charge it to the items that trigger it: docs/explanation/session.md)"



def _spend_line(spend: Spend, now: str = "decoded now") -> str:
    if spend.forwards is None or spend.naive_forwards is None:
        text = f"spend: {spend.items_run} of {spend.items} items run (forwards unknown)"
    else:
        basis = "exact, from the forwards column" if spend.exact else "the rest estimated at each config's mean"
        text = (f"spend: {spend.forwards:,.0f} forwards on {spend.items_run} of {spend.items} items vs "
                f"{spend.naive_forwards:,.0f} for the full grid: {spend.ratio:.2f}x ({basis})")
    text += f"; {now}: {0 if spend.decoded_forwards is None else spend.decoded_forwards:,.0f} forwards in {spend.decode_seconds:.1f} s"
    if spend.naive_seconds is not None:
        text += f" (full grid ~{spend.naive_seconds:.1f} s)"
    if spend.decoded_past_stops:
        text += (f"; {spend.decoded_past_stops} more prompts decoded past early stops ("
                 + ", ".join(f"{c} {k}" for c, k in spend.past_stop.items() if k)
                 + "): sent ahead before the stop was decided, stored for reruns, not counted as items")
    return text



def regression_lines(v: GridVerdict, verbosity: int) -> list[str]:
    regressions = v.record.regressions()
    if not regressions:
        return ["regressions: none"]
    per_config: dict[str, int] = {}
    for reg in regressions:
        per_config[reg["config"]] = per_config.get(reg["config"], 0) + 1
    lines = [f"regressions: {len(regressions)} ({', '.join(f'{c}: {k}' for c, k in per_config.items())})"]
    if verbosity >= 1:
        limit = None if verbosity >= 2 else ANSWER_CHARS
        for reg in regressions:
            lines.append(f"  REGRESSED {reg['config']}::{reg['prompt']}{_scored(reg)}")
            lines.append(f"    reference answer: {_clip(reg['reference_answer'], limit)}")
            lines.append(f"    candidate answer: {_clip(reg['candidate_answer'], limit)}")
    return lines



def _scored(reg: dict) -> str:
    """What the scorer read in both texts: `` (reference 18 by marker, candidate none: revised)``."""
    if {reg.get("reference_rule"), reg.get("candidate_rule")} <= {None, "", "score"}:
        return ""  # a suite without judge() (rule "score"), or outcomes stored before rules were recorded
    reference, candidate = reg.get("reference_extracted"), reg.get("candidate_extracted")
    return (f" (reference {reference if reference is not None else 'none'} by {reg.get('reference_rule') or '?'}, "
            f"candidate {candidate if candidate is not None else 'none'}: {reg.get('candidate_rule') or '?'})")



def _cost_cells(v: GridVerdict, i: int) -> tuple[str, str]:
    """The cost and gain cells: all-prompt figures, an interval (settled by the cost intervals
    without decoding it everywhere), or "-" (not comparable)."""
    r = v.result
    if v.cost_known(i):
        return f"{r.cost[i]:.4g}", _gain(r, i)
    interval = v.cost_interval(i)
    if interval is None:
        return "-", "-"
    low, high = interval
    gains = interval_gain(v, interval)
    unit = "%" if r.gain_kind == "percent" else "x"
    return f"[{low:.4g}, {high:.4g}]", f"[{gains[0]:+.1f}, {gains[1]:+.1f}]{unit}" if unit == "%" else f"[{gains[0]:.2f}, {gains[1]:.2f}]x"



def grid_lines(v: GridVerdict, verbosity: int) -> list[str]:
    """A grid's terminal summary, every line within :data:`text.WIDTH` columns."""
    return [part for line in _grid_lines(v, verbosity) for part in text.wrapped(line, indent=_indent(line))]


def _indent(line: str) -> str:
    return " " * (len(line) - len(line.lstrip(" ")) + 4)


def _grid_lines(v: GridVerdict, verbosity: int) -> list[str]:
    lines = [header(v)]
    if not v.complete:
        lines += missing_lines(v)
    elif v.error:
        lines.append(v.error)
    else:
        lines += table_lines(v)
        lines += slice_lines(v)
    lines.append(outcomes_line(v))
    lines += length_stop_lines(v)
    lines += schedule_lines(v)
    lines += regression_lines(v, verbosity)
    hint = hint_line(v)
    if hint:
        lines.append(hint)
    lines += trade_lines(v)
    lines.append(verdict_line(v))
    return lines



def _gain(r: RedlineResult, i: int) -> str:
    return text.gain(r.gain[i], r.gain_kind)



def _clip(text: str, limit: int | None) -> str:
    text = text.replace("\n", "\\n")
    if limit is None or len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f" ... ({len(text) - limit} more characters)"
