"""Confidence intervals for the study's figures: a percentile bootstrap over held-out prompts within
a seed, and over seeds when there are several.

Every arm of a seed is evaluated on the same held-out prompts (and sampled with the same keys),
so one resample of a seed's prompts is applied to every arm's whole curve at once: a figure that
compares arms (a saving, a FLOP ratio, an accuracy difference) is bootstrapped paired, as it
should be. With several seeds a replicate first draws the seeds with replacement, then each
drawn seed's prompts; a figure's value is its mean over the drawn seeds. A figure that is
unbounded in a replicate (a target never reached: FLOPs +inf) stays in the percentile, so an
interval can be open on one side; a replicate where it is undefined (nan) is left out and
counted.

Curves store per-prompt correct counts (`correct`: {domain: [0..k]}, `samples`: k, smjax.train.
evaluate); a curve without them (a hand-made one) gets point estimates and no interval.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

# {seed: {domain: resampled prompt indices, or None for the prompts as they are}}
Draw = Mapping[int, Mapping[str, np.ndarray | None]]


# A curve point's per-domain figure -> the per-prompt values it is the mean of (and their scale).
SOURCES = {"accuracy": ("correct", "samples"), "greedy": ("greedy_correct", None),
           "length": ("lengths", None)}


def curve_values(curve: Sequence[dict], idx: Mapping[str, np.ndarray | None], *,
                 source: str = "accuracy") -> list[dict]:
  """The curve's per-domain `source` figure ("accuracy": mean of the k samples, "greedy",
  "length") at every point, over the prompts `idx` (a domain not in it: as stored)."""
  per_prompt, scale_key = SOURCES[source]
  out = []
  for p in curve:
    vals = {}
    for d, v in p.get(source, {}).items():
      raw = p.get(per_prompt, {}).get(d)
      sel = None if raw is None else idx.get(d)
      scale = p.get(scale_key, 1) if scale_key else 1
      vals[d] = v if sel is None else float(np.asarray(raw, np.float64)[sel].mean()) / scale
    out.append(vals)
  return out


def prompt_counts(arms_curves: Sequence[Sequence[dict]]) -> dict[str, int]:
  """{domain: number of held-out prompts} over curves that carry per-prompt counts."""
  n: dict[str, int] = {}
  for curve in arms_curves:
    for p in curve:
      for d, c in p.get("correct", {}).items():
        if n.setdefault(d, len(c)) != len(c):
          raise ValueError(f"domain {d!r}: curves hold {n[d]} and {len(c)} held-out prompts; "
                           "the arms of a seed must be evaluated on one held-out set")
  return n


def draws(prompts_by_seed: Mapping[int, Mapping[str, int]], replicates: int,
          rng: np.random.Generator) -> list[tuple[list[int], Draw]]:
  """`replicates` bootstrap draws: (the seeds drawn, with replacement when there are several;
  each drawn seed's resampled prompt indices per domain)."""
  seeds = sorted(prompts_by_seed)
  out = []
  for _ in range(replicates):
    picked = (list(rng.choice(seeds, size=len(seeds), replace=True)) if len(seeds) > 1
              else list(seeds))
    out.append(([int(s) for s in picked],
                {s: {d: rng.integers(0, n, size=n) for d, n in prompts_by_seed[s].items()}
                 for s in set(picked)}))
  return out


def identity(prompts_by_seed: Mapping[int, Mapping[str, int]]) -> tuple[list[int], Draw]:
  return sorted(prompts_by_seed), {s: {} for s in prompts_by_seed}


def percentile_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
  """The equal-tailed percentile interval of `values` (nan left out; +-inf kept)."""
  v = np.asarray([x for x in values if not math.isnan(x)], np.float64)
  if not v.size:
    return math.nan, math.nan
  a = (1 - confidence) / 2
  with np.errstate(invalid="ignore"):  # inf - inf between two unbounded replicates
    lo, hi = np.quantile(v, [a, 1 - a], method="linear")
  return _unbounded(v, a, lo, -math.inf), _unbounded(v, 1 - a, hi, math.inf)


def _unbounded(v: np.ndarray, q: float, x: float, side: float) -> float:
  """The `q` quantile `x`, or where interpolating next to an infinite replicate made it nan:
  that infinity (`side` between -inf and +inf, where it is undefined)."""
  if not np.isnan(x):
    return float(x)
  below, above = (float(np.quantile(v, q, method=m)) for m in ("lower", "higher"))
  if below == above:
    return below
  if math.isinf(below) and math.isinf(above):
    return side
  return below if math.isinf(below) else above


def summarise(per_seed: Callable[[int, Mapping[str, np.ndarray | None]], dict[str, float]],
              point: tuple[list[int], Draw], replicates: Sequence[tuple[list[int], Draw]],
              confidence: float) -> dict[str, dict]:
  """Every figure `per_seed(seed, idx)` returns ({name: value}), as its mean over seeds with
  its interval over the replicates: {name: {"mean", "lo", "hi", "std" (over seeds), "n",
  "missing" (seeds where it is nan or infinite), "undefined" (replicates left out), "per_seed"
  (each seed's value on all its prompts, in the order of `point`'s seeds)}}."""

  def over(draw):
    seeds, idx = draw
    vals = {s: per_seed(s, idx[s]) for s in set(seeds)}
    names = {k for v in vals.values() for k in v}
    return {k: [vals[s].get(k, math.nan) for s in seeds] for k in names}

  base = over(point)
  reps = [over(r) for r in replicates]
  out = {}
  for name, xs in base.items():
    x = np.asarray(xs, np.float64)
    finite = x[np.isfinite(x)]
    means = [_mean(r.get(name, [math.nan])) for r in reps]
    lo, hi = percentile_interval(means, confidence) if reps else (math.nan, math.nan)
    out[name] = {"mean": _mean(xs), "lo": lo, "hi": hi,
                 "std": float(np.std(finite, ddof=1)) if finite.size > 1 else 0.0,
                 "n": len(xs), "missing": int(x.size - finite.size),
                 "undefined": int(sum(math.isnan(m) for m in means)), "confidence": confidence,
                 "per_seed": [float(v) for v in xs]}
  return out


def _mean(xs: Sequence[float]) -> float:
  x = np.asarray(xs, np.float64)
  if np.isnan(x).any():
    return math.nan
  with np.errstate(invalid="ignore"):
    return float(np.mean(x))


def jsonable(v: dict) -> dict:
  """A summary with +-inf as the strings "inf"/"-inf" and nan as None (strict JSON), in lists
  too."""
  def f(x):
    if isinstance(x, list):
      return [f(y) for y in x]
    if isinstance(x, float) and math.isinf(x):
      return "inf" if x > 0 else "-inf"
    if isinstance(x, float) and math.isnan(x):
      return None
    return x
  return {k: f(x) for k, x in v.items()}


def number(x) -> float:
  """A summary field back from JSON (None -> nan, "inf" -> inf)."""
  if x is None:
    return math.nan
  return float(x)
