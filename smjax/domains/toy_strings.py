"""Toy `strings`: count the letters of a word, in alphabetical order.

  prompt "count:qbqqeb="  solution "b2e1q3"

difficulty 0: 4-letter words over 2 letters;  1: 6 over 3;  2: 8 over 4;  3: 9 over 5 (at most
10-char answers; a letter's count is a single digit).

Chain form (smjax.domains.chains): the words of difficulty d + 1, counted as a running tally:
  "count:qbqqebeq="  "q1;b1;q2;q3;e1;b2;e2;q4;#b2e2q4"

Held-out split, disjoint by construction: a word is held out iff the sum of its letters'
alphabet positions is 0 mod 5 (about a fifth of the words). Every letter, letter pair, count and
length occurs in training; no held-out word does (and anagrams, which share an answer, share a
split).

Calibration (2-layer d64 char model, batch 64, Adam 3e-3, greedy exact match; train / held-out):
difficulty 1 reached 7/8% after 200 steps, 50/38% after 400, 77/75% after 800. Letter sorting,
tried first, was learnt too fast to leave RL anything to do (8-letter words: 59% after 200
steps, 93% after 800; a letter-range held-out split instead stayed at 21-44% held-out while
training reached 97%).
"""

from __future__ import annotations

import random
import string

from smjax.domains import chains
from smjax.domains.base import Example, ToyDomain

LEVELS = {0: (4, 2), 1: (6, 3), 2: (8, 4), 3: (9, 5)}  # difficulty -> (length, letters to use)


def is_held_out(word: str) -> bool:
  return sum(ord(c) - ord("a") for c in word) % 5 == 0


def letter_counts(word: str) -> str:
  return "".join(f"{c}{word.count(c)}" for c in sorted(set(word)))


class StringsDomain(ToyDomain):
  """Letter counting; see the module docstring."""

  name = "strings"

  max_chain_difficulty = 2

  def _make(self, split: str, rng: random.Random, difficulty: int) -> Example:
    n, k = LEVELS[difficulty + (self.form == "chain")]
    want_test = split == "test"
    while True:
      letters = rng.sample(string.ascii_lowercase, k)
      word = "".join(rng.choice(letters) for _ in range(n))
      if is_held_out(word) == want_test:
        break
    answer = letter_counts(word)
    solution = chains.strings_chain(word)[0] if self.form == "chain" else answer
    return Example(prompt=f"count:{word}=", reference=answer, solution=solution, domain=self.name,
                   metadata={"word": word})

  def chain_sites(self, example: Example) -> int:
    return chains.strings_sites(example.metadata["word"])

  def chain_solution(self, example: Example, flaw) -> str:
    return chains.strings_chain(example.metadata["word"], flaw)[0]

  def score(self, example: Example, completion: str) -> float:
    return float(self.extract_answer(completion) == example.reference)
