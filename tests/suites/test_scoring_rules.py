"""One answer, or none: the GSM8K and MATH-500 scorers on the styles real models write.

Every style that must score wrong (revisions, hedges, markers without an answer, truncation,
another problem after a stop string) and every equivalent form that must stay correct is a
row of a table; the laws (appending a different final answer, cutting before the final
answer, a wrong digit) are hypothesis properties.
"""
from __future__ import annotations

import warnings
from decimal import Decimal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_redline.contracts import Judgement, Prompt, judge
from pytest_redline.suites import equivalence
from pytest_redline.suites.equivalence import math_equivalent, math_verify_available
from pytest_redline.suites.math import GSM8K, MATH500, MathSuite
from pytest_redline.suites.union import Union

GSM8K_SUITE = GSM8K(ids=[0])
MATH_SUITE = MATH500(count=1)
OWN_RULES = MATH500(count=1, math_verify=False)


def gsm8k_prompt(gold: str) -> Prompt:
    return Prompt("gsm8k/0", "Question: ...\nAnswer:", meta={"answer": gold}, stop=GSM8K.stop)


def math_prompt(gold: str) -> Prompt:
    return Prompt("math500/x", "Problem: ...\nSolution:", meta={"answer": gold}, stop=MATH500.stop)


def gsm8k(text: str, gold: str = "18", finish: str | None = "eos") -> Judgement:
    return GSM8K_SUITE.judge(gsm8k_prompt(gold), text, finish)


def math(text: str, gold: str, finish: str | None = "eos", suite: MATH500 = MATH_SUITE) -> Judgement:
    return suite.judge(math_prompt(gold), text, finish)


# --- GSM8K: the table ------------------------------------------------------------------------

@pytest.mark.parametrize("text, finish, rule", [
    # a revision after the marker
    ("The answer is 18. Wait, I misread: 5 + 10 = 15, so it is 15.", "eos", "revised"),
    ("3 + 15 = 18\n#### 18\nCorrection: she keeps 3, so #### 15", "eos", "revised"),
    ("The answer is 18.\nActually, the answer is 15.", "eos", "revised"),
    ("#### 18\n\nOn second thought the total is 15.", "eos", "revised"),
    (r"So the answer is $\boxed{18}$. Hmm, recounting: $\boxed{15}$.", "eos", "revised"),
    # a marker without a parseable answer never falls back to the last number
    ("She has 18 eggs. The answer is nineteen.", "eos", "no answer"),
    ("3 + 15 = 18. The answer is", "eos", "no answer"),
    ("3 + 15 = 18.\n####", "eos", "no answer"),
    # cut off by the token limit
    ("3 + 15 = 18. The answer is", "length", "truncated"),
    ("She makes 3 + 15 = 18 dollars, and then", "length", "truncated"),
    ("3 + 15 = 18\n#### 18", "length", "truncated"),  # the limit may have cut 180 to 18
    ("The answer is 18", "length", "truncated"),
    # hedges
    ("#### 18\n15", "eos", "revised"),
    ("The answer is 18 minus 3, which is 15.", "eos", "revised"),
    ("The answer is 18 - 3 dollars = 15 dollars.", "eos", "marker"),  # 18 - 3 is read as 15
    ("The answer is 18.\n\n**$15**", "eos", "revised"),
    ("The answer is 18 or 19.", "eos", "hedged"),
    ("So she has 18 or 19 apples.", "eos", "hedged"),
    ("#### 18 (or 19 if she eats one)", "eos", "hedged"),
    (r"The answer is $\boxed{18 \text{ or } 19}$.", "eos", "hedged"),
    ("The answer is either 18 or 19.", "eos", "no answer"),
    ("So the count is between 18 and 19.", "eos", "hedged"),
    # another problem after the stop string is never scored
    ("6 * 3 = 15\n#### 15\n\nQuestion: Tom has 18 pens.\nAnswer: #### 18", "eos", "marker"),
])
def test_wrong_styles_gsm8k(text, finish, rule):
    verdict = gsm8k(text, "18", finish)
    assert verdict.rule == rule and not verdict.correct, verdict


@pytest.mark.parametrize("text, gold, rule", [
    ("so 3 + 4 = 7\n#### 1,234", "1234", "marker"),
    ("#### 1234.00", "1234", "marker"),
    ("She pays $1,234 in total.\n#### $1,234", "1234", "marker"),
    (r"Thus $\boxed{18}$.", "18", "boxed"),
    (r"The final answer is $\boxed{18}$.", "18", "boxed"),
    ("The answer is 18 dollars.", "18", "marker"),
    ("It is 5 now. The answer is: -3.", "-3", "marker"),
    ("The answer is 15 + 3 = 18.", "18", "marker"),
    ("The answer is 6 x 3 = 18 eggs.", "18", "marker"),
    (r"The answer is $\frac{3}{4}$.", "0.75", "marker"),
    ("The answer is 3/4 of a cup.", "0.75", "marker"),
    (r"\boxed{\dfrac{1}{2}}", "0.5", "boxed"),
    ("**Answer:** 18", "18", "marker"),
    ("Final Answer: The final answer is 18. I hope it is correct.", "18", "marker"),
    ("The answer is 18.\n#### 18", "18", "marker"),
    ("The answer is 18. Check: 3 + 15 = 18.", "18", "marker"),
    ("The answer is 18.\n\nExplanation: she sells 9 eggs at $2 each.", "18", "marker"),
    ("The answer is 18, not 19.", "18", "marker"),
    ("He had 5 apples, then 12, then 7 left", "7", "last number"),
    ("Janet makes **$18** every day.", "18", "last number"),
    ("Total: 1,450,000 eggs.", "1450000", "last number"),
    ("The answer is .5", "0.5", "marker"),
    ("The answer is 18, or 18.00 dollars.", "18", "marker"),
    ("#### 18\n\nQuestion: Tom has 3 pens.", "18", "marker"),
    ("The answer is \u221218.", "-18", "marker"),
])
def test_correct_equivalent_forms_gsm8k(text, gold, rule):
    verdict = gsm8k(text, gold)
    assert verdict.correct and verdict.rule == rule, verdict


def test_wrong_no_marker_unless_known_to_have_ended_gsm8k():
    """A cut-off output's last number is often the gold one: without a marker, only an output
    known to have ended (EOS, a stop string) is read by its last number."""
    assert gsm8k("3 + 15 = 18.", finish="eos").correct and gsm8k("3 + 15 = 18.", finish="stop").correct
    assert gsm8k("3 + 15 = 18.", finish=None).rule == "no answer"
    assert gsm8k("3 + 15 = 18.", finish="length").rule == "truncated"
    assert not GSM8K_SUITE.score(gsm8k_prompt("18"), "3 + 15 = 18.")
    assert GSM8K_SUITE.score(gsm8k_prompt("18"), "3 + 15 = 18.\n#### 18")
    assert GSM8K_SUITE.judge(gsm8k_prompt("18"), "3 + 15 = 18.\n\nQuestion: 2 + 2?", "length").correct  # cut at the stop


# --- MATH: the table -------------------------------------------------------------------------

@pytest.mark.parametrize("text, gold, finish, rule", [
    (r"So $x$ is $\boxed{5 \text{ or } 6}$.", "5", "eos", "hedged"),
    (r"\boxed{x = 5 \text{ or } x = -5}", "5", "eos", "hedged"),
    (r"\boxed{5} or \boxed{6}", "5", "eos", "hedged"),
    (r"So $\boxed{5}$ (or possibly $6$).", "5", "eos", "hedged"),
    (r"\boxed{5} or 6", "5", "eos", "hedged"),
    (r"First $\boxed{6}$. Wait, that is wrong. The answer is $\boxed{5}$.", "6", "eos", "revised"),
    (r"\boxed{5.4 \text{ cents} 7}", r"5.4 \text{ cents}", "eos", "boxed"),
    (r"\boxed{864 \mbox{ inches}^2 1}", r"864 \mbox{ inches}^2", "eos", "boxed"),
    (r"\boxed{52_87}", "52_8", "eos", "boxed"),
    (r"\boxed{.00006727}", ".0000672", "eos", "boxed"),
    (r"\boxed{0.3333333}", r"\frac{1}{3}", "eos", "boxed"),
    (r"\boxed{0.\overline{3}}", r"\frac{1}{6}", "eos", "boxed"),
    (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", r"\begin{pmatrix} 1 & 2 \end{pmatrix}", "eos", "boxed"),
    (r"\boxed{(2,1)}", "(1,2)", "eos", "boxed"),
    (r"\boxed{a-b}", "b-a", "eos", "boxed"),
    (r"\boxed{52}", "52_8", "eos", "boxed"),
    (r"The area is $\boxed{1", "12", "length", "truncated"),
    (r"so the area is 12", "12", "length", "truncated"),
    (r"so the area is 12", "12", "eos", "no answer"),
    (r"\boxed{}", "12", "eos", "no answer"),
    (r"So $\boxed{5}$. Actually, I made a mistake: it is 6.", "5", "eos", "revised"),
    ("So $\\boxed{5}$.\n\nWait, the square is 36, so x = 6.", "5", "eos", "revised"),
    (r"So $\boxed{5}$. Hence the answer is $6$.", "5", "eos", "revised"),
    ("The answer is $\\boxed{7}$.\n\nProblem: What is 5 + 7?\nSolution: $\\boxed{12}$", "12", "eos", "boxed"),
])
def test_wrong_styles_math500(text, gold, finish, rule):
    for suite in (MATH_SUITE, OWN_RULES):
        verdict = math(text, gold, finish, suite)
        assert verdict.rule == rule and not verdict.correct, (suite.math_verify, verdict)


@pytest.mark.parametrize("text, gold", [
    (r"$\boxed{\frac{1}{2}}$", "0.5"),
    (r"$\boxed{0.5}$", r"\frac{1}{2}"),
    (r"\boxed{b+a}", "a+b"),
    (r"\boxed{x-1}", "-1+x"),
    (r"\boxed{5.4}", r"5.4 \text{ cents}"),
    (r"\boxed{864}", r"864 \mbox{ inches}^2"),
    (r"\boxed{\frac{270}{7}}", r"\frac{270}7\text{ degrees}"),
    (r"\boxed{4210_{5}}", "4210_5"),
    (r"\boxed{\dfrac{3}{4}}", r"\frac34"),
    (r"\boxed{\left(1, 2\right)}", "(1,2)"),
    (r"\boxed{1{,}000}", "1000"),
    (r"\boxed{C}", r"\text{(C)}"),
    (r"\boxed{\text{(C)}}", r"\text{(C)}"),
    (r"\boxed{3, 1}", "1,3"),
    (r"\boxed{(0,9) \cup (2,12)}", r"(2,12) \cup (0,9)"),
    (r"\boxed{\{-2, 1+\sqrt{5}, 1-\sqrt{5}\}}", r"\{1+\sqrt{5},1-\sqrt{5},-2\}"),
    (r"\boxed{\begin{pmatrix} -1 & 0 \\ 0 & -1 \end{pmatrix}}", r"\begin{pmatrix} -1 & 0 \\ 0 & -1 \end{pmatrix}"),
    (r"\boxed{\begin{pmatrix} -\frac{1}{3} \\ \frac23 \end{pmatrix}}", r"\begin{pmatrix} -1/3 \\ 2/3 \end{pmatrix}"),
    (r"\boxed{15\frac{39}{40}}", r"\frac{639}{40}"),
    (r"\boxed{\frac{1}{6}}", r"0.1\overline{6}"),
    (r"\boxed{0.\overline{3}}", r"\frac{1}{3}"),
    (r"\boxed{15\frac{39}{40}}, or $\boxed{\frac{639}{40}}$ inches", r"\frac{639}{40}"),
    ("Final Answer: The final answer is $18$. I hope it is correct.", "18"),
    (r"\boxed{5}. Checking: \boxed{5.0}", "5"),
    (r"$\boxed{5}$, since $5^2 = 25$.", "5"),
    (r"$\boxed{5}$, or equivalently $\frac{10}{2}$.", "5"),
    (r"Only $\boxed{49}$ has a remainder of 1 when divided by 2, 3, 4, or 6.", "49"),
    (r"$\boxed{5}$. Wait, let me check: $2 + 3 = 5$. Yes.", "5"),
    (r"$\boxed{44}$. We may check our answer: $17\cdot 44 = 748 \equiv 1$, so our answer is correct.", "44"),
    (r"$\boxed{63}$. It is a common mistake to count squares, for 48, instead of points.", "63"),
])
def test_correct_equivalent_forms_math500(text, gold):
    for suite in (MATH_SUITE, OWN_RULES):
        verdict = math(text, gold, "eos", suite)
        assert verdict.correct, (suite.math_verify, verdict)


def test_exact_decimals_without_math_verify_rounding():
    """math-verify rounds floats to 6 places by default; both sides decimal: exact."""
    assert not math_equivalent(".00006727", ".0000672")
    assert not math_equivalent("0.3333333", r"\frac{1}{3}")
    assert math_equivalent("0.125", r"\frac{1}{8}")
    assert equivalence.FLOAT_ROUNDING >= 8


def test_cached_parsed_gold_math_verify():
    if not math_verify_available():
        pytest.skip("math-verify (the optional [math] extra) is not installed")
    equivalence._parsed_gold.cache_clear()
    for _ in range(3):
        math_equivalent(r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}")
    info = equivalence._parsed_gold.cache_info()
    assert info.misses == 1 and info.hits == 2


def test_warned_once_without_math_verify(monkeypatch):
    monkeypatch.setattr(equivalence, "math_verify_available", lambda: False)
    monkeypatch.setattr(equivalence, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MATH500(count=1)
        MATH500(count=2)
        MATH500(count=1, math_verify=False)
    assert len(caught) == 1 and "math-verify is not installed" in str(caught[0].message)


# --- the laws --------------------------------------------------------------------------------

def decimals():
    """Finite decimals, as strings: integers, cents, small fractions, large numbers."""
    return st.builds(lambda n, k: format(Decimal(n).scaleb(-k), "f"), st.integers(-10**7, 10**7), st.integers(0, 8))


GSM8K_ENDINGS = ("The answer is {}.", "#### {}", "\\boxed{{{}}}", "So the answer is ${}$.")
GSM8K_REVISIONS = ("\nWait, it is actually {}.", "\n#### {}", " The answer is {}.", "\nSo she has {} left.",
                   "\n\\boxed{{{}}}", " Hmm, {}.", "\n{}", "\n**${}**", " No, {} in total.", " Therefore {}.")
MATH_REVISIONS = ("\nWait: $\\boxed{{{}}}$", " Final answer: \\boxed{{{}}}", "\\boxed{{{}}}")
WORK = "She buys 3 boxes of 6 eggs, so 3 * 6 = 18 eggs, and gives away some.\n"


@settings(max_examples=80, deadline=None)
@given(decimals(), decimals(), st.sampled_from(GSM8K_ENDINGS), st.sampled_from(GSM8K_REVISIONS))
@example("18", "15", "The answer is {}.", "\nWait, it is actually {}.")
def test_wrong_appended_different_answer_gsm8k(gold, other, ending, revision):
    if Decimal(other) == Decimal(gold):
        other = str(Decimal(other) + 1)
    text = WORK + ending.format(gold)
    assert gsm8k(text, gold).correct
    assert not gsm8k(text + revision.format(other), gold).correct


@settings(max_examples=60, deadline=None)
@given(decimals(), decimals(), st.sampled_from(MATH_REVISIONS))
def test_wrong_appended_different_answer_math500(gold, other, revision):
    if Decimal(other) == Decimal(gold):
        other = str(Decimal(other) + 1)
    text = f"We find $x$. So $\\boxed{{{gold}}}$."
    assert math(text, gold, suite=OWN_RULES).correct
    assert not math(text + revision.format(other), gold, suite=OWN_RULES).correct


@settings(max_examples=80, deadline=None)
@given(decimals(), st.sampled_from(GSM8K_ENDINGS), st.data())
@example("18", "#### {}", None)
def test_wrong_cut_before_final_answer_gsm8k(gold, ending, data):
    text = f"So 3 * 6 = {gold} now.\n" + ending.format(gold)
    end = text.rindex(gold) + len(gold)
    cut = end - 1 if data is None else data.draw(st.integers(0, end - 1))
    assert not gsm8k(text[:cut], gold, finish="length").correct


@settings(max_examples=60, deadline=None)
@given(decimals(), st.sampled_from(GSM8K_ENDINGS), st.sampled_from([None, "length"]), st.data())
def test_wrong_cut_before_final_answer_finish_unknown_gsm8k(gold, ending, finish, data):
    """Cut before the final answer starts, a plain score() (finish unknown) never credits the
    gold number the work computed on the way."""
    text = f"So 3 * 6 = {gold} now.\n" + ending.format(gold)
    cut = data.draw(st.integers(0, len(text) - len(ending.format(gold))))
    assert not gsm8k(text[:cut], gold, finish=finish).correct
    assert not GSM8K_SUITE.score(gsm8k_prompt(gold), text[:cut])


@settings(max_examples=60, deadline=None)
@given(decimals(), st.data())
def test_wrong_cut_before_final_answer_math500(gold, data):
    text = f"Since $y = {gold}$, we get $\\boxed{{{gold}}}$."
    cut = data.draw(st.integers(0, text.rindex("}")))
    for finish in ("length", "eos"):
        assert not math(text[:cut], gold, finish, OWN_RULES).correct


@settings(max_examples=100, deadline=None)
@given(decimals(), st.data())
@example("1234", None)
@example("0.00006727", None)
def test_wrong_one_wrong_digit_anywhere(gold, data):
    digits = [i for i, c in enumerate(gold) if c.isdigit()]
    i = digits[-1] if data is None else data.draw(st.sampled_from(digits))
    wrong = gold[:i] + str((int(gold[i]) + 1) % 10) + gold[i + 1:]
    if Decimal(wrong) == Decimal(gold):  # never: a changed digit always changes the value
        raise AssertionError((gold, wrong))
    assert not gsm8k(f"#### {wrong}", gold).correct
    assert not gsm8k(f"The answer is {wrong}.", gold).correct
    for suite in (MATH_SUITE, OWN_RULES):
        assert not math(f"$\\boxed{{{wrong}}}$", gold, suite=suite).correct


@settings(max_examples=60, deadline=None)
@given(decimals(), st.integers(1, 4))
def test_equivalent_trailing_zeros_and_commas(gold, zeros):
    value = Decimal(gold)
    written = f"{value:,.{max(0, -value.as_tuple().exponent) + zeros}f}"
    assert gsm8k(f"#### {written}", gold).correct
    assert math(f"\\boxed{{{written.replace(',', '{,}')}}}", gold, suite=OWN_RULES).correct


# --- the protocol: judge, and plain score ----------------------------------------------------

class PlainSuite:
    """A third-party suite with only the plain protocol."""

    name = "plain"

    def prompts(self):
        return [Prompt("plain/0", "2+2=", meta={"answer": "4"})]

    def score(self, prompt, text):
        return text.strip() == prompt.meta["answer"]


def test_plain_score_still_works_judge():
    suite = PlainSuite()
    prompt = suite.prompts()[0]
    assert judge(suite, prompt, "4", "eos") == Judgement(True, None, "score")
    assert judge(suite, prompt, "5", None) == Judgement(False, None, "score")
    union = Union("both", [suite, GSM8K(count=2)])
    assert union.judge(prompt, "4") == Judgement(True, None, "score")
    assert union.judge(union.prompts()[1], "#### 0.5").rule == "marker"


def test_dispatch_judge_union_math():
    suite = MathSuite(gsm8k={"count": 2}, math500={"count": 2})
    for prompt in suite.prompts():
        own = suite.part(prompt)
        assert suite.judge(prompt, "#### 7 or 8", "eos") == own.judge(prompt, "#### 7 or 8", "eos")
    assert "one answer or none" in suite.rules and suite.prompts()[0].stop == ("Question:",)


def test_equivalent_earlier_names_answers():
    """The functions earlier releases exported from suites.answers give the suites' verdicts."""
    from pytest_redline.suites import answers

    assert answers.gsm8k_answer("#### 1,234") == Decimal("1234") and answers.gsm8k_answer("18 or 19", "eos") is None
    assert answers.gsm8k_correct("#### 1,234", "1234") and not answers.gsm8k_correct("#### 18\nWait, so it is 15.", "18")
    assert answers.math_correct(r"\boxed{0.5}", r"\frac12") and not answers.math_correct(r"\boxed{5 \text{ or } 6}", "5")
    assert answers.math_equivalent is math_equivalent and answers.normalise_math(r"\dfrac12") == r"\frac{1}{2}"
