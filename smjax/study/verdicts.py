"""The study's verdict lines: one sentence per claim, read off a report's figures and intervals.

A saving whose interval lies above 0 is stated as a saving, one below as a cost, one that holds 0
as "not distinguishable", a censored one as a bound; with several seeds each line says how many
seeds agree, and the last line says what the intervals cover (smjax.study.stats). A report without
intervals (one seed and no bootstrap: `smjax report --bootstrap=0`) states its point estimates as
such, and its last line says there are no intervals. The figures are smjax.study.report's
(`build_report` calls `verdicts` on the report it built).
"""

from __future__ import annotations

import math

from smjax.study import stats
from smjax.study.rules import AT_RULE


def _fmt_pct(x: float, signed: bool = False) -> str:
  return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def _pct(v: dict, signed: bool = False, negate: bool = False) -> str:
  """"31.0% [18.2, 44.1]" from a summary (fractions); a censored mean as "≥ 31.0%" (or "≤"),
  and where no interval is supported the share of replicates or seeds that stopped it."""
  fmt = lambda x: _fmt_pct(-x if negate else x, signed)  # noqa: E731
  m, lo, hi = (stats.number(v.get(k)) for k in ("mean", "lo", "hi"))
  if negate:
    lo, hi = hi, lo
  if math.isnan(m):
    return "n/a"
  bound = int(v.get("bound") or 0) * (-1 if negate else 1)
  s = {1: "≥ ", -1: "≤ ", 0: ""}[bound] + fmt(m) + "%"
  if not (math.isnan(lo) and math.isnan(hi)):
    return s + f" [{_bound(lo, fmt)}, {_bound(hi, fmt)}]"
  return s if bound else s + _no_interval(v)


def _no_interval(v: dict) -> str:
  """Why a summary has no interval: censored seeds, or censored/undefined prompt replicates."""
  n, cs = int(v.get("n") or 1), int(v.get("censored_seeds") or 0)
  if n > 1 and cs:
    return f" (censored on {cs} of {n} seeds: no interval)"
  share = float(v.get("censored") or 0.0)
  undefined = int(v.get("undefined") or 0)
  if share or undefined:
    return f" ({100 * share:.0f} % of replicates censored, {undefined} undefined: no interval)"
  return ""


def _bound(x: float, fmt) -> str:
  return "-inf" if x == -math.inf else "inf" if x == math.inf else "?" if math.isnan(x) else fmt(x)


def _finite(v: dict) -> list[float]:
  return [x for x in (stats.number(x) for x in v.get("per_seed") or []) if math.isfinite(x)]


def _some_seeds(report: dict, arm: str) -> str:
  """"1 of 5 seeds so far" for an arm that has not run on every seed of the report yet (the
  every-arm runs catching up with the main comparison's); "" otherwise."""
  ran = len((report["arms"].get(arm) or {}).get("seeds") or [])
  n = len(report.get("seeds") or [])
  return f"{ran} of {n} seeds so far" if 0 < ran < n else ""


def _side(v: dict) -> int:
  """+1 when the interval lies above 0, -1 below, 0 when it holds 0 or is missing."""
  lo, hi = stats.number(v.get("lo")), stats.number(v.get("hi"))
  if math.isnan(lo) or math.isnan(hi):
    return 0
  return 1 if lo > 0 else -1 if hi < 0 else 0


def _agree(v: dict, side: int, words: tuple[str, str] = ("cheaper", "dearer")) -> str:
  """"4 of 5 seeds agree" for a verdict on the sign `side` of a figure (per_seed values), or for
  a figure not told from 0 (side 0) how many seeds fall on each side, in `words` (positive,
  negative); a censored seed counts where its bound fixes its sign (stats.seed_signs), and the
  seeds whose sign it leaves open are named as such, as are those without a value (e.g. a saving
  where neither arm reached the level) and those at exactly 0: the counts add up to the seeds."""
  signs = stats.seed_signs(v)
  if len(signs) < 2:
    return ""
  n = len(signs)
  # The seeds without a sign, each named once: censored, else nan, else exactly 0.
  left = [xb for s, xb in zip(signs, stats.per_seed(v)) if s is None]
  open_ = sum(bound != 0 for _, bound in left)
  undefined = sum(bound == 0 and math.isnan(x) for x, bound in left)
  zero = sum(bound == 0 and x == 0 for x, bound in left)
  tail = "".join(f", {k} {what}" for k, what in ((open_, "censored (sign open)"),
                                                   (undefined, "without a value"),
                                                   (zero, "at exactly 0")) if k)
  if side == 0:
    return (f"; {signs.count(1)} of {n} seeds {words[0]}, {signs.count(-1)} {words[1]}" + tail)
  return f"; {signs.count(side)} of {n} seeds agree" + tail


def _tokens_per_seed(d: dict) -> str:
  """" (per seed: +0.1, +14.9, +0.01)" for a length difference on several seeds: its sign count
  counts a seed 0.01 tokens longer as longer, so the values show what the count is made of (a
  value under 0.05 in hundredths)."""
  xs = [stats.number(x) for x in d.get("per_seed") or []]
  if len(xs) < 2:
    return ""
  return " (per seed: " + ", ".join(
      f"{x:+.2f}" if abs(x) < 0.05 else f"{x:+.1f}" for x in xs) + ")"


def _length_line(report: dict, arm: str, what: str, ref: str, point: bool,
                 where: str = "") -> list[str]:
  """Claim (c)'s answer-length line for `arm` against `ref` ([] without one on every seed)."""
  d = ((report.get("arms") or {}).get(arm) or {}).get("length_vs_reference")
  if not d or _some_seeds(report, arm):
    return []
  m, lo, hi = (stats.number(d.get(k)) for k in ("mean", "lo", "hi"))
  if math.isnan(m):   # a curve without lengths
    return []
  # Hundredths where tenths would print every figure as 0.0 ("+0.0 [-0.0, +0.0]").
  nd = 2 if all(abs(x) < 0.05 for x in (m, lo, hi) if math.isfinite(x)) else 1
  ci = "" if math.isnan(lo) and math.isnan(hi) else f" [{lo:+.{nd}f}, {hi:+.{nd}f}]"
  return [f"(c) {what} answers{where} are {m:+.{nd}f} tokens{ci} vs {ref}"
          + ("" if _side(d) or point else " (not distinguishable)")
          + _agree(d, _side(d), ("longer", "shorter")) + _tokens_per_seed(d)]


def fell_from_best(report: dict, below: float = 0.5) -> list[str]:
  """One line naming the runs that ended below `below` times their own best checkpoint's
  accuracy (best and final on the report set, per seed) without the collapse rule ending them
  (it asks for 0): a run that fell apart and went on to its cap. A recovery arm is read on the
  recovered domain, any other on the mean over domains; [] when none."""
  seeds = report.get("seeds") or []
  out = []
  for name, a in (report.get("arms") or {}).items():
    final = a.get("accuracy_recover_domain" if a.get("group") == "recovery"
                  and report.get("recover_domain") else "accuracy_mean") or {}
    stopped = {c["seed"] for c in a.get("collapsed") or []}
    # An arm read at its rule's end (report.rule_views) on a seed the rule did not end: the arm.
    same = [name.endswith(AT_RULE) and not r for r in a.get("reached_stop_rule") or []]
    for i, (seed, b, f) in enumerate(zip(seeds, (a.get("best_accuracy") or {}).get("per_seed")
                                         or [], final.get("per_seed") or [])):
      b, f = stats.number(b), stats.number(f)
      if i < len(same) and same[i]:
        continue
      if seed not in stopped and b > 0 and f < below * b:   # nan compares False
        out.append(f"{name} on seed {seed} (best {100 * b:.1f}%, final {100 * f:.1f}%)")
  if not out:
    return []
  return [f"Fell below {below:.0%} of its best and ran on (the collapse rule asks for 0; the best "
          "checkpoint is chosen on the stop set): " + "; ".join(out)]


def collapse_text(arm: str, c: dict) -> str:
  """A collapsed run ({"seed", "step", "what"}, a report arm's "collapsed") in words."""
  return f"{arm} on seed {c['seed']} at step {c['step']} ({c['what']})"


def point_only(report: dict) -> bool:
  """Whether `report` has no intervals at all: one seed and no bootstrap replicates (bootstrap=0,
  or curves without per-prompt counts). Several seeds have t intervals without a bootstrap."""
  n = len(report.get("seeds") or [])
  return report.get("bootstrap") == 0 and report.get(
      "interval", "seeds" if n > 1 else "prompts") != "seeds"


def _times(s: dict) -> str:
  """A clear positive saving s as the factor 1 / (1 - s) by which the FLOPs shrink, its interval
  mapped the same way (monotone for s < 1): " (3.2x [2.1, 6.9] fewer)"; "" where undefined."""
  m, lo, hi = (stats.number(s.get(k)) for k in ("mean", "lo", "hi"))
  if not m < 1:
    return ""
  f = lambda x: "inf" if x >= 1 else f"{1 / (1 - x):.1f}"  # noqa: E731
  ci = "" if math.isnan(lo) or math.isnan(hi) else f" [{f(lo)}, {f(hi)}]"
  return f" ({f(m)}x{ci} fewer)"


def _on_seeds(s: dict) -> str:
  """" on 1 of 2 seeds" for a censored saving that is censored on some of its seeds only (the
  run reached the level on the others); "" when on every seed, or on one seed of one. A seed
  without a value (nan: neither arm reached the level there) counts as one where it had not."""
  seeds = stats.per_seed(s)
  short = sum(bound != 0 or math.isnan(x) for x, bound in seeds)
  return f" on {short} of {len(seeds)} seeds" if 0 < short < len(seeds) else ""


def _fell(arm: dict) -> str:
  """" (it collapsed on seed 0 at step 31)" for a report arm whose run collapsed (its curve ends
  there, so a level it had not reached is censored at the collapse); "" otherwise."""
  c = arm.get("collapsed") or []
  return (" (it collapsed on " + "; ".join(f"seed {x['seed']} at step {x['step']}" for x in c)
          + ")") if c else ""


def _saving_line(what: str, s: dict, against: str, flops: dict | None = None,
                 point: bool = False, some: str = "", times: bool = False,
                 fell: tuple[str, str] = ("", "")) -> str:
  """A saving's verdict: cheaper, dearer, not distinguishable, or (censored: the arm had not
  reached the level when it stopped, `flops` its FLOPs then; or the reference had not, so the
  saving is at least this) a bound, with seed agreement.
  `point`: the report has no intervals, so the point estimate's sign is stated as it is.
  `some`: the arm has run on some seeds only (`_some_seeds`): their values, no summary.
  `times`: a clear saving also as the factor by which the FLOPs shrink (claim (d)'s unit).
  `fell`: (`_fell` of the arm, of the reference): said of the censored one, whose bound then
  stands where its run collapsed, not where it could have gone on."""
  side, bound = _side(s), int(s.get("bound") or 0)
  if some:
    return (f"{what} vs {against}, on {some}: saving "
            + ", ".join(f"{_fmt_pct(x, True)}%" for x in _finite(s)))
  if point and not bound:
    m = stats.number(s.get("mean"))
    side = 1 if m > 0 else -1 if m < 0 else 0
    if not side:
      return f"{what} vs {against}: saving {_pct(s)}"
  if side > 0:
    return (f"{what} needs {_pct(s)} fewer FLOPs than {against}"
            + (_times(s) if times and not bound else "") + _agree(s, 1))
  if side < 0:
    return f"{what} needs {_pct(s, negate=True)} more FLOPs than {against}" + _agree(s, -1)
  if bound < 0:
    at = f" ({_flops(flops)} FLOPs)" if flops else ""
    if stats.number(s.get("mean")) < 0:
      return (f"{what} had not reached the level{_on_seeds(s)} when it stopped{at}{fell[0]}: it "
              f"needs {_pct(s, negate=True)} more FLOPs than {against}" + _agree(s, 0))
    return (f"{what} had not reached the level{_on_seeds(s)} when it stopped{at}{fell[0]}: "
            f"saving {_pct(s)}" + _agree(s, 0))
  if bound > 0:   # the reference was censored: the saving is at least this
    m = stats.number(s.get("mean"))
    # The factor of a censored reference is its budget's: a longer run that still fell short
    # would make it larger (claim (d)'s "up to 50x" must not be read off a cap).
    at_least = (f" (≥ {1 / (1 - m):.1f}x fewer FLOPs, a bound that grows with {against}'s "
                "budget)" if times and 0 < m < 1 else "")
    return (f"{what} vs {against}: {against} had not reached the level{_on_seeds(s)} when it "
            f"stopped{fell[1]}: saving {_pct(s)}" + at_least + _agree(s, 0))
  return f"{what} vs {against}: not distinguishable (saving {_pct(s)})" + _agree(s, 0)


# The frontier's readings (smjax.study.report._frontier), in the order reports list them:
# (mode, whose gain the levels are shares of (None: the reference arm's), where they are read,
# the frontier table's short label).
FRONTIER_READINGS = (
    ("mean", None, "mean over domains", "mean"),
    ("every", None, "every domain at its level", "every domain"),
    ("mean_best", "the better route's", "mean over domains", "mean, better route's"),
    ("every_best", "the better route's", "every domain at its level",
     "every domain, better route's"))


# The frontier's modes read again with MOPD's flat rule replayed (smjax.study.report).
REPLAYED = ":replayed"


def replay_differs(front: dict, modes, levels=None) -> bool:
  """Whether a report's frontier (`front`) read under the replayed flat rule differs from the
  frontier as run, in any of `modes` at any of `levels` (None: every level): a different
  split-then-merge figure, bound or cheapest set on some seed."""
  for mode in modes:
    for level, at in (front.get(mode) or {}).items():
      if levels is not None and level not in levels:
        continue
      again = (front.get(mode + REPLAYED) or {}).get(level) or {}
      if any((at.get(k) or {}).get(f) != (again.get(k) or {}).get(f)
             for k in ("split", "saving") for f in ("per_seed", "per_seed_bound")):
        return True
      if at.get("sets") != again.get("sets"):
        return True
  return False


def flat_rule_text(fraction: float, evals: int) -> str:
  """MOPD's flat rule (rules.Plateau) in words: "flat over 3 evaluations" and, with a FLOPs span,
  "and 25% more of its own FLOPs"."""
  return f"flat over {evals} evaluations" + (
      f" and {100 * fraction:.0f}% more of its own FLOPs" if fraction else "")


def claim_a_head(level: float, of: str | None, ref: str, where: str) -> str:
  """The start of claim (a)'s verdict line for one reading at `level` (what a map finds it by)."""
  whose = of or f"{ref}'s"
  return f"(a) at {100 * level:.0f}% of {whose} gain ({where})"


# How a regime map reads a cell (docs/regimes.md, "How the map will be read"; fixed before the
# map's last cells had run): at the report's level, on the mean over domains.
FAVOURS_SPLIT, FAVOURS_JOINT = "favours splitting", "favours joint GRPO"
JOINT_AT_BARS, UNRESOLVED = "favours joint GRPO at the bars' resolution", "unresolved"
READINGS = (FAVOURS_SPLIT, FAVOURS_JOINT, JOINT_AT_BARS, UNRESOLVED)


def cell_reading(row: dict) -> tuple[str, str]:
  """A map cell's row (smjax.study.regimes.cell_row) read by the map's rule: (reading, why).

  Splitting is favoured when split-then-merge is cheaper on every seed on the better route's
  levels (`mean_best`; a row without them, from before they existed, on joint GRPO's); joint
  GRPO when split-then-merge is dearer on every seed on both readings and its bound for expert
  stops between the bars (`saving_finer_bars`) stays below zero on every seed that has one; a row
  from before that bound existed is dearer "at the bars' resolution" at best. A censored seed
  counts where its bound fixes its sign (stats.seed_signs). Anything else is unresolved."""
  mean, best = row.get("mean") or {}, row.get("mean_best") or {}
  if "saving" not in mean:
    return UNRESOLVED, "no saving at the level"
  readings = [r for r in (mean, best) if "saving" in r]
  signs = [stats.seed_signs(r["saving"]) for r in readings]
  n = len(signs[0])
  on_best = stats.seed_signs((best or mean)["saving"])
  whose = "the better route's levels" if best else "joint GRPO's levels"
  if on_best and all(x == 1 for x in on_best):
    return FAVOURS_SPLIT, f"cheaper on {n} of {n} seeds on {whose}"
  if n and all(x == -1 for sg in signs for x in sg):
    bounds = [r.get("saving_finer_bars") for r in readings]
    if any(b is None for b in bounds):
      return JOINT_AT_BARS, (f"dearer on {n} of {n} seeds on {whose}; the row predates "
                             + ("" if best else "the better route's levels and ")
                             + "the bound for stops between the bars")
    crossing = sorted({i for b in bounds for i, x in enumerate(b.get("per_seed") or [])
                       if not stats.number(x) < 0 and math.isfinite(stats.number(x))})
    if not crossing:
      return FAVOURS_JOINT, (f"dearer on {n} of {n} seeds on both readings, and with stops "
                             "anywhere between the bars")
    return UNRESOLVED, (f"dearer on {n} of {n} seeds at the bars, but stops between them could "
                        f"reach zero on {len(crossing)} (finer bars would settle it)")
  names = ("joint GRPO's levels", "the better route's")
  counts = "; ".join(f"on {name} {sg.count(1)} cheaper, {sg.count(-1)} dearer"
                     + (f", {sg.count(None)} open" if None in sg else "")
                     for name, sg in zip(names, signs))
  if any(1 in sg and -1 in sg for sg in signs):
    return UNRESOLVED, f"the seeds differ in sign: {counts}; more seeds would settle it"
  return UNRESOLVED, (f"censored seeds leave the sign open: {counts}; runs carried on past "
                      "their ends would settle it" + _capture_note(readings, signs))


def _capture_note(readings: list[dict], signs: list[list]) -> str:
  """For the seeds whose sign is open: the share of its teachers' gain each one's cheapest
  set's student would need to reach the level, against what it had (report._capture_gap)."""
  pairs = []
  for r, sg in zip(readings, signs):
    need = (r.get("capture_needed") or {}).get("per_seed") or []
    had = (r.get("capture_reached") or {}).get("per_seed") or []
    pairs += [(stats.number(need[i]), stats.number(had[i])) for i, x in enumerate(sg)
              if x is None and i < min(len(need), len(had))]
  pairs = sorted({p for p in pairs if all(math.isfinite(v) for v in p)})
  if not pairs:
    return ""

  def span(xs):   # "118-122" (percent), or one value
    lo, hi = (f"{100 * x:.0f}" for x in (min(xs), max(xs)))
    return lo if lo == hi else f"{lo}-{hi}"
  return (f"; the open seeds' students would need {span([n for n, _ in pairs])} % of their "
          f"teachers' gain to get there, and had {span([h for _, h in pairs])} %")


def verdicts(report: dict) -> list[str]:
  """One line per claim the report can speak to, read off the intervals, each saying how many
  seeds agree; the last line says what the intervals cover."""
  arms, conf = report["arms"], f"{100 * report['confidence']:.0f}%"
  point = point_only(report)
  lines = []
  ref = report.get("reference_arm") or "the reference"
  level = report.get("target_fraction", 0.9)
  front = report.get("frontier") or {}
  for mode, of, where, _ in FRONTIER_READINGS:
    at = (front.get(mode) or {}).get(f"{level:g}")
    if not at or "saving" not in at:
      continue
    sets = [x.partition("@")[2] or "final" for x in at.get("sets") or [] if x]
    which = (f"; cheapest expert stop: {', '.join(sets)}" if sets else "")
    finer = at.get("saving_finer_bars")
    if (finer and not finer.get("bound")
        and stats.number((at.get("grid_step") or {}).get("mean")) > 0):
      # How much the experts' bar grid could move the figure (smjax.study.report._grid_step).
      which += f"; expert stops between the bars: at most {_pct(finer, signed=True)}"
    lines.append(f"{claim_a_head(level, of, ref, where)}: " + _saving_line(
        "split-then-merge", at["saving"], ref, at["split"], point)
        + f" ({_flops(at['split'])} against {_flops(at['joint'])}{which})")
  flat = report.get("flat_rule")
  readings = [r for r in FRONTIER_READINGS[::2]   # mean and mean_best
              if "saving" in (front.get(r[0] + REPLAYED) or {}).get(f"{level:g}", {})]
  rule, ran = ((flat_rule_text(flat[k], flat["evals"]) for k in ("replayed", "ran")) if flat
               else ("", ""))
  if readings and not replay_differs(front, [r[0] for r in readings], [f"{level:g}"]):
    lines.append(f"(a) the same on each seed with MOPD stopped on a curve {rule} (replayed on the "
                 f"same runs, which stopped on one {ran})")
    readings = []
  for mode, of, where, _ in readings:
    at = front[mode + REPLAYED][f"{level:g}"]
    sets = [x.partition("@")[2] or "final" for x in at.get("sets") or [] if x]
    whose = of or f"{ref}'s"
    lines.append(
        f"(a) with MOPD stopped on a curve {rule} (replayed on the same runs, which stopped on "
        f"one {ran}), at {100 * level:.0f}% of {whose} gain ({where}): "
        + _saving_line("split-then-merge", at["saving"], ref, at["split"], point)
        + (f"; cheapest expert stop: {', '.join(sets)}" if sets else ""))
  at = (front.get("mean") or {}).get(f"{level:g}") or {}
  if "distillation_share" in at and not math.isnan(stats.number(at["distillation_share"]["mean"])):
    lines.append(f"(b) distillation cost {_pct(at['distillation_share'])} of the experts' "
                 f"FLOPs on the cheapest route to {100 * level:.0f}% of {ref}'s gain")
  for arm, what in (("external_opd", "external-teacher OPD"),
                    ("control_opd", "control-teacher OPD (student-size teacher, plain chains)")):
    ext = arms.get(arm, {})
    if "saving_at_target" in ext:
      lines.append(f"(c) to {100 * level:.0f}% of {ref}'s gain: " + _saving_line(
          what, ext["saving_at_target"], ref, ext.get("flops_to_target"), point,
          _some_seeds(report, arm), fell=(_fell(ext), _fell(arms.get(ref, {})))))
    # An arm run on to its cap past its stop rule is read at both ends (report.rule_views);
    # where the rule ended it on no seed, the two are one.
    ruled = (arms.get(arm + AT_RULE) or {}).get("reached_stop_rule") or []
    where = (" where its stop rule ended it" if all(ruled) else
             f" where its stop rule ended it ({sum(ruled)} of {len(ruled)} seeds; the others at "
             "their cap)")
    ends = (((arm, " at its cap"), (arm + AT_RULE, where)) if any(ruled) else
            ((arm, " at its cap (its stop rule ended it on no seed)" if ruled else ""),))
    for name, at in ends:
      lines += _length_line(report, name, what, ref, point, at)
    if len(ends) == 2 and all("accuracy_mean" in arms[n] for n, _ in ends):
      (cap, rule), some = (arms[n]["accuracy_mean"] for n, _ in ends), _some_seeds(report, arm)
      pairs = list(zip(cap.get("per_seed") or [], rule.get("per_seed") or []))
      lines.append(
          f"(c) {what}'s final accuracy: {_acc(cap, some)} at its cap, {_acc(rule, some)}"
          f"{ends[1][1]}" + ("" if len(pairs) < 2 or some else " (per seed: " + ", ".join(
              f"{100 * stats.number(c):.1f} / {100 * stats.number(r):.1f}%" for c, r in pairs)
              + ")"))
  best = [(n, arms[n]["best_accuracy"]) for n in (ref, "external_opd", "control_opd")
          if "best_accuracy" in arms.get(n, {})]
  if len(best) > 1:
    lines.append("(c) best checkpoint (chosen on the stop set, measured on the report set): "
                 + "; ".join(f"{n} {_acc(v, _some_seeds(report, n))}" for n, v in best))
  for sfx in recovery_suffixes(arms):   # each depth of the degradation (recovery_suffix)
    rs, rg = arms.get("recover_self" + sfx, {}), arms.get("recover_grpo" + sfx, {})
    head = "(d) to recover the degraded domain" + (f" (degrade{sfx})" if sfx else "") + ": "
    if "saving_at_target" in rs:
      lines += degradation_line(report, sfx)
    if "saving_at_target" in rs and rg:
      lines.append(head + _saving_line(
          "self-teacher OPD", rs["saving_at_target"], "GRPO", rs.get("flops_to_target"), point,
          times=True, fell=(_fell(rs), _fell(rg))))
    if "saving_vs_external" in rs:   # "cut distillation FLOPs": against the other teacher too
      lines.append(head + _saving_line(
          "self-teacher OPD", rs["saving_vs_external"], "external-teacher OPD",
          rs.get("flops_to_target"), point, times=True,
          fell=(_fell(rs), _fell(arms.get("recover_external" + sfx, {})))))
  fell = [collapse_text(name, c) for name, arm in arms.items() for c in arm.get("collapsed") or []]
  if fell:   # an outcome of its route: the arm's curve ends at the collapse
    fell = ["Collapsed (the run ended there; its route is charged up to it): " + "; ".join(fell)]
  fell += fell_from_best(report)
  if not lines:
    return fell
  lines += fell
  n = len(report.get("seeds") or [])
  if point:
    return lines + ["Intervals: none: one seed and no bootstrap replicates (`smjax report "
                    "WORKDIR --bootstrap=1000` draws them), so these are point estimates and no "
                    "line says whether a difference is beyond noise."]
  if report.get("interval", "seeds" if n > 1 else "prompts") == "seeds":
    tail = f"{conf} t intervals over {n} seeds (training and evaluation noise)"
  else:
    tail = (f"{conf} intervals over held-out prompts: evaluation noise only; one seed cannot "
            "separate training noise")
  return lines + [f"Intervals: {tail}."]


def recovery_suffix(name: str) -> str:
  """A recovery arm's degradation: "" for the configured one's arms (degrade, recover_*),
  "@<fraction>" for a further depth's (degrade@0, recover_grpo@0: smjax.study.run); the report
  groups the recovery arms by it."""
  return name[name.index("@"):] if "@" in name else ""


def recovery_suffixes(names) -> list[str]:
  """The degradations among a report's recovery arms (their names), in order: "" first."""
  return list(dict.fromkeys(recovery_suffix(n) for n in names
                            if n.partition("@")[0] == "degrade"
                            or n.partition("@")[0].startswith("recover_")))


def degradation_line(report: dict, suffix: str = "") -> list[str]:
  """Claim (d)'s condition, as a line before its savings: how the domain was degraded and how
  far (the joint model's accuracy on it, the degraded one's, the recovery target). What the
  self teacher saves depends on it: GRPO's one-bit reward finds its way back from a mild loss,
  not from one that leaves no right answer to learn from (docs/design.md). `suffix`: which
  degradation ("" the configured one, "@<fraction>" a further depth)."""
  arms, rec = report.get("arms") or {}, report.get("recover_domain")
  deg = arms.get("degrade" + suffix) or {}
  after = deg.get("accuracy_recover_domain")
  if not rec or not after:
    return []
  before = ((arms.get("joint_grpo") or {}).get("accuracy") or {}).get(rec)
  how = "; ".join(deg.get("notes") or []) or "later training"
  target = report.get("recover_target" + suffix)
  return [f"(d) the degradation{f' degrade{suffix}' if suffix else ''} ({how}): {rec} "
          + (f"{_acc(before)} → " if before else "")
          + _acc(after) + (f"; the recovery target {_acc(target)}" if target else "")]


def _acc(v: dict, some: str = "") -> str:
  """An accuracy summary as "x% [lo, hi]" (the interval left out when there is none); `some`:
  the arm has run on some seeds only (`_some_seeds`): their values."""
  m, lo, hi = (100 * stats.number(v.get(k)) for k in ("mean", "lo", "hi"))
  if some:
    return ", ".join(f"{100 * x:.1f}%" for x in _finite(v)) + f" ({some})"
  return f"{m:.1f}%" + ("" if math.isnan(lo) or math.isnan(hi) else f" [{lo:.1f}, {hi:.1f}]")


def _flops(v: dict) -> str:
  m = stats.number(v.get("mean"))
  return "n/a" if math.isnan(m) else ("≥ " if int(v.get("bound") or 0) > 0 else "") + f"{m:.3g}"
