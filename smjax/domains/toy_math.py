"""Toy `math`: integer arithmetic, answer checked numerically.

  prompt "57+38="  solution "95"

difficulty 0: a+b, a, b in 0..9;  1: a+b in 0..99;  2: a+b or a-b in 0..99;  3: a±b in 0..999.

Chain form (smjax.domains.chains): a+b with operands of difficulty + 2 digits, zero-padded in the
prompt, solved by columns with carries:  "573+089="  "3+9+0=2,1;7+8+1=6,1;5+0+1=6,0;#662".

Held-out split, disjoint by construction: an operand pair (a, b) is held out iff
(3·digitsum(a) + digitsum(b)) mod 5 == 0 (a fifth of the pairs). At difficulty >= 1 every
digit combination at every position (and every carry) still occurs in training, so the
held-out pairs are reachable by learning column addition, but no held-out pair is ever
trained on.

Calibration (2-layer d64 char model, batch 64, Adam 3e-3, greedy exact match; train / held-out):
difficulty 1 reached 9/5% after 200 steps, 64/59% after 400, 82/77% after 600.
"""

from __future__ import annotations

import math
import random

from smjax.domains import chains
from smjax.domains.base import Example, ToyDomain

_RANGES = {0: 9, 1: 99, 2: 99, 3: 999}


def digit_sum(n: int) -> int:
  return sum(int(c) for c in str(abs(n)))


def is_held_out(a: int, b: int) -> bool:
  return (3 * digit_sum(a) + digit_sum(b)) % 5 == 0


class MathDomain(ToyDomain):
  """Integer arithmetic; see the module docstring."""

  name = "math"
  max_chain_difficulty = 2

  def _make(self, split: str, rng: random.Random, difficulty: int) -> Example:
    want_test = split == "test"
    if self.form == "chain":
      width = difficulty + 2
      while True:
        a, b = rng.randint(0, 10 ** width - 1), rng.randint(0, 10 ** width - 1)
        if is_held_out(a, b) == want_test:
          break
      chain, value = chains.math_chain(a, b, width)
      return Example(prompt=f"{a:0{width}d}+{b:0{width}d}=", reference=a + b, solution=chain,
                     domain=self.name, metadata={"a": a, "b": b, "op": "+", "width": width})
    hi = _RANGES[difficulty]
    while True:
      a, b = rng.randint(0, hi), rng.randint(0, hi)
      if is_held_out(a, b) == want_test:
        break
    op = rng.choice("+-") if difficulty >= 2 else "+"
    value = a + b if op == "+" else a - b
    return Example(prompt=f"{a}{op}{b}=", reference=value, solution=str(value), domain=self.name,
                   metadata={"a": a, "b": b, "op": op})

  def chain_sites(self, example: Example) -> int:
    m = example.metadata
    return chains.math_sites(m["a"], m["b"], m["width"])

  def chain_solution(self, example: Example, flaw) -> str:
    m = example.metadata
    return chains.math_chain(m["a"], m["b"], m["width"], flaw)[0]

  def score(self, example: Example, completion: str) -> float:
    answer = self.extract_answer(completion)
    if answer is None or len(answer) > 32:
      return 0.0
    value = float(answer)
    return float(math.isfinite(value) and value == float(example.reference))
