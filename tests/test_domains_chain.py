"""The toy domains' chain form (smjax.domains.chains): checked against chains written here from
the docstrings' formats with plain arithmetic, answers and split rules re-derived from the prompt
text (tests/domain_truths.py); the verifier reads the final answer only; mistakes, the base's
mixture rate, disjoint splits, errors; the short form unchanged."""

import collections
import hashlib
import itertools
import json
import random
import re

import numpy as np
import pytest

from domain_truths import digit_sum, logic_truth, strings_truth
from smjax.domains import get_domain
from smjax.domains.base import Example
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
CHAIN_MAX = {"math": 2, "code": 1, "logic": 2, "strings": 2}  # max difficulty in the chain form


def _chain_dom(name, d=1):
  return get_domain(name, difficulty=d, form="chain")


def _digit(n, i):
  return n // 10 ** i % 10


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
  """(x, y, c, held_out) from a chain-form code prompt "f(023)=058;f(x)="."""
  x, y = map(int, re.fullmatch(r"f\((\d{3})\)=(\d{3});f\(x\)=", prompt).groups())
  c = y - x
  return x, y, c, (3 * digit_sum(x) + digit_sum(c)) % 5 == 0


def chain_truth(name, prompt):
  """(the gold chain written here, its number of sites, the answer, held_out, split key)."""
  if name == "math":
    a, b = map(int, re.fullmatch(r"(\d+)\+(\d+)=", prompt).groups())
    width = len(re.match(r"\d+", prompt).group())
    chain, sites = ref_math_chain(a, b, width)
    return chain, sites, str(a + b), (3 * digit_sum(a) + digit_sum(b)) % 5 == 0, (a, b)
  if name == "code":
    x, y, c, held = code_chain_truth(prompt)
    chain, sites = ref_code_chain(x, y)
    return chain, sites, f"x+{c}", held, (x, c)
  if name == "logic":
    order, held = logic_truth(prompt)
    links = prompt[:-1].split(",")
    pos = {ch: i for i, ch in enumerate(order)}
    template = ("".join(str(min(pos[l[0]], pos[l[2]])) for l in links) + "|"
                + "".join("1" if l[1] == ">" else "0" for l in links))
    chain, sites = ref_logic_chain(prompt)
    assert chain.endswith("#" + order)  # the pieces end as the order logic_truth derives
    return chain, sites, order, held, template
  word = re.fullmatch(r"count:([a-z]+)=", prompt).group(1)
  answer, held = strings_truth(prompt)
  chain, sites = ref_strings_chain(word)
  return chain, sites, answer, held, word


def wrong_answer(name, answer):
  if name == "math":
    return str(int(answer) + 1)
  if name == "code":
    return f"x+{int(answer[2:]) + 1}"
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
    chain, sites, answer, _, _ = chain_truth(name, e.prompt)
    assert e.solution == chain, (e.prompt, e.solution, chain)
    assert e.solution.count("#") == 1 and "\n" not in e.solution
    assert dom.extract_answer(e.solution) == answer == e.solution.split("#")[1]
    assert dom.chain_sites(e) == sites, (e.prompt, dom.chain_sites(e), sites)
    assert tok.decode(tok.encode(e.prompt + e.solution)) == e.prompt + e.solution
    assert e.metadata["difficulty"] == d
    if name == "code":  # the hidden tests are f(x) = x + c on every input
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
  """The chain before '#' is 10 chars per math column, 10 per code column (3 columns), 3 per
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
    want = {"math": 10 * (d + 2), "code": 30, "strings": 3 * (6, 8, 9)[d]}[name]
    assert lengths == {want}
  if d >= 1:
    assert want >= 24


# Worked by hand from the module docstrings: (domain, example, gold chain, chain with every site
# flawed, sites).
def _hand_examples():
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
  for name, e, gold, flawed, sites in _hand_examples():
    dom = _chain_dom(name)
    assert dom.chain_solution(e, lambda s: False) == gold, (e.prompt, gold)
    assert dom.chain_solution(e, lambda s: True) == flawed, (e.prompt, flawed)
    assert dom.chain_sites(e) == sites, e.prompt
    assert chain_truth(name, e.prompt)[:2] == (gold, sites)  # the writers here agree
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


def _chain_completions(dom, name, e):
  """(completion, expected reward) for one example: only the final answer after the last '#' on
  the first line counts."""
  chain, _, answer, _, _ = chain_truth(name, e.prompt)
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


@pytest.mark.parametrize("name", TOY)
def test_chain_verifier_reads_the_final_answer_only(name, pool):
  dom = _chain_dom(name)
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
    _, sites, answer, _, _ = chain_truth(name, e.prompt)
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
  if name in ("logic", "strings"):
    assert min(want) == max(want) == 0.0  # every logic / strings chain has a site
  else:
    assert 0 < sum(want) < len(want)


def _is_correct(name, e, completion):
  return _chain_dom(name).extract_answer(completion) == chain_truth(name, e.prompt)[2]


@pytest.mark.parametrize("name", TOY)
def test_sample_solution_correct_fraction(name, pool):
  dom = _chain_dom(name)
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


@pytest.mark.parametrize("name,d", [(n, d) for n in TOY for d in sorted({1, CHAIN_MAX[n]})])
def test_chain_splits_disjoint_by_construction(name, d):
  dom = _chain_dom(name, d)
  train, test = dom.generate("train", 3000, 0), dom.generate("test", 3000, 0)
  truths = {split: [chain_truth(name, e.prompt) for e in exs]
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


def test_chain_form_errors():
  with pytest.raises(ValueError, match=r"code: difficulty=3 must be an int in \[0, 1\] in the "
                                       r"chain form"):
    get_domain("code", difficulty=3, form="chain")
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
