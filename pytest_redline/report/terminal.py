"""What the gate tells people: the terminal summary, the JSON report and the outcome CSV."""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from pytest_redline import text
from pytest_redline.ledger import REASONS
from pytest_redline.spend import Spend
from pytest_redline.verdict import PROMPTS_LIMIT, GridVerdict

if TYPE_CHECKING:  # the statistics load scipy: imported when a grid is certified (verdict.judge)
    from pytest_redline.risk import RedlineResult

EXAMPLES = 3
ANSWER_CHARS = 300


# --------------------------------------------------------------------------- terminal


def session_header(labels: Sequence[str], only_grids: bool) -> list[str]:
    """pytest's header lines of a gate run: what is collected, and what the progress marks mean."""
    what = " (only the grids are collected, not testpaths)" if only_grids else ""
    return [f"redline: gating {', '.join(labels)}{what}",
            "redline marks: . no regression (or the reference's own item); R regressed: the reference answers "
            "correctly and this config does not; s skipped by the schedule (the reference is wrong there, or the "
            "config stopped early); E/F no outcome (nothing is certified)"]


def header(v: GridVerdict) -> str:
    cal = v.cal
    delta = f"delta={cal.delta:g}"
    if cal.grids_in_session > 1:
        delta += f" (share {cal.delta_share:.4g}: split over {cal.grids_in_session} grids, Bonferroni)"
    deploy = {"select": f"select the best-cost valid config: {best_cost(cal.grid.cost, cal.grid.direction)}",
              "all": "every candidate must be valid"}.get(cal.mode, f"gate: {cal.deploy} must be valid")
    return (
        f"alpha={cal.alpha:g} {delta} {cal.correction}, n={cal.n} prompts, m={cal.m} configs, "
        f"cost {cal.grid.cost} ({cal.grid.direction} is better); mode {cal.mode} ({deploy})"
    )


def best_cost(cost: str, direction: str) -> str:
    """What "best cost" means on this grid's cost (a memory grid is not made "fastest")."""
    return f"{'highest' if direction == 'higher' else 'lowest'} {cost}"


def table_lines(v: GridVerdict) -> list[str]:
    """The per-config table: R marks the reference, * the deployed config, G the config a
    gate names. Only figures comparable across rows are shown: accuracy, cost, gain and
    d_acc on all n prompts ("-" for a config a scheduled run did not decode on every
    prompt), acc_rc on the reference-correct prompts for every row."""
    r, sched = v.result, v.scheduled
    gated = v.cal.deploy if v.cal.mode == "gate" else None
    kept = v.on_reference_correct()
    rows = [("", "config", "run", "accuracy", "acc_rc", "V", "risk", "risk_up", "p_value", "p_adj", "valid", "status", "cost", "gain",
             "d_acc", "note")]
    for i, name in enumerate(r.names):
        mark = ("R" if i == r.reference_index else " ") + ("*" if i == v.deployed_index else " ") + (("G" if name == gated else " ") if gated else "")
        bound = {"lower": ">=", "upper": "<="}.get(sched.bounds[i], "") if sched else ""
        run = int(sched.ran[i].sum()) if sched else v.cal.n
        full, cost, gain = v.comparable(i), *_cost_cells(v, i)
        rows.append((
            mark, name, str(run), f"{r.accuracy[i]:.4f}" if full else "-", f"{kept[i]:.4f}", f"{bound}{int(r.violations[i])}",
            f"{r.risk[i]:.4f}", f"{r.risk_upper[i]:.4f}", text.number(r.p_values[i]), text.number(r.p_adjusted[i]),
            "valid" if r.valid[i] else "NOT valid", v.statuses[i], cost, gain,
            f"{r.net_accuracy[i]:+.1f}" if full else "-", _note(v, i),
        ))
    lines = text.table(rows, left=(1, 14))
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


def schedule_lines(v: GridVerdict) -> list[str]:
    """How the grid was run, and what it spent against the full grid."""
    cal, record = v.cal, v.record
    if v.mode == "scheduled":
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
        lines = [f"schedule: {v.mode}"]
    if v.spend is not None:
        lines.append(_spend_line(v.spend))
        if v.spend.config_seconds:
            lines.append(_decode_line(v))
    if v.cal.cost_estimated:
        lines.append(f"note: the cost {v.cal.grid.cost} is a measured wall time, so the cost ranking (and the deployed "
                     "config) is an estimate; the certificate, which concerns correctness only, is exact")
    return lines


def _decode_line(v: GridVerdict) -> str:
    """Decoding time per config. pytest's durations and timeouts charge it to the items that
    trigger decoding (docs/gate.md): the reference's first item, then the first candidate
    item, which runs every candidate's schedule (a full run: each config's first item)."""
    seconds = v.spend.config_seconds
    shown = ", ".join(f"{name} {seconds[name]:.1f} s" for name in v.cal.configs if name in seconds)
    return f"decoding per config: {shown} (pytest's durations charge it to the items that trigger it: docs/gate.md)"


def _spend_line(spend: Spend) -> str:
    if spend.forwards is None or spend.naive_forwards is None:
        text = f"spend: {spend.items_run} of {spend.items} items run (forwards unknown)"
    else:
        basis = "exact, from the forwards column" if spend.exact else "the rest estimated at each config's mean"
        text = (f"spend: {spend.forwards:,.0f} forwards on {spend.items_run} of {spend.items} items vs "
                f"{spend.naive_forwards:,.0f} for the full grid: {spend.ratio:.2f}x ({basis})")
    text += f"; decoded now: {0 if spend.decoded_forwards is None else spend.decoded_forwards:,.0f} forwards in {spend.decode_seconds:.1f} s"
    if spend.naive_seconds is not None:
        text += f" (full grid ~{spend.naive_seconds:.1f} s)"
    return text


def missing_lines(v: GridVerdict) -> list[str]:
    total = v.cal.m * v.cal.n
    lines = [f"PARTIAL RUN: {len(v.missing)} of {total} items produced no outcome, so nothing is certified"]
    for reason in REASONS:
        items = [m for m in v.missing if m.reason == reason]
        if items:
            shown = ", ".join(f"{m.config}::{m.prompt}" for m in items[:EXAMPLES])
            more = f", ... ({len(items) - EXAMPLES} more)" if len(items) > EXAMPLES else ""
            lines.append(f"  {reason}: {len(items)} ({shown}{more})")
    return lines


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


def grid_verdict(v: GridVerdict) -> str:
    """The grid's verdict line. In gate mode it leads with the named config and whether it is
    certified, then what to deploy (it, or the reference)."""
    cal = v.cal
    gate = f"{cal.deploy} " if cal.mode == "gate" else ""
    if not v.complete:
        return f"NOT CERTIFIED ({cal.grid.name}): {gate}partial run, {len(v.missing)} items missing" + _fallback(v)
    if v.error:
        return f"NOT CERTIFIED ({cal.grid.name}): {gate}{v.error}" + _fallback(v)
    if cal.mode == "gate":
        state = "is certified" if v.certified else f"is NOT valid at alpha={cal.alpha:g}"
        return f"{'' if v.certified else 'NOT '}CERTIFIED ({cal.grid.name}, gate): {cal.deploy} {state}; {_deploy_text(v)}"
    if v.certified:
        what = {"select": "", "all": "every candidate is valid; "}[cal.mode]
        return f"CERTIFIED ({cal.grid.name}, {cal.mode}): {what}{_deploy_text(v)}"
    failed = v.not_certified
    return (
        f"NOT CERTIFIED ({cal.grid.name}, {cal.mode}): {len(failed)} of {len(v.required)} required configs "
        f"not valid at alpha={cal.alpha:g}: {', '.join(failed)}"
    )


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
    gains = _interval_gain(v, interval)
    unit = "%" if r.gain_kind == "percent" else "x"
    return f"[{low:.4g}, {high:.4g}]", f"[{gains[0]:+.1f}, {gains[1]:+.1f}]{unit}" if unit == "%" else f"[{gains[0]:.2f}, {gains[1]:.2f}]x"


def _interval_gain(v: GridVerdict, interval: tuple[float, float]) -> tuple[float, float]:
    r = v.result
    return gain_interval(float(r.cost[r.reference_index]), interval, r.lower_is_better, r.gain_kind)


def gain_interval(reference: float, interval: tuple[float, float], lower_is_better: bool, kind: str) -> tuple[float, float]:
    """The gain over the reference (``risk.gains``) of every cost in ``interval``, as ``(low, high)``.

    Costs are positive, so an end at or below 0 (an unbounded ``-inf``) bounds nothing: the ratio
    of cost to the reference's then runs down to 0, and an unbounded end up to ``inf``.

    >>> gain_interval(2.0, (1.0, 4.0), False, "percent")
    (-50.0, 100.0)
    >>> gain_interval(8.0, (2.0, math.inf), True, "factor")
    (0.0, 4.0)
    >>> gain_interval(8.0, (-math.inf, math.inf), True, "percent")
    (-100.0, inf)
    """
    low, high = interval
    if lower_is_better:  # the ratio reference / cost falls as the cost rises
        ratios = (reference / high if 0 < high < math.inf else 0.0, reference / low if low > 0 else math.inf)
    else:
        ratios = (max(low, 0.0) / reference, high / reference if high > 0 else 0.0)
    return tuple(100.0 * (x - 1.0) if kind == "percent" else x for x in ratios)


def _fallback(v: GridVerdict) -> str:
    return f"; deploy the reference {v.cal.reference}" if v.cal.mode == "gate" else ""


def _deploy_text(v: GridVerdict, index: int | None = None, verb: str = "deploy") -> str:
    r = v.result
    d = v.deployed_index if index is None else index
    if d == r.reference_index:
        return f"{verb} {r.names[d]} (the reference)"
    if not v.comparable(d):  # its cost is fixed by declared bounds; its accuracy is on the prompts it ran
        return f"{verb} {r.names[d]} ({_gain(r, d)} {v.cal.grid.cost}; accuracy not measured on every prompt)"
    return f"{verb} {r.names[d]} ({_gain(r, d)} {v.cal.grid.cost}, {r.net_accuracy[d]:+.1f} accuracy points)"


def hint_line(v: GridVerdict) -> str | None:
    """Gate mode: the best valid config, as a hint beside the named one (None elsewhere)."""
    if v.cal.mode != "gate" or v.result is None or v.error:
        return None
    best = v.result.deployed_index
    open_ = v.best_valid_open
    if open_:  # gate mode decodes only the named config for cost: the best is not settled
        others = open_[0] if len(open_) == 1 else f"one of {', '.join(open_)}"
        return (f"hint: the best-cost valid config is {v.result.names[best]} or {others} (valid, "
                "not decoded for cost in gate mode; their cost intervals are in the table)")
    return "hint: " + _deploy_text(v, best, "the best-cost valid config is") + (
        " (what deploy: fastest would serve)" if best != v.deployed_index else "")


def trade_lines(v: GridVerdict) -> list[str]:
    """What the deployment trades: a poor trade (points lost over percent gained), a gate's
    certified config that is slower than the reference, and a min_gain that held back a config."""
    lines = [v.poor_trade] if v.poor_trade else []
    if v.slower_than_reference:
        r = v.result
        i = r.names.index(v.cal.deploy)
        lines.append(f"note: {v.cal.deploy} is certified but slower than the reference {v.cal.reference} on "
                     f"{v.cal.grid.cost} ({_gain(r, i)}); it is still the requested config")
    if v.cal.grid.min_gain is not None and v.result is not None:
        unit = "x" if v.result.gain_kind == "factor" else "%"
        applies = "" if v.cal.mode == "select" else f" (not applied: it applies in select mode only, this is {v.cal.mode})"
        lines.append(f"min_gain: a deployed candidate must gain at least {v.cal.grid.min_gain:g}{unit} {v.cal.grid.cost}{applies}")
    return lines


def grid_lines(v: GridVerdict, verbosity: int) -> list[str]:
    lines = [header(v)]
    if not v.complete:
        lines += missing_lines(v)
    elif v.error:
        lines.append(v.error)
    else:
        lines += table_lines(v)
    lines.append(f"outcomes: {v.record.count('store')} reused from the store, {v.record.count('decoded')} decoded")
    lines += schedule_lines(v)
    lines += regression_lines(v, verbosity)
    hint = hint_line(v)
    if hint:
        lines.append(hint)
    lines += trade_lines(v)
    lines.append(grid_verdict(v))
    return lines


def session_line(verdicts: Sequence[GridVerdict], exitstatus: int = 1) -> tuple[str, bool]:
    """The one line that says whether the session certified, and the exit status the
    process returns (2 after an interrupt, not the 1 of an uncertified run)."""
    failed = [v.cal.grid.name for v in verdicts if not v.certified]
    if not failed:
        return f"REDLINE CERTIFIED: {len(verdicts)} grid{'s' * (len(verdicts) != 1)}", True
    why = "interrupted, " if int(exitstatus) == 2 else ""
    return f"REDLINE NOT CERTIFIED: {', '.join(failed)} ({why}exit status {int(exitstatus)})", False


# --------------------------------------------------------------------------- JSON


def grid_report(v: GridVerdict) -> dict[str, Any]:
    """The JSON report object of one grid (docs/reports.md), plus partial-run and regression detail."""
    cal = v.cal
    out: dict[str, Any] = {}
    if cal.mode == "gate":  # a gate's report leads with the named config and whether it is certified
        out.update(requested=cal.deploy, certified=v.certified, slower_than_reference=v.slower_than_reference)
    out.update({
        "grid": cal.grid.name,
        "grid_file": cal.label,
        # the suite and what scored it (a code suite's version names its sandbox, e.g. an opted-in "process")
        "suite": None if cal.suite is None else {"name": cal.grid.suite, "args": dict(cal.grid.suite_args),
                                                 "version": str(getattr(cal.suite, "version", ""))},
        "alpha": cal.alpha,
        "delta": cal.delta,
        "delta_share": cal.delta_share,
        "grids_in_session": cal.grids_in_session,
        "correction": cal.correction,
        "family": "all",  # the reference counts in the Holm family (the paper's convention)
        "checkpoints": dict(getattr(cal, "declared", {})),  # per config: family, block size, mask id used
        "n": cal.n,
        "m": cal.m,
        "reference": cal.reference,
        "cost": cal.grid.cost,
        "direction": cal.grid.direction,
        "deploy_mode": cal.mode,
        "deploy": cal.deploy,
        "deployed": v.deployed,
        "best_valid": v.best_valid,
        "best_valid_open": list(v.best_valid_open),  # gate mode: configs not decoded for cost that may beat it
        "certified": v.certified,
        "complete": v.complete,
        "required": list(v.required),
        "not_certified": list(v.not_certified),
        "alpha_min": v.alpha_min,
        "min_gain": cal.grid.min_gain if cal.grid.min_gain is not None else 0,  # applies in select mode only
        "statuses": _statuses(v),
        "poor_trade": v.poor_trade,
        "configs": _configs(v),
        "regressions": v.record.regressions(),
        "outcomes": {"reused": v.record.count("store"), "decoded": v.record.count("decoded")},
        "missing": [{"config": m.config, "prompt": m.prompt, "reason": m.reason} for m in v.missing],
        "error": v.error,
        "schedule": _schedule(v),
        "spend": v.spend.to_dict() if v.spend is not None else None,
    })
    return out


def _schedule(v: GridVerdict) -> dict[str, Any]:
    from pytest_redline.schedule import REFERENCE_WRONG

    record = v.record
    return {
        "mode": v.mode,
        "seed": v.cal.seed,
        "skipped": {"reference_wrong": record.skipped(REFERENCE_WRONG),
                    "early_stop": len(record.skips) - record.skipped(REFERENCE_WRONG)},
        "cost_estimated": v.cal.cost_estimated,
    }


def _configs(v: GridVerdict) -> list[dict[str, Any]]:
    params = v.cal.params
    if v.result is None:
        return [{"name": name, "params": dict(params[name]), "decode_seconds": _seconds(v, name)} for name in v.cal.configs]
    entries = v.result.to_dict()["configs"]
    prompts = [p.id for p in v.cal.prompts]
    sched = v.scheduled
    kept = v.on_reference_correct()
    for i, entry in enumerate(entries):
        entry["params"] = dict(params[entry["name"]])
        entry["decode_seconds"] = _seconds(v, entry["name"])
        entry["accuracy_on_reference_correct"] = float(kept[i])  # on those it ran on, in a scheduled run
        entry["estimates_biased"] = v.estimate_biased(i)  # risk estimate, accuracy_on_reference_correct, prompts_needed
        if not v.comparable(i):  # accuracy, cost, gain: all-prompt figures; this config ran on fewer
            entry["cost_on_prompts_run"], entry["gain_on_prompts_run"] = entry["cost"], entry["gain"]
            entry.update(accuracy=None, net_accuracy_points=None)
            if not v.cost_known(i):
                entry.update(cost=None, gain=None)
        interval = v.cost_interval(i)
        if interval is not None:  # settled by the contenders' cost intervals (docs/scheduling.md)
            entry["cost_interval"] = [x if math.isfinite(x) else None for x in interval]  # None: unbounded
            entry["gain_interval"] = [x if math.isfinite(x) else None for x in _interval_gain(v, interval)]
            entry["cost_decided"] = v.decided[entry["name"]]["reason"]
        ran = [p for p, r in zip(prompts, sched.ran[i]) if r] if sched else prompts
        if not v.comparable(i):  # chosen by the schedule (mostly reference-correct prompts): not an all-prompt accuracy
            right = sum(v.record.entries[(entry["name"], p)].correct for p in ran)
            entry["accuracy_on_prompts_run"] = right / len(ran) if ran else None
        entry["prompts_run"] = len(ran)
        entry["ran_on"] = ran
        entry["stopped"] = sched.stops[i] if sched else None
        entry["violations_bound"] = sched.bounds[i] if sched else "exact"
        entry["status"] = v.statuses[i]
        entry["reverse"] = {"violations": int(v.reverse.violations[i]), "p_value": _json_number(v.reverse.p_values[i]),
                            "p_adjusted": _json_number(v.reverse.p_adjusted[i])}
        settle = v.to_settle(entry["name"])
        if settle is not None:
            entry["to_settle"] = {"test": settle.test, "risk": settle.risk, "prompts": settle.prompts,
                                  "over": PROMPTS_LIMIT if settle.over_limit else None}
        if not entry["valid"] and entry["name"] != v.cal.reference:
            entry["prompts_needed"] = v.prompts_needed(entry["name"])
            if v.needs_over_limit(entry["name"]):
                entry["prompts_needed_over"] = PROMPTS_LIMIT
    return entries


def _statuses(v: GridVerdict) -> dict[str, Any] | None:
    """The reverse family beside the certificates: its level, and what a scheduled run's status means."""
    if v.statuses is None:
        return None
    return {
        "family_level": v.cal.delta_share,  # each family's error <= this; any status wrong <= twice it
        "any_status_wrong_at_most": 2 * v.cal.delta_share,
        "reverse_test": "P[Bin(n, alpha) >= V], " + v.cal.correction + " over the m - 1 candidates",
        "lower_bounds": v.status_bounded,  # stopped configs' V counted on the prompts they ran on
    }


def _json_number(x: Any) -> float | None:
    x = float(x)
    return None if x != x else x


def _seconds(v: GridVerdict, name: str) -> float | None:
    """Wall time this session spent decoding config ``name`` (0.0: all reused or skipped)."""
    return None if v.spend is None else round(v.spend.config_seconds.get(name, 0.0), 3)


def session_report(verdicts: Sequence[GridVerdict]) -> dict[str, Any]:
    """One grid: its object; several: ``{"grids": [...]}``."""
    reports = [grid_report(v) for v in verdicts]
    return reports[0] if len(reports) == 1 else {"grids": reports, "certified": all(v.certified for v in verdicts)}


def write_json(path: str | os.PathLike, verdicts: Sequence[GridVerdict]) -> None:
    atomic_write(Path(path), json.dumps(session_report(verdicts), indent=2) + "\n")


# --------------------------------------------------------------------------- CSV


def outcome_paths(path: str | os.PathLike, verdicts: Sequence[GridVerdict]) -> list[Path]:
    """Where each grid's outcomes go: PATH with one grid, PATH-<grid name> with several."""
    path = Path(path)
    if len(verdicts) == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', v.cal.grid.name)}{path.suffix}") for v in verdicts]


def write_outcomes(path: str | os.PathLike, verdicts: Sequence[GridVerdict]) -> list[str]:
    """Write each complete grid's outcome CSV; returns one line per grid saying what happened."""
    lines = []
    for v, target in zip(verdicts, outcome_paths(path, verdicts)):
        if v.table is None:
            lines.append(f"outcomes of {v.cal.grid.name}: not written (partial run)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        v.table.write_csv(target)
        lines.append(f"outcomes of {v.cal.grid.name}: {target}")
    return lines


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, with the permissions
    an ordinary new file gets (mkstemp's are owner-only, which CI artifact upload can trip on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _gain(r: RedlineResult, i: int) -> str:
    return text.gain(r.gain[i], r.gain_kind)


def _clip(text: str, limit: int | None) -> str:
    text = text.replace("\n", "\\n")
    if limit is None or len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f" ... ({len(text) - limit} more characters)"
