"""The code suites (HumanEval, MBPP, code) on the vendored data: every reference solution passes,
broken ones fail, each completion form is assembled into a program the standard way, and
malformed output is wrong, never an error."""
from __future__ import annotations

import json
import re
from importlib.metadata import entry_points

import pytest

from pytest_redline.contracts import Suite
from pytest_redline.suites.code import MBPP, CodeSuite, HumanEval, code_blocks, humaneval_program, mbpp_program
from pytest_redline.suites.records import DATA

pytestmark = pytest.mark.slow  # the code scorers run programs under bubblewrap

HUMANEVAL = HumanEval()
MBPP_ALL = MBPP(split="all")


def test_registered_entry_points_code():
    found = {ep.name: ep for ep in entry_points(group="redline.suites")}
    for name, kind in (("humaneval", HumanEval), ("mbpp", MBPP)):
        suite = found[name].load()(count=2, seed=1)
        assert isinstance(suite, kind) and isinstance(suite, Suite) and suite.name == name
    assert found["code"].load()(count=2).name == "code"


# --- HumanEval -----------------------------------------------------------------------------------


def test_pass_all_canonical_solutions_humaneval():
    prompts = HUMANEVAL.prompts()
    assert len(prompts) == 164 and prompts[0].id == "humaneval/HumanEval-0"
    results = HUMANEVAL.execute(prompts, [p.meta["canonical_solution"] for p in prompts])
    assert [(p.id, r.reason) for p, r in zip(prompts, results) if not r.passed] == []


def test_fail_broken_solutions_humaneval():
    # Every problem's tests reject a broken body (a removed body on even problems, a wrong
    # constant on odd ones), so no problem passes vacuously.
    prompts = HUMANEVAL.prompts()
    passed = HUMANEVAL.score_many(prompts, ["", "    return 0\n"] * (len(prompts) // 2))
    assert [p.id for p, ok in zip(prompts, passed) if ok] == []


def _forms(prompt):
    """One correct solution of a HumanEval prompt, written in each form a model may answer in."""
    body, code = prompt.meta["canonical_solution"], prompt.meta["prompt"]
    function = code[code.index(f"def {prompt.meta['entry_point']}"):] + body
    return {
        "bare body": body,
        "body then junk after a stop sequence": body + "\n\nif __name__ == '__main__':\n    import sys; sys.exit(0)\n",
        "body then a print": body + "\nprint('debugging')\nraise SystemExit(0)\n",
        "full function": function,
        "fenced full function in prose": f"Here it is:\n\n```python\n{function}```\n\nIt works because ...",
        "fenced, unclosed": f"```python\n{function}",
        "fenced body": f"```\n{body}```",
        "echoed prompt": code + body,
    }


@pytest.mark.parametrize("form", list(_forms(HUMANEVAL.prompts()[0])))
def test_pass_every_completion_form_humaneval(form):
    wanted = ("humaneval/HumanEval-0", "humaneval/HumanEval-10", "humaneval/HumanEval-38")
    prompts = [p for p in HUMANEVAL.prompts() if p.id in wanted]
    texts = [_forms(p)[form] for p in prompts]
    assert HUMANEVAL.score_many(prompts, texts) == [True] * 3


def test_keeps_prompt_helpers_full_function_humaneval():
    # HumanEval/10's prompt defines is_palindrome, which the completed make_palindrome needs.
    prompt = next(p for p in HUMANEVAL.prompts() if p.id == "humaneval/HumanEval-10")
    program = humaneval_program(prompt.meta["prompt"], "make_palindrome", _forms(prompt)["full function"])
    assert program.count("def is_palindrome") == 1 and program.count("def make_palindrome") == 2


def test_cut_at_stop_sequences_humaneval():
    program = humaneval_program("def f():\n", "f", "    return 1\ndef g():\n    pass\n# done\n")
    assert program == "def f():\n    return 1\ndef g():\n    pass\n"  # a helper after the body stays


def test_forms_prompt_humaneval():
    prompt = HUMANEVAL.prompts()[0]
    assert prompt.text == prompt.meta["prompt"] and prompt.text.rstrip().endswith('"""')
    assert len(prompt.messages) == 1 and "```python\n" + prompt.text + "```" in prompt.messages[0]["content"]


# --- MBPP ----------------------------------------------------------------------------------------


def test_pass_reference_solutions_mbpp():
    # A seeded sample of 150 of the 974; benchmarks/bench_humaneval.py --mbpp sweeps them all.
    prompts = MBPP_ALL.prompts()
    assert len(prompts) == 974
    sample = MBPP(split="all", count=150, seed=2).prompts()
    results = MBPP_ALL.execute(sample, [p.meta["code"] for p in sample])
    assert [(p.id, r.reason, r.output[-300:]) for p, r in zip(sample, results) if not r.passed] == []


def test_pass_reference_solutions_sanitized_mbpp():
    # The sanitized file's own fields (prompt, test_imports); a seeded sample keeps this quick.
    suite = MBPP(split="all", sanitized=True, count=60, seed=1)
    prompts = suite.prompts()
    assert any(p.meta["setup"] for p in prompts)  # some need their test_imports
    results = suite.execute(prompts, [p.meta["code"] for p in prompts])
    assert [(p.id, r.reason) for p, r in zip(prompts, results) if not r.passed] == []


@pytest.mark.parametrize("split, sanitized, count, first, last", [
    ("test", False, 500, 11, 510),
    ("prompt", False, 10, 1, 10),
    ("validation", False, 90, 511, 600),
    ("train", False, 374, 601, 974),
    ("test", True, 257, 11, 510),
    ("all", True, 427, 2, 974),
])
def test_standard_splits_mbpp(split, sanitized, count, first, last):
    ids = [int(p.id.split("/")[1]) for p in MBPP(split=split, sanitized=sanitized).prompts()]
    assert len(ids) == count and min(ids) >= first and max(ids) <= last


def test_cut_closing_main_block_mbpp():
    # A closing __main__ block (the program's own run: input(), unittest.main(), sys.exit(0)) is
    # cut, so it never fails a right function; an exit at the top level still fails.
    prompt = MBPP(ids=[11]).prompts()[0]
    code = prompt.meta["code"]
    assert MBPP_ALL.score(prompt, code + "\n\nif __name__ == '__main__':\n    print('ok')\n")
    assert MBPP_ALL.score(prompt, "import sys\n" + code + "\n\nif __name__ == '__main__':\n    sys.exit(0)\n")
    assert mbpp_program(f"{code}\nif __name__ == '__main__':\n    input()\n") == code + "\n"
    kept = f"if __name__ == '__main__':\n    pass\n{code}"  # a def after it: not its closing block
    assert mbpp_program(kept) == kept + "\n"
    assert not MBPP_ALL.score(prompt, "import os\n" + code + "\nos._exit(0)\n")


def test_pass_completion_forms_mbpp():
    prompt = MBPP(ids=[11]).prompts()[0]
    code = prompt.meta["code"]
    for text in (code, f"{code}\n[DONE]\nnonsense after the end", f"[BEGIN]\n{code}\n[DONE]",
                 f"Sure:\n```python\n{code}\n```\nDone.", f"```py\n{code}"):
        assert MBPP_ALL.score(prompt, text), text
    assert mbpp_program(f"```\nprint(1)\n```\n```python\n{code}\n```") == code + "\n"


def test_forms_few_shot_prompt_mbpp():
    prompt = MBPP(ids=[11], few_shot=3).prompts()[0]
    assert prompt.text.count("You are an expert Python programmer") == 4
    assert prompt.text.count("[DONE]") == 3 and prompt.text.endswith("[BEGIN]\n")
    assert prompt.messages[0]["content"].count("assert ") == 3
    assert MBPP(ids=[11]).prompts()[0].text.count("[BEGIN]") == 1


@pytest.mark.parametrize("args, message", [
    ({"split": "dev"}, r"suite 'mbpp': suite_args.split: expected one of \['all', 'prompt', 'test', 'train', 'validation'\], "
                       r"got 'dev'"),
    ({"sanitized": "yes"}, r"suite 'mbpp': suite_args.sanitized: expected true or false, got 'yes'"),
    ({"timeout": 0}, r"suite 'mbpp': suite_args.timeout: expected CPU seconds > 0, got 0"),
    ({"workers": 0}, r"suite 'mbpp': suite_args.workers: expected an int >= 1, got 0"),
    ({"few_shot": 4}, r"suite 'mbpp': suite_args.few_shot: expected an int in 0..3, got 4"),
    ({"ids": [5]}, r"suite 'mbpp': suite_args.ids: unknown prompt id 5"),  # not in the test split
])
def test_rejected_bad_suite_args_mbpp(args, message):
    with pytest.raises(ValueError, match=message):
        MBPP(**args)


def test_user_file_same_fields_code(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"text": "Write a function to double x.", "code": "def double(x):\n    return 2 * x",
                                "task_id": 42, "test_setup_code": "", "test_list": ["assert double(2) == 4"]}) + "\n")
    suite = MBPP(path=str(mine))
    prompt = suite.prompts()[0]
    assert prompt.id == "mbpp/42" and suite.score(prompt, prompt.meta["code"])
    assert not suite.score(prompt, "def double(x): return x")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"text": "t", "code": "c", "task_id": "42", "test_list": []}) + "\n")
    with pytest.raises(ValueError, match=r"broken.jsonl:1: key 'task_id': expected int, got '42'"):
        MBPP(path=str(broken))


# --- both ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [None, b"def f(): pass", 17, "", "```", "```python\n", "\x00\x01", "def (:", "[DONE]", "\ud800"])
def test_wrong_malformed_output_code(text):
    assert HUMANEVAL.score(HUMANEVAL.prompts()[0], text) is False
    assert MBPP_ALL.score(MBPP_ALL.prompts()[0], text) is False


def test_equivalent_score_score_many_code():
    prompts = HUMANEVAL.prompts()[:6]
    texts = [p.meta["canonical_solution"] if i % 2 else "    return None\n" for i, p in enumerate(prompts)]
    assert HUMANEVAL.score_many(prompts, texts, workers=2) == [HUMANEVAL.score(p, t) for p, t in zip(prompts, texts)]
    assert HUMANEVAL.score_many(prompts, texts) == [False, True] * 3


def test_dispatch_union_code():
    suite = CodeSuite(mbpp={"count": 3, "seed": 0}, workers=2)
    prompts = suite.prompts()
    assert len(prompts) == 164 + 3 and [p.id.split("/")[0] for p in prompts[163:165]] == ["humaneval", "mbpp"]
    texts = [prompts[0].meta["canonical_solution"], prompts[-1].meta["code"], "    return 0\n"]
    assert suite.score_many([prompts[0], prompts[-1], prompts[1]], texts) == [True, True, False]
    assert suite.score(prompts[-1], prompts[-1].meta["code"])
    assert len(CodeSuite().prompts()) == 164 + 500
    with pytest.raises(ValueError, match=r"suite 'code': suite_args.mbpp.workers: give workers at the top level"):
        CodeSuite(mbpp={"workers": 2})


def test_fenced_blocks_only_python_code():
    text = "```bash\npip install x\n```\n```python\nx = 1\n```\n```\ny = 2\n```"
    assert code_blocks(text) == ["x = 1", "y = 2"]


def test_vendored_data_used_code():
    assert HUMANEVAL.prompts()[0].meta["prompt"].startswith("from typing import List")
    assert (DATA / "HumanEval.jsonl.gz").is_file() and (DATA / "mbpp.jsonl").is_file()


def test_version_names_interpreter_and_sandbox_code(tmp_path):
    """The interpreter's version and the sandbox enter the outcome store's key; the interpreter's
    path does not, so the same Python reached through another path (a venv's link) keeps a
    store warm."""
    import os
    import platform
    import sys

    chosen = HumanEval(count=1, seed=0, python=sys.executable).version
    assert chosen == f"Python {platform.python_version()}; sandbox namespaces"
    moved = tmp_path / "venv" / "bin" / "python"
    moved.parent.mkdir(parents=True)
    moved.symlink_to(os.path.realpath(sys.executable))
    assert HumanEval(count=1, seed=0, python=str(moved)).version == chosen
    default = HumanEval(count=1, seed=0).version
    assert re.fullmatch(r"Python \d+\.\d+\.\d+; sandbox namespaces", default)
    assert CodeSuite(count=2, seed=0).version == default  # the union runs every part's programs
    with pytest.warns(UserWarning, match="weaker sandbox"):
        weak = CodeSuite(count=2, seed=0, sandbox="process")
    assert weak.version.endswith("; sandbox process") and weak.sandbox == "process"
    with pytest.raises(ValueError, match=r"suite 'code': suite_args.humaneval.sandbox: give sandbox at the top level"):
        CodeSuite(humaneval={"sandbox": "process"})
