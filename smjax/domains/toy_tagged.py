"""Toy `add` and `sub`: one surface form, two opposite operations, told apart by a tag.

  add  prompt "a:573?089="  chain "3?9?0=2,1;7?8?1=6,1;5?0?1=6,0;#662"   a + b
  sub  prompt "s:573?089="  chain "3?9?0=4,1;7?8?1=8,1;5?0?1=4,0;#484"   a - b

The other toy domains share a skill (math and code are both column rules with a carry or borrow
flag), so a policy trained on all of them jointly gets transfer for free. This pair is built to
interfere instead: the prompts after the tag ("a:" or "s:") are drawn from one distribution, and
the chains have one format, with the operator written `?` in the prompt and in every column, so
the only thing that says whether a column adds or subtracts is the tag at the start of the
prompt. Joint GRPO must learn to condition on it from a one-bit reward per sample; an expert of
either domain shows it token by token.

The mistake sites are the operation itself: a flawed column is computed by the other domain's
operation (its flag carried on), so the base's mistakes are all "did what the other tag asks",
and what GRPO on one domain rewards (add here) is what the other domain punishes. (A first
construction flawed the carries and borrows instead, math's and code's kind of site: there, on
the regime map's first seed, GRPO on add alone lifted sub from 31 % to 87 % and GRPO on sub alone
lifted add from 29 % to 56 %: a shared skill, not an interfering one.)

Chain form, units first, one column "a_i?b_i?flag_in=digit,flag_out;" each, then ANSWER_MARK and
the value: add carries (digit = (a_i + b_i + c) mod 10, flag = the carry), sub borrows
(digit = (a_i - b_i - c) mod 10, flag = whether it borrowed). Sites (`op_sites`): the columns
where the other operation, the rest of the chain right, changes the answer (a column with
b_i + flag_in of 0 or 10 comes out the same either way, and sub's last column has no place for
the flag the other operation would leave). Any set of flawed sites changes the final answer
(checked over every level in the tests). The short form (the answer alone) shares the prompts.

difficulty d: operands of d + 2 digits, zero-padded: prompts of 2d + 8 characters (8, 10, 12),
chains of 10 (d + 2) + 1 + answer characters (at most 24, 35, 46; difficulty 2 passes the
toy study's rl.max_new_tokens=44, as math's does).

Operand pairs, the same in both domains: a, b uniform with a >= b (so that a - b >= 0 and the
answer has no sign), kept only when both chains have a site, so that every example of either
domain admits a mistake (and so b > 0: the two answers always differ). Example `index` of a
split, seed and difficulty is the same pair in both domains (drawn from a stream seeded by the
family, not the domain's name).

Held-out split, disjoint by construction, the same pairs in both domains: a pair is held out iff
(3·digitsum(a) + digitsum(b)) mod 5 == 0, toy math's rule (smjax.domains.toy_math): every digit
combination of every column, with either flag, still occurs in training.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Callable

from smjax.domains.base import Example, ToyDomain, check_split, rng_for
from smjax.domains.chains import ANSWER_MARK

Flaw = Callable[[int], bool]
# The stream the operand pairs are drawn from, shared by both domains (not `name`, as
# ToyDomain.example seeds it), so that one index is one pair in each.
FAMILY = "tagged"
_MAX_ANSWER_CHARS = 32


def _keep(site: int) -> bool:
  del site
  return False


def digit_sum(n: int) -> int:
  return sum(int(c) for c in str(abs(n)))


def is_held_out(a: int, b: int) -> bool:
  """Toy math's rule on the operand pair (smjax.domains.toy_math.is_held_out)."""
  return (3 * digit_sum(a) + digit_sum(b)) % 5 == 0


def _digits(n: int, width: int) -> list[int]:
  """Least significant first, zero-padded to `width`."""
  return [int(c) for c in str(n).zfill(width)[::-1]]


def _column(op: str, x: int, y: int, f_in: int) -> tuple[int, int]:
  """One column by `op`: (digit, flag out): add carries, sub borrows."""
  s = x + y + f_in if op == "+" else x - y - f_in
  return s % 10, (s // 10 if op == "+" else int(s < 0))


def _run(op: str, da: list[int], db: list[int], flipped: set[int]) -> tuple[str, int]:
  """The chain of `op` with the columns in `flipped` computed by the other operation, each
  flag carried on into the next column as `op` reads it; (chain text, the value it arrives at)."""
  other = "-" if op == "+" else "+"
  parts, flag, out = [], 0, []
  for i, (x, y) in enumerate(zip(da, db)):
    digit, nxt = _column(other if i in flipped else op, x, y, flag)
    out.append(digit)
    parts.append(f"{x}?{y}?{flag}={digit},{nxt};")
    flag = nxt
  # Add's final carry is its leading digit; sub with a >= b never borrows out of its last column
  # (a flag left there by a flipped column is dropped, as sub's rule has no place for it).
  lead = [flag] if op == "+" and flag else []
  return "".join(parts), int("".join(map(str, lead + out[::-1])))


def op_sites(op: str, a: int, b: int, width: int) -> list[int]:
  """The columns where computing by the other operation, the rest of the chain right, changes
  the answer: the chain's mistake sites, in order (a column with b_i + flag_in of 0 or 10 comes
  out the same either way)."""
  da, db = _digits(a, width), _digits(b, width)
  gold = _run(op, da, db, set())[1]
  return [i for i in range(width) if _run(op, da, db, {i})[1] != gold]


def tagged_chain(op: str, a: int, b: int, width: int, flaw: Flaw = _keep) -> tuple[str, int]:
  """a + b (op "+") or a - b (op "-", a >= b) by columns, units first:
  "a_i?b_i?flag_in=digit,flag_out;", then ANSWER_MARK and the value the chain arrives at, and
  that value. The mistake sites are the operation itself: `flaw(site)` is asked at each column
  of `op_sites`, in order (True: that column is computed by the other operation, and its flag
  carried on), so a flawed chain does what the other domain's tag asks for at those columns."""
  if op not in ("+", "-"):
    raise ValueError(f"op={op!r} must be '+' or '-'")
  if op == "-" and a < b:
    raise ValueError(f"a={a} < b={b}: sub's chains need a >= b")
  cols = op_sites(op, a, b, width)
  flipped = {i for k, i in enumerate(cols) if flaw(k)}
  chain, value = _run(op, _digits(a, width), _digits(b, width), flipped)
  return chain + f"{ANSWER_MARK}{value}", value


def tagged_sites(op: str, a: int, b: int, width: int) -> int:
  """How many sites the correct chain has (the times it asks its `flaw`)."""
  return len(op_sites(op, a, b, width))


def draw_pair(rng: random.Random, width: int, held_out: bool) -> tuple[int, int]:
  """An operand pair (a, b), a >= b, of `width` digits, whose chains both have a site, on the
  held-out side `held_out` of `is_held_out`."""
  top = 10 ** width - 1
  while True:
    a, b = rng.randint(0, top), rng.randint(0, top)
    a, b = max(a, b), min(a, b)
    if (is_held_out(a, b) == held_out and tagged_sites("+", a, b, width)
        and tagged_sites("-", a, b, width)):
      return a, b


class TaggedDomain(ToyDomain):
  """One operation of the tagged pair; see the module docstring. Subclasses set name, tag, op."""

  tag: str = ""
  op: str = ""
  max_difficulty = 2
  max_chain_difficulty = 2

  def example(self, split: str, index: int, seed: int, difficulty: int | None = None) -> Example:
    """As ToyDomain.example, but drawn from the family's stream (FAMILY), so that both domains
    have the same operand pair at each (split, index, seed, difficulty)."""
    check_split(split)
    d = self._check_difficulty(difficulty)
    ex = self._make(split, rng_for(FAMILY, split, seed, d, index), d)
    return dataclasses.replace(ex, metadata={**ex.metadata, "split": split, "index": index,
                                             "seed": seed, "difficulty": d})

  def _make(self, split: str, rng: random.Random, difficulty: int) -> Example:
    width = difficulty + 2
    a, b = draw_pair(rng, width, held_out=split == "test")
    chain, value = tagged_chain(self.op, a, b, width)
    return Example(prompt=f"{self.tag}:{a:0{width}d}?{b:0{width}d}=", reference=value,
                   solution=chain if self.form == "chain" else str(value), domain=self.name,
                   metadata={"a": a, "b": b, "op": self.op, "width": width})

  def chain_sites(self, example: Example) -> int:
    m = example.metadata
    return tagged_sites(self.op, m["a"], m["b"], m["width"])

  def chain_solution(self, example: Example, flaw) -> str:
    m = example.metadata
    return tagged_chain(self.op, m["a"], m["b"], m["width"], flaw)[0]

  def score(self, example: Example, completion: str) -> float:
    """1 iff the final answer (chain form: after the last ANSWER_MARK of the first line) is the
    value as an integer (leading zeros allowed), else 0."""
    answer = self.extract_answer(completion)
    if answer is None or len(answer) > _MAX_ANSWER_CHARS or not re.fullmatch(r"-?\d+", answer):
      return 0.0
    return float(int(answer) == int(example.reference))


class AddDomain(TaggedDomain):
  """`add`: "a:573?089=" -> a + b; see the module docstring."""

  name = "add"
  tag = "a"
  op = "+"


class SubDomain(TaggedDomain):
  """`sub`: "s:573?089=" -> a - b; see the module docstring."""

  name = "sub"
  tag = "s"
  op = "-"
