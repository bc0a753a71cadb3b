"""Stop rules: when an arm of the study stops, read on the stop set only.

A rule is `(curve point) -> bool`, asked by the RL loop after every evaluation (run_rl's `stop_at`,
or an expert's checkpoint bars). Every rule reads the point's stop-set accuracy (`stop_accuracy`:
held-out prompts disjoint from the report's, smjax.study.shared), and its marks (a start, a
reference, a teacher) are stop-set accuracies too, so that where an arm stopped is never decided
by the prompts its figures are reported on (smjax.study.report). A point without a stop set (a
study with `stop_size=0`) is read on its report accuracy.
"""

from __future__ import annotations

import math

# The suffix of an arm read where its stop rule would have ended it, for an arm run on to its
# cap past the rule (smjax.study.report.rule_views): "external_opd@rule".
AT_RULE = "@rule"


def stop_accuracy(point: dict) -> dict:
  """{domain: accuracy} of a curve point on the stop set (its report accuracy without one)."""
  return (point.get("stop") or {}).get("accuracy") or point["accuracy"]


def captured(acc: dict, start: dict, teacher: dict) -> float | None:
  """The fraction of the teachers' gain over `start` a student with accuracy `acc` has captured,
  summed over the teachers' domains: sum(acc - start) / sum(teacher - start); None when the
  teachers have no gain to capture."""
  gain = sum(teacher[d] - start[d] for d in teacher)
  return None if gain <= 0 else sum(acc[d] - start[d] for d in teacher) / gain


def capture_rule(start: dict, teacher: dict, fraction: float):
  """An OPD phase's stop rule: True at the first point that has captured `fraction` of the
  teachers' gain; None (run to the cap) when there is none."""
  if captured(teacher, start, teacher) is None:
    return None
  return lambda point: captured(stop_accuracy(point), start, teacher) >= fraction - 1e-12


def matched_target(start: dict, reference: dict, fraction: float) -> float:
  """The mean accuracy at `fraction` of the reference's gain over `start` ({domain: acc})."""
  return mean_accuracy(start) + fraction * (mean_accuracy(reference) - mean_accuracy(start))


def target_rule(start: dict, reference: dict, fraction: float):
  """True at the first point whose mean accuracy is at or above `matched_target`; None (no rule)
  when the reference gained nothing over `start`, so that the target is no mark to reach."""
  if mean_accuracy(reference) <= mean_accuracy(start):
    return None
  target = matched_target(start, reference, fraction)
  return lambda point: mean_accuracy(stop_accuracy(point)) >= target - 1e-12


def bar_rule(domain: str, start: dict, reference: dict, fraction: float):
  """An expert's checkpoint bar: True at the first point where its own domain has gained
  `fraction` of the reference's (joint GRPO's) final gain there over `start`; None when the
  reference gained nothing there."""
  gain = reference[domain] - start[domain]
  if fraction <= 0 or gain <= 0:
    return None
  level = start[domain] + fraction * gain
  return lambda point: stop_accuracy(point)[domain] >= level - 1e-12


class Plateau:
  """A rule that holds once the curve has gone flat on the stop set: the last points (a window
  of at least `evals` of them) brought no domain more than `tol` above its best before them. It
  remembers the points it was asked about, so it must be asked about every point of one curve
  once, in order, as run_rl does (a fresh rule per run; `all_rules` asks every member). Used with
  the capture rule, so that a distillation runs on until its curve flattens: the frontier reads
  first passages, and a run cut short while still rising would censor the levels it had not yet
  reached.

  flops_fraction: the window also spans at least this fraction more of the run's own training
  FLOPs (a point's "flops" less `offset`, what the run was charged before it started): its first
  point's own FLOPs times (1 + flops_fraction) at most its last's. Without it "flat" depends on
  how densely the run is evaluated: a distillation evaluated every few steps and still rising
  slowly looks flat over three evaluations (disjoint_uneven's 0.9 sets stopped so while their
  hard domain had risen 1.6-2.1 points over their last quarter of FLOPs, docs/regimes.md)."""

  def __init__(self, evals: int, tol: float, flops_fraction: float = 0.0, offset: float = 0.0):
    if evals < 1:
      raise ValueError(f"config.mopd.plateau_evals={evals}: expected at least 1 evaluation")
    if flops_fraction < 0:
      raise ValueError(f"config.mopd.plateau_flops_fraction={flops_fraction}: expected >= 0")
    self.evals, self.tol, self.seen = int(evals), float(tol), []
    self.fraction, self.offset, self.flops = float(flops_fraction), float(offset), []

  def __call__(self, point: dict) -> bool:
    self.seen.append(stop_accuracy(point))
    self.flops.append(float(point.get("flops", 0.0)) - self.offset)
    start = len(self.seen) - self.evals   # the window's first point: the latest that spans both
    while start > 0 and self.flops[-1] < (1 + self.fraction) * self.flops[start]:
      start -= 1
    if start < 1:
      return False
    before, window = self.seen[:start], self.seen[start:]
    return all(max(a[d] for a in window) <= max(a[d] for a in before) + self.tol + 1e-12
               for d in window[-1])


# The flat rule's FLOPs span the later regime cells run with (smjax.study.regimes.LATER); a report
# of a study run without one replays its MOPD under this span, and one run with a span replays it
# without (smjax.study.report.replay_distillation).
FLAT_SPAN = 0.25


def all_rules(*rules):
  """The rule that holds when every given rule (None: no rule) holds; None when none given.
  Every rule is asked about every point (no short cut), so that a rule with a memory (`Plateau`)
  sees the whole curve."""
  rules = [r for r in rules if r is not None]
  return (lambda point: all([r(point) for r in rules])) if rules else None


def mean_accuracy(acc: dict) -> float:
  """The mean over domains of {domain: accuracy} (nan when empty). Summed in order in Python, as
  np.mean sums so few values, so the same number; a report's bootstrap calls it millions of
  times, where np.mean's own overhead was a third of `smjax report`."""
  return float(sum(float(v) for v in acc.values()) / len(acc)) if acc else math.nan
