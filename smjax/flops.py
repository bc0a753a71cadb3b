"""FLOPs of compiled executables (XLA cost analysis), cached per shape signature.

A FLOP is what XLA's cost analysis of the compiled executable says it does, times how often it ran
(DESIGN.md §6). Loop bodies are counted once by XLA, so callers that run a `lax.while_loop` report the
per-iteration program separately (`ProgramCall` with `calls = iterations`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

_COST_CACHE: dict[tuple, float] = {}


def _signature(args, kwargs) -> tuple:
  def sig(x):
    if hasattr(x, "shape") and hasattr(x, "dtype"):
      sh = getattr(x, "sharding", None)
      return (tuple(x.shape), str(x.dtype), str(getattr(sh, "spec", "")))
    return ("static", repr(x))
  leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
  return (str(tree),) + tuple(sig(x) for x in leaves)


def _abstract(x):
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
  return x


def cost_analysis(jitted: Callable, *args, **kwargs) -> dict[str, float]:
  """The cost-analysis dict of `jitted` compiled for these argument shapes (not cached)."""
  compiled = jitted.lower(*jax.tree.map(_abstract, args), **jax.tree.map(_abstract, kwargs)).compile()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax returned one dict per device program
    cost = cost[0] if cost else {}
  return dict(cost or {})


def compiled_flops(jitted: Callable, *args, **kwargs) -> float:
  """FLOPs of one call of `jitted` on arguments of these shapes, from XLA's cost analysis.

  Cached per (function, shape/dtype/sharding signature), so asking in a hot loop compiles nothing
  after the first time. `args` may be arrays or `jax.ShapeDtypeStruct`s.
  """
  key = (id(jitted), _signature(args, kwargs))
  if key not in _COST_CACHE:
    _COST_CACHE[key] = float(cost_analysis(jitted, *args, **kwargs).get("flops", 0.0))
  return _COST_CACHE[key]


@dataclasses.dataclass
class ProgramCall:
  """One executable that ran `calls` times in a ledger phase (e.g. the decode step x steps run).

  `fn` is a jitted function and `args`/`kwargs` arrays or ShapeDtypeStructs of one call; the FLOPs are
  computed lazily (and cached) by `flops()`. `useful` is the analytic count for the same work.
  """
  phase: str
  fn: Callable
  args: tuple
  kwargs: dict = dataclasses.field(default_factory=dict)
  calls: int = 1
  useful: float = 0.0

  def flops_per_call(self) -> float:
    return compiled_flops(self.fn, *self.args, **self.kwargs)

  def flops(self) -> float:
    return self.flops_per_call() * self.calls


def shape_struct(x: Any):
  """A ShapeDtypeStruct for an array (keeps its sharding), other leaves unchanged."""
  return _abstract(x)
