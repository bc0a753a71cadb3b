"""Which sandbox results may be reused, and the store that keeps them (smjax.rewards.sandbox).

A study evaluates the same held-out prompts many times, and a model that has learnt a program
writes it again and again: in a profile of the full study's evaluation the toy `code` domain's
sandbox runs were a third of its time, nearly all of them repeats. `ResultCache` keeps the results
of io jobs that completed (status ok or error; the last `size`, least recently used out first)
and answers an identical job (same program, calls and limits) from them. A job is taken to be a
function of its fields, as `SandboxPool.run` already does within one call (identical jobs run
once): a candidate whose outputs depend on chance or the clock is scored by its first run.
Timeouts and crashes depend on the machine's load and are never kept; nor are check jobs, whose
pass also waits on the test process's exit. The cache holds copies and hands out copies, so a
caller changing a result (its outputs list too) does not change what a later job gets.
"""

from __future__ import annotations

import collections
import copy
import threading
from typing import Any, Sequence

KEPT_STATUSES = ("ok", "error")


def cache_key(job) -> Any | None:
  """The job itself as the key for an io job whose fields are all hashable; None (never kept)
  for a check job or one with unhashable arguments."""
  if job.calls is None:
    return None
  try:
    hash(job)
  except TypeError:
    return None
  return job


class ResultCache:
  """`lookup(jobs)` -> {key: a copy of the kept result} for the jobs it holds; `store(jobs,
  results)` keeps the completed io ones. Thread-safe. size 0: nothing is kept."""

  def __init__(self, size: int):
    self.size, self.hits = int(size), 0
    self._kept: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def keys(self, jobs: Sequence) -> list:
    return [cache_key(j) if self.size > 0 else None for j in jobs]

  def lookup(self, keys: Sequence) -> dict:
    with self._lock:
      out = {}
      for k in keys:
        if k is not None and k in self._kept:
          self._kept.move_to_end(k)
          out[k] = self._kept[k]
      self.hits += sum(k in out for k in keys if k is not None)
    return {k: copy.deepcopy(r) for k, r in out.items()}

  def store(self, keys: Sequence, results: Sequence) -> None:
    with self._lock:
      for k, r in zip(keys, results, strict=True):
        if k is not None and r.status in KEPT_STATUSES:
          self._kept[k] = copy.deepcopy(r)
          self._kept.move_to_end(k)
      while len(self._kept) > self.size:
        self._kept.popitem(last=False)
