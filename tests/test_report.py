"""The report's arithmetic against hand-computed values, its verdicts, its files, and the
distill-to-target stopping rule (on a scripted run_rl)."""

import dataclasses
import itertools
import json
import os
import types

import numpy as np
import pytest

from smjax.study.render import curve_series, format_table, write_report
from smjax.study.report import (ArmResult, all_rules, build_report, capture_rule, captured,
                                expert_rule, matched_target, seed_figures, target_rule, verdicts)

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
  assert _exact(s["saving_total"], 1 - 190 / 200)
  assert _exact(s["distillation_share_run"], 40 / 150)
  assert _exact(s["accuracy_vs_reference"], 0.6 - 0.6)
  assert e["flops_to_target"]["mean"] == "inf" and e["flops_to_target"]["missing"] == 1
  assert s["accuracy"]["math"]["mean"] == pytest.approx(0.7)
  assert s["accuracy_mean"]["mean"] == pytest.approx(0.6)
  assert s["greedy"]["math"]["mean"] == 1.0 and s["greedy"]["code"]["mean"] == 1.0
  assert s["response_length"]["mean"] == 4.0
  assert "saving_at_target" not in j  # the reference itself
  json.dumps(rep, allow_nan=False)
  table = format_table(rep)
  assert "split_merge" in table and "54.0%" in table and "never" in table
  assert "external-teacher OPD never reached joint_grpo's matched target (95% intervals)" in (
      rep["verdicts"])


def test_seeds_give_mean_and_spread():
  arms = _arms(0) + _arms(1, joint_scale=2.0)
  rep = build_report(arms, target_fraction=0.9, bootstrap=200)
  j = rep["arms"]["joint_grpo"]
  assert j["flops_total"]["mean"] == 300.0 and j["flops_total"]["n"] == 2
  assert j["flops_total"]["std"] == pytest.approx(141.42, rel=1e-3)  # sample std of 200, 400
  assert j["flops_to_target"]["mean"] == pytest.approx((170 + 340) / 2)
  # Over seeds drawn with replacement: between both seeds' values, wider than a point.
  f = j["flops_to_target"]
  assert 170 - 1e-9 <= f["lo"] < f["hi"] <= 340 + 1e-9


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
  assert rep["bootstrap"] == 0 and rep["target_accuracy"]["lo"] is None  # no interval


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
  assert "matched target -;" in format_table(rep)
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
  assert any(r.startswith("external_opd,flops_to_target,inf,inf,inf") for r in rows)
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


def test_expert_and_target_rules_hold_split_then_merge_to_joint_grpos_result():
  """An expert stops once its domain has gained the set share of joint GRPO's final gain there;
  MOPD once it has captured its share of the teachers' gain and is at the report's target."""
  base, joint = {"math": .2, "code": .4}, {"math": .8, "code": .9}
  rule = expert_rule("math", base, joint, 1.0)       # math: 0.8 (its own domain only)
  assert [rule({"accuracy": {"math": a, "code": 0.0}}) for a in (.5, .79, .8, .95)] == [
      False, False, True, True]
  half = expert_rule("code", base, joint, 0.5)       # code: 0.4 + 0.5 x 0.5 = 0.65
  assert not half({"accuracy": {"math": 1.0, "code": .64}}) and half({"accuracy": {"code": .65}})
  assert expert_rule("math", base, joint, 0.0) is None              # 0: the cap
  assert expert_rule("math", base, {"math": .1, "code": .9}, 1.0) is None   # no gain there
  # The matched target is the report's, per seed: base 0.3 + 0.9 x (joint 0.85 - 0.3) = 0.795.
  assert matched_target(base, joint, 0.9) == pytest.approx(0.795)
  arms = {"base": ArmResult("base", 0, _curve([(0, .2, .4)]), {}),
          "joint_grpo": ArmResult("joint_grpo", 0, _curve([(0, .2, .4), (100, .8, .9)]),
                                  {"train/policy": 100.0})}
  f = seed_figures(arms, {}, target_fraction=0.9, reference_arm="joint_grpo", recover_domain=None)
  assert f["_study|target"] == pytest.approx(matched_target(base, joint, 0.9))
  at = target_rule(base, joint, 0.9)
  assert not at({"accuracy": {"math": .7, "code": .88}}) and at({"accuracy": {"math": .7,
                                                                               "code": .89}})
  both = all_rules(capture_rule(START, TEACHER, 0.9), lambda p: p["accuracy"]["math"] >= .65)
  assert [both({"accuracy": acc}) for acc, _ in SCRIPT] == [False, False, False, False, True]
  assert target_rule(base, {"math": .3, "code": .3}, 0.9) is None     # no gain: no mark
  assert all_rules(None, None) is None and all_rules(None, at) is not None


def _distill_arms():
  """A seed's split-then-merge arm: experts' FLOPs 150, distillation from 150 on."""
  base = ArmResult("base", 0, _curve([(0, .2, .2)]), {})
  em = ArmResult("expert_math", 0, _curve([(0, .2, .2), (75, .6, .1)]), {"train/policy": 75.0})
  ec = ArmResult("expert_code", 0, _curve([(0, .2, .2), (75, .1, .6)]), {"train/policy": 75.0})
  joint = ArmResult("joint_grpo", 0, _curve([(0, .2, .2), (300, .6, .6)]), {"train/policy": 300.0})
  # Captured: 0, (.2 + .1) / .8 = .375, (.4 + .3) / .8 = .875, (.5 + .3) / .8 = 1.
  split = ArmResult("split_merge", 0, _curve([(150, .2, .2), (170, .4, .3), (190, .6, .5),
                                              (210, .7, .5)]),
                    {"train/policy": 150.0, "train/teacher": 60.0}, expert_flops=150.0,
                    distill_flops=60.0, teachers={"math": "expert_math", "code": "expert_code"},
                    capture_fraction=0.9, reached=True)
  return [base, em, ec, joint, split]


def test_distillation_flops_share_and_headroom():
  arms = _distill_arms()
  f = seed_figures({a.arm: a for a in arms}, {}, target_fraction=0.9, reference_arm="joint_grpo",
                   recover_domain=None)
  # 0.9 is crossed between 190 (.875) and 210 (1.0): 190 + 20 x .025 / .125 = 194; minus the
  # curve's start (the experts' 150).
  assert f["split_merge|distill_flops_to_capture"] == pytest.approx(44.0)
  assert f["split_merge|distillation_share"] == pytest.approx(44.0 / 150)
  assert f["split_merge|distillation_share_run"] == pytest.approx(60.0 / 150)
  # Headroom: (student - start) / (teacher - start) per domain, and the summed one.
  assert f["split_merge|headroom/math"] == pytest.approx((.7 - .2) / (.6 - .2))
  assert f["split_merge|headroom/code"] == pytest.approx((.5 - .2) / (.6 - .2))
  assert f["split_merge|headroom_mean"] == pytest.approx(1.0)
  rep = build_report(arms, bootstrap=30)
  s = rep["arms"]["split_merge"]
  assert _exact(s["distillation_share"], 44.0 / 150) and s["reached_stop_rule"] == [True]
  assert any(v.startswith("distillation cost 29.3% [29.3, 29.3] of the experts' FLOPs")
             for v in rep["verdicts"])
  # A distillation that stops short of 90 %: never, and its verdict says so.
  short = dataclasses.replace(arms[-1], curve=arms[-1].curve[:3], reached=False)
  rep = build_report(arms[:-1] + [short], bootstrap=0)
  assert rep["arms"]["split_merge"]["distillation_share"]["mean"] == "inf"
  assert any(v.startswith("distillation did not capture its target share") for v in rep["verdicts"])


def _verdict_report(lo, mean, hi):
  s = {"mean": mean, "lo": lo, "hi": hi, "n": 1}
  return {"confidence": 0.95, "reference_arm": "joint_grpo",
          "arms": {"split_merge": {"saving_at_target": s, "flops_to_target": {"mean": 100.0}}}}


def test_verdict_lines_follow_the_interval():
  assert verdicts(_verdict_report(.2, .3, .4)) == [
      "split-then-merge reaches joint_grpo's matched target with 30.0% [20.0, 40.0] fewer FLOPs "
      "(95% intervals)"]
  assert verdicts(_verdict_report(-.7, -.5, -.3)) == [
      "split-then-merge needs 50.0% [30.0, 70.0] more FLOPs than joint_grpo to reach its matched "
      "target (95% intervals)"]
  (line,) = verdicts(_verdict_report(-.1, .1, .3))
  assert "not distinguishable" in line and "saving 10.0% [-10.0, 30.0]" in line
  (line,) = verdicts(_verdict_report(0.0, .1, .3))  # touches 0: not clearly positive
  assert "not distinguishable" in line
  (line,) = verdicts(_verdict_report(.1, .3, "inf"))  # open above: still clearly positive
  assert "fewer FLOPs" in line


def test_verdicts_end_to_end():
  # split reaches 0.54 at 178 vs joint's 170 on every replicate: more FLOPs, exactly.
  rep = build_report(_arms(), bootstrap=20)
  assert any(v.startswith("split-then-merge needs 4.7% [4.7, 4.7] more FLOPs than joint_grpo")
             for v in rep["verdicts"])
  # Scaled-up joint (target reached at 340): split's 178 is 47.6% fewer.
  arms = _arms(joint_scale=2.0)
  rep = build_report(arms, bootstrap=20)
  assert any(v.startswith("split-then-merge reaches joint_grpo's matched target with 47.6% "
                          "[47.6, 47.6] fewer FLOPs") for v in rep["verdicts"])


def test_length_verdict_and_held_out_sets():
  arms = _arms(joint_scale=2.0)
  ext = arms[2]
  ext.curve = [_point(p["flops"], p["accuracy"], {"math": 9.0, "code": 7.0}) for p in ext.curve]
  # external: (9 + 7) / 2 = 8 tokens against joint's (3 + 5) / 2 = 4.
  line = "external-teacher OPD answers are +4.0 tokens [+4.0, +4.0] vs joint_grpo (95% intervals)"
  assert line in build_report(arms, bootstrap=10)["verdicts"]
  assert "external-teacher OPD answers are +4.0 tokens vs joint_grpo (not distinguishable) (95% " \
      "intervals)" in build_report(arms, bootstrap=0)["verdicts"]
  # The arms of a seed must share one held-out set.
  ext.curve[-1]["correct"]["math"] = [1] * (N + 1)
  with pytest.raises(ValueError, match="one held-out set"):
    build_report(arms)


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
      {"train/policy": 100.0}, group="recovery")
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
  assert "flops_to_target" not in d and "saving_total" not in d
  r = rep["arms"]["recover_self"]
  assert r["accuracy_recover_domain"]["mean"] == pytest.approx(0.50)
  assert _exact(r["flops_to_target"], 7.5)  # .3 -> .5 over 10: .45 at 7.5
  assert _exact(r["saving_at_target"], 1 - 7.5 / 75)  # recover_grpo: .45 at 75
  assert _exact(r["saving_total"], 0.9) and r["reference"] == "recover_grpo"
  assert r["headroom"]["math"]["mean"] == pytest.approx((.5 - .3) / (.6 - .3))
  assert "saving_at_target" not in rep["arms"]["recover_grpo"]
  assert rep["arms"]["joint_grpo"]["flops_to_target"]["mean"] == pytest.approx(170.0)
  assert any(v.startswith("self-teacher OPD vs GRPO, FLOPs to recover: 90.0% [90.0, 90.0] fewer")
             for v in rep["verdicts"])
  # The recovery table: one accuracy column, on math, for every row; degrade has no target.
  table = format_table(rep)
  recovery = table[table.index("Self-teacher recovery of math (matched target 45.0%"):]
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
  main = {arm: ys for arm, _, _, ys, _ in panels["main"]["series"]}
  assert main["split_merge"] == pytest.approx([20.0, 50.0, 60.0])  # (0.7 + 0.5) / 2 at the end
  # Every prompt has the same count: no spread over prompts, no band.
  assert all(b == 0 for *_, band in panels["main"]["series"] for b in band)
  paths = write_report(rep, arms, str(tmp_path))
  csv_rows = open(paths["csv"]).read().splitlines()
  assert "degrade,accuracy_recover_domain,0.3,0.3,0.3,0.0,1" in csv_rows
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

def test_run_rl_stops_at_the_first_point_that_meets_the_capture_rule(monkeypatch):
  """run_rl with every model piece scripted (no model, no compile): it evaluates at step 0 and
  after every step, and stops, saved, at the first point the rule accepts."""
  from smjax.train import loop as loop_lib  # pylint: disable=import-outside-toplevel
  ex = types.SimpleNamespace(domain="math", prompt="q")
  ro = loop_lib.Rollout(types.SimpleNamespace(lengths_B=np.ones(2)), [ex, ex],
                        np.array([0.0, 1.0], np.float32))
  monkeypatch.setattr(loop_lib, "rollout", lambda *a, **k: (ro, []))
  monkeypatch.setattr(loop_lib.steps_lib, "step_program_calls", lambda *a, **k: [])
  progress = loop_lib.RLProgress()

  def make_batch(_):
    progress.ledger.add_flops("train/policy", 10.0)
    return None, [], {}

  script = iter([acc for acc, _ in SCRIPT])
  evaluations, saves = [], []

  def evaluator(params):
    evaluations.append(params)
    return {"accuracy": next(script)}, []

  cfg = loop_lib.RLLoopConfig(steps=10, samples_per_prompt=2, eval_every_steps=1, progress=False)
  kw = dict(name="mopd", loop=cfg, step=lambda state, batch: (state, {"loss": 0.0, "finite": 1.0}),
            make_batch=make_batch, sampler=None, tokenizer=None, prompts=itertools.repeat([ex]),
            verify=None, evaluator=evaluator, save=lambda *a: saves.append(a[0]),
            stop_at=capture_rule(START, TEACHER, 0.9))
  res = loop_lib.run_rl(types.SimpleNamespace(params="p"), progress=progress, **kw)
  # Points at steps 0..3; SCRIPT[3] is the first at >= 90 %: stopped after step 3, saved there.
  assert res.reached and not res.stopped
  assert [p["step"] for p in res.curve] == [0, 1, 2, 3]
  assert [p["flops"] for p in res.curve] == [0.0, 10.0, 20.0, 30.0]
  assert res.curve[-1]["accuracy"] == SCRIPT[3][0] and saves == [3] and progress.step == 3
  assert res.curve[2]["mean"] == pytest.approx(0.55)
  assert res.last_metrics["reward/mean"] == 0.5
  # A resumed run whose last point met the rule returns at once: no evaluation, no step.
  n = len(evaluations)
  again = loop_lib.run_rl(types.SimpleNamespace(params="p"), progress=progress, **kw)
  assert again.reached and len(evaluations) == n and progress.step == 3 and len(again.curve) == 4
  # Without a rule it runs to its cap.
  script = iter([acc for acc, _ in SCRIPT] * 3)
  full = loop_lib.run_rl(types.SimpleNamespace(params="p"), progress=loop_lib.RLProgress(),
                         **(kw | {"stop_at": None, "make_batch": lambda _: (None, [], {})}))
  assert not full.reached and len(full.curve) == 11
