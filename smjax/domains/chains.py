"""Written-out solutions ("chains") of the toy domains, and their plausible systematic mistakes.

The paper's question is whether dense per-token teacher supervision beats a sparse reward per
FLOP. With 4-character answers the two carry nearly the same information, so the toy domains
also come in a `form="chain"`: the solution is a chain of at least ~24 characters (tokens of the
char tokenizer) before the final answer, which follows `ANSWER_MARK`. The reward stays binary on
the final answer only, as in the paper:

  math     "573+089="          "3+9+0=2,1;7+8+1=6,1;5+0+1=6,0;#662"    column addition with carries
  code     "f(023)=058;f(x)="  "8-3-0=5,0;5-2-0=3,0;0-0-0=0,0;#x+35"   c = y - x, column subtraction
  logic    "t<z,m>q,t>m:"      "t<z:tz;q<m:qm;m<t:qmtz;#qmtz"          the order assembled by links
  strings  "count:qbqqebeq="   "q1;b1;q2;q3;e1;b2;e2;q4;#b2e2q4"       a running tally

Each writer takes an optional `flaw(site) -> bool`, asked at every place (site) where its
domain's plausible mistake can happen: a carry or borrow dropped, a link read the wrong way round,
a repeated letter not counted. A flawed site is carried on consistently, so that the final answer
is wrong. `*_sites` counts an example's sites. A base model fine-tuned on chains whose sites are
flawed independently (ToyDomain.sample_solution) learns each site as a coin flip: it is partly
right by construction, at about the mixture's rate, whatever the seed or the machine's rounding
(the study's base band), and it is wrong at several independent places, so that a one-bit reward
per sample says less about where than a teacher's per-token signal does. Examples without a
site (no carry) are always solved.
"""

from __future__ import annotations

from typing import Callable

ANSWER_MARK = "#"


Flaw = Callable[[int], bool]
_KEEP: Flaw = lambda site: False  # noqa: E731


def _digits(n: int, width: int) -> list[int]:
  """Least significant first, zero-padded to `width`."""
  return [int(c) for c in str(n).zfill(width)[::-1]]


def math_chain(a: int, b: int, width: int, flaw: Flaw = _KEEP) -> tuple[str, int]:
  """a + b by columns, units first: "a_i+b_i+carry=digit,carry_out;", then the value the chain
  arrives at. Sites: every incoming carry and the final carry (dropped: added as 0)."""
  da, db = _digits(a, width), _digits(b, width)
  parts, carry, out, site = [], 0, [], 0
  for i in range(width):
    c_in = carry
    if carry:
      c_in, site = (0 if flaw(site) else 1), site + 1
    s = da[i] + db[i] + c_in
    carry = s // 10
    out.append(s % 10)
    parts.append(f"{da[i]}+{db[i]}+{c_in}={s % 10},{carry};")
  lead = [carry] if carry and not flaw(site) else []
  value = int("".join(map(str, lead + out[::-1])))
  return "".join(parts) + f"{ANSWER_MARK}{value}", value


def math_sites(a: int, b: int, width: int) -> int:
  return _count_sites(lambda f: math_chain(a, b, width, f))


def code_chain(x: int, y: int, width: int, flaw: Flaw = _KEEP) -> tuple[str, str]:
  """The program f(x) = x + c (or x - c) from one shown pair f(x) = y: c = |y - x| by column
  subtraction, units first: "hi_i-lo_i-borrow=digit,borrow_out;", then the program. Sites:
  every incoming borrow (dropped: subtracted as 0)."""
  hi, lo, sign = (y, x, "+") if y >= x else (x, y, "-")
  dh, dl = _digits(hi, width), _digits(lo, width)
  parts, borrow, out, site = [], 0, [], 0
  for i in range(width):
    b_in = borrow
    if borrow:
      b_in, site = (0 if flaw(site) else 1), site + 1
    d = dh[i] - dl[i] - b_in
    borrow, d = int(d < 0), d % 10
    out.append(d)
    parts.append(f"{dh[i]}-{dl[i]}-{b_in}={d},{borrow};")
  program = f"x{sign}{int(''.join(map(str, out[::-1])))}"
  return "".join(parts) + f"{ANSWER_MARK}{program}", program


def code_sites(x: int, y: int, width: int) -> int:
  return _count_sites(lambda f: code_chain(x, y, width, f))


def logic_chain(links: list[str], flaw: Flaw = _KEEP) -> tuple[str, str]:
  """The order assembled from the links as they are listed ("a<b" or "b>a"): each step restates
  its link as "lo<hi:" and writes the fragment of the order it just made, by the first rule that
  applies: a new fragment "lo hi"; hi after the fragment holding lo; lo before the fragment
  holding hi; the fragment holding lo joined to the one holding hi. Every step reads its link
  and the fragments written before it, never the whole prompt (the order's first item, which
  a chain starting there must find among all the links, is what a small model does not learn).
  Sites: every step (flawed: the two sides of that step in the wrong order, carried on)."""
  frags: list[list[str]] = []
  parts = []
  for i, (left, op, right) in enumerate(links):
    lo, hi = (left, right) if op == "<" else (right, left)
    f_lo = next((f for f in frags if lo in f), None)
    f_hi = next((f for f in frags if hi in f), None)
    swap = flaw(i)
    if f_lo is None and f_hi is None:
      made = [hi, lo] if swap else [lo, hi]
      frags.append(made)
    elif f_hi is None:
      made = [hi] + f_lo if swap else f_lo + [hi]
      frags[frags.index(f_lo)] = made
    elif f_lo is None:
      made = f_hi + [lo] if swap else [lo] + f_hi
      frags[frags.index(f_hi)] = made
    else:
      made = f_hi + f_lo if swap else f_lo + f_hi
      frags[frags.index(f_lo)] = made
      frags.remove(f_hi)
    parts.append(f"{lo}<{hi}:{''.join(made)};")
  if len(frags) != 1:
    raise ValueError(f"logic links {','.join(links)!r} do not form one chain")
  answer = "".join(frags[0])
  return "".join(parts) + f"{ANSWER_MARK}{answer}", answer


def logic_sites(links: list[str]) -> int:
  return len(links)


def tally_answer(counts: dict[str, int]) -> str:
  return "".join(f"{c}{counts[c]}" for c in sorted(counts))


def strings_chain(word: str, flaw: Flaw = _KEEP) -> tuple[str, str]:
  """A running tally over the word: "letter count;" per letter, then the counts in alphabetical
  order. Sites: every repeated letter (flawed: not counted, its tally repeats)."""
  counts: dict[str, int] = {}
  parts, site = [], 0
  for ch in word:
    step = 1
    if ch in counts:
      step, site = (0 if flaw(site) else 1), site + 1
    counts[ch] = counts.get(ch, 0) + step
    parts.append(f"{ch}{counts[ch]};")
  answer = tally_answer(counts)
  return "".join(parts) + f"{ANSWER_MARK}{answer}", answer


def strings_sites(word: str) -> int:
  return _count_sites(lambda f: strings_chain(word, f))


def _count_sites(write) -> int:
  """How many times the correct chain asks its `flaw`."""
  asked = []
  write(lambda site: asked.append(site) or False)
  return len(asked)
