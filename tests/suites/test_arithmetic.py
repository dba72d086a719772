"""Laws of the synthetic arithmetic suite."""
import itertools
import random
import re

import pytest
from hypothesis import given, strategies as st

from pytest_redline.contracts import Judgement, Prompt
from pytest_redline.suites.arithmetic import (
    ArithmeticSuite,
    addition,
    distinct_problems,
    final_answer,
    odd_sum,
    product,
    sample_problem,
    split_of,
    stream,
    subtraction,
)

pytest_plugins = ["pytester"]


def _check_steps(problem):
    """Every step of a solution is true arithmetic, and the final answer is the problem's."""
    steps, answer = problem.solution.rsplit("#", 1)
    for step in steps.split(","):
        lhs, rhs = step.split("=")
        assert eval(lhs) == int(rhs) or (problem.family == "sub" and eval(lhs) % 10 == int(rhs)), step
    assert int(answer) == problem.answer == eval(problem.prompt.rstrip("=").replace("..", "0"), {}) or problem.family == "odd"


def test_correct_solutions_every_family():
    rng = random.Random(1)
    for _ in range(2000):
        _check_steps(sample_problem(rng))


@pytest.mark.parametrize(
    "problem, answer",
    [(addition(347, 589), 936), (subtraction(503, 498), 5), (product(347, 6), 2082), (odd_sum(1, 5), 25)],
)
def test_correct_answer_pinned(problem, answer):
    assert problem.answer == answer
    assert final_answer(problem.solution) == answer
    _check_steps(problem)


def test_correct_odd_sum_is_square_from_one():
    for count in range(2, 10):
        assert odd_sum(1, count).answer == count**2


def test_disjoint_splits():
    calibration = {p.prompt for p in distinct_problems("calibration", 600, seed=0)}
    test = {p.prompt for p in distinct_problems("test", 600, seed=0)}
    train = {p.prompt for _, p in zip(range(20000), stream("train", seed=5))}
    assert not calibration & test and not calibration & train and not test & train
    assert all(split_of(p) == "calibration" for p in calibration)


def test_deterministic_prompts_for_seed():
    a, b = ArithmeticSuite(n=50, seed=3).prompts(), ArithmeticSuite(n=50, seed=3).prompts()
    assert a == b
    assert [p.text for p in a] != [p.text for p in ArithmeticSuite(n=50, seed=4).prompts()]


def test_stable_ids_and_distinct_prompts():
    prompts = ArithmeticSuite(split="calibration", n=512).prompts()
    assert [p.id for p in prompts[:2]] == ["arithmetic/cal/0", "arithmetic/cal/1"]
    assert len({p.text for p in prompts}) == 512
    assert {p.meta["family"] for p in prompts} == {"add", "sub", "mul", "odd"}
    assert all(p.messages == ({"role": "user", "content": p.text},) for p in prompts)


def test_long_outputs_span_three_blocks_of_eight():
    prompts = ArithmeticSuite(n=512).prompts()
    spans = []
    for p in prompts:
        end = len(p.text) + len(p.meta["solution"])  # the EOS position
        spans.append(end // 8 - len(p.text) // 8 + 1)
    assert sum(spans) / len(spans) >= 3


def test_score_exact_integer_match():
    suite = ArithmeticSuite(n=5)
    prompt = suite.prompts()[0]
    assert suite.score(prompt, prompt.meta["solution"])
    assert suite.score(prompt, f"garbage#{prompt.meta['answer']}")
    assert not suite.score(prompt, f"#{prompt.meta['answer'] + 1}")
    assert not suite.score(prompt, f"{prompt.meta['answer']}")  # no answer mark


def test_equivalent_judge_and_score_arithmetic():
    suite = ArithmeticSuite(n=5)
    prompt = suite.prompts()[0]
    gold = prompt.meta["answer"]
    assert suite.judge(prompt, prompt.meta["solution"], "eos") == Judgement(True, str(gold), "marker")
    assert suite.judge(prompt, f"#{gold + 1}") == Judgement(False, str(gold + 1), "marker")
    assert suite.judge(prompt, f"{gold}", "length") == Judgement(False, None, "no answer")
    for text in (prompt.meta["solution"], f"#{gold + 1}", "", "#"):
        assert suite.judge(prompt, text).correct == suite.score(prompt, text)


@given(st.text(alphabet="0123456789+-*=#,. x[]MASK", max_size=40))
def test_total_score_on_malformed_text(text):
    suite_prompt = Prompt(id="arithmetic/cal/0", text="1+1=", meta={"answer": 2})
    result = ArithmeticSuite.score(None, suite_prompt, text)
    assert result is (final_answer(text) == 2)
    if final_answer(text) is not None:
        assert re.search(r"#\s*-?\d+\s*$", text)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"split": "dev"}, "suite_args.split"), ({"n": 0}, "suite_args.n"), ({"n": "5"}, "suite_args.n"), ({"seed": 1.5}, "suite_args.seed")],
)
def test_clear_errors_bad_suite_args(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ArithmeticSuite(**kwargs)


@pytest.mark.slow  # lists and counts the 1.48 million problems: about 6 s of CPU here (57 s wall at load 12)
def test_n_beyond_the_split_refused_with_the_largest_n():
    """A split holds a finite number of distinct problems; a larger n is refused at once (it used
    to draw up to 1000 n problems first), naming that number, which is every problem the stream
    can draw that falls in the split."""
    from pytest_redline.suites import arithmetic

    prompts = list(arithmetic.every_prompt())
    assert len(prompts) == len(set(prompts))
    drawn = {problem.prompt for problem in itertools.islice(stream("calibration", 0), 20_000)}
    assert drawn <= set(prompts)
    counts = {split: arithmetic.distinct_count(split) for split in ("calibration", "test", "train")}
    assert sum(counts.values()) == len(prompts)
    assert min(counts.values()) > arithmetic.FEWEST_DISTINCT  # below it, n needs no count
    for split, count in counts.items():
        with pytest.raises(ValueError, match=rf"^arithmetic: suite_args.n: expected at most {count} \(the distinct "
                                             rf"problems of split '{split}'\), got 100000000$"):
            ArithmeticSuite(split=split, n=100_000_000)
    assert len(ArithmeticSuite(n=2000).prompts()) == 2000


@pytest.mark.slow  # a gate run in process, counting the problems: about 4 s of CPU
def test_gate_exit_4_for_n_beyond_the_split(pytester):
    from pathlib import Path

    from pytest_redline.suites.arithmetic import distinct_count

    root = Path(__file__).resolve().parents[2]
    grid = (root / "redline.yaml").read_text().replace("n: 512", "n: 100000000")
    pytester.makefile(".yaml", redline=grid.replace("engines/models/bd-tiny", str(root / "engines" / "models" / "bd-tiny")))
    result = pytester.runpytest("-p", "no:cacheprovider", "--redline-alpha=0.1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: */redline.yaml: suite_args: * arithmetic: suite_args.n: expected at most "
                                 f"{distinct_count('calibration')} (the distinct problems of split 'calibration'), got 100000000"])
