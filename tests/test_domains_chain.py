"""The toy domains' chain form (smjax.domains.chains): checked against chains written here from
the docstrings' formats with plain arithmetic, answers and split rules re-derived from the prompt
text (tests/domain_truths.py); the verifier reads the final answer only; mistakes, the base's
mixture rate, disjoint splits, errors; the hard level's sites and kinds; the short form
unchanged."""

import collections
import hashlib
import itertools
import json
import random
import re

import numpy as np
import pytest

from domain_truths import digit_sum, logic_truth, math_sum_truth, strings_truth
from smjax.domains import get_domain
from smjax.domains.base import Example
from smjax.domains.chains import HARD_MIN_SITES
from smjax.models.tokenizer import CharTokenizer
from smjax.rewards.sandbox import SandboxPool

TOY = ("math", "code", "logic", "strings")


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(2) as p:
    yield p


# ================================================================================ chain form
# The chain form (smjax.domains.chains) is checked against chains written here from the
# docstrings' formats with plain arithmetic, and answers re-derived from the prompt text.
CHAIN_MAX = {"math": 3, "code": 3, "logic": 3, "strings": 3}  # max difficulty in the chain form
HARD = 3   # the hard level: >= HARD_MIN_SITES sites of >= 2 kinds in every example


def _chain_dom(name, d=1):
  return get_domain(name, difficulty=d, form="chain")


def _digit(n, i):
  return n // 10 ** i % 10


def _kinds(**counts):
  """Sites by kind, the kinds without a site left out (as Counter(dom.chain_site_kinds(e)))."""
  return collections.Counter({k: v for k, v in counts.items() if v})


def ref_math_chain(a, b, width):
  """Column addition, units first: "a_i+b_i+carry=digit,carry_out;", then #a+b; and the number
  of carries (each carry out is one site: consumed by the next column or the final digit)."""
  parts, carry, carries = [], 0, 0
  for i in range(width):
    s = _digit(a, i) + _digit(b, i) + carry
    parts.append(f"{_digit(a, i)}+{_digit(b, i)}+{carry}={s % 10},{s // 10};")
    carry = s // 10
    carries += carry
  return "".join(parts) + f"#{a + b}", carries


def ref_sum3_chain(a, b, c):
  """Three 3-digit terms by columns, units first: "a_i+b_i+c_i+carry=digit,carry_out;", then
  #a+b+c; and the sites by kind: each carry out of 1 or 2 may be dropped ("carry"), each carry
  out of 2 taken as 1 ("carry2")."""
  parts, carry, kinds = [], 0, collections.Counter()
  for i in range(3):
    s = _digit(a, i) + _digit(b, i) + _digit(c, i) + carry
    parts.append(f"{_digit(a, i)}+{_digit(b, i)}+{_digit(c, i)}+{carry}={s % 10},{s // 10};")
    carry = s // 10
    kinds.update(["carry"] * (carry > 0) + ["carry2"] * (carry == 2))
  return "".join(parts) + f"#{a + b + c}", kinds


def ref_code_signed_chain(x, y, width):
  """Difficulty 2-3: "y-x:" when y >= x (program x+c) or "x-y:" (program x-c), then the larger
  minus the smaller by columns, units first; and the sites by kind: the sign when x != y, and
  each borrow."""
  top, low = max(x, y), min(x, y)
  head, program = ("y-x:", f"x+{y - x}") if y >= x else ("x-y:", f"x-{x - y}")
  parts, borrow, borrows = [head], 0, 0
  for i in range(width):
    d = _digit(top, i) - _digit(low, i) - borrow
    out = int(d < 0)
    parts.append(f"{_digit(top, i)}-{_digit(low, i)}-{borrow}={d % 10},{out};")
    borrow, borrows = out, borrows + out
  return "".join(parts) + f"#{program}", _kinds(sign=int(x != y), borrow=borrows)


def ref_code_chain(x, y, width=3):
  """c = y - x (y >= x in the chain form) by column subtraction, units first, then #x+c; and the
  number of borrows."""
  assert y >= x
  parts, borrow, borrows = [], 0, 0
  for i in range(width):
    d = _digit(y, i) - _digit(x, i) - borrow
    out = int(d < 0)
    parts.append(f"{_digit(y, i)}-{_digit(x, i)}-{borrow}={d % 10},{out};")
    borrow = out
    borrows += out
  return "".join(parts) + f"#x+{y - x}", borrows


def ref_logic_chain(prompt):
  """Links in listed order, each restated "lo<hi:", then the piece of the order it completes:
  kept here as a map item -> piece (a string), rebuilt from the two pieces it touches."""
  piece, parts = {}, []
  links = prompt[:-1].split(",")
  for link in links:
    lo, hi = (link[0], link[2]) if link[1] == "<" else (link[2], link[0])
    made = piece.get(lo, lo) + piece.get(hi, hi)
    for ch in made:
      piece[ch] = made
    parts.append(f"{lo}<{hi}:{made};")
  order = piece[links[0][0]]
  return "".join(parts) + f"#{order}", len(links)


def ref_strings_chain(word):
  seen = collections.Counter()
  parts = []
  for ch in word:
    seen[ch] += 1
    parts.append(f"{ch}{seen[ch]};")
  return "".join(parts) + "#" + strings_truth(f"count:{word}=")[0], len(word) - len(set(word))


def code_chain_truth(prompt):
  """(x, y, c, held_out) from a chain-form code prompt "f(023)=058;f(x)=" (3 or 4 digits): f(x) =
  x + c, c < 0 for the x-c of difficulty 2-3; held out by (the smaller of x and y, |c|), so that
  f(x)=y and its mirror f(y)=x share a split."""
  x, y = map(int, re.fullmatch(r"f\((\d{3,4})\)=(\d{3,4});f\(x\)=", prompt).groups())
  c = y - x
  return x, y, c, (3 * digit_sum(min(x, y)) + digit_sum(abs(c))) % 5 == 0


def _truth(name, prompt, d):
  """(the gold chain written here, its sites by kind, the answer, held_out, split key) of an
  example of chain-form difficulty d."""
  if name == "math":
    if prompt.count("+") == 2:   # the hard level: three 3-digit terms
      terms = tuple(map(int, re.fullmatch(r"(\d{3})\+(\d{3})\+(\d{3})=", prompt).groups()))
      total, held = math_sum_truth(prompt)
      chain, kinds = ref_sum3_chain(*terms)
      return chain, kinds, str(total), held, tuple(sorted(terms))  # any order: one split
    a, b = map(int, re.fullmatch(r"(\d+)\+(\d+)=", prompt).groups())
    width = len(re.match(r"\d+", prompt).group())
    chain, sites = ref_math_chain(a, b, width)
    return (chain, _kinds(carry=sites), str(a + b),
            (3 * digit_sum(a) + digit_sum(b)) % 5 == 0, (a, b))
  if name == "code":
    x, y, c, held = code_chain_truth(prompt)
    if d >= 2:
      chain, kinds = ref_code_signed_chain(x, y, len(re.search(r"\d+", prompt).group()))
    else:
      chain, borrows = ref_code_chain(x, y)
      kinds = _kinds(borrow=borrows)
    return chain, kinds, f"x+{c}" if c >= 0 else f"x-{-c}", held, (min(x, y), abs(c))
  if name == "logic":
    order, held = logic_truth(prompt)
    links = prompt[:-1].split(",")
    pos = {ch: i for i, ch in enumerate(order)}
    template = ("".join(str(min(pos[l[0]], pos[l[2]])) for l in links) + "|"
                + "".join("1" if l[1] == ">" else "0" for l in links))
    chain, sites = ref_logic_chain(prompt)
    assert chain.endswith("#" + order)  # the pieces end as the order logic_truth derives
    reads = sum(l[1] == ">" for l in links) if d == HARD else 0   # '>' links read as '<'
    return chain, _kinds(order=sites, read=reads), order, held, template
  word = re.fullmatch(r"count:([a-z]+)=", prompt).group(1)
  answer, held = strings_truth(prompt)
  chain, sites = ref_strings_chain(word)
  seen = "".join(dict.fromkeys(word))   # letters in the order first seen
  # Hard level: a letter first seen after one that comes later alphabetically may be listed
  # where it was seen.
  sorts = sum(any(p > ch for p in seen[:i]) for i, ch in enumerate(seen)) if d == HARD else 0
  return chain, _kinds(count=sites, sort=sorts), answer, held, word


def chain_truth(name, prompt, d=1):
  """(the gold chain written here, its number of sites, the answer, held_out, split key)."""
  chain, kinds, answer, held, key = _truth(name, prompt, d)
  return chain, sum(kinds.values()), answer, held, key


def kinds_truth(name, prompt, d=1):
  """The example's sites by kind, counted here."""
  return _truth(name, prompt, d)[1]


def _d(e):
  return e.metadata.get("difficulty", 1)


def wrong_answer(name, answer):
  if name == "math":
    return str(int(answer) + 1)
  if name == "code":
    return f"x{answer[1]}{int(answer[2:]) + 1}"
  if name == "logic":
    return answer[::-1]
  return answer[:-1] + str(int(answer[-1]) % 9 + 1)  # strings: the last letter's count changed


CHAIN_CASES = [(n, d) for n in TOY for d in range(CHAIN_MAX[n] + 1)]


@pytest.mark.parametrize("name,d", CHAIN_CASES)
def test_chain_gold_solutions_match_independent_chains(name, d, pool):
  """Gold chains equal the ones written here, end in the independent answer, verify to 1 (code:
  in the sandbox, on the hidden inputs), and fit the char tokenizer."""
  dom, tok = _chain_dom(name, d), CharTokenizer()
  n = 150 if name == "code" else 400
  exs = dom.generate("train", n, 5) + dom.generate("test", n, 5)
  for e in exs:
    chain, sites, answer, _, _ = chain_truth(name, e.prompt, d)
    assert e.solution == chain, (e.prompt, e.solution, chain)
    assert e.solution.count("#") == 1 and "\n" not in e.solution
    assert dom.extract_answer(e.solution) == answer == e.solution.split("#")[1]
    assert dom.chain_sites(e) == sites, (e.prompt, dom.chain_sites(e), sites)
    assert collections.Counter(dom.chain_site_kinds(e)) == kinds_truth(name, e.prompt, d)
    assert tok.decode(tok.encode(e.prompt + e.solution)) == e.prompt + e.solution
    assert e.metadata["difficulty"] == d
    if name == "code":  # the hidden tests are f(x) = x + c on every input (c < 0: x - |c|)
      c = code_chain_truth(e.prompt)[2]
      assert e.reference["outputs"] == [x + c for x in e.reference["inputs"]]
      assert len(e.reference["inputs"]) == 5
    else:
      assert str(e.reference) == answer
  if name == "code":
    assert dom.verify_many(exs, [e.solution for e in exs], pool=pool) == [1.0] * len(exs)
  else:
    assert all(dom.verify(e, e.solution) == 1.0 for e in exs)


@pytest.mark.parametrize("name,d", CHAIN_CASES)
def test_chain_length_before_answer(name, d):
  """The chain before '#' is 10 chars per math column (12 with three terms), 10 per code column
  (3 columns; 4 at the hard level, after 4 for "y-x:" or "x-y:" from difficulty 2), 3 per
  strings letter, and per logic link 5 plus the piece it makes (2 to n items, n = d + 4):
  >= 24 chars at difficulty >= 1 (difficulty 0: math 20, strings 18, logic 23 or more, below
  the ~24 of smjax.domains.chains' docstring)."""
  exs = _chain_dom(name, d).generate("train", 200, 1) + _chain_dom(name, d).generate(
      "test", 200, 1)
  lengths = {len(e.solution.split("#")[0]) for e in exs}
  if name == "logic":
    n = d + 4
    assert all(len(ref_logic_chain(e.prompt)[0].split("#")[0]) == len(e.solution.split("#")[0])
               for e in exs)
    # Over every order of listing the links i (joining items i and i + 1) of a chain of n: each
    # piece is the run of items its links so far connect.
    made = []
    for order in itertools.permutations(range(n - 1)):
      done, size = set(), 0
      for i in order:
        done.add(i)
        lo = next(j for j in range(i, -2, -1) if j not in done)   # link left of the run
        hi = next(j for j in range(i, n) if j not in done)        # link right of the run
        size += hi - lo
      made.append(5 * (n - 1) + size)
    assert min(made) <= min(lengths) and max(lengths) <= max(made)
    assert len(lengths) > 1   # the length depends on the order the links are listed in
    want = min(lengths)
  else:
    want = {"math": (20, 30, 40, 36)[d], "code": (30, 30, 34, 44)[d],
            "strings": 3 * (6, 8, 9, 10)[d]}[name]
    assert lengths == {want}
  if d >= 1:
    assert want >= 24


# Worked by hand from the module docstrings: (domain, difficulty, example, gold chain, chain with
# every site flawed, sites).
def _hand_examples():
  ex = lambda name, prompt, ref, **meta: Example(prompt=prompt, reference=ref, solution="",
                                                  domain=name, metadata=meta)
  return [(name, 1, *case) for name, *case in _hand_examples_d1()] + [
      # Three terms: a carry of 2 is two sites; dropped wins over taken as 1.
      ("math", HARD, ex("math", "573+089+264=", 926, a=573, b=89, c=264, op="+", width=3),
       "3+9+4+0=6,1;7+8+6+1=2,2;5+0+2+2=9,0;#926",
       "3+9+4+0=6,1;7+8+6+0=1,2;5+0+2+0=7,0;#716", 3),
      ("math", HARD, ex("math", "999+999+999=", 2997, a=999, b=999, c=999, op="+", width=3),
       "9+9+9+0=7,2;9+9+9+2=9,2;9+9+9+2=9,2;#2997",
       "9+9+9+0=7,2;9+9+9+0=7,2;9+9+9+0=7,2;#777", 6),   # the leading 2 dropped
      # The sign flawed: the smaller minus the larger, a final borrow left over: x+(1000-65).
      ("code", 2, ex("code", "f(147)=082;f(x)=", {"inputs": [147, 0], "outputs": [82, -65]},
                     width=3, signed=True),
       "x-y:7-2-0=5,0;4-8-0=6,1;1-0-1=0,0;#x-65",
       "y-x:2-7-0=5,1;8-4-0=4,0;0-1-0=9,1;#x+945", 2),
      ("code", 2, ex("code", "f(082)=082;f(x)=", {"inputs": [82, 0], "outputs": [82, 0]},
                     width=3, signed=True),
       "y-x:2-2-0=0,0;8-8-0=0,0;0-0-0=0,0;#x+0", "y-x:2-2-0=0,0;8-8-0=0,0;0-0-0=0,0;#x+0", 0),
      ("code", HARD, ex("code", "f(0473)=2128;f(x)=",
                        {"inputs": [473, 0], "outputs": [2128, 1655]}, width=4, signed=True),
       "y-x:8-3-0=5,0;2-7-0=5,1;1-4-1=6,1;2-0-1=1,0;#x+1655",
       "x-y:3-8-0=5,1;7-2-0=5,0;4-1-0=3,0;0-2-0=8,1;#x-8355", 3),
      # A misread '>' link: restated and assembled reversed; its order site then changes nothing.
      ("logic", HARD, ex("logic", "p<d,j>l,s<n,s>a,d<a,n<l:", "pdasnlj", read_sites=True),
       "p<d:pd;l<j:lj;s<n:sn;a<s:asn;d<a:pdasn;n<l:pdasnlj;#pdasnlj",
       "p<d:dp;j<l:jl;s<n:ns;s<a:nsa;d<a:nsadp;n<l:jlnsadp;#jlnsadp", 8),
      # Every letter placed where it was first seen: x c g s b.
      ("strings", HARD, ex("strings", "count:xcxgccgsbg=", "b1c3g3s1x2", word="xcxgccgsbg",
                           sort_sites=True),
       "x1;c1;x2;g1;c2;c3;g2;s1;b1;g3;#b1c3g3s1x2",
       "x1;c1;x1;g1;c1;c1;g1;s1;b1;g1;#x1c1g1s1b1", 9),
  ]


def _hand_examples_d1():
  """The difficulty 0-2 cases: (domain, example, gold chain, every site flawed, sites)."""
  ex = lambda name, prompt, ref, **meta: Example(prompt=prompt, reference=ref, solution="",
                                                  domain=name, metadata=meta)
  return [
      ("math", ex("math", "573+089=", 662, a=573, b=89, op="+", width=3),
       "3+9+0=2,1;7+8+1=6,1;5+0+1=6,0;#662",
       "3+9+0=2,1;7+8+0=5,1;5+0+0=5,0;#552", 2),  # both carries dropped: 662 - 10 - 100
      ("math", ex("math", "999+001=", 1000, a=999, b=1, op="+", width=3),
       "9+1+0=0,1;9+0+1=0,1;9+0+1=0,1;#1000",
       "9+1+0=0,1;9+0+0=9,0;9+0+0=9,0;#990", 3),  # a dropped carry stops the ripple
      ("math", ex("math", "00+00=", 0, a=0, b=0, op="+", width=2),
       "0+0+0=0,0;0+0+0=0,0;#0", "0+0+0=0,0;0+0+0=0,0;#0", 0),
      ("math", ex("math", "50+50=", 100, a=50, b=50, op="+", width=2),
       "0+0+0=0,0;5+5+0=0,1;#100", "0+0+0=0,0;5+5+0=0,1;#0", 1),  # final carry dropped
      ("code", ex("code", "f(023)=058;f(x)=", {"inputs": [23, 0], "outputs": [58, 35]}),
       "8-3-0=5,0;5-2-0=3,0;0-0-0=0,0;#x+35", "8-3-0=5,0;5-2-0=3,0;0-0-0=0,0;#x+35", 0),
      ("code", ex("code", "f(047)=082;f(x)=", {"inputs": [47, 0], "outputs": [82, 35]}),
       "2-7-0=5,1;8-4-1=3,0;0-0-0=0,0;#x+35", "2-7-0=5,1;8-4-0=4,0;0-0-0=0,0;#x+45", 1),
      ("code", ex("code", "f(099)=100;f(x)=", {"inputs": [99, 0], "outputs": [100, 1]}),
       "0-9-0=1,1;0-9-1=0,1;1-0-1=0,0;#x+1", "0-9-0=1,1;0-9-0=1,1;1-0-0=1,0;#x+111", 2),
      ("logic", ex("logic", "q<m,t>m,z>t:", "qmtz"),
       "q<m:qm;m<t:qmt;t<z:qmtz;#qmtz", "q<m:mq;m<t:tmq;t<z:ztmq;#ztmq", 3),
      ("logic", ex("logic", "t<z,m>q,t>m:", "qmtz"),   # two pieces, then joined
       "t<z:tz;q<m:qm;m<t:qmtz;#qmtz", "t<z:zt;q<m:mq;m<t:ztmq;#ztmq", 3),
      ("strings", ex("strings", "count:qbqqebeq=", "b2e2q4", word="qbqqebeq"),
       "q1;b1;q2;q3;e1;b2;e2;q4;#b2e2q4", "q1;b1;q1;q1;e1;b1;e1;q1;#b1e1q1", 5),
  ]


def test_chain_hand_written_examples(pool):
  code_cases = []
  for name, d, e, gold, flawed, sites in _hand_examples():
    dom = _chain_dom(name)   # the example's metadata says how its chain is written
    assert dom.chain_solution(e, lambda s: False) == gold, (e.prompt, gold)
    assert dom.chain_solution(e, lambda s: True) == flawed, (e.prompt, flawed)
    assert dom.chain_sites(e) == sites == len(dom.chain_site_kinds(e)), e.prompt
    assert chain_truth(name, e.prompt, d)[:2] == (gold, sites)  # the writers here agree
    assert collections.Counter(dom.chain_site_kinds(e)) == kinds_truth(name, e.prompt, d)
    if name == "code":
      code_cases += [(e, gold, 1.0), (e, flawed, float(sites == 0))]
    else:
      assert dom.verify(e, gold) == 1.0
      assert dom.verify(e, flawed) == float(sites == 0)
  # The docstring examples' prompts are what the generators write for those operands.
  assert chain_truth("math", "573+089=")[0] == "3+9+0=2,1;7+8+1=6,1;5+0+1=6,0;#662"
  dom = _chain_dom("code")
  exs, comps, want = zip(*code_cases)
  assert dom.verify_many(list(exs), list(comps), pool=pool) == list(want)


# The hard level's examples above with the sites of one kind flawed (or the sites listed), by
# hand: (prompt, kind or site indices, chain).
ONE_KIND = [
    ("573+089+264=", "carry", "3+9+4+0=6,1;7+8+6+0=1,2;5+0+2+0=7,0;#716"),
    ("573+089+264=", "carry2", "3+9+4+0=6,1;7+8+6+1=2,2;5+0+2+1=8,0;#826"),
    ("999+999+999=", "carry2", "9+9+9+0=7,2;9+9+9+1=8,2;9+9+9+1=8,2;#1887"),  # each 2 as 1
    ("f(147)=082;f(x)=", "sign", "y-x:2-7-0=5,1;8-4-1=3,0;0-1-0=9,1;#x+935"),  # 1000 - 65
    ("f(147)=082;f(x)=", "borrow", "x-y:7-2-0=5,0;4-8-0=6,1;1-0-0=1,0;#x-165"),
    ("f(0473)=2128;f(x)=", "sign", "x-y:3-8-0=5,1;7-2-1=4,0;4-1-0=3,0;0-2-0=8,1;#x-8345"),
    ("f(0473)=2128;f(x)=", "borrow", "y-x:8-3-0=5,0;2-7-0=5,1;1-4-0=7,1;2-0-0=2,0;#x+2755"),
    ("p<d,j>l,s<n,s>a,d<a,n<l:", "read",
     "p<d:pd;j<l:jl;s<n:sn;s<a:sna;d<a:pdsna;n<l:pdsnajl;#pdsnajl"),
    ("p<d,j>l,s<n,s>a,d<a,n<l:", "order",
     "p<d:dp;l<j:jl;s<n:ns;a<s:nsa;d<a:nsadp;n<l:jlnsadp;#jlnsadp"),
    ("count:xcxgccgsbg=", "sort", "x1;c1;x2;g1;c2;c3;g2;s1;b1;g3;#x2c3g3s1b1"),
    ("count:xcxgccgsbg=", "count", "x1;c1;x1;g1;c1;c1;g1;s1;b1;g1;#b1c1g1s1x1"),
    # Only c (first seen after x) placed where seen; g, s and b then go before the first
    # letter after them: g before x, s before x, b before g.
    ("count:xcxgccgsbg=", (5,), "x1;c1;x2;g1;c2;c3;g2;s1;b1;g3;#b1g3s1x2c3"),
]


@pytest.mark.parametrize("prompt,which,want", ONE_KIND)
def test_hard_level_flaws_of_one_kind(prompt, which, want, pool):
  """Each kind of site alone makes the final answer wrong, carried on as the docstrings say."""
  name, _, e, gold, _, _ = next(h for h in _hand_examples() if h[2].prompt == prompt)
  dom = _chain_dom(name)
  kinds = dom.chain_site_kinds(e)
  sites = ({i for i, k in enumerate(kinds) if k == which} if isinstance(which, str)
           else set(which))
  assert sites and (isinstance(which, str) or len(sites) < kinds.count("sort"))
  assert dom.chain_solution(e, lambda s: s in sites) == want
  assert dom.extract_answer(want) != dom.extract_answer(gold)
  if name == "code":
    assert dom.verify_many([e, e], [want, gold], pool=pool) == [0.0, 1.0]
  else:
    assert (dom.verify(e, want), dom.verify(e, gold)) == (0.0, 1.0)


def _chain_completions(dom, name, e):
  """(completion, expected reward) for one example: only the final answer after the last '#' on
  the first line counts."""
  chain, _, answer, _, _ = chain_truth(name, e.prompt, _d(e))
  body = chain.split("#")[0]
  flawed_body = dom.chain_solution(e, lambda s: True).split("#")[0]
  wrong = wrong_answer(name, answer)
  cases = [
      (chain, 1.0), (f"  {chain}  \n", 1.0), (f"{chain}\nmore text #{wrong}", 1.0),
      (f"garbage steps; 1+1=3;#{answer}", 1.0), (f"#{answer}", 1.0),  # wrong/no chain, right answer
      (body[::-1] + f"#{answer}", 1.0), (f"{flawed_body}#{answer}", 1.0),
      (f"{body}#{wrong}#{answer}", 1.0),  # the last mark counts
      (f"{body}#{answer}#{wrong}", 0.0), (f"{body}#{wrong}", 0.0),  # right chain, wrong answer
      (f"{body}#{answer[:-1]}", 0.0),  # cut inside the answer
      (body, 0.0), (answer, 0.0), (body + answer, 0.0),  # no mark: truncated
      (f"{body}\n#{answer}", 0.0),  # the answer not on the first line
      ("", 0.0), ("\n", 0.0), ("#", 0.0), (f"{body}# \n{answer}", 0.0),
  ]
  cases += [(chain[:k], 0.0) for k in range(0, len(chain) - len(answer) + 1, 3)]
  cases.append((chain[:len(chain) - len(answer)], 0.0))  # cut right after the mark
  if name == "code":
    x, y, c, _ = code_chain_truth(e.prompt)
    cases += [(f"{body}#{c}+x", 1.0), (f"{body}#(x*2+{2 * c})//2", 1.0), (f"#x-(-{c})", 1.0),
              (f"{body}#{y}", 0.0), (f"{body}#x", float(c == 0)), (f"{body}#x+", 0.0),
              (f"{body}#1/0", 0.0), (f"{body}#{'x+' * 40}x", 0.0)]
  if name == "math":
    cases += [(f"{body}#{answer}.0", 1.0), (f"{body}#0{answer}", 1.0), (f"{body}#{answer}0", 0.0),
              (f"{body}#nan", 0.0), (f"{body}#inf", 0.0), (f"{body}#{'9' * 40}", 0.0)]
  return cases


@pytest.mark.parametrize("name,d", [(n, d) for n in TOY for d in (1, HARD)] + [("code", 2)])
def test_chain_verifier_reads_the_final_answer_only(name, d, pool):
  """A right chain scores 1, a wrong (or flawed) chain ending in the right answer scores 1, a
  truncated chain or a wrong answer 0."""
  dom = _chain_dom(name, d)
  exs = dom.generate("train", 15, 2) + dom.generate("test", 15, 2)
  flat = [(e, comp, want) for e in exs for comp, want in _chain_completions(dom, name, e)]
  if name == "code":
    got = dom.verify_many([f[0] for f in flat], [f[1] for f in flat], pool=pool)
  else:
    got = [dom.verify(e, comp) for e, comp, _ in flat]
  bad = [(e.prompt, comp, want, g) for (e, comp, want), g in zip(flat, got) if g != want]
  assert not bad, bad[:10]


@pytest.mark.parametrize("name,d", CHAIN_CASES)
def test_chain_mistakes(name, d, pool):
  """Every site flawed: a wrong final answer wherever there is a site; no site flawed: the gold
  chain; `flaw` is asked once per site, in order."""
  dom = _chain_dom(name, d)
  n = 150 if name == "code" else 400
  exs = dom.generate("train", n, 9) + dom.generate("test", n, 9)
  flawed = []
  for e in exs:
    _, sites, answer, _, _ = chain_truth(name, e.prompt, d)
    asked = []
    assert dom.chain_solution(e, lambda s: asked.append(s) or False) == e.solution
    assert asked == list(range(sites)) and dom.chain_sites(e) == sites
    bad = dom.chain_solution(e, lambda s: True)
    flawed.append(bad)
    assert bad.count("#") == 1 and len(bad.split("#")[0]) == len(e.solution.split("#")[0])
    if sites:
      assert dom.extract_answer(bad) != answer, (e.prompt, bad)
    else:
      assert bad == e.solution
  want = [float(dom.chain_sites(e) == 0) for e in exs]
  if name == "code":
    assert dom.verify_many(exs, flawed, pool=pool) == want
  else:
    assert [dom.verify(e, c) for e, c in zip(exs, flawed)] == want
  if name in ("logic", "strings") or d == HARD:
    assert min(want) == max(want) == 0.0  # every logic / strings / hard chain has a site
  else:   # (code difficulty 2: only c = 0, x == y, has no site)
    assert 0 < sum(want) < len(want) / (20 if (name, d) == ("code", 2) else 1)


def _is_correct(name, e, completion):
  return _chain_dom(name).extract_answer(completion) == chain_truth(name, e.prompt, _d(e))[2]


@pytest.mark.parametrize("name,d", [(n, d) for n in TOY for d in (1, HARD)])
def test_sample_solution_correct_fraction(name, d, pool):
  """Sites flawed independently: correct at the mixture's rate p (within binomial noise), at
  the hard level too, where every chain has several sites of two kinds."""
  dom = _chain_dom(name, d)
  exs = [e for e in dom.generate("train", 1500, 11) + dom.generate("test", 1500, 11)
         if dom.chain_sites(e) > 0][:2000]
  assert len(exs) >= 1500
  rng = random.Random(1234)
  for p in (0.25, 0.6):
    comps = [dom.sample_solution(e, rng, p) for e in exs]
    correct = [_is_correct(name, e, c) for e, c in zip(exs, comps)]
    frac, sigma = np.mean(correct), np.sqrt(p * (1 - p) / len(exs))
    assert abs(frac - p) < 4 * sigma, (name, p, frac, sigma)
    # The reward agrees with the independent check (code: a slice, run in the sandbox).
    if name == "code":
      assert dom.verify_many(exs[:150], comps[:150], pool=pool) == [float(c) for c in
                                                                    correct[:150]]
    else:
      assert [dom.verify(e, c) for e, c in zip(exs, comps)] == [float(c) for c in correct]
    # Mistakes land at several independent places: some wrong samples differ from the gold
    # chain in >= 2 steps (a dropped final carry changes the answer alone).
    steps = lambda chain: re.split("[;#]", chain)
    diffs = [sum(a != b for a, b in zip(steps(c), steps(e.solution)))
             for e, c in zip(exs, comps) if c != e.solution]
    assert max(diffs) >= 2 and min(diffs) >= 1
  for e in exs[:200]:  # the extremes: p = 1 is the gold chain, p = 0 flaws every site
    assert dom.sample_solution(e, rng, 1.0) == e.solution
    assert dom.sample_solution(e, rng, 0.0) == dom.chain_solution(e, lambda s: True)


@pytest.mark.parametrize("name", ["math", "code"])
def test_sample_solution_without_sites_is_always_correct(name, pool):
  dom = _chain_dom(name)
  exs = [e for e in dom.generate("train", 600, 4) + dom.generate("test", 600, 4)
         if chain_truth(name, e.prompt)[1] == 0]
  assert len(exs) > 50 and all(dom.chain_sites(e) == 0 for e in exs)
  rng = random.Random(0)
  comps = [dom.sample_solution(e, rng, p) for e in exs for p in (0.0, 0.25, 0.6)]
  assert comps == [e.solution for e in exs for _ in range(3)]
  assert all(_is_correct(name, e, e.solution) for e in exs)
  if name == "code":
    exs = exs[:150]
    assert dom.verify_many(exs, [e.solution for e in exs], pool=pool) == [1.0] * len(exs)
  else:
    assert all(dom.verify(e, e.solution) == 1.0 for e in exs)


@pytest.mark.parametrize("name,d", [(n, d) for n in TOY for d in sorted({1, 2, CHAIN_MAX[n]})])
def test_chain_splits_disjoint_by_construction(name, d):
  """No held-out prompt is trained on, nor (math's three terms) any reordering of one, nor (code)
  its mirror f(y)=x."""
  dom = _chain_dom(name, d)
  train, test = dom.generate("train", 3000, 0), dom.generate("test", 3000, 0)
  truths = {split: [chain_truth(name, e.prompt, d) for e in exs]
            for split, exs in (("train", train), ("test", test))}
  assert not any(t[3] for t in truths["train"])  # the held-out rule fails on every train example
  assert all(t[3] for t in truths["test"])  # and holds on every test example
  assert not {e.prompt for e in train} & {e.prompt for e in test}
  keys = {split: {t[4] for t in ts} for split, ts in truths.items()}
  assert not keys["train"] & keys["test"]
  assert len(keys["test"]) > 50  # not one repeated example (logic 5 items: 96 of 384 templates)
  if name == "logic":  # the generator's own template key is the one re-derived here
    assert [e.metadata["template"] for e in train + test] == [
        t[4] for t in truths["train"] + truths["test"]]


@pytest.mark.parametrize("name", TOY)
def test_levels_add_sites_and_the_hard_level_has_several_of_two_kinds(name):
  """Mean sites per example grow with the difficulty; at the hard level every example has
  >= HARD_MIN_SITES sites of >= 2 kinds (counted here, and as the domain reports them)."""
  means = []
  for d in range(CHAIN_MAX[name] + 1):
    dom = _chain_dom(name, d)
    exs = dom.generate("train", 1000, 3) + dom.generate("test", 500, 3)
    kinds = [kinds_truth(name, e.prompt, d) for e in exs]
    assert [collections.Counter(dom.chain_site_kinds(e)) for e in exs] == kinds
    means.append(np.mean([sum(k.values()) for k in kinds]))
    if d == HARD:
      assert min(sum(k.values()) for k in kinds) >= HARD_MIN_SITES
      assert min(len(k) for k in kinds) == 2, name
    else:   # the lower levels keep their one kind (code difficulty 2 adds the sign)
      assert max(len(k) for k in kinds) == 1 + ((name, d) == ("code", 2))
  assert all(a < b for a, b in zip(means, means[1:])), (name, means)
  assert means[HARD] >= HARD_MIN_SITES


# (max prompt, max chain) characters per chain-form difficulty 0-3, as the module docstrings say.
LENGTHS = {"math": ((6, 24), (8, 35), (10, 46), (12, 41)),
           "code": ((16, 34), (16, 35), (16, 39), (18, 51)),
           "logic": ((12, 29), (16, 40), (20, 52), (24, 65)),
           "strings": ((13, 25), (15, 33), (16, 38), (17, 43))}


@pytest.mark.parametrize("name", TOY)
def test_chain_lengths_as_documented(name):
  """The longest prompt and chain (answer mark and answer included) of each level, which the
  study's model.max_seq_len and rl.max_new_tokens must fit, are the documented ones."""
  import importlib  # pylint: disable=import-outside-toplevel
  doc = " ".join(importlib.import_module(f"smjax.domains.toy_{name}").__doc__.split())
  prompts, chains_ = zip(*LENGTHS[name])
  assert (f"prompts of at most {', '.join(map(str, prompts[:3]))} and {prompts[3]}; chains of "
          f"at most {', '.join(map(str, chains_[:3]))} and {chains_[3]}") in doc
  for d, (prompt_max, chain_max) in enumerate(LENGTHS[name]):
    dom = _chain_dom(name, d)
    exs = dom.generate("train", 2000, 0) + dom.generate("test", 1000, 0)
    assert max(len(e.prompt) for e in exs) == prompt_max, (name, d)
    assert max(len(e.solution) for e in exs) == chain_max, (name, d)


def test_chain_form_errors():
  with pytest.raises(ValueError, match=r"code: difficulty=4 must be an int in \[0, 3\] in the "
                                       r"chain form"):
    get_domain("code", difficulty=4, form="chain")
  for name in TOY:
    top = CHAIN_MAX[name]
    _chain_dom(name, top)
    with pytest.raises(ValueError, match=rf"difficulty={top + 1} .* in the chain form"):
      get_domain(name, difficulty=top + 1, form="chain")
    with pytest.raises(ValueError, match=r"form='bogus' must be one of \('short', 'chain'\)"):
      get_domain(name, form="bogus")
    with pytest.raises(ValueError, match="chain form"):
      _chain_dom(name).generate("train", 1, 0, difficulty=top + 1)
    assert get_domain(name, difficulty=3).difficulty == 3  # the short form keeps its range


# Short-form examples as commit 309a8fc (before the chain form) generated them: seed 7, the first
# train example, and a hash of 50 train + 50 test (prompt, solution, reference).
SHORT_PINS = {
    ("math", 0): ("2+3=", "5", "4dfefd78b80a73a8"),
    ("math", 1): ("54+5=", "59", "29944e4d7d55b16d"),
    ("math", 2): ("49+62=", "111", "49b612e9f72b4174"),
    ("math", 3): ("461+367=", "828", "a6ef13a24d5e7507"),
    ("code", 0): ("f(6)=11;f(x)=", "x+5", "a67785b695f4ea7e"),
    ("code", 1): ("f(74)=145;f(x)=", "x+71", "b1a4302ae713b950"),
    ("code", 2): ("f(77)=68;f(x)=", "x-9", "e8e260f1636a7037"),
    ("code", 3): ("f(0)=85,f(1)=146;f(x)=", "61*x+85", "0889e81cd7732261"),
    ("logic", 0): ("m>o,m<j:", "omj", "3ff674447c59f600"),
    ("logic", 1): ("q>c,p>z,q<z:", "cqzp", "fa0d873bb7c9d7a2"),
    ("logic", 2): ("x<f,f<u,u<q,d>q:", "xfuqd", "b1549b7699798a89"),
    ("logic", 3): ("w>g,c>w,r<e,x>e,r>c:", "gwcrex", "ecc6a3e64aae9c72"),
    ("strings", 0): ("count:adaa=", "a3d1", "a2c2fa8468b13a19"),
    ("strings", 1): ("count:uuouxu=", "o1u4x1", "ff74e67151e48acb"),
    ("strings", 2): ("count:iwfiwfsi=", "f2i3s1w2", "0f0c0cf8990de181"),
    ("strings", 3): ("count:njnjuojuj=", "j4n2o1u2", "3fcb157a6012213f"),
}


@pytest.mark.parametrize("name", TOY)
def test_short_form_unchanged(name):
  for d in range(4):
    dom = get_domain(name, difficulty=d)
    assert dom.form == "short" and get_domain(name, difficulty=d, form="short").form == "short"
    exs = dom.generate("train", 50, 7) + dom.generate("test", 50, 7)
    blob = json.dumps([(e.prompt, e.solution, e.reference) for e in exs])
    prompt, solution, digest = SHORT_PINS[name, d]
    assert (exs[0].prompt, exs[0].solution) == (prompt, solution)
    assert hashlib.sha256(blob.encode()).hexdigest()[:16] == digest
    for e in exs:
      assert "#" not in e.solution and "\n" not in e.solution
      assert dom.extract_answer(e.solution) == e.solution  # the bare answer
      assert dom.extract_answer(f" {e.solution} \n#zz") == e.solution  # the first line
      assert dom.extract_answer(f"steps#{e.solution}") == f"steps#{e.solution}"  # no mark rule
  dom = get_domain(name)
  e = dom.generate("train", 1, 0)[0]
  if name != "code":
    assert dom.verify(e, e.solution + "\n#zz") == 1.0
    assert dom.verify(e, "#" + e.solution) == 0.0
  chain = _chain_dom(name)
  assert chain.extract_answer(e.solution) is None and chain.extract_answer("a#b\nc#d") == "b"


def test_a_domain_without_a_chain_form_refuses_it_at_construction():
  from smjax.domains.base import ToyDomain  # pylint: disable=import-outside-toplevel

  class ShortOnly(ToyDomain):
    name = "short_only"

    def _make(self, split, rng, difficulty):
      return Example(prompt="1=", reference=1, solution="1", domain=self.name)

    def score(self, example, completion):
      return 1.0

  assert ShortOnly().form == "short"
  with pytest.raises(ValueError, match="short_only: this domain has no chain form"):
    ShortOnly(form="chain")
