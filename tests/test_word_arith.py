"""The real model's task (smjax.domains.word_arith): a + b asked in words, the answer the last
integer on the completion's first non-empty line."""

import pytest

from smjax.domains.word_arith import (RANGES, WordAdd, WordArithDomain, WordSub, first_line_number,
                                      is_held_out)


@pytest.mark.parametrize("completion, right", [
    ("47 + 8 = 55", True), ("55", True), ("The answer is 55.", True), ("\n\n  55\nmore", True),
    ("47 + 8 = 54", False), ("47 + 8 = 55 or maybe 56", False), ("", False), ("   \n  ", False),
    ("Let me think.\n47 + 8 = 55", False),          # the number is not on the first line
    ("forty-seven plus eight is fifty-five", False), ("47 + 8 = 5 5", False)])
def test_the_verifier_reads_the_first_lines_last_integer(completion, right):
  d = WordArithDomain(difficulty=1)
  ex = next(e for e in d.generate("train", 200, seed=0) if e.reference == 55)
  assert d.verify(ex, completion) == float(right)
  assert d.verify(ex, ex.solution) == 1.0


def test_first_line_number():
  assert first_line_number("1,234 apples") == "1234"
  assert first_line_number("-3 and 7") == "7" and first_line_number("x") is None


@pytest.mark.parametrize("level", sorted(RANGES))
def test_levels_splits_and_prompts(level):
  d = WordArithDomain(difficulty=level)
  (a_lo, a_hi), (b_lo, b_hi) = RANGES[level]
  train, test = d.generate("train", 300, seed=1), d.generate("test", 100, seed=1)
  assert train == d.generate("train", 300, seed=1)           # deterministic
  pair = lambda e: tuple(int(x) for x in e.prompt.split("?")[0][8:].split(" + "))  # noqa: E731
  for e in train + test:
    a, b = pair(e)
    assert a_lo <= a <= a_hi and b_lo <= b <= b_hi and e.reference == a + b
    assert e.prompt == f"What is {a} + {b}? Reply with one line that ends with the number."
    assert is_held_out(a, b) == (e in test)
  # Disjoint by construction, and a + b with b + a on the same side.
  assert not {frozenset(pair(e)) for e in train} & {frozenset(pair(e)) for e in test}


def test_a_bad_level_is_one_line():
  with pytest.raises(ValueError, match=r"word_arith: difficulty=7 must be one of \[0, 1, 2\]"):
    WordArithDomain(difficulty=7)


def test_the_studys_pair_subtracts_without_negatives_and_keeps_the_split():
  """WordAdd and WordSub (configs/smollm2_study.py's domains, built by import path without
  arguments): two-digit operands; a - b with a >= b; the held-out pairs are the same unordered
  pairs as the sums'; the domain names are the study's keys."""
  add, sub = WordAdd(), WordSub()
  assert (add.name, sub.name, add.difficulty, sub.difficulty) == ("word_add", "word_sub", 2, 2)
  for split in ("train", "test"):
    subs = sub.generate(split, 300, seed=3)
    for e in subs:
      a, b = (int(x) for x in e.prompt.split("?")[0][8:].split(" - "))
      assert 10 <= b <= a <= 99 and e.reference == a - b >= 0, e.prompt
      assert e.prompt == f"What is {a} - {b}? Reply with one line that ends with the number."
      assert is_held_out(a, b) == (split == "test") and e.domain == "word_sub"
      assert sub.verify(e, f"{a} - {b} = {a - b}") == 1.0
      assert sub.verify(e, f"{a} - {b} = {a + b}") == float(a + b == a - b)
  # The sums are word_arith's at difficulty 2, prompt for prompt (only the name differs).
  assert [e.prompt for e in add.generate("test", 50, seed=4)] == [
      e.prompt for e in WordArithDomain(difficulty=2).generate("test", 50, seed=4)]
  # The differences are drawn apart from the sums (their own stream), not the same pairs re-signed.
  operands = lambda e: frozenset(int(x) for x in e.prompt.split("?")[0][8:].split()[::2])  # noqa
  assert [operands(e) for e in sub.generate("train", 50, seed=4)] != [
      operands(e) for e in add.generate("train", 50, seed=4)]
