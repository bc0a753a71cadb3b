"""Toy `strings`: count the letters of a word, in alphabetical order.

  prompt "count:qbqqeb="  solution "b2e1q3"

difficulty 0: 4-letter words over 2 letters;  1: 6 over 3;  2: 8 over 4;  3: 9 over 5 (at most
10-char answers; a letter's count is a single digit).

Chain form (smjax.domains.chains), difficulty 0-2: the words of difficulty d + 1, counted as a
running tally (sites: every repeated letter, "count"):
  "count:qbqqebeq="  "q1;b1;q2;q3;e1;b2;e2;q4;#b2e2q4"
difficulty 3, the hard level: 10-letter words over 6 letters, and the answer's alphabetical
order is a second kind of site ("sort": a letter that goes before one seen earlier, listed
where it was seen instead); only words whose letters are not first seen in alphabetical order
are used, so that every example has >= 4 "count" sites and >= 1 "sort" site:
  "count:xcxgccgsbg="  "x1;c1;x2;g1;c2;c3;g2;s1;b1;g3;#b1c3g3s1x2"  (9 sites: 5 + 4)
Lengths at chain-form difficulty 0-3, in characters (= char tokens): prompts of at most
13, 15, 16 and 17; chains of at most 25, 33, 38 and 43 (the answer mark and answer included).
Sites per example at difficulty 0-3, mean (min): 3.27 (3), 4.40 (4), 4.68 (4) and 7.77 (5; 4.96
count + 2.81 sort).

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

# difficulty -> (length, letters to use); the chain form's difficulty d uses d + 1, its hard
# level (3) the last.
LEVELS = {0: (4, 2), 1: (6, 3), 2: (8, 4), 3: (9, 5), 4: (10, 6)}


def is_held_out(word: str) -> bool:
  return sum(ord(c) - ord("a") for c in word) % 5 == 0


def letter_counts(word: str) -> str:
  return "".join(f"{c}{word.count(c)}" for c in sorted(set(word)))


def _sort_sites(example: Example) -> bool:
  """Whether the example's answer order is a "sort" site too (the chain form's hard level)."""
  return bool(example.metadata.get("sort_sites", False))


class StringsDomain(ToyDomain):
  """Letter counting; see the module docstring."""

  name = "strings"

  def _make(self, split: str, rng: random.Random, difficulty: int) -> Example:
    n, k = LEVELS[difficulty + (self.form == "chain")]
    hard = self.form == "chain" and difficulty == 3
    want_test = split == "test"
    while True:
      letters = rng.sample(string.ascii_lowercase, k)
      word = "".join(rng.choice(letters) for _ in range(n))
      seen = "".join(dict.fromkeys(word))   # letters in the order first seen
      if is_held_out(word) == want_test and (not hard or seen != "".join(sorted(seen))):
        break
    answer = letter_counts(word)
    solution = (chains.strings_chain(word, sort_sites=hard)[0] if self.form == "chain"
                else answer)
    return Example(prompt=f"count:{word}=", reference=answer, solution=solution, domain=self.name,
                   metadata={"word": word, **({"sort_sites": True} if hard else {})})

  def chain_sites(self, example: Example) -> int:
    return chains.strings_sites(example.metadata["word"], _sort_sites(example))

  def chain_site_kinds(self, example: Example) -> list[str]:
    word, sort = example.metadata["word"], _sort_sites(example)
    return chains.site_kinds(lambda f, k: chains.strings_chain(word, f, k, sort))

  def chain_solution(self, example: Example, flaw) -> str:
    return chains.strings_chain(example.metadata["word"], flaw,
                                sort_sites=_sort_sites(example))[0]

  def score(self, example: Example, completion: str) -> float:
    return float(self.extract_answer(completion) == example.reference)
