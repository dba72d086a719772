r"""Whether two MATH answers are the same: our own rules, then (optionally) math-verify.

Our rules (:func:`same_normalised` on :func:`normalise_math` forms) decide alone, without
math-verify, in the cases where math-verify is known to merge distinct answers:

- both sides exact rationals (``12``, ``-0.35625``, ``\frac{3}{4}``): equal as fractions, so
  ``.00006727`` is not ``.0000672`` and ``0.3333333`` is not ``\frac{1}{3}``;
- either side a number with a base subscript (``52_8``): the subscript is part of the number,
  compared as written (``52_{8}`` = ``52_8``, ``52_87`` != ``52_8``).

Otherwise two answers are the same when their normal forms are equal, or they are the same
tuple/interval (element by element), the same unordered list, set or union of intervals (in
any order), the same matrix, or the same sum of terms in any order (``a+b`` = ``b+a``); and,
when math-verify is installed, when it proves them equal (floats rounded to
:data:`FLOAT_ROUNDING` places; the gold's parse is cached). Nothing here raises.
"""
from __future__ import annotations

import functools
import re
import threading
import warnings
from decimal import Decimal, InvalidOperation
from fractions import Fraction

FLOAT_ROUNDING = 10  # math-verify's default, 6, merges .00006727 with .0000672
_BASE = re.compile(r"-?[0-9A-Za-z]+_\{?\d+\}?")
_UNIT = re.compile(r"(?<=\S)\s*\\(?:text|mbox|textrm|textnormal|mathrm)\{\s*([A-Za-z]+(?:\s+[A-Za-z]+)*)\s*\}"
                   r"(?:\s*\^\s*\{?\s*\d\s*\}?)?\s*$")
_HEDGE_WORDS = {"or", "and", "either"}  # a \text{...} holding these is a connective, never a unit
_warned = False


def normalise_math(answer: str) -> str:
    r"""A normal form of a MATH answer, for string comparison.

    ``\dfrac``/``\tfrac`` -> ``\frac``; ``\frac12`` -> ``\frac{1}{2}``; ``\sqrt2`` -> ``\sqrt{2}``;
    ``a/b`` of integers -> ``\frac{a}{b}``; no ``\left``/``\right``, ``\!``, ``\,``, spaces,
    ``^\circ``, ``\$``, ``$``, ``\%``, ``{,}``; a trailing unit (``\text{ cm}``, ``\mbox{ inches}^2``
    after a value) dropped, other ``\text{...}`` (and ``\textbf``, ``\mbox``, ``\mathrm``)
    unwrapped; ``(C)`` -> ``C``; ``x=5`` -> ``5`` (a name of at most two characters); base
    subscripts ``_{8}`` -> ``_8``; thousands separators and a trailing period dropped. ``\\`` (a
    matrix row break) is kept. The rules are applied until nothing changes, so the normal form
    is a fixed point.
    """
    s = answer
    for _ in range(10):
        once = _normalise_once(s)
        if once == s:
            break
        s = once
    return s


def _normalise_once(answer: str) -> str:
    s = answer.strip().replace("\n", " ")
    unit = _UNIT.search(s)
    if unit and not set(unit.group(1).lower().split()) & _HEDGE_WORDS:
        s = s[: unit.start()]
    s = re.sub(r"\\(?:text|textbf|textrm|textnormal|mbox|mathrm|mathbf)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\displaystyle(?![a-zA-Z])", "", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)
    s = s.replace("{,}", "").replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\\\|\\[!,;: ]|~", lambda m: m.group() if m.group() == "\\\\" else "", s).replace(" ", "")
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"^(-?\d+)/(\d+)$", r"\\frac{\1}{\2}", s)
    s = re.sub(r"^[a-zA-Z]\w?=(?!=)", "", s)
    s = re.sub(r"_\{(\d+)\}", r"_\1", s)
    s = re.sub(r"^\(([A-Za-z])\)$", r"\1", s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s.rstrip(".")


def rational(s: str) -> Fraction | None:
    r"""``s`` (normalised) as an exact rational: ``12``, ``-0.35625``, ``\frac{3}{4}``, ``-\frac{3}{4}``,
    the mixed number ``15\frac{39}{40}``, the repeating decimal ``0.1\overline{6}``."""
    m = re.fullmatch(r"(-?)(\d*)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)  # a mixed number 15\frac{39}{40} too
    try:
        if m:
            value = int(m.group(2) or 0) + Fraction(int(m.group(3)), int(m.group(4)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)", s):
            return Fraction(Decimal(s))
        m = re.fullmatch(r"(-?)(\d*)\.(\d*)\\overline\{(\d+)\}", s)  # 0.1\overline{6} = 1/6
        if m:
            sign, whole, fixed, period = m.groups()
            value = int(whole or 0) + Fraction(int(fixed or 0), 10 ** len(fixed)) + Fraction(
                int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
            return -value if sign else value
    except (ZeroDivisionError, InvalidOperation, ValueError):
        pass
    return None


def split_top(s: str, separator: str) -> list[str]:
    """``s`` split at ``separator`` where no bracket or brace is open (``\\{`` counts as a brace)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        if s.startswith(separator, i) and depth == 0:
            parts.append(s[start:i])
            i = start = i + len(separator)
            continue
        depth += (s[i] in "([{") - (s[i] in ")]}")
        i += 1
    parts.append(s[start:])
    return parts


def _elements(s: str) -> tuple[str, list[str]] | None:
    """A tuple or interval ``(a,b]`` as (its brackets, its top-level elements), else None."""
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]" or _unbalanced(s[1:-1]):
        return None  # "(1)+(2)" is not one tuple
    parts = split_top(s[1:-1], ",")
    return (s[0] + s[-1], parts) if len(parts) > 1 else None


def _unbalanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += (c in "([{") - (c in ")]}")
        if depth < 0:
            return True
    return depth != 0


def _collection(s: str) -> list[str] | None:
    r"""An unordered collection: ``\{a,b\}``, ``A\cupB``, or a bare list ``a,b``; else None."""
    if s.startswith("\\{") and s.endswith("\\}") and not _unbalanced(s[2:-2]):
        return split_top(s[2:-2], ",")
    for separator in ("\\cup", ","):
        parts = split_top(s, separator)
        if len(parts) > 1 and all(parts):
            return parts
    return None


def _matrix(s: str) -> tuple[str, list[list[str]]] | None:
    m = re.fullmatch(r"\\begin\{(\w+)\}(.*)\\end\{\1\}", s)
    if not m:
        return None
    return m.group(1), [split_top(row, "&") for row in split_top(m.group(2), "\\\\")]


def _terms(s: str) -> list[str] | None:
    """A sum's signed terms (``x-1`` -> ``+x``, ``-1``), when it has two or more."""
    terms, depth, start = [], 0, 0
    for i, c in enumerate(s):
        depth += (c in "([{") - (c in ")]}")
        if c in "+-" and depth == 0 and i > 0 and s[i - 1] not in "^_([{=,\\":
            terms.append(s[start:i])
            start = i
    terms.append(s[start:])
    if len(terms) < 2 or not all(t.strip("+-") for t in terms):
        return None
    return [t if t[0] in "+-" else "+" + t for t in terms]


def same_normalised(a: str, b: str) -> bool:
    """Whether two normal forms denote the same answer (our rules, without math-verify)."""
    if a == b:
        return True
    ra, rb = rational(a), rational(b)
    if ra is not None or rb is not None:
        return ra == rb
    if _BASE.fullmatch(a) or _BASE.fullmatch(b):
        return False
    for shape in (_elements, _matrix):
        sa, sb = shape(a), shape(b)
        if sa and sb:
            return sa[0] == sb[0] and _pairwise(sa[1], sb[1])
    for shape in (_collection, _terms):
        sa, sb = shape(a), shape(b)
        if sa and sb:
            return _unordered(sa, sb)
    return False


def _same(x: str, y: str) -> bool:
    return same_normalised(normalise_math(x), normalise_math(y))


def _pairwise(xs: list, ys: list) -> bool:
    if len(xs) != len(ys):
        return False
    return all(_pairwise(x, y) if isinstance(x, list) else _same(x, y) for x, y in zip(xs, ys))


def _unordered(xs: list[str], ys: list[str]) -> bool:
    left = list(ys)
    for x in xs:
        match = next((i for i, y in enumerate(left) if _same(x, y)), None)
        if match is None:
            return False
        left.pop(match)
    return not left


def decided_without_math_verify(a: str, b: str) -> bool:
    """Whether our rules alone decide (exact rationals, base subscripts): math-verify would
    round decimals and drop subscripts."""
    both_rational = rational(a) is not None and rational(b) is not None
    return both_rational or bool(_BASE.fullmatch(a) or _BASE.fullmatch(b))


def math_equivalent(predicted: str, gold: str, use_math_verify: bool = True) -> bool:
    """Whether a predicted MATH answer equals the gold one. Never raises."""
    try:
        a, b = normalise_math(predicted), normalise_math(gold)
        if same_normalised(a, b):
            return True
        if decided_without_math_verify(a, b):
            return False
    except Exception:  # a pathological string: fall through to math-verify, else wrong
        pass
    return use_math_verify and _math_verify(predicted, gold)


def math_verify_version() -> str | None:
    """The installed math-verify's version, or None (it changes which answers count as equal)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("math-verify") if math_verify_available() else None
    except PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def warn_once_without_math_verify() -> None:
    """One warning per session: equivalence falls back to our own rules."""
    global _warned
    if not _warned and not math_verify_available():
        _warned = True
        warnings.warn("math-verify is not installed: MATH answers are compared by pytest-redline's own rules "
                      "only (pip install 'pytest-redline[math]' adds symbolic equivalence)", stacklevel=3)


def _timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parsed_gold(gold: str) -> tuple:
    from math_verify import parse

    return tuple(parse("\\boxed{" + gold + "}", parsing_timeout=_timeout()))


def _math_verify(predicted: str, gold: str) -> bool:
    if not math_verify_available():
        return False
    from math_verify import parse, verify

    try:
        gold_parsed = list(_parsed_gold(gold))
        predicted_parsed = parse("\\boxed{" + predicted + "}", parsing_timeout=_timeout())
        return bool(gold_parsed and predicted_parsed and verify(
            gold_parsed, predicted_parsed, float_rounding=FLOAT_ROUNDING, timeout_seconds=_timeout()))
    except Exception:  # math-verify's own errors, sympy's, or a timeout: not shown equal
        return False
