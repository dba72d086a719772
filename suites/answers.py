r"""Final answers: one per output, or none.

An output has a final answer when exactly one can be read from it under these rules, else it
scores wrong whatever the gold answer is. The rule that decided is reported
(:mod:`pytest_redline.suites.base`: ``marker``, ``boxed``, ``last number``, ``no answer``,
``revised``, ``hedged``, ``truncated``).

GSM8K (:func:`gsm8k_extract`), a number:

- Markers: ``####``, "answer is" / "answer:" (any case), and ``\boxed{...}``. The answer of a
  marker is the number right after it (``$``, ``*``, ``:``, ``\boxed{`` may come between), or
  an arithmetic chain starting there: ``15 + 3 = 18`` gives 18, ``6 * 3`` gives 18, ``3/4`` is
  a fraction. A marker followed by anything else ("The answer is nineteen.") has no answer.
- The last marker decides, and it must have an answer: it never falls back to another number.
  Every marker with an answer must agree with it, and no sentence after the answer (nor the
  rest of its own, outside parentheses) may conclude another number: one with a conclusion
  or revision word ("so", "therefore", "total", "it is", "wait", "actually", "hmm", ...), or
  a bare number ("15."), whose last number differs; otherwise the output was ``revised`` ("#### 18 Hmm, 15.", "The answer
  is 18. Wait, ... so it is 15."). An explanation that concludes nothing may follow.
- Two different numbers joined by "or"/"either" in the answer's sentence (or box), or
  "between 18 and 19", are a hedge.
- Without a marker, an output known to have ended on its own (finish reason ``"eos"`` or
  ``"stop"``) is read by its last number, with the same hedge rule on its last sentence; one
  that hit the token limit (``"length"``) has no answer (``truncated``), and so has one whose
  final answer's sentence was still open when the limit hit. When the finish reason is not
  known (None, as with plain ``score()``), an output without a marker has no answer: it may
  have been cut off.
- Numbers compare exactly (as fractions): ``1,234.00`` = ``1234``, ``0.5`` = ``1/2``.

MATH (:func:`math_extract`): the content of the last ``\boxed{...}`` (braces nested to any
depth). An earlier box with a different answer is a revision (a hedge when only "or" stands
between them), and so is, after the last box, a marked different answer ("the answer is
$6$") or, for a numeric answer, a different last number after a sentence that opens with a
revision cue ("Wait", "Actually", "Hmm", "Oops", "Correction", "Sorry", "No"); "or"
inside the box, or right after it with another answer ("(or possibly $6$)"), is a hedge; a
box cut open by the token limit is ``truncated``. Without a box, "The final answer is $X$"
gives X (the minerva format). Whether the answer equals the gold one is
:func:`pytest_redline.suites.equivalence.math_equivalent`.

Every function here returns a result, never raises, on any string.
"""
from __future__ import annotations

import functools
import operator
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Callable

from pytest_redline.suites.base import BOXED, HEDGED, LAST_NUMBER, MARKER, NO_ANSWER, REVISED, TRUNCATED
from pytest_redline.suites.equivalence import (  # noqa: F401  (also importable from here, as before)
    math_equivalent,
    math_verify_available,
    math_verify_version,
    normalise_math,
    rational,
    same_normalised,
)

LENGTH = "length"  # Generation.finish_reason of an output cut by the token limit
ENDED = ("eos", "stop")  # finish reasons of an output known to have ended on its own


@dataclass(frozen=True)
class Extracted:
    """The final answer read from an output: as written (None: none), and the deciding rule."""

    answer: str | None
    rule: str
    value: Fraction | None = None  # GSM8K: the answer's exact value


# --- numbers and arithmetic chains -----------------------------------------------------------

_NUM = r"\d{1,3}(?:,\d{3})+(?![\d,])(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
_TOKEN = re.compile(rf"\s*(?:(?P<num>\$?\s?(?:{_NUM}))|(?P<op>[-+*/()=])|(?P<x>x)(?=\s*[\d(]))")
_NUMBER = re.compile(rf"(?<![\w.])-?\$?(?:{_NUM})")
_FILLER = re.compile(r"(?:\s|[:*_=]|\\\(|\\\[|\$|\\boxed\s*\{|\\fbox\s*\{|\\text(?:bf)?\{|\\mathbf\{|\{)*")
_DISJUNCTION = re.compile(r"(?<![A-Za-z\\])(?:or|either)(?![A-Za-z])")
_BETWEEN = re.compile(rf"\bbetween\s+\$?((?:{_NUM}))\s+and\s+\$?((?:{_NUM}))", re.I)
_CONCLUSION = re.compile(r"\b(?:so|thus|therefore|hence|actually|wait|hmm|oops|sorry|correction|instead|answer|total"
                         r"|final|result|equals?|(?:it|which|that|this)(?:'s| is| was))\b|\bno\b,", re.I)
_OWN_CONCLUSION = re.compile(rf"{_CONCLUSION.pattern}|=|\b(?:is|are|was|gives?|makes?)\b", re.I)  # in the answer's sentence
_REVISION = re.compile(r"(?:^|[.!?]\s|\n)\s*\W{0,2}(?:wait|actually|correction|oops|sorry|hmm|no)\b", re.I)  # a sentence's start
_MARKED_AFTER = re.compile(r"\banswer\s+is\s*:?\s*\$+([^$]+)\$", re.I)
_SENTENCE_END = re.compile(r"\n|[.!?;](?=\s|$)")


def _clean(text: str) -> str:
    r"""``text`` with LaTeX arithmetic as plain arithmetic: ``\frac{3}{4}`` -> ``(3/4)``, ``\times`` -> ``*``."""
    s = text.replace("\u2212", "-").replace("\\$", "$").replace("{,}", "").replace("\\%", "%").replace("$-", "-$")
    s = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1/\2)", s)
    s = re.sub(r"\\(?:times|cdot)(?![a-zA-Z])|[\u00d7\u00b7]", "*", s)
    s = re.sub(r"\\div(?![a-zA-Z])|\u00f7", "/", s)
    return re.sub(r"\\(?:left|right)(?![a-zA-Z])|\\[!,;]", "", s)


def _value(token: str) -> Fraction:
    digits = re.sub(r"[\s$,]", "", token)
    negative = digits.count("-") % 2 == 1
    return -Fraction(Decimal(digits.replace("-", ""))) if negative else Fraction(Decimal(digits.replace("-", "")))


_OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "x": operator.mul, "/": operator.truediv}


class _Chain:
    """A recursive-descent reader of ``a op b ... = c = d`` at the start of a string."""

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while True:
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                break
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind), m.end()))
            pos = m.end()
        self.i = 0

    def peek(self, *ops: str) -> bool:
        if self.i >= len(self.tokens):
            return False
        kind, text, _ = self.tokens[self.i]
        return (kind == "op" and text in ops) or (kind == "x" and "*" in ops)

    def factor(self) -> Fraction | None:
        if self.i >= len(self.tokens):
            return None
        kind, text, _ = self.tokens[self.i]
        if kind == "num":
            self.i += 1
            return _value(text)
        if kind == "op" and text in "+-":
            self.i += 1
            inner = self.factor()
            if inner is not None:
                return -inner if text == "-" else inner
            self.i -= 1
        if kind == "op" and text == "(":
            start = self.i
            self.i += 1
            inner = self.expr()
            if inner is not None and self.peek(")"):
                self.i += 1
                return inner
            self.i = start
        return None

    def binary(self, operand: Callable[[], Fraction | None], ops: str) -> Fraction | None:
        value = operand()
        while value is not None and self.peek(*ops):
            back = self.i
            op = self.tokens[self.i][1]
            self.i += 1
            right = operand()
            if right is None or (op == "/" and right == 0):
                self.i = back
                break
            value = _OPERATIONS[op](value, right)
        return value

    def term(self) -> Fraction | None:
        return self.binary(self.factor, "*/")

    def expr(self) -> Fraction | None:
        return self.binary(self.term, "+-")

    def chain(self) -> tuple[Fraction, int] | None:
        """The value after the chain's last ``=`` and where the chain ends, or None."""
        value = self.expr()
        if value is None:
            return None
        while self.peek("="):
            back = self.i
            self.i += 1
            right = self.expr()
            if right is None:
                self.i = back
                break
            value = right
        return value, self.tokens[self.i - 1][2]


def read_number(text: str) -> tuple[Fraction, int] | None:
    """The value of the number or arithmetic chain at the start of ``text`` (after fillers such as
    ``$``, ``:``, ``**``, ``\\boxed{``) and where it ends, or None."""
    skip = _FILLER.match(text).end()
    found = _Chain(text[skip:]).chain()
    return (found[0], skip + found[1]) if found else None


def numbers(text: str) -> list[Fraction]:
    """Every number in ``text``, in order: ``$1,234.50`` -> ``1234.5``, ``-3`` -> ``-3``."""
    return [_value(m.group()) for m in _NUMBER.finditer(_clean(text))]


def show(value: Fraction) -> str:
    """A value as written in an answer: ``18``, ``0.75``, ``1/3``."""
    if value.denominator == 1:
        return str(value.numerator)
    try:
        exact = Decimal(value.numerator) / Decimal(value.denominator)
        if Fraction(exact) == value:
            return format(exact.normalize(), "f")
    except InvalidOperation:
        pass
    return f"{value.numerator}/{value.denominator}"


def _hedged(text: str, answer: Fraction | None = None) -> bool:
    """Whether ``text`` offers a second candidate with "or"/"either": a number right after the
    word that differs from ``answer``, or (``answer`` None) from the number right before it."""
    for m in _DISJUNCTION.finditer(text):
        after = numbers(text[m.end():])[:1]
        before = [answer] if answer is not None else numbers(text[: m.start()])[-1:]
        if after and before and after[0] != before[0]:
            return True
    return any(_value(m.group(1)) != _value(m.group(2)) for m in _BETWEEN.finditer(text))  # "between 18 and 19"


# --- GSM8K -----------------------------------------------------------------------------------

_MARKER = re.compile(r"####|\banswer(?:\*\*)?\s*(?:is\b|:|=)|\\(?:boxed|fbox)\s*(?=\{)", re.I)


@dataclass(frozen=True)
class _Read:
    """One marker's reading: its value (None: nothing parseable), the text after the value
    (for the hedge rule), where the marker's text ends, and whether it ended before the output."""

    value: Fraction | None
    rest: str
    end: int
    closed: bool
    boxed: bool


def _read(span: str, end: int, closed: bool, boxed: bool) -> _Read:
    cleaned = _clean(span)
    found = read_number(cleaned)
    if found is None:
        return _Read(None, cleaned, end, closed, boxed)
    return _Read(found[0], cleaned[found[1]:], end, closed, boxed)


def _read_marker(text: str, m: re.Match) -> _Read:
    if m.group().startswith("\\"):
        content, end = braced(text, m.end())
        return _read(content or "", end, content is not None, True)
    if m.group() == "####":
        stop = text.find("\n", m.end())
    else:
        after = _SENTENCE_END.search(text, m.end())
        stop = after.start() if after else -1
    end = len(text) if stop < 0 else stop
    return _read(text[m.end():end], end, stop >= 0, False)


def gsm8k_extract(text: str, finish_reason: str | None = None) -> Extracted:
    """The final number of a GSM8K output under the rules of the module docstring."""
    reads = [_read_marker(text, m) for m in _MARKER.finditer(text)]
    if not reads:
        return _last_number(text, finish_reason)
    last = reads[-1]
    if last.value is None:
        return Extracted(None, TRUNCATED if finish_reason == LENGTH and not last.closed else NO_ANSWER)
    answer = show(last.value)
    if any(r.value is not None and _hedged(r.rest, r.value) for r in reads):
        return Extracted(answer, HEDGED, last.value)
    rest = re.sub(r"\([^()]*\)", " ", last.rest)  # "18 (6 x 3)": the parentheses explain
    if (any(r.value is not None and r.value != last.value for r in reads)
            or _concludes_otherwise(rest, last.value, bare=False) or _concludes_otherwise(text[last.end:], last.value)):
        return Extracted(answer, REVISED, last.value)
    if finish_reason == LENGTH and not last.closed:
        return Extracted(answer, TRUNCATED, last.value)
    return Extracted(answer, BOXED if last.boxed else MARKER, last.value)


def _concludes_otherwise(after: str, answer: Fraction, bare: bool = True) -> bool:
    """Whether a sentence after the answer concludes another number: it is a bare number ("15.",
    "$15 dollars") or has a conclusion or revision word ("so", "therefore", "total", "wait",
    "actually", ...), and its last number is not the answer. Explanations without one ("She
    sells 9 eggs at $2 each.") conclude nothing. In the rest of the answer's own sentence
    (``bare`` False) "is", "=", "gives", "makes" conclude too ("18 minus 3, which is 15"), and
    a bare number does not ("The answer is 18, not 19.")."""
    cleaned, start = _clean(after), 0
    for end in [m.end() for m in _SENTENCE_END.finditer(_clean(after))] + [len(cleaned)]:
        sentence, start = cleaned[start:end], end
        alone = bare and len(re.findall(r"[A-Za-z]+", _NUMBER.sub(" ", sentence))) <= 2  # "15.", "$15 dollars"
        found = numbers(sentence) if alone or (_CONCLUSION if bare else _OWN_CONCLUSION).search(sentence) else []
        if found and found[-1] != answer:
            return True
    return False


def _last_number(text: str, finish_reason: str | None) -> Extracted:
    if finish_reason not in ENDED:  # cut by the limit, or not known to have ended (plain score())
        return Extracted(None, TRUNCATED if finish_reason == LENGTH else NO_ANSWER)
    found = list(_NUMBER.finditer(_clean(text)))
    if not found:
        return Extracted(None, NO_ANSWER)
    cleaned = _clean(text)
    value = _value(found[-1].group())
    ends = [m.end() for m in _SENTENCE_END.finditer(cleaned, 0, found[-1].start())]
    sentence = cleaned[ends[-1] if ends else 0:]
    if _hedged(sentence):
        return Extracted(show(value), HEDGED, value)
    return Extracted(show(value), LAST_NUMBER, value)


def gsm8k_gold(solution: str) -> Decimal:
    """The gold number of a GSM8K reference solution (``... #### 18``)."""
    if "####" not in solution:
        raise ValueError(f"a GSM8K solution ends with '#### <number>', got {solution[-60:]!r}")
    found = _NUMBER.search(_clean(solution.rsplit("####", 1)[1]))
    if not found:
        raise ValueError(f"no number after '####' in {solution[-60:]!r}")
    return Decimal(re.sub(r"[\s$,]", "", found.group()))


def gsm8k_answer(text: str, finish_reason: str | None = None) -> Decimal | Fraction | None:
    """The final number of a GSM8K output (a Decimal when it has a finite decimal form), or None
    when the rules give it none (no answer, revised, hedged, truncated)."""
    found = gsm8k_extract(text, finish_reason)
    if found.rule not in (MARKER, BOXED, LAST_NUMBER):
        return None
    shown = show(found.value)
    return found.value if "/" in shown else Decimal(shown)


def gsm8k_correct(text: str, gold: str, finish_reason: str | None = None) -> bool:
    """Whether ``text`` has one final number, equal to ``gold`` (a number, as a string) exactly."""
    found = gsm8k_extract(text, finish_reason)
    return found.rule in (MARKER, BOXED, LAST_NUMBER) and found.value == Fraction(Decimal(gold))


# --- MATH ------------------------------------------------------------------------------------

_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_MATH_MARKER = re.compile(r"\banswer\s*(?:is\b|:)", re.I)


def braced(text: str, i: int) -> tuple[str | None, int]:
    r"""The content of the brace group opening at ``text[i]`` (after spaces) and the index after
    it, or (None, len(text)) when it is unbalanced (cut off). ``\{``, ``\}`` never count."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None, len(text)
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        depth += (c == "{") - (c == "}")
        if depth == 0:
            return text[i + 1: j], j + 1
        j += 1
    return None, len(text)


def boxes(text: str) -> list[tuple[int, str | None, int]]:
    r"""Every ``\boxed{...}``/``\fbox{...}`` (or ``\boxed 5``): (start, content or None, end)."""
    found = []
    for m in _BOX.finditer(text):
        rest = text[m.end():]
        if rest.lstrip(" ")[:1] not in ("{", ""):
            bare = re.match(r"\s*([^\s$]*)", rest)
            found.append((m.start(), bare.group(1) or None, m.end() + bare.end()))
        else:
            content, end = braced(text, m.end())
            found.append((m.start(), content, end))
    return found


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``, or ``\boxed 5``), or None."""
    found = boxes(text)
    return found[-1][1] if found else None


def math_extract(text: str, same: Callable[[str, str], bool], finish_reason: str | None = None) -> Extracted:
    """The final answer of a MATH output; ``same(a, b)`` decides whether two boxes agree."""
    found = boxes(text)
    if not found:
        return _math_marker(text, finish_reason)
    start, answer, _ = found[-1]
    if answer is None or not answer.strip():
        return Extracted(None, TRUNCATED if finish_reason == LENGTH and answer is None else NO_ANSWER)
    if _DISJUNCTION.search(answer):
        return Extracted(answer, HEDGED)
    for earlier_start, earlier, earlier_end in found[:-1]:
        if earlier and earlier.strip() and not same(earlier, answer):
            between = text[earlier_end:start]
            joined = _DISJUNCTION.search(between) and not _SENTENCE_END.search(between)
            return Extracted(answer, HEDGED if joined else REVISED)
    after = text[found[-1][2]:]
    if _hedged_after(after, answer, same):
        return Extracted(answer, HEDGED)
    return Extracted(answer, REVISED if _revised_after(after, answer, same) else BOXED)


def _hedged_after(after: str, answer: str, same: Callable[[str, str], bool]) -> bool:
    """Right after the box, "or" and another answer: ``\\boxed{5} (or possibly $6$)``."""
    m = re.match(r"[\s$.,;:(]*(?:or|either)(?![A-Za-z])[^$\d.!?\n]{0,30}(?:\$([^$]+)\$|(-?(?:" + _NUM + ")))", after)
    return m is not None and not same(m.group(1) or m.group(2), answer)


def _revised_after(after: str, answer: str, same: Callable[[str, str], bool]) -> bool:
    """After the last box: another answer after a marker ("the answer is $6$"), or, for a
    numeric answer, a different last number after a sentence that opens with a revision cue
    ("Wait, ... it is 6")."""
    if any(not same(m.group(1), answer) for m in _MARKED_AFTER.finditer(after)):
        return True
    cue = _REVISION.search(after)
    value = rational(normalise_math(answer)) if cue else None
    later = numbers(after[cue.end():]) if value is not None else []
    return bool(later) and later[-1] != value


def _math_marker(text: str, finish_reason: str | None) -> Extracted:
    markers = list(_MATH_MARKER.finditer(text))
    if not markers:
        return Extracted(None, TRUNCATED if finish_reason == LENGTH else NO_ANSWER)
    rest = text[markers[-1].end():]
    dollars = re.match(r"[\s:*]*\$+([^$]+)\$", rest)
    end = _SENTENCE_END.search(rest)
    if dollars:
        answer = dollars.group(1)
    elif end is None and finish_reason == LENGTH:
        return Extracted(None, TRUNCATED)
    else:
        answer = rest[: end.start() if end else len(rest)].strip(" :*$.")
    if not answer.strip():
        return Extracted(None, NO_ANSWER)
    return Extracted(answer, HEDGED if _DISJUNCTION.search(answer) else MARKER)


def math_correct(text: str, gold: str, use_math_verify: bool = True, finish_reason: str | None = None) -> bool:
    """Whether a MATH output has one final answer, equal to ``gold``. Never raises."""
    try:
        same = functools.partial(math_equivalent, use_math_verify=use_math_verify)
        found = math_extract(text, same, finish_reason)
        return found.rule in (MARKER, BOXED) and same(found.answer, gold)
    except Exception:
        return False
