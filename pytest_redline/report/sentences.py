"""The sentences every renderer says alike: a grid's header, its verdict line, the hint beside a
gate's config, what the deployment trades, a partial run's missing items, and the session's line.

The terminal, the review page and the Markdown summary each take these from here, so that they can
never word the verdict differently (and no renderer imports another).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from pytest_redline.calibration import GRID_FILE
from pytest_redline.ledger import LENGTH_WARN, REASONS
from pytest_redline.report import text
from pytest_redline.verdict import GridVerdict

if TYPE_CHECKING:  # the statistics load scipy: imported when a grid is certified (verdict.decide)
    from pytest_redline.risk import RedlineResult

EXAMPLES = 3
ADVISORY = "advisory (required: false): reported, fails nothing"


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


def title(v: GridVerdict) -> str:
    """The grid's title: its name and file, its budget and where it came from, and whether it is
    advisory: ``code (code.yaml): alpha=0.05 from the grid file; advisory (...)``."""
    cal = v.cal
    source = "the grid file" if cal.alpha_source == GRID_FILE else cal.alpha_source
    return f"{cal.grid.name} ({cal.label}): alpha={cal.alpha:g} from {source}" + (f"; {ADVISORY}" if cal.advisory else "")


def outcomes_line(v: GridVerdict) -> str:
    """Where the outcomes came from: a replayed grid (recorded outcomes: replay, lm_eval,
    inspect) says it read them, since nothing was decoded."""
    reused, now = v.record.count("store"), v.record.count("decoded")
    if v.cal.replayed:
        engines = ", ".join(dict.fromkeys(engine for engine, _ in v.cal.engines.values()))
        return (f"outcomes: replayed ({engines}): {now} read from the recorded outcomes, {reused} reused from the store, "
                "none decoded")
    return f"outcomes: {reused} reused from the store, {now} decoded"



def length_stop_lines(v: GridVerdict) -> list[str]:
    """Each config's outcomes that stopped at the token limit, when any did, and a warning for
    each config with more than LENGTH_WARN of its outcomes there."""
    counts = {c: n for c, n in v.record.length_stops().items() if n[0]}
    if not counts:
        return []
    return ["stopped at the token limit (finish_reason length): "
            + ", ".join(f"{c} {cut} of {total}" for c, (cut, total) in counts.items()), *length_warnings(v)]


def length_warnings(v: GridVerdict) -> list[str]:
    """A warning for each config with more than LENGTH_WARN of its outcomes at the token limit."""
    counts = v.record.length_stops()
    return [f"warning: config {c!r}: {counts[c][0]} of {counts[c][1]} outcomes stopped at the token limit (over "
            f"{float(LENGTH_WARN):.0%}); raise its max_tokens if the answers are cut" for c in v.record.length_warned()]


def best_cost(cost: str, direction: str) -> str:
    """What "best cost" means on this grid's cost (a memory grid is not made "fastest")."""
    return f"{'highest' if direction == 'higher' else 'lowest'} {cost}"



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



def verdict_line(v: GridVerdict) -> str:
    """The grid's verdict line. In gate mode it leads with the named config and whether it is
    certified, then what to deploy (it, or the reference). An advisory grid's is marked so."""
    return ("ADVISORY " if v.cal.advisory else "") + _verdict(v)


def _verdict(v: GridVerdict) -> str:
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



def session_line(verdicts: Sequence[GridVerdict], exitstatus: int = 1) -> tuple[str, bool]:
    """The one line that says whether the session certified, and the exit status the
    process returns (2 after an interrupt, not the 1 of an uncertified run)."""
    failed = [v.cal.grid.name for v in verdicts if not v.certified and not v.cal.advisory]
    advisory = [v.cal.grid.name for v in verdicts if not v.certified and v.cal.advisory]
    aside = f"; advisory, not certified (fails nothing): {', '.join(advisory)}" if advisory else ""
    if not failed:
        required = sum(not v.cal.advisory for v in verdicts)
        if not required:
            return f"REDLINE: no required grid ({len(verdicts)} advisory){aside}", True
        which = "required " if required < len(verdicts) else ""
        return f"REDLINE CERTIFIED: {required} {which}grid{'s' * (required != 1)}{aside}", True
    why = "interrupted, " if int(exitstatus) == 2 else ""
    return f"REDLINE NOT CERTIFIED: {', '.join(failed)} ({why}exit status {int(exitstatus)}){aside}", False



def _gain(r: RedlineResult, i: int) -> str:
    return text.gain(r.gain[i], r.gain_kind)
