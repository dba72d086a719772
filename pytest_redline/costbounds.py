"""Declared cost bounds: the check on every decoded prompt, and a config's all-prompt cost interval.

An engine may declare, per config and before decoding, hard bounds on each prompt's cost fields
(``cost_bounds(engine_args, params)`` on its factory, see :class:`~pytest_redline.contracts.EngineFactory`):
a mapping from a field to ``(low, high)``, or to :data:`CONSTANT` (the same value on every
prompt of the config); ``high`` may be ``math.inf`` (no upper bound). Fields: ``tokens``, ``forwards``, ``tokens_per_forward`` (a prompt's
``tokens / max(forwards, 1)``) and any ``Generation.extra`` column.

:func:`violation` checks a decoded prompt; :func:`interval` bounds a config's cost on all n
prompts from the prompts it decoded and the bounds on the rest, exactly (``Fraction``s of the
stored floats, which are exact binary fractions):

- a mean cost (``apf``, an extra column) lies in ``(sum decoded + k * [low, high]) / n`` for
  k prompts left;
- the pooled ``tpf`` = (T0 + sum t_j) / (F0 + sum f_j) over the k cells (t_j, f_j) that the
  bounds allow (a polygon: a box in tokens and forwards cut by the ratio bounds) is a
  linear-fractional program: its extremes are found exactly by Dinkelbach's iteration over
  the cells' vertices (:func:`dinkelbach`). Without an upper bound on forwards (and no
  positive lower bound on the ratio) the lower end is 0; without bounds on tokens, or a lower
  bound of at least 1 on forwards, the interval is unbounded.

:func:`standing` applies the deployment rule to intervals: which contenders can no longer be
deployed. Plain Python; no pytest, no store.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction
from itertools import combinations
from typing import Any, Callable, Mapping, Sequence

CONSTANT = "constant"
RATIO = "tokens_per_forward"
INF = math.inf

Bounds = Mapping[str, "tuple[Fraction, Fraction] | str"]
Interval = tuple  # (low, high): Fractions, or -inf / inf


class BoundsError(ValueError):
    """An engine's declared bounds are malformed."""


def parse(raw: Mapping[str, Any] | None, where: str) -> dict[str, tuple[Fraction, Fraction] | str] | None:
    """Declared bounds as Fractions (None: the engine declares none); a BoundsError names ``where``."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise BoundsError(f"{where}: cost_bounds must return a mapping, got {type(raw).__name__}")
    out: dict[str, tuple[Fraction, Fraction] | str] = {}
    for field, value in raw.items():
        if value == CONSTANT:
            out[str(field)] = CONSTANT
            continue
        ok = isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2 and all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isnan(v) for v in value)
        if not ok or not -INF < value[0] <= value[1] or value[1] == -INF:
            raise BoundsError(f"{where}: cost_bounds[{field!r}]: expected (low, high), numbers with low <= high (low "
                              f"finite, high possibly inf), or {CONSTANT!r}; got {value!r}")
        out[str(field)] = (decimal(value[0]), value[1] if math.isinf(value[1]) else decimal(value[1]))
    return out


def decimal(x: Any) -> Fraction:
    """``x`` exactly as it was written: a float as the shortest decimal that gives it back
    (``Fraction(repr(x))``: 6.4 is 32/5, not the binary double's 7205759403792794/1125899906842624),
    an int or a Fraction as itself. The one reading of ``min_gain`` and of the costs it meets."""
    if isinstance(x, Fraction) or isinstance(x, numbers.Integral):
        return Fraction(int(x)) if isinstance(x, numbers.Integral) else x
    return Fraction(repr(float(x)))


def value(outcome: Any, field: str) -> Fraction | None:
    """A prompt's value of ``field`` (None when it has none)."""
    if field == RATIO:
        t, f = value(outcome, "tokens"), value(outcome, "forwards")
        return None if t is None or f is None else t / max(f, 1)
    if field in ("tokens", "forwards"):
        x = getattr(outcome, field)
    else:
        x = dict(outcome.extra).get(field)
    return None if x is None or math.isnan(x) else decimal(x)


def violation(bounds: Bounds, outcome: Any, first: Any | None = None) -> str | None:
    """Which declared bound a decoded prompt breaks (None: all hold). ``first`` is another decoded
    prompt of the config, which a :data:`CONSTANT` field must equal."""
    for field, bound in bounds.items():
        x = value(outcome, field)
        if x is None:  # a cost that needs the field fails on the empty cell, with its own message
            continue
        if bound == CONSTANT:
            other = None if first is None else value(first, field)
            if other is not None and x != other:
                return f"{field} = {float(x):g}, declared constant per config, but another prompt has {float(other):g}"
        elif not bound[0] <= x <= bound[1]:
            return f"{field} = {float(x):g} outside the declared {_text(bound)}"
    return None


def _text(bound) -> str:
    return CONSTANT if bound == CONSTANT else f"[{float(bound[0]):g}, {float(bound[1]):g}]"


def _range(bounds: Bounds, field: str, decoded: Sequence[Any]) -> tuple:
    """The values ``field`` may take on a prompt not decoded yet."""
    bound = bounds.get(field)
    if bound == CONSTANT:
        if not decoded:
            return -INF, INF
        x = value(decoded[0], field)
        return (x, x) if x is not None else (-INF, INF)
    return bound if bound is not None else (-INF, INF)


def interval(kind: str, decoded: Sequence[Any], unknown: int, bounds: Bounds | None) -> Interval:
    """The config's cost on all ``len(decoded) + unknown`` prompts: exact when nothing is
    unknown, else the interval that the bounds allow (``(-inf, inf)`` without them)."""
    n = len(decoded) + unknown
    if kind == "tpf":
        return _pooled(decoded, unknown, bounds or {})
    if kind == "apf":
        values = [value(o, RATIO) for o in decoded]
        low, high = _ratio_range(bounds or {}, decoded)
    else:
        values = [value(o, kind) for o in decoded]
        low, high = _range(bounds or {}, kind, decoded)
    if any(v is None for v in values) or n == 0:
        return -INF, INF
    total = sum(values, Fraction(0))
    if unknown == 0:
        return total / n, total / n
    return _div(_add(total, unknown, low), n), _div(_add(total, unknown, high), n)


def _add(total: Fraction, k: int, x) -> Any:
    return x if math.isinf(x) else total + k * x


def _div(x, n: int) -> Any:
    return x if math.isinf(x) else x / n


def _ratio_range(bounds: Bounds, decoded: Sequence[Any]) -> tuple:
    """A prompt's tokens / max(forwards, 1): its own bound, tightened by those on tokens and forwards."""
    low, high = _range(bounds, RATIO, decoded)
    (tl, th), (fl, fh) = _range(bounds, "tokens", decoded), _range(bounds, "forwards", decoded)
    if tl >= 0 and not math.isinf(fh):
        low = max(low, tl / max(fh, 1))
    if tl >= 0 and not math.isinf(th) and not math.isinf(fl):
        high = min(high, th / max(fl, 1))
    return low, high


def _pooled(decoded: Sequence[Any], unknown: int, bounds: Bounds) -> Interval:
    tokens = [value(o, "tokens") for o in decoded]
    forwards = [value(o, "forwards") for o in decoded]
    if any(x is None for x in tokens + forwards):
        return -INF, INF
    t0, f0 = sum(tokens, Fraction(0)), sum(forwards, Fraction(0))
    if unknown == 0:
        return (t0 / f0, t0 / f0) if f0 > 0 else (-INF, INF)
    (tl, th), (fl, fh) = _range(bounds, "tokens", decoded), _range(bounds, "forwards", decoded)
    rl, rh = _range(bounds, RATIO, decoded)
    if math.isinf(tl) or math.isinf(th) or tl < 0 or fl < 1:  # the ratio needs t >= 0 and a forward
        return -INF, INF
    vertices = cell_vertices(tl, th, fl, fh, rl, rh)
    if not vertices:  # the bounds admit no prompt: any decoded one breaks them
        return -INF, INF
    groups = [(vertices, unknown)]
    high = dinkelbach(t0, f0, groups, maximize=True)
    unbounded = math.isinf(fh) and not rl > 0  # forwards can grow without end: the pooled ratio tends to 0
    low = Fraction(0) if unbounded else dinkelbach(t0, f0, groups, maximize=False)
    return low, high


def cell_vertices(tl, th, fl, fh, rl, rh) -> list[tuple[Fraction, Fraction]]:
    """The vertices (t, f) of {tl <= t <= th, fl <= f <= fh, rl f <= t <= rh f} (infinite
    bounds left out), from every pair of boundary lines a t + b f = c; f >= fl >= 1 here, so
    the ratio bound on t / max(f, 1) is the one on t / f."""
    lines = [(1, 0, tl), (1, 0, th), (0, 1, fl)]  # a t + b f = c
    if not math.isinf(fh):
        lines.append((0, 1, fh))
    lines += [(1, -r, 0) for r in (rl, rh) if not math.isinf(r)]
    points = set()
    for (a1, b1, c1), (a2, b2, c2) in combinations(lines, 2):
        det = a1 * b2 - a2 * b1
        if det == 0:
            continue
        t, f = Fraction(c1 * b2 - c2 * b1) / det, Fraction(a1 * c2 - a2 * c1) / det
        if tl <= t <= th and fl <= f <= fh and (math.isinf(rl) or t >= rl * f) and (math.isinf(rh) or t <= rh * f):
            points.add((t, f))
    return sorted(points)


def dinkelbach(t0: Fraction, f0: Fraction, groups: Sequence[tuple[Sequence[tuple[Fraction, Fraction]], int]],
               maximize: bool) -> Fraction:
    """The extreme of (t0 + sum of t) / (f0 + sum of f) when each of ``count`` cells of a group
    takes a vertex (t, f) of the group's polygon, the denominator positive throughout.

    Dinkelbach: at lambda = the ratio of the current choice, every cell takes the vertex with
    the best t - lambda f (the linear subproblem separates by cell, and a linear function's
    extreme over a polygon is at a vertex); the ratio then strictly improves until that best
    value is 0, where lambda is optimal. Finitely many choices, exact Fractions: it ends exact."""
    better = max if maximize else min
    choice = [vertices[0] for vertices, _ in groups]
    while True:
        num = t0 + sum(count * t for (t, _), (_, count) in zip(choice, groups))
        den = f0 + sum(count * f for (_, f), (_, count) in zip(choice, groups))
        lam = num / den
        step = [better(vertices, key=lambda v: v[0] - lam * v[1]) for vertices, _ in groups]
        gain = sum(count * ((t - lam * f) - (ct - lam * cf)) for (t, f), (ct, cf), (_, count) in zip(step, choice, groups))
        if gain == 0:
            return lam
        choice = step


def standing(
    intervals: Sequence[Interval],
    reference: int,
    contenders: Sequence[int],
    lower_is_better: bool,
    min_gain: float | None = None,
    names: Sequence[str] | None = None,
) -> dict[int, str]:
    """The contenders that can no longer be deployed, with why, from each config's cost interval.

    The deployment rule (:func:`~pytest_redline.risk.certification.select_deployed`): the best
    cost among the valid configs and the reference; a candidate must be strictly better than
    the reference, and among tied candidates the first listed wins; with ``min_gain`` (select
    mode) a candidate must also gain that much (percent, or a reduction factor when lower is
    better). A contender is out when its best end does not beat the reference, cannot reach
    ``min_gain``, or when another contender sure to reach ``min_gain`` is sure to be at least
    as good (better, or tied and listed first). ``intervals[reference]`` must be a point.
    """
    def score(iv: Interval) -> tuple:
        return (-iv[1], -iv[0]) if lower_is_better else (iv[0], iv[1])

    ref = score(intervals[reference])[0]
    threshold = None
    if min_gain is not None:
        g = decimal(min_gain)
        threshold = -intervals[reference][0] / g if lower_is_better else ref * (1 + g / 100)
    sure = {i: threshold is None or score(intervals[i])[0] >= threshold for i in contenders}
    out = {}
    for c in contenders:
        low, high = score(intervals[c])
        if high <= ref:
            out[c] = "cannot beat the reference"
        elif threshold is not None and high < threshold:
            out[c] = "cannot reach min_gain"
        else:
            for d in contenders:
                d_low = score(intervals[d])[0]
                if d != c and sure[d] and (d_low > high or (d_low >= high and d < c)):
                    out[c] = f"beaten for certain by {names[d] if names is not None else d}"
                    break
    return out


def settle(
    m: int,
    reference: int,
    contenders: Sequence[int],
    interval_of: Callable[[int], Interval],
    waiting: Callable[[int], bool],
    decode_next: Callable[[int], None],
    lower_is_better: bool,
    min_gain: float | None = None,
    names: Sequence[str] | None = None,
) -> tuple[list[Interval], dict[int, str], list[int]]:
    """Decode the contenders, a batch at a time, until at most one can still be deployed.

    Each step takes every config's interval (``interval_of``), drops what :func:`standing`
    drops, and decodes the next batch (``decode_next``) of the contender left with the best
    possible cost among those with batches left (``waiting``). Returns the last intervals, the
    dropped contenders with why, and those left (at most one, unless batches ran out)."""
    while True:
        intervals = [interval_of(i) for i in range(m)]
        out = standing(intervals, reference, contenders, lower_is_better, min_gain, names)
        alive = [i for i in contenders if i not in out]
        ready = [i for i in alive if waiting(i)]
        if len(alive) <= 1 or not ready:
            return intervals, out, alive
        decode_next(best_high(intervals, ready, lower_is_better))


def exact_choice(table: Any, kind: str, complete: Sequence[int], points: Mapping[int, Fraction],
                 choosable: Sequence[int], reference: int, lower_is_better: bool,
                 min_gain: Any = None, gain_kind: str | None = None) -> int | None:
    """The deployment on exact costs: rows ``complete`` of ``table`` summed exactly, ``points``
    (costs fixed by declared bounds) as given; None when a config it needs has no exact cost.
    With ``min_gain``, a candidate must gain that much on those exact costs (``gain_kind``
    ``"percent"`` or ``"factor"``; default: a factor when lower is better)."""
    need = [reference, *choosable]
    costs = {**exact_costs(table, kind, [i for i in complete if i in need]), **points}
    if any(i not in costs for i in need):
        return None
    if min_gain is not None:
        kind_of_gain = gain_kind or ("factor" if lower_is_better else "percent")
        choosable = [i for i in choosable if gains_enough(costs[i], costs[reference], lower_is_better, kind_of_gain, min_gain)]
    return select_exact(costs, choosable, reference, lower_is_better)


def gains_enough(cost: Fraction, reference_cost: Fraction, lower_is_better: bool, gain_kind: str, min_gain: Any) -> bool:
    """Whether ``cost`` gains at least ``min_gain`` (read as written) over ``reference_cost``, exactly."""
    top, bottom = (reference_cost, cost) if lower_is_better else (cost, reference_cost)
    if bottom == 0:
        return top > 0
    ratio = Fraction(top) / Fraction(bottom)
    return (100 * (ratio - 1) if gain_kind == "percent" else ratio) >= decimal(min_gain)


def exact_costs(table: Any, kind: str, rows: Sequence[int]) -> dict[int, Fraction]:
    """The exact all-prompt cost of each config in ``rows`` of an outcome table (every cell known)."""
    from types import SimpleNamespace

    out = {}
    for i in rows:
        cells = [SimpleNamespace(tokens=table.tokens[i, j], forwards=table.forwards[i, j],
                                 extra={k: v[i, j] for k, v in table.extra.items()}) for j in range(table.n)]
        low, high = interval(kind, cells, 0, None)
        if low == high:
            out[i] = low
    return out


def select_exact(costs: Mapping[int, Fraction], choosable: Sequence[int], reference: int, lower_is_better: bool) -> int:
    """The deployment rule (``select_deployed``) on exact costs: the best among ``choosable`` and
    the reference, strictly better than the reference, ties to the first listed."""
    sign = -1 if lower_is_better else 1
    best = reference
    for i in sorted(choosable):
        if sign * costs[i] > sign * costs[best]:
            best = i
    return best


def best_high(intervals: Sequence[Interval], alive: Sequence[int], lower_is_better: bool) -> int:
    """The alive contender with the best possible cost (ties: the first listed)."""
    return min(alive, key=lambda i: (intervals[i][0] if lower_is_better else -intervals[i][1], i))
