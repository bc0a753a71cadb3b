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

Each writer takes an optional `flaw(site) -> bool`, asked at every place (site) where a plausible
mistake can happen, and an optional `kinds` list it appends each site's kind to:

  math     "carry"   a carry dropped (added as 0)
           "carry2"  a carry of 2 (three-term sums) taken as 1
  code     "borrow"  a borrow dropped (subtracted as 0)
           "sign"    the larger of x and y misjudged: the chain subtracts the wrong way round
  logic    "order"   a step's two sides in the wrong order
           "read"    a link written with '>' read as if written with '<'
  strings  "count"   a repeated letter not counted (its tally repeats)
           "sort"    a letter listed where it was first seen, not in alphabetical order

The first kind of each domain is at every level; the second only at its hard level (difficulty 3,
the toy modules), where every example has at least `HARD_MIN_SITES` sites of both kinds, so that
a one-bit reward is sparse: a sample is right only if it is right at several decisions of
different kinds. A flawed site is carried on consistently, and any flawed site, alone or with
others, makes the final answer wrong. `*_sites` counts an example's sites and `site_kinds` lists
them. A base model fine-tuned on chains whose sites are flawed independently
(ToyDomain.sample_solution) learns each site as a coin flip: it is partly right by construction,
at about the mixture's rate, whatever the seed or the machine's rounding (the study's base band),
and it is wrong at several independent places, so that a one-bit reward per sample says less
about where than a teacher's per-token signal does. Examples without a site (no carry) are
always solved.
"""

from __future__ import annotations

from typing import Callable, Sequence

ANSWER_MARK = "#"
# Every example of a toy domain's hard level (chain-form difficulty 3) has at least this many
# sites, of at least two kinds.
HARD_MIN_SITES = 3


Flaw = Callable[[int], bool]
_KEEP: Flaw = lambda site: False  # noqa: E731


class _Ask:
  """Numbers the sites a writer asks `flaw` at (0, 1, ... in the order asked) and records each
  site's kind in `kinds` (when given), so that every writer counts and names sites one way."""

  def __init__(self, flaw: Flaw, kinds: list[str] | None):
    self.flaw, self.kinds, self.site = flaw, kinds, 0

  def __call__(self, kind: str) -> bool:
    if self.kinds is not None:
      self.kinds.append(kind)
    self.site += 1
    return bool(self.flaw(self.site - 1))


def _digits(n: int, width: int) -> list[int]:
  """Least significant first, zero-padded to `width`."""
  return [int(c) for c in str(n).zfill(width)[::-1]]


def _take_carry(ask: _Ask, carry: int) -> int:
  """The carry a column takes in (or the leading digit): a carry of 1 or 2 is a "carry" site
  (dropped: 0); a carry of 2 is then also a "carry2" site (taken as 1). Both are asked whatever
  the answers, so the number of sites does not depend on them; dropped wins over taken as 1."""
  if not carry:
    return 0
  dropped = ask("carry")
  as_one = carry == 2 and ask("carry2")
  return 0 if dropped else (1 if as_one else carry)


def sum_chain(terms: Sequence[int], width: int, flaw: Flaw = _KEEP,
              kinds: list[str] | None = None) -> tuple[str, int]:
  """The sum of two or three terms by columns, units first: "t1_i+t2_i(+t3_i)+carry=digit,
  carry_out;", then the value the chain arrives at. Sites: every carry, consumed by the next
  column or written as the leading digit ("carry"; with three terms a carry can be 2: "carry2",
  `_take_carry`). A flawed carry changes its column's digit, which no later column can undo."""
  if len(terms) not in (2, 3):
    raise ValueError(f"sum_chain: terms={tuple(terms)} must be two or three numbers")
  ask, cols = _Ask(flaw, kinds), [_digits(t, width) for t in terms]
  parts, carry, out = [], 0, []
  for i in range(width):
    c_in = _take_carry(ask, carry)
    col = [d[i] for d in cols] + [c_in]
    s = sum(col)
    carry = s // 10
    out.append(s % 10)
    parts.append("+".join(map(str, col)) + f"={s % 10},{carry};")
  lead = _take_carry(ask, carry)
  value = int("".join(map(str, ([lead] if lead else []) + out[::-1])))
  return "".join(parts) + f"{ANSWER_MARK}{value}", value


def math_chain(a: int, b: int, width: int, flaw: Flaw = _KEEP,
               kinds: list[str] | None = None) -> tuple[str, int]:
  """a + b by columns, units first: "a_i+b_i+carry=digit,carry_out;", then the value the chain
  arrives at. Sites: every incoming carry and the final carry (dropped: added as 0)."""
  return sum_chain((a, b), width, flaw, kinds)


def math_sites(a: int, b: int, width: int) -> int:
  return len(site_kinds(lambda f, k: math_chain(a, b, width, f, k)))


def sum_sites(terms: Sequence[int], width: int) -> int:
  return len(site_kinds(lambda f, k: sum_chain(terms, width, f, k)))


def code_chain(x: int, y: int, width: int, flaw: Flaw = _KEEP, kinds: list[str] | None = None,
               signed: bool = False) -> tuple[str, str]:
  """The program f(x) = x + c (or x - c) from one shown pair f(x) = y: c = |y - x| by column
  subtraction, units first: "hi_i-lo_i-borrow=digit,borrow_out;", then the program. Sites: every
  incoming borrow (dropped: subtracted as 0).

  signed: the chain first says which way it subtracts, "y-x:" (y >= x, program x+c) or "x-y:"
  (program x-c), then subtracts the second from the first. That choice is a "sign" site (asked
  first, when x != y); flawed, the chain subtracts the larger from the smaller, a final borrow
  left over, and writes the program of the way it chose: x+(10^width - c) for x-c, or the
  reverse, a program that is off by a constant on every input."""
  ask = _Ask(flaw, kinds)
  if signed:
    y_first = y >= x
    if x != y and ask("sign"):
      y_first = not y_first
    top, low, sign = (y, x, "+") if y_first else (x, y, "-")
    head = "y-x:" if y_first else "x-y:"
  else:
    (top, low, sign), head = ((y, x, "+") if y >= x else (x, y, "-")), ""
  dt, dl = _digits(top, width), _digits(low, width)
  parts, borrow, out = [head], 0, []
  for i in range(width):
    b_in = borrow
    if borrow:
      b_in = 0 if ask("borrow") else 1
    d = dt[i] - dl[i] - b_in
    borrow, d = int(d < 0), d % 10
    out.append(d)
    parts.append(f"{dt[i]}-{dl[i]}-{b_in}={d},{borrow};")
  program = f"x{sign}{int(''.join(map(str, out[::-1])))}"
  return "".join(parts) + f"{ANSWER_MARK}{program}", program


def code_sites(x: int, y: int, width: int, signed: bool = False) -> int:
  return len(site_kinds(lambda f, k: code_chain(x, y, width, f, k, signed)))


def logic_chain(links: list[str], flaw: Flaw = _KEEP, kinds: list[str] | None = None,
                read_sites: bool = False) -> tuple[str, str]:
  """The order assembled from the links as they are listed ("a<b" or "b>a"): each step restates
  its link as "lo<hi:" and writes the fragment of the order it just made, by the first rule that
  applies: a new fragment "lo hi"; hi after the fragment holding lo; lo before the fragment
  holding hi; the fragment holding lo joined to the one holding hi. Every step reads its link
  and the fragments written before it, never the whole prompt (the order's first item, which
  a chain starting there must find among all the links, is what a small model does not learn).
  Sites: every step ("order"; flawed: the two sides of that step in the wrong order, carried on).

  read_sites: every link written with '>' is first a "read" site (flawed: read as if its '>'
  were '<', so the step restates and assembles the reversed link; its "order" site is still
  asked but changes nothing, so the two never cancel). Either flaw puts the two sides of a step
  the wrong way round in a fragment; no later step reorders a fragment, so the answer is wrong."""
  ask = _Ask(flaw, kinds)
  frags: list[list[str]] = []
  parts = []
  for left, op, right in links:
    lo, hi = (left, right) if op == "<" else (right, left)
    misread = read_sites and op == ">" and ask("read")
    swap = ask("order") and not misread
    if misread:
      lo, hi = hi, lo
    f_lo = next((f for f in frags if lo in f), None)
    f_hi = next((f for f in frags if hi in f), None)
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


def logic_sites(links: list[str], read_sites: bool = False) -> int:
  return len(links) + (sum(link[1] == ">" for link in links) if read_sites else 0)


def tally_answer(counts: dict[str, int]) -> str:
  return "".join(f"{c}{counts[c]}" for c in sorted(counts))


def strings_chain(word: str, flaw: Flaw = _KEEP, kinds: list[str] | None = None,
                  sort_sites: bool = False) -> tuple[str, str]:
  """A running tally over the word: "letter count;" per letter, then the counts in alphabetical
  order. Sites: every repeated letter ("count"; flawed: not counted, its tally repeats).

  sort_sites: the answer's letters are placed in the order they were first seen, each inserted
  before the first letter already placed that comes after it alphabetically; each letter that
  has such a letter to go before is a "sort" site (flawed: placed last, where it was seen; the
  letter it should precede stays before it, so the answer is out of order)."""
  ask = _Ask(flaw, kinds)
  counts: dict[str, int] = {}
  parts = []
  for ch in word:
    step = 1
    if ch in counts:
      step = 0 if ask("count") else 1
    counts[ch] = counts.get(ch, 0) + step
    parts.append(f"{ch}{counts[ch]};")
  if sort_sites:
    placed: list[str] = []
    for ch in counts:   # in the order first seen
      after = next((i for i, p in enumerate(placed) if p > ch), None)
      if after is None or ask("sort"):
        placed.append(ch)
      else:
        placed.insert(after, ch)
    answer = "".join(f"{c}{counts[c]}" for c in placed)
  else:
    answer = tally_answer(counts)
  return "".join(parts) + f"{ANSWER_MARK}{answer}", answer


def strings_sites(word: str, sort_sites: bool = False) -> int:
  return len(site_kinds(lambda f, k: strings_chain(word, f, k, sort_sites)))


def site_kinds(write: Callable[[Flaw, list[str]], object]) -> list[str]:
  """The kind of each site the correct chain asks its `flaw` at, in order: `write(flaw, kinds)`
  is a writer above with its example's arguments bound."""
  kinds: list[str] = []
  write(_KEEP, kinds)
  return kinds
