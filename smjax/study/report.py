"""The study's report: every figure with its confidence interval, and a verdict per claim.

Input is one `ArmResult` per arm and seed (what smjax.study.run produces). Every figure is computed
here, per seed, from the arms' FLOP ledgers and accuracy-vs-FLOPs curves (`seed_figures`):

- final held-out accuracy per domain and its mean (the mean of k samples per prompt at the
  training temperature), greedy pass@1 beside it, and the mean response length;
- total training FLOPs by ledger phase (eval/* and base/* excluded from the totals);
- FLOPs to first reach the matched-accuracy target (linear interpolation on the curve; +inf,
  "never reached", when the curve stays below it);
- the saving against the reference arm (joint GRPO): 1 - F_arm / F_ref, at the target and in
  total, and the final accuracy's difference from the reference;
- distillation arms: the teacher headroom captured per domain (student gain over its start /
  the domain's teacher's gain), the distillation FLOPs to capture `capture_fraction` of it, and
  (split-then-merge) those FLOPs as a share of the experts'.
Each figure is reported as its mean over seeds with a percentile-bootstrap interval over held-out
prompts and seeds (smjax.study.stats), and each claim gets a verdict line read off the intervals
(`verdicts`).

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
from smjax.study import stats


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
  # Distillation arms: the arm whose final accuracy on each domain is the teacher's (and `start`:
  # the arm the student started from), the fraction of the teachers' gain the run stops at, and
  # whether it got there before its cap (`reached`; experts: whether their stop rule, a share
  # of joint GRPO's gain, ended them before their cap).
  teachers: dict = dataclasses.field(default_factory=dict)
  start: str = "base"
  capture_fraction: float | None = None
  reached: bool | None = None

  @property
  def total_flops(self) -> float:
    return float(sum(self.flops_by_phase.values()))

  @property
  def final(self) -> dict:
    return self.curve[-1] if self.curve else {"accuracy": {}, "mean": float("nan"), "length": {}}


def captured(acc: dict, start: dict, teacher: dict) -> float | None:
  """The fraction of the teachers' gain over `start` a student with accuracy `acc` has captured,
  summed over the teachers' domains: sum(acc - start) / sum(teacher - start); None when the
  teachers have no gain to capture."""
  gain = sum(teacher[d] - start[d] for d in teacher)
  return None if gain <= 0 else sum(acc[d] - start[d] for d in teacher) / gain


def capture_rule(start: dict, teacher: dict, fraction: float):
  """An OPD phase's stop rule (run_rl's `stop_at`): True at the first curve point that has
  captured `fraction` of the teachers' gain; None (run to the cap) when there is none."""
  if captured(teacher, start, teacher) is None:
    return None
  return lambda point: captured(point["accuracy"], start, teacher) >= fraction - 1e-12


def matched_target(start: dict, reference: dict, fraction: float) -> float:
  """The report's matched target from final accuracies ({domain: acc}): the start's mean plus
  `fraction` of the reference arm's gain over it (seed_figures computes it the same way)."""
  return _mean(start) + fraction * (_mean(reference) - _mean(start))


def target_rule(start: dict, reference: dict, fraction: float):
  """run_rl's `stop_at` for an arm that must reach the matched target: True at the first curve
  point whose mean accuracy is at or above it; None (no rule) when the reference gained nothing
  over `start`, so that the target is no mark to reach."""
  if _mean(reference) <= _mean(start):
    return None
  target = matched_target(start, reference, fraction)
  return lambda point: _mean(point["accuracy"]) >= target - 1e-12


def expert_rule(domain: str, start: dict, reference: dict, fraction: float):
  """An expert's stop rule: True at the first curve point where its own domain has gained
  `fraction` of the reference arm's (joint GRPO's) final gain on that domain over `start`; None
  (run to the cap) with fraction 0 or when the reference gained nothing there."""
  gain = reference[domain] - start[domain]
  if fraction <= 0 or gain <= 0:
    return None
  level = start[domain] + fraction * gain
  return lambda point: point["accuracy"][domain] >= level - 1e-12


def all_rules(*rules):
  """The stop rule that holds when every given rule (None: no rule) holds; None when none given."""
  rules = [r for r in rules if r is not None]
  return (lambda point: all(r(point) for r in rules)) if rules else None


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


def _mean(acc: dict) -> float:
  return float(np.mean(list(acc.values()))) if acc else math.nan


def _reach(xs, target) -> float:
  f = flops_to_reach(xs, target)
  return math.inf if f is None else f


def _saving(f_arm: float, f_ref: float) -> float:
  with np.errstate(divide="ignore", invalid="ignore"):
    return float(1 - np.float64(f_arm) / np.float64(f_ref)) if f_ref else math.nan


def seed_figures(arms: dict[str, ArmResult], idx, *, target_fraction: float,
                 reference_arm: str | None, recover_domain: str | None,
                 target: float | None = None) -> dict[str, float]:
  """Every figure of one seed's arms (`arms`: {name: ArmResult}) with the held-out prompts `idx`
  ({domain: indices}, smjax.study.stats): {"<arm>|<figure>": value}, +inf for a target never
  reached, nan where a figure is undefined."""
  acc = {n: stats.curve_values(a.curve, idx) for n, a in arms.items()}
  greedy = {n: stats.curve_values(a.curve, idx, source="greedy") for n, a in arms.items()}
  length = {n: stats.curve_values(a.curve, idx, source="length") for n, a in arms.items()}
  final = {n: v[-1] if v else {} for n, v in acc.items()}
  out: dict[str, float] = {}
  if target is None:
    main = [n for n, a in arms.items() if a.group == "main" and a.curve and a.flops_by_phase]
    pool = [reference_arm] if reference_arm in arms else ([] if reference_arm else main)
    if pool:
      ref_final = float(np.mean([_mean(final[n]) for n in pool]))
      target = (target_fraction * ref_final if "base" not in arms
                else _mean(final["base"]) + target_fraction * (ref_final - _mean(final["base"])))
  rec_target = None
  # Without a recover domain (hand-made recovery arms on several domains) they are scored on the
  # mean, against the target they carry.
  on_rec = recover_domain is not None
  routes = [a for a in arms.values() if a.group == "recovery" and a.teachers] if on_rec else []
  if routes and routes[0].start in arms and routes[0].teachers[recover_domain] in arms:
    r = routes[0]
    lo, hi = final[r.start][recover_domain], final[r.teachers[recover_domain]][recover_domain]
    rec_target = lo + r.capture_fraction * (hi - lo)
  elif any(a.target is not None for a in arms.values() if a.group == "recovery"):
    rec_target = next(a.target for a in arms.values() if a.target is not None)

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
    tgt = target if a.group == "main" else (rec_target if a.target is not None else None)
    ref = reference_arm if a.group == "main" else "recover_grpo"
    if a.flops_by_phase:
      f["flops_total"] = a.total_flops
      for p, v in a.flops_by_phase.items():
        f[f"flops/{p}"] = v
      if tgt is not None:
        f["target"] = tgt
        f["flops_to_target"] = _reach(xs(name), tgt)
        if ref in arms and arms[ref].flops_by_phase and ref != name:
          f["saving_at_target"] = _saving(f["flops_to_target"], _reach(xs(ref), tgt))
          f["saving_total"] = _saving(a.total_flops, arms[ref].total_flops)
          f["accuracy_vs_reference"] = scored(name, final[name]) - scored(ref, final[ref])
          f["length_vs_reference"] = f["response_length"] - (
              _mean(length[ref][-1]) if a.group == "main" or not on_rec else
              length[ref][-1].get(recover_domain, math.nan))
    if a.teachers and all(t in arms for t in a.teachers.values()) and a.start in arms:
      start = {d: final[a.start][d] for d in a.teachers}
      teacher = {d: final[t][d] for d, t in a.teachers.items()}
      for d in a.teachers:
        gain = teacher[d] - start[d]
        f[f"headroom/{d}"] = (final[name][d] - start[d]) / gain if gain > 0 else math.nan
      got = captured(final[name], start, teacher)
      f["headroom_mean"] = math.nan if got is None else got
      if a.capture_fraction is not None and captured(teacher, start, teacher) is not None:
        frac = [(p["flops"], captured(v, start, teacher)) for p, v in zip(a.curve, acc[name])]
        f["distill_flops_to_capture"] = _reach(frac, a.capture_fraction) - a.curve[0]["flops"]
        if a.expert_flops:
          f["distillation_share"] = f["distill_flops_to_capture"] / a.expert_flops
    if a.expert_flops:
      f["distillation_share_run"] = a.distill_flops / a.expert_flops
    out |= {f"{name}|{k}": v for k, v in f.items()}
  if target is not None:
    out["_study|target"] = target
  if rec_target is not None:
    out["_study|recover_target"] = rec_target
  return out


def build_report(arms: Sequence[ArmResult], *, target: float | None = None,
                 target_fraction: float = 0.9, reference_arm: str | None = "joint_grpo",
                 recover_domain: str | None = None, bootstrap: int = 1000,
                 confidence: float = 0.95, seed: int = 0) -> dict:
  """The report dict: {"arms": {name: {figure: summary}}, "verdicts": [...], ...}.

  `target` (main arms), when not given, is set per seed: the base's final mean held-out accuracy
  plus target_fraction of the reference arm's gain over it (without a base arm: target_fraction
  x the reference's final accuracy; without a reference arm: the mean over all main arms), and
  recomputed in every bootstrap replicate. Recovery arms share the target their routes stopped
  at: the degraded accuracy plus their capture_fraction of the gap to their teacher; their
  savings are against `recover_grpo`. `bootstrap` replicates (0: point estimates only) at
  `confidence`, drawn with numpy seed `seed` (smjax.study.stats).
  """
  rec_d = recover_domain_of(arms, recover_domain)
  by_seed: dict[int, dict[str, ArmResult]] = {}
  for a in arms:
    by_seed.setdefault(a.seed, {})[a.arm] = a
  names = list(dict.fromkeys(a.arm for a in arms))
  if target is None and reference_arm and not any(a.arm == reference_arm for a in arms):
    if any(a.group == "main" and a.flops_by_phase for a in arms):
      raise ValueError(f"build_report: no target given and no {reference_arm!r} arm among "
                       f"{sorted(names)}")
  prompts = {s: stats.prompt_counts([a.curve for a in seed_arms.values()])
             for s, seed_arms in by_seed.items()}
  rng = np.random.default_rng(seed)
  reps = stats.draws(prompts, bootstrap, rng) if bootstrap and all(prompts.values()) else []
  per_seed = lambda s, idx: seed_figures(  # noqa: E731
      by_seed[s], idx, target_fraction=target_fraction, reference_arm=reference_arm,
      recover_domain=rec_d, target=target)
  summary = stats.summarise(per_seed, stats.identity(prompts), reps, confidence)
  out = {"reference_arm": reference_arm, "recover_domain": rec_d, "confidence": confidence,
         "bootstrap": len(reps), "seeds": sorted(by_seed), "arms": {}}
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
        "reference": (reference_arm if runs[0].group == "main" else "recover_grpo"),
        "reached_stop_rule": [r.reached for r in runs if r.reached is not None],
        "notes": sorted({r.note for r in runs if r.note})}
  for key, field in (("target", "target_accuracy"), ("recover_target", "recover_target")):
    v = summary.get(f"_study|{key}")
    out[field] = None if v is None else stats.jsonable(v)
  out["verdicts"] = verdicts(out)
  return out


def _pct(v: dict, signed: bool = False) -> str:
  """"31.0% [18.2, 44.1]" from a summary (fractions)."""
  fmt = (lambda x: f"{100 * x:+.1f}") if signed else (lambda x: f"{100 * x:.1f}")
  m, lo, hi = (stats.number(v.get(k)) for k in ("mean", "lo", "hi"))
  if math.isnan(m):
    return "n/a"
  s = "never" if math.isinf(m) else fmt(m) + "%"
  if not (math.isnan(lo) and math.isnan(hi)):
    s += f" [{_bound(lo, fmt)}, {_bound(hi, fmt)}]"
  return s


def _bound(x: float, fmt) -> str:
  return "-inf" if x == -math.inf else "inf" if x == math.inf else "?" if math.isnan(x) else fmt(x)


def _side(v: dict) -> int:
  """+1 when the interval lies above 0, -1 below, 0 when it holds 0 or is missing."""
  lo, hi = stats.number(v.get("lo")), stats.number(v.get("hi"))
  if math.isnan(lo) or math.isnan(hi):
    return 0
  return 1 if lo > 0 else -1 if hi < 0 else 0


def verdicts(report: dict) -> list[str]:
  """One line per claim the report can speak to, read off the intervals."""
  arms, conf = report["arms"], f"{100 * report['confidence']:.0f}%"
  lines = []
  ref = report.get("reference_arm") or "the reference"
  for name, what in (("split_merge", "split-then-merge"), ("external_opd", "external-teacher OPD")):
    a = arms.get(name)
    if not a or "saving_at_target" not in a:
      continue
    s = a["saving_at_target"]
    side = _side(s)
    if math.isinf(stats.number(a["flops_to_target"]["mean"])):
      lines.append(f"{what} never reached {ref}'s matched target")
    elif side > 0:
      lines.append(f"{what} reaches {ref}'s matched target with {_pct(s)} fewer FLOPs")
    elif side < 0:
      neg = {k: (-stats.number(v) if k in ("mean", "lo", "hi") else v) for k, v in s.items()}
      neg["lo"], neg["hi"] = neg["hi"], neg["lo"]
      lines.append(f"{what} needs {_pct(neg)} more FLOPs than {ref} to reach its matched target")
    else:
      lines.append(f"{what} vs {ref}, FLOPs to the matched target: not distinguishable at this "
                   f"resolution (saving {_pct(s)})")
    d = a.get("accuracy_vs_reference")
    if d:
      lines.append(f"{what} final accuracy vs {ref}: {_pct(d, signed=True).replace('%', '')} "
                   "points" + ("" if _side(d) else " (not distinguishable)"))
  sm = arms.get("split_merge", {})
  if "distillation_share" in sm:
    share = sm["distillation_share"]
    if math.isinf(stats.number(share["mean"])):
      lines.append("distillation did not capture its target share of the experts' gain before "
                   f"its cap (it spent {_pct(sm.get('distillation_share_run', {}))} of the "
                   "experts' FLOPs)")
    else:
      lines.append(f"distillation cost {_pct(share)} of the experts' FLOPs to capture its target "
                   f"fraction of their gain; teacher headroom captured {_pct(sm['headroom_mean'])}")
  ext = arms.get("external_opd", {})
  if "length_vs_reference" in ext:
    d = ext["length_vs_reference"]
    m, lo, hi = (stats.number(d.get(k)) for k in ("mean", "lo", "hi"))
    ci = "" if math.isnan(lo) and math.isnan(hi) else f" [{lo:+.1f}, {hi:+.1f}]"
    if not math.isnan(m):  # nan: a curve without lengths
      lines.append(f"external-teacher OPD answers are {m:+.1f} tokens{ci} vs {ref}"
                   + ("" if _side(d) else " (not distinguishable)"))
  rs, rg = arms.get("recover_self", {}), arms.get("recover_grpo", {})
  if "saving_at_target" in rs and rg:
    s = rs["saving_at_target"]
    lines.append("self-teacher OPD vs GRPO, FLOPs to recover: " + (
        f"{_pct(s)} fewer" if _side(s) > 0 else f"saving {_pct(s)}, " + (
            "GRPO cheaper" if _side(s) < 0 else "not distinguishable at this resolution")))
  return [f"{line} ({conf} intervals)" for line in lines]
