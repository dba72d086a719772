r"""Math suites scored by exact match: ``gsm8k``, ``math500`` and ``math`` (both).

Formats (the engine uses ``messages`` with its tokenizer's chat template when it has one, else
``text``):

- GSM8K, plain: ``Question: <question>\nAnswer:``, after ``few_shot`` solved examples in the
  same form (``Question: ...\nAnswer: <solution>\n#### <number>\n\n``). Chat: one user turn
  ``<question>\n\n<GSM8K_INSTRUCTION>``, after the examples as user/assistant turns. The examples
  are the first problems of the file (skipping the prompt itself), with their calculator
  annotations ``<<2*3=6>>`` removed.
- MATH-500, plain: ``Problem: <problem>\nSolution:``. Chat: ``<problem>\n\n<MATH_INSTRUCTION>``.

Stop strings (``Prompt.stop``, and the scorer cuts at them whatever the engine did): GSM8K
``Question:``, MATH-500 ``Problem:``, where a model on a plain prompt starts the next problem.
Extraction is in :mod:`suites.answers`, MATH equivalence in :mod:`suites.equivalence`; both
are described in docs/explanation/scoring.md. Prompt ids: ``gsm8k/<line index from 0>`` and
``math500/<unique_id without "test/" and ".json">`` (``math500/precalculus/807``).
"""
from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Any, Mapping, Sequence

from pytest_redline.contracts import Judgement, Prompt
from pytest_redline.suites.answers import gsm8k_extract, gsm8k_gold, math_extract
from pytest_redline.suites.base import chat, judged
from pytest_redline.suites.equivalence import math_equivalent, math_verify_version, warn_once_without_math_verify
from pytest_redline.suites.records import check_int, data_path, read_records, reject_unknown, select
from pytest_redline.suites.union import Union, part_args

GSM8K_INSTRUCTION = 'Solve the problem step by step. End with the final answer, a number, after "####".'
MATH_INSTRUCTION = "Solve the problem step by step. Put the final answer in \\boxed{}."
RULES = "one answer or none (2)"  # the revision of the scoring rules (docs/explanation/scoring.md): part of the scoring version


class GSM8K:
    """GSM8K test problems; ``few_shot`` (0-8) solved examples before each."""

    name = "gsm8k"
    stop = ("Question:",)
    rules = RULES

    def __init__(self, *, path: str | None = None, seed: int | None = None, count: int | None = None,
                 ids: Sequence[str | int] | None = None, few_shot: int = 0, **unknown: Any):
        reject_unknown(self.name, unknown, ("path", "seed", "count", "ids", "few_shot"))
        check_int(few_shot, "few_shot", self.name, 0, 8)
        problems = []
        for record in read_records(data_path(path, "gsm8k_test.jsonl")):
            question, solution = record.get("question"), record.get("answer")
            try:
                gold = gsm8k_gold(solution)
            except ValueError as error:
                raise ValueError(f"{record.where}: key 'answer': {error}") from None
            problems.append((question, solution, gold))
        pool = problems[: few_shot + 1]  # each prompt uses the first few_shot of these that are not itself
        prompts = []
        for i, (question, _, gold) in enumerate(problems):
            examples = [(q, _readable(s)) for j, (q, s, _) in enumerate(pool) if j != i][:few_shot]
            prompts.append(_gsm8k_prompt(f"{self.name}/{i}", question, str(gold), examples))
        self._prompts = select(prompts, self.name, seed=seed, count=count, ids=ids)

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    def judge(self, prompt: Prompt, text: str, finish_reason: str | None = None) -> Judgement:
        return judged(text, self.stop, finish_reason, gsm8k_extract,
                      lambda found: found.value == Fraction(Decimal(re.sub(r"[\s$,]", "", str(prompt.meta["answer"])))))

    def score(self, prompt: Prompt, text: str) -> bool:
        return self.judge(prompt, text).correct


def _readable(solution: str) -> str:
    """A GSM8K solution without its calculator annotations: ``6*3=<<6*3=18>>18`` -> ``6*3=18``."""
    return re.sub(r"<<[^>]*>>", "", solution)


def _gsm8k_prompt(id: str, question: str, gold: str, examples: Sequence[tuple[str, str]]) -> Prompt:
    text = "".join(f"Question: {q}\nAnswer: {s}\n\n" for q, s in examples) + f"Question: {question}\nAnswer:"
    messages: list[Mapping[str, str]] = []
    for q, s in examples:
        messages += [{"role": "user", "content": f"{q}\n\n{GSM8K_INSTRUCTION}"}, {"role": "assistant", "content": s}]
    messages += chat(f"{question}\n\n{GSM8K_INSTRUCTION}")
    return Prompt(id=id, text=text, messages=tuple(messages), meta={"answer": gold}, stop=GSM8K.stop)


class MATH500:
    """The 500 MATH test problems of "Let's Verify Step by Step".

    ``math_verify`` (default true) also asks the ``math-verify`` package, when it is installed,
    whether two answers are equivalent; without it the normaliser of :mod:`suites.answers` decides.
    """

    name = "math500"
    stop = ("Problem:",)
    rules = RULES

    def __init__(self, *, path: str | None = None, seed: int | None = None, count: int | None = None,
                 ids: Sequence[str | int] | None = None, math_verify: bool = True, **unknown: Any):
        reject_unknown(self.name, unknown, ("path", "seed", "count", "ids", "math_verify"))
        if not isinstance(math_verify, bool):
            raise ValueError(f"suite {self.name!r}: suite_args.math_verify: expected true or false, got {math_verify!r}")
        self.math_verify = math_verify
        if math_verify:
            warn_once_without_math_verify()
        prompts = []
        for record in read_records(data_path(path, "math500.jsonl")):
            problem, answer = record.get("problem"), record.get("answer")
            key = re.sub(r"^test/|\.json$", "", record.get("unique_id"))
            meta = {"answer": answer, "subject": record.get("subject", str, None), "level": record.get("level", int, None)}
            prompts.append(Prompt(id=f"{self.name}/{key}", text=f"Problem: {problem}\nSolution:",
                                  messages=chat(f"{problem}\n\n{MATH_INSTRUCTION}"), meta=meta, stop=self.stop))
        self._prompts = select(prompts, self.name, seed=seed, count=count, ids=ids)

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    @property
    def version(self) -> str:
        """What scoring depends on beyond the data (part of the outcome store's key)."""
        installed = math_verify_version()
        return f"math-verify {installed}" if self.math_verify and installed else "math-verify not used"

    def same(self, predicted: str, gold: str) -> bool:
        return math_equivalent(predicted, gold, use_math_verify=self.math_verify)

    def judge(self, prompt: Prompt, text: str, finish_reason: str | None = None) -> Judgement:
        gold = prompt.meta["answer"]
        return judged(text, self.stop, finish_reason, lambda t, f: math_extract(t, self.same, f),
                      lambda found: self.same(found.answer, gold))

    def score(self, prompt: Prompt, text: str) -> bool:
        return self.judge(prompt, text).correct


def MathSuite(*, gsm8k: Mapping[str, Any] | None = None, math500: Mapping[str, Any] | None = None,
              seed: int | None = None, count: int | None = None, ids: Sequence[str] | None = None,
              **unknown: Any) -> Union:
    """GSM8K + MATH-500. ``gsm8k`` and ``math500`` hold each part's own suite_args."""
    reject_unknown("math", unknown, ("gsm8k", "math500", "seed", "count", "ids"))
    parts = [GSM8K(**part_args("math", "gsm8k", gsm8k)), MATH500(**part_args("math", "math500", math500))]
    return Union("math", parts, seed=seed, count=count, ids=ids)
