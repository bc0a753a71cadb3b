"""Confidence intervals for the study's figures: over seeds when there are several, over held-out
prompts within a seed when there is one.

**Several seeds.** A figure's value on one seed (its arms evaluated on that seed's own held-out
prompts) is one draw of everything that varies between runs: training noise (which samples, which
steps) and evaluation noise (which prompts). Its headline interval is Student's t over the seeds'
values, mean +- t_{n-1} s / sqrt(n), exact for normally distributed seeds and the one that covers
what seeds disagree by. The two-level percentile bootstrap (seeds with replacement, then each drawn
seed's prompts) is kept beside it (`boot_lo`, `boot_hi`), not as the headline: with n seeds its
seed level spans about the range of the n values, and it undercovers: on a synthetic study with a
known answer it covered 85 % of the time with three seeds and 90 % with five, t 96 %
(tests/test_stats.py measures both).

**One seed.** The interval is the percentile bootstrap over held-out prompts, and it covers
evaluation noise only: it says nothing of how far another training run would land.

Every arm of a seed is evaluated on the same held-out prompts (and sampled with the same keys), so
one resample of a seed's prompts is applied to every arm's whole curve at once: a figure that
compares arms (a saving, an accuracy difference) is bootstrapped paired.

**Censoring.** A first passage that a curve does not reach is not infinite: the arm stopped before
it. A figure computed from one is a `Bound` (the true value is at least, or at most, the value at
the arm's last point). A figure whose point estimate is a bound is reported as one ("≥ x"). An
interval needs every seed's value uncensored (several seeds), or at most `MAX_UNSUPPORTED` of the
prompt replicates censored or undefined (one seed); otherwise it is left out and the share is
reported instead of a percentile the data cannot support.

Curves store per-prompt correct counts (`correct`: {domain: [0..k]}, `samples`: k, smjax.train.
evaluate); a curve without them (a hand-made one) gets point estimates and no interval.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

import numpy as np
import scipy.special

# {seed: {domain: resampled prompt indices, or None for the prompts as they are}}
Draw = Mapping[int, Mapping[str, np.ndarray | None]]

# One seed: an interval needs at most this share of the prompt replicates censored or undefined.
MAX_UNSUPPORTED = 0.05


@dataclasses.dataclass(frozen=True)
class Bound:
  """A censored figure: the true value is at least `value` (`side` +1: a first passage at or past
  an arm's last FLOPs) or at most `value` (`side` -1, e.g. a saving against such an arm)."""
  value: float
  side: int


def value_of(x) -> float:
  """A figure's number, whether it is a float or a `Bound`."""
  return float(x.value) if isinstance(x, Bound) else float(x)


def side_of(x) -> int:
  """+1 / -1 for a `Bound` (at least / at most), 0 for an exact value."""
  return x.side if isinstance(x, Bound) else 0


# A curve point's per-domain figure -> the per-prompt values it is the mean of (and their scale).
SOURCES = {"accuracy": ("correct", "samples"), "greedy": ("greedy_correct", None),
           "length": ("lengths", None)}


def curve_values(curve: Sequence[dict], idx: Mapping[str, np.ndarray | None], *,
                 source: str = "accuracy") -> list[dict]:
  """The curve's per-domain `source` figure ("accuracy": mean of the k samples, "greedy",
  "length") at every point, over the prompts `idx` (a domain not in it: as stored). A curve
  from `with_arrays` takes each domain's points in one numpy call."""
  per_prompt, scale_key = SOURCES[source]
  stacked = getattr(curve, "stacked", {})
  at_once = {d: stacked[(per_prompt, d)][:, sel].mean(axis=1) for d, sel in idx.items()
             if sel is not None and (per_prompt, d) in stacked}
  out = []
  for i, p in enumerate(curve):
    vals = {}
    for d, v in p.get(source, {}).items():
      raw = p.get(per_prompt, {}).get(d)
      sel = None if raw is None else idx.get(d)
      scale = p.get(scale_key, 1) if scale_key else 1
      if sel is None:
        vals[d] = v
      elif d in at_once:
        vals[d] = float(at_once[d][i]) / scale
      else:
        vals[d] = float(np.asarray(raw, np.float64)[sel].mean()) / scale
    out.append(vals)
  return out


class _Curve(list):
  """A curve (its points, a list) with its per-prompt figures stacked: {(key, domain): array of
  points x prompts} (`with_arrays`)."""
  stacked: dict


def with_arrays(curve: Sequence[dict]) -> list[dict]:
  """A copy of `curve` whose per-prompt lists (SOURCES) are float64 arrays, and stacked per
  domain where every point has one of the same length, made once so that curve_values, called
  for every bootstrap replicate, neither converts them again nor goes point by point."""
  keys = {k for k, _ in SOURCES.values()}

  def array(x):
    try:
      return np.asarray(x, np.float64)
    except (TypeError, ValueError):   # not a list of numbers: left as stored
      return x

  out = _Curve({k: ({d: array(x) for d, x in v.items()} if k in keys and isinstance(v, dict)
                    else v) for k, v in p.items()} for p in curve)
  out.stacked = {}
  for key in keys:
    for d in {d for p in out for d in (p.get(key) or {})}:
      rows = [(p.get(key) or {}).get(d) for p in out]
      if (all(isinstance(r, np.ndarray) and r.ndim == 1 for r in rows)
          and len({r.shape for r in rows}) == 1):
        out.stacked[(key, d)] = np.stack(rows)
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


def t_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
  """Student's t interval of the mean of `values` (n >= 2 finite values; else (nan, nan))."""
  x = np.asarray(values, np.float64)
  if x.size < 2 or not np.isfinite(x).all():
    return math.nan, math.nan
  # Student's t quantile (scipy.stats.t.ppf's value; scipy.special imports in a third the time).
  t = scipy.special.stdtrit(x.size - 1, (1 + confidence) / 2)
  half = t * x.std(ddof=1) / math.sqrt(x.size)
  return float(x.mean() - half), float(x.mean() + half)


def wilson_interval(mean: float, n: int, confidence: float) -> tuple[float, float]:
  """Wilson's score interval for a success rate `mean` over `n` prompts ((nan, nan) for n < 1).

  Exact-coverage-minded for one sample per prompt (a binomial), and conservative for the mean of
  several samples per prompt: a per-prompt rate in [0, 1] with mean p has variance at most
  p (1 - p), the binomial's. Unlike a bootstrap or t interval it does not collapse to a point when
  every prompt scored the same (0 of 5 right gives [0, 43 %]). `smjax eval` reports it."""
  if n < 1 or math.isnan(mean):
    return math.nan, math.nan
  z = float(scipy.special.ndtri((1 + confidence) / 2))   # the normal quantile
  z2n = z * z / n
  centre = (mean + z2n / 2) / (1 + z2n)
  half = z / (1 + z2n) * math.sqrt(max(mean * (1 - mean), 0.0) / n + z2n / (4 * n))
  return max(0.0, centre - half), min(1.0, centre + half)


def summarise(per_seed: Callable[[int, Mapping[str, np.ndarray | None]], dict],
              point: tuple[list[int], Draw], replicates: Sequence[tuple[list[int], Draw]],
              confidence: float) -> dict[str, dict]:
  """Every figure `per_seed(seed, idx)` returns ({name: float or Bound}), as its mean over seeds
  with its interval (module docstring): {name: {"mean", "lo", "hi", "interval" ("seeds": t over
  the seeds; "prompts": the prompt bootstrap of one seed, evaluation noise only; "": none the
  data supports), "bound" (+1: the mean is a lower bound, "≥"; -1: an upper one; 0: exact),
  "censored_seeds", "censored" (share of replicates with a censored value), "undefined"
  (replicates where it is nan), "boot_lo", "boot_hi" (the percentile bootstrap, several seeds),
  "std" (over seeds), "n", "missing" (seeds where it is nan or infinite), "per_seed" (each seed's
  value on all its prompts, in the order of `point`'s seeds), and where any seed's value is
  censored "per_seed_bound" (each seed's side, as "bound")}}."""

  def over(draw):
    seeds, idx = draw
    vals = {s: per_seed(s, idx[s]) for s in set(seeds)}
    # Sorted: a set of names iterates in an order that changes from one process to the next
    # (string hashing), and the report's JSON would with it.
    names = sorted({k for v in vals.values() for k in v})
    return {k: [vals[s].get(k, math.nan) for s in seeds] for k in names}

  base = over(point)
  reps = [over(r) for r in replicates]
  out = {}
  for name, xs in base.items():
    x = np.asarray([value_of(v) for v in xs], np.float64)
    sides = {side_of(v) for v in xs} - {0}
    bound = sides.pop() if len(sides) == 1 else 0
    finite = x[np.isfinite(x)]
    rep = [r.get(name, [math.nan]) for r in reps]
    means = [_mean([value_of(v) for v in r]) for r in rep]
    censored = sum(any(side_of(v) for v in r) for r in rep)
    undefined = sum(math.isnan(m) for m in means)
    share = (censored + undefined) / len(rep) if rep else 0.0
    boot = percentile_interval(means, confidence) if rep else (math.nan, math.nan)
    if x.size > 1:
      lo, hi = (math.nan, math.nan) if bound or len(sides) else t_interval(x, confidence)
      kind = "seeds"
    else:
      lo, hi = boot if share <= MAX_UNSUPPORTED and not bound else (math.nan, math.nan)
      kind = "prompts"
    out[name] = {"mean": _mean(x), "lo": lo, "hi": hi,
                 "interval": kind if not (math.isnan(lo) and math.isnan(hi)) else "",
                 "bound": bound, "censored_seeds": int(sum(side_of(v) != 0 for v in xs)),
                 "censored": censored / len(rep) if rep else 0.0,
                 "undefined": int(undefined),
                 "boot_lo": boot[0] if x.size > 1 else math.nan,
                 "boot_hi": boot[1] if x.size > 1 else math.nan,
                 "std": float(np.std(finite, ddof=1)) if finite.size > 1 else 0.0,
                 "n": len(xs), "missing": int(x.size - finite.size), "confidence": confidence,
                 "per_seed": [float(v) for v in x]}
    if any(side_of(v) for v in xs):
      out[name]["per_seed_bound"] = [side_of(v) for v in xs]
  return out


def per_seed(v: Mapping) -> list[tuple[float, int]]:
  """Each seed's (value, bound side) of a summarised figure (`summarise`'s dict): nan for a
  missing value; side 0 for an exact one, +1 / -1 for a censored "≥" / "≤" (a summary written
  before "per_seed_bound" existed reads as exact on every seed)."""
  xs = [number(x) for x in v.get("per_seed") or []]
  return list(zip(xs, v.get("per_seed_bound") or [0] * len(xs)))


def seed_signs(v: Mapping) -> list[int | None]:
  """Each seed's sign of a summarised figure (`summarise`'s dict, e.g. a saving): +1 or -1, or
  None where it is unknown: a censored value whose bound does not fix it ("≥ -20 %" or
  "≤ +15 %"), nan, or exactly 0 (`per_seed`)."""
  out = []
  for x, side in per_seed(v):
    sign = 1 if x > 0 else -1 if x < 0 else None   # nan compares False both ways
    out.append(sign if side == 0 or sign == side else None)
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
