"""The study report rendered: the printed table with its intervals and verdicts, report.json/csv,
curves.json and the accuracy-vs-FLOPs plot (smjax.study.report computes every figure)."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import io
import json
import math
import os
import re
import sys
import textwrap
from typing import Sequence

import numpy as np

from smjax import distributed, paths as paths_lib
from smjax.study import stats
from smjax.study.bench_tables import bench_markdown
from smjax.study.report import ArmResult, recover_domain_of
from smjax.study.verdicts import (FRONTIER_READINGS, READINGS, REPLAYED, cell_reading,
                                  collapse_text, flat_rule_text, point_only, recovery_suffix,
                                  recovery_suffixes, replay_differs)

# The terminal's table (`format_table(report, width=TERMINAL_WIDTH)`, printed by the command line)
# fits this many columns; report.txt, report.csv and report.json keep every figure.
TERMINAL_WIDTH = 120


def _num(v: dict | None, key: str = "mean") -> float:
  return math.nan if not v else stats.number(v.get(key))


def _ci(v: dict | None, pct: bool = False, signed: bool = False) -> str:
  """"41.3% [38.0, 44.9]" or "2.31e+12 [1.9e+12, 2.8e+12]"; "≥ 2.3e+12" for a censored figure;
  "-" when absent."""
  m = _num(v)
  if math.isnan(m):
    return "-"
  if math.isinf(m):
    return "never"
  if pct:
    f = (lambda x: f"{100 * x:+.1f}") if signed else (lambda x: f"{100 * x:.1f}")
    head = f(m) + "%"
  else:
    f = lambda x: f"{x:.3g}"  # noqa: E731
    head = f(m)
  head = {1: "≥ ", -1: "≤ "}.get(int(v.get("bound") or 0), "") + head
  lo, hi = _num(v, "lo"), _num(v, "hi")
  if lo == hi == m:  # an exact figure (FLOPs of one seed): no interval to show
    return head
  if math.isnan(lo) and math.isnan(hi):
    n, cs = int(v.get("n", 1) or 1), int(v.get("censored_seeds") or 0)
    if n > 1 and cs:
      return head + f" ({cs}/{n} seeds censored)"
    if int(v.get("bound") or 0):   # censored at the point estimate: "≥ x" says it
      return head
    if v.get("censored") or v.get("undefined"):
      return head + f" ({100 * float(v.get('censored') or 0):.0f}% censored)"
    return head + (f" ±{100 * _num(v, 'std') if pct else _num(v, 'std'):.2g}" if n > 1 else "")
  b = lambda x: "inf" if x == math.inf else "-inf" if x == -math.inf else f(x)  # noqa: E731
  return f"{head} [{b(lo)}, {b(hi)}]"


def repeats_reference(front: dict, mode: str, level: str, suffix: str = "") -> bool:
  """Whether the frontier's row at `mode` (a reading on levels of the better route's gain) and
  `level` is its reference reading's, figure for figure: the reference was the better route on
  every domain of every seed, so both read the same levels."""
  return mode.endswith("_best") and (front.get(mode + suffix) or {}).get(level) == (
      front.get(mode.removesuffix("_best") + suffix) or {}).get(level)


def frontier_rows(report: dict, suffix: str = "") -> list[list[str]]:
  """The frontier table's rows: per level and mode, each route's FLOPs to it, the saving, the
  distillation's share and which expert stop was cheapest (per seed); a row of the better
  route's gain that repeats the reference's (`repeats_reference`) is left out. `suffix`: the
  modes read with MOPD's flat rule replayed (verdicts.REPLAYED), the rows that differ from the
  frontier as run only."""
  rows = []
  front = report.get("frontier") or {}
  for mode, _, _, where in FRONTIER_READINGS:
    for level, at in front.get(mode + suffix, {}).items():
      if suffix and not replay_differs(front, [mode], [level]):
        continue
      if repeats_reference(front, mode, level, suffix):
        continue
      sets = [s.partition("@")[2] or "final" if s else "-" for s in at.get("sets") or []]
      bracket = lambda k: "-" if not at.get(k) else _ci(at[k], pct=True).split(" [")[0]  # noqa
      rows.append([f"{100 * float(level):.0f}%", where, _ci(at.get("joint")),
                   _ci(at.get("split")), _ci(at.get("saving"), pct=True),
                   _ci(at.get("distillation_share"), pct=True), " ".join(sets),
                   f"{bracket('joint_bracket')} / {bracket('split_bracket')}",
                   _ci(at.get("saving_finer_bars"), pct=True)
                   if _num(at.get("grid_step")) > 0 else "-"])
  return rows


def _table(title: str, cols: list[str], rows: list[list[str]], width: int | None = None,
           points: Sequence[str] = (), drop: Sequence[str] = ()) -> list[str]:
  """A titled plain-text table. With `width` (the terminal's), a table wider than that shows the
  `points` columns' point estimates alone (no interval), then leaves out the `drop` columns in
  that order until it fits, and says what it left out; the title is wrapped to `width`."""
  def lines(cols, rows):
    widths = [max(len(str(r[i])) for r in rows + [cols]) for i in range(len(cols))]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))  # noqa: E731
    out = [line(cols), line(["-" * w for w in widths])] + [line(r) for r in rows]
    return out if width is None else [ln.rstrip() for ln in out]

  if width is None:
    return [title] + lines(cols, rows) + [""]
  fits = lambda: max(len(ln) for ln in lines(cols, rows)) <= width  # noqa: E731
  shown = []
  if not fits() and points:
    idx = [cols.index(c) for c in points if c in cols]
    bare = [[_point(x) if i in idx else x for i, x in enumerate(r)] for r in rows]
    if bare != rows:
      rows = bare
      shown.append(f"{' and '.join(points)} without their intervals")
  left_out = []
  for name in drop:
    if fits():
      break
    i = cols.index(name)
    cols, rows = cols[:i] + cols[i + 1:], [r[:i] + r[i + 1:] for r in rows]
    left_out.append(name)
  if left_out:
    shown.append(f"not shown: {', '.join(left_out)}")
  note = [f"({'; '.join(shown)}; report.txt has every column in full)"] if shown else []
  return textwrap.wrap(title, width) + lines(cols, rows) + textwrap.wrap(" ".join(note), width) \
      + [""]


def _point(cell: str) -> str:
  """A table cell without its interval or its censoring note: "2.3e+12 [1.9e+12, 2.8e+12]" and
  "≥ 5.97e+11 (5/5 seeds censored)" as "2.3e+12" and "≥ 5.97e+11"."""
  return re.sub(r" (\[[^\]]*\]|\(\d+/\d+ seeds censored\)|±\S+)$", "", str(cell))


def format_table(report: dict, width: int | None = None) -> str:
  """Plain-text tables (the frontier, the main arms, the recovery arms) and the verdict lines.
  `width` (the terminal's, TERMINAL_WIDTH): tables wider than that leave out intervals of FLOPs
  and then their least-read columns, saying so (`_table`), and titles and verdicts are wrapped;
  without it (report.txt, the docs' markdown) every column is shown in full."""
  rec_d = report.get("recover_domain")
  conf = f"{100 * report.get('confidence', 0.95):.0f}%"
  seeds = report.get("seeds")
  kind = report.get("interval")
  over = (f"t intervals over seeds {seeds}" if kind == "seeds" else
          f"seed {seeds}: intervals over prompts, evaluation noise only" if kind == "prompts" else
          f"seeds {seeds}: percentile bootstrap over prompts and seeds")   # reports before t
  cover = (f"seed {seeds}: point estimates, no intervals (no bootstrap)" if point_only(report)
           else f"{over}, {conf}")
  out = []
  rows = frontier_rows(report)
  if rows:
    ref = report.get("reference_arm")
    front = report.get("frontier") or {}
    best = any(m.endswith("_best") for m in front)
    repeated = best and any(repeats_reference(front, m, lv) for m in front
                            for lv in front[m] if m.endswith("_best"))
    out += _table(f"Frontier: training FLOPs to each level (the base plus a share of {ref}'s "
                  f"gain" + (", or of the better route's where it says so: per domain, the "
                  "higher final accuracy of the two routes" if best else "")
                  + ("; a level where that is the reference on every domain of every seed "
                     "has no row of its own" if repeated else "")
                  + f"), each route's cheapest; {cover}",
                  ["level", "read on", ref, "split-then-merge", "saving", "distill/experts",
                   "cheapest expert stop per seed", "bracket joint / split",
                   "saving, stops between bars: at most"], rows, width,
                  points=(ref, "split-then-merge"),
                  drop=("saving, stops between bars: at most", "bracket joint / split",
                        "cheapest expert stop per seed", "distill/experts"))
  flat = report.get("flat_rule")
  # The frontier under MOPD's other flat rule: its rows that differ from the one as run.
  rows = frontier_rows(report, REPLAYED) if flat else []
  if rows:
    out += _table(f"Where the frontier differs with MOPD stopped on a curve "
                  f"{flat_rule_text(flat['replayed'], flat['evals'])}, replayed on the same runs "
                  f"(which stopped on one {flat_rule_text(flat['ran'], flat['evals'])}; a run "
                  "that would have gone on past its record is censored where it ends"
                  + (f"; seeds {flat['not_replayed']} could not be replayed"
                     if flat.get("not_replayed") else "") + f"); {cover}",
                  ["level", "read on", report.get("reference_arm"), "split-then-merge", "saving",
                   "distill/experts", "cheapest expert stop per seed", "bracket joint / split",
                   "saving, stops between bars: at most"], rows, width,
                  points=(report.get("reference_arm"), "split-then-merge"),
                  drop=("saving, stops between bars: at most", "bracket joint / split",
                        "cheapest expert stop per seed", "distill/experts"))
  recovery = [n for n, a in report["arms"].items() if a["group"] == "recovery"]
  # The main arms, then each degradation's recovery arms (a further depth's: degrade@<f>, ...).
  for group, sfx in [("main", "")] + [("recovery", x) for x in recovery_suffixes(recovery)]:
    arms = {n: a for n, a in report["arms"].items() if a["group"] == group
            and (group == "main" or recovery_suffix(n) == sfx)}
    if not arms:
      continue
    on = rec_d if group == "recovery" else None
    tgt = report.get("target_accuracy" if group == "main" else "recover_target" + sfx)
    title = ("Arms" if group == "main" else f"Self-teacher recovery of {rec_d}"
             + (f" from degrade{sfx}" if sfx else "")) + (
        f" (target {_ci(tgt, pct=True)}; savings vs "
        f"{report.get('reference_arm') if group == 'main' else 'recover_grpo' + sfx}; {cover})")
    cols = ["arm", "acc" if on is None else f"{on} acc", "greedy", "per domain", "train FLOPs",
            "FLOPs to target", "saving@target", "headroom", "resp len"]
    rows = []
    for name, a in arms.items():
      acc = a.get("accuracy_mean") if on is None else a.get("accuracy_recover_domain")
      greedy = a.get("greedy_mean") if on is None else (a.get("greedy") or {}).get(on)
      per = " ".join(f"{d}={_ci(v, pct=True).split(' [')[0]}"
                     for d, v in sorted((a.get("accuracy") or {}).items()))
      reach = a.get("flops_to_target")
      reach_s = "-" if not reach else (
          "0 (starts above)" if _num(reach) == 0 else _ci(reach))
      rows.append([name, _ci(acc, pct=True), _ci(greedy, pct=True), per,
                   _ci(a.get("flops_total")) if a.get("flops_total") else "- (not charged)",
                   reach_s, _ci(a.get("saving_at_target"), pct=True),
                   _ci(a.get("headroom_mean"), pct=True), _ci(a.get("response_length"))])
    out += _table(title, cols, rows, width, points=("train FLOPs", "FLOPs to target"),
                  drop=("resp len", "headroom", "greedy", "per domain"))
  if report.get("verdicts"):
    out += ["Verdicts:"] + [
        f"  - {v}" if width is None else
        textwrap.fill(v, width, initial_indent="  - ", subsequent_indent="    ")
        for v in report["verdicts"]] + [""]
  return "\n".join(out)


def _flat(prefix: str, v, into: dict) -> None:
  if isinstance(v, dict) and "mean" in v and "n" in v:
    into[prefix] = v
  elif isinstance(v, dict):
    for k, x in v.items():
      _flat(f"{prefix}/{k}" if prefix else k, x, into)


def write_report(report: dict, arms: Sequence[ArmResult], out_dir: str) -> dict[str, str]:
  """Writes report.json, report.csv, report.txt, curves.json and accuracy_vs_flops.png into
  `out_dir` (a local path or a gs:// URL); returns their paths. Each file is written atomically
  (smjax.paths.write_atomic), so a reader never sees a half-written one. On a multi-host run only
  process 0 writes (the others return the same paths)."""
  paths = {k: paths_lib.join(out_dir, f) for k, f in (
      ("json", "report.json"), ("csv", "report.csv"), ("curves", "curves.json"),
      ("plot", "accuracy_vs_flops.png"), ("table", "report.txt"))}
  if not distributed.is_coordinator():
    return paths
  paths_lib.makedirs(out_dir)

  def atomic(key, write):
    f = io.StringIO(newline="")
    write(f)
    paths_lib.write_atomic(paths[key], f.getvalue())

  atomic("json", lambda f: json.dump(report, f, indent=1))
  atomic("curves", lambda f: json.dump([dataclasses.asdict(a) for a in arms], f))

  def rows(f):
    w = csv.writer(f)
    w.writerow(["arm", "metric", "mean", "lo", "hi", "std", "n"])
    for name, a in report["arms"].items():
      flat: dict = {}
      _flat("", {k: v for k, v in a.items() if isinstance(v, dict)}, flat)
      for metric, v in flat.items():
        w.writerow([name, metric, v.get("mean"), v.get("lo"), v.get("hi"), v.get("std"),
                    v.get("n")])
  atomic("csv", rows)
  atomic("table", lambda f: f.write(format_table(report) + "\n"))
  png = io.BytesIO()
  plot_curves(arms, report, png)
  paths_lib.write_atomic(paths["plot"], png.getvalue(), tmp_suffix=".tmp.png")
  return paths


def _band(point: dict, on: str | None) -> float:
  """Half-width of a curve point's normal-approximation 95% interval over prompts (0 without
  per-prompt counts): for the mean over domains, the domains' errors combined."""
  ses = []
  for d, c in point.get("correct", {}).items():
    if on is not None and d != on:
      continue
    x = np.asarray(c, np.float64) / point.get("samples", 1)
    ses.append(x.std(ddof=1) / math.sqrt(len(x)) if len(x) > 1 else 0.0)
  if not ses:
    return 0.0
  return 1.96 * math.sqrt(sum(s * s for s in ses)) / len(ses)


def curve_series(arms: Sequence[ArmResult], *, recover_domain: str | None = None) -> dict:
  """What each panel of the plot draws: {group: {"ylabel", "domain", "series": [(arm, seed,
  flops, acc %, interval half-width %)], "targets"}}. "main": the mean held-out accuracy over
  domains; "degrade" / "recovery": the recovered domain's, in panels of their own (the recovery
  curves would be squeezed into the start of the degradation's much longer FLOP axis). A
  degradation whose FLOPs are not charged (SFT on noisy chains: every point at 0 FLOPs) is drawn
  as each seed's step from the joint model it degraded to the degraded model ("steps": the two
  x-axis labels)."""
  rec_d = recover_domain_of(arms, recover_domain)
  out = {}
  depths = recovery_suffixes([a.arm for a in arms if a.group == "recovery"])
  for group in ["main"] + [g + x for x in depths for g in ("degrade", "recovery")]:
    on = None if group == "main" else rec_d
    members = [a for a in arms if a.curve and (
        a.group == "main" if group == "main" else
        a.group == "recovery" and recovery_suffix(a.arm) == recovery_suffix(group)
        and (a.target is None) == group.startswith("degrade"))]
    if members:
      score = lambda p: p["mean"] if on is None else p["accuracy"][on]  # noqa: E731
      out[group] = {
          "series": [(a.arm, a.seed, [p["flops"] for p in a.curve],
                      [100 * score(p) for p in a.curve],
                      [100 * _band(p, on) for p in a.curve]) for a in members],
          "domain": on,
          "targets": sorted({a.target for a in members if a.target is not None}),
          "ylabel": "held-out accuracy (%), " + (
              "mean over domains" if on is None else f"{on} (the recovered domain)")}
      # The degradation trains the joint model further (smjax.study.run._self_teacher).
      joint = {a.seed: a for a in arms if a.arm == "joint_grpo" and a.curve}
      if group.startswith("degrade") and all(len({p["flops"] for p in a.curve}) == 1
                                             and a.seed in joint for a in members):
        ends = [(a, joint[a.seed].curve[-1], a.curve[-1]) for a in members]
        out[group]["series"] = [
            (a.arm, a.seed, [0, 1], [100 * score(before), 100 * score(after)],
             [100 * _band(before, on), 100 * _band(after, on)]) for a, before, after in ends]
        out[group]["steps"] = ("joint GRPO", "degraded (its SFT not charged)")
  return out


def line_style(i: int) -> tuple[str, str, str]:
  """The i-th arm's (colour, line style, marker): the ten default colours, then again with the
  next line style and marker, so that no two of up to 40 arms look alike (a four-domain study
  with its teachers' arms draws 14 lines in one panel)."""
  k = (i // 10) % 4
  return f"C{i % 10}", ("-", "--", "-.", ":")[k], ("o", "s", "^", "D")[k]


def plot_curves(arms: Sequence[ArmResult], report: dict, path) -> None:
  """Held-out accuracy against cumulative training FLOPs, one line per arm and seed with its 95%
  band over prompts, and the matched target; with the self-teacher study, the degradation and
  the recovery panels (`curve_series`); an arm run on to its cap past its stop rule has a cross
  where the rule would have ended it (report.rule_views). `path`: a local file name (its
  extension gives the format) or a binary file object (PNG)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  panels = curve_series(arms, recover_domain=report.get("recover_domain"))
  front = (report.get("frontier") or {}).get("mean")
  n = max(len(panels) + bool(front), 1)
  # At most three panels a row (two degradations make five with the main curves).
  cols = min(n, 3)
  rows = -(-n // cols)
  fig, grid = plt.subplots(rows, cols, figsize=(7 * cols, 5 * rows), squeeze=False)
  axes = list(grid.flat)
  for ax in axes[n:]:
    ax.set_visible(False)
  if front:
    plot_frontier(axes[0], report)
    axes = axes[1:]
  colors: dict[bool, dict[str, tuple[str, str, str]]] = {}
  rule_ends = {(a.arm, a.seed): int(a.rule_end["index"]) for a in arms
               if a.rule_end and a.rule_end.get("met") and a.group == "main"}
  titles = {"main": "Held-out accuracy vs training FLOPs", "degrade": "Degradation",
            "recovery": "Self-teacher recovery"}
  for ax, (panel_name, panel) in zip(axes, panels.items()):
    group, sfx = panel_name.partition("@")[0], recovery_suffix(panel_name)
    labelled = set()
    for arm, seed, xs, ys, band in panel["series"]:
      # A recovery route keeps its colour at every depth of the degradation; the recovery
      # panels number their few arms apart from the main panel's many.
      key = arm if group == "main" else arm.partition("@")[0]
      styles = colors.setdefault(group == "main", {})
      c, ls, mk = styles.setdefault(key, line_style(len(styles)))
      ax.plot(xs, ys, ls=ls, marker=mk, color=c, ms=3, alpha=0.9,
              label=None if arm in labelled else arm)
      ax.fill_between(xs, np.subtract(ys, band), np.add(ys, band), color=c, alpha=0.15, lw=0)
      labelled.add(arm)
      at = rule_ends.get((arm, seed)) if group == "main" else None
      if at is not None and at < len(xs):
        ax.plot([xs[at]], [ys[at]], "X", color=c, ms=9, mec="black", label=None if (
            "rule" in labelled) else "where its stop rule would have ended it")
        labelled.add("rule")
    tgt = report.get("target_accuracy" if group == "main" else "recover_target" + sfx)
    if tgt and not math.isnan(_num(tgt)):
      ax.axhline(100 * _num(tgt), color="gray", ls=":", lw=1,
                 label="matched target" if group == "main" else "recovery target")
    if panel.get("steps"):
      ax.set_xticks([0, 1], panel["steps"])
      ax.set_xlim(-0.3, 1.3)
      ax.set_xlabel("each seed's model before and after the degrade phase")
    else:
      ax.set_xlabel("cumulative training FLOPs (XLA cost analysis)"
                    + ("" if group == "main" else f" of the {group} phase"))
    ax.set_ylabel(panel["ylabel"])
    ax.set_title(titles[group] + (f" of {panel['domain']}" if panel["domain"] else "")
                 + (f" (degrade{sfx})" if sfx else "")
                 + " (bands: 95% over prompts)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120, **({} if isinstance(path, (str, os.PathLike)) else {"format": "png"}))
  plt.close(fig)


def plot_frontier(ax, report: dict) -> None:
  """Training FLOPs against accuracy level, one line per route (solid: the mean over domains at
  its level; dashed: every domain at its own), with its interval as a band; a censored point
  (the route had not got there when it stopped) is drawn as an open marker at its bound."""
  ref = report.get("reference_arm") or "reference"
  drawn = []
  for mode, ls in (("mean", "-"), ("every", "--")):
    at = (report.get("frontier") or {}).get(mode) or {}
    levels = sorted(at, key=float)
    for key, label, c in (("joint", ref, "C0"), ("split", "split-then-merge", "C1")):
      xs = [100 * float(lv) for lv in levels if at[lv].get(key)]
      vs = [at[lv][key] for lv in levels if at[lv].get(key)]
      if not xs:
        continue
      ys = [_num(v) for v in vs]
      drawn += ys
      lo = [_num(v, "lo") if not math.isnan(_num(v, "lo")) else y for v, y in zip(vs, ys)]
      hi = [_num(v, "hi") if not math.isnan(_num(v, "hi")) else y for v, y in zip(vs, ys)]
      ax.plot(xs, ys, ls, color=c, marker="o",
              label=f"{label} ({'mean' if mode == 'mean' else 'every domain'})")
      ax.fill_between(xs, lo, hi, color=c, alpha=0.12 if mode == "mean" else 0.06, lw=0)
      cens = [(x, y) for x, y, v in zip(xs, ys, vs) if int(v.get("bound") or 0)]
      if cens:
        ax.plot(*zip(*cens), "o", mfc="white", color=c, ms=8)
  finite = [y for y in drawn if math.isfinite(y)]
  if finite and min(finite) > 0:   # a level at the start is 0 FLOPs; none reached: nan
    ax.set_yscale("log")
  ax.set_xlabel(f"accuracy level (% of {ref}'s gain over the base)")
  ax.set_ylabel("training FLOPs to reach it (each route's cheapest)")
  ax.set_title("Compute frontier (open markers: censored, at least)")
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8)


def markdown(report: dict, part: str = "") -> str:
  """The report's tables and verdicts as GitHub markdown (what docs/ pages embed); `part`
  "recovery": claim (d)'s alone (the recovery table, the (d) lines, the recovery arms'
  collapses and the intervals line), for a page that shows the main arms elsewhere."""
  if part not in ("", "recovery"):
    raise ValueError(f"report part {part!r}: expected '' (all) or 'recovery'")
  out = []
  for block in format_table(report).split("\n\n"):
    lines = [ln for ln in block.splitlines() if ln.strip()]
    if not lines:
      continue
    if lines[0] == "Verdicts:":
      items = [ln.strip()[2:] for ln in lines[1:]]
      if part:
        items = [_recovery_only(v) for v in items]
        items = [v for v in items
                 if v and v.startswith(("(d)", "Collapsed", "Fell below", "Intervals"))]
      out.append("\n".join(["**Verdicts**", ""] + [f"- {v}" for v in items]))
      continue
    if part and not lines[0].startswith("Self-teacher recovery"):
      continue
    title, header, _, *rows = lines
    cut = _columns(header)
    cells = lambda ln: [ln[a:b].strip() for a, b in cut]  # noqa: E731
    out.append("\n".join([f"*{title}*", "", "| " + " | ".join(cells(header)) + " |",
                          "|" + "---|" * len(cut)] +
                         ["| " + " | ".join(cells(r)) + " |" for r in rows]))
  return "\n\n".join(out) + "\n"


def _recovery_only(line: str) -> str:
  """A verdict line listing runs ("Collapsed (...): a; b", "Fell below ... (...): a; b") cut to
  the recovery arms' entries ("" when none); any other line as it is."""
  if not line.startswith(("Collapsed", "Fell below")):
    return line
  head, _, entries = line.partition("): ")
  kept = [e for e in entries.split("; ") if e.startswith("recover_")]
  return f"{head}): " + "; ".join(kept) if kept else ""


def _columns(header: str) -> list[tuple[int, int]]:
  """Column spans of a format_table header (names are separated by two or more spaces)."""
  starts = [m.start() for m in re.finditer(r"(?:^|(?<=\s\s))\S", header)]
  return [(a, b) for a, b in zip(starts, starts[1:] + [None])]


def seeds_markdown(data: dict) -> str:
  """benchmarks/study_seeds.py's JSON as tables: per seed, the base's band measurement, then the
  base and each arm's final accuracy per domain with its interval, and whether its own domains'
  gain over the base clears the interval."""
  rows = []
  base_only = data.get("base_only", False)
  for r in data["seeds"] if not base_only else []:
    if "error" in r:
      rows.append(f"| {r['seed']} | failed: {' '.join(r['error'])} | | | |")
      continue
    base = " ".join(f"{d}={100 * v:.1f}%" for d, v in sorted(r["base"].items()))
    for arm, a in r["arms"].items():
      acc = " ".join(f"{d}={100 * v['mean']:.1f}% [{100 * v['lo']:.1f}, {100 * v['hi']:.1f}]"
                     for d, v in sorted(a["accuracy"].items()))
      gain = " ".join(f"{d}: {100 * g['gain']:+.1f} [{100 * g['lo']:+.1f}, {100 * g['hi']:+.1f}]"
                      f"{'' if g['learns'] else ' (not beyond)'}"
                      for d, g in sorted(a["gain_over_base"].items()))
      rows.append(f"| {r['seed']} | {base} | {arm} | {acc} | {gain} |")
  band = []
  for r in data["seeds"]:
    if "band" in r:
      k = r["band"]["samples"]
      band.append(f"| {r['seed']} | " + " ".join(
          f"{d}={100 * v:.1f}%" for d, v in sorted(r["band"]["accuracy"].items()))
          + " | " + " ".join(f"{d}={100 * v:.1f}%"
                             for d, v in sorted(r["band"]["pass_at_k"].items())) + " |"
          + (f" {'; '.join(r['misses']) if r['misses'] else 'in the band'} |"
             if base_only else ""))
    elif base_only:
      band.append(f"| {r['seed']} | failed: {' '.join(r['error'])} | | |")
  head = (f"`{data['command']}` ({data['config']}; {data['machine']['cpu']}, "
          f"{data['machine']['cores']} cores, {data['date']}; wall time per seed: "
          + ", ".join(f"{r['wall_s']:.0f} s" for r in data["seeds"]) + ")")
  if base_only:
    cfg = next((r["band_config"] for r in data["seeds"] if "band_config" in r), None)
    band_of = (f" against config.band (accuracy in [{100 * cfg['low']:.0f}%, "
               f"{100 * cfg['high']:.0f}%], pass@k at least {100 * cfg['min_headroom']:.0f} "
               "points above it)" if cfg else "")
    k = next((r["band"]["samples"] for r in data["seeds"] if "band" in r), 8)
    return "\n".join([head, "", "The base alone, per seed: its band measurement (sampled held-out "
                      f"accuracy, mean of {k} samples per prompt, and pass@{k}){band_of}:", "",
                      f"| seed | sampled accuracy | pass@{k} | band |", "|---|---|---|---|"]
                     + band) + "\n"
  band_table = (["The base's band measurement (sampled held-out accuracy, mean of "
                 f"{k} samples per prompt, and pass@{k}):", "",
                 f"| seed | sampled accuracy | pass@{k} |", "|---|---|---|"] + band + [""]
                if band else [])
  return "\n".join([head, ""] + band_table + [
      "| seed | base accuracy | arm | final accuracy [95%] | "
      "gain over base on its domains, points [95%] |", "|---|---|---|---|---|"] + rows) + "\n"


# ------------------------------------------------------------------------------ the regime map

def _pct(v: dict | None) -> str:
  return _ci(v, pct=True, signed=True) if v else "-"


def _points(v: dict | None) -> str:
  """An accuracy difference in points: "-3.5 [-7.4, +0.4] (0 of 3 seeds above)"."""
  if not v:
    return "-"
  per_seed = [stats.number(x) for x in v.get("per_seed") or []]
  f = lambda x: f"{100 * x:+.1f}"  # noqa: E731
  m, lo, hi = (stats.number(v.get(k)) for k in ("mean", "lo", "hi"))
  out = f(m) + (f" [{f(lo)}, {f(hi)}]" if math.isfinite(lo) and math.isfinite(hi) else "")
  return out + f" ({sum(x > 0 for x in per_seed)} of {len(per_seed)} seeds above)"


def map_markdown(data: dict) -> str:
  """A regime map's map.json (smjax.study.regimes.map_report) as a markdown table, one row per
  cell, then each cell's verdict line."""
  head = ("| cell | skill | difficulty | seeds | saving at the level, mean [interval] | "
          "every domain at its level | levels of the better route's gain: mean; every domain | "
          "distillation / experts | final accuracy, split-then-merge "
          "minus joint GRPO (points) | joint GRPO's zero-advantage groups |")
  lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
  for r in data["cells"]:
    mean, every = r.get("mean") or {}, r.get("every") or {}
    best = (f"{_pct((r.get('mean_best') or {}).get('saving'))}; "
            f"{_pct((r.get('every_best') or {}).get('saving'))}")
    zv = " ".join(f"{d} {100 * v:.0f}%" for d, v in sorted(
        (r.get("zero_variance_groups") or {}).items())) or "-"
    seeds = f"{len(r['seeds'])}" + ("" if r["status"] == "done" else f" ({r['status']})")
    lines.append(f"| {r['cell']} | {r['skill']} | {r['difficulty']}"
                 f"{' + ' + r['extra'] if r['extra'] else ''} | {seeds} | "
                 f"{_pct(mean.get('saving'))} | {_pct(every.get('saving'))} | {best} | "
                 f"{_pct(mean.get('distillation_share')).lstrip('+')} | "
                 f"{_points((r.get('final') or {}).get('difference'))} | {zv} |")
  read = {r["cell"]: cell_reading(r) for r in data["cells"] if r.get("mean")}
  # Each cell read again with MOPD's other flat rule replayed on its runs (where its row has it).
  other = {r["cell"]: (cell_reading(r["replayed"]), r["replayed"]["flat_rule"])
           for r in data["cells"] if (r.get("replayed") or {}).get("mean")}

  def swapped(cell):
    if cell not in other:
      return ""
    (what, why), flat = other[cell]
    return (f"; with MOPD stopped on a curve {flat_rule_text(flat['replayed'], flat['evals'])} "
            f"instead (replayed on the same runs): **{what}** ({why})")
  verdicts = [f"- **{r['cell']}** ({r['about']}): {r['mean']['verdict']}"
              + (f"; {r['mean_best']['verdict']}" if (r.get("mean_best") or {}).get("verdict")
                 else "") + f". By the map's rule: **{read[r['cell']][0]}** "
              f"({read[r['cell']][1]}){swapped(r['cell'])}" for r in data["cells"]
              if r.get("mean")]
  if read:
    level = next((f"{100 * r['level']:.0f} %" for r in data["cells"] if r.get("level")),
                 "the target level")
    verdicts = ["", f"By the map's rule (at {level} of the gain, on the mean over domains; "
                "the rule is in docs/regimes.md): " + "; ".join(
                    f"{what}: {', '.join(c for c, (w, _) in read.items() if w == what) or 'none'}"
                    for what in READINGS)
                + "."] + (["", (
                    "With MOPD's other flat rule replayed on the same runs (a cell that ran "
                    "without the FLOPs span read with it, and the other way round): " + "; ".join(
                        f"{what}: {', '.join(c for c, ((w, _), _) in other.items() if w == what)}"
                        for what in READINGS if any(w == what for (w, _), _ in other.values()))
                    + "".join(f"; not replayed (a row kept without its runs): {', '.join(rest)}"
                              for rest in [[c for c in read if c not in other]] if rest)
                    + "."), ""] if other else []) + verdicts
  teachers = [f"- **{r['cell']}**: " + "; ".join(v.removeprefix("(c) ") for v in r["teachers"])
              for r in data["cells"] if r.get("teachers")]
  if teachers:
    teachers = ["", "Claim (c) across teachers (external-teacher OPD from the bigger verbose "
                "teacher; control-teacher OPD from one of the student's size on plain chains):"
                ] + teachers
  fell = [f"- **{r['cell']}**: " + "; ".join(collapse_text(c["arm"], c) for c in r["collapsed"])
          for r in data["cells"] if r.get("collapsed")]
  if fell:
    fell = ["", "Runs whose policy collapsed (each ended there, an outcome of its route: the "
            "route is charged up to it and reaches no level past it):"] + fell
  kept = [r for r in data["cells"] if r.get("from")]
  if kept:
    where = sorted({f"{r['from']['file']} (the map of {r['from']['map']}"
                    + (f", written {r['from']['written']})" if r["from"].get("written") else ")")
                    for r in kept})
    fell += ["", f"Rows kept from an earlier map (`smjax report --keep`: their cells' workdirs are "
             f"not in {data['map']}): {', '.join(r['cell'] for r in kept)}; from "
             f"{'; '.join(where)}."]
  missing = data.get("not_started") or []
  tail = [f"\nNot started: {', '.join(missing)}."] if missing else []
  return "\n".join(lines + verdicts + teachers + fell + tail) + "\n"


# The paper's claims (arXiv:2611.08453, as reported), each with the verdict lines that speak to
# it: (claim, the paper's words, which of a report's verdict lines are its figures).
CLAIMS = (
    ("(a)", "split-then-merge matches joint GRPO's held-out accuracy with 42 % fewer total "
     "training FLOPs", ("(a) at ",)),
    ("(b)", "distillation costs 5.2 % of the experts' FLOPs with two domains, 8.0 % with four",
     ("(b) ",)),
    ("(c)", "OPD from external post-trained teachers loses to GRPO per FLOP and makes answers "
     "longer", ("(c) to ", "(c) external-teacher OPD answers")),
    ("(d)", "teachers made from the student's own earlier GRPO checkpoints cut the FLOPs to "
     "recover a degraded domain up to 50x", ("(d) the degradation", "(d) to recover")),
)


def _basis(report: dict) -> str:
  """What a report's intervals cover, in a few words."""
  seeds = report.get("seeds") or []
  runs = (f"seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 2 and seeds == list(
      range(seeds[0], seeds[-1] + 1)) else "seed" + ("s " if len(seeds) > 1 else " ")
          + ", ".join(map(str, seeds)))
  if report.get("interval", "seeds" if len(seeds) > 1 else "prompts") == "seeds":
    return f"{runs}; t intervals over seeds"
  return f"{runs} only; intervals over prompts, evaluation noise only"


def claims_markdown(reports: Sequence[tuple[str, dict]]) -> str:
  """The paper's claims, each followed by the verdict lines of `reports` ([(label, report)])
  that measure it: (a) on the reference's gain only (the better route's and the replayed flat
  rule's readings are in each report's own block), (b), (c)'s savings and the external
  teacher's answer length, (d)'s degradations and savings; a claim no report measures says
  so."""
  out = []
  for claim, paper, heads in CLAIMS:
    out += ["", f"**{claim}** The paper: {paper}.", ""]
    found = False
    for label, rep in reports:
      ref = rep.get("reference_arm") or "joint_grpo"
      lines = [v.removeprefix(claim + " ") for v in rep.get("verdicts") or []
               if v.startswith(heads) and (claim != "(a)" or f"of {ref}'s gain" in v.split(":")[0])]
      if lines:
        found = True
        out += [f"- `{label}` ({_basis(rep)}):"] + [f"  - {v}" for v in lines]
    if not found:
      out.append("- not measured by these studies yet")
  return "\n".join(out[1:]) + "\n"


GENERATED = "<!-- generated by `python -m smjax.study.render --update-docs` from {src} -->"
END = "<!-- end generated -->"


def update_docs(page: str) -> str:
  """`page` (a markdown text) with every generated block re-rendered from the report JSON it
  names (paths relative to the repository root, which the command runs in; "a.json,b.json#claims":
  the paper's claims across those reports, `claims_markdown`)."""
  pat = re.compile(re.escape(GENERATED).replace(r"\{src\}", r"(\S+)") + r"\n.*?" + re.escape(END),
                   re.S)

  def render(m):
    src, _, part = m.group(1).partition("#")   # "report.json#recovery": that part alone
    if part == "claims":   # "a.json,b.json#claims": the paper's claims across these reports
      reports = []
      for path in src.split(","):
        with open(path) as f:
          reports.append((os.path.basename(path).removeprefix("study_").removesuffix(
              "_report.json"), json.load(f)))
      return f"{GENERATED.format(src=m.group(1))}\n{claims_markdown(reports)}{END}"
    with open(src) as f:
      data = json.load(f)
    if "benchmark" in data:
      body = bench_markdown(data)
    elif "cells" in data and "map" in data:   # a regime map's map.json
      body = map_markdown(data)
    else:
      body = (seeds_markdown(data) if "command" in data and "seeds" in data
              else markdown(data, part))
    return f"{GENERATED.format(src=m.group(1))}\n{body}{END}"
  return pat.sub(render, page)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m smjax.study.render",
                               description="Render study reports as markdown.")
  ap.add_argument("--markdown", metavar="REPORT_JSON", help="print a report.json as markdown")
  ap.add_argument("--update-docs", nargs="*", metavar="PAGE",
                  help="re-render the generated blocks of these pages in place "
                       "(default: README.md and docs/*.md)")
  a = ap.parse_args(argv)
  if a.markdown:
    print(markdown(json.loads(paths_lib.read_text(a.markdown))), end="")
  if a.update_docs is not None:
    for page in a.update_docs or ["README.md"] + sorted(glob.glob("docs/*.md")):
      with open(page) as f:
        text = f.read()
      new = update_docs(text)
      if new != text:
        with open(page, "w") as f:
          f.write(new)
        print(f"updated {page}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
