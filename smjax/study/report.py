"""The study's report: per-arm tables, FLOPs to matched accuracy, savings, JSON/CSV and a plot.

Input is one `ArmResult` per arm and seed (what smjax.study.run produces). Every figure is computed
here from the arms' FLOP ledgers and accuracy-vs-FLOPs curves:

- final held-out accuracy per domain and its mean (greedy pass@1 on the fixed held-out set);
- total training FLOPs by ledger phase (eval/* and base/* excluded from the totals);
- FLOPs to first reach the matched-accuracy target (linear interpolation on the curve; "never
  reached" when the curve stays below it);
- the saving against joint GRPO: 1 - F_arm / F_joint, at the target and in total;
- the distillation share: distillation FLOPs / the experts' FLOPs (split-then-merge arms);
- mean response length on the held-out set.
Over several seeds each number is reported as mean and sample std.

The self-teacher study's "recovery" arms are scored on the recovered domain only (recover_* are
evaluated on it alone), so every recovery figure (FLOPs to its target, the recovery table's
accuracy and length, the recovery panel of the plot) is read on that domain for every recovery
arm, the `degrade` arm included, although `degrade` is evaluated on every domain.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from typing import Sequence

import numpy as np

from smjax.ledger import flops_to_reach


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

  @property
  def total_flops(self) -> float:
    return float(sum(self.flops_by_phase.values()))

  @property
  def final(self) -> dict:
    return self.curve[-1] if self.curve else {"accuracy": {}, "mean": float("nan"), "length": {}}


def _mean_std(xs: Sequence[float | None]) -> dict:
  vals = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
  if not vals:
    return {"mean": None, "std": None, "n": 0, "missing": len(xs)}
  return {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
          "n": len(vals), "missing": len(xs) - len(vals)}


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


def _score(point: dict, domain: str | None) -> float:
  """The accuracy a curve point is compared on: `domain`'s, or the mean over domains."""
  return point["mean"] if domain is None else point["accuracy"][domain]


def _curve_xy(curve, domain: str | None = None):
  return [(p["flops"], _score(p, domain)) for p in curve]


def build_report(arms: Sequence[ArmResult], *, target: float | None = None,
                 target_fraction: float = 0.9, reference_arm: str | None = "joint_grpo",
                 recover_domain: str | None = None) -> dict:
  """The report dict.

  `target` (main arms), when not given, is set per seed: the base's final mean held-out accuracy
  plus target_fraction of the reference arm's gain over it (without a base arm: target_fraction
  x the reference's final accuracy; without a reference arm: the mean over all main arms). Seeds
  start from very different bases, so one shared target would be met before training on some
  seeds and never on others. Recovery arms use their own per-run `target`, and their savings are
  against `recover_grpo` when present; they are scored on `recover_domain` (default: inferred by
  `recover_domain_of`), which the recovery arms also get `*_recover_domain` figures for.
  """
  rec_d = recover_domain_of(arms, recover_domain)
  by_arm: dict[str, list[ArmResult]] = {}
  for a in arms:
    by_arm.setdefault(a.arm, []).append(a)
  main = [a for a in arms if a.group == "main" and a.curve and a.flops_by_phase]
  by_seed: dict[int, float] = {}
  if target is None:
    pool = by_arm.get(reference_arm, []) if reference_arm else main
    if not pool and reference_arm:
      raise ValueError(f"build_report: no target given and no {reference_arm!r} arm among "
                       f"{sorted(by_arm)}")
    bases = {a.seed: a.final["mean"] for a in by_arm.get("base", []) if a.curve}
    for seed in sorted({a.seed for a in pool}):
      final = float(np.mean([a.final["mean"] for a in pool if a.seed == seed]))
      b = bases.get(seed)
      by_seed[seed] = (target_fraction * final if b is None
                       else b + target_fraction * (final - b))
    # No trained arm at all (e.g. phases=('base',)): the report has no matched-accuracy target.
    target = float(np.mean(list(by_seed.values()))) if by_seed else None
  out = {"target_accuracy": target, "target_by_seed": by_seed, "reference_arm": reference_arm,
         "recover_domain": rec_d, "arms": {}}
  for name, runs in by_arm.items():
    group = runs[0].group
    ref_name = reference_arm if group == "main" else "recover_grpo"
    tgt_of = {r.seed: (by_seed.get(r.seed, target) if group == "main" else r.target)
              for r in runs}
    ref_runs = {a.seed: a for a in by_arm.get(ref_name, [])}
    scored_on = rec_d if group == "recovery" else None
    reach = [flops_to_reach(_curve_xy(r.curve, scored_on), tgt_of[r.seed])
             if tgt_of[r.seed] is not None and r.flops_by_phase else None for r in runs]

    def ref_reach(seed):
      ref, tgt = ref_runs.get(seed), tgt_of.get(seed)
      return (None if ref is None or tgt is None
              else flops_to_reach(_curve_xy(ref.curve, scored_on), tgt))

    # A recovery arm without a target (`degrade`, which only sets the recovery up) is not a route
    # to compare with recover_grpo.
    saving_total = [1 - r.total_flops / ref_runs[r.seed].total_flops
                    if r.seed in ref_runs and ref_runs[r.seed].total_flops and r.flops_by_phase
                    and not (group == "recovery" and tgt_of[r.seed] is None)
                    else None for r in runs]
    saving_reach = [1 - f / ref_reach(r.seed) if f is not None and ref_reach(r.seed) else None
                    for r, f in zip(runs, reach)]
    phases = sorted({p for r in runs for p in r.flops_by_phase})
    domains = sorted({d for r in runs for d in r.final["accuracy"]})
    out["arms"][name] = {
        "group": group,
        "target_accuracy": (float(np.mean([t for t in tgt_of.values() if t is not None]))
                            if any(t is not None for t in tgt_of.values()) else None),
        "reference": ref_name if ref_runs else None,
        "seeds": [r.seed for r in runs],
        "accuracy": {d: _mean_std([r.final["accuracy"].get(d) for r in runs]) for d in domains},
        "accuracy_mean": _mean_std([r.final["mean"] for r in runs]),
        "response_length": _mean_std([float(np.mean(list(r.final.get("length", {}).values())))
                                      if r.final.get("length") else None for r in runs]),
        "flops_total": _mean_std([r.total_flops if r.flops_by_phase else None for r in runs]),
        "flops_by_phase": {p: _mean_std([r.flops_by_phase.get(p, 0.0) for r in runs])
                           for p in phases},
        "flops_to_target": _mean_std(reach),
        "reached_target": [f is not None for f in reach],
        "saving_vs_reference_total": _mean_std(saving_total),
        "saving_vs_reference_at_target": _mean_std(saving_reach),
        "distillation_share_of_experts": _mean_std(
            [r.distill_flops / r.expert_flops if r.expert_flops else None for r in runs]),
        "notes": sorted({r.note for r in runs if r.note}),
    }
    if scored_on is not None:
      out["arms"][name] |= {
          "accuracy_recover_domain": _mean_std([r.final["accuracy"].get(rec_d) for r in runs]),
          "response_length_recover_domain": _mean_std([r.final.get("length", {}).get(rec_d)
                                                       for r in runs])}
  return out


def _fmt(ms: dict, scale: float = 1.0, pct: bool = False) -> str:
  if ms is None or ms.get("mean") is None:
    return "-"
  m, s = ms["mean"] * scale, (ms["std"] or 0.0) * scale
  if pct:
    return f"{100 * m:.1f}%" + (f" ±{100 * s:.1f}" if ms["n"] > 1 else "")
  return f"{m:.3g}" + (f" ±{s:.2g}" if ms["n"] > 1 else "")


def format_table(report: dict) -> str:
  """Plain-text tables: the main arms (matched targets per seed), then the recovery arms."""
  rec_d = report.get("recover_domain")
  out = []
  for group, title in (("main", "Arms (matched target {t}, mean over seeds; savings vs {r})"),
                       ("recovery", "Self-teacher recovery (target {t}, mean over seeds; "
                                    "savings vs {r})" if rec_d is None else
                                    f"Self-teacher recovery of {rec_d} (target {{t}} on {rec_d}, "
                                    "mean over seeds; savings vs {r})")):
    arms = {n: a for n, a in report["arms"].items() if a["group"] == group}
    if not arms:
      continue
    # Recovery arms are compared on the recovered domain, so `degrade` is shown on it too.
    on = rec_d if group == "recovery" else None
    cols = ["arm", "heldout acc" if on is None else f"{on} acc", "per domain", "train FLOPs",
            "FLOPs to target", "saving@target", "saving total", "distill/experts",
            "resp len" if on is None else f"{on} resp len"]
    acc_key, len_key = (("accuracy_mean", "response_length") if on is None else
                        ("accuracy_recover_domain", "response_length_recover_domain"))
    rows = []
    for name, a in arms.items():
      per = " ".join(f"{d}={_fmt(v, pct=True)}" for d, v in a["accuracy"].items())
      trained = a["flops_total"]["mean"] is not None
      reach = a["flops_to_target"]
      if not trained or a["target_accuracy"] is None:  # no target (`degrade`): nothing to reach
        reach_s = "-"
      elif reach["mean"] is None:
        reach_s = "never reached"
      else:
        reach_s = "0 (starts above target)" if reach["mean"] == 0 else _fmt(reach)
        if reach["missing"]:
          reach_s += f" ({reach['missing']} seed(s) never)"
      rows.append([name, _fmt(a[acc_key], pct=True), per,
                   _fmt(a["flops_total"]) if trained else "- (not charged)", reach_s,
                   _fmt(a["saving_vs_reference_at_target"], pct=True),
                   _fmt(a["saving_vs_reference_total"], pct=True),
                   _fmt(a["distillation_share_of_experts"], pct=True),
                   _fmt(a[len_key])])
    widths = [max(len(str(r[i])) for r in rows + [cols]) for i in range(len(cols))]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))
    tgt = next((a["target_accuracy"] for a in arms.values() if a["target_accuracy"] is not None),
               None)
    ref = next((a["reference"] for a in arms.values() if a["reference"]), None)
    out.append(title.format(t="-" if tgt is None else f"{100 * tgt:.1f}%", r=ref or "-"))
    out += [line(cols), line(["-" * w for w in widths])] + [line(r) for r in rows] + [""]
  return "\n".join(out)


def write_report(report: dict, arms: Sequence[ArmResult], out_dir: str) -> dict[str, str]:
  """Writes report.json, report.csv, curves.json and accuracy_vs_flops.png; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {k: os.path.join(out_dir, f) for k, f in (
      ("json", "report.json"), ("csv", "report.csv"), ("curves", "curves.json"),
      ("plot", "accuracy_vs_flops.png"), ("table", "report.txt"))}
  with open(paths["json"], "w") as f:
    json.dump(report, f, indent=1)
  with open(paths["curves"], "w") as f:
    json.dump([dataclasses.asdict(a) for a in arms], f)
  with open(paths["csv"], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["arm", "metric", "mean", "std", "n"])
    for name, a in report["arms"].items():
      flat = {"accuracy_mean": a["accuracy_mean"], "flops_total": a["flops_total"],
              "flops_to_target": a["flops_to_target"],
              "saving_vs_reference_total": a["saving_vs_reference_total"],
              "saving_vs_reference_at_target": a["saving_vs_reference_at_target"],
              "distillation_share_of_experts": a["distillation_share_of_experts"],
              "response_length": a["response_length"]}
      flat |= {k: a[k] for k in ("accuracy_recover_domain", "response_length_recover_domain")
               if k in a}
      flat |= {f"accuracy/{d}": v for d, v in a["accuracy"].items()}
      flat |= {f"flops/{p}": v for p, v in a["flops_by_phase"].items()}
      for metric, v in flat.items():
        w.writerow([name, metric, v["mean"], v["std"], v["n"]])
  with open(paths["table"], "w") as f:
    f.write(format_table(report) + "\n")
  plot_curves(arms, report.get("target_by_seed") or report["target_accuracy"], paths["plot"],
              recover_domain=report.get("recover_domain"))
  return paths


def curve_series(arms: Sequence[ArmResult], *, recover_domain: str | None = None) -> dict:
  """What each panel of the plot draws: {group: {"ylabel", "domain", "series": [(arm, seed, flops,
  acc %)], "targets": sorted per-seed targets (recovery only)}}.

  "main": the mean held-out accuracy over domains. "degrade" and "recovery": the recovered
  domain's accuracy (`recover_domain_of`), the recovery-group arms without a target (`degrade`,
  which only sets the recovery up) and with one, in panels of their own, so that the recovery
  curves are not squeezed into the first part of the degradation's much longer FLOP axis.
  """
  rec_d = recover_domain_of(arms, recover_domain)
  out = {}
  for group in ("main", "degrade", "recovery"):
    on = None if group == "main" else rec_d
    members = [a for a in arms if a.curve and (
        a.group == "main" if group == "main" else
        a.group == "recovery" and (a.target is None) == (group == "degrade"))]
    if members:
      out[group] = {
          "series": [(a.arm, a.seed, [p["flops"] for p in a.curve],
                      [100 * _score(p, on) for p in a.curve]) for a in members],
          "domain": on,
          "targets": sorted({a.target for a in members if a.target is not None}),
          "ylabel": "held-out accuracy (%), " + (
              "mean over domains" if on is None else f"{on} (the recovered domain)")}
  return out


def plot_curves(arms: Sequence[ArmResult], targets: dict | float | None, path: str, *,
                recover_domain: str | None = None) -> None:
  """Held-out mean accuracy against cumulative training FLOPs, one line per arm and seed, with the
  matched target per seed (`targets`: {seed: accuracy} or one shared value); with the
  self-teacher study, two more panels on the recovered domain's accuracy (`curve_series`): the
  degradation, and the recovery arms with their per-seed recovery targets."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  panels = curve_series(arms, recover_domain=recover_domain)
  n = max(len(panels), 1)
  fig, axes = plt.subplots(1, n, figsize=(7 * n, 5), squeeze=False)
  colors: dict[str, str] = {}
  titles = {"main": "Held-out accuracy vs training FLOPs", "degrade": "Degradation",
            "recovery": "Self-teacher recovery"}
  for ax, (group, panel) in zip(axes[0], panels.items()):
    labelled = set()
    for arm, _, xs, ys in panel["series"]:
      c = colors.setdefault(arm, f"C{len(colors) % 10}")
      ax.plot(xs, ys, "-o", color=c, ms=3, alpha=0.9, label=None if arm in labelled else arm)
      labelled.add(arm)
    if group == "main":
      values = ([] if targets is None else
                sorted(set(targets.values())) if isinstance(targets, dict) else [targets])
      label = "matched target" + (" per seed" if len(values) > 1 else "")
    else:
      values, label = panel["targets"], "recovery target per seed"
    for i, t in enumerate(values):
      ax.axhline(100 * t, color="gray", ls=":", lw=1, label=label if i == 0 else None)
    ax.set_xlabel("cumulative training FLOPs (XLA cost analysis)"
                  + ("" if group == "main" else f" of the {group} phase"))
    ax.set_ylabel(panel["ylabel"])
    ax.set_title(titles[group] + (f" of {panel['domain']}" if panel["domain"] else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title=None if panel["domain"] is None
              else f"accuracy on {panel['domain']}", title_fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
