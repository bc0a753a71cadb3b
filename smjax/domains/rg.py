"""reasoning-gym adapter: any `reasoning_gym` dataset is a domain named "rg:<dataset>".

Examples come from the dataset's generator, rewards from its `score_answer` (a scorer that raises
gives 0). The answer is taken from <answer>...</answer> when the completion has those tags, else
the completion's last non-empty line. `difficulty` d sets every attribute of the dataset's
curriculum to level min(d, its highest) where reasoning-gym defines a curriculum; extra keyword
arguments go to the dataset config.

Held-out split, disjoint by construction: a question is held out iff the CRC-32 of its text is
0 mod 5; each split only keeps its own questions, so no question text is in both. (The
generators' own ranges cannot be changed generically, so this is a template-free partition of
the question space, not a range split.)
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Any

from smjax.domains.base import Domain, Example, MissingExtraError, check_split, stable_seed

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
DEFAULT_TEMPLATE = "{question}\nGive your final answer inside <answer></answer>."


def _reasoning_gym():
  """The reasoning_gym package; MissingExtraError naming the `rg` extra where it is missing (it
  is an optional dependency: `pip install 'smjax[rg]'`)."""
  try:
    import reasoning_gym  # pylint: disable=import-outside-toplevel
    from reasoning_gym import factory  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    raise MissingExtraError(f"rg: domains need reasoning-gym, which is not installed ({e}); "
                            "install it with: pip install 'smjax[rg]'") from e
  return reasoning_gym


def known_datasets() -> list[str]:
  return sorted(_reasoning_gym().factory.DATASETS)


def is_held_out(question: str) -> bool:
  return zlib.crc32(question.encode()) % 5 == 0


class ReasoningGymDomain(Domain):
  """One reasoning-gym dataset as a domain; see the module docstring."""

  def __init__(self, dataset: str, *, template: str = DEFAULT_TEMPLATE, **config: Any):
    known = known_datasets()
    if dataset not in known:
      raise ValueError(f"unknown reasoning_gym dataset {dataset!r}; known: {', '.join(known)}")
    self.dataset, self.template, self.config = dataset, template, config
    self.name = f"rg:{dataset}"
    self._scorer = self._make_dataset(None, seed=0, size=1)

  def _make_dataset(self, difficulty: int | None, *, seed: int, size: int):
    reasoning_gym = _reasoning_gym()
    factory = reasoning_gym.factory
    kwargs = dict(self.config)
    if difficulty is not None and factory.has_curriculum(self.dataset):
      curriculum = factory.create_curriculum(self.dataset)
      curriculum.set_global_level(difficulty)
      cfg = curriculum.generate_configuration({"seed": seed, "size": size})
      kwargs = {**dataclasses.asdict(cfg), **kwargs}
    kwargs.update(seed=seed, size=size)
    return reasoning_gym.create_dataset(self.dataset, **kwargs)

  def format_prompt(self, question: str) -> str:
    return self.template.format(question=question)

  def generate(self, split: str, n: int, seed: int, difficulty: int | None = None
               ) -> list[Example]:
    check_split(split)
    want_test = split == "test"
    out, chunk = [], 0
    while len(out) < n:
      if chunk > 50 + 10 * n:
        raise RuntimeError(f"{self.name}: could not draw {n} {split} examples (the generator "
                           "repeats itself too much)")
      size = max(64, 2 * (n - len(out)))
      ds = self._make_dataset(difficulty, seed=stable_seed(self.name, seed, chunk) % 2**31,
                              size=size)
      for i in range(size):
        entry = ds[i]
        if is_held_out(entry["question"]) == want_test:
          out.append(Example(prompt=self.format_prompt(entry["question"]), reference=entry,
                             solution=str(entry["answer"]), domain=self.name,
                             metadata={"split": split, "seed": seed, "difficulty": difficulty}))
          if len(out) == n:
            break
      chunk += 1
    return out

  def extract_answer(self, completion: str) -> str | None:
    tagged = _ANSWER_TAG.findall(completion)
    if tagged:
      return tagged[-1].strip()
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None

  def score(self, example: Example, completion: str) -> float:
    return self._scorer.score_answer(answer=self.extract_answer(completion),
                                     entry=example.reference)
