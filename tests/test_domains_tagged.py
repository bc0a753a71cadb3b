"""The tagged pair `add` / `sub` (smjax.domains.toy_tagged): chains checked against ones written
here with plain arithmetic from the prompt text; the verifier reads the final answer only; the tag
alone decides the answer (one pair, one prompt after the tag, two answers); held-out splits
disjoint by construction and the same in both; mistakes and the base's mixture rate; lengths,
difficulty levels and errors."""

import itertools
import random
import re

import numpy as np
import pytest

from domain_truths import digit_sum
from smjax.domains import TOY_DOMAINS, get_domain, known_domains, register_domain
from smjax.domains.base import Example
from smjax.domains.toy_tagged import AddDomain
from smjax.models.tokenizer import CharTokenizer

TAGGED = ("add", "sub")
TAG = {"add": "a", "sub": "s"}
LEVELS = (0, 1, 2)


def _dom(name, d=1, form="chain"):
  return get_domain(name, difficulty=d, form=form)


def _digit(n, i):
  return n // 10 ** i % 10


def truth(prompt):
  """(tag, a, b, width, held_out) from the prompt text alone."""
  tag, a, b = re.fullmatch(r"([as]):(\d+)\?(\d+)=", prompt).groups()
  assert len(a) == len(b)
  width, a, b = len(a), int(a), int(b)
  return tag, a, b, width, (3 * digit_sum(a) + digit_sum(b)) % 5 == 0


def _ref_value(tag, a, b, width, flipped=()):
  """The value a chain arrives at with the columns in `flipped` worked by the other tag's
  operation: each column's result digit and its flag (a carry of x + y + c >= 10, or a borrow of
  x - y - c < 0), the flag taken by the next column as the chain's own operation does; add writes
  a last carry as its leading digit, sub has no place for one."""
  digits, flag = [], 0
  for i in range(width):
    x, y = _digit(a, i), _digit(b, i)
    adds = (tag == "a") != (i in flipped)
    total = x + y + flag if adds else x - y - flag
    digits.append(total % 10)
    flag = int(total >= 10) if adds else int(total < 0)
  value = sum(d * 10 ** i for i, d in enumerate(digits))
  return value + (10 ** width if tag == "a" and flag else 0)


def ref_chain(tag, a, b, width):
  """Columns units first, "x?y?flag=digit,flag_out;": add carries (x + y + c), sub borrows
  (x - y - c); then #a+b or #a-b. Also the number of sites: the columns where the other tag's
  operation alone changes the value."""
  parts, flag = [], 0
  for i in range(width):
    x, y = _digit(a, i), _digit(b, i)
    if tag == "a":
      total = x + y + flag
      out = 1 if total >= 10 else 0
    else:
      total = x - y - flag
      out = 1 if total < 0 else 0
    parts.append(f"{x}?{y}?{flag}={total % 10},{out};")
    flag = out
  value = a + b if tag == "a" else a - b
  assert _ref_value(tag, a, b, width) == value
  sites = sum(_ref_value(tag, a, b, width, {i}) != value for i in range(width))
  return "".join(parts) + f"#{value}", sites, value


def chain_truth(prompt):
  tag, a, b, width, _ = truth(prompt)
  return ref_chain(tag, a, b, width)


def _exs(name, d, n=400, seed=5):
  dom = _dom(name, d)
  return dom, dom.generate("train", n, seed) + dom.generate("test", n, seed)


# ----------------------------------------------------------------------------- registry, errors
def test_registry_names():
  for name in TAGGED:
    assert name in TOY_DOMAINS and name in known_domains()
    dom = get_domain(name, difficulty=1, form="chain")
    assert dom.name == name and dom.form == "chain" and dom.difficulty == 1
    assert get_domain(name).form == "short"   # the registry's default form works too
  with pytest.raises(ValueError, match="'add' is a built-in domain's"):
    register_domain(AddDomain())


@pytest.mark.parametrize("name", TAGGED)
def test_bad_difficulty_and_form_are_one_line_errors(name):
  for form in ("chain", "short"):
    for bad in (3, -1, "1", 1.0):
      with pytest.raises(ValueError, match=rf"^{name}: difficulty={bad!r} must be an int in "
                                           r"\[0, 2\]") as e:
        get_domain(name, difficulty=bad, form=form)
      assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"difficulty=3 .* in the chain form"):
      _dom(name).generate("train", 1, 0, difficulty=3)
  with pytest.raises(ValueError, match=rf"^{name}: form='bogus' must be one of"):
    get_domain(name, form="bogus")


# ----------------------------------------------------------------------------- gold chains
@pytest.mark.parametrize("name,d", [(n, d) for n in TAGGED for d in LEVELS])
def test_gold_chains_match_independent_chains(name, d):
  """Gold chains equal the ones written here, end in the independent answer, verify to 1, have
  a site, use `?` for the operator everywhere, and fit the char tokenizer and the toy budget."""
  dom, exs = _exs(name, d)
  tok = CharTokenizer()
  width = d + 2
  for e in exs:
    tag, a, b, w, _ = truth(e.prompt)
    chain, sites, value = chain_truth(e.prompt)
    assert tag == TAG[name] and w == width and a >= b
    assert e.solution == chain, (e.prompt, e.solution, chain)
    assert e.reference == value and dom.extract_answer(e.solution) == str(value)
    assert dom.chain_sites(e) == sites >= 1
    assert dom.verify(e, e.solution) == 1.0
    assert not re.search(r"[+\-*]", e.prompt + e.solution)  # the operator is `?` throughout
    assert e.solution.count("#") == 1 and "\n" not in e.solution
    assert tok.decode(tok.encode(e.prompt + e.solution)) == e.prompt + e.solution
    assert e.metadata["difficulty"] == d
  # Lengths: prompts 2d + 8 chars; chains 10 per column, '#', the answer.
  assert {len(e.prompt) for e in exs} == {2 * d + 8}
  assert {len(e.solution.split("#")[0]) for e in exs} == {10 * width}
  longest = max(len(e.solution) for e in exs)
  assert longest <= 10 * width + 1 + width + (name == "add")
  assert max(len(e.prompt) for e in exs) <= 16
  if d <= 1:
    assert longest <= 44  # the toy study's rl.max_new_tokens


def test_short_form_is_the_answer_on_the_same_prompts():
  for name in TAGGED:
    short, chain = _dom(name, 1, "short"), _dom(name, 1, "chain")
    for s, c in zip(short.generate("test", 100, 3), chain.generate("test", 100, 3)):
      assert s.prompt == c.prompt and s.reference == c.reference
      assert s.solution == str(chain_truth(s.prompt)[2])
      assert short.verify(s, s.solution) == 1.0 and short.verify(s, f"#{s.solution}") == 0.0


def _ex(name, a, b, width):
  value = a + b if name == "add" else a - b
  prompt = f"{TAG[name]}:{a:0{width}d}?{b:0{width}d}="
  return Example(prompt=prompt, reference=value, solution="", domain=name,
                 metadata={"a": a, "b": b, "op": "+" if name == "add" else "-", "width": width})


# Worked by hand: (domain, a, b, width, gold chain, chain with every site flawed, sites). A
# flawed site is a column worked by the other operation, its flag read on by the chain's own.
HAND = [
    ("add", 573, 89, 3, "3?9?0=2,1;7?8?1=6,1;5?0?1=6,0;#662",
     "3?9?0=4,1;7?8?1=8,1;5?0?1=4,0;#484", 3),      # every column subtracts: sub's chain
    ("sub", 573, 89, 3, "3?9?0=4,1;7?8?1=8,1;5?0?1=4,0;#484",
     "3?9?0=2,1;7?8?1=6,1;5?0?1=6,0;#662", 3),      # every column adds: add's chain
    ("add", 950, 50, 3, "0?0?0=0,0;5?5?0=0,1;9?0?1=0,1;#1000",
     "0?0?0=0,0;5?5?0=0,0;9?0?0=9,0;#900", 2),      # 0?0: no site; 5?5: the same digit, no carry
    ("sub", 100, 1, 3, "0?1?0=9,1;0?0?1=9,1;1?0?1=0,0;#99",
     "0?1?0=1,0;0?0?0=0,0;1?0?0=1,0;#101", 3),
    ("add", 55, 39, 2, "5?9?0=4,1;5?3?1=9,0;#94", "5?9?0=6,1;5?3?1=1,0;#16", 2),
    ("sub", 55, 39, 2, "5?9?0=6,1;5?3?1=1,0;#16", "5?9?0=4,1;5?3?1=9,0;#94", 2),
    ("add", 99, 99, 2, "9?9?0=8,1;9?9?1=9,1;#198", "9?9?0=0,0;9?9?0=8,1;#180", 1),  # 9?9?1: as
    # 9 + 9 + 1 = 19 and 9 - 9 - 1 = -1 both write 9 and a flag: not a site
    ("add", 50, 50, 2, "0?0?0=0,0;5?5?0=0,1;#100", "0?0?0=0,0;5?5?0=0,0;#0", 1),  # final carry
    ("sub", 50, 50, 2, "0?0?0=0,0;5?5?0=0,0;#0", "0?0?0=0,0;5?5?0=0,0;#0", 0),  # 5+5's carry
    # out of sub's last column has no place: no site (draw_pair never draws such a pair)
]


def test_hand_written_examples():
  for name, a, b, width, gold, flawed, sites in HAND:
    dom, e = _dom(name), _ex(name, a, b, width)
    assert ref_chain(TAG[name], a, b, width)[:2] == (gold, sites)  # the writer here agrees
    assert dom.chain_solution(e, lambda s: False) == gold, (name, gold)
    assert dom.chain_solution(e, lambda s: True) == flawed, (name, flawed)
    assert dom.chain_sites(e) == sites
    assert dom.verify(e, gold) == 1.0 and dom.verify(e, flawed) == float(sites == 0)


# ----------------------------------------------------------------------------- the verifier
def _completions(e):
  """(completion, expected reward): only the final answer after the last '#' on the first line
  counts."""
  chain, _, value = chain_truth(e.prompt)
  body, answer, wrong = chain.split("#")[0], str(value), str(value + 1)
  cases = [
      (chain, 1.0), (f"  {chain}  \n", 1.0), (f"{chain}\nmore #{wrong}", 1.0),
      (f"garbage; 1?1?0=3,0;#{answer}", 1.0), (f"#{answer}", 1.0),  # wrong/no chain, right answer
      (body[::-1] + f"#{answer}", 1.0), (f"{body}#{wrong}#{answer}", 1.0),
      (f"{body}#0{answer}", 1.0),   # leading zeros are the same integer
      (f"{body}#{answer}#{wrong}", 0.0), (f"{body}#{wrong}", 0.0),  # right chain, wrong answer
      (f"{body}#{value - 1}", 0.0), (f"{body}#{answer}0", 0.0), (f"{body}#-{answer}", 0.0),
      (f"{body}#{answer[:-1]}", 0.0),  # cut inside the answer
      (body, 0.0), (answer, 0.0), (body + answer, 0.0),  # no mark: truncated
      (f"{body}\n#{answer}", 0.0), (f"{body}# \n{answer}", 0.0),  # not on the first line
      (f"{body}#{answer}.0", 0.0), (f"{body}#{answer}x", 0.0), (f"{body}#{'9' * 40}", 0.0),
      ("", 0.0), ("\n", 0.0), ("#", 0.0),
  ]
  cases += [(chain[:k], 0.0) for k in range(0, len(chain) - len(answer) + 1, 3)]
  cases.append((chain[:len(chain) - len(answer)], 0.0))  # cut right after the mark
  return cases


@pytest.mark.parametrize("name", TAGGED)
def test_verifier_reads_the_final_answer_only(name):
  dom = _dom(name)
  exs = dom.generate("train", 20, 2) + dom.generate("test", 20, 2)
  bad = [(e.prompt, comp, want, got) for e in exs for comp, want in _completions(e)
         if (got := dom.verify(e, comp)) != want]
  assert not bad, bad[:10]


# ----------------------------------------------------------------------------- the tag decides
@pytest.mark.parametrize("d", LEVELS)
def test_the_tag_alone_decides_the_answer(d):
  """The same draw is the same pair in both domains (the prompts differ in the tag only), the
  answers differ (b > 0 always), and each domain's gold completion scores 0 in the other."""
  add, sub = _dom("add", d), _dom("sub", d)
  for split in ("train", "test"):
    adds, subs = add.generate(split, 1000, 7), sub.generate(split, 1000, 7)
    for ea, es in zip(adds, subs):
      assert ea.prompt[:2] == "a:" and es.prompt[:2] == "s:" and ea.prompt[2:] == es.prompt[2:]
      _, a, b, _, _ = truth(ea.prompt)
      assert b > 0 and ea.reference == a + b and es.reference == a - b
      assert ea.reference != es.reference
      assert ea.solution.split("#")[0] != es.solution.split("#")[0]  # the chains differ too
      assert add.verify(ea, ea.solution) == sub.verify(es, es.solution) == 1.0
      assert add.verify(ea, es.solution) == sub.verify(es, ea.solution) == 0.0
      # An example of one domain read by the other's reference: the answers cross over.
      assert sub.verify(es, f"#{a - b}") == 1.0 and sub.verify(es, f"#{a + b}") == 0.0
  # The short form's answers cross over the same way.
  sa, ss = _dom("add", d, "short"), _dom("sub", d, "short")
  for ea, es in zip(sa.generate("test", 200, 1), ss.generate("test", 200, 1)):
    assert sa.verify(ea, es.solution) == ss.verify(es, ea.solution) == 0.0


def test_prompts_after_the_tag_have_one_distribution():
  """Pairs are drawn from one stream for both domains: the sets of prompts after the tag are
  equal for every split, seed and level (not only in distribution), and each domain's own draws
  are varied (not one repeated pair)."""
  for d in LEVELS:
    for split, seed in (("train", 0), ("test", 3)):
      rest = {name: [e.prompt[2:] for e in _dom(name, d).generate(split, 2000, seed)]
              for name in TAGGED}
      assert rest["add"] == rest["sub"]
      assert len(set(rest["add"])) > (1000 if d >= 1 else 200)  # d 0: 1120 train, 280 test


# ----------------------------------------------------------------------------- held-out split
@pytest.mark.parametrize("name,d", [(n, d) for n in TAGGED for d in LEVELS])
def test_held_out_split_disjoint_by_construction(name, d):
  dom = _dom(name, d)
  train, test = dom.generate("train", 3000, 0), dom.generate("test", 3000, 0)
  assert not any(truth(e.prompt)[4] for e in train)   # the rule fails on every train pair
  assert all(truth(e.prompt)[4] for e in test)        # and holds on every test pair
  pairs = {split: {truth(e.prompt)[1:3] for e in exs}
           for split, exs in (("train", train), ("test", test))}
  assert not pairs["train"] & pairs["test"]
  assert len(pairs["test"]) > (1000 if d >= 1 else 200)  # d 0 has 280 held-out pairs in all


def test_held_out_pairs_are_the_same_in_both_domains():
  """Both domains hold out the same pairs: every pair either one draws for a split is on that
  split's side of the one rule, and at one seed they draw the same pairs."""
  for d in (1, 2):
    for split in ("train", "test"):
      got = {name: {truth(e.prompt)[1:3] for e in _dom(name, d).generate(split, 2000, 4)}
             for name in TAGGED}
      assert got["add"] == got["sub"]
    train_add = {truth(e.prompt)[1:3] for e in _dom("add", d).generate("train", 3000, 1)}
    test_sub = {truth(e.prompt)[1:3] for e in _dom("sub", d).generate("test", 3000, 2)}
    assert not train_add & test_sub


# ----------------------------------------------------------------------------- mistakes, levels
@pytest.mark.parametrize("name,d", [(n, d) for n in TAGGED for d in LEVELS])
def test_mistakes(name, d):
  """Every site flawed: a wrong final answer (every example has a site); no site flawed: the
  gold chain; `flaw` is asked once per site, in order."""
  dom, exs = _exs(name, d, n=300, seed=9)
  for e in exs:
    _, sites, value = chain_truth(e.prompt)
    asked = []
    assert dom.chain_solution(e, lambda s: asked.append(s) or False) == e.solution
    assert asked == list(range(sites)) and sites >= 1
    bad = dom.chain_solution(e, lambda s: True)
    assert bad.count("#") == 1 and len(bad.split("#")[0]) == len(e.solution.split("#")[0])
    assert dom.extract_answer(bad) != str(value) and dom.verify(e, bad) == 0.0
    # Flawing any set of sites changes the answer too (a flawed site is carried on), and the
    # flawed chain arrives where the other operation at those columns takes it.
    tag, a, b, width, _ = truth(e.prompt)
    cols = [i for i in range(width) if _ref_value(tag, a, b, width, {i}) != value]
    for n in range(1, sites + 1):
      for ks in itertools.combinations(range(sites), n):
        some = dom.chain_solution(e, lambda s, ks=ks: s in ks)
        assert dom.verify(e, some) == 0.0, (e.prompt, ks, some)
        want = _ref_value(tag, a, b, width, {cols[k] for k in ks})
        assert dom.extract_answer(some) == str(want), (e.prompt, ks, some, want)


@pytest.mark.parametrize("name", TAGGED)
def test_levels_are_monotone_in_sites(name):
  means, mins = [], []
  for d in LEVELS:
    dom, exs = _exs(name, d, n=1000, seed=6)
    sites = [chain_truth(e.prompt)[1] for e in exs]
    assert [dom.chain_sites(e) for e in exs] == sites
    means.append(np.mean(sites))
    mins.append(min(sites))
  assert means == sorted(means) and means[0] < means[-1] and min(mins) >= 1, means


@pytest.mark.parametrize("name", TAGGED)
def test_sample_solution_correct_fraction(name):
  dom = _dom(name)
  exs = dom.generate("train", 1000, 11) + dom.generate("test", 1000, 11)
  rng = random.Random(1234)
  for p in (0.1, 0.25, 0.6):
    comps = [dom.sample_solution(e, rng, p) for e in exs]
    correct = [dom.extract_answer(c) == str(chain_truth(e.prompt)[2])
               for e, c in zip(exs, comps)]
    frac, sigma = np.mean(correct), np.sqrt(p * (1 - p) / len(exs))
    assert abs(frac - p) < 4 * sigma, (name, p, frac, sigma)
    assert [dom.verify(e, c) for e, c in zip(exs, comps)] == [float(c) for c in correct]
  for e in exs[:200]:  # the extremes: p = 1 is the gold chain, p = 0 flaws every site
    assert dom.sample_solution(e, rng, 1.0) == e.solution
    assert dom.sample_solution(e, rng, 0.0) == dom.chain_solution(e, lambda s: True)
