"""The domain interface shared by toy, reasoning-gym and real-data domains.

A domain generates `Example`s for a split ("train" or "test"; disjoint by construction), formats
prompts, extracts answers from completions and verifies a completion to a reward in [0, 1].
`verify` never raises: junk completions score 0. `verify_many` is the batched form the GRPO loop
calls once per step (code domains send the whole batch to the sandbox pool at once).
"""

from __future__ import annotations

import abc
import dataclasses
import math
import random
import zlib
from typing import Any, Mapping, Sequence

from smjax.domains.chains import ANSWER_MARK

SPLITS = ("train", "test")


class MissingExtraError(ImportError):
  """A domain needs a package of an optional extra that is not installed; the message names the
  domain and the `pip install 'smjax[EXTRA]'` that adds it (the command line prints it as is)."""


@dataclasses.dataclass(frozen=True)
class Example:
  """One task instance.

  prompt: the text the model is conditioned on. reference: what `verify` checks against (JSON-able).
  solution: a short gold completion for supervised warm-up ("" when the domain has none).
  domain: the registry name of the domain that made it. metadata: split, index, difficulty, ...
  """
  prompt: str
  reference: Any
  solution: str
  domain: str
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def check_split(split: str) -> str:
  if split not in SPLITS:
    raise ValueError(f"split={split!r} must be one of {SPLITS}")
  return split


def stable_seed(*parts: Any) -> int:
  """A seed that is the same in every process and Python version (unlike hash())."""
  return zlib.crc32(repr(parts).encode()) ^ (zlib.adler32(repr(parts[::-1]).encode()) << 32)


def rng_for(*parts: Any) -> random.Random:
  return random.Random(stable_seed(*parts))


def clamp_reward(x: Any) -> float:
  try:
    x = float(x)
  except (TypeError, ValueError):
    return 0.0
  return 0.0 if math.isnan(x) else min(1.0, max(0.0, x))


class Domain(abc.ABC):
  """Base class. Subclasses implement `generate` and `score` (and usually `extract_answer`)."""

  name: str = ""
  uses_sandbox: bool = False

  @abc.abstractmethod
  def generate(self, split: str, n: int, seed: int, difficulty: int | None = None
               ) -> list[Example]:
    """n examples of `split`, a deterministic function of (split, n, seed, difficulty)."""

  def format_prompt(self, question: str) -> str:
    """The prompt the model sees for a raw question (toy domains: the question itself)."""
    return question

  def extract_answer(self, completion: str) -> str | None:
    """The answer part of a completion: its first line, stripped (None if empty)."""
    line = completion.strip().split("\n", 1)[0].strip()
    return line or None

  @abc.abstractmethod
  def score(self, example: Example, completion: str) -> float:
    """Reward in [0, 1]; may raise on junk (verify turns that into 0)."""

  def verify(self, example: Example, completion: str) -> float:
    """Reward in [0, 1]; never raises."""
    try:
      return clamp_reward(self.score(example, completion))
    except Exception:  # pylint: disable=broad-except
      return 0.0

  def verify_many(self, examples: Sequence[Example], completions: Sequence[str], *,
                  pool: Any = None) -> list[float]:
    """Batched verify (one call per GRPO step). `pool` is a SandboxPool for code domains."""
    del pool
    return [self.verify(e, c) for e, c in zip(examples, completions, strict=True)]

  def __repr__(self) -> str:
    return f"{type(self).__name__}(name={self.name!r})"


class SandboxDomain:
  """Mixin for domains verified by running code in the sandbox: subclasses give `job(example,
  completion) -> Job | None` (None: unrunnable, scores 0) and `passed(example, result)`. The
  whole batch goes to the sandbox pool at once; identical jobs (GRPO groups repeat completions)
  run once. A failing sandbox raises instead of scoring 0."""

  uses_sandbox = True

  def score(self, example: Example, completion: str) -> float:
    return self.verify_many([example], [completion])[0]

  def verify(self, example: Example, completion: str) -> float:
    try:
      return self.score(example, completion)
    except Exception:  # pylint: disable=broad-except
      return 0.0

  def verify_many(self, examples: Sequence[Example], completions: Sequence[str], *,
                  pool: Any = None) -> list[float]:
    from smjax.rewards.sandbox import default_pool  # pylint: disable=import-outside-toplevel
    jobs = [self.job(e, c) for e, c in zip(examples, completions, strict=True)]
    first: dict[Any, int] = {}
    for i, j in enumerate(jobs):
      if j is not None:
        first.setdefault(j, i)
    results = dict(zip(first, (pool or default_pool()).run(list(first)))) if first else {}
    return [0.0 if j is None else float(self.passed(examples[i], results[j]))
            for i, j in enumerate(jobs)]


FORMS = ("short", "chain")


class ToyDomain(Domain):
  """A procedural domain whose examples are generated one index at a time.

  `example(split, index, seed, difficulty)` is random access, so data pipelines can draw from
  an unbounded stream without materialising it; `generate` is that for indices 0..n-1.

  form: "short" (the solution is the answer alone) or "chain" (a written-out chain of steps,
  then ANSWER_MARK and the answer; smjax.domains.chains). The reward reads the final answer only.
  A chain-form domain also writes chains with mistakes (`sample_solution`) for a partly-right
  base.
  """

  max_difficulty: int = 3
  max_chain_difficulty: int = 3

  def __init__(self, difficulty: int = 1, form: str = "short"):
    if form not in FORMS:
      raise ValueError(f"{self.name}: form={form!r} must be one of {FORMS}")
    if form == "chain" and type(self).chain_solution is ToyDomain.chain_solution:
      raise ValueError(f"{self.name}: this domain has no chain form; use form='short'")
    self.form = form
    self.difficulty = self._check_difficulty(difficulty)

  def extract_answer(self, completion: str) -> str | None:
    """Short form: the first line. Chain form: what follows the last ANSWER_MARK on the first
    line (None without one: a truncated chain has no answer)."""
    if self.form == "short":
      return super().extract_answer(completion)
    line = completion.strip().split("\n", 1)[0]
    if ANSWER_MARK not in line:
      return None
    return line.rsplit(ANSWER_MARK, 1)[1].strip() or None

  def chain_sites(self, example: Example) -> int:
    """How many places of the example's chain admit the domain's mistake (chain form)."""
    raise NotImplementedError(f"{self.name}: no chain form")

  def chain_site_kinds(self, example: Example) -> list[str]:
    """The kind of each of those places, in the order the chain asks its `flaw` ("carry",
    "borrow", ...; smjax.domains.chains): a hard level has several sites of several kinds."""
    raise NotImplementedError(f"{self.name}: no chain form or no site kinds")

  def chain_solution(self, example: Example, flaw) -> str:
    """The example's chain with `flaw(site) -> bool` asked at each site (smjax.domains.chains)."""
    raise NotImplementedError(f"{self.name}: no chain form")

  def sample_solution(self, example: Example, rng: random.Random,
                      correct_fraction: float) -> str:
    """A chain whose sites are each flawed with probability 1 - correct_fraction ** (1 / sites),
    so that it is correct with probability `correct_fraction` (an example without sites: always),
    and wrong at any number of independent places."""
    n = self.chain_sites(example)
    if n == 0:
      return example.solution
    q = 1.0 - correct_fraction ** (1.0 / n)
    return self.chain_solution(example, lambda site: rng.random() < q)

  def _check_difficulty(self, difficulty: int | None) -> int:
    d = self.difficulty if difficulty is None else difficulty
    top = self.max_difficulty if self.form == "short" else self.max_chain_difficulty
    if not isinstance(d, int) or not 0 <= d <= top:
      raise ValueError(f"{self.name}: difficulty={d!r} must be an int in [0, {top}]"
                       + (" in the chain form" if self.form == "chain" else ""))
    return d

  @abc.abstractmethod
  def _make(self, split: str, rng: random.Random, difficulty: int) -> Example:
    """One example of `split` drawn with `rng` (the split rule lives here)."""

  def example(self, split: str, index: int, seed: int, difficulty: int | None = None) -> Example:
    check_split(split)
    d = self._check_difficulty(difficulty)
    ex = self._make(split, rng_for(self.name, split, seed, d, index), d)
    return dataclasses.replace(ex, metadata={**ex.metadata, "split": split, "index": index,
                                             "seed": seed, "difficulty": d})

  def generate(self, split: str, n: int, seed: int, difficulty: int | None = None
               ) -> list[Example]:
    return [self.example(split, i, seed, difficulty) for i in range(n)]
