"""The real model's task (smjax.domains.word_arith): a + b asked in words, the answer the last
integer on the completion's first non-empty line."""

import pytest

from smjax.domains.word_arith import RANGES, WordArithDomain, first_line_number, is_held_out


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
