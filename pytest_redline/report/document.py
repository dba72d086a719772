"""The report document: the JSON report object of each grid (``docs/reference/reports.md``), which the review
page and the Markdown summary render too, and ``--redline-json``'s file."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from pytest_redline.report.files import atomic_write
from pytest_redline.slices import slicings
from pytest_redline.verdict import PROMPTS_LIMIT, GridVerdict


def grid_report(v: GridVerdict) -> dict[str, Any]:
    """The JSON report object of one grid (docs/reference/reports.md), plus partial-run and regression detail."""
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
        "alpha_source": cal.alpha_source,  # "grid file" (its alpha:) or "--redline-alpha"
        "advisory": cal.advisory,  # required: false: gated and reported, fails nothing
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
        "slices": [s.to_json() for s in slicings(v)],  # descriptive per-slice counts (pytest_redline.slices)
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
        "mode": v.how_run,
        "seed": v.cal.seed,
        "skipped": {"reference_wrong": record.skipped(REFERENCE_WRONG),
                    "early_stop": len(record.skips) - record.skipped(REFERENCE_WRONG)},
        "cost_estimated": v.cal.cost_estimated,
    }



def _configs(v: GridVerdict) -> list[dict[str, Any]]:
    params = v.cal.params
    if v.result is None:
        return [{"name": name, "params": dict(params[name]), "decode_seconds": _seconds(v, name),
                 "length_stops": _length_stops(v, name), "decoded_past_stop": _past_stop(v, name)} for name in v.cal.configs]
    entries = v.result.to_dict()["configs"]
    prompts = [p.id for p in v.cal.prompts]
    sched = v.scheduled
    kept = v.on_reference_correct()
    for i, entry in enumerate(entries):
        entry["params"] = dict(params[entry["name"]])
        entry["decode_seconds"] = _seconds(v, entry["name"])
        entry["length_stops"] = _length_stops(v, entry["name"])
        entry["decoded_past_stop"] = _past_stop(v, entry["name"])
        entry["accuracy_on_reference_correct"] = float(kept[i])  # on those it ran on, in a scheduled run
        entry["estimates_biased"] = v.estimate_biased(i)  # risk estimate, accuracy_on_reference_correct, prompts_needed
        if not v.comparable(i):  # accuracy, cost, gain: all-prompt figures; this config ran on fewer
            entry["cost_on_prompts_run"], entry["gain_on_prompts_run"] = entry["cost"], entry["gain"]
            entry.update(accuracy=None, net_accuracy_points=None)
            if not v.cost_known(i):
                entry.update(cost=None, gain=None)
        interval = v.cost_interval(i)
        if interval is not None:  # settled by the contenders' cost intervals (docs/explanation/scheduling.md)
            entry["cost_interval"] = [x if math.isfinite(x) else None for x in interval]  # None: unbounded
            entry["gain_interval"] = [x if math.isfinite(x) else None for x in interval_gain(v, interval)]
            entry["cost_decided"] = v.decided[entry["name"]]["reason"]
        ran = [p for p, r in zip(prompts, sched.ran[i]) if r] if sched else prompts
        if not v.comparable(i):  # chosen by the schedule (mostly reference-correct prompts): not an all-prompt accuracy
            right = sum(v.record.entries[(entry["name"], p)].correct for p in ran)
            entry["accuracy_on_prompts_run"] = right / len(ran) if ran else None
            entry["correct_on_prompts_run"] = int(right)
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



def _length_stops(v: GridVerdict, name: str) -> dict[str, Any]:
    """The config's outcomes that stopped at the token limit, of those this run has, and whether
    that is over LENGTH_WARN (the terminal's warning)."""
    cut, total = v.record.length_stops()[name]
    return {"count": cut, "outcomes": total, "warning": name in v.record.length_warned()}


def _past_stop(v: GridVerdict, name: str) -> int:
    """Prompts of config ``name`` decoded past its early stop (sent ahead), not its items."""
    return 0 if v.spend is None else int(v.spend.past_stop.get(name, 0))


def _seconds(v: GridVerdict, name: str) -> float | None:
    """Wall time this session spent decoding config ``name`` (0.0: all reused or skipped)."""
    return None if v.spend is None else round(v.spend.config_seconds.get(name, 0.0), 3)



def session_report(verdicts: Sequence[GridVerdict]) -> dict[str, Any]:
    """One grid: its object; several: ``{"grids": [...]}``."""
    reports = [grid_report(v) for v in verdicts]
    if len(reports) == 1:
        return reports[0]
    return {"grids": reports, "certified": all(v.certified for v in verdicts if not v.cal.advisory),  # what exit 0 needs
            "advisory_not_certified": [v.cal.grid.name for v in verdicts if v.cal.advisory and not v.certified]}



def write_json(path: str | os.PathLike, verdicts: Sequence[GridVerdict]) -> None:
    atomic_write(Path(path), json.dumps(session_report(verdicts), indent=2) + "\n")



def interval_gain(v: GridVerdict, interval: tuple[float, float]) -> tuple[float, float]:
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
