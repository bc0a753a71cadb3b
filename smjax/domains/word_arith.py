"""Arithmetic asked in words, for a small pretrained instruct model (a real model's first task).

  prompt "What is 47 + 8? Reply with one line that ends with the number."    answer 55
  prompt "What is 47 - 8? Reply with one line that ends with the number."    answer 39  (WordSub)

The toy domains are written for char-level models trained from scratch (`f(23)=58;f(x)=`); an
instruct model reads English through its chat template (smjax.models.chat), so this domain asks in
English and checks a fixed format: the answer is the last integer on the completion's first
non-empty line. "47 + 8 = 55" and "55" score 1; "47 + 8 = 54", a first line without a number, or
the right number only on a later line score 0. The format is what GRPO can teach from a one-bit
reward (SmolLM2-135M-Instruct, sampled at temperature 0.5, often writes the sum on its first line
and as often wanders off: docs/real_model.md), the arithmetic what it partly knows already.

difficulty 0: a + b with a, b in 1..9;  1: a in 10..99, b in 1..9;  2: a, b in 10..99.
Held-out split, disjoint by construction: the unordered pair {a, b} is held out iff the CRC-32 of
"min,max" is 0 mod 5, so a + b and b + a are in the same split.

The study's pair on a real model (configs/smollm2_study.py) is `WordAdd` and `WordSub`, two-digit
a + b and a - b (a >= b, so no answer is negative) as two domains: one format, two skills, both
imported by path (`smjax.domains.word_arith:WordAdd`), which builds them at difficulty 2.
"""

from __future__ import annotations

import re
import zlib

from smjax.domains.base import Domain, Example, check_split, rng_for

INSTRUCTION = "Reply with one line that ends with the number."
RANGES = {0: ((1, 9), (1, 9)), 1: ((10, 99), (1, 9)), 2: ((10, 99), (10, 99))}
_INT = re.compile(r"-?\d+")


def is_held_out(a: int, b: int) -> bool:
  lo, hi = min(a, b), max(a, b)
  return zlib.crc32(f"{lo},{hi}".encode()) % 5 == 0


def first_line_number(completion: str) -> str | None:
  """The last integer on the first non-empty line (None: no such line, or no integer on it)."""
  for line in completion.split("\n"):
    if line.strip():
      found = _INT.findall(line.replace(",", ""))
      return found[-1] if found else None
  return None


class WordArithDomain(Domain):
  """`a + b` asked in words (module docstring); `difficulty` 0-2 sets the operands' digits."""

  name = "word_arith"
  op = "+"

  def __init__(self, difficulty: int = 1):
    if difficulty not in RANGES:
      raise ValueError(f"word_arith: difficulty={difficulty!r} must be one of {sorted(RANGES)}")
    self.difficulty = difficulty

  def generate(self, split: str, n: int, seed: int, difficulty: int | None = None
               ) -> list[Example]:
    check_split(split)
    level = self.difficulty if difficulty is None else difficulty
    (a_lo, a_hi), (b_lo, b_hi) = RANGES[level]
    # Sums keep word_arith's stream (benchmarks/real_model.py's prompts); differences their own.
    rng = rng_for("word_arith" if self.op == "+" else self.name, split, seed, level)
    pairs = [(a, b) for a in range(a_lo, a_hi + 1) for b in range(b_lo, b_hi + 1)
             if is_held_out(a, b) == (split == "test")]
    out = []
    for i in range(n):
      a, b = pairs[rng.randrange(len(pairs))]
      if self.op == "-":
        a, b = max(a, b), min(a, b)
      value = a + b if self.op == "+" else a - b
      out.append(Example(prompt=f"What is {a} {self.op} {b}? {INSTRUCTION}", reference=value,
                         solution=f"{a} {self.op} {b} = {value}", domain=self.name,
                         metadata={"split": split, "index": i, "difficulty": level}))
    return out

  def extract_answer(self, completion: str) -> str | None:
    return first_line_number(completion)

  def score(self, example: Example, completion: str) -> float:
    got = first_line_number(completion)
    return float(got is not None and int(got) == int(example.reference))


class WordAdd(WordArithDomain):
  """Two-digit `a + b` (difficulty 2 unless given): the study's first real-model domain."""

  name = "word_add"

  def __init__(self, difficulty: int = 2):
    super().__init__(difficulty)


class WordSub(WordArithDomain):
  """Two-digit `a - b` with a >= b (difficulty 2 unless given): the study's second real-model
  domain."""

  name = "word_sub"
  op = "-"

  def __init__(self, difficulty: int = 2):
    super().__init__(difficulty)
