"""The report's arithmetic against hand-computed values, and its files."""

import json
import os

import pytest

from smjax.study.report import ArmResult, build_report, curve_series, format_table, write_report


def _curve(points):
  return [{"flops": f, "accuracy": {"math": a, "code": b}, "mean": (a + b) / 2,
           "length": {"math": 3.0, "code": 5.0}} for f, a, b in points]


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


def test_report_numbers_match_hand_computation():
  rep = build_report(_arms(), target_fraction=0.9)
  assert rep["target_accuracy"] == pytest.approx(0.54)  # 0.9 x joint's final mean 0.6
  j, s, e = (rep["arms"][k] for k in ("joint_grpo", "split_merge", "external_opd"))
  # joint: 0.4 at 100, 0.6 at 200 -> 0.54 at 170.
  assert j["flops_to_target"]["mean"] == pytest.approx(170.0)
  # split: mean 0.5 at 170, 0.6 at 190 -> 0.54 at 178.
  assert s["flops_to_target"]["mean"] == pytest.approx(178.0)
  assert s["saving_vs_reference_at_target"]["mean"] == pytest.approx(1 - 178 / 170)
  assert s["flops_total"]["mean"] == 190.0 and j["flops_total"]["mean"] == 200.0
  assert s["saving_vs_reference_total"]["mean"] == pytest.approx(1 - 190 / 200)
  assert s["distillation_share_of_experts"]["mean"] == pytest.approx(40 / 150)
  assert e["flops_to_target"]["mean"] is None and e["reached_target"] == [False]
  assert s["accuracy"]["math"]["mean"] == 0.7 and s["accuracy_mean"]["mean"] == 0.6
  assert s["response_length"]["mean"] == 4.0
  table = format_table(rep)
  assert "never reached" in table and "split_merge" in table and "54.0%" in table


def test_seeds_give_mean_and_spread():
  arms = _arms(0) + _arms(1, joint_scale=2.0)
  rep = build_report(arms, target_fraction=0.9)
  j = rep["arms"]["joint_grpo"]
  assert j["flops_total"]["mean"] == 300.0 and j["flops_total"]["n"] == 2
  assert j["flops_total"]["std"] == pytest.approx(141.42, rel=1e-3)  # sample std of 200, 400
  assert j["flops_to_target"]["mean"] == pytest.approx((170 + 340) / 2)


def test_recovery_group_uses_its_own_target():
  arms = [ArmResult("recover_self", 0, _curve([(0, .1, .1), (10, .5, .5)]), {"train/teacher": 10.0},
                    group="recovery", target=0.3),
          ArmResult("recover_grpo", 0, _curve([(0, .1, .1), (100, .5, .5)]), {"train/policy": 100.0},
                    group="recovery", target=0.3)] + _arms()
  rep = build_report(arms)
  r = rep["arms"]["recover_self"]
  assert r["target_accuracy"] == 0.3 and r["flops_to_target"]["mean"] == pytest.approx(5.0)
  assert r["saving_vs_reference_at_target"]["mean"] == pytest.approx(1 - 5 / 50)
  assert "Self-teacher recovery" in format_table(rep)


def test_files_are_written(tmp_path):
  arms = _arms()
  rep = build_report(arms)
  paths = write_report(rep, arms, str(tmp_path))
  assert json.load(open(paths["json"]))["arms"]["split_merge"]["flops_total"]["mean"] == 190.0
  rows = open(paths["csv"]).read().splitlines()
  assert rows[0] == "arm,metric,mean,std,n" and any(r.startswith("split_merge,flops_to_target,178")
                                                     for r in rows)
  assert os.path.getsize(paths["plot"]) > 10_000 and open(paths["plot"], "rb").read(4) == b"\x89PNG"


def test_missing_reference_is_an_error():
  with pytest.raises(ValueError, match="no 'joint_grpo' arm"):
    build_report(_arms()[1:])


def test_base_only_study_reports_without_a_target(tmp_path):
  base = ArmResult("base", 0, _curve([(0, .3, .1)]), {})
  rep = build_report([base], reference_arm=None)
  assert rep["target_accuracy"] is None
  assert rep["arms"]["base"]["accuracy_mean"]["mean"] == pytest.approx(0.2)
  assert "matched target -," in format_table(rep)
  paths = write_report(rep, [base], str(tmp_path))
  assert open(paths["plot"], "rb").read(4) == b"\x89PNG"


def test_target_is_per_seed_base_plus_fraction_of_reference_gain():
  arms = [ArmResult("base", 0, _curve([(0, .2, .2)]), {}),
          ArmResult("base", 1, _curve([(0, .5, .5)]), {}),
          ArmResult("joint_grpo", 0, _curve([(0, .2, .2), (100, .4, .4), (200, .6, .6)]),
                    {"train/policy": 200.0}),
          ArmResult("joint_grpo", 1, _curve([(0, .5, .5), (100, .7, .7)]), {"train/policy": 100.0})]
  rep = build_report(arms, target_fraction=0.9)
  # seed 0: 0.2 + 0.9 x (0.6 - 0.2) = 0.56, reached at 100 + 100 x 0.16 / 0.2 = 180;
  # seed 1: 0.5 + 0.9 x (0.7 - 0.5) = 0.68, reached at 100 x 0.18 / 0.2 = 90.
  assert rep["target_by_seed"] == {0: pytest.approx(0.56), 1: pytest.approx(0.68)}
  assert rep["target_accuracy"] == pytest.approx(0.62)
  assert rep["arms"]["joint_grpo"]["flops_to_target"]["mean"] == pytest.approx(135.0)
  assert rep["arms"]["joint_grpo"]["reached_target"] == [True, True]


def _recovery_arms(seed=0):
  """The self-teacher arms as smjax.study.run stores them: `degrade` evaluated on both domains (its
  mean differs from its math accuracy), recover_* on the recovered domain (math) alone."""
  degrade = ArmResult("degrade", seed, [
      {"flops": 0.0, "accuracy": {"math": .60, "code": .40}, "mean": .50,
       "length": {"math": 3.0, "code": 5.0}},
      {"flops": 100.0, "accuracy": {"math": .30, "code": .70}, "mean": .50,
       "length": {"math": 2.0, "code": 6.0}}], {"train/policy": 100.0}, group="recovery")

  def math_only(points):
    return [{"flops": f, "accuracy": {"math": a}, "mean": a, "length": {"math": 4.0}}
            for f, a in points]
  return [degrade,
          ArmResult("recover_self", seed, math_only([(0, .30), (10, .50)]),
                    {"train/teacher": 10.0}, group="recovery", target=0.4),
          ArmResult("recover_grpo", seed, math_only([(0, .30), (100, .50)]),
                    {"train/policy": 100.0}, group="recovery", target=0.4)]


def test_degrade_arm_is_shown_on_the_recovered_domain(tmp_path):
  arms = _recovery_arms() + _arms()
  rep = build_report(arms)
  assert rep["recover_domain"] == "math"  # the one domain every recovery arm is scored on
  assert build_report(arms, recover_domain="math")["arms"] == rep["arms"]
  d = rep["arms"]["degrade"]
  assert d["accuracy_recover_domain"]["mean"] == pytest.approx(0.30)  # not its mean, 0.50
  assert d["accuracy_mean"]["mean"] == pytest.approx(0.50)
  assert d["response_length_recover_domain"]["mean"] == 2.0  # math only, not (2 + 6) / 2
  assert d["target_accuracy"] is None and d["flops_to_target"]["mean"] is None
  # It only sets the recovery up: no saving against recover_grpo (100 FLOPs each would say 0 %).
  assert d["saving_vs_reference_total"]["mean"] is None
  assert rep["arms"]["recover_self"]["saving_vs_reference_total"]["mean"] == pytest.approx(0.9)
  r = rep["arms"]["recover_self"]
  assert r["accuracy_recover_domain"]["mean"] == pytest.approx(0.50)
  assert r["flops_to_target"]["mean"] == pytest.approx(5.0)  # .3 -> .5 over 10: .4 at 5
  assert "accuracy_recover_domain" not in rep["arms"]["joint_grpo"]
  # The recovery table: one accuracy column, on math, for every row; degrade has no target.
  table = format_table(rep)
  recovery = table[table.index("Self-teacher recovery of math (target 40.0% on math"):]
  _, header, _, *rows = [line for line in recovery.splitlines() if line]
  assert header.split()[:3] == ["arm", "math", "acc"] and "math resp len" in header
  row = {line.split()[0]: line.split() for line in rows}
  assert row["degrade"][1] == "30.0%" and row["degrade"][-1] == "2"
  assert row["degrade"][2:4] == ["code=70.0%", "math=30.0%"]
  assert "never reached" not in row["degrade"] and "50.0%" not in row["degrade"]
  assert row["recover_self"][1] == "50.0%" and row["recover_grpo"][1] == "50.0%"
  # The plot's panels: the main one on the mean; degrade, and the recovery arms, on math.
  panels = curve_series(arms)
  assert "math" in panels["recovery"]["ylabel"] and "mean" in panels["main"]["ylabel"]
  assert "math" in panels["degrade"]["ylabel"]
  assert [arm for arm, *_ in panels["degrade"]["series"]] == ["degrade"]
  assert panels["degrade"]["series"][0][3] == pytest.approx([60.0, 30.0])
  series = {arm: ys for arm, _, _, ys in panels["recovery"]["series"]}
  assert "degrade" not in series
  assert series["recover_self"] == pytest.approx([30.0, 50.0])
  assert panels["recovery"]["targets"] == pytest.approx([0.4]) and not panels["degrade"]["targets"]
  main = {arm: ys for arm, _, _, ys in panels["main"]["series"]}
  assert main["split_merge"] == pytest.approx([20.0, 50.0, 60.0])  # (0.7 + 0.5) / 2 at the end
  paths = write_report(rep, arms, str(tmp_path))
  csv_rows = open(paths["csv"]).read().splitlines()
  assert "degrade,accuracy_recover_domain,0.3,0.0,1" in csv_rows
  assert open(paths["plot"], "rb").read(4) == b"\x89PNG"


def test_recovery_targets_are_read_on_the_given_domain():
  # A recovery arm also evaluated on code: on math (0.1 -> 0.5 over 100 FLOPs) it reaches the
  # target 0.3 at 50; its mean (0.3 -> 0.5) is at the target from the start.
  both = [{"flops": 0.0, "accuracy": {"math": .1, "code": .5}, "mean": .3},
          {"flops": 100.0, "accuracy": {"math": .5, "code": .5}, "mean": .5}]
  arm = ArmResult("recover_self", 0, both, {"train/teacher": 100.0}, group="recovery", target=0.3)
  on_math = build_report([arm], reference_arm=None, recover_domain="math")
  assert on_math["arms"]["recover_self"]["flops_to_target"]["mean"] == pytest.approx(50.0)
  on_mean = build_report([arm], reference_arm=None)  # shares two domains: the mean is used
  assert on_mean["recover_domain"] is None
  assert on_mean["arms"]["recover_self"]["flops_to_target"]["mean"] == 0.0
  with pytest.raises(ValueError, match="recover_domain='gsm8k'"):
    build_report([arm], reference_arm=None, recover_domain="gsm8k")
