"""The report's arithmetic against hand-computed values (the frontier and censoring included), its
verdicts, its files, and the stop rules (on a scripted run_rl, running on past its stop)."""

import dataclasses
import functools
import itertools
import json
import math
import os
import re
import types

import numpy as np
import pytest

from smjax.study.render import curve_series, format_table, markdown, update_docs, write_report
from smjax.study.report import ArmResult, build_report, seed_figures
from smjax.study.rules import (Plateau, all_rules, bar_rule, capture_rule, captured, matched_target,
                               stop_accuracy, target_rule)
from smjax.study.verdicts import verdicts

N, K = 5, 10  # held-out prompts per domain, samples per prompt


def _point(flops, acc, length=None):
  """A curve point with per-prompt counts; every prompt has the same count (round(K x acc)), so
  every bootstrap replicate equals the point estimate: the intervals are exact."""
  length = length or {d: 3.0 if d == "math" else 5.0 for d in acc}
  return {"step": 0, "flops": float(flops), "mean": float(np.mean(list(acc.values()))),
          "accuracy": dict(acc), "correct": {d: [round(K * a)] * N for d, a in acc.items()},
          "greedy": {d: float(a >= 0.5) for d, a in acc.items()},
          "greedy_correct": {d: [int(a >= 0.5)] * N for d, a in acc.items()},
          "length": dict(length), "lengths": {d: [length[d]] * N for d in acc}, "samples": K}


def _curve(points):
  return [_point(f, {"math": a, "code": b}) for f, a, b in points]


def _arms(seed=0, joint_scale=1.0):
  joint = ArmResult("joint_grpo", seed, _curve([(0, .2, .2), (100 * joint_scale, .4, .4),
                                                (200 * joint_scale, .6, .6)]),
                    {"rollout/decode": 120.0 * joint_scale, "train/policy": 80.0 * joint_scale})
  split = ArmResult("split_merge", seed, _curve([(150, .2, .2), (170, .5, .5), (190, .7, .5)]),
                    {"rollout/decode": 100.0, "train/policy": 60.0, "train/teacher": 30.0},
                    expert_flops=150.0, distill_flops=40.0)
  never = ArmResult("external_opd", seed, _curve([(0, .2, .2), (50, .3, .3)]),
                    {"train/teacher": 50.0}, distill_flops=50.0)
  return [joint, split, never]


def _exact(v, value):
  """A summary whose mean and interval are all `value`."""
  return v["mean"] == pytest.approx(value) and (v["lo"], v["hi"]) == pytest.approx((value, value))


def test_report_numbers_match_hand_computation():
  rep = build_report(_arms(), target_fraction=0.9, bootstrap=50)
  assert rep["bootstrap"] == 50 and rep["seeds"] == [0]
  assert _exact(rep["target_accuracy"], 0.54)  # 0.9 x joint's final mean 0.6 (no base arm)
  j, s, e = (rep["arms"][k] for k in ("joint_grpo", "split_merge", "external_opd"))
  # joint: 0.4 at 100, 0.6 at 200 -> 0.54 at 170; split: mean 0.5 at 170, 0.6 at 190 -> 178.
  assert _exact(j["flops_to_target"], 170.0) and _exact(s["flops_to_target"], 178.0)
  assert _exact(s["saving_at_target"], 1 - 178 / 170)
  assert s["flops_total"]["mean"] == 190.0 and j["flops_total"]["mean"] == 200.0
  assert s["flops"]["train/teacher"]["mean"] == 30.0
  assert "saving_total" not in s   # no figure against a configured budget
  assert _exact(s["distillation_share_run"], 40 / 150)
  assert _exact(s["accuracy_vs_reference"], 0.6 - 0.6)
  # The external arm stopped at 50 FLOPs below the target: censored there, "at least 50".
  assert e["flops_to_target"]["mean"] == 50.0 and e["flops_to_target"]["bound"] == 1
  assert e["saving_at_target"]["bound"] == -1   # so its saving is at most 1 - 50 / 170
  assert s["accuracy"]["math"]["mean"] == pytest.approx(0.7)
  assert s["accuracy_mean"]["mean"] == pytest.approx(0.6)
  assert s["greedy"]["math"]["mean"] == 1.0 and s["greedy"]["code"]["mean"] == 1.0
  assert s["response_length"]["mean"] == 4.0
  assert "saving_at_target" not in j  # the reference itself
  json.dumps(rep, allow_nan=False)
  table = format_table(rep)
  assert "split_merge" in table and "54.0%" in table and "≥ 50" in table
  assert ("(c) to 90% of joint_grpo's gain: external-teacher OPD had not reached the level when "
          "it stopped (≥ 50 FLOPs): saving ≤ 70.6%") in rep["verdicts"]
  assert not any(v.startswith("(a)") for v in rep["verdicts"])   # no base: no frontier
  assert rep["verdicts"][-1].startswith("Intervals: 95% intervals over held-out prompts: "
                                        "evaluation noise only")


def test_seeds_give_mean_and_spread():
  arms = _arms(0) + _arms(1, joint_scale=2.0)
  rep = build_report(arms, target_fraction=0.9, bootstrap=200)
  j = rep["arms"]["joint_grpo"]
  assert j["flops_total"]["mean"] == 300.0 and j["flops_total"]["n"] == 2
  assert j["flops_total"]["std"] == pytest.approx(141.42, rel=1e-3)  # sample std of 200, 400
  assert j["flops_to_target"]["mean"] == pytest.approx((170 + 340) / 2)
  # Student's t over the two seeds (12.706 x 120.2 / sqrt 2 either side), wider than their
  # range; the two-level bootstrap beside it stays within the range.
  f = j["flops_to_target"]
  assert f["interval"] == "seeds"
  assert (f["lo"], f["hi"]) == pytest.approx((255 - 1080.0, 255 + 1080.0), rel=1e-3)
  assert 170 - 1e-9 <= f["boot_lo"] < f["boot_hi"] <= 340 + 1e-9


def test_target_is_per_seed_base_plus_fraction_of_reference_gain():
  arms = [ArmResult("base", 0, _curve([(0, .2, .2)]), {}),
          ArmResult("base", 1, _curve([(0, .5, .5)]), {}),
          ArmResult("joint_grpo", 0, _curve([(0, .2, .2), (100, .4, .4), (200, .6, .6)]),
                    {"train/policy": 200.0}),
          ArmResult("joint_grpo", 1, _curve([(0, .5, .5), (100, .7, .7)]), {"train/policy": 100.0})]
  rep = build_report(arms, target_fraction=0.9, bootstrap=0)
  # seed 0: 0.2 + 0.9 x (0.6 - 0.2) = 0.56, reached at 100 + 100 x 0.16 / 0.2 = 180;
  # seed 1: 0.5 + 0.9 x (0.7 - 0.5) = 0.68, reached at 100 x 0.18 / 0.2 = 90.
  for seed, tgt, flops in ((0, 0.56, 180.0), (1, 0.68, 90.0)):
    f = seed_figures({a.arm: a for a in arms if a.seed == seed}, {}, target_fraction=0.9,
                     reference_arm="joint_grpo", recover_domain=None)
    assert f["_study|target"] == pytest.approx(tgt)
    assert f["joint_grpo|flops_to_target"] == pytest.approx(flops)
  assert rep["target_accuracy"]["mean"] == pytest.approx(0.62)
  assert rep["arms"]["joint_grpo"]["flops_to_target"]["mean"] == pytest.approx(135.0)
  assert rep["arms"]["joint_grpo"]["flops_to_target"]["missing"] == 0
  # Without a bootstrap, two seeds still give Student's t over their values (.56, .68).
  assert rep["bootstrap"] == 0 and rep["target_accuracy"]["boot_lo"] is None
  half = 12.7062 * np.std([.56, .68], ddof=1) / np.sqrt(2)
  assert rep["target_accuracy"]["lo"] == pytest.approx(0.62 - half, rel=1e-4)


def test_missing_reference_is_an_error():
  with pytest.raises(ValueError, match="no 'joint_grpo' arm"):
    build_report(_arms()[1:])


def test_base_only_study_reports_without_a_target(tmp_path):
  # A hand-made curve (no per-prompt counts): point estimates, no interval.
  base = ArmResult("base", 0, [{"flops": 0.0, "accuracy": {"math": .3, "code": .1}, "mean": .2,
                                "length": {"math": 3.0, "code": 5.0}}], {})
  rep = build_report([base], reference_arm=None)
  assert rep["target_accuracy"] is None and rep["bootstrap"] == 0
  assert rep["arms"]["base"]["accuracy_mean"]["mean"] == pytest.approx(0.2)
  assert rep["arms"]["base"]["accuracy_mean"]["lo"] is None
  assert "(target -;" in format_table(rep)
  paths = write_report(rep, [base], str(tmp_path))
  assert open(paths["plot"], "rb").read(4) == b"\x89PNG"


def test_files_are_written(tmp_path):
  arms = _arms()
  rep = build_report(arms, bootstrap=20)
  paths = write_report(rep, arms, str(tmp_path))
  strict = lambda c: (_ for _ in ()).throw(ValueError(c))  # noqa: E731  no NaN/Infinity
  assert json.load(open(paths["json"]), parse_constant=strict)["arms"]["split_merge"][
      "flops_total"]["mean"] == 190.0
  rows = open(paths["csv"]).read().splitlines()
  assert rows[0] == "arm,metric,mean,lo,hi,std,n"
  assert any(r.startswith("split_merge,flops_to_target,178") for r in rows)
  assert any(r.startswith("external_opd,flops_to_target,50.0,,,") for r in rows)  # censored
  assert "split_merge,flops/train/teacher,30.0,30.0,30.0,0.0,1" in rows
  assert open(paths["table"]).read() == format_table(rep) + "\n"
  curves = json.load(open(paths["curves"]))
  assert [c["arm"] for c in curves] == ["joint_grpo", "split_merge", "external_opd"]
  assert os.path.getsize(paths["plot"]) > 10_000 and open(paths["plot"], "rb").read(4) == b"\x89PNG"
  assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


# ------------------------------------------------------------------ distillation to a target

START = {"math": .2, "code": .4}
TEACHER = {"math": .6, "code": .6}   # gain .4 + .2 = .6; 90 % of it: .54
SCRIPT = [  # (accuracy, captured fraction by hand)
    ({"math": .2, "code": .4}, 0.0),
    ({"math": .5, "code": .4}, .3 / .6),
    ({"math": .9, "code": .2}, (.7 - .2) / .6),   # past its teacher on math, still short overall
    ({"math": .6, "code": .55}, (.4 + .15) / .6),  # 0.9167: the first point at >= 90 %
    ({"math": .7, "code": .6}, (.5 + .2) / .6),
]


def test_captured_and_the_capture_rule():
  rule = capture_rule(START, TEACHER, 0.9)
  for acc, frac in SCRIPT:
    assert captured(acc, START, TEACHER) == pytest.approx(frac)
  assert [rule({"accuracy": acc}) for acc, _ in SCRIPT] == [False, False, False, True, True]
  # Exactly 90 %, up to rounding: (.32 + .22) / .6.
  assert rule({"accuracy": {"math": .52, "code": .62}}) is True
  assert capture_rule(START, dict(START), 0.9) is None          # no gain to capture
  assert capture_rule(START, {"math": .1, "code": .4}, 0.9) is None
  assert captured(SCRIPT[1][0], START, dict(START)) is None


def test_stop_rules_read_the_stop_set_only():
  """An expert's bar, a target and a capture are marks on the stop set's accuracy; a point
  without a stop set (stop_size=0) is read on its report accuracy."""
  base, joint = {"math": .2, "code": .4}, {"math": .8, "code": .9}
  rule = bar_rule("math", base, joint, 1.0)       # math: 0.8 (its own domain only)
  on_stop = lambda acc: {"accuracy": {"math": 0.0, "code": 0.0}, "stop": {"accuracy": acc}}  # noqa
  assert [rule(on_stop({"math": a, "code": 0.0})) for a in (.5, .79, .8, .95)] == [
      False, False, True, True]
  # The report accuracy says 1.0; the stop set says 0.5: not crossed.
  assert not rule({"accuracy": {"math": 1.0}, "stop": {"accuracy": {"math": .5}}})
  assert rule({"accuracy": {"math": .8, "code": 0.0}})   # no stop set: the report accuracy
  half = bar_rule("code", base, joint, 0.5)       # code: 0.4 + 0.5 x 0.5 = 0.65
  assert not half(on_stop({"math": 1.0, "code": .64})) and half(on_stop({"code": .65}))
  assert bar_rule("math", base, {"math": .1, "code": .9}, 1.0) is None   # no gain there
  # base 0.3 + 0.9 x (joint 0.85 - 0.3) = 0.795
  assert matched_target(base, joint, 0.9) == pytest.approx(0.795)
  at = target_rule(base, joint, 0.9)
  assert not at(on_stop({"math": .7, "code": .88})) and at(on_stop({"math": .7, "code": .89}))
  both = all_rules(capture_rule(START, TEACHER, 0.9), lambda p: p["accuracy"]["math"] >= .65)
  assert [both({"accuracy": acc}) for acc, _ in SCRIPT] == [False, False, False, False, True]
  assert target_rule(base, {"math": .3, "code": .3}, 0.9) is None     # no gain: no mark
  assert all_rules(None, None) is None and all_rules(None, at) is not None
  assert stop_accuracy(on_stop({"math": .1})) == {"math": .1}


# ------------------------------------------------------------------------------ the frontier

def _frontier_arms(seed=0, split_cut=None):
  """One seed: base at .2/.2, joint GRPO reaching .6/.6 (a gain of .4 on each domain), and two
  split-then-merge sets: MOPD from early experts (cheap, 60 FLOPs, but their student stops
  lower) and from late ones (160 FLOPs, the student goes higher)."""
  base = ArmResult("base", seed, _curve([(0, .2, .2)]), {})
  joint = ArmResult("joint_grpo", seed, _curve([(0, .2, .2), (100, .4, .4), (200, .6, .6)]),
                    {"train/policy": 200.0})
  early = ArmResult("split_merge@0.9", seed, _curve([(60, .2, .2), (80, .4, .5), (100, .5, .5)]),
                    {"train/policy": 100.0}, expert_flops=60.0, distill_flops=40.0)
  late = ArmResult("split_merge", seed,
                   _curve([(160, .2, .2), (170, .5, .5), (180, .6, .7), (190, .7, .7)]
                          [:split_cut]), {"train/policy": 190.0}, expert_flops=160.0,
                   distill_flops=30.0)
  return [base, joint, early, late]


def test_the_best_checkpoint_is_chosen_on_the_stop_set_and_read_on_the_report_set():
  """best_accuracy / best_flops: the point with the best stop-set mean, at its report accuracy;
  a verdict line sets the arms' best checkpoints side by side."""
  curve = _curve([(10, .3, .3), (20, .5, .5), (30, .9, .9)])
  for p, stop in zip(curve, (.5, .9, .7)):   # the stop set prefers the second point
    p["stop"] = {"accuracy": {"math": stop, "code": stop}}
  arms = {a.arm: a for a in _frontier_arms()[:2]}
  arms["external_opd"] = ArmResult("external_opd", 0, curve, {"train/policy": 30.0})
  f = seed_figures(arms, {}, target_fraction=0.9, reference_arm="joint_grpo",
                   recover_domain=None, levels=(0.9,))
  assert f["external_opd|best_accuracy"] == pytest.approx(.5)
  assert f["external_opd|best_flops"] == 20.0
  assert f["external_opd|accuracy_mean"] == pytest.approx(.9)     # the final point
  # joint GRPO has no stop set on its points: its report accuracy chooses (the last, .6).
  assert f["joint_grpo|best_accuracy"] == pytest.approx(.6)
  assert "base|best_accuracy" not in f                            # not trained, no choice
  rep = build_report(list(arms.values()), bootstrap=0, levels=(0.9,))
  assert ("(c) best checkpoint (chosen on the stop set, measured on the report set): "
          "joint_grpo 60.0%; external_opd 50.0%") in rep["verdicts"]


def test_frontier_is_each_routes_cheapest_first_passage():
  f = seed_figures({a.arm: a for a in _frontier_arms()}, {}, target_fraction=0.9,
                   reference_arm="joint_grpo", recover_domain=None, levels=(0.5, 0.9))
  # 50 %: the mean level .4; joint crosses it at 100. Early set: mean .45 at 80 (from .2 at 60):
  # 60 + 20 x .2 / .25 = 76; late set: .35 at 170 -> 160 + 10 x .2 / .3 = 166.7. Cheapest: 76.
  assert f["_frontier|mean/0.5/joint"] == pytest.approx(100.0)
  assert f["_frontier|mean/0.5/split"] == pytest.approx(76.0)
  assert f["_frontier|mean/0.5/saving"] == pytest.approx(1 - 76 / 100)
  assert f["_frontier|mean/0.5/distillation_share"] == pytest.approx(16 / 60)
  assert f["_frontier|mean/0.5/set"] == 0.0                       # the early set
  assert f["_frontier|mean/0.5/split_bracket"] == pytest.approx(20 / 76)
  # 90 %: the mean level .56; joint at 100 + 100 x .16 / .2 = 180. The early set never gets
  # there (censored at 100, "at least"); the late one crosses between 170 (.5) and 180 (.65):
  # 170 + 10 x .06 / .15 = 174, which is below nothing the early set could still show: 100 < 174,
  # so the cheapest is only known to be at least 100.
  assert f["_frontier|mean/0.9/joint"] == pytest.approx(180.0)
  split = f["_frontier|mean/0.9/split"]
  assert split.value == pytest.approx(100.0) and split.side == 1
  assert math.isnan(f["_frontier|mean/0.9/grid_step"])    # a censored figure has no grid step
  # "every domain at its level" (.56 on each): math reaches .56 at 174 on the late set too.
  assert f["_frontier|every/0.9/joint"] == pytest.approx(180.0)
  # The early set's distillation met its stop rule (its curve went flat) below .56: it does not
  # get there, so it is no candidate, and the late set's 174 is exact. Cut at its cap while still
  # rising (reached False, as above) it stayed a censored candidate.
  flat = {a.arm: (dataclasses.replace(a, reached=True) if a.arm == "split_merge@0.9" else a)
          for a in _frontier_arms()}
  h = seed_figures(flat, {}, target_fraction=0.9, reference_arm="joint_grpo",
                   recover_domain=None, levels=(0.5, 0.9))
  assert h["_frontier|mean/0.9/split"] == pytest.approx(174.0)
  assert h["_frontier|mean/0.9/set"] == 1.0
  assert h["_frontier|mean/0.5/split"] == pytest.approx(76.0)    # where it got there, it counts
  # The bar grid's step under the chosen late set: its experts cost 160, the early set's 60, so an
  # expert stop between the bars pays at least 60: the figure could fall by (160 - 60) / 174, to
  # 74, a saving of at most 1 - 74 / 180. The early set, cheapest at 50 %, has no step below it.
  assert h["_frontier|mean/0.9/grid_step"] == pytest.approx(100 / 174)
  assert h["_frontier|mean/0.9/saving_finer_bars"] == pytest.approx(1 - 74 / 180)
  assert h["_frontier|mean/0.5/grid_step"] == 0.0
  assert h["_frontier|mean/0.5/saving_finer_bars"] == pytest.approx(1 - 76 / 100)
  rep = build_report(list(flat.values()), bootstrap=0, levels=(0.5, 0.9))
  (line,) = [v for v in rep["verdicts"] if v.startswith("(a) at 90% of joint_grpo's gain (mean")]
  assert line.endswith("cheapest expert stop: final; expert stops between the bars: at most "
                       "+58.9%)"), line
  # Without the early set the late one's 174 is exact: a saving of 1 - 174 / 180.
  late_only = {a.arm: a for a in _frontier_arms() if a.arm != "split_merge@0.9"}
  g = seed_figures(late_only, {}, target_fraction=0.9, reference_arm="joint_grpo",
                   recover_domain=None, levels=(0.9,))
  assert g["_frontier|mean/0.9/split"] == pytest.approx(174.0)
  assert g["_frontier|mean/0.9/saving"] == pytest.approx(1 - 174 / 180)
  assert g["_frontier|mean/0.9/distillation_share"] == pytest.approx(14 / 160)
  assert g["_frontier|mean/0.9/joint_bracket"] == pytest.approx(100 / 180)
  # every domain: math .56 at 170 + 10 x .06 / .1 = 176 (math .5 -> .6), code .56 at 170 + 10 x
  # .06 / .2 = 173: both at 176.
  assert g["_frontier|every/0.9/split"] == pytest.approx(176.0)


def test_frontier_levels_of_the_better_routes_gain():
  """The "_best" modes read the levels as shares of the better route's gain: on the mean, the
  higher final mean of the two routes; per domain, the higher final on that domain. A route that
  ends above joint GRPO reaches levels joint GRPO never does; joint GRPO is censored there."""
  # Late set ends at .7/.7 above joint's .6/.6: mean top .7, a gain of .5; 90 % -> .65. Joint
  # never gets there (censored at 200); the late set crosses between 170 (.5) and 180 (.65): 180.
  flat = {a.arm: (dataclasses.replace(a, reached=True) if a.arm == "split_merge@0.9" else a)
          for a in _frontier_arms()}
  f = seed_figures(flat, {}, target_fraction=0.9, reference_arm="joint_grpo",
                   recover_domain=None, levels=(0.9,))
  joint = f["_frontier|mean_best/0.9/joint"]
  assert joint.value == 200.0 and joint.side == 1
  assert f["_frontier|mean_best/0.9/split"] == pytest.approx(180.0)
  saving = f["_frontier|mean_best/0.9/saving"]      # at least 1 - 180 / 200
  assert saving.value == pytest.approx(0.1) and saving.side == 1
  # Every domain at .65: code is there at 180 (.7), math between 180 (.6) and 190 (.7): 185.
  assert f["_frontier|every_best/0.9/split"] == pytest.approx(185.0)
  # Joint's own levels are unchanged beside them (.56 at 180 against 174).
  assert f["_frontier|mean/0.9/split"] == pytest.approx(174.0)
  # Per domain: joint ends at math .6 / code .4, the one split set at math .4 / code .6, from .2
  # each. Every domain at 50 % of the better route's gain (.4 on both): joint at 100 (code .4),
  # the set at 150 (math .4): 1 - 150 / 100 = -50 %. On joint's own levels (math .4, code .3)
  # joint's shortfall min_d(v_d - level_d) goes from -.2 at 0 to +.1 at 100: zero at 66.7, and
  # the saving reads -125 %, the route held to the bar only joint GRPO set.
  base = ArmResult("base", 0, _curve([(0, .2, .2)]), {})
  joint_arm = ArmResult("joint_grpo", 0, _curve([(0, .2, .2), (100, .6, .4)]),
                        {"train/policy": 100.0})
  split = ArmResult("split_merge", 0, _curve([(50, .2, .2), (150, .4, .6)]),
                    {"train/policy": 150.0}, expert_flops=50.0, distill_flops=100.0)
  arms = {a.arm: a for a in (base, joint_arm, split)}
  g = seed_figures(arms, {}, target_fraction=0.5, reference_arm="joint_grpo",
                   recover_domain=None, levels=(0.5, 1.0))
  assert g["_frontier|every_best/0.5/joint"] == pytest.approx(100.0)
  assert g["_frontier|every_best/0.5/split"] == pytest.approx(150.0)
  assert g["_frontier|every_best/0.5/saving"] == pytest.approx(-0.5)
  assert g["_frontier|every/0.5/joint"] == pytest.approx(200 / 3)
  assert g["_frontier|every/0.5/split"] == pytest.approx(150.0)
  assert g["_frontier|every/0.5/saving"] == pytest.approx(1 - 150 / (200 / 3))
  # At 100 % of the better route's gain on every domain neither route gets there: both censored
  # at their last FLOPs, the saving undefined.
  assert g["_frontier|every_best/1/joint"].side == 1 and g["_frontier|every_best/1/split"].side
  assert math.isnan(g["_frontier|every_best/1/saving"])
  # The means tie (.5 each): the better route's mean is joint's own, the readings agree.
  assert g["_frontier|mean_best/0.5/joint"] == g["_frontier|mean/0.5/joint"]
  rep = build_report(list(flat.values()), bootstrap=0, levels=(0.9,))
  assert "mean_best" in rep["frontier"] and "every_best" in rep["frontier"]
  # joint GRPO censored: the saving is a lower bound, said as one (not "not distinguishable").
  assert ("(a) at 90% of the better route's gain (mean over domains): split-then-merge vs "
          "joint_grpo: joint_grpo had not reached the level when it stopped: saving ≥ 10.0% (180 "
          "against ≥ 200") in "\n".join(
              rep["verdicts"])


def test_a_better_route_row_that_repeats_the_references_is_left_out():
  """Where the better route is the reference on every domain, the frontier's row on the better
  route's levels is the reference's row figure for figure: the table shows it once and says so;
  a row that differs stays."""
  base = ArmResult("base", 0, _curve([(0, .2, .2)]), {})
  joint = ArmResult("joint_grpo", 0, _curve([(0, .2, .2), (100, .6, .4)]), {"train/policy": 100.0})
  split = ArmResult("split_merge", 0, _curve([(50, .2, .2), (150, .4, .6)]),
                    {"train/policy": 150.0}, expert_flops=50.0, distill_flops=100.0)
  rep = build_report([base, joint, split], bootstrap=0, levels=(0.5,), target_fraction=0.5)
  front = rep["frontier"]
  # The means tie (.5 each): the mean's two readings are one; per domain they differ.
  assert front["mean_best"]["0.5"] == front["mean"]["0.5"]
  assert front["every_best"]["0.5"] != front["every"]["0.5"]
  table = format_table(rep)
  rows = [ln for ln in table.splitlines() if ln.startswith("50%")]
  assert len(rows) == 3, table   # mean, every domain, every domain on the better route's levels
  assert not any("mean, better route's" in r for r in rows), table
  assert sum("every domain, better route's" in r for r in rows) == 1, table
  assert ("a level where that is the reference on every domain of every seed has no row of its "
          "own") in table
  # With both rows different, nothing is left out and the title does not say so.
  front["mean_best"]["0.5"] = dict(front["mean_best"]["0.5"], split={"mean": 151.0})
  table = format_table(rep)
  assert sum("mean, better route's" in ln for ln in table.splitlines()) == 1
  assert "has no row of its own" not in table


def test_frontier_report_censors_a_truncated_curve_and_names_the_set():
  # The late set cut after its crossing point at 170 (mean .5): at 90 % it never got there.
  arms = [a for a in _frontier_arms(split_cut=2) if a.arm != "split_merge@0.9"]
  rep = build_report(arms, bootstrap=20, levels=(0.5, 0.9))
  at = rep["frontier"]["mean"]["0.9"]
  assert at["split"]["mean"] == 170.0 and at["split"]["bound"] == 1
  assert at["saving"]["bound"] == -1 and at["sets"] == ["split_merge"]
  (line,) = [v for v in rep["verdicts"] if v.startswith("(a) at 90% of joint_grpo's gain (mean")]
  assert "had not reached the level when it stopped (≥ 170 FLOPs)" in line
  assert "saving ≤ 5.6%" in line
  full = build_report(_frontier_arms(), bootstrap=20, levels=(0.5, 0.9))
  fifty = full["frontier"]["mean"]["0.5"]
  assert _exact(fifty["split"], 76.0) and fifty["sets"] == ["split_merge@0.9"]
  assert any(v.startswith("(a) at 50%") for v in full["verdicts"]) is False  # 90 % is read
  table = format_table(full)
  assert table.startswith("Frontier: training FLOPs to each level") and "76" in table
  with pytest.raises(ValueError, match="target_fraction=0.9 must be one of"):
    build_report(arms, levels=(0.5, 0.75))


def test_one_seed_without_a_bootstrap_words_its_verdicts_without_intervals():
  """`smjax report --bootstrap=0` on one seed: no line judges a difference against an interval
  it does not have ("not distinguishable"), nor claims a confidence level."""
  arms = [a for a in _frontier_arms() if a.arm != "split_merge@0.9"]
  rep = build_report(arms, bootstrap=0, levels=(0.5, 0.9))
  (line,) = [v for v in rep["verdicts"] if v.startswith("(a) at 90% of joint_grpo's gain (mean")]
  assert "split-then-merge needs 3.3% fewer FLOPs than joint_grpo (174 against 180" in line, line
  assert not any("distinguishable" in v or "95%" in v or "[" in v for v in rep["verdicts"])
  assert rep["verdicts"][-1].startswith("Intervals: none: one seed and no bootstrap replicates")
  table = format_table(rep)
  assert "seed [0]: point estimates, no intervals (no bootstrap)" in table and "95%" not in table
  with_ci = build_report(arms, bootstrap=20, levels=(0.5, 0.9))
  assert "95%" in format_table(with_ci) and with_ci["verdicts"][-1].startswith("Intervals: 95%")


def test_terminal_table_fits_120_columns():
  """The command line prints the table at TERMINAL_WIDTH: FLOPs without their intervals, then the
  least-read columns left out, saying so; report.txt and the docs' markdown keep every column."""
  from smjax.study.render import TERMINAL_WIDTH, markdown  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  reports = [build_report(_frontier_arms() + _frontier_arms(1), bootstrap=20)]
  for name in ("demo_report.json", "demo_seeds_report.json",
               "archive/stop_rule/study_two_full_report.json"):
    with open(os.path.join(root, "docs", name)) as f:
      reports.append(json.load(f))
  for rep in reports:
    full, short = format_table(rep), format_table(rep, width=TERMINAL_WIDTH)
    assert max(len(ln) for ln in short.splitlines()) <= TERMINAL_WIDTH < max(
        len(ln) for ln in full.splitlines())
    assert "report.txt has every column in full" in " ".join(short.split())
    assert short.count("\n\n") == full.count("\n\n")   # the same tables, one verdict each
    for arm in rep["arms"]:
      assert f"\n{arm} " in short
  assert "bracket joint / split" in markdown(reports[1]) and "| resp len |" in markdown(reports[1])


def test_verdicts_count_the_seeds_that_agree():
  # Seed 0: joint reaches 90 % at 180 and the late set at 174 (cheaper); seed 1: joint's curve
  # twice as fast (90 at 90): split dearer. Two seeds, one each way: not distinguishable.
  fast = _frontier_arms(1)
  fast[1] = ArmResult("joint_grpo", 1, _curve([(0, .2, .2), (50, .4, .4), (100, .6, .6)]),
                      {"train/policy": 100.0})
  arms = [a for a in _frontier_arms(0) + fast if a.arm != "split_merge@0.9"]
  rep = build_report(arms, bootstrap=0, levels=(0.9,))
  (line,) = [v for v in rep["verdicts"] if v.startswith("(a) at 90% of joint_grpo's gain (mean")]
  assert "not distinguishable" in line and "1 of 2 seeds cheaper, 1 dearer" in line
  assert rep["verdicts"][-1] == ("Intervals: 95% t intervals over 2 seeds (training and "
                                 "evaluation noise).")
  # Both seeds dearer: a verdict, with its agreement.
  slow = [dataclasses.replace(a, seed=1) for a in fast if a.arm != "split_merge@0.9"]
  both = build_report([a for a in fast if a.arm != "split_merge@0.9"] + [
      dataclasses.replace(a, seed=2) for a in slow], bootstrap=0, levels=(0.9,))
  (line,) = [v for v in both["verdicts"] if v.startswith("(a) at 90% of joint_grpo's gain (mean")]
  assert "split-then-merge needs" in line and "more FLOPs" in line and "2 of 2 seeds agree" in line


def test_headroom_and_the_distillation_run_share():
  base = ArmResult("base", 0, _curve([(0, .2, .2)]), {})
  em = ArmResult("expert_math", 0, _curve([(0, .2, .2), (75, .6, .1)]), {"train/policy": 75.0})
  ec = ArmResult("expert_code", 0, _curve([(0, .2, .2), (75, .1, .6)]), {"train/policy": 75.0})
  joint = ArmResult("joint_grpo", 0, _curve([(0, .2, .2), (300, .6, .6)]), {"train/policy": 300.0})
  split = ArmResult("split_merge", 0, _curve([(150, .2, .2), (170, .4, .3), (190, .6, .5),
                                              (210, .7, .5)]),
                    {"train/policy": 150.0, "train/teacher": 60.0}, expert_flops=150.0,
                    distill_flops=60.0, teachers={"math": "expert_math", "code": "expert_code"},
                    capture_fraction=0.9, reached=True)
  f = seed_figures({a.arm: a for a in (base, em, ec, joint, split)}, {}, target_fraction=0.9,
                   reference_arm="joint_grpo", recover_domain=None, levels=(0.9,))
  assert f["split_merge|distillation_share_run"] == pytest.approx(60.0 / 150)
  # Headroom: (student - start) / (teacher - start) per domain, and the summed one.
  assert f["split_merge|headroom/math"] == pytest.approx((.7 - .2) / (.6 - .2))
  assert f["split_merge|headroom/code"] == pytest.approx((.5 - .2) / (.6 - .2))
  assert f["split_merge|headroom_mean"] == pytest.approx(1.0)
  # (b) at 90 %: the level .56, crossed between 190 (.55) and 210 (.6): 194; less the experts'
  # 150 over them.
  assert f["_frontier|mean/0.9/distillation_share"] == pytest.approx(44.0 / 150)
  rep = build_report([base, em, ec, joint, split], bootstrap=30, levels=(0.9,))
  assert rep["arms"]["split_merge"]["reached_stop_rule"] == [True]
  assert any(v.startswith("(b) distillation cost 29.3% [29.3, 29.3] of the experts' FLOPs")
             for v in rep["verdicts"])


def _verdict_report(lo, mean, hi, per_seed=(), bound=0):
  s = {"mean": mean, "lo": lo, "hi": hi, "n": max(1, len(per_seed)), "per_seed": list(per_seed),
       "bound": bound}
  f = {"mean": 100.0, "bound": -bound}
  return {"confidence": 0.95, "reference_arm": "joint_grpo", "target_fraction": 0.9,
          "seeds": list(range(max(1, len(per_seed)))), "arms": {},
          "frontier": {"mean": {"0.9": {"saving": s, "split": f, "joint": {"mean": 90.0},
                                        "sets": ["split_merge"]}}}}


def test_verdict_lines_follow_the_interval():
  (line, tail) = verdicts(_verdict_report(.2, .3, .4))
  assert line == ("(a) at 90% of joint_grpo's gain (mean over domains): split-then-merge needs "
                  "30.0% [20.0, 40.0] fewer FLOPs than joint_grpo (100 against 90; cheapest "
                  "expert stop: final)")
  assert "evaluation noise only; one seed cannot separate training noise" in tail
  (line, _) = verdicts(_verdict_report(-.7, -.5, -.3, per_seed=(-.6, -.4, -.5, .1, -.5)))
  assert "needs 50.0% [30.0, 70.0] more FLOPs than joint_grpo; 4 of 5 seeds agree" in line
  (line, _) = verdicts(_verdict_report(-.1, .1, .3))
  assert "not distinguishable" in line and "saving 10.0% [-10.0, 30.0]" in line
  (line, _) = verdicts(_verdict_report(0.0, .1, .3))  # touches 0: not clearly positive
  assert "not distinguishable" in line
  (line, _) = verdicts(_verdict_report(.1, .3, "inf"))  # open above: still clearly positive
  assert "fewer FLOPs" in line
  (line, _) = verdicts(_verdict_report(None, -.5, None, bound=-1))   # censored: at least
  assert ("had not reached the level when it stopped (≥ 100 FLOPs): it needs ≥ 50.0% more"
          in line)
  # An arm run on some seeds only (the every-arm runs catching up with the main ones): no
  # summary, its seeds' values, how many.
  rep = _verdict_report(None, None, None, per_seed=(-.293, None, None, None, None))
  rep["arms"]["external_opd"] = {"saving_at_target": rep["frontier"]["mean"]["0.9"]["saving"],
                                 "best_accuracy": {"mean": None, "per_seed": [.964] + [None] * 4},
                                 "length_vs_reference": {"mean": None, "per_seed": [.1]},
                                 "seeds": [0]}
  rep["arms"]["joint_grpo"] = {"best_accuracy": {"mean": .986, "lo": .977, "hi": .995,
                                                 "per_seed": [.98, .99, .99, .98, .99]},
                               "seeds": [0, 1, 2, 3, 4]}
  lines = verdicts(rep)
  assert ("(c) to 90% of joint_grpo's gain: external-teacher OPD vs joint_grpo, on 1 of 5 seeds "
          "so far: saving -29.3%") in lines, lines
  assert any(v.endswith("joint_grpo 98.6% [97.7, 99.5]; external_opd 96.4% (1 of 5 seeds so far)")
             for v in lines), lines
  assert not any("answers are" in v for v in lines), lines
  # On every seed: the summary as before.
  rep["arms"]["external_opd"]["seeds"] = [0, 1, 2, 3, 4]
  assert any("external-teacher OPD vs joint_grpo: not distinguishable" in v
             for v in verdicts(rep)), verdicts(rep)
  # A length not told from 0 counts the seeds on each side, as a saving does; a clear one counts
  # the seeds that agree with it.
  ext = rep["arms"]["external_opd"]
  ext["length_vs_reference"] = {"mean": .1, "lo": -.2, "hi": .4,
                                "per_seed": [.2, -.1, .3, 0.0, .1]}
  assert any(v.endswith("answers are +0.1 tokens [-0.2, +0.4] vs joint_grpo (not distinguishable)"
                        "; 3 of 5 seeds longer, 1 shorter, 1 at exactly 0 (per seed: +0.2, -0.1, "
                        "+0.3, +0.00, +0.1)")
             for v in verdicts(rep)), verdicts(rep)
  # Differences of hundredths of a token print in hundredths, not as "+0.0 [-0.0, +0.0]".
  ext["length_vs_reference"].update(mean=.001, lo=-.022, hi=.024,
                                    per_seed=[-.006, .011, -.002, .001, .001])
  assert any(v.endswith("answers are +0.00 tokens [-0.02, +0.02] vs joint_grpo (not "
                        "distinguishable); 3 of 5 seeds longer, 2 shorter (per seed: -0.01, "
                        "+0.01, -0.00, +0.00, +0.00)")
             for v in verdicts(rep)), verdicts(rep)
  ext["length_vs_reference"].update(mean=5.0, lo=3.0, hi=7.0, per_seed=[5, 4, 6, 7, -1])
  assert any(v.endswith("answers are +5.0 tokens [+3.0, +7.0] vs joint_grpo; 4 of 5 seeds agree"
                        " (per seed: +5.0, +4.0, +6.0, +7.0, -1.0)")
             for v in verdicts(rep)), verdicts(rep)


def test_a_run_that_fell_far_below_its_best_is_named():
  """verdicts.fell_from_best by hand: final below half the best on a seed the collapse rule did
  not stop; a recovery arm read on the recovered domain; a seed stopped by the rule left to the
  "Collapsed" line; nan and missing seeds skipped."""
  from smjax.study.verdicts import fell_from_best  # pylint: disable=import-outside-toplevel
  rep = {"seeds": [0, 1, 2], "recover_domain": "math", "arms": {
      "external_opd": {"group": "main", "best_accuracy": {"per_seed": [.9, .9, .9]},
                       "accuracy_mean": {"per_seed": [.8, .02, .45]}},
      "recover_external": {"group": "recovery", "best_accuracy": {"per_seed": [.9, .9, None]},
                           "accuracy_mean": {"per_seed": [.9, .9, .9]},
                           "accuracy_recover_domain": {"per_seed": [.3, 0.0, .1]},
                           "collapsed": [{"seed": 1, "step": 5, "what": "fell to 0"}]},
      "base": {"group": "main", "accuracy_mean": {"per_seed": [.1, .1, .1]}}}}
  (line,) = fell_from_best(rep)
  assert line.endswith("external_opd on seed 1 (best 90.0%, final 2.0%); recover_external on "
                       "seed 0 (best 90.0%, final 30.0%)"), line   # .45 is not below .45
  assert line.startswith("Fell below 50% of its best and ran on")
  assert fell_from_best(rep, below=0.01) == []


def test_length_verdict_and_held_out_sets():
  arms = _arms(joint_scale=2.0)
  ext = arms[2]
  ext.curve = [_point(p["flops"], p["accuracy"], {"math": 9.0, "code": 7.0}) for p in ext.curve]
  # external: (9 + 7) / 2 = 8 tokens against joint's (3 + 5) / 2 = 4.
  line = "(c) external-teacher OPD answers are +4.0 tokens [+4.0, +4.0] vs joint_grpo"
  assert line in build_report(arms, bootstrap=10)["verdicts"]
  # Without a bootstrap one seed has no interval: the point estimate, not a judgement on it.
  assert "(c) external-teacher OPD answers are +4.0 tokens vs joint_grpo" \
      in build_report(arms, bootstrap=0)["verdicts"]
  # The arms of a seed must share one held-out set.
  ext.curve[-1]["correct"]["math"] = [1] * (N + 1)
  with pytest.raises(ValueError, match="one held-out set"):
    build_report(arms)


def test_an_arm_run_on_to_its_cap_is_read_at_its_rules_end_too():
  """external.to_cap: external_opd ran to its cap past its rule, which would have ended it at
  its second point (50 FLOPs, 50 %, 8 tokens); at its cap it fell to 10 % with 14-token answers.
  The report reads both ends: external_opd (the cap) and external_opd@rule (the rule's end, its
  curve cut there and charged the FLOPs spent then); the verdicts say both."""
  arms = _arms(joint_scale=2.0)
  lengths = [{"math": 9.0, "code": 7.0}, {"math": 9.0, "code": 7.0}, {"math": 15.0, "code": 13.0}]
  arms[2] = ArmResult("external_opd", 0, [
      _point(f, {"math": a, "code": a}, ln) for (f, a), ln in zip(
          [(0, .2), (50, .5), (400, .1)], lengths)], {"train/teacher": 400.0}, distill_flops=400.0,
      rule_end={"index": 1, "step": 7, "flops_by_phase": {"train/teacher": 50.0}, "met": True})
  rep = build_report(arms, bootstrap=10)
  cap, rule = rep["arms"]["external_opd"], rep["arms"]["external_opd@rule"]
  assert _exact(cap["accuracy_mean"], .1) and _exact(rule["accuracy_mean"], .5)
  assert _exact(cap["flops_total"], 400.0) and _exact(rule["flops_total"], 50.0)
  assert _exact(cap["response_length"], 14.0) and _exact(rule["response_length"], 8.0)
  # The target (.2 + .9 x (.6 - .2) = .56) is never reached by either: the same first passage.
  assert rule["notes"] == ["external_opd where its stop rule ended it (step 7)"]
  v = rep["verdicts"]
  assert ("(c) external-teacher OPD answers at its cap are +10.0 tokens [+10.0, +10.0] vs "
          "joint_grpo") in v, v
  assert ("(c) external-teacher OPD answers where its stop rule ended it are +4.0 tokens "
          "[+4.0, +4.0] vs joint_grpo") in v, v
  assert ("(c) external-teacher OPD's final accuracy: 10.0% [10.0, 10.0] at its cap, 50.0% "
          "[50.0, 50.0] where its stop rule ended it") in v, v
  fell = next(x for x in v if x.startswith("Fell below"))
  assert "external_opd on seed 0 (best 50.0%, final 10.0%)" in fell and "@rule" not in fell
  # A run its rule never ended: its view is the arm itself (both arms hold every seed).
  arms[2].rule_end = {"index": 2, "step": 9, "flops_by_phase": {"train/teacher": 400.0},
                      "met": False}
  rep = build_report(arms, bootstrap=0)
  again, v = rep["arms"], rep["verdicts"]
  assert again["external_opd@rule"]["accuracy_mean"] == again["external_opd"]["accuracy_mean"]
  assert again["external_opd@rule"]["notes"] == [
      "external_opd (its rule never ended it: the run to its cap)"]
  # ...and the verdicts read it once, saying so.
  assert ("(c) external-teacher OPD answers at its cap (its stop rule ended it on no seed) are "
          "+10.0 tokens vs joint_grpo") in v, v
  assert not any("where its stop rule ended it" in x for x in v), v
  fell = next(x for x in v if x.startswith("Fell below"))
  assert "external_opd on seed 0" in fell and "@rule" not in fell
  # An arm from before to_cap (no rule_end): one arm, as before.
  arms[2].rule_end = None
  assert "external_opd@rule" not in build_report(arms, bootstrap=0)["arms"]


def test_plot_band_is_the_normal_interval_over_prompts():
  # k = 2; math per-prompt accuracies 0, 1: std 0.7071, se 0.5; code 0.5, 0.5: se 0.
  p = {"flops": 0.0, "accuracy": {"math": .5, "code": .5}, "mean": .5,
       "correct": {"math": [0, 2], "code": [1, 1]}, "samples": 2}
  (series,) = curve_series([ArmResult("joint_grpo", 0, [p], {"train/policy": 1.0})])["main"][
      "series"]
  # The mean over two domains: sqrt(0.5^2 + 0^2) / 2 = 0.25 -> 49 points.
  assert series[4] == pytest.approx([1.96 * 25.0])


# --------------------------------------------------------------------- self-teacher recovery

def _math_only(points):
  return [_point(f, {"math": a}, {"math": 4.0}) for f, a in points]


def _recovery_arms(seed=0):
  """The self-teacher arms as smjax.study.run stores them: `degrade` evaluated on both domains (its
  mean differs from its math accuracy), recover_* on the recovered domain (math) alone, stopping
  at half the gap from the degraded math accuracy (.3) back to joint_grpo's (.6): .45."""
  degrade = ArmResult("degrade", seed, [
      _point(0, {"math": .6, "code": .4}, {"math": 3.0, "code": 5.0}),
      _point(100, {"math": .3, "code": .7}, {"math": 2.0, "code": 6.0})],
      {"train/policy": 100.0}, group="recovery", note="noisy SFT")
  kw = dict(group="recovery", target=0.45, teachers={"math": "joint_grpo"}, start="degrade",
            capture_fraction=0.5, reached=True)
  return [degrade,
          ArmResult("recover_self", seed, _math_only([(0, .3), (10, .5)]),
                    {"train/teacher": 10.0}, distill_flops=10.0, **kw),
          ArmResult("recover_grpo", seed, _math_only([(0, .3), (100, .5)]),
                    {"train/policy": 100.0}, **kw)]


def test_recovery_arms_are_scored_on_the_recovered_domain(tmp_path):
  arms = _recovery_arms() + _arms()
  rep = build_report(arms, bootstrap=30)
  assert rep["recover_domain"] == "math"  # the one domain every recovery arm is scored on
  assert build_report(arms, recover_domain="math", bootstrap=30)["arms"] == rep["arms"]
  assert _exact(rep["recover_target"], 0.45)
  d = rep["arms"]["degrade"]
  assert d["accuracy_recover_domain"]["mean"] == pytest.approx(0.30)  # not its mean, 0.50
  assert d["accuracy_mean"]["mean"] == pytest.approx(0.50)
  assert d["response_length"]["mean"] == 2.0  # math only, not (2 + 6) / 2
  # It only sets the recovery up: no target, no saving against recover_grpo.
  assert "flops_to_target" not in d and "saving_at_target" not in d
  r = rep["arms"]["recover_self"]
  assert r["accuracy_recover_domain"]["mean"] == pytest.approx(0.50)
  assert _exact(r["flops_to_target"], 7.5)  # .3 -> .5 over 10: .45 at 7.5
  assert _exact(r["saving_at_target"], 1 - 7.5 / 75)  # recover_grpo: .45 at 75
  assert r["reference"] == "recover_grpo"
  assert r["headroom"]["math"]["mean"] == pytest.approx((.5 - .3) / (.6 - .3))
  assert "saving_at_target" not in rep["arms"]["recover_grpo"]
  assert rep["arms"]["joint_grpo"]["flops_to_target"]["mean"] == pytest.approx(170.0)
  # One seed, bootstrap over prompts: the same saving in every replicate. Claim (d)'s unit, the
  # factor 1 / (1 - 0.9) = 10, beside it.
  assert ("(d) to recover the degraded domain: self-teacher OPD needs 90.0% [90.0, 90.0] fewer "
          "FLOPs than GRPO (10.0x [10.0, 10.0] fewer)") in rep["verdicts"]
  # Claim (d)'s condition before its savings: how deep the degradation went (joint_grpo's math
  # at its end, .6 in _arms, down to .3) and the target the routes are charged to.
  assert ("(d) the degradation (noisy SFT): math 60.0% [60.0, 60.0] → 30.0% [30.0, 30.0]; the "
          "recovery target 45.0% [45.0, 45.0]") in rep["verdicts"], rep["verdicts"]
  assert "saving_vs_external" not in r and not any("external-teacher OPD" in v and "(d)" in v
                                                   for v in rep["verdicts"])
  # With the external teacher's recovery too: the self teacher against it (math .45 at 22.5).
  ext = dataclasses.replace(arms[2], arm="recover_external",
                            curve=_math_only([(0, .3), (30, .5)]),
                            flops_by_phase={"train/teacher": 30.0}, distill_flops=30.0)
  rep2 = build_report(arms + [ext], bootstrap=30)
  assert _exact(rep2["arms"]["recover_self"]["saving_vs_external"], 1 - 7.5 / 22.5)
  assert _exact(rep2["arms"]["recover_external"]["saving_at_target"], 1 - 22.5 / 75)
  assert ("(d) to recover the degraded domain: self-teacher OPD needs 66.7% [66.7, 66.7] fewer "
          "FLOPs than external-teacher OPD (3.0x [3.0, 3.0] fewer)") in rep2["verdicts"]
  assert not any(v.startswith("Fell below") for v in rep2["verdicts"])
  # The external recovery falling apart after the target and running on: named among the verdicts.
  fallen = dataclasses.replace(ext, curve=_math_only([(0, .3), (30, .5), (60, .1)]))
  assert ("Fell below 50% of its best and ran on (the collapse rule asks for 0; the best checkpoint"
          " is chosen on the stop set): recover_external on seed 0 (best 50.0%, final 10.0%)"
          ) in build_report(arms + [fallen], bootstrap=0)["verdicts"]
  # The external recovery collapsed before the target: its run ended there, and the bound the
  # censoring gives says so (a run that collapsed would not have gone on).
  broke = dataclasses.replace(ext, curve=_math_only([(0, .3), (5, .0)]),
                              collapsed={"step": 2, "what": "x"})
  assert ("(d) to recover the degraded domain: self-teacher OPD vs external-teacher OPD: "
          "external-teacher OPD had not reached the level when it stopped (it collapsed on seed 0 "
          "at step 2): saving ≥ -50.0%") in build_report(
              arms + [broke], bootstrap=0)["verdicts"]
  # A page that shows the main arms elsewhere embeds claim (d)'s part alone.
  rec_md = markdown(rep2, "recovery")
  assert rec_md.startswith("*Self-teacher recovery of math") and "| joint_grpo |" not in rec_md
  items = [ln[2:] for ln in rec_md.splitlines() if ln.startswith("- ")]
  assert [v[:3] for v in items] == ["(d)", "(d)", "(d)", "Int"], items
  assert "| joint_grpo |" in markdown(rep2)
  from smjax.study import render  # pylint: disable=import-outside-toplevel
  head = "Collapsed (the run ended there; its route is charged up to it): "
  both = head + "external_opd on seed 1 at step 9 (x); recover_external on seed 2 at step 5 (y)"
  assert render._recovery_only(both) == head + "recover_external on seed 2 at step 5 (y)"
  assert render._recovery_only(head + "external_opd on seed 1 at step 9 (x)") == ""
  ran_on = "Fell below 50% of its best and ran on (a; b): recover_self on seed 0 (x)"
  assert render._recovery_only(ran_on) == ran_on
  with pytest.raises(ValueError, match="'recover'"):
    markdown(rep2, "recover")
  src = tmp_path / "rep.json"
  src.write_text(json.dumps(rep2))
  page = (f"<!-- generated by `python -m smjax.study.render --update-docs` from {src}#recovery -->"
          "\nstale\n<!-- end generated -->")
  assert update_docs(page).split("\n", 1)[1] == rec_md + "<!-- end generated -->"
  # GRPO that never gets back (its curve ends at .4 < .45): the saving and the factor are bounds.
  grpo = next(a for a in arms if a.arm == "recover_grpo")
  stuck = dataclasses.replace(grpo, curve=_math_only([(0, .3), (100, .4)]))
  rep3 = build_report([a if a is not grpo else stuck for a in arms], bootstrap=0)
  assert ("(d) to recover the degraded domain: self-teacher OPD vs GRPO: GRPO had not reached "
          "the level when it stopped: saving ≥ 92.5% (≥ 13.3x fewer FLOPs, a bound that grows "
          "with GRPO's budget)"
          ) in rep3["verdicts"], rep3["verdicts"]
  # The recovery table: one accuracy column, on math, for every row; degrade has no target.
  table = format_table(rep)
  recovery = table[table.index("Self-teacher recovery of math (target 45.0%"):]
  recovery = recovery[:recovery.index("Verdicts:")]
  _, header, _, *rows = [line for line in recovery.splitlines() if line]
  assert header.split()[:3] == ["arm", "math", "acc"]
  row = {line.split()[0]: line.split() for line in rows}
  assert row["degrade"][1] == "30.0%" and row["degrade"][-1] == "2"
  assert row["recover_self"][1] == "50.0%" and row["recover_grpo"][1] == "50.0%"
  assert "never" not in row["degrade"]
  # The plot's panels: the main one on the mean; degrade, and the recovery arms, on math.
  panels = curve_series(arms)
  assert "math" in panels["recovery"]["ylabel"] and "mean" in panels["main"]["ylabel"]
  assert "math" in panels["degrade"]["ylabel"]
  assert [arm for arm, *_ in panels["degrade"]["series"]] == ["degrade"]
  assert panels["degrade"]["series"][0][3] == pytest.approx([60.0, 30.0])
  series = {arm: ys for arm, _, _, ys, _ in panels["recovery"]["series"]}
  assert "degrade" not in series and series["recover_self"] == pytest.approx([30.0, 50.0])
  assert panels["recovery"]["targets"] == pytest.approx([0.45]) and not panels["degrade"]["targets"]
  # An SFT degradation is not charged: its one point sits at 0 FLOPs, so the panel shows each
  # seed's step from joint GRPO's last point (math .6) to the degraded model (.3) instead.
  sft = dataclasses.replace(arms[0], curve=arms[0].curve[-1:], flops_by_phase={})
  deg = curve_series([sft] + arms[1:])["degrade"]
  assert deg["steps"][0] == "joint GRPO"
  assert [(x, y) for _, _, x, y, _ in deg["series"]] == [([0, 1], pytest.approx([60.0, 30.0]))]
  assert "steps" not in panels["degrade"]   # a charged degradation keeps its FLOP axis
  main = {arm: ys for arm, _, _, ys, _ in panels["main"]["series"]}
  assert main["split_merge"] == pytest.approx([20.0, 50.0, 60.0])  # (0.7 + 0.5) / 2 at the end
  # Every prompt has the same count: no spread over prompts, no band.
  assert all(b == 0 for *_, band in panels["main"]["series"] for b in band)
  paths = write_report(rep, arms, str(tmp_path))
  csv_rows = open(paths["csv"]).read().splitlines()
  assert "degrade,accuracy_recover_domain,0.3,0.3,0.3,0.0,1" in csv_rows
  assert open(paths["plot"], "rb").read(4) == b"\x89PNG"


def _deeper_arms(seed=0):
  """A further depth of the degradation (self_teacher.also_correct_fractions, arms named
  `<phase>@0`): math .6 -> .1, so its routes' target is .1 + .5 x (.6 - .1) = .35; the self
  teacher gets there at 12.5 FLOPs, GRPO never does (its curve ends at .3 after 200)."""
  deg, me, grpo = _recovery_arms(seed)
  kw = dict(start="degrade@0", target=0.35)
  return [dataclasses.replace(deg, arm="degrade@0", note="noisy SFT, none right", curve=[
              _point(0, {"math": .6, "code": .4}, {"math": 3.0, "code": 5.0}),
              _point(100, {"math": .1, "code": .7}, {"math": 2.0, "code": 6.0})]),
          dataclasses.replace(me, arm="recover_self@0", curve=_math_only([(0, .1), (20, .5)]),
                              flops_by_phase={"train/teacher": 20.0}, distill_flops=20.0, **kw),
          dataclasses.replace(grpo, arm="recover_grpo@0", curve=_math_only([(0, .1), (200, .3)]),
                              flops_by_phase={"train/policy": 200.0}, **kw)]


def test_a_further_depth_of_the_degradation_is_a_recovery_group_of_its_own(tmp_path):
  arms = _recovery_arms() + _deeper_arms() + _arms()
  rep = build_report(arms, bootstrap=0)
  # Each depth has its own target and reference; the configured one's figures are unchanged.
  assert rep["recover_target"]["mean"] == pytest.approx(0.45)
  assert rep["recover_target@0"]["mean"] == pytest.approx(0.35)
  assert build_report(_recovery_arms() + _arms(), bootstrap=0)["arms"]["recover_self"] == \
      rep["arms"]["recover_self"]
  me = rep["arms"]["recover_self@0"]
  assert me["reference"] == "recover_grpo@0"
  assert me["flops_to_target"]["mean"] == pytest.approx(20 * .25 / .4)   # .1 -> .5: .35 at 12.5
  # GRPO had not got back when it stopped: censored at its 200 FLOPs, the saving a bound.
  assert me["saving_at_target"]["mean"] == pytest.approx(1 - 12.5 / 200)
  assert me["saving_at_target"]["bound"] == 1
  lines = [v for v in rep["verdicts"] if v.startswith("(d)")]
  assert lines == [
      "(d) the degradation (noisy SFT): math 60.0% → 30.0%; the recovery target 45.0%",
      "(d) to recover the degraded domain: self-teacher OPD needs 90.0% fewer FLOPs than GRPO "
      "(10.0x fewer)",
      "(d) the degradation degrade@0 (noisy SFT, none right): math 60.0% → 10.0%; the recovery "
      "target 35.0%",
      "(d) to recover the degraded domain (degrade@0): self-teacher OPD vs GRPO: GRPO had not "
      "reached the level when it stopped: saving ≥ 93.8% (≥ 16.0x fewer FLOPs, a bound that "
      "grows with GRPO's budget)"
  ], lines
  # A table per depth, each on its own target and reference, and both in the page's part.
  table = format_table(rep)
  assert "Self-teacher recovery of math (target 45.0%; savings vs recover_grpo;" in table
  deep = table[table.index("Self-teacher recovery of math from degrade@0 (target 35.0%; savings "
                           "vs recover_grpo@0"):]
  rows = [ln.split()[0] for ln in deep[:deep.index("Verdicts:")].splitlines()[3:] if ln.strip()]
  assert rows == ["degrade@0", "recover_self@0", "recover_grpo@0"], rows
  part = markdown(rep, "recovery")
  assert part.count("*Self-teacher recovery of math") == 2 and "| joint_grpo |" not in part
  # The plot: a degradation and a recovery panel per depth, each on its own target.
  panels = curve_series(arms)
  assert list(panels) == ["main", "degrade", "recovery", "degrade@0", "recovery@0"]
  assert [a for a, *_ in panels["recovery@0"]["series"]] == ["recover_self@0", "recover_grpo@0"]
  assert panels["recovery@0"]["targets"] == pytest.approx([0.35])
  assert [a for a, *_ in panels["degrade@0"]["series"]] == ["degrade@0"]
  paths = write_report(rep, arms, str(tmp_path))
  assert open(paths["plot"], "rb").read(4) == b"\x89PNG"


def test_recovery_targets_are_read_on_the_given_domain():
  # A recovery arm also evaluated on code: on math (0.1 -> 0.5 over 100 FLOPs) it reaches the
  # target 0.3 at 50; its mean (0.3 -> 0.5) is at the target from the start.
  both = [_point(0, {"math": .1, "code": .5}), _point(100, {"math": .5, "code": .5})]
  arm = ArmResult("recover_self", 0, both, {"train/teacher": 100.0}, group="recovery", target=0.3)
  on_math = build_report([arm], reference_arm=None, recover_domain="math")
  assert on_math["arms"]["recover_self"]["flops_to_target"]["mean"] == pytest.approx(50.0)
  on_mean = build_report([arm], reference_arm=None)  # shares two domains: the mean is used
  assert on_mean["recover_domain"] is None
  assert on_mean["arms"]["recover_self"]["flops_to_target"]["mean"] == 0.0
  with pytest.raises(ValueError, match="recover_domain='gsm8k'"):
    build_report([arm], reference_arm=None, recover_domain="gsm8k")


# ------------------------------------------------------------------ run_rl's stop_at, scripted

def test_run_rl_runs_on_past_the_first_point_that_meets_its_rule(monkeypatch):
  """run_rl with every model piece scripted (no model, no compile): it evaluates at step 0 and
  after every step, notes the first point the rule accepts, and stops only once it has run on
  past it by 2 more evaluations and 25 % more of its own FLOPs; `on_eval` sees every point."""
  from smjax.train import loop as loop_lib  # pylint: disable=import-outside-toplevel
  ex = types.SimpleNamespace(domain="math", prompt="q")
  ro = loop_lib.Rollout(types.SimpleNamespace(lengths_B=np.ones(2), num_samples=2), [ex, ex],
                        np.array([0.0, 1.0], np.float32))
  monkeypatch.setattr(loop_lib, "rollout", lambda *a, **k: (ro, []))
  monkeypatch.setattr(loop_lib.steps_lib, "step_program_calls", lambda *a, **k: [])
  progress = loop_lib.RLProgress()

  def make_batch(_):
    progress.ledger.add_flops("train/policy", 10.0)
    return None, [], {}

  accs = [acc for acc, _ in SCRIPT] + [SCRIPT[-1][0]] * 10
  script = iter(accs)
  evaluations, saves, seen = [], [], []

  def evaluator(params):
    evaluations.append(params)
    return {"accuracy": next(script)}, []

  cfg = loop_lib.RLLoopConfig(steps=10, samples_per_prompt=2, eval_every_steps=1, progress=False)
  kw = dict(name="mopd", loop=cfg, step=lambda state, batch: (state, {"loss": 0.0, "finite": 1.0}),
            make_batch=make_batch, sampler=None, tokenizer=None, prompts=itertools.repeat([ex]),
            verify=None, evaluator=evaluator, save=lambda *a: saves.append(a[0]),
            stop_at=capture_rule(START, TEACHER, 0.9), run_on=(2, 0.25),
            on_eval=lambda point, state, prog: seen.append(point["step"]))
  res = loop_lib.run_rl(types.SimpleNamespace(params="p"), progress=progress, **kw)
  # SCRIPT[3] (step 3, 30 FLOPs) is the first at >= 90 %; 2 more evaluations (step 5) and 25 %
  # more FLOPs (37.5: step 4) later it stops, after step 5, saved there.
  assert res.reached and not res.stopped and res.stop_point == 3
  assert [p["step"] for p in res.curve] == [0, 1, 2, 3, 4, 5] and seen == [0, 1, 2, 3, 4, 5]
  assert [p["flops"] for p in res.curve] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
  assert res.curve[3]["accuracy"] == SCRIPT[3][0] and saves == [5] and progress.step == 5
  assert res.curve[2]["mean"] == pytest.approx(0.55)
  assert res.last_metrics["reward/mean"] == 0.5
  # A resumed run that had run on returns at once: no evaluation, no step.
  n = len(evaluations)
  again = loop_lib.run_rl(types.SimpleNamespace(params="p"), progress=progress, **kw)
  assert again.reached and again.stop_point == 3 and len(evaluations) == n
  assert progress.step == 5 and len(again.curve) == 6
  # The FLOPs share can be what holds it: 100 % more of its own FLOPs is step 6 (60 >= 2 x 30).
  script = iter(accs)
  fresh = loop_lib.RLProgress()

  def batch_for_fresh(_):
    fresh.ledger.add_flops("train/policy", 10.0)
    return None, [], {}

  longer = loop_lib.run_rl(types.SimpleNamespace(params="p"), progress=fresh,
                           **(kw | {"run_on": (2, 1.0), "make_batch": batch_for_fresh}))
  assert longer.stop_point == 3 and len(longer.curve) == 7
  # (0, 0.0): it stops at the first point that meets the rule.
  script = iter(accs)
  at_once = loop_lib.run_rl(types.SimpleNamespace(params="p"), progress=loop_lib.RLProgress(),
                            **(kw | {"run_on": (0, 0.0), "make_batch": lambda _: (None, [], {})}))
  assert len(at_once.curve) == 4
  # Without a rule it runs to its cap.
  script = iter(accs)
  full = loop_lib.run_rl(types.SimpleNamespace(params="p"), progress=loop_lib.RLProgress(),
                         **(kw | {"stop_at": None, "make_batch": lambda _: (None, [], {})}))
  assert not full.reached and full.stop_point is None and len(full.curve) == 11
  # stop_ends=False: the rule's point is noted, and the run goes on to its cap all the same.
  script = iter(accs)
  on = loop_lib.run_rl(types.SimpleNamespace(params="p"), progress=loop_lib.RLProgress(),
                       **(kw | {"stop_ends": False, "make_batch": lambda _: (None, [], {})}))
  assert on.reached and on.stop_point == 3 and len(on.curve) == 11
  # ...and up to where the rule ended the first run (run_on_end on its own curve: what
  # rl_phase keeps as its rule_end) it is that run, point for point.
  end = loop_lib.run_on_end(on.curve, on.stop_point, 2, 0.25)
  assert end == len(res.curve) - 1 == 5
  assert [(p["step"], p["accuracy"]) for p in on.curve[:end + 1]] == [
      (p["step"], p["accuracy"]) for p in res.curve]


def test_a_phase_also_saves_on_the_clock_where_its_steps_are_slow(monkeypatch):
  """loop.checkpoint_seconds: a save once that much wall time has passed since the last save (or
  the start), beside the step cadence; the clock restarts at every save, either cadence's. A
  scripted run whose save clock reads 10 s more at every look (construction, then once a step).
  The script is the cadence's own clock, not time.monotonic, which jax reads too when it
  compiles (the test passed only where the worker had compiled its programs before)."""
  from smjax.train import loop as loop_lib  # pylint: disable=import-outside-toplevel
  ex = types.SimpleNamespace(domain="math", prompt="q")
  ro = loop_lib.Rollout(types.SimpleNamespace(lengths_B=np.ones(2), num_samples=2), [ex, ex],
                        np.array([0.0, 1.0], np.float32))
  monkeypatch.setattr(loop_lib, "rollout", lambda *a, **k: (ro, []))
  monkeypatch.setattr(loop_lib.steps_lib, "step_program_calls", lambda *a, **k: [])
  cadence = loop_lib.SaveCadence

  def saves_with(**fields):
    ticks, saves = itertools.count(0, 10), []
    monkeypatch.setattr(loop_lib, "SaveCadence", functools.partial(
        cadence, clock=lambda: float(next(ticks))))
    cfg = loop_lib.RLLoopConfig(steps=10, samples_per_prompt=2, progress=False, **fields)
    loop_lib.run_rl(types.SimpleNamespace(params="p"), name="joint_grpo", loop=cfg,
                    step=lambda state, batch: (state, {"loss": 0.0, "finite": 1.0}),
                    make_batch=lambda _: (None, [], {}), sampler=None, tokenizer=None,
                    prompts=itertools.repeat([ex]), verify=None,
                    save=lambda *a: saves.append(a[0]))
    return saves

  # Step k looks at 10k s: 30 s is past 25 (save), 60 s is 30 past it, 90 s; the cap's step saves.
  assert saves_with(checkpoint_seconds=25) == [3, 6, 9, 10]
  # With every 4 steps too: 30 s (clock), step 4 at 40 s (steps: the clock restarts), 70 s
  # (clock), step 8 (steps), the cap.
  assert saves_with(checkpoint_seconds=25, checkpoint_every=4) == [3, 4, 7, 8, 10]
  assert saves_with() == [10]
  with pytest.raises(ValueError, match="checkpoint_seconds=-1"):
    loop_lib.RLLoopConfig(steps=1, samples_per_prompt=1, checkpoint_seconds=-1)


def test_a_plateau_holds_once_no_domain_has_a_new_best_for_its_window():
  """Plateau(3, 0.01) on a scripted stop-set curve, by hand: it holds at the first point whose
  last three evaluations lifted neither domain more than 0.01 above its best before them."""
  curve = [(.2, .2), (.5, .3), (.6, .5), (.6, .6), (.605, .62), (.61, .615), (.6, .6),
           (.59, .63), (.6, .6)]
  point = lambda m, c: {"accuracy": {"math": 0.0, "code": 0.0},  # noqa: E731
                        "stop": {"accuracy": {"math": m, "code": c}}}
  rule = Plateau(3, 0.01)
  # Index 5: window (.6,.6),(.605,.62),(.61,.615) against bests (.6, .5): code +0.12, no.
  # Index 6: window from index 4: math .61 vs .6 (0 + 0.01: holds, within tol), code .62 vs .6:
  # +0.02, no. Index 7: window 5-7 against bests (.605, .62): math .61 (+.005), code .63
  # (+.01, within tol): holds.
  assert [rule(point(*mc)) for mc in curve] == [False] * 7 + [True, True]
  # A new best past the tolerance breaks it again; a fresh rule is needed per curve.
  fresh = Plateau(3, 0.01)
  assert [fresh(point(*mc)) for mc in curve[:7] + [(.7, .6)]][-1] is False
  # Without a stop set it reads the report accuracy, like every rule.
  report = Plateau(1, 0.0)
  assert [report({"accuracy": {"math": a}}) for a in (.1, .2, .2)] == [False, False, True]
  with pytest.raises(ValueError, match="plateau_evals=0"):
    Plateau(0, 0.01)


def test_a_plateau_over_a_share_of_the_runs_flops_is_not_fooled_by_dense_evaluation():
  """Plateau(3, 0.01, flops_fraction=0.25) against Plateau(3, 0.01) on a scripted curve evaluated
  every 10 FLOPs (past an offset of 1,000 the run was charged before it started): math rises
  0.015 an evaluation to 0.5 at index 20, then 0.003 an evaluation (a point every 3.3
  evaluations) to 0.62 at index 60, then stays. By hand: three evaluations alone see 0.009 at
  index 23 and call it flat. The window that also spans a quarter more of the run's FLOPs starts
  at the latest index k <= i - 2 with 10 i >= 1.25 x 10 k (k = 18 at 23: lift 0.054), so during
  the slow climb it always spans about a fifth of the curve (lift >= 0.018); on the flat top it
  first holds at 73 (k = 58: the best before it 0.611 at 57, 0.62 - 0.611 = 0.009; at 72, k = 57
  and 0.62 - 0.608 = 0.012)."""
  def math_at(i):
    return 0.2 + 0.015 * i if i <= 20 else min(0.5 + 0.003 * (i - 20), 0.62)
  points = [{"flops": 1000.0 + 10 * i, "accuracy": {"math": 0.0},
             "stop": {"accuracy": {"math": math_at(i)}}} for i in range(90)]
  first = lambda rule: next(i for i, p in enumerate(points) if rule(p))  # noqa: E731
  assert first(Plateau(3, 0.01, offset=1000.0)) == 23
  assert first(Plateau(3, 0.01, flops_fraction=0.25, offset=1000.0)) == 73
  # The offset matters: read on the charged FLOPs (1,000 more: the experts', for MOPD), a quarter
  # more is 250+ FLOPs, 25+ evaluations, and the flat top never spans it within these 90.
  assert not any(map(Plateau(3, 0.01, flops_fraction=0.25), points))
  with pytest.raises(ValueError, match="plateau_flops_fraction=-0.1"):
    Plateau(3, 0.01, flops_fraction=-0.1)


def test_a_capture_and_plateau_rule_resumes_to_the_same_stop(monkeypatch):
  """MOPD's rule (capture and plateau, all_rules asking both about every point) in run_rl: it
  runs on past the capture until the curve is flat, and a run stopped part-way and resumed with
  a fresh rule stops where the uninterrupted run did."""
  from smjax.train import loop as loop_lib  # pylint: disable=import-outside-toplevel
  ex = types.SimpleNamespace(domain="math", prompt="q")
  ro = loop_lib.Rollout(types.SimpleNamespace(lengths_B=np.ones(2), num_samples=2), [ex, ex],
                        np.array([0.0, 1.0], np.float32))
  monkeypatch.setattr(loop_lib, "rollout", lambda *a, **k: (ro, []))
  monkeypatch.setattr(loop_lib.steps_lib, "step_program_calls", lambda *a, **k: [])
  # Captured (>= 90 % of TEACHER's gain over START) at index 3; still rising to index 6; flat
  # (no new best > 0.01 in 2 evaluations) first at index 8.
  accs = [acc for acc, _ in SCRIPT] + [{"math": .7, "code": .65}, {"math": .75, "code": .7},
                                       {"math": .75, "code": .7}, {"math": .755, "code": .7}]
  accs += [accs[-1]] * 10

  def run(progress, stop_after=None):
    script = iter(accs[len(progress.curve):])
    steps_done = []

    def make_batch(_):
      progress.ledger.add_flops("train/policy", 10.0)
      return None, [], {}

    cfg = loop_lib.RLLoopConfig(steps=15, samples_per_prompt=2, eval_every_steps=1,
                                progress=False)
    return loop_lib.run_rl(
        types.SimpleNamespace(params="p"), name="mopd", loop=cfg, progress=progress,
        step=lambda state, batch: (state, {"loss": 0.0, "finite": 1.0}), make_batch=make_batch,
        sampler=None, tokenizer=None, prompts=itertools.repeat([ex]), verify=None,
        evaluator=lambda params: ({"accuracy": next(script)}, []),
        save=lambda *a: steps_done.append(a[0]),
        should_stop=(lambda: progress.step == stop_after) if stop_after else None,
        stop_at=all_rules(capture_rule(START, TEACHER, 0.9), Plateau(2, 0.01)), run_on=(1, 0.0))

  whole = run(loop_lib.RLProgress())
  assert whole.stop_point == 8 and len(whole.curve) == 10
  progress = loop_lib.RLProgress()
  part = run(progress, stop_after=7)
  assert part.stopped and len(part.curve) == 8
  resumed = run(progress)
  assert resumed.stop_point == 8 and len(resumed.curve) == 10


def test_evaluations_are_dense_where_a_run_starts_and_on_the_grid_later():
  """eval_growth: the next evaluation comes once the run's own FLOPs have grown by that share
  since the last one, or at the grid's next multiple, whichever is first."""
  from smjax.train.loop import _next_eval  # pylint: disable=import-outside-toplevel
  assert _next_eval(100.0, 250.0) == 300.0                        # the grid alone
  assert _next_eval(100.0, 250.0, growth=0.1) == pytest.approx(275.0)
  assert _next_eval(100.0, 10.0, growth=0.5) == pytest.approx(15.0)
  assert _next_eval(0.0, 10.0, growth=0.5) == pytest.approx(15.0)  # no grid yet
  assert _next_eval(0.0, 10.0) == math.inf
  # A run that starts after others (MOPD after its experts): growth of its own FLOPs only.
  assert _next_eval(1000.0, 1050.0, growth=0.2, offset=1000.0) == pytest.approx(1060.0)
  # Steps of 10 FLOPs from 0, growth 0.25 and a grid of 100: evaluated after steps 1, 2, 3, 4,
  # 5, 7, 9 (growth), 10 (the grid: 90 x 1.25 > 100), 13, 17 (growth), 20 (grid), 25 (growth),
  # 30 (grid), 38 (growth: 300 x 1.25 = 375), 40 (grid).
  done, due, at = 0.0, _next_eval(100.0, 0.0, 0.25), []
  for step in range(1, 41):
    done += 10.0
    if done >= due:
      at.append(step)
      due = _next_eval(100.0, done, 0.25)
  assert at == [1, 2, 3, 4, 5, 7, 9, 10, 13, 17, 20, 25, 30, 38, 40]


def test_rollout_metrics_count_the_completions_that_ran_to_the_cap():
  from smjax.train import loop as loop_lib  # pylint: disable=import-outside-toplevel
  ex = [types.SimpleNamespace(domain=d) for d in ("math", "math", "code", "code")]
  result = types.SimpleNamespace(lengths_B=np.array([3, 5, 5, 2]), completion_BC=np.zeros((4, 5)),
                                 num_samples=2)
  m = loop_lib.rollout_metrics(loop_lib.Rollout(result, ex, np.array([1.0, 0.0, 0.0, 0.0])))
  assert m["length/at_cap"] == 0.5 and m["length/math"] == 4.0
  assert m["reward/zero_variance_groups"] == 0.5 and m["reward/math"] == 0.5
  # Per domain: math's one group has rewards 1, 0 (a signal), code's 0, 0 (none).
  assert m["zero_variance_groups/math"] == 0.0 and m["zero_variance_groups/code"] == 1.0


def test_a_checkpoint_sets_headroom_is_against_its_teachers_where_they_were_stopped():
  base = ArmResult("base", 0, _curve([(0, .2, .2)]), {})
  joint = ArmResult("joint_grpo", 0, _curve([(0, .2, .2), (300, .6, .6)]), {"train/policy": 300.0})
  em = ArmResult("expert_math", 0, [dict(p, step=s) for p, s in zip(
      _curve([(0, .2, .2), (40, .4, .2), (80, .6, .2)]), (0, 10, 20))], {"train/policy": 80.0})
  ec = ArmResult("expert_code", 0, [dict(p, step=s) for p, s in zip(
      _curve([(0, .2, .2), (40, .2, .5), (80, .2, .6)]), (0, 10, 20))], {"train/policy": 80.0})
  # MOPD from the experts at step 10 (math .4, code .5): a student at .3 / .35 has captured half.
  split = ArmResult("split_merge@0.9", 0, _curve([(80, .2, .2), (100, .3, .35)]),
                    {"train/policy": 100.0}, expert_flops=80.0,
                    teachers={"math": "expert_math", "code": "expert_code"},
                    experts_at={"math": {"at": "0.9", "step": 10}, "code": {"at": "0.9",
                                                                             "step": 10}})
  f = seed_figures({a.arm: a for a in (base, joint, em, ec, split)}, {}, target_fraction=0.9,
                   reference_arm="joint_grpo", recover_domain=None)
  assert f["split_merge@0.9|headroom/math"] == pytest.approx(0.5)   # (.3 - .2) / (.4 - .2)
  assert f["split_merge@0.9|headroom/code"] == pytest.approx(0.5)   # (.35 - .2) / (.5 - .2)


def test_a_frontier_at_zero_flops_is_plotted(tmp_path):
  """A level the reference starts above costs it 0 FLOPs: the frontier panel, log-scaled
  otherwise, is drawn linear then (a log scale cannot show 0)."""
  arms = _frontier_arms()
  arms[1] = ArmResult("joint_grpo", 0, _curve([(0, .6, .6), (100, .6, .6)]),
                      {"train/policy": 100.0})
  rep = build_report(arms, bootstrap=5, levels=(0.5, 0.9))
  assert rep["frontier"]["mean"]["0.9"]["joint"]["mean"] == 0.0
  paths = write_report(rep, arms, str(tmp_path))
  assert open(paths["plot"], "rb").read(4) == b"\x89PNG"
  # A reference that gained nothing: no level, every frontier figure undefined (nan).
  arms[1] = ArmResult("joint_grpo", 0, _curve([(0, .2, .2), (100, .2, .2)]),
                      {"train/policy": 100.0})
  rep = build_report(arms, bootstrap=5, levels=(0.5, 0.9))
  assert rep["frontier"]["mean"]["0.9"]["joint"]["mean"] is None
  paths = write_report(rep, arms, str(tmp_path / "flat"))
  assert open(paths["plot"], "rb").read(4) == b"\x89PNG"


def test_no_frontier_against_split_then_merge_itself():
  """configs/mopd.py reports against split_merge (no joint GRPO): no routes to set side by side."""
  arms = [a for a in _frontier_arms() if a.arm != "joint_grpo"]
  rep = build_report(arms, reference_arm="split_merge", bootstrap=0, levels=(0.9,))
  assert rep["arms"]["split_merge@0.9"]["saving_at_target"]["mean"] is not None
  assert rep["frontier"] == {} and not any(v.startswith("(a)") for v in rep["verdicts"])


def _flat_rule_arms(ran: float):
  """A seed whose MOPD from early experts (60 FLOPs, teachers at .7 on the stop set, the base at
  .2, capture fraction .5) rises .03 an evaluation to .5 at index 10, then .003 an evaluation
  to a top of .568 (index 33), evaluated every 2 of its own FLOPs; recorded as it ran under the
  flat rule spanning `ran` of its FLOPs (test_mopd_is_read_under_both_flat_rules says where
  each ends). The late set (experts 160 FLOPs) ran to its cap; joint GRPO reaches .56 at 180."""
  arms = [a for a in _frontier_arms() if a.arm in ("base", "joint_grpo")]
  acc = [.2 + .03 * i if i <= 10 else min(.5 + .003 * (i - 10), .568) for i in range(50)]
  curve = _curve([(60 + 2 * i, a, a) for i, a in enumerate(acc[:50 if ran else 18])])
  for i, p in enumerate(curve):
    p["step"] = i
  teach = {"math": "expert_math", "code": "expert_code"}
  experts = [ArmResult(t, 0, _curve([(30, .7, .7)]), {"train/policy": 30.0})
             for t in teach.values()]
  early = ArmResult("split_merge@0.9", 0, curve, {"train/policy": curve[-1]["flops"]},
                    expert_flops=60.0, distill_flops=curve[-1]["flops"] - 60.0, teachers=teach,
                    capture_fraction=0.5, reached=True)
  late = next(a for a in _frontier_arms() if a.arm == "split_merge")
  for p, step in zip(late.curve, (0, 40, 80, 100)):   # its cap
    p["step"] = step
  late = dataclasses.replace(late, teachers=teach, capture_fraction=0.5, reached=False)
  return {a.arm: a for a in arms + experts + [early, late]}


def test_mopd_is_read_under_both_flat_rules():
  """report.replay_distillation and the frontier read again under the other flat rule, by hand
  (Plateau(3, 0.01), run-on 3 evaluations and 25 % more of the run's own FLOPs, cap 100 steps).
  Three evaluations alone first see a flat curve at index 13 (.509 against .5 at 10), which
  runs on to index 17 (own FLOPs 34 >= 1.25 x 26). Spanning a quarter of its FLOPs, the window
  at index i reaches back to floor(0.8 i), so that it holds four or more rises of .003 (.012)
  until the top; it is flat only once .568 is within .01 of the best before it (.56 at index
  30): index 39 (window from 31), run on to 49 (own 98 >= 1.25 x 78). The level (90 % of joint
  GRPO's gain: .56) is first met at index 30, 60 + 60 = 120 FLOPs.

  Run with the span, the record holds index 49 and the early set's 120 is the cheapest (saving 1
  - 120 / 180); replayed without, its distillation ends at 17, flat below .56, so it is no
  candidate and the late set's 174 is (1 - 174 / 180). Run without, the record ends at 17;
  replayed with the span, the run would have gone on past it, so the set stays a candidate
  censored at its end, 94 FLOPs: split-then-merge at least 94, the saving at most 1 - 94 / 180."""
  from smjax.study.report import replay_distillation  # pylint: disable=import-outside-toplevel
  rule = dict(evals=3, tol=0.01, run_on=(3, 0.25), cap=100)
  spanned, plain = _flat_rule_arms(0.25), _flat_rule_arms(0.0)
  # Each record's own rule reproduces where it ended; the late set ended at its cap either way.
  assert replay_distillation(spanned, ran=0.25, replay=0.25, **rule) == {
      "split_merge@0.9": (49, True), "split_merge": (3, False)}
  assert replay_distillation(spanned, ran=0.25, replay=0.0, **rule)["split_merge@0.9"] == (17, True)
  assert replay_distillation(plain, ran=0.0, replay=0.0, **rule)["split_merge@0.9"] == (17, True)
  assert replay_distillation(plain, ran=0.0, replay=0.25, **rule)["split_merge@0.9"] == (
      None, False)
  # A record its own rule does not reproduce (cut short of its run-on, not at its cap): no replay.
  cut = dict(spanned, **{"split_merge@0.9": dataclasses.replace(
      spanned["split_merge@0.9"], curve=spanned["split_merge@0.9"].curve[:45])})
  assert replay_distillation(cut, ran=0.25, replay=0.0, **rule) is None
  for arms, ran, split, saving in ((spanned, 0.25, 120.0, 1 - 120 / 180),
                                   (plain, 0.0, 94.0, 1 - 94 / 180)):
    rep = build_report(list(arms.values()), bootstrap=0, levels=(0.9,),
                       flat_rule=dict(rule, ran=ran, replay=0.25 - ran))
    assert rep["flat_rule"] == {"ran": ran, "replayed": 0.25 - ran, "evals": 3,
                                "not_replayed": []}
    mean, again = rep["frontier"]["mean"]["0.9"], rep["frontier"]["mean:replayed"]["0.9"]
    assert mean["split"]["mean"] == pytest.approx(120.0 if ran else 174.0)   # as run
    assert again["split"]["mean"] == pytest.approx(174.0 if ran else split)
    assert again["saving"]["mean"] == pytest.approx(1 - 174 / 180 if ran else saving)
    assert again["saving"]["bound"] == (0 if ran else -1)
  # The censored replay: its student (teachers at .7 over a base at .2) would need
  # (.56 - .2) / .5 = 72 % of their gain and had (.521 - .2) / .5 = 64.2 % where its record ends.
  assert again["capture_needed"]["mean"] == pytest.approx(0.72)
  assert again["capture_reached"]["mean"] == pytest.approx(0.642)
  assert mean["capture_needed"]["per_seed"] == [None]     # an exact figure (nan) needs none
  # Both readings in the verdicts and the tables (here: the rule without the span replayed).
  rep = build_report(list(spanned.values()), bootstrap=0, levels=(0.9,),
                     flat_rule=dict(rule, ran=0.25, replay=0.0))
  line = next(v for v in rep["verdicts"] if v.startswith("(a) with MOPD"))
  assert line.startswith(
      "(a) with MOPD stopped on a curve flat over 3 evaluations (replayed on the same runs, which "
      "stopped on one flat over 3 evaluations and 25% more of its own FLOPs), at 90% of "
      "joint_grpo's gain (mean over domains): split-then-merge needs 3.3% fewer FLOPs"), line
  table = format_table(rep)
  head = "Where the frontier differs with MOPD stopped on a curve flat over 3 evaluations, replayed"
  assert head in table
  assert "cheapest expert stop per seed" in table.split(head)[1]
  # Where the rules agree (half of joint GRPO's gain, .4, met at index 7 under both), one line
  # says so and no table repeats the frontier.
  same = build_report(list(spanned.values()), bootstrap=0, levels=(0.5,), target_fraction=0.5,
                      flat_rule=dict(rule, ran=0.25, replay=0.0))
  assert ("(a) the same on each seed with MOPD stopped on a curve flat over 3 evaluations "
          "(replayed on the same runs, which stopped on one flat over 3 evaluations and 25% more "
          "of its own FLOPs)") in same["verdicts"]
  assert "Where the frontier differs" not in format_table(same)


def test_no_two_arms_of_a_panel_are_drawn_alike(tmp_path, monkeypatch):
  """A four-domain study with its teachers' arms draws 14 lines in one panel: past the ten
  default colours the next arms change line style and marker, so no two labelled lines match."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib.axes import Axes  # pylint: disable=import-outside-toplevel
  drawn, plot = [], Axes.plot

  def spy(self, *args, **kw):
    lines = plot(self, *args, **kw)
    if kw.get("label") and kw.get("marker") == lines[0].get_marker():
      drawn.append((kw["label"], lines[0].get_color(), lines[0].get_linestyle(),
                    lines[0].get_marker()))
    return lines

  monkeypatch.setattr(Axes, "plot", spy)
  base = _arms()
  arms = base + [dataclasses.replace(base[2], arm=f"arm_{i}") for i in range(11)]
  rep = build_report(arms, bootstrap=0)
  write_report(rep, arms, str(tmp_path))
  labels = [d[0] for d in drawn]
  assert sorted(labels) == sorted(a.arm for a in arms)
  assert len({d[1:] for d in drawn}) == len(arms) == 14
  assert {d[2] for d in drawn} == {"-", "--"}


def test_the_claims_block_lists_each_claims_verdicts_across_reports():
  """docs/study.md's "Where each claim stands": per claim, each report's lines that measure it,
  (a) on the reference's gain only, (d) with its degradation; a claim none measures says so."""
  from smjax.study.render import claims_markdown  # pylint: disable=import-outside-toplevel
  two = {"seeds": [0, 1, 2, 3, 4], "interval": "seeds", "reference_arm": "joint_grpo",
         "verdicts": ["(a) at 90% of joint_grpo's gain (mean over domains): A",
                      "(a) at 90% of the better route's gain (mean over domains): B",
                      "(b) distillation cost C", "Intervals: x"]}
  one = {"seeds": [0], "interval": "prompts", "reference_arm": "joint_grpo",
         "verdicts": ["(d) the degradation (D)", "(d) to recover the degraded domain: E",
                      "Collapsed (F)"]}
  md = claims_markdown([("two", two), ("one", one)])
  blocks = {b[2:5]: b for b in re.split(r"\n\n(?=\*\*\()", md.strip())}
  assert list(blocks) == ["(a)", "(b)", "(c)", "(d)"]
  assert "- `two` (seeds 0-4; t intervals over seeds):\n  - at 90% of joint_grpo's gain (mean " \
         "over domains): A" in blocks["(a)"] and "B" not in blocks["(a)"]
  assert "`one`" not in blocks["(a)"] and "  - distillation cost C" in blocks["(b)"]
  assert blocks["(c)"].endswith("- not measured by these studies yet")
  assert ("- `one` (seed 0 only; intervals over prompts, evaluation noise only):\n"
          "  - the degradation (D)\n  - to recover the degraded domain: E") in blocks["(d)"]
  assert "Collapsed" not in md and "Intervals" not in md
