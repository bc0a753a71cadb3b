"""Real-data domains from local JSONL/Parquet files.

- "jsonl_math:<path>": records {question, answer} (GSM8K / MATH style; aliases problem,
  solution), verified with math-verify; the gold answer is read from "#### x" or \\boxed{x}.
- "jsonl_code:<path>": records {prompt, tests, entry_point} (HumanEval / MBPP style; aliases
  test, test_list), verified in the sandbox: the tests run in their own process and reach the
  candidate through a call proxy (see smjax.rewards.sandbox).

Splits: with one file, a record is held out iff the CRC-32 of its question/prompt text is 0 mod 5
(identical texts always land in the same split); or pass train= and test= files explicitly.

Published files (GSM8K, MATH, MBPP, HumanEval) are read in their own schemas
(smjax.domains.datasets; `python -m smjax.prepare` writes them as these records). For a chat model
(smjax.models.chat) a prompt is a user message: the math prompt as it is, a code prompt that is
code (HumanEval's signature and docstring) with an instruction to complete it
(`metadata["chat_prompt"]`); `system=` gives every example a system message.
"""

from __future__ import annotations

import abc
import random
import re
import zlib
from typing import Any, Sequence

from smjax.domains.base import Domain, Example, SandboxDomain, check_split
from smjax.domains import datasets
from smjax.domains.records import load_records
from smjax.rewards.math import gold_answer, math_reward
from smjax.rewards.sandbox import Job, Limits

MATH_TEMPLATE = "{question}\nPut your final answer in \\boxed{{}}."
# A code prompt that is code, as a chat model's user message (smjax.models.chat.prompt_messages).
CODE_CHAT_TEMPLATE = ("Complete the following Python function. Reply with the complete function, "
                      "with any imports it needs, in one ```python block.\n\n```python\n{prompt}"
                      "```")
_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)(?:```|$)", re.DOTALL)
CODE_LIMITS = Limits(timeout_s=6.0, memory_mb=1024, nproc=32)


def _held_out(text: str) -> bool:
  return zlib.crc32(text.encode()) % 5 == 0


def _is_code(prompt: str) -> bool:
  """Whether a code prompt is Python (HumanEval's signature and docstring) rather than prose."""
  try:
    compile(prompt, "<prompt>", "exec")
    return True
  except (SyntaxError, ValueError):
    return False


class _FileDomain(Domain):
  """Shared split handling; subclasses define `kind`, `key_field` and `_example`."""

  kind = ""
  _adapt = None   # load_records(adapt=): a raw record in a published schema -> the study's
  key_field = ""

  def __init__(self, path: str | None = None, *, train: str | None = None,
               test: str | None = None, system: str | None = None):
    if (path is None) == (train is None and test is None):
      raise ValueError(f"{type(self).__name__}: pass either a path or train=/test= files")
    self.path, self.files = path, {"train": train, "test": test}
    self.system = system   # a chat model's system message for every example (None: none)
    where = path if path else f"train={train},test={test}"
    self.name = f"jsonl_{self.kind}:{where}"

  def records(self, split: str | None = None) -> Sequence[dict]:
    """Validated records of a split (None: every record of the file(s), in file order)."""
    if self.path is not None:
      recs = load_records(self.path, self.kind, self._adapt)
      if split is None:
        return recs
      return [r for r in recs if _held_out(r[self.key_field]) == (check_split(split) == "test")]
    if split is None:
      return [r for s in ("train", "test") if self.files[s]
              for r in load_records(self.files[s], self.kind, self._adapt)]
    if self.files[check_split(split)] is None:
      raise ValueError(f"{self.name}: no {split} file was given")
    return load_records(self.files[split], self.kind, self._adapt)

  def all_examples(self) -> list[Example]:
    return [self._example(r) for r in self.records(None)]

  def generate(self, split: str, n: int, seed: int, difficulty: int | None = None
               ) -> list[Example]:
    """n examples of the split: its records shuffled by seed (reshuffled per pass if n > count)."""
    del difficulty  # real data has no difficulty knob
    recs = self.records(split)
    if not recs:
      raise ValueError(f"{self.name}: the {split} split is empty")
    out, rnd = [], 0
    while len(out) < n:
      order = list(range(len(recs)))
      random.Random(f"{self.name}:{split}:{seed}:{rnd}").shuffle(order)
      out += [self._example(recs[i]) for i in order[:n - len(out)]]
      rnd += 1
    return out

  def _metadata(self, rec: dict, **more: Any) -> dict:
    """An example's metadata: where its record is, `more`, and the system message if any."""
    return {"where": rec["_where"], **more, **({"system": self.system} if self.system else {})}

  @abc.abstractmethod
  def _example(self, rec: dict) -> Example:
    """One validated record as an Example (the math and code domains define it)."""


class JsonlMathDomain(_FileDomain):
  """{question, answer} records verified with math-verify."""

  kind, key_field = "math", "question"

  def __init__(self, path: str | None = None, *, template: str = MATH_TEMPLATE, **files: Any):
    super().__init__(path, **files)
    self.template = template

  def format_prompt(self, question: str) -> str:
    return self.template.format(question=question)

  def _example(self, rec: dict) -> Example:
    answer = str(rec["answer"])
    gold = gold_answer(answer)
    if "####" in answer:
      solution = f"{answer.rsplit('####', 1)[0].strip()}\nThe answer is \\boxed{{{gold}}}."
    else:
      solution = answer if "\\boxed" in answer else f"\\boxed{{{gold}}}"
    kept = {k: rec[k] for k in ("level", "type") if k in rec}   # MATH's, for per-level reads
    return Example(prompt=self.format_prompt(rec["question"]), reference=gold, solution=solution,
                   domain=self.name, metadata=self._metadata(rec, **kept))

  def extract_answer(self, completion: str) -> str | None:
    from smjax.rewards.math import last_boxed  # pylint: disable=import-outside-toplevel
    boxed = last_boxed(completion)
    return boxed if boxed is not None else super().extract_answer(completion)

  def score(self, example: Example, completion: str) -> float:
    return math_reward(completion, example.reference)


class JsonlCodeDomain(SandboxDomain, _FileDomain):
  """{prompt, tests, entry_point} records verified in the sandbox."""

  kind, key_field = "code", "prompt"
  _adapt = staticmethod(datasets.code_record)   # MBPP's own schema read as it is published

  def __init__(self, path: str | None = None, *, limits: Limits = CODE_LIMITS, **files: Any):
    super().__init__(path, **files)
    self.limits = limits

  def _example(self, rec: dict) -> Example:
    tests = rec["tests"] if isinstance(rec["tests"], str) else "\n".join(rec["tests"])
    ref = {"prompt": rec["prompt"], "tests": tests, "entry_point": rec["entry_point"]}
    solution = rec.get("canonical_solution") or rec.get("code") or ""
    chat = {"chat_prompt": CODE_CHAT_TEMPLATE.format(prompt=rec["prompt"].rstrip("\n") + "\n")
            } if _is_code(rec["prompt"]) else {}
    return Example(prompt=rec["prompt"], reference=ref, solution=str(solution), domain=self.name,
                   metadata=self._metadata(rec, task_id=rec.get("task_id", ""), **chat))

  def extract_answer(self, completion: str) -> str | None:
    """The first fenced code block if there is one, else the completion as is."""
    fenced = _FENCE.search(completion)
    code = fenced.group(1) if fenced else completion
    return code if code.strip() else None

  def job(self, example: Example, completion: str) -> Job | None:
    code = self.extract_answer(completion)
    if code is None:
      return None
    prompt = example.reference["prompt"]
    # A code prompt (HumanEval) is completed and is trusted prelude for the tests; with a
    # natural-language prompt (MBPP) the code stands alone.
    prelude = prompt if _is_code(prompt) else ""
    program = prelude + ("" if code[:1].isspace() or not prelude else "\n") + code
    return Job(program, kind="module", entry=example.reference["entry_point"],
               tests=example.reference["tests"], prelude=prelude, limits=self.limits)

  def passed(self, example: Example, result) -> bool:
    return result.status == "ok" and result.passed is True
