"""The study's bootstrap (smjax.study.stats) against numpy, scipy and hand-computed values."""

import json
import math

import numpy as np
import pytest
import scipy.stats

from smjax.study import stats
from smjax.study.report import ArmResult, build_report


def _point(flops, counts, k):
  """A curve point as smjax.train.evaluate writes it, from per-prompt correct counts."""
  acc = {d: float(np.mean(c)) / k for d, c in counts.items()}
  return {"step": 0, "flops": float(flops), "mean": float(np.mean(list(acc.values()))),
          "accuracy": acc, "correct": {d: [int(x) for x in c] for d, c in counts.items()},
          "samples": k}


def _accuracy_interval(counts_by_seed, k, replicates, rng, confidence=0.95):
  """The library's interval of the final mean accuracy of one curve point per seed."""
  curves = {s: [_point(0, {"math": c}, k)] for s, c in counts_by_seed.items()}
  prompts = {s: stats.prompt_counts([curve]) for s, curve in curves.items()}
  per_seed = lambda s, idx: {"acc": stats.curve_values(curves[s], idx)[-1]["math"]}  # noqa: E731
  out = stats.summarise(per_seed, stats.identity(prompts), stats.draws(prompts, replicates, rng),
                        confidence)
  return out["acc"]


def test_percentile_interval_is_numpys_linear_quantile():
  v = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
  # Sorted 1 1 2 3 4 5 6 9; q=0.1 sits at 0.7 (between 1 and 1), q=0.9 at 6.3: 6 + 0.3 x 3.
  assert stats.percentile_interval(v, 0.8) == pytest.approx((1.0, 6.9))
  assert stats.percentile_interval(v, 0.8) == pytest.approx(tuple(np.quantile(v, [0.1, 0.9])))
  assert stats.percentile_interval(v + [math.nan], 0.8) == pytest.approx((1.0, 6.9))
  assert all(math.isnan(x) for x in stats.percentile_interval([math.nan], 0.9))


def test_percentile_interval_with_unbounded_replicates():
  inf = math.inf
  assert stats.percentile_interval([1.0, 2.0, 3.0, inf], 0.95) == (pytest.approx(1.075), inf)
  # Every replicate unbounded, or the lower quantile among unbounded ones: the interval is
  # [inf, inf], not (-inf, inf).
  assert stats.percentile_interval([inf] * 10, 0.95) == (inf, inf)
  assert stats.percentile_interval([1.0] * 2 + [inf] * 98, 0.95) == (inf, inf)
  assert stats.percentile_interval([-inf] * 10, 0.95) == (-inf, -inf)
  # q=0.025 of 61 values sits at 1.5, between a finite 1 and inf: inf.
  assert stats.percentile_interval([1.0] * 2 + [inf] * 59, 0.95) == (inf, inf)
  # Between -inf and +inf it is undefined: open on that side.
  assert stats.percentile_interval([-inf, inf], 0.5) == (-inf, inf)


def test_hand_computed_replicates():
  # 4 prompts, k = 4 samples: accuracies 0, .25, .5, 1 (mean .4375).
  curve = [_point(0, {"math": [0, 1, 2, 4]}, 4)]
  per_seed = lambda s, idx: {"acc": stats.curve_values(curve, idx)[-1]["math"]}  # noqa: E731
  reps = [([0], {0: {"math": np.array(i)}}) for i in
          ([0, 0, 0, 0], [3, 3, 3, 3], [0, 1, 2, 3], [1, 1, 2, 2], [2, 3, 2, 3])]
  # Replicate means 0, 1, .4375, .375, .75 -> sorted 0 .375 .4375 .75 1.
  s = stats.summarise(per_seed, stats.identity({0: {"math": 4}}), reps, 0.5)["acc"]
  assert s["mean"] == pytest.approx(0.4375)
  assert (s["lo"], s["hi"]) == pytest.approx((0.375, 0.75))  # positions 1 and 3
  assert (s["n"], s["std"], s["missing"], s["undefined"]) == (1, 0.0, 0, 0)
  s = stats.summarise(per_seed, stats.identity({0: {"math": 4}}), reps, 0.8)["acc"]
  assert (s["lo"], s["hi"]) == pytest.approx((0.4 * 0.375, 0.75 + 0.6 * 0.25))  # 0.4, 3.6
  # The drawn indices: one resample of each domain's prompts per replicate.
  d = stats.draws({0: {"math": 4, "code": 7}}, 3, np.random.default_rng(0))
  assert len(d) == 3 and all(seeds == [0] for seeds, _ in d)
  for _, idx in d:
    assert idx[0]["math"].shape == (4,) and idx[0]["code"].shape == (7,)
    assert idx[0]["code"].min() >= 0 and idx[0]["code"].max() < 7


def test_interval_matches_an_independent_numpy_bootstrap():
  rng = np.random.default_rng(1)
  k, n, b = 4, 300, 3000
  counts = rng.binomial(k, 0.3, size=n)
  s = _accuracy_interval({0: counts}, k, b, np.random.default_rng(2))
  idx = np.random.default_rng(3).integers(0, n, size=(b, n))
  means = counts[idx].mean(1) / k
  lo, hi = np.quantile(means, [0.025, 0.975])
  assert s["mean"] == pytest.approx(counts.mean() / k)
  # Monte-Carlo error of each bound ~ 1e-3 here.
  assert s["lo"] == pytest.approx(lo, abs=4e-3) and s["hi"] == pytest.approx(hi, abs=4e-3)


def test_interval_matches_scipy_bootstrap_percentile():
  rng = np.random.default_rng(4)
  x = (rng.random(2000) < 0.3).astype(int)  # Bernoulli(0.3) counts, one sample per prompt
  s = _accuracy_interval({0: x}, 1, 2000, np.random.default_rng(5))
  ref = scipy.stats.bootstrap((x,), np.mean, method="percentile", n_resamples=2000,
                              confidence_level=0.95, random_state=np.random.default_rng(6))
  assert s["lo"] < 0.3 < s["hi"]
  assert s["lo"] == pytest.approx(ref.confidence_interval.low, abs=5e-3)
  assert s["hi"] == pytest.approx(ref.confidence_interval.high, abs=5e-3)


def test_coverage_of_a_known_accuracy():
  rng = np.random.default_rng(7)
  p, k, n, trials = 0.35, 4, 80, 200
  covered = 0
  for _ in range(trials):
    s = _accuracy_interval({0: rng.binomial(k, p, size=n)}, k, 200, rng)
    covered += s["lo"] <= p <= s["hi"]
  assert 0.90 * trials <= covered <= 0.99 * trials


def test_identical_arms_give_an_exact_zero_saving():
  rng = np.random.default_rng(8)
  k, n = 4, 50
  lo_c, mid_c, hi_c = (rng.binomial(k, p, size=n) for p in (0.2, 0.4, 0.6))
  curve = [_point(0, {"math": lo_c}, k), _point(100, {"math": mid_c}, k),
           _point(200, {"math": hi_c}, k)]
  arms = [ArmResult(name, 0, [dict(p) for p in curve], {"train/policy": 200.0})
          for name in ("joint_grpo", "split_merge")]
  rep = build_report(arms, bootstrap=300)
  s = rep["arms"]["split_merge"]
  for fig in ("saving_at_target", "accuracy_vs_reference"):
    assert (s[fig]["mean"], s[fig]["lo"], s[fig]["hi"], s[fig]["undefined"]) == (0, 0, 0, 0)
  # ... while each arm's own FLOPs to the target do vary over the replicates.
  f = s["flops_to_target"]
  assert f["lo"] < f["mean"] < f["hi"] < 200


def test_interval_widens_when_seeds_disagree():
  rng = np.random.default_rng(9)
  k, n, b = 4, 200, 400
  close = _accuracy_interval({s: rng.binomial(k, p, size=n) for s, p in enumerate((.49, .5, .51))},
                             k, b, np.random.default_rng(10))
  apart = _accuracy_interval({s: rng.binomial(k, p, size=n) for s, p in enumerate((.2, .5, .8))},
                             k, b, np.random.default_rng(10))
  assert close["n"] == apart["n"] == 3 and apart["std"] > 0.2 > close["std"]
  assert close["interval"] == apart["interval"] == "seeds"
  assert apart["hi"] - apart["lo"] > 5 * (close["hi"] - close["lo"])
  # Student's t over the three seeds' values (each on all its prompts), by hand.
  x = np.asarray(apart["per_seed"])
  half = scipy.stats.t.ppf(0.975, 2) * x.std(ddof=1) / math.sqrt(3)
  assert (apart["lo"], apart["hi"]) == pytest.approx((x.mean() - half, x.mean() + half))
  # The two-level bootstrap is kept beside it, and is narrower: it spans about the seeds' range.
  assert x.min() - 0.05 < apart["boot_lo"] and apart["boot_hi"] < x.max() + 0.05
  assert apart["boot_hi"] - apart["boot_lo"] < apart["hi"] - apart["lo"]


def _coverage(seeds, trials, rng, sd_seed, p=0.4, k=4, n=64):
  """Shares of `trials` simulated studies whose headline interval (t over seeds) and two-level
  bootstrap cover the known mean accuracy p: each seed's true accuracy is p plus training noise
  of sd `sd_seed`, and its held-out prompts are sampled from it (evaluation noise)."""
  hit_t = hit_boot = 0
  for _ in range(trials):
    ps = np.clip(p + sd_seed * rng.standard_normal(seeds), 0.01, 0.99)
    s = _accuracy_interval({i: rng.binomial(k, q, size=n) for i, q in enumerate(ps)}, k, 60, rng)
    hit_t += s["lo"] <= p <= s["hi"]
    hit_boot += s["boot_lo"] <= p <= s["boot_hi"]
  return hit_t / trials, hit_boot / trials


def test_seed_interval_covers_a_known_answer_at_its_nominal_rate():
  """A synthetic study with a known answer: seeds whose accuracy varies by training noise far
  beyond one seed's evaluation noise. The headline interval covers ~95 %; the two-level
  percentile bootstrap, at the seed level about the range of the values, covers far less."""
  rng = np.random.default_rng(21)
  for seeds in (3, 5):
    t_cover, boot_cover = _coverage(seeds, 400, rng, sd_seed=0.08)
    assert 0.90 <= t_cover <= 0.98, (seeds, t_cover)
    # (seed 21: 0.85 with three seeds, 0.90 with five, against t's 0.96 and 0.96)
    assert boot_cover <= t_cover - 0.04, (seeds, t_cover, boot_cover)
    if seeds == 3:
      assert boot_cover < 0.90, boot_cover


def test_a_target_not_always_reached_is_censored_and_says_so():
  rng = np.random.default_rng(11)
  k, n = 4, 60
  start = np.zeros(n, int)
  end = rng.binomial(k, 0.5, size=n)
  target = end.mean() / k  # the point estimate reaches it exactly at the last point
  curve = [_point(0, {"math": start}, k), _point(100, {"math": end}, k)]
  arms = [ArmResult(name, 0, [dict(p) for p in curve], {"train/policy": 100.0})
          for name in ("joint_grpo", "split_merge")]
  rep = build_report(arms, target=target, bootstrap=200, levels=())
  f = rep["arms"]["split_merge"]["flops_to_target"]
  # Replicates that move the target above the curve's end are censored at its last FLOPs (not
  # +inf); about half of them here, far over 5 %: no percentile interval, the share instead.
  assert f["mean"] == pytest.approx(100.0) and f["bound"] == 0 and f["missing"] == 0
  assert 0.2 < f["censored"] < 0.8 and f["lo"] is None and f["hi"] is None
  assert f["interval"] == ""
  # Both arms censored in the same replicates: their saving is undefined there, counted.
  s = rep["arms"]["split_merge"]["saving_at_target"]
  assert 0 < s["undefined"] < 200 and s["mean"] == 0
  json.dumps(rep, allow_nan=False)
  # jsonable and number, both ways.
  v = {"mean": 1.0, "lo": -math.inf, "hi": math.inf, "std": math.nan, "n": 2,
       "per_seed": [math.nan, 1.0]}
  j = stats.jsonable(v)
  assert j == {"mean": 1.0, "lo": "-inf", "hi": "inf", "std": None, "n": 2,
               "per_seed": [None, 1.0]}
  assert [stats.number(j[x]) for x in ("lo", "hi")] == [-math.inf, math.inf]
  assert math.isnan(stats.number(j["std"]))


def test_censored_values_are_bounds_and_few_censored_replicates_keep_the_interval():
  """A figure censored in at most 5 % of the replicates keeps its percentile interval (the
  censored replicates at their bound); censored at the point estimate, it is "at least"."""
  def per_seed(s, idx):
    sel = idx.get("math")
    hit = sel is not None and not sel[:3].any()   # rare: prompt 0 drawn first three times
    return {"x": stats.Bound(5.0, +1) if hit else float(1 + np.mean(sel if sel is not None
                                                                        else np.arange(4))),
            "y": stats.Bound(7.0, +1)}
  rng = np.random.default_rng(3)
  reps = [([0], {0: {"math": rng.integers(0, 4, 4)}}) for _ in range(400)]
  share = np.mean([not r[1][0]["math"][:3].any() for r in reps])
  assert 0 < share <= 0.05
  out = stats.summarise(per_seed, stats.identity({0: {"math": 4}}), reps, 0.9)
  x, y = out["x"], out["y"]
  assert x["censored"] == pytest.approx(share) and x["interval"] == "prompts"
  assert x["lo"] < x["mean"] == 2.5 < x["hi"] and x["bound"] == 0
  assert y["bound"] == 1 and y["mean"] == 7.0 and math.isnan(y["lo"]) and y["censored_seeds"] == 1
  # With several seeds, one censored seed leaves no interval (its value is only a bound).
  two = stats.summarise(lambda s, idx: {"z": stats.Bound(3.0, 1) if s else 1.0},
                        stats.identity({0: {}, 1: {}}), [], 0.9)["z"]
  assert two["bound"] == 1 and two["censored_seeds"] == 1 and math.isnan(two["lo"])
  assert two["per_seed"] == [1.0, 3.0] and two["per_seed_bound"] == [0, 1]
  assert "per_seed_bound" not in x   # no seed censored at the point estimate: left out


def test_a_censored_seed_has_a_sign_only_where_its_bound_fixes_it():
  """stats.seed_signs, by hand: an exact value's sign; "≥ +8 %" cheaper, "≥ -20 %" open; "≤ -30 %"
  dearer, "≤ +15 %" open; nan and 0 open; a summary from before per_seed_bound reads as exact.
  The verdict's seed count follows it and names the open seeds, the nan and the 0 ones, so that
  every seed is counted once."""
  from smjax.study import verdicts  # pylint: disable=import-outside-toplevel
  v = {"per_seed": [0.3, -0.2, 0.08, -0.2, -0.3, 0.15, math.nan, 0.0],
       "per_seed_bound": [0, 0, 1, 1, -1, -1, 0, 0]}
  assert stats.seed_signs(v) == [1, -1, 1, None, -1, None, None, None]
  assert stats.seed_signs({"per_seed": [0.3, -0.2]}) == [1, -1]
  assert stats.seed_signs({}) == []
  tail = ", 2 censored (sign open), 1 without a value, 1 at exactly 0"
  assert verdicts._agree(v, 0) == "; 2 of 8 seeds cheaper, 2 dearer" + tail
  assert verdicts._agree(v, -1) == "; 2 of 8 seeds agree" + tail
  assert verdicts._agree({"per_seed": [0.1, -0.2, -0.3]}, -1) == "; 2 of 3 seeds agree"
  # A censored seed at 0 or nan is named once, as censored.
  assert verdicts._agree({"per_seed": [0.1, 0.0, math.nan], "per_seed_bound": [0, 1, -1]},
                         0) == "; 1 of 3 seeds cheaper, 0 dearer, 2 censored (sign open)"


def test_a_saving_censored_on_some_seeds_says_on_how_many():
  """A route that had not reached the level on 1 of 3 seeds: its verdict says so and counts the
  seeds (it reached the level on the other two); censored on every seed, or on the one seed of
  one, it says it had not reached it, as before."""
  from smjax.study import verdicts  # pylint: disable=import-outside-toplevel
  some = {"mean": -0.4, "lo": math.nan, "hi": math.nan, "bound": -1, "n": 3,
          "censored_seeds": 1, "per_seed": [-0.5, -0.3, -0.4], "per_seed_bound": [0, 0, -1]}
  line = verdicts._saving_line("split-then-merge", some, "joint_grpo",
                              flops={"mean": 2e12, "bound": 1})
  assert line.startswith("split-then-merge had not reached the level on 1 of 3 seeds when it "
                         "stopped (≥ 2e+12 FLOPs): it needs ≥ 40.0% more FLOPs than "
                         "joint_grpo"), line
  assert line.endswith("; 0 of 3 seeds cheaper, 3 dearer"), line
  ref = dict(some, mean=0.3, bound=1, per_seed=[0.2, 0.4, 0.3], per_seed_bound=[0, 0, 1])
  line = verdicts._saving_line("self-teacher OPD", ref, "GRPO")
  # Whose saving it is stays named when the reference is the censored one.
  assert line.startswith("self-teacher OPD vs GRPO: GRPO had not reached the level on 1 of 3 "
                         "seeds when it stopped: saving ≥ 30.0%"), line
  every = dict(some, censored_seeds=3, per_seed_bound=[-1, -1, -1])
  assert "had not reached the level when it stopped" in verdicts._saving_line(
      "split-then-merge", every, "joint_grpo")
  # A seed without a saving (neither arm reached the level there) is one where it had not.
  nan = dict(ref, per_seed=[0.2, math.nan, 0.3])
  assert "GRPO had not reached the level on 2 of 3 seeds when" in verdicts._saving_line(
      "self-teacher OPD", nan, "GRPO")


def test_nan_and_infinite_seeds_are_counted():
  # Two seeds; the figure is nan in seed 1's replicates that drew prompt 0 twice or more.
  def per_seed(s, idx):
    sel = idx.get("math")
    if s == 0:
      return {"x": 1.0, "y": math.inf}
    return {"x": math.nan if sel is not None and np.sum(sel == 0) >= 2 else 2.0, "y": 1.0}
  reps = [([0, 1], {0: {"math": np.array([1, 2])}, 1: {"math": np.array(i)}})
          for i in ([0, 0], [0, 1], [1, 1], [0, 0])]
  out = stats.summarise(per_seed, stats.identity({0: {"math": 2}, 1: {"math": 2}}), reps, 0.9)
  x, y = out["x"], out["y"]
  assert x["mean"] == 1.5 and x["undefined"] == 2 and (x["boot_lo"], x["boot_hi"]) == (1.5, 1.5)
  half = scipy.stats.t.ppf(0.95, 1) * np.std([1.0, 2.0], ddof=1) / math.sqrt(2)
  assert (x["lo"], x["hi"]) == pytest.approx((1.5 - half, 1.5 + half))
  assert y["mean"] == math.inf and y["missing"] == 1 and y["std"] == 0.0  # over finite seeds
  assert math.isnan(y["lo"]) and math.isnan(y["hi"])   # no t interval over an infinite seed
  # each seed's own value (all its prompts), in seed order; strict JSON keeps inf as a string
  assert x["per_seed"] == [1.0, 2.0] and y["per_seed"] == [math.inf, 1.0]
  assert stats.jsonable(y)["per_seed"] == ["inf", 1.0]


def test_summarised_figures_come_in_one_order_in_every_process():
  """The summary's figures are in sorted order, not a set's (whose order changes with each
  process's string hashing), so that a report's JSON is the same file in every run."""
  names = [f"arm{i % 7}|figure/{i}" for i in range(40)]
  rng = np.random.default_rng(0)
  shuffled = list(rng.permutation(names))
  per_seed = lambda s, idx: {n: float(s + i) for i, n in enumerate(shuffled)}  # noqa: E731
  prompts = {0: {"math": 4}, 1: {"math": 4}}
  out = stats.summarise(per_seed, stats.identity(prompts), stats.draws(prompts, 5, rng), 0.95)
  assert list(out) == sorted(names)


def test_stacked_curves_give_the_same_figures_as_point_by_point():
  """stats.with_arrays (what build_report hands every replicate) gives bit-identical figures:
  a domain whose points all have the same prompts goes in one numpy call, one whose prompt count
  changes between points (or has none) point by point, as stored."""
  rng = np.random.default_rng(3)
  curve = [_point(f, {"math": rng.integers(0, 5, 40), "code": rng.integers(0, 5, 30)}, 4)
           for f in (0, 10, 20)]
  curve[1]["correct"]["code"] = curve[1]["correct"]["code"][:20]   # ragged: not stacked
  curve[2]["accuracy"]["strings"] = 0.5                              # no per-prompt counts
  fast = stats.with_arrays(curve)
  assert set(fast.stacked) == {("correct", "math")}
  assert curve[0]["correct"]["math"] == [int(x) for x in fast[0]["correct"]["math"]]  # a copy
  for _ in range(20):
    idx = {"math": rng.integers(0, 40, 40), "code": rng.integers(0, 20, 20), "strings": None}
    assert stats.curve_values(fast, idx) == stats.curve_values(curve, idx)
  assert stats.curve_values(fast, {"math": None}) == stats.curve_values(curve, {"math": None})
