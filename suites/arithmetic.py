"""The synthetic arithmetic suite: seeded problems with step-by-step solutions and integer answers.

Four families, each written so that every step needs only nearby context:

- ``add``: ``347+589=`` -> ``7+9+0=16,4+8+1=13,3+5+1=09#936`` (columns from the lowest digit,
  each ``a+b+carry=two digits``);
- ``sub``: ``583-247=`` -> ``13-0-7=6,8-1-4=3,5-0-2=3#336`` (a borrowed column shows ``1x``,
  each column subtracts the borrow, then the digit);
- ``mul``: ``347*6=`` -> ``7*6+0=42,4*6+4=28,3*6+2=20#2082`` (a product of a 2-3 digit number
  and one digit, columns with carries);
- ``odd``: ``1+3+..+9=`` -> ``1+3=4,4+5=9,9+7=16,16+9=25#25`` (running sums of consecutive odd
  numbers; the sum of the first N odd numbers when it starts at 1).

The final answer follows the last ``#``. Operands have 2 or 3 digits, so difficulty varies within
and across families. Splits are disjoint by construction: a problem's split is a hash of the
problem itself (10 % calibration, 10 % test, 80 % train), so a calibration problem can never be
drawn for training, whatever the seeds.
"""
from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass
from typing import Iterator

from pytest_redline.contracts import Judgement, Prompt
from pytest_redline.suites.base import MARKER, NO_ANSWER, chat

FAMILIES = ("add", "sub", "mul", "odd")
FAMILY_WEIGHTS = (0.3, 0.3, 0.3, 0.1)
SPLITS = {"train": "train", "calibration": "cal", "test": "test"}
ANSWER_MARK = "#"


@dataclass(frozen=True)
class Problem:
    family: str
    prompt: str  # e.g. "347+589="
    solution: str  # the steps and "#<answer>"
    answer: int

    @property
    def split(self) -> str:
        return split_of(self.prompt)


def split_of(prompt: str) -> str:
    """The split a problem belongs to: a fixed function of its text."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") % 10
    return "calibration" if bucket == 0 else "test" if bucket == 1 else "train"


DIGITS = (2, 3)  # an operand's number of digits
MULTIPLIERS = range(2, 10)  # mul's one-digit factor
ODD_STARTS, ODD_COUNTS = range(1, 16, 2), range(3, 8)  # odd's first number and how many
#: Every split holds more distinct problems than this (tests/suites/test_arithmetic.py counts
#: them): a larger n is checked against :func:`distinct_count` before any problem is drawn.
FEWEST_DISTINCT = 140_000


def _digits(rng: random.Random) -> int:
    n = rng.choice(DIGITS)
    return rng.randint(10 ** (n - 1), 10**n - 1)


def _reversed_digits(x: int, width: int) -> list[int]:
    return [int(c) for c in reversed(str(x).zfill(width))]


def addition(a: int, b: int) -> Problem:
    width = max(len(str(a)), len(str(b)))
    steps, carry = [], 0
    for x, y in zip(_reversed_digits(a, width), _reversed_digits(b, width)):
        total = x + y + carry
        steps.append(f"{x}+{y}+{carry}={total:02d}")
        carry = total // 10
    return Problem("add", f"{a}+{b}=", ",".join(steps) + f"{ANSWER_MARK}{a + b}", a + b)


def subtraction(a: int, b: int) -> Problem:
    if a < b:
        raise ValueError(f"subtraction needs a >= b, got a={a}, b={b}")
    width = len(str(a))
    steps, borrow = [], 0
    for x, y in zip(_reversed_digits(a, width), _reversed_digits(b, width)):
        digit = x - borrow - y
        top = f"1{x}" if digit < 0 else f"{x}"
        steps.append(f"{top}-{borrow}-{y}={digit % 10}")
        borrow = int(digit < 0)
    return Problem("sub", f"{a}-{b}=", ",".join(steps) + f"{ANSWER_MARK}{a - b}", a - b)


def product(a: int, b: int) -> Problem:
    if not 0 <= b <= 9:
        raise ValueError(f"product needs a one-digit multiplier, got b={b}")
    steps, carry = [], 0
    for x in _reversed_digits(a, len(str(a))):
        total = x * b + carry
        steps.append(f"{x}*{b}+{carry}={total:02d}")
        carry = total // 10
    return Problem("mul", f"{a}*{b}=", ",".join(steps) + f"{ANSWER_MARK}{a * b}", a * b)


def odd_sum(start: int, count: int) -> Problem:
    if start % 2 != 1 or count < 2:
        raise ValueError(f"odd_sum needs an odd start and count >= 2, got start={start}, count={count}")
    odds = [start + 2 * i for i in range(count)]
    steps, total = [], odds[0]
    for odd in odds[1:]:
        steps.append(f"{total}+{odd}={total + odd}")
        total += odd
    return Problem("odd", f"{odds[0]}+{odds[1]}+..+{odds[-1]}=", ",".join(steps) + f"{ANSWER_MARK}{total}", total)


def sample_problem(rng: random.Random) -> Problem:
    """One problem from the mixture of families (any split)."""
    family = rng.choices(FAMILIES, weights=FAMILY_WEIGHTS)[0]
    if family == "add":
        return addition(_digits(rng), _digits(rng))
    if family == "sub":
        a, b = _digits(rng), _digits(rng)
        return subtraction(max(a, b), min(a, b))
    if family == "mul":
        return product(_digits(rng), rng.randint(MULTIPLIERS.start, MULTIPLIERS.stop - 1))
    return odd_sum(rng.randrange(ODD_STARTS.start, ODD_STARTS.stop, ODD_STARTS.step),
                   rng.randint(ODD_COUNTS.start, ODD_COUNTS.stop - 1))


def every_prompt() -> Iterator[str]:
    """The prompt of every problem :func:`sample_problem` can draw, each once."""
    operands = range(10 ** (min(DIGITS) - 1), 10 ** max(DIGITS))
    for a in operands:
        for b in operands:
            yield f"{a}+{b}="
            if a >= b:
                yield f"{a}-{b}="
        for b in MULTIPLIERS:
            yield f"{a}*{b}="
    for start in ODD_STARTS:
        for count in ODD_COUNTS:
            yield odd_sum(start, count).prompt


@functools.cache
def distinct_count(split: str) -> int:
    """How many distinct problems the split holds: the largest n it can give (about 2 s of CPU)."""
    _check_split(split)
    return sum(1 for prompt in every_prompt() if split_of(prompt) == split)


def stream(split: str, seed: int) -> Iterator[Problem]:
    """An endless seeded stream of the split's problems (repeats possible): the training data."""
    _check_split(split)
    rng = random.Random(seed)
    while True:
        problem = sample_problem(rng)
        if problem.split == split:
            yield problem


def distinct_problems(split: str, n: int, seed: int) -> list[Problem]:
    """``n`` distinct problems of the split, in the order the seeded stream first yields them."""
    seen: dict[str, Problem] = {}
    for attempts, problem in enumerate(stream(split, seed)):
        seen.setdefault(problem.prompt, problem)
        if len(seen) == n:
            return list(seen.values())
        if attempts > 1000 * n:
            raise ValueError(f"arithmetic: split {split!r} has fewer than n={n} distinct problems")
    raise AssertionError("unreachable")


def final_answer(text: str) -> int | None:
    """The integer after the last ``#``, or None when the text has no well-formed answer."""
    tail = text.rsplit(ANSWER_MARK, 1)
    if len(tail) != 2:
        return None
    match = re.fullmatch(r"\s*(-?\d{1,12})\s*", tail[1])
    return int(match.group(1)) if match else None


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"arithmetic: suite_args.split: expected one of {sorted(SPLITS)}, got {split!r}")


class ArithmeticSuite:
    """``ArithmeticSuite(split="calibration", n=512, seed=0)``: n distinct problems of one split."""

    name = "arithmetic"

    def __init__(self, split: str = "calibration", n: int = 512, seed: int = 0):
        _check_split(split)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"arithmetic: suite_args.n: expected int >= 1, got {n!r}")
        if n > FEWEST_DISTINCT and n > distinct_count(split):
            raise ValueError(f"arithmetic: suite_args.n: expected at most {distinct_count(split)} (the distinct problems "
                             f"of split {split!r}), got {n}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"arithmetic: suite_args.seed: expected int, got {seed!r}")
        self.split, self.n, self.seed = split, n, seed
        self._problems = distinct_problems(split, n, seed)

    def problems(self) -> list[Problem]:
        return list(self._problems)

    def prompts(self) -> list[Prompt]:
        tag = SPLITS[self.split]
        return [
            Prompt(
                id=f"arithmetic/{tag}/{i}",
                text=p.prompt,
                messages=chat(p.prompt),
                meta={"family": p.family, "answer": p.answer, "solution": p.solution},
            )
            for i, p in enumerate(self._problems)
        ]

    def judge(self, prompt: Prompt, text: str, finish_reason: str | None = None) -> Judgement:
        """The integer after the last ``#`` (rule "marker"), else none ("no answer"). The format
        is strict (nothing but the integer may follow), so the finish reason changes nothing."""
        answer = final_answer(text) if isinstance(text, str) else None
        if answer is None:
            return Judgement(False, None, NO_ANSWER)
        return Judgement(answer == prompt.meta["answer"], str(answer), MARKER)

    def score(self, prompt: Prompt, text: str) -> bool:
        """Exact integer match of the final answer; malformed output is wrong, never an error."""
        return final_answer(text) == prompt.meta["answer"]
