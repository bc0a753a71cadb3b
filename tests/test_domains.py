"""Toy domains and the registry: formats, determinism, disjoint splits, verification.

Answers and split rules are re-derived from the prompt text alone (tests/domain_truths.py,
independently of the generators' metadata), so a generator that mislabels a split or an answer
fails. The chain form is tests/test_domains_chain.py.
"""

import re
import string

import numpy as np
import pytest

from domain_truths import code_truth, digit_sum, logic_truth, math_truth, strings_truth
from smjax.domains import domain_label, get_domain, known_domains
from smjax.models.tokenizer import CharTokenizer
from smjax.rewards.sandbox import SandboxPool
from smjax.rewards.verify import verify_batch

TOY = ("math", "code", "logic", "strings")
N = 300


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(2) as p:
    yield p


# ------------------------------------------------------------------------------------- registry
def test_registry_names_and_unknown_name_error():
  names = known_domains()
  for name in TOY + ("rg:<reasoning_gym dataset>", "jsonl_math:<path>", "jsonl_code:<path>"):
    assert name in names
  for name in TOY:
    assert get_domain(name).name == name
  with pytest.raises(ValueError, match=r"unknown domain 'mathz'; known: math, code, logic, "
                                       r"strings, rg:"):
    get_domain("mathz")


@pytest.mark.parametrize("name", TOY)
def test_difficulty_knob_is_checked(name):
  with pytest.raises(ValueError, match="difficulty=7 must be an int in"):
    get_domain(name, difficulty=7)
  with pytest.raises(ValueError, match="split='val' must be one of"):
    get_domain(name).generate("val", 1, 0)


# --------------------------------------------------------------------------------------- format
@pytest.mark.parametrize("name", TOY)
def test_format_fits_char_model_and_is_deterministic(name):
  tok = CharTokenizer()
  for d in range(4):
    dom = get_domain(name, difficulty=d)
    for split in ("train", "test"):
      exs = dom.generate(split, 100, seed=3)
      assert exs == dom.generate(split, 100, seed=3)
      assert [e.prompt for e in exs] != [e.prompt for e in dom.generate(split, 100, seed=4)]
      for e in exs:
        assert e.domain == name and e.metadata["split"] == split and e.metadata["difficulty"] == d
        assert len(e.prompt) <= 24 and len(e.solution) <= 10, (e.prompt, e.solution)
        assert tok.decode(tok.encode(e.prompt + e.solution)) == e.prompt + e.solution


def test_difficulty_scales_ranges():
  widest = lambda d: max(len(s) for e in get_domain("math", difficulty=d).generate("train", N, 0)
                         for s in re.findall(r"\d+", e.prompt))
  assert [widest(d) for d in range(4)] == [1, 2, 2, 3]
  ops = {e.prompt[len(re.match(r"\d+", e.prompt).group()):][0]
         for e in get_domain("math", difficulty=2).generate("train", N, 0)}
  assert ops == {"+", "-"}
  words = [[re.search(r":(\w+)=", e.prompt).group(1) for e in get_domain("strings", difficulty=d)
            .generate("train", 50, 0)] for d in range(4)]
  assert [{len(w) for w in ws} for ws in words] == [{4}, {6}, {8}, {9}]
  assert [max(len(set(w)) for w in ws) for ws in words] == [2, 3, 4, 5]
  items = [{len(logic_truth(e.prompt)[0]) for e in get_domain("logic", difficulty=d)
            .generate("train", 50, 0)} for d in range(4)]
  assert items == [{3}, {4}, {5}, {6}]


# -------------------------------------------------------------------------- disjoint held-out
def test_math_splits_disjoint_by_digit_sum_rule_and_reachable():
  dom = get_domain("math", difficulty=1)
  train = dom.generate("train", 2000, 0)
  test = dom.generate("test", 2000, 0)
  assert not any(math_truth(e.prompt)[1] for e in train)
  assert all(math_truth(e.prompt)[1] for e in test)
  assert not {e.prompt for e in train} & {e.prompt for e in test}
  # Reachable: every (units, units) and (tens, tens) digit pair occurs among training pairs.
  train_pairs = [(a, b) for a in range(100) for b in range(100) if (3 * digit_sum(a) + digit_sum(b)) % 5]
  all_pairs = {(i, j) for i in range(10) for j in range(10)}
  assert {(a % 10, b % 10) for a, b in train_pairs} == all_pairs
  assert {(a // 10, b // 10) for a, b in train_pairs} == all_pairs


def test_strings_splits_disjoint_by_letter_sum():
  for d in (1, 3):
    dom = get_domain("strings", difficulty=d)
    train, test = dom.generate("train", N, 0), dom.generate("test", N, 0)
    assert not any(strings_truth(e.prompt)[1] for e in train)
    assert all(strings_truth(e.prompt)[1] for e in test)
    assert not {e.prompt for e in train} & {e.prompt for e in test}


def test_logic_splits_disjoint_by_template():
  for d in (1, 3):
    dom = get_domain("logic", difficulty=d)
    train, test = dom.generate("train", N, 0), dom.generate("test", N, 0)
    assert not any(logic_truth(e.prompt)[1] for e in train)
    assert all(logic_truth(e.prompt)[1] for e in test)
    templates = lambda exs: {e.metadata["template"] for e in exs}
    assert not templates(train) & templates(test)


def test_code_splits_disjoint():
  for d in (1, 3):
    dom = get_domain("code", difficulty=d)
    assert not any(code_truth(e.prompt)[1] for e in dom.generate("train", N, 0))
    assert all(code_truth(e.prompt)[1] for e in dom.generate("test", N, 0))


# ---------------------------------------------------------------------------------- references
@pytest.mark.parametrize("name,truth", [("math", math_truth), ("logic", logic_truth),
                                        ("strings", strings_truth)])
def test_references_match_independent_answers(name, truth):
  for d in range(4):
    for e in get_domain(name, difficulty=d).generate("test", 100, 1):
      assert str(truth(e.prompt)[0]) == e.solution == str(e.reference)


def test_code_hidden_tests_match_independent_program():
  for d in range(4):
    for e in get_domain("code", difficulty=d).generate("train", 100, 1):
      f, _ = code_truth(e.prompt)
      assert e.reference["outputs"] == [f(x) for x in e.reference["inputs"]]
      assert len(e.reference["inputs"]) == 4 + (2 if d == 3 else 1)


# -------------------------------------------------------------------------------------- verify
JUNK = ["", "\n", " ", "\x00\x01", "é", "9" * 5000, "(((((", "None", "nan", "inf", "1e400",
        "__import__('os')._exit(0)", "x" * 70]


def test_math_verify_numeric():
  dom = get_domain("math")
  e = dom.generate("train", 1, 0)[0]
  value = math_truth(e.prompt)[0]
  for good in (f"{value}", f" {value}\n", f"{value}.0", f"+{value}", f"{value}\nmore text"):
    assert dom.verify(e, good) == 1.0, good
  for bad in (f"{value + 1}", f"{value}0", f"{value} apples") + tuple(JUNK):
    assert dom.verify(e, bad) == 0.0, bad


@pytest.mark.parametrize("name", ["logic", "strings"])
def test_exact_match_domains(name):
  dom = get_domain(name)
  e = dom.generate("train", 1, 0)[0]
  assert dom.verify(e, e.solution) == 1.0
  assert dom.verify(e, e.solution[::-1] + "q") == 0.0
  assert all(dom.verify(e, j) == 0.0 for j in JUNK)


def test_code_verify_in_sandbox(pool):
  dom = get_domain("code", difficulty=2)
  exs = dom.generate("train", 40, 0) + dom.generate("test", 40, 0)
  assert dom.verify_many(exs, [e.solution for e in exs], pool=pool) == [1.0] * 80
  e = exs[0]
  f, _ = code_truth(e.prompt)
  c = f(0)
  equivalent = [f"{c}+x", f"x-({-c})", f"(x*2+{2 * c})//2"]
  wrong = [str(e.reference["outputs"][0]), f"x+{c + 1}", "x", "1/0", "x[", "'a'+x"] + JUNK
  rewards = dom.verify_many([e] * (len(equivalent) + len(wrong)), equivalent + wrong, pool=pool)
  assert rewards == [1.0] * len(equivalent) + [0.0] * len(wrong)


def test_verify_batch_mixed_domains_in_order(pool):
  exs, comps, want = [], [], []
  for i, name in enumerate(TOY * 3):
    e = get_domain(name).generate("train", 1, i)[0]
    good = i % 2 == 0
    exs.append(e)
    comps.append(e.solution if good else "zzz")
    want.append(float(good))
  rewards = verify_batch(exs, comps, pool=pool)
  assert rewards.dtype == np.float32 and rewards.tolist() == want
  with pytest.raises(ValueError, match="len"):
    verify_batch(exs, comps[:-1], pool=pool)


def test_logic_prompt_letters_are_lowercase_and_distinct():
  for e in get_domain("logic", difficulty=3).generate("train", 50, 0):
    chain = logic_truth(e.prompt)[0]
    assert len(set(chain)) == 6 and set(chain) <= set(string.ascii_lowercase)


def test_code_runs_each_distinct_candidate_once(pool):
  class Counting:
    def __init__(self):
      self.jobs = []

    def run(self, jobs):
      self.jobs += jobs
      return pool.run(jobs)

  dom = get_domain("code", difficulty=1)
  e = dom.generate("train", 1, 0)[0]
  counting = Counting()
  comps = [e.solution] * 5 + ["x+1"] * 2 + [str(e.reference["outputs"][0]), "(", ""]
  assert dom.verify_many([e] * 10, comps, pool=counting) == [1.0] * 5 + [0.0] * 5
  assert sorted(j.program for j in counting.jobs) == sorted([e.solution, "x+1"])


def test_domain_labels_are_flat_names():
  assert domain_label("math") == "math"
  assert domain_label("jsonl_math:/data/sets/gsm8k.jsonl.gz") == "jsonl_math_gsm8k"
  assert domain_label("jsonl_code:/x/humaneval.parquet") == "jsonl_code_humaneval"
  assert domain_label("rg:basic arithmetic") == "rg_basic_arithmetic"
  assert "/" not in domain_label("jsonl_math:/a/b/") and ":" not in domain_label("rg:x")
