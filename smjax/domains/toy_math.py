"""Toy `math`: integer arithmetic, answer checked numerically.

  prompt "57+38="  solution "95"

difficulty 0: a+b, a, b in 0..9;  1: a+b in 0..99;  2: a+b or a-b in 0..99;  3: a±b in 0..999.

Chain form (smjax.domains.chains), difficulty 0-2: a+b with operands of difficulty + 2 digits,
zero-padded in the prompt, solved by columns with carries (sites: every carry, "carry"):
  "573+089="  "3+9+0=2,1;7+8+1=6,1;5+0+1=6,0;#662"
difficulty 3, the hard level: a+b+c of three 3-digit operands, where a column's carry can be 2:
  "573+089+264="  "3+9+4+0=6,1;7+8+6+1=2,2;5+0+2+2=9,0;#926"
Sites: every carry ("carry": dropped) and every carry of 2 ("carry2": taken as 1). Only sums
with at least chains.HARD_MIN_SITES sites and a carry of 2 are kept (drawn again otherwise, from
the example's own rng), so that every example has >= 3 sites of both kinds (3.9 on average).
Lengths at chain-form difficulty 0-3, in characters (= char tokens): prompts of at most
6, 8, 10 and 12; chains of at most 24, 35, 46 and 41 (the answer mark and answer included).
Sites per example at difficulty 0-3, mean (min): 0.94 (0), 1.47 (0), 1.97 (0) and 3.93 (3; 2.72
carry + 1.21 carry2).

Held-out split, disjoint by construction: an operand pair (a, b) is held out iff
(3·digitsum(a) + digitsum(b)) mod 5 == 0 (a fifth of the pairs); a triple (a, b, c) iff
(digitsum(a) + digitsum(b) + digitsum(c)) mod 5 == 0, a rule that does not depend on the
operands' order, so that no reordering of a held-out sum is trained on either. At difficulty
>= 1 every digit combination at every position (and every carry) still occurs in training, so
the held-out sums are reachable by learning column addition, but no held-out one is ever
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


def is_held_out_sum(terms) -> bool:
  """The three-term rule: symmetric in the terms (see the module docstring)."""
  return sum(digit_sum(t) for t in terms) % 5 == 0


HARD_WIDTH = 3   # digits of each of the three operands at the hard level (difficulty 3)


def _terms(m) -> tuple[int, ...]:
  """The operands of a chain-form example's metadata: (a, b), or (a, b, c) at the hard level."""
  return (m["a"], m["b"], m["c"]) if "c" in m else (m["a"], m["b"])


class MathDomain(ToyDomain):
  """Integer arithmetic; see the module docstring."""

  name = "math"

  def _make(self, split: str, rng: random.Random, difficulty: int) -> Example:
    want_test = split == "test"
    if self.form == "chain" and difficulty == 3:
      return self._make_hard(want_test, rng)
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

  def _make_hard(self, want_test: bool, rng: random.Random) -> Example:
    """A three-term sum with >= HARD_MIN_SITES sites, one of them a carry of 2."""
    w = HARD_WIDTH
    while True:
      terms = tuple(rng.randint(0, 10 ** w - 1) for _ in range(3))
      if is_held_out_sum(terms) != want_test:
        continue
      kinds = chains.site_kinds(lambda f, k: chains.sum_chain(terms, w, f, k))
      if len(kinds) >= chains.HARD_MIN_SITES and "carry2" in kinds:
        break
    a, b, c = terms
    return Example(prompt="+".join(f"{t:0{w}d}" for t in terms) + "=", reference=sum(terms),
                   solution=chains.sum_chain(terms, w)[0], domain=self.name,
                   metadata={"a": a, "b": b, "c": c, "op": "+", "width": w})

  def chain_sites(self, example: Example) -> int:
    m = example.metadata
    return chains.sum_sites(_terms(m), m["width"])

  def chain_site_kinds(self, example: Example) -> list[str]:
    m = example.metadata
    return chains.site_kinds(lambda f, k: chains.sum_chain(_terms(m), m["width"], f, k))

  def chain_solution(self, example: Example, flaw) -> str:
    m = example.metadata
    return chains.sum_chain(_terms(m), m["width"], flaw)[0]

  def score(self, example: Example, completion: str) -> float:
    answer = self.extract_answer(completion)
    if answer is None or len(answer) > 32:
      return 0.0
    value = float(answer)
    return float(math.isfinite(value) and value == float(example.reference))
