r"""Code suites scored by execution (pass@1): ``humaneval``, ``mbpp`` and ``code`` (both).

Every completion runs in :mod:`suites.sandbox`: by default in Linux namespaces of its own (PID,
mount, network; docs/explanation/sandbox.md), refusing to score where they are unavailable; ``suite_args:
{sandbox: process}`` opts into the weaker process sandbox, and the suite's ``version`` (so the
outcome key and the report) records which one scored. ``score(prompt, text)`` runs one program;
``score_many(prompts, texts)`` runs many in parallel (default: one at a time per usable CPU) and
is what a caller with many outcomes wants.

Formats (plain ``text``; chat ``messages`` for models with a chat template):

- HumanEval, plain: the data set's ``prompt`` (imports, signature, docstring), to be continued
  with the function body. Chat: ``HUMANEVAL_INSTRUCTION`` and the prompt in a fenced block.
- MBPP, plain: the format of Austin et al. (2021): ``You are an expert Python programmer, and
  here is your task: <text> Your code should pass these tests:\n\n<asserts>\n[BEGIN]\n``, after
  ``few_shot`` (0-3) solved examples (tasks 2, 3, 4, as in the paper) closed by ``[DONE]``.
  Chat: the task, the asserts and ``MBPP_INSTRUCTION``.

How a program is assembled from a completion:

- A completion over ``MAX_COMPLETION_CHARS`` (1 Mi characters) is wrong, unrun (the scorer's
  memory stays bounded whatever an endpoint or a recorded log holds).
- The code is every fenced block, in order (```` ``` ```` or ``~~~`` fences, tagged ``python``,
  ``py``, ``python3`` or untagged, indented or not, e.g. inside a list; an unclosed fence runs to
  the end), else the whole text. The scan is one lazy pass over the fence lines (linear in the
  length, nothing kept per line).
  MBPP text is cut at ``[DONE]`` and ``[BEGIN]`` is dropped first.
- HumanEval: a top-level ``print(`` or ``if __name__`` line ends the code only when no
  top-level ``def`` or ``class`` follows it (a helper after a debugging print is kept). If the
  code defines ``def <entry_point>(`` at the top level it is a full function: the program is the
  prompt, then the code (which replaces the prompt's stub and keeps its imports and helpers).
  Otherwise it is a body: the program is the prompt followed by the code; when it was not
  fenced it also ends at a top-level ``#``, ``if`` or closing fence (the Codex paper's stop
  sequences, but helpers defined after the body are kept). An engine that honours the Codex stop
  strings (``\nprint(`` among them) never generates what follows them: its stop wins, and
  these rules apply to what reached the scorer. The tests are the data set's ``test`` and
  ``check(<entry_point>)``.
- MBPP: the program is the block that defines a function (else the first block, else the
  text), without a closing top-level ``if __name__`` block (one no ``def`` or ``class`` follows:
  the program's own run, which may read ``input()``, run ``unittest.main()`` or exit); the tests
  are ``test_setup_code`` (``test_imports`` in the sanitized file) and the asserts of
  ``test_list``.

Code and tests are compiled separately and run in that order as ``__main__``, so an
``if __name__ == "__main__":`` block the rules above keep runs, and one that exits makes it fail.
"""
from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, Callable, Sequence

from pytest_redline.contracts import Prompt
from pytest_redline.suites.base import chat
from pytest_redline.suites.records import Record, check_int, data_path, read_records, reject_unknown, select
from pytest_redline.suites.sandbox import Limits, Program, Result, check_sandbox, run_many, version
from pytest_redline.suites.union import Union, part_args

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in a ```python code block."
MBPP_INSTRUCTION = "Write the Python code for this task. Reply with the code in a ```python code block."
MBPP_SPLITS = {"test": (11, 510), "prompt": (1, 10), "validation": (511, 600), "train": (601, 974), "all": (1, 10**9)}
MBPP_EXAMPLES = (2, 3, 4)  # the few-shot tasks of Austin et al. (2021)
STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint", "\n```")  # the Codex paper's stop sequences
_PYTHON_TAGS = ("", "python", "py", "python3")
# a fence line: its indentation (or a list item's marker), the fence, its tag, the space after the tag and what
# follows it (one character: nothing of a long line is copied)
_TOP_LEVEL_DEF = re.compile(r"\n(?:async def|def|class) ")
_MAIN_STOPS = re.compile(r"\n(?:print\(|if __name__)")  # a program's own run; cut unless a def follows
_MAIN_BLOCK = re.compile(r"\nif __name__")  # an MBPP program's own run (input(), unittest.main(), sys.exit)
_BODY_STOPS = re.compile(r"\n(?:#|if|print|```)")  # the Codex paper's stop sequences but def and class
_FENCE_LINE = re.compile(r"^([ \t]*(?:(?:[-*+]|\d{1,9}[.)])[ \t]+)?)(`{3,}|~{3,})[ \t]*([^\s`]{0,16})([ \t]*)(\S?).*$",
                         re.M)
# A completion longer than this is wrong, unrun: real ones are far below it (the longest HumanEval and MBPP
# reference solutions are under 2,000 characters), and engines' and recorded logs' completions have no token limit.
MAX_COMPLETION_CHARS = 1 << 20
VERDICT_OUTPUT_BYTES = 4096  # of each program's output, what score_many holds while it runs (only its verdict is kept)
_SUITE_ARGS = ("path", "seed", "count", "ids", "timeout", "workers", "python", "sandbox")


def code_blocks(text: str) -> list[str]:
    """The contents of the fenced Python (or untagged) code blocks of ``text``, in order: fences of
    three or more backticks or tildes, indented or not (the indentation of the opening fence is
    removed from its lines). A tagged fence line inside a block closes it and opens the next (a
    model that forgot a closing fence). Linear in the length, and lazy: one regular-expression
    scan for fence lines (anchored at line starts, no nested repetition), read as it goes, then
    slicing; nothing is kept per line."""
    blocks, fences = [], _FENCE_LINE.finditer(text)
    opener = next(fences, None)
    while opener is not None:
        indent, fence, tag, space, more = opener.groups()
        following = None  # a tagged fence line that closed this block opens the next
        if fence[0] == "`" and text.find("`", opener.end(3), opener.end()) >= 0:  # inline code such as ```x```
            opener = next(fences, None)
            continue
        end = len(text)
        for other in fences:  # another kind of fence, or a shorter one, inside the block is part of it
            if other.group(2)[0] == fence[0] and len(other.group(2)) >= len(fence):
                end = other.start()
                if other.group(3) or other.group(5):
                    following = other
                break
        body = text[opener.end() + 1:end]
        body = body[:-1] if body.endswith("\n") else body
        if indent:
            body = re.sub(rf"(?m)^[ \t]{{0,{len(indent)}}}", "", body)
        if tag.lower() in _PYTHON_TAGS and (space or not more):
            blocks.append(body)
        opener = following if following is not None else next(fences, None)
    return blocks


def _top_level_cut(code: str, stops: re.Pattern) -> str:
    """``code`` before the first top-level line (not the first line) matching ``stops`` that no
    top-level ``def`` or ``class`` follows (a stop before a helper does not cut it off)."""
    start = 0
    for start in (match.end() for match in _TOP_LEVEL_DEF.finditer(code)):
        pass
    stop = stops.search(code, start)
    return code[:stop.start()] if stop else code


def _defines(code: str, name: str) -> bool:
    if "def" not in code or name not in code:  # a fast answer for most texts, long ones included
        return False
    return re.search(rf"^def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def _pick(blocks: list[str], name: str | None) -> str:
    for wanted in ([f"def {name}"] if name else []) + ["def "]:
        for block in blocks:
            if wanted in block:
                return block
    return blocks[0]


def humaneval_program(prompt: str, entry_point: str, completion: str) -> str:
    """The program (without tests) for a HumanEval completion; see the module docstring."""
    blocks = code_blocks(completion)
    code = _top_level_cut("\n".join(blocks) if blocks else completion, _MAIN_STOPS)
    if _defines(code, entry_point):
        return f"{prompt}\n{code}\n"
    if not blocks:
        code = _top_level_cut(code, _BODY_STOPS)
    return f"{prompt}{code}\n"


def mbpp_program(completion: str) -> str:
    """The program (without tests) for an MBPP completion; see the module docstring."""
    text = completion.split("[DONE]", 1)[0].replace("[BEGIN]", "")
    blocks = code_blocks(text)
    return _top_level_cut(_pick(blocks, None) if blocks else text, _MAIN_BLOCK) + "\n"


class _Executed:
    """Scoring by execution, for suites that turn (prompt, text) into a sandbox Program."""

    name: str
    workers: int | None = None
    python: str | None = None
    sandbox: str = "namespaces"

    def program(self, prompt: Prompt, text: str) -> Program:
        raise NotImplementedError

    @property
    def version(self) -> str:
        """The interpreter programs run under, its version and the sandbox (part of the outcome
        store's key). Refuses (SandboxUnavailable) where the namespace sandbox cannot run."""
        return version(self.python, self.sandbox)

    def execute(self, prompts: Sequence[Prompt], texts: Sequence[str], workers: int | None = None) -> list[Result | None]:
        """The sandbox result of each completion (None where no program could be built from it;
        a completion over MAX_COMPLETION_CHARS is failed unrun, with a reason that says so)."""
        return self._run(prompts, texts, workers, lambda result: result)

    def score_many(self, prompts: Sequence[Prompt], texts: Sequence[str], workers: int | None = None) -> list[bool]:
        """``score`` for many outcomes at once, run in parallel (default: the usable CPU count).
        Only each verdict is kept as the programs finish: their output is drained but, past its
        last VERDICT_OUTPUT_BYTES, never held (the verdict does not depend on it)."""
        return self._run(prompts, texts, workers, lambda result: result is not None and result.passed,
                         output_bytes=VERDICT_OUTPUT_BYTES)

    def score(self, prompt: Prompt, text: str) -> bool:
        return self.score_many([prompt], [text], workers=1)[0]

    def _run(self, prompts: Sequence[Prompt], texts: Sequence[str], workers: int | None,
             keep: Callable[[Result | None], Any], output_bytes: int | None = None) -> list[Any]:
        """``keep(result)`` for each completion (``keep(None)`` where no program could be built);
        ``output_bytes``: how much of each output to keep, if not the suite's limits'."""
        if len(prompts) != len(texts):
            raise ValueError(f"suite {self.name!r}: {len(prompts)} prompts but {len(texts)} texts")
        programs: list[Program | Result | None] = []
        for prompt, text in zip(prompts, texts):
            if isinstance(text, str) and len(text) > MAX_COMPLETION_CHARS:
                programs.append(Result(False, f"a completion of {len(text)} characters, over the "
                                       f"{MAX_COMPLETION_CHARS}-character cap, is wrong unrun", "", 0.0))
                continue
            try:
                program = self.program(prompt, text)
                if output_bytes is not None:
                    limits = dataclasses.replace(program.limits, output_bytes=output_bytes, output_chars=output_bytes)
                    program = dataclasses.replace(program, limits=limits)
                programs.append(program)
            except Exception:  # malformed output (not even a string) is wrong, never an error
                programs.append(None)
        kept = iter(run_many([p for p in programs if isinstance(p, Program)], workers or self.workers, self.python,
                             self.sandbox, keep=keep))
        return [next(kept) if isinstance(p, Program) else keep(p) for p in programs]


def _limits(suite: str, timeout: Any) -> Limits:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"suite {suite!r}: suite_args.timeout: expected CPU seconds > 0, got {timeout!r}")
    return Limits(cpu_seconds=timeout)


def _runner(suite: str, workers: Any, python: Any, sandbox: Any) -> tuple[int | None, str | None, str]:
    """The checked ``workers``, ``python`` and ``sandbox`` suite_args."""
    if workers is not None:
        check_int(workers, "workers", suite, 1)
    if python is not None and not isinstance(python, str):
        raise ValueError(f"suite {suite!r}: suite_args.python: expected a path to a Python interpreter, got {python!r}")
    check_sandbox(sandbox, f"suite {suite!r}: suite_args.sandbox")
    if sandbox != "namespaces":
        warnings.warn(f"suite {suite!r}: suite_args.sandbox: {sandbox!r} is the weaker sandbox (no namespaces: "
                      "programs see the host's files and network); the outcome key and the report record it",
                      stacklevel=3)
    return workers, python, sandbox


class HumanEval(_Executed):
    """The 164 HumanEval problems. ``timeout``: CPU seconds per program (wall: 3 x + 5 s)."""

    name = "humaneval"
    # Stop strings for engines and the scorer: where a completion's function has ended, and
    # never the start of a fenced chat reply (as "\ndef" or "\n#" would be).
    stop = ("\nif __name__", "\nprint(")
    rules = "every fenced block; a top-level stop before a def does not cut; over 1 Mi characters wrong (4)"  # part of the scoring version

    def __init__(self, *, path: str | None = None, seed: int | None = None, count: int | None = None,
                 ids: Sequence[str | int] | None = None, timeout: float = 10.0, workers: int | None = None,
                 python: str | None = None, sandbox: str = "namespaces", **unknown: Any):
        reject_unknown(self.name, unknown, _SUITE_ARGS)
        self.limits = _limits(self.name, timeout)
        self.workers, self.python, self.sandbox = _runner(self.name, workers, python, sandbox)
        prompts = [self._prompt(record) for record in read_records(data_path(path, "HumanEval.jsonl.gz"))]
        self._prompts = select(prompts, self.name, seed=seed, count=count, ids=ids)

    def _prompt(self, record: Record) -> Prompt:
        task, code = record.get("task_id"), record.get("prompt")
        meta = {"prompt": code, "entry_point": record.get("entry_point"), "test": record.get("test"),
                "canonical_solution": record.get("canonical_solution", str, None)}
        return Prompt(id=f"{self.name}/{task.replace('/', '-')}", text=code,
                      messages=chat(f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{code}```"), meta=meta, stop=self.stop)

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    def program(self, prompt: Prompt, text: str) -> Program:
        meta = prompt.meta
        return Program(code=humaneval_program(meta["prompt"], meta["entry_point"], text),
                       tests=f"{meta['test']}\ncheck({meta['entry_point']})\n", limits=self.limits)


class MBPP(_Executed):
    """MBPP. ``split``: test (task_ids 11-510, the default), prompt, validation, train or all;
    ``sanitized``: the hand-verified subset (427 tasks, 257 of them in the test split)."""

    name = "mbpp"
    stop = ("[DONE]",)  # the end of a solution in the format of Austin et al.; mbpp_program cuts there
    rules = "``` and ~~~ fences, indented or not; a closing __main__ block cut; over 1 Mi characters wrong (3)"  # the revision of the scoring rules: part of the scoring version

    def __init__(self, *, path: str | None = None, split: str = "test", sanitized: bool = False, few_shot: int = 0,
                 seed: int | None = None, count: int | None = None, ids: Sequence[str | int] | None = None,
                 timeout: float = 10.0, workers: int | None = None, python: str | None = None,
                 sandbox: str = "namespaces", **unknown: Any):
        reject_unknown(self.name, unknown, _SUITE_ARGS + ("split", "sanitized", "few_shot"))
        self.limits = _limits(self.name, timeout)
        self.workers, self.python, self.sandbox = _runner(self.name, workers, python, sandbox)
        if split not in MBPP_SPLITS:
            raise ValueError(f"suite {self.name!r}: suite_args.split: expected one of {sorted(MBPP_SPLITS)}, got {split!r}")
        if not isinstance(sanitized, bool):
            raise ValueError(f"suite {self.name!r}: suite_args.sanitized: expected true or false, got {sanitized!r}")
        check_int(few_shot, "few_shot", self.name, 0, len(MBPP_EXAMPLES))
        default = "sanitized-mbpp.json" if sanitized else "mbpp.jsonl"
        tasks = [_mbpp_task(record) for record in read_records(data_path(path, default))]
        low, high = MBPP_SPLITS[split]
        shots = _mbpp_examples(few_shot)
        prompts = [self._prompt(task, shots) for task in tasks if low <= task["task_id"] <= high]
        self._prompts = select(prompts, self.name, seed=seed, count=count, ids=ids)

    def _prompt(self, task: dict[str, Any], shots: str) -> Prompt:
        tests = "\n".join(task["test_list"])
        meta = {"test_list": task["test_list"], "setup": task["setup"], "code": task["code"]}
        return Prompt(id=f"{self.name}/{task['task_id']}", text=shots + _mbpp_head(task) + "[BEGIN]\n",
                      messages=chat(f"{task['text']} Your code should pass these tests:\n\n{tests}\n\n{MBPP_INSTRUCTION}"),
                      meta=meta, stop=self.stop)

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    def program(self, prompt: Prompt, text: str) -> Program:
        tests = prompt.meta["setup"] + "\n" + "\n".join(prompt.meta["test_list"]) + "\n"
        return Program(code=mbpp_program(text), tests=tests, limits=self.limits)


def _mbpp_task(record: Record) -> dict[str, Any]:
    """One MBPP record, from either file's fields (full: text, test_setup_code; sanitized: prompt, test_imports)."""
    sanitized = "prompt" in record.fields
    return {
        "task_id": record.get("task_id", int),
        "text": record.get("prompt" if sanitized else "text"),
        "code": record.get("code"),
        "setup": "\n".join(record.strings("test_imports")) if sanitized else record.get("test_setup_code", str, ""),
        "test_list": record.strings("test_list"),
    }


def _mbpp_examples(few_shot: int) -> str:
    """The first ``few_shot`` solved examples of Austin et al. (tasks 2, 3, 4 of the full file)."""
    if few_shot == 0:
        return ""
    tasks = {t["task_id"]: t for t in map(_mbpp_task, read_records(data_path(None, "mbpp.jsonl")))}
    return "".join(_mbpp_head(tasks[i]) + f"[BEGIN]\n{tasks[i]['code']}\n[DONE]\n" for i in MBPP_EXAMPLES[:few_shot])


def _mbpp_head(task: dict[str, Any]) -> str:
    tests = "\n".join(task["test_list"])
    return (f"You are an expert Python programmer, and here is your task: {task['text']} "
            f"Your code should pass these tests:\n\n{tests}\n")


class _CodeUnion(_Executed, Union):
    def program(self, prompt: Prompt, text: str) -> Program:
        return self.part(prompt).program(prompt, text)


def CodeSuite(*, humaneval: dict[str, Any] | None = None, mbpp: dict[str, Any] | None = None,
              seed: int | None = None, count: int | None = None, ids: Sequence[str] | None = None,
              workers: int | None = None, python: str | None = None, sandbox: str = "namespaces",
              **unknown: Any) -> _CodeUnion:
    """HumanEval + MBPP. ``humaneval`` and ``mbpp`` hold each part's own suite_args, except
    ``workers``, ``python`` and ``sandbox``, which apply to both and are given at the top level."""
    reject_unknown("code", unknown, ("humaneval", "mbpp", "seed", "count", "ids", "workers", "python", "sandbox"))
    args = {"humaneval": part_args("code", "humaneval", humaneval), "mbpp": part_args("code", "mbpp", mbpp)}
    for part, given in args.items():
        for key in ("workers", "python", "sandbox"):
            if key in given:
                raise ValueError(f"suite 'code': suite_args.{part}.{key}: give {key} at the top level of code's suite_args")
    suite = _CodeUnion("code", [HumanEval(**args["humaneval"]), MBPP(**args["mbpp"])], seed=seed, count=count, ids=ids)
    suite.workers, suite.python, suite.sandbox = _runner("code", workers, python, sandbox)
    return suite
