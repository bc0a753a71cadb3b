"""The study's report: every figure with its confidence interval, and a verdict per claim.

Input is one `ArmResult` per arm and seed (what smjax.study.run produces). Every figure is computed
here, per seed, from the arms' FLOP ledgers and accuracy-vs-FLOPs curves on the report set
(`seed_figures`; the stop rules read another set, smjax.study.rules):

- each route's compute frontier (claims (a), (b)): for each accuracy level (a share of the
  reference arm's gain over the base, on the mean over domains and with every domain at its own
  level) the reference's first passage, and split-then-merge's cheapest: the minimum over the
  experts' checkpoint sets of their FLOPs plus MOPD's first passage, with that set's
  distillation share and the evaluation bracket each passage was interpolated in;
- final held-out accuracy per domain and its mean (the mean of k samples per prompt at the
  training temperature), greedy pass@1 beside it, and the mean response length;
- total training FLOPs by ledger phase (eval/* and base/* excluded from the totals);
- FLOPs to first reach the target (the frontier's `target_fraction` level, linear interpolation on
  the curve), and the saving against the reference arm at it, 1 - F_arm / F_ref; a level a curve
  does not reach is censored at the arm's last FLOPs (`stats.Bound`: "at least"), not infinite;
- distillation arms: the teacher headroom captured per domain (student gain over its start / its
  teacher's gain, the teacher read where it was stopped).
Each figure is reported as its mean over seeds with its interval (Student's t over seeds, or with
one seed a percentile bootstrap over held-out prompts: smjax.study.stats), and each claim gets a
verdict line read off the intervals, with how many seeds agree (smjax.study.verdicts).

The self-teacher study's "recovery" arms are scored on the recovered domain only (recover_* are
evaluated on it alone), so every recovery figure is read on that domain for every recovery arm,
the `degrade` arm included, although `degrade` is evaluated on every domain.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from smjax.ledger import flops_to_reach
from smjax.study import rules, stats
from smjax.study.rules import captured, mean_accuracy as _mean, stop_accuracy
from smjax.study.verdicts import recovery_suffix, verdicts
from smjax.train.loop import first_hold, run_on_end


@dataclasses.dataclass
class ArmResult:
  arm: str
  seed: int
  curve: list[dict]                    # {"flops", "accuracy": {domain: acc}, "mean", "length"}
  flops_by_phase: dict[str, float]     # training phases only
  expert_flops: float = 0.0            # split-then-merge: FLOPs of the experts (in the totals)
  distill_flops: float = 0.0           # split-then-merge / OPD arms: FLOPs of the distillation
  note: str = ""
  group: str = "main"                  # "main" arms share each seed's matched target;
  target: float | None = None          # "recovery" arms (self-teacher study) carry their own
  # Distillation arms: the arm that was the teacher on each domain (read where `experts_at` says
  # it was stopped, else at its end; `start`: the arm the student started from), the fraction of
  # the teachers' gain the run stops at, and whether it met its stop rule before its cap
  # (`reached`; experts: whether they crossed their last bar of joint GRPO's gain).
  teachers: dict = dataclasses.field(default_factory=dict)
  start: str = "base"
  capture_fraction: float | None = None
  reached: bool | None = None
  # Split-then-merge: where each expert was stopped for this arm's teachers ({domain: {"at": a
  # bar of experts.bars or "final", "step", "flops"}}); experts: the checkpoints they kept
  # ({bar: {"step", "flops", ...}}).
  experts_at: dict = dataclasses.field(default_factory=dict)
  # The run's policy collapsed and the run ended there ({"step", "what"}; smjax.train.guards):
  # an outcome of the route, reported; the arm's curve ends at the collapse.
  collapsed: dict | None = None
  # An arm run on to its cap past its stop rule (config.external.to_cap): where the rule and its
  # run-on would have ended it ({"index" of that curve point, "step", "flops_by_phase" then});
  # the report reads it there too, as the arm "<arm>@rule" (`rule_views`).
  rule_end: dict | None = None

  @property
  def total_flops(self) -> float:
    return float(sum(self.flops_by_phase.values()))

  @property
  def final(self) -> dict:
    return self.curve[-1] if self.curve else {"accuracy": {}, "mean": float("nan"), "length": {}}


def recover_domain_of(arms: Sequence[ArmResult], recover_domain: str | None = None) -> str | None:
  """The domain the recovery arms are scored on (config.self_teacher.recover_domain).

  Given: checked against every recovery arm's curve. Not given: the one domain every recovery
  arm's curve points share (recover_* are evaluated on it alone, `degrade` on every domain);
  None without recovery arms or when they share several domains (then the mean is used).
  """
  rec = [a for a in arms if a.group == "recovery" and a.curve]
  if not rec:
    return None
  if recover_domain is not None:
    for a in rec:
      bad = [p["accuracy"] for p in a.curve if recover_domain not in p["accuracy"]]
      if bad:
        raise ValueError(f"recovery arm {a.arm!r} (seed {a.seed}): a curve point has accuracy "
                         f"on {sorted(bad[0])}, expected {recover_domain=} among them")
    return recover_domain
  shared = set.intersection(*(set(p["accuracy"]) for a in rec for p in a.curve))
  return shared.pop() if len(shared) == 1 else None


def _at_step(arm: ArmResult, values: list[dict], step) -> dict:
  """`values` (one per curve point) at the last point evaluated after `step` steps; the final
  one when `step` is None or not on the curve."""
  at = [v for p, v in zip(arm.curve, values) if step is not None and p.get("step") == step]
  return at[-1] if at else values[-1]


def _teachers(arm: ArmResult, arms: dict, values: dict) -> dict:
  """{domain: accuracy} of a distillation arm's teachers, each on its own domain and read where
  it was stopped for this arm (`experts_at`), from `values` ({arm name: one {domain: accuracy}
  per curve point})."""
  return {d: _at_step(arms[t], values[t], (arm.experts_at.get(d) or {}).get("step"))[d]
          for d, t in arm.teachers.items()}


def _reach(xs, target):
  """First passage of `xs` ([(flops, value)]) at `target`: its FLOPs; censored at the curve's last
  FLOPs (a `stats.Bound`, at least that) when the curve stays below; nan for an empty curve."""
  if not xs:
    return math.nan
  f = flops_to_reach(xs, target)
  return stats.Bound(float(xs[-1][0]), +1) if f is None else f


def _bracket(xs, target) -> float:
  """The width of the evaluation interval a first passage was interpolated in, as a share of
  the passage's FLOPs (0 when the curve starts above; nan when never reached)."""
  f = flops_to_reach(xs, target) if xs else None
  if f is None:
    return math.nan
  prev = None
  for x, a in xs:
    if a >= target:
      return 0.0 if prev is None or f <= 0 else (x - prev) / f
    prev = x
  return math.nan


def _saving(f_arm, f_ref):
  """1 - F_arm / F_ref, carrying censoring: an arm censored above makes it at most that; a
  reference censored above, at least that; both censored: undefined (nan)."""
  a, r = stats.value_of(f_arm), stats.value_of(f_ref)
  if not r or math.isnan(a) or math.isnan(r):
    return math.nan
  v = 1.0 - a / r
  side_a, side_r = stats.side_of(f_arm), stats.side_of(f_ref)
  if side_a and side_r:
    return math.nan
  return stats.Bound(v, -side_a or side_r) if (side_a or side_r) else v


def _shift(x, by: float, scale: float = 1.0):
  """(x - by) / scale, keeping a Bound's side."""
  v = (stats.value_of(x) - by) / scale
  return stats.Bound(v, stats.side_of(x)) if stats.side_of(x) else v


def _cheapest(values: dict):
  """The smallest of {label: FLOPs or Bound}: (label, value); a lower bound when a censored
  route's bound is below every exact one (it might be cheaper still)."""
  label = min(values, key=lambda k: (stats.value_of(values[k]), stats.side_of(values[k])))
  return label, values[label]


def levels_of(start: dict, reference: dict, level: float) -> dict:
  """Per-domain accuracy levels: start + `level` x (reference - start), {domain: float}."""
  return {d: start[d] + level * (reference[d] - start[d]) for d in start}


def split_sets(arms) -> list[str]:
  """The split-then-merge arms of one seed (one per expert checkpoint set), by name."""
  return [n for n, a in arms.items() if n == SPLIT or n.startswith(SPLIT + "@")]


SPLIT = "split_merge"


def seed_figures(arms: dict[str, ArmResult], idx, *, target_fraction: float,
                 reference_arm: str | None, recover_domain: str | None,
                 target: float | None = None, levels: Sequence[float] = (),
                 replayed: dict | None = None) -> dict:
  """Every figure of one seed's arms (`arms`: {name: ArmResult}) with the held-out prompts `idx`
  ({domain: indices}, smjax.study.stats): {"<arm>|<figure>": value}; a first passage the arm
  did not reach is censored (`stats.Bound`), nan marks a figure that is undefined.

  The frontier (`levels`, fractions of the reference arm's gain; needs a base and the reference)
  is under "_frontier|<mode>/<level>/<figure>": for mode "mean" the level is the base's mean plus
  that share of the reference's mean gain, for "every" each domain must reach its own level
  (base_d plus that share of the reference's gain on d); modes "mean_best" and "every_best" read
  the levels as shares of the better route's gain instead (the higher final mean of the
  reference and any split-then-merge set; per domain, the higher final on d), so that neither
  route's end caps the other; figures "joint" (the reference's first
  passage), "split" (the cheapest split-then-merge set's first passage: experts' FLOPs at its
  checkpoints plus distillation; a set whose distillation met its stop rule, its curve flat,
  below the level is no candidate, one cut at its cap is, censored), "saving" (1 - split /
  joint), "distillation_share" (that set's distillation FLOPs over its experts'),
  "joint_bracket" / "split_bracket" (the evaluation interval each passage was interpolated in, as
  a share of its FLOPs), "grid_step" (how far below the figure the experts one bar down start,
  as a share of it: `_grid_step`), "saving_finer_bars" (the saving with the figure lowered by
  that step: the most that expert stops between the bars could show, if a stop below the next
  bar down gets there no cheaper), "set" (which set, as its index in `split_sets`),
  "capture_needed" / "capture_reached" (a censored figure on the mean: the share of its
  teachers' gain the chosen set's student would need to reach the level, and had: `_capture_gap`).
  `replayed` ({set: (end, reached)}, `replay_distillation`): the same figures again under modes
  "<mode>:replayed", each set's distillation cut where it would have ended under another flat
  rule (end None: it would have run past its record, read as it stands and censored there)."""
  acc = {n: stats.curve_values(a.curve, idx) for n, a in arms.items()}
  greedy = {n: stats.curve_values(a.curve, idx, source="greedy") for n, a in arms.items()}
  length = {n: stats.curve_values(a.curve, idx, source="length") for n, a in arms.items()}
  final = {n: v[-1] if v else {} for n, v in acc.items()}
  out: dict = {}
  if target is None:
    main = [n for n, a in arms.items() if a.group == "main" and a.curve and a.flops_by_phase]
    pool = [reference_arm] if reference_arm in arms else ([] if reference_arm else main)
    if pool:
      ref_final = float(np.mean([_mean(final[n]) for n in pool]))
      target = (target_fraction * ref_final if "base" not in arms
                else _mean(final["base"]) + target_fraction * (ref_final - _mean(final["base"])))
  # Each degradation's routes share a target (one per depth: recovery_suffix). Without a recover
  # domain (hand-made recovery arms on several domains) they are scored on the mean, against the
  # target they carry.
  on_rec = recover_domain is not None
  rec_targets: dict[str, float] = {}
  for a in arms.values():
    sfx = recovery_suffix(a.arm)
    if a.group != "recovery" or a.target is None or sfx in rec_targets:
      continue
    if on_rec and a.teachers and a.start in arms and a.teachers[recover_domain] in arms:
      lo, hi = final[a.start][recover_domain], final[a.teachers[recover_domain]][recover_domain]
      rec_targets[sfx] = lo + a.capture_fraction * (hi - lo)
    else:
      rec_targets[sfx] = a.target

  def scored(name, point_acc):
    return (point_acc.get(recover_domain, math.nan) if arms[name].group == "recovery" and on_rec
            else _mean(point_acc))

  def xs(name):
    return [(p["flops"], scored(name, a)) for p, a in zip(arms[name].curve, acc[name])]

  for name, a in arms.items():
    f = {}
    for d, v in final[name].items():
      f[f"accuracy/{d}"] = v
    for d, v in (greedy[name][-1] if greedy[name] else {}).items():
      f[f"greedy/{d}"] = v
    f["accuracy_mean"] = _mean(final[name])
    if greedy[name] and greedy[name][-1]:
      f["greedy_mean"] = _mean(greedy[name][-1])
    lens = length[name][-1] if length[name] else {}
    f["response_length"] = (lens.get(recover_domain, math.nan) if a.group == "recovery" and on_rec
                            else _mean(lens))
    if recover_domain is not None and recover_domain in final[name]:
      f["accuracy_recover_domain"] = final[name][recover_domain]
    sfx = recovery_suffix(name) if a.group == "recovery" else ""
    tgt = target if a.group == "main" else (rec_targets.get(sfx) if a.target is not None else None)
    ref = reference_arm if a.group == "main" else "recover_grpo" + sfx
    if a.flops_by_phase:
      f["flops_total"] = a.total_flops
      for p, v in a.flops_by_phase.items():
        f[f"flops/{p}"] = v
      if tgt is not None:
        f["target"] = tgt
        f["flops_to_target"] = _reach(xs(name), tgt)
        if ref in arms and arms[ref].flops_by_phase and ref != name:
          f["saving_at_target"] = _saving(f["flops_to_target"], _reach(xs(ref), tgt))
          f["accuracy_vs_reference"] = scored(name, final[name]) - scored(ref, final[ref])
          f["length_vs_reference"] = f["response_length"] - (
              _mean(length[ref][-1]) if a.group == "main" or not on_rec else
              length[ref][-1].get(recover_domain, math.nan))
        if name == "recover_self" + sfx and "recover_external" + sfx in arms:
          # Claim (d) speaks of distillation FLOPs: the self teacher against the external one.
          f["saving_vs_external"] = _saving(f["flops_to_target"],
                                            _reach(xs("recover_external" + sfx), tgt))
    if a.teachers and all(t in arms for t in a.teachers.values()) and a.start in arms:
      start = {d: final[a.start][d] for d in a.teachers}
      # A checkpoint set's teachers are the experts where they were stopped, not their ends.
      teacher = _teachers(a, arms, acc)
      for d in a.teachers:
        gain = teacher[d] - start[d]
        f[f"headroom/{d}"] = (final[name][d] - start[d]) / gain if gain > 0 else math.nan
      got = captured(final[name], start, teacher)
      f["headroom_mean"] = math.nan if got is None else got
    if a.expert_flops:
      f["distillation_share_run"] = a.distill_flops / a.expert_flops
    if a.flops_by_phase and len(a.curve) > 1:
      # The best checkpoint: chosen on the stop set, measured on the report set (as a user who
      # keeps the best evaluation would, without choosing it on the prompts it is reported on).
      best = max(range(len(a.curve)), key=lambda i: scored(name, stop_accuracy(a.curve[i])))
      f["best_accuracy"] = scored(name, acc[name][best])
      f["best_flops"] = float(a.curve[best]["flops"])
    out |= {f"{name}|{k}": v for k, v in f.items()}
  if target is not None:
    out["_study|target"] = target
  for sfx, t in rec_targets.items():
    out[f"_study|recover_target{sfx}"] = t
  sets = split_sets(arms)
  # The frontier compares two routes: a split-then-merge arm as the reference has none to face.
  if levels and "base" in arms and reference_arm in arms and sets and reference_arm not in sets:
    out |= _frontier(arms, acc, final, sets, reference_arm, levels)
    if replayed:
      out |= _frontier(arms, acc, final, sets, reference_arm, levels, replayed)
  return out


def _frontier(arms, acc, final, sets, reference_arm, levels, replayed=None) -> dict:
  """seed_figures' "_frontier|..." figures (its docstring); with `replayed`, under the modes
  "<mode>:replayed", the sets' curves cut where `replayed` says."""
  out = {}
  suffix = ":replayed" if replayed else ""
  # Each set's distillation as it ran, or as it would have run under the replayed rule: its
  # curve's points up to its end there, whether that rule stopped it, and whether the run would
  # have gone on past its record (then it stays a candidate, censored where its record ends).
  view = {n: (len(arms[n].curve), bool(arms[n].reached), False) for n in sets}
  if replayed:
    view = {n: (len(arms[n].curve) if replayed[n][0] is None else replayed[n][0] + 1,
                replayed[n][1], replayed[n][0] is None) for n in sets}
  base, ref = final["base"], final[reference_arm]
  doms = sorted(base)
  # The levels' top, read two ways: joint GRPO's end (modes "mean", "every": the paper's
  # "comparable to joint GRPO"), and the better route's end ("mean_best", "every_best": on the
  # mean, the higher final mean of joint GRPO and any split-then-merge set; per domain, the
  # higher final on that domain), so that a route ending above joint GRPO is not capped at 100 %.
  ends = [ref] + [final[n] for n in sets if final[n]]
  best = {d: max(e[d] for e in ends) for d in doms}
  tops = {"mean": ref, "every": ref, "mean_best": max(ends, key=_mean), "every_best": best}
  if _mean(ref) <= _mean(base):   # the reference gained nothing: no level to reach
    return {f"_frontier|{m}{suffix}/{lv:g}/{k}": math.nan for lv in levels for m in tops
            for k in ("joint", "split", "saving", "distillation_share", "set")}

  def curve(name, lv, mode):
    upto = view[name][0] if name in view else len(acc[name])
    pts = zip(arms[name].curve[:upto], acc[name][:upto])
    if mode.startswith("mean"):
      return [(p["flops"], _mean(v)) for p, v in pts]
    return [(p["flops"], min(v[d] - lv[d] for d in doms)) for p, v in pts]

  for level in levels:
    for mode, top in tops.items():
      lv = levels_of(base, top, level)
      mark = _mean(lv) if mode.startswith("mean") else 0.0
      key = f"_frontier|{mode}{suffix}/{level:g}/"
      joint_xs = curve(reference_arm, lv, mode)
      joint = _reach(joint_xs, mark)
      split_xs = {n: curve(n, lv, mode) for n in sets}
      reach = {n: _reach(x, mark) for n, x in split_xs.items()}
      # A set whose distillation met its stop rule (its curve went flat) below the level does not
      # get there: it is no candidate. One that stopped at its cap still rising might: it stays,
      # censored. (If none is left, the bounds are all there is to report.)
      gets_there = {n: f for n, f in reach.items()
                    if not (stats.side_of(f) > 0 and view[n][1] and not view[n][2])}
      label, split = _cheapest(gets_there or reach)
      chosen = arms[label]
      out[key + "joint"] = joint
      out[key + "split"] = split
      out[key + "saving"] = _saving(split, joint)
      out[key + "distillation_share"] = (
          _shift(split, chosen.expert_flops, chosen.expert_flops) if chosen.expert_flops
          else math.nan)
      out[key + "joint_bracket"] = _bracket(joint_xs, mark)
      out[key + "split_bracket"] = _bracket(split_xs[label], mark)
      step = _grid_step(split, chosen, [arms[n] for n in sets])
      out[key + "grid_step"] = step
      # The saving a finer grid could show at most: the figure lowered by the whole step.
      out[key + "saving_finer_bars"] = (
          math.nan if math.isnan(step) else _saving(stats.value_of(split) * (1 - step), joint))
      out[key + "set"] = float(sets.index(label))
      out[key + "capture_needed"], out[key + "capture_reached"] = (
          _capture_gap(arms, acc, base, chosen, mark, split_xs[label])
          if stats.side_of(split) > 0 and mode.startswith("mean") else (math.nan, math.nan))
  return out


def _capture_gap(arms, acc, base, chosen: ArmResult, mark: float, xs) -> tuple[float, float]:
  """For a censored split-then-merge figure on the mean: the share of its teachers' gain (over
  the base, mean over domains, the teachers read where they were stopped) its student would
  have to capture to reach `mark`, and the share it had where its curve (`xs`) ends; nan when
  the set has no teachers to read or they gained nothing. A student that ends near its
  teachers and would need well over 100 % of their gain has a bound that is open only in
  principle."""
  if not xs or not chosen.teachers or any(t not in arms for t in chosen.teachers.values()):
    return math.nan, math.nan
  teacher = _teachers(chosen, arms, acc)
  start = _mean({d: base[d] for d in teacher})
  gain = _mean(teacher) - start
  if gain <= 0 or set(teacher) != set(base):
    return math.nan, math.nan
  return (mark - start) / gain, (xs[-1][1] - start) / gain


def _grid_step(split, chosen: ArmResult, sets: Sequence[ArmResult]) -> float:
  """How coarsely the experts' bars place split-then-merge's figure: the chosen set's expert
  FLOPs less those of the nearest set below it (the experts one bar down), as a share of the
  figure. An expert stop between the two bars pays at least the lower set's experts, so a finer
  grid there could lower the figure by this share at most. 0 when no set has cheaper experts;
  nan when the figure is censored."""
  if stats.side_of(split) or math.isnan(stats.value_of(split)) or not stats.value_of(split):
    return math.nan
  below = [a.expert_flops for a in sets if a.expert_flops < chosen.expert_flops]
  return (chosen.expert_flops - max(below)) / stats.value_of(split) if below else 0.0


def replay_distillation(seed_arms: dict[str, ArmResult], *, evals: int, tol: float,
                        ran: float, replay: float, run_on: tuple[int, float],
                        cap: int) -> dict | None:
  """Where each split-then-merge set's distillation of one seed would have ended had MOPD's flat
  rule spanned `replay` of its own FLOPs instead of `ran` (rules.Plateau's flops_fraction; with
  the same capture rule, `evals`, `tol`, run-on and step `cap` as it ran): {set: (index of the
  last point of its curve, whether the rule stopped it)}, the index None where the run would
  have gone on past what was recorded. A run's stop set does not depend on where it stops, so
  the part of a curve both rules share is the same run: the replay is exact up to its record.

  Each set's own rule is replayed first; a record it does not reproduce (its end neither where
  that rule and its run-on put it, nor at the cap or a collapse) gets no replay: None for the
  seed. None too without a base or a set."""
  sets = split_sets(seed_arms)
  base = seed_arms.get("base")
  if not sets or base is None or not base.curve:
    return None
  start = stop_accuracy(base.curve[-1])
  out = {}
  for name in sets:
    arm = seed_arms[name]
    if not arm.curve or arm.capture_fraction is None or any(
        t not in seed_arms for t in arm.teachers.values()):
      return None
    teacher = _teachers(arm, seed_arms, {t: [stop_accuracy(p) for p in seed_arms[t].curve]
                                         for t in arm.teachers.values()})

    def end(fraction):   # (stop index, end index) under the flat rule with this span
      at = first_hold(arm.curve, rules.all_rules(
          rules.capture_rule(start, teacher, arm.capture_fraction),
          rules.Plateau(evals, tol, fraction, offset=arm.expert_flops)))
      return at, (None if at is None else
                  run_on_end(arm.curve, at, *run_on, offset=arm.expert_flops))

    last = len(arm.curve) - 1
    ends_anyway = int(arm.curve[-1].get("step", -1)) >= cap or bool(arm.collapsed)
    if not ends_anyway and end(ran)[1] != last:
      return None
    stopped_at, ends_at = end(replay)
    if ends_at is not None and ends_at <= last:
      out[name] = (ends_at, True)
    else:   # no stop, or its run-on ends past the record: the cap (or a collapse) ended it
      out[name] = (last if ends_anyway else None, stopped_at is not None)
  return out


def rule_views(arms: Sequence[ArmResult]) -> list[ArmResult]:
  """`arms`, each arm run on to its cap past its stop rule (`rule_end`, config.external.to_cap)
  followed by itself as it stood where the rule and its run-on would have ended it: the arm
  "<arm>@rule", its curve cut after that point and charged the FLOPs it had spent then. The run
  is the same run up to there (the rule only reads the curve), so that is the arm the rule would
  have reported, and the report reads both ends. A run the rule never ended (`rule_end` "met"
  false) has its view all the same, equal to itself, so that both arms hold every seed; a view's
  `reached` says whether the rule ended it."""
  out = []
  for a in arms:
    out.append(a)
    end = a.rule_end
    if not end or not a.curve:
      continue
    flops = {k: float(v) for k, v in end["flops_by_phase"].items()}
    cut = min(int(end["index"]), len(a.curve) - 1) + 1
    how = (f"where its stop rule ended it (step {end['step']})" if end.get("met", True)
           else "(its rule never ended it: the run to its cap)")
    out.append(dataclasses.replace(
        a, arm=a.arm + rules.AT_RULE, curve=a.curve[:cut], flops_by_phase=flops,
        distill_flops=sum(flops.values()) if a.distill_flops else 0.0,
        reached=bool(end.get("met", True)),
        collapsed=a.collapsed if cut == len(a.curve) else None, rule_end=None,
        note=f"{a.arm} {how}"))
  return out


def build_report(arms: Sequence[ArmResult], *, target: float | None = None,
                 target_fraction: float = 0.9, reference_arm: str | None = "joint_grpo",
                 recover_domain: str | None = None, bootstrap: int = 1000,
                 confidence: float = 0.95, seed: int = 0,
                 levels: Sequence[float] = (0.5, 0.75, 0.9, 0.95),
                 flat_rule: dict | None = None) -> dict:
  """The report dict: {"arms": {name: {figure: summary}}, "frontier": {mode: {level: {figure:
  summary}, "sets": ...}}, "verdicts": [...], ...}.

  `target` (main arms), when not given, is set per seed: the base's final mean held-out accuracy
  plus target_fraction of the reference arm's gain over it (without a base arm: target_fraction
  x the reference's final accuracy; without a reference arm: the mean over all main arms), and
  recomputed in every bootstrap replicate. Recovery arms share the target their routes stopped
  at: the degraded accuracy plus their capture_fraction of the gap to their teacher; their
  savings are against `recover_grpo`. A further depth of the degradation (arms `degrade@<f>`,
  `recover_*@<f>`) is its own such group, with its own target ("recover_target@<f>") and its
  savings against `recover_grpo@<f>`. `bootstrap` replicates (0: point estimates only) at
  `confidence`, drawn with numpy seed `seed` (smjax.study.stats). `levels`: the frontier's
  accuracy levels as fractions of the reference arm's gain (seed_figures); `target_fraction`
  must be one of them when the frontier is reported (its verdicts read that level).
  `flat_rule`: `replay_distillation`'s keywords: the frontier is read again with MOPD's flat rule
  replayed at another span (modes "<mode>:replayed"; "flat_rule" in the report says which, and
  the seeds whose records it could not replay). An arm run on to its cap past its stop rule is
  reported at the rule's end too, as "<arm>@rule" (`rule_views`).
  """
  levels = tuple(float(x) for x in levels)
  arms = rule_views(arms)   # an arm run on to its cap: at its rule's end too
  if levels and target_fraction not in levels:
    raise ValueError(f"build_report: target_fraction={target_fraction} must be one of the "
                     f"frontier's levels={levels} (the verdicts read the frontier there)")
  rec_d = recover_domain_of(arms, recover_domain)
  by_seed: dict[int, dict[str, ArmResult]] = {}
  for a in arms:
    # The figures read per-prompt arrays converted once, not each replicate (stats.with_arrays).
    by_seed.setdefault(a.seed, {})[a.arm] = dataclasses.replace(
        a, curve=stats.with_arrays(a.curve))
  names = list(dict.fromkeys(a.arm for a in arms))
  if target is None and reference_arm and not any(a.arm == reference_arm for a in arms):
    if any(a.group == "main" and a.flops_by_phase for a in arms):
      raise ValueError(f"build_report: no target given and no {reference_arm!r} arm among "
                       f"{sorted(names)}")
  prompts = {s: stats.prompt_counts([a.curve for a in seed_arms.values()])
             for s, seed_arms in by_seed.items()}
  rng = np.random.default_rng(seed)
  reps = stats.draws(prompts, bootstrap, rng) if bootstrap and all(prompts.values()) else []
  replayed = ({s: replay_distillation(seed_arms, **flat_rule) for s, seed_arms in by_seed.items()}
              if flat_rule else {})
  per_seed = lambda s, idx: seed_figures(  # noqa: E731
      by_seed[s], idx, target_fraction=target_fraction, reference_arm=reference_arm,
      recover_domain=rec_d, target=target, levels=levels, replayed=replayed.get(s))
  summary = stats.summarise(per_seed, stats.identity(prompts), reps, confidence)
  out = {"reference_arm": reference_arm, "recover_domain": rec_d, "confidence": confidence,
         "bootstrap": len(reps), "seeds": sorted(by_seed), "target_fraction": target_fraction,
         "interval": ("seeds" if len(by_seed) > 1 else "prompts"), "arms": {}}
  for name in names:
    runs = [by_seed[s][name] for s in sorted(by_seed) if name in by_seed[s]]
    figs = {k.partition("|")[2]: stats.jsonable(v) for k, v in summary.items()
            if k.partition("|")[0] == name}
    nested: dict = {}
    for k, v in figs.items():
      group, sep, key = k.partition("/")
      if sep:
        nested.setdefault(group, {})[key] = v
      else:
        nested[k] = v
    out["arms"][name] = nested | {
        "group": runs[0].group, "seeds": [r.seed for r in runs],
        "reference": (reference_arm if runs[0].group == "main"
                      else "recover_grpo" + recovery_suffix(name)),
        "reached_stop_rule": [r.reached for r in runs if r.reached is not None],
        "notes": sorted({r.note for r in runs if r.note}),
        "collapsed": [{"seed": r.seed} | r.collapsed for r in runs if r.collapsed]}
  for key, field in (("target", "target_accuracy"), ("recover_target", "recover_target")):
    v = summary.get(f"_study|{key}")
    out[field] = None if v is None else stats.jsonable(v)
  for k, v in summary.items():   # a further degradation's recovery target: recover_target@<f>
    if k.startswith("_study|recover_target@"):
      out[k.partition("|")[2]] = stats.jsonable(v)
  out["frontier"] = _frontier_summary(summary, by_seed)
  if flat_rule:
    out["flat_rule"] = {"ran": flat_rule["ran"], "replayed": flat_rule["replay"],
                        "evals": flat_rule["evals"],
                        "not_replayed": sorted(s for s, r in replayed.items() if r is None)}
  out["verdicts"] = verdicts(out)
  return out


def _level_key(name: str):
  arm, _, fig = name.partition("|")
  parts = fig.split("/")
  return (arm, parts[0], float(parts[1])) if arm == "_frontier" and len(parts) == 3 else (arm,)


def _frontier_summary(summary: dict, by_seed: dict) -> dict:
  """{mode: {level: {figure: summary}, ...}} from the "_frontier|" figures; "set" becomes
  "sets": the cheapest split-then-merge arm per seed (in the report's seed order)."""
  out: dict = {}
  seeds = sorted(by_seed)
  for k, v in sorted(summary.items(), key=lambda kv: _level_key(kv[0])):
    arm, _, fig = k.partition("|")
    if arm != "_frontier":
      continue
    mode, level, name = fig.split("/")
    at = out.setdefault(mode, {}).setdefault(level, {})
    if name == "set":
      names = [split_sets(by_seed[s]) for s in seeds]
      at["sets"] = [n[int(i)] if not math.isnan(i) else None
                    for n, i in zip(names, v["per_seed"])]
    else:
      at[name] = stats.jsonable(v)
  return out
