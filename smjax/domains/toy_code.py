"""Toy `code`: write the body of f from input/output examples, run against hidden tests.

  prompt "f(23)=58;f(x)="          solution "x+35"
  prompt "f(0)=27,f(1)=34;f(x)="   solution "7*x+27"       (difficulty 3)

The completion is a Python expression in `x`, run in the sandbox on hidden tests: the shown
inputs and four more in 0..199. It scores 1 iff every output equals the gold program's, so any
equivalent expression counts ("35+x"), and echoing the shown output ("58") does not. Syntax
errors and expressions that never name x score 0 on the host, and repeated completions in a
batch (common within a GRPO group) are run once.

difficulty 0: f(x) = x+c, x, c in 0..9;  1: x+c, x, c in 0..99;  2: x+c or x-c in 0..99;
3: f(x) = a*x+c, a in 2..99, c in 0..99, shown at x = 0 and 1.

Chain form (smjax.domains.chains), difficulty 0-1: f(x) = x+c as at those levels, the shown
pair zero-padded to three digits, c derived by column subtraction with borrows (sites: every
borrow, "borrow"), then the program:
  "f(023)=058;f(x)="   "8-3-0=5,0;5-2-0=3,0;0-0-0=0,0;#x+35"
difficulty 2: x+c or x-c, c and the smaller of x and y in 0..99: the chain first says which way it
subtracts ("y-x:" for x+c, "x-y:" for x-c; when x == y, "y-x:"), a "sign" site (flawed: the
larger misjudged, the smaller minus the larger, a final borrow left over, x+(1000-c) for x-c
or the reverse), then the borrows:
  "f(147)=082;f(x)="   "x-y:7-2-0=5,0;4-8-0=6,1;1-0-1=0,0;#x-65"
difficulty 3, the hard level: the same with four digits, c and the smaller of x, y in 0..4999,
kept only with a sign site and >= 2 borrows (drawn again otherwise, from the example's own
rng), so that every example has >= chains.HARD_MIN_SITES sites of both kinds:
  "f(0473)=2128;f(x)="   "y-x:8-3-0=5,0;2-7-0=5,1;1-4-1=6,1;2-0-1=1,0;#x+1655"
Lengths at chain-form difficulty 0-3, in characters (= char tokens): prompts of at most
16, 16, 16 and 18; chains of at most 34, 35, 39 and 51 (the answer mark and answer included).
Sites per example at difficulty 0-3, mean (min): 0.44 (0), 0.95 (0), 1.92 (0) and 3.29 (3; 1 sign +
2.29 borrow).

Held-out split, disjoint by construction: the pair (x, c) (difficulty 3: (a, c); chain form
difficulty 2-3: (the smaller of x and y, c), so that f(x)=y and its mirror f(y)=x share a split)
is held out iff (3·digitsum + digitsum) mod 5 == 0, as for `math`. Every digit column, borrow
and carry of the subtraction that recovers c occurs in training; no held-out program/input pair
does.

Calibration (2-layer d64 char model, batch 64, Adam 3e-3, greedy exact match; train / held-out):
difficulty 1 reached 2/2% after 200 steps, 5/7% after 400, 58/60% after 800; difficulty 2
3/3%, 4/3%, 8/9%. A slice-synthesis variant ("qbzhem->bhm:" -> "x[1::2]") was tried first and
stayed at 20% train / 0% held-out after 800 steps: reading positions through two attention hops
was too hard at that size.
"""

from __future__ import annotations

import random

from smjax.domains import chains
from smjax.domains.base import Example, SandboxDomain, ToyDomain
from smjax.domains.toy_math import is_held_out
from smjax.rewards.sandbox import Job, Limits

NUM_HIDDEN = 4
MAX_PROGRAM_CHARS = 64
LIMITS = Limits(timeout_s=1.0, memory_mb=256)


def gold_value(a: int, c: int, sign: int, x: int) -> int:
  """The gold program f(x) = a*x + sign*c, evaluated without running any code."""
  return a * x + sign * c


class CodeDomain(SandboxDomain, ToyDomain):
  """Program synthesis from input/output examples; see the module docstring."""

  name = "code"
  chain_width = 3
  # Chain-form difficulty 2 and 3 (both signs) -> (digits, the top of the range of c and of the
  # smaller of x and y); the hard level keeps only pairs with >= this many borrows.
  SIGNED = {2: (3, 99), 3: (4, 4999)}
  HARD_MIN_BORROWS = chains.HARD_MIN_SITES - 1

  def _make(self, split: str, rng: random.Random, difficulty: int) -> Example:
    want_test = split == "test"
    if self.form == "chain" and difficulty in self.SIGNED:
      return self._make_signed(want_test, rng, difficulty)
    hi = 9 if difficulty == 0 else 99
    while True:
      if difficulty == 3:
        a, c = rng.randint(2, 99), rng.randint(0, 99)
        key, shown = (a, c), [0, 1]
      else:
        a, x, c = 1, rng.randint(0, hi), rng.randint(0, hi)
        key, shown = (x, c), [x]
      if is_held_out(*key) == want_test:
        break
    sign = -1 if difficulty == 2 and rng.random() < 0.5 else 1
    inputs = shown + [rng.randint(0, 199) for _ in range(NUM_HIDDEN)]
    outputs = [gold_value(a, c, sign, x) for x in inputs]
    if self.form == "chain":
      x, w = shown[0], self.chain_width
      prompt = f"f({x:0{w}d})={outputs[0]:0{w}d};f(x)="
      solution = chains.code_chain(x, outputs[0], w)[0]
    else:
      prompt = ",".join(f"f({x})={y}" for x, y in zip(shown, outputs)) + ";f(x)="
      solution = f"{a}*x+{c}" if difficulty == 3 else f"x{'+' if sign > 0 else '-'}{c}"
    return Example(prompt=prompt, reference={"inputs": inputs, "outputs": outputs},
                   solution=solution, domain=self.name,
                   metadata={"a": a, "c": c, "sign": sign})

  def _make_signed(self, want_test: bool, rng: random.Random, difficulty: int) -> Example:
    """Chain-form difficulty 2-3: f(x) = x+c or x-c, shown at x with y >= 0, the chain saying
    which way it subtracts (the module docstring)."""
    w, top = self.SIGNED[difficulty]
    while True:
      low, c = rng.randint(0, top), rng.randint(0, top)
      if is_held_out(low, c) != want_test:
        continue
      if difficulty < 3:
        break
      kinds = chains.site_kinds(lambda f, k: chains.code_chain(low, low + c, w, f, k, True))
      if "sign" in kinds and kinds.count("borrow") >= self.HARD_MIN_BORROWS:
        break
    sign = -1 if rng.random() < 0.5 and c else 1   # c = 0: x == y, written x+0
    x = low + c if sign < 0 else low
    inputs = [x] + [rng.randint(0, 199) for _ in range(NUM_HIDDEN)]
    outputs = [gold_value(1, c, sign, v) for v in inputs]
    return Example(prompt=f"f({x:0{w}d})={outputs[0]:0{w}d};f(x)=",
                   reference={"inputs": inputs, "outputs": outputs},
                   solution=chains.code_chain(x, outputs[0], w, signed=True)[0], domain=self.name,
                   metadata={"a": 1, "c": c, "sign": sign, "width": w, "signed": True})

  def _chain_args(self, example: Example) -> tuple:
    """(x, y, width, signed) of a chain-form example: the shown pair and how it is solved."""
    m = example.metadata
    return (example.reference["inputs"][0], example.reference["outputs"][0],
            m.get("width", self.chain_width), bool(m.get("signed", False)))

  def chain_sites(self, example: Example) -> int:
    x, y, w, signed = self._chain_args(example)
    return chains.code_sites(x, y, w, signed)

  def chain_site_kinds(self, example: Example) -> list[str]:
    x, y, w, signed = self._chain_args(example)
    return chains.site_kinds(lambda f, k: chains.code_chain(x, y, w, f, k, signed))

  def chain_solution(self, example: Example, flaw) -> str:
    x, y, w, signed = self._chain_args(example)
    return chains.code_chain(x, y, w, flaw, signed=signed)[0]

  def job(self, example: Example, completion: str) -> Job | None:
    """The sandbox job for a completion, or None when it is sure to fail: not an expression, or
    an expression that never reads x (a constant cannot match different outputs)."""
    program = self.extract_answer(completion)
    if program is None or len(program) > MAX_PROGRAM_CHARS:
      return None
    try:  # cheap host-side check of a short input (compiling does not run it)
      code = compile(program, "<candidate>", "eval")
    except (SyntaxError, ValueError):
      return None
    if "x" not in _names(code) and len(set(example.reference["outputs"])) > 1:
      return None
    return Job(program, kind="expr", arg_names=("x",),
               calls=tuple((x,) for x in example.reference["inputs"]), limits=LIMITS)

  def passed(self, example: Example, result) -> bool:
    return result.matches(example.reference["outputs"])


def _names(code) -> set[str]:
  """Every global/attribute name a code object (or any nested one) refers to."""
  names = set(code.co_names)
  for const in code.co_consts:
    if hasattr(const, "co_names"):
      names |= _names(const)
  return names
