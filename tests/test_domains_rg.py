"""reasoning-gym adapter: any dataset name is a domain; its scorer gives the reward."""

import re

import pytest

from smjax.domains import get_domain
from smjax.domains import rg as rg_domain


def test_basic_arithmetic_generate_verify_and_disjoint_splits():
  dom = get_domain("rg:basic_arithmetic")
  assert dom.name == "rg:basic_arithmetic"
  train = dom.generate("train", 40, seed=0)
  test = dom.generate("test", 20, seed=0)
  assert len(train) == 40 and len(test) == 20
  assert train == dom.generate("train", 40, seed=0)
  questions = lambda exs: {e.reference["question"] for e in exs}
  assert not questions(train) & questions(test)
  assert all(not rg_domain.is_held_out(q) for q in questions(train))
  assert all(rg_domain.is_held_out(q) for q in questions(test))
  for e in train[:10]:
    assert e.prompt.startswith(e.reference["question"]) and "<answer>" in e.prompt
    # The expression in the question, evaluated independently, is the answer.
    expr = e.reference["question"].removeprefix("Calculate ").rstrip(".").replace(" ", "")
    value = eval(expr, {"__builtins__": {}})  # pylint: disable=eval-used
    assert float(e.solution) == pytest.approx(value)
    assert dom.verify(e, f"thinking...\n<answer>{e.solution}</answer>") == 1.0
    assert dom.verify(e, e.solution) == 1.0  # untagged: the last line
    assert dom.verify(e, f"<answer>{float(e.solution) + 1}</answer>") == 0.0
    assert dom.verify(e, "") == 0.0


def test_difficulty_uses_curriculum():
  dom = get_domain("rg:basic_arithmetic")
  easy = dom.generate("train", 30, seed=1, difficulty=0)
  hard = dom.generate("train", 30, seed=1, difficulty=3)
  digits = lambda exs: max(len(run) for e in exs
                           for run in re.findall(r"\d+", e.reference["question"]))
  assert digits(easy) == 1 and digits(hard) > 1


def test_scorer_that_raises_gives_zero(monkeypatch):
  dom = get_domain("rg:basic_arithmetic")
  e = dom.generate("train", 1, seed=0)[0]

  def boom(answer, entry):
    raise RuntimeError("scorer bug")
  monkeypatch.setattr(dom._scorer, "score_answer", boom)  # pylint: disable=protected-access
  assert dom.verify(e, e.solution) == 0.0


def test_unknown_dataset_lists_known_ones():
  with pytest.raises(ValueError, match=r"unknown reasoning_gym dataset 'no_such'; known: .*"
                                       r"basic_arithmetic.*"):
    get_domain("rg:no_such")
