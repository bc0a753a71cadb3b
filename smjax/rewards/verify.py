"""Batched verification: the one call the GRPO loop makes per step.

`verify_batch(examples, completions, pool=...)` groups the batch by domain, sends each group to
its domain's `verify_many` (code domains run their whole group through the sandbox pool at once,
in parallel over its workers) and returns float32 rewards in [0, 1] in input order.
"""

from __future__ import annotations

import collections
from typing import Mapping, Sequence

import numpy as np

from smjax.domains import Domain, Example, get_domain

_CACHE: dict[str, Domain] = {}


def domain_for(name: str, domains: Mapping[str, Domain] | None = None) -> Domain:
  """The Domain object for an example's domain name (given, or built once and cached)."""
  if domains is not None and name in domains:
    return domains[name]
  if name not in _CACHE:
    _CACHE[name] = get_domain(name)
  return _CACHE[name]


def verify_batch(examples: Sequence[Example], completions: Sequence[str], *,
                 domains: Mapping[str, Domain] | Sequence[Domain] | None = None,
                 pool=None) -> np.ndarray:
  """Rewards [len(examples)] float32. `domains`: Domain objects by name (or a list of them) to
  use instead of building them from each example's `domain` name; `pool`: a SandboxPool (the
  process-wide default pool if None)."""
  if len(examples) != len(completions):
    raise ValueError(f"{len(examples)=} != {len(completions)=}")
  if domains is not None and not isinstance(domains, Mapping):
    domains = {d.name: d for d in domains}
  groups: dict[str, list[int]] = collections.defaultdict(list)
  for i, e in enumerate(examples):
    groups[e.domain].append(i)
  rewards = np.zeros(len(examples), np.float32)
  for name, idx in groups.items():
    dom = domain_for(name, domains)
    got = dom.verify_many([examples[i] for i in idx], [completions[i] for i in idx], pool=pool)
    rewards[idx] = np.asarray(got, np.float32)
  return rewards
