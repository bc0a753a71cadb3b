"""Toy `logic`: transitive inference. Order the items of a chain given its links in any order.

  prompt "q<m,t>m:"  solution "qmt"        (q < m, t > m, so q < m < t)

difficulty d: a chain of n = 3 + d distinct random letters (up to 21-char prompts). The n - 1
links are listed in a random order, each written as "a<b" or as "b>a".

Chain form (smjax.domains.chains): a chain of n = 4 + d letters, the order assembled from the
links in the order they are listed, each step restating its link and writing the fragment it
made (sites: every step, "order"):
  "t<z,m>q,t>m:"  "t<z:tz;q<m:qm;m<t:qmtz;#qmtz"
difficulty 3, the hard level: n = 7, and every link written with '>' is also a "read" site (read
as if written with '<'); only templates with at least one '>' link are used, so that every
example has n - 1 = 6 "order" sites and at least one "read" site (9 sites on average):
  "p<d,j>l,s<n,s>a,d<a,n<l:"  "p<d:pd;l<j:lj;s<n:sn;a<s:asn;d<a:pdasn;n<l:pdasnlj;#pdasnlj"
Lengths at chain-form difficulty 0-3, in characters (= char tokens): prompts of at most
12, 16, 20 and 24; chains of at most 29, 40, 52 and 65 (the answer mark and answer included).
Sites per example at difficulty 0-3, mean (min): 3, 4, 5 and 9.03 (7; 6 order + 3.03 read).

Held-out split, disjoint by construction (a template split): a template is the order in which
the links are listed plus the direction each is written in; a fixed quarter of the templates
(by a CRC of the template) is used only for the held-out split. Each link position, link and
direction occurs in training; the held-out combinations of them never do.

Calibration (2-layer d64 char model, batch 64, Adam 3e-3, greedy exact match; train / held-out):
difficulty 1 reached 5/4% after 200 steps, 8/8% after 400, 24/19% after 800; difficulty 2
1/0%, 2/1%, 3/2%.
"""

from __future__ import annotations

import random
import string
import zlib

from smjax.domains import chains
from smjax.domains.base import Example, ToyDomain


def template_key(order: list[int], directions: list[int]) -> str:
  """order[p]: which chain link is listed at position p; directions[p]: 1 if written with '>'."""
  return "".join(map(str, order)) + "|" + "".join(map(str, directions))


def is_held_out(order: list[int], directions: list[int]) -> bool:
  return zlib.crc32(template_key(order, directions).encode()) % 4 == 0


def _links(prompt: str) -> list[str]:
  """"q<m,t>m:" -> ["q<m", "t>m"]."""
  return prompt.rstrip(":").split(",")


def _read_sites(example: Example) -> bool:
  """Whether the example's '>' links are "read" sites too (the chain form's hard level)."""
  return bool(example.metadata.get("read_sites", False))


class LogicDomain(ToyDomain):
  """Chain ordering; see the module docstring."""

  name = "logic"

  def _make(self, split: str, rng: random.Random, difficulty: int) -> Example:
    n = 3 + difficulty + (self.form == "chain")
    hard = self.form == "chain" and difficulty == 3
    want_test = split == "test"
    while True:
      order = rng.sample(range(n - 1), n - 1)
      directions = [rng.randint(0, 1) for _ in range(n - 1)]
      if is_held_out(order, directions) == want_test and (not hard or 1 in directions):
        break
    chain = rng.sample(string.ascii_lowercase, n)
    links = []
    for link, flip in zip(order, directions):
      lo, hi = chain[link], chain[link + 1]
      links.append(f"{hi}>{lo}" if flip else f"{lo}<{hi}")
    answer = "".join(chain)
    solution = (chains.logic_chain(links, read_sites=hard)[0] if self.form == "chain"
                else answer)
    return Example(prompt=",".join(links) + ":", reference=answer, solution=solution,
                   domain=self.name,
                   metadata={"template": template_key(order, directions),
                             **({"read_sites": True} if hard else {})})

  def chain_sites(self, example: Example) -> int:
    return chains.logic_sites(_links(example.prompt), _read_sites(example))

  def chain_site_kinds(self, example: Example) -> list[str]:
    links, read = _links(example.prompt), _read_sites(example)
    return chains.site_kinds(lambda f, k: chains.logic_chain(links, f, k, read))

  def chain_solution(self, example: Example, flaw) -> str:
    return chains.logic_chain(_links(example.prompt), flaw,
                              read_sites=_read_sites(example))[0]

  def score(self, example: Example, completion: str) -> float:
    return float(self.extract_answer(completion) == example.reference)
