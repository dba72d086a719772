r"""Final answers: extracting them from model output and deciding whether two are the same.

GSM8K: a number. The prediction is the first number after the last ``####`` if there is
one, else after the last "The answer is", else the last number in the text. Commas, ``$``,
units and trailing zeros don't matter: the comparison is exact on the decimal value.

MATH: the content of the last ``\boxed{...}`` (braces nested to any depth). Two answers are the
same when their normal forms (:func:`normalise_math`) are equal, or they are both exact
rationals of equal value, or both are tuples/intervals with the same brackets whose elements
are pairwise the same, or, when the optional ``math-verify`` package is installed, when it says
they are equivalent. Every function here returns ``None`` or ``False`` on malformed input; none
raises.
"""
from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation
from fractions import Fraction

# --- GSM8K -----------------------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.])-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\$?\.\d+")
_MARKERS = ("####", "the answer is")


def numbers(text: str) -> list[Decimal]:
    """Every number in ``text``, in order: ``$1,234.50`` -> ``1234.50``, ``-3`` -> ``-3``."""
    text = text.replace("\u2212", "-")  # the Unicode minus sign
    return [Decimal(m.group().replace(",", "").replace("$", "")) for m in _NUMBER.finditer(text)]


def gsm8k_answer(text: str) -> Decimal | None:
    """The predicted number: after the last ``####``, else "The answer is", else the last one."""
    lowered = text.lower()
    for marker in _MARKERS:
        at = lowered.rfind(marker)
        if at >= 0:
            found = numbers(text[at + len(marker):])
            if found:
                return found[0]
    found = numbers(text)
    return found[-1] if found else None


def gsm8k_gold(solution: str) -> Decimal:
    """The gold number of a GSM8K reference solution (``... #### 18``)."""
    if "####" not in solution:
        raise ValueError(f"a GSM8K solution ends with '#### <number>', got {solution[-60:]!r}")
    found = numbers(solution.rsplit("####", 1)[1])
    if not found:
        raise ValueError(f"no number after '####' in {solution[-60:]!r}")
    return found[0]


def gsm8k_correct(text: str, gold: str) -> bool:
    """Whether the prediction in ``text`` equals ``gold`` (a number, as a string) exactly."""
    predicted = gsm8k_answer(text)
    return predicted is not None and predicted == Decimal(gold)


# --- MATH ------------------------------------------------------------------------------------

_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``, or ``\boxed 5``), or None."""
    starts = [m.end() for m in _BOX.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{":  # \boxed 5: up to the next space or $
        return re.match(r"[^\s$]*", text[i:]).group() or None
    depth = 0
    j = i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2  # an escaped character, \{ or \} included, never opens or closes
            continue
        depth += (c == "{") - (c == "}")
        if depth == 0:
            return text[i + 1 : j]
        j += 1
    return None  # unbalanced: cut off mid-answer


def normalise_math(answer: str) -> str:
    r"""A normal form of a MATH answer, for string comparison.

    ``\dfrac``/``\tfrac`` -> ``\frac``; ``\frac12`` -> ``\frac{1}{2}``; ``\sqrt2`` -> ``\sqrt{2}``;
    ``a/b`` of integers -> ``\frac{a}{b}``; no ``\left``/``\right``, ``\!``, ``\,``, spaces,
    ``^\circ``, ``\$``, ``$``, ``\%``; a trailing unit ``\text{ cm}`` dropped, other ``\text{...}``
    (and ``\textbf``, ``\mbox``, ``\mathrm``) unwrapped; ``x=5`` -> ``5`` (a name of at most two
    characters); thousands separators and a trailing period dropped. The rules are applied until
    nothing changes (one rule can expose another's pattern, as ``1/2.`` or ``x=y=3`` do), so the
    normal form is a fixed point.
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
    s = re.split(r"\\(?:text|mbox)\{ ", s, maxsplit=1)[0] if re.search(r"\S\s*\\(?:text|mbox)\{ ", s) else s
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm|mathbf)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\displaystyle(?![a-zA-Z])", "", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\[!,;: ]|~", "", s).replace(" ", "")
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"^(-?\d+)/(\d+)$", r"\\frac{\1}{\2}", s)
    s = re.sub(r"^[a-zA-Z]\w?=(?!=)", "", s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s.rstrip(".")


def _rational(s: str) -> Fraction | None:
    r"""``s`` (normalised) as an exact rational: ``12``, ``-0.35625``, ``\frac{3}{4}``, ``-\frac{3}{4}``."""
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    try:
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)", s):
            return Fraction(Decimal(s))
    except (ZeroDivisionError, InvalidOperation, ValueError):
        pass
    return None


def _elements(s: str) -> tuple[str, list[str]] | None:
    """A tuple or interval ``(a,b]`` as (its brackets, its top-level elements), else None."""
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]":
        return None
    parts, depth, start = [], 0, 1
    for i, c in enumerate(s[1:-1], start=1):
        depth += (c in "([{") - (c in ")]}")
        if depth < 0:
            return None  # "(1)+(2)" is not one tuple
        if c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:-1])
    return (s[0] + s[-1], parts) if len(parts) > 1 else None


def same_normalised(a: str, b: str) -> bool:
    """Whether two normal forms denote the same answer (without math-verify)."""
    if a == b:
        return True
    ra, rb = _rational(a), _rational(b)
    if ra is not None and rb is not None:
        return ra == rb
    ea, eb = _elements(a), _elements(b)
    if ea and eb and ea[0] == eb[0] and len(ea[1]) == len(eb[1]):
        return all(same_normalised(normalise_math(x), normalise_math(y)) for x, y in zip(ea[1], eb[1]))
    return False


def math_equivalent(predicted: str, gold: str, use_math_verify: bool = True) -> bool:
    """Whether a predicted MATH answer equals the gold one. Never raises."""
    try:
        if same_normalised(normalise_math(predicted), normalise_math(gold)):
            return True
    except Exception:  # a pathological string: fall through to math-verify, else wrong
        pass
    return use_math_verify and _math_verify(predicted, gold)


def math_correct(text: str, gold: str, use_math_verify: bool = True) -> bool:
    """Whether the last ``\\boxed{}`` of ``text`` is the gold answer. Never raises."""
    predicted = last_boxed(text)
    return bool(predicted and predicted.strip()) and math_equivalent(predicted, gold, use_math_verify)


def math_verify_version() -> str | None:
    """The installed math-verify's version, or None (it changes which answers count as equal)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("math-verify") if math_verify_available() else None
    except PackageNotFoundError:
        return None


def math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def _math_verify(predicted: str, gold: str) -> bool:
    if not math_verify_available():
        return False
    from math_verify import parse, verify

    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=timeout)
        predicted_parsed = parse("\\boxed{" + predicted + "}", parsing_timeout=timeout)
        return bool(gold_parsed and predicted_parsed and verify(gold_parsed, predicted_parsed, timeout_seconds=timeout))
    except Exception:  # math-verify's own errors, sympy's, or a timeout: not shown equal
        return False
