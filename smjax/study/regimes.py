"""The regime map: under which conditions does split-then-merge save compute, and by how much?

One study cannot say: its verdict holds for its domains. The map runs the main comparison (the
base, joint GRPO, experts at the per-domain batch, the MOPD frontier: claims (a) and (b)) over a
grid of conditions, each condition (a *cell*) a whole study in its own workdir under the map's
folder, so that a cell resumes from its checkpoints, a finished cell is reused, and the map renders
from whatever cells have finished seeds:

  make regimes REGIMES_WORKDIR=runs/regimes           # two cells at a time (hours on 2 cores)
  python -m smjax.main --config=configs/regimes.py:disjoint_even --workdir=runs/regimes/disjoint_even
  smjax report runs/regimes                           # the map, partial while cells run
  python -m smjax.study.regimes cells                 # the cells' names, conditions, domains

The grid: skill {shared, disjoint, interfering} x difficulty {even, uneven}, plus two extra cells:
strong-to-weak (experts of a bigger model than the student) and sparse (a base far below the
usual band, with chains of several decision sites of more than one kind). Per cell the map gives
the frontier's saving at the report's target level (mean over domains, and every domain at its
level) with its seed-level interval and how many seeds agree, and the diagnostics that explain
it: joint GRPO's share of zero-advantage groups per domain (samples spent on a domain it has
solved, or cannot yet solve), each route's FLOPs to the level, distillation's share of the
experts' FLOPs; and each route's final accuracy, since the levels are shares of joint GRPO's gain
and a route that ends above joint GRPO shows it there, not in a saving.

Cells are `Cell`s: their settings are config overrides on `study_defaults()`, sized as the full
two-domain study (`configs/study.py:two_domain,full,main`), each calibrated so that its base
lands in the cell's band on every seed (benchmarks/study_seeds.py --base-only); a seed outside
the band stops that cell, and the map says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import json
import math
import os
import sys
from typing import Any

import ml_collections as mlc
import numpy as np

from smjax import paths
from smjax.json_io import config_diff, read_json
from smjax.study import layout, rules, stats
from smjax.study.verdicts import (FRONTIER_READINGS, JOINT_AT_BARS, REPLAYED, cell_reading,
                                  claim_a_head)

SKILLS = ("shared", "disjoint", "interfering")
DIFFICULTIES = ("even", "uneven")


@dataclasses.dataclass(frozen=True)
class Cell:
  """One condition of the map: its name (the cell's directory), where it sits on the grid
  (`skill`, `difficulty`; `extra` for the cells beside the grid), what it tests in words, and its
  config overrides (dotted field -> value) on the full study's settings. `same_as`: a study
  config (`configs/<file>.py:<arg>`) whose every phase this cell's would compute alike, so that
  a workdir of that study lends the cell its seeds (`share`); `shares`: where only some phases
  are alike, their names (a workdir of that study lends the cell those phases)."""
  name: str
  skill: str
  difficulty: str
  about: str
  settings: dict[str, Any]
  extra: str = ""
  same_as: str = ""
  shares: tuple[str, ...] = ()


# Shared by every cell: the main comparison at the full study's sizes, three seeds (the map's
# cost is cells x seeds; five where the budget allows: --config.seeds). The map reads sampled
# accuracy only, so its cells skip the greedy pass (a quarter of every evaluation's time, and
# evaluation is most of a cell's), except shared_even, which is the full study itself. The
# experts, then the MOPD runs, side by side (parallel_phases, as the full study: a toy phase keeps
# about one of 2 cores busy; run-neutral).
MAIN = ("base", "joint", "experts", "mopd")
_COMMON = {"phases": MAIN, "seeds": (0, 1, 2), "mopd.steps": 400, "eval.points": 10,
           "external.steps": 400, "self_teacher.recover_steps": 300, "eval.greedy": False,
           "parallel_phases": 2}
# Claim (c) across teachers (external-teacher OPD from the bigger verbose teacher, and from the
# control teacher of the student's size on plain chains) in the cells where it is cheap:
# shared_even, whose seeds the full two-domain study runs with every arm anyway, and
# interfering_even, where a teacher shows the tag's meaning token by token.
WITH_TEACHERS = MAIN + ("external",)
# The experts' bars of the cells run after the first six: one more between 0.9 and 0.95 of joint
# GRPO's gain. Split-then-merge's figure is the cheapest checkpoint set that gets its student to
# a level, and on the first cells it sat at the 0.95 bar on most seeds, the 0.9 set's student
# just short: the step between those two bars was as large as the saving itself
# (interfering_uneven: -51 % at the bars, -3 % with stops anywhere between them). One more MOPD
# run a seed.
FINER_BARS = (0.75, 0.9, 0.925, 0.95, 1.0)
# ...and MOPD's flat curve read over at least a quarter more of its own FLOPs, not only three
# evaluations: disjoint_uneven's 0.9 sets, evaluated every few steps, were stopped as flat while
# their hard domain had risen 1.6-2.1 points on the stop set over their last quarter of FLOPs.
LATER = {"experts.bars": FINER_BARS, "mopd.plateau_flops_fraction": rules.FLAT_SPAN}

CELLS = (
    Cell("shared_even", "shared", "even",
         "math and code: one column rule with a carry or borrow flag; both at level 1",
         {"domains": ("math", "code"), "eval.greedy": True, "phases": WITH_TEACHERS},
         same_as="configs/study.py:two_domain,full"),
    Cell("shared_uneven", "shared", "uneven",
         "math at its hard level (three-term sums: about 4 decision sites of two kinds, a carry "
         "dropped or a carry of 2 taken as 1) beside code at level 1: joint GRPO keeps "
         "sampling code once code is solved",
         # The hard domain's base in the hard band (2-15 %; measured 5.7-6.6 % on seeds 0-2),
         # the easy one in the usual band: a slow domain beside a fast one.
         {"domains": ("math", "code"), "domain_difficulty": "math=3", "band.hard_domains": "math"}),
    Cell("disjoint_even", "disjoint", "even",
         "math and strings (a running tally): no shared rule; both at level 1",
         {"domains": ("math", "strings"), "base.domain_correct_fraction": "strings=0.3"}),
    Cell("disjoint_uneven", "disjoint", "uneven",
         "strings at its hard level (10 letters over 6: about 8 sites, a repeat not counted "
         "or a letter left unsorted) beside math at level 1",
         # At the even cell's mixture rate (0.3) the hard strings landed at 16-20 % on seeds 0-2,
         # between the bands; at 0.15, in the hard band like shared_uneven's hard math.
         {"domains": ("math", "strings"), "domain_difficulty": "strings=3",
          "base.domain_correct_fraction": "strings=0.15", "band.hard_domains": "strings"}),
    Cell("interfering_even", "interfering", "even",
         "add and sub: one surface form (a?b), opposite operations told apart by a one-letter "
         "tag, the base's mistakes a column worked by the other operation; joint GRPO must "
         "learn to condition on the tag from a one-bit reward",
         # Every add/sub example has a decision site, so nothing lifts the base above the
         # mixture's rate. With carry and borrow sites, seed 0 landed at 13-14 % with math's
         # 0.1 and in the band at 0.3; with the operation's sites (about 2.7 an answer, not 1.5)
         # at 0.3 it landed at 17-19 %, below the band, hence 0.45. Its teachers' arms ran
         # before external.to_cap, ended by their stop rule: the cell keeps that, so that its
         # record stays its run (a fresh workdir with external.to_cap=True reads both ends).
         {"domains": ("add", "sub"), "base.correct_fraction": 0.45, "phases": WITH_TEACHERS,
          "external.to_cap": False}),
    Cell("interfering_uneven", "interfering", "uneven",
         "add and sub with sub at its wider level (4 digits: its chains up to 45 tokens) and "
         "in the hard band: a slow domain beside a fast one, told apart by the tag alone",
         # As the other uneven cells: the hard domain in the hard band, the easy one in the
         # usual band. With both at 0.45 (the even cell's rate) seed 2 landed below the usual
         # band (add 24.3 %, sub 17.5 %; seeds 0-1 in it, sub 35.7-45.8 %): sub's spread over
         # seeds is wider than the usual band; 0.12 puts it in the hard band.
         {"domains": ("add", "sub"), "domain_difficulty": "sub=2", "rl.max_new_tokens": 48,
          "base.correct_fraction": 0.45, "base.domain_correct_fraction": "sub=0.12",
          "band.hard_domains": "sub"}),
    Cell("strong_to_weak", "shared", "even",
         "the shared-even cell with GRPO experts of a bigger model (toy-small, from a base of its "
         "own) distilled into the toy-tiny student; joint GRPO on the student is the reference",
         # With shared_even's greedy pass, the student's base and joint GRPO read what the full
         # two-domain study's do, so that study's workdir lends them (`share`): the reference is
         # shared_even's own runs, and the two cells differ in their experts alone.
         {"domains": ("math", "code"), "experts.preset": "toy-small", "eval.greedy": True,
          "phases": MAIN + ("joint_strong",), **LATER},
         extra="strong-to-weak", same_as="configs/study.py:two_domain,full",
         shares=("base", "joint_grpo")),
    Cell("sparse", "shared", "even",
         "math and code at their hard levels (at least 3 decision sites of two kinds in every "
         "answer; code's chains up to 51 tokens) with a base far below the usual band (sampled "
         "accuracy ~2-15 %, pass@8 ~10-40 %): the one-bit reward is sparse",
         {"domains": ("math", "code"), "domain_difficulty": "math=3,code=3",
          # 0.05 left seed 1's math at 1.6 % (seeds 0 and 2: 3.3 % and 4.8 %; code 4-5 %).
          "base.correct_fraction": 0.08, "band.hard_domains": "math,code",
          "model.max_seq_len": 80, "base.seq_len": 80,
          "rl.max_new_tokens": 56, **LATER},
         extra="sparse"),
)


def cell(name: str) -> Cell:
  """The cell called `name`; ValueError naming the known cells."""
  for c in CELLS:
    if c.name == name:
      return c
  raise ValueError(f"regime cell {name!r} is not one of {[c.name for c in CELLS]}")


def _set(c: mlc.ConfigDict, field: str, value) -> None:
  *sections, key = field.split(".")
  d = c
  for s in sections:
    d = d[s]
  if key not in d:
    raise ValueError(f"regime cell setting {field!r}: the study config has no such field")
  d[key] = value


def cell_config(name: str, *, tiny: bool = False) -> mlc.ConfigDict:
  """The study config of cell `name`: the study's defaults at the full two-domain sizes, the
  main comparison's phases, then the cell's settings. `tiny`: sizes for a test (seconds of
  training, one seed, no band check): the cell's conditions, none of its figures' meaning."""
  # pylint: disable-next=import-outside-toplevel
  from smjax.study.config import study_defaults
  spec = cell(name)
  c = study_defaults()
  c.name = f"regimes/{name}"
  n = len(spec.settings.get("domains", c.domains))
  settings = {**_COMMON, "joint.steps": 400 * n, "experts.steps": 400 * n, **spec.settings}
  if tiny:
    settings.update({
        "seeds": (0,), "heldout_size": 16, "stop_size": 16, "eval.batch_size": 16,
        "eval.points": 3, "base.steps": 20, "joint.steps": 6, "experts.steps": 6,
        "mopd.steps": 6, "rl.prompts_per_step": 4, "opd.prompts_per_step": 4,
        "rl.samples_per_prompt": 4, "opd.samples_per_prompt": 2, "checkpoint_every": 2,
        "band.check": False, "eval.samples": 2, "eval.greedy": False, "progress": False,
        "phases": MAIN})
  for field, value in settings.items():
    _set(c, field, value)
  return c


def share(study_workdir: str, map_workdir: str, name: str) -> list[str]:
  """Lends cell `name` what a study it is the same as (`Cell.same_as`) has run, as links under
  `map_workdir/<name>/`: each `seed_<k>` directory of `study_workdir` whole, so that the cell's
  run reuses every phase that study finished (and writes the phases it adds, e.g. the teachers'
  arms, into the study's seed directories: one study, not two); or, for a cell alike in some
  phases only (`Cell.shares`), each seed's finished phases of those names, with the seed's
  evaluation grid (eval_interval.json, copied), so that the cell computes the rest itself on the
  same grid. The study's config.json must agree with the cell's on every field that is not
  run-neutral (seeds and phases may differ), or on every field the shared phases read; each
  phase is checked again when it is loaded. Writes the cell's config.json when it has none.
  Local workdirs only (links). Returns the directories it linked; one the cell already has on
  its own is an error, raised before anything is written."""
  # pylint: disable-next=import-outside-toplevel
  from smjax.study.config import RUN_NEUTRAL_FIELDS, upgrade_old_config
  spec = cell(name)
  if not spec.same_as:
    raise ValueError(f"regime cell {name!r} is the same as no study; cells that are: "
                     f"{[c.name for c in CELLS if c.same_as]}")
  if paths.is_url(study_workdir) or paths.is_url(map_workdir):
    raise ValueError(f"share links directories, so both workdirs must be local; got "
                     f"{study_workdir} and {map_workdir}")
  study_cfg = paths.join(study_workdir, "config.json")
  old = read_json(study_cfg, f"give the workdir of a study run with {spec.same_as}")
  config = cell_config(name)
  from smjax.study import store  # pylint: disable=import-outside-toplevel
  if spec.shares:
    reads = tuple(dict.fromkeys(f for p in spec.shares
                                for f in layout.read_fields(layout.spec_of(p))))
    ignored = store.unread_fields(config, reads)
  else:
    ignored = RUN_NEUTRAL_FIELDS
  diff = config_diff(upgrade_old_config(old), config.to_dict(), ignored)
  if diff:
    what = f"its {', '.join(spec.shares)}" if spec.shares else "it"
    raise ValueError(f"{study_cfg}: not a study the cell {name!r} can share {what} with (it is "
                     f"{spec.same_as}); differing fields (study -> cell): " + "; ".join(diff))
  cell_dir = os.path.join(map_workdir, name)
  if spec.shares:
    linked = store.lend(study_workdir, cell_dir, spec.shares)   # refusals before any write
  else:
    seeds = layout.seed_dirs(study_workdir)
    if not seeds:
      raise ValueError(f"{study_workdir}: no seed_<k> directories to share")
    todo = store.new_links(   # every refusal before anything is written
        [(os.path.abspath(os.path.join(study_workdir, d)), os.path.join(cell_dir, d))
         for d in seeds], "the cell ran it on its own; move it away to share the study's")
    os.makedirs(cell_dir, exist_ok=True)
    for src, dst in todo:
      os.symlink(src, dst)
    linked = [dst for _, dst in todo]
  # The cell's own config.json (as its run writes it), so that the map renders the shared seeds
  # before the cell has run.
  if not os.path.exists(os.path.join(cell_dir, "config.json")):
    os.makedirs(cell_dir, exist_ok=True)
    paths.write_atomic(os.path.join(cell_dir, "config.json"),
                       json.dumps(config.to_dict(), indent=1))
  return linked


# ------------------------------------------------------------------------------- the map report

MAP_FILE = "map.json"


def is_map(workdir: str) -> bool:
  """Whether `workdir` is a map's folder: no study of its own (config.json), and at least one
  cell's workdir (a directory named after a cell, holding a config.json)."""
  if paths.exists(paths.join(workdir, "config.json")):
    return False
  return any(paths.exists(paths.join(workdir, c.name, "config.json")) for c in CELLS)


def _zero_variance(cell_dir: str, seeds, domains) -> dict[str, float]:
  """Joint GRPO's share of groups whose rewards are all equal, per domain, over its whole run and
  the given seeds (its metrics.jsonl rows): samples that carried no GRPO signal. A run that logged
  only the share over all domains (before the per-domain metric) gives that, as "all domains"."""
  vals: dict[str, list[float]] = {d: [] for d in domains}
  overall: list[float] = []
  for s in seeds:
    path = paths.join(cell_dir, f"seed_{s}", "joint_grpo", "logs", "metrics.jsonl")
    if not paths.exists(path):
      continue
    for line in paths.read_text(path).splitlines():
      row = json.loads(line) if line.strip() else {}
      for d in domains:
        v = row.get(f"zero_variance_groups/{d}")
        if v is not None:
          vals[d].append(float(v))
      if row.get("reward/zero_variance_groups") is not None:
        overall.append(float(row["reward/zero_variance_groups"]))
  out = {d: float(np.mean(v)) for d, v in vals.items() if v}
  return out or ({"all domains": float(np.mean(overall))} if overall else {})


def cell_row(name: str, cell_dir: str, out_dir: str, bootstrap: int | None = None) -> dict:
  """One cell's line of the map from its workdir: its report (written to `out_dir`), the saving
  at the target level on both frontiers with their intervals and seed agreement, distillation's
  share, each route's FLOPs to the level, joint GRPO's zero-advantage share per domain, and each
  route's final accuracy with their difference per seed (`final`). A cell with no finished
  comparison yet says what it has."""
  # pylint: disable=import-outside-toplevel
  from smjax.study.run import load_arms, make_report
  spec = next((c for c in CELLS if c.name == name), None)
  row = {"cell": name, "skill": spec.skill if spec else "?",
         "difficulty": spec.difficulty if spec else "?", "extra": spec.extra if spec else "",
         "about": spec.about if spec else ""}
  config = mlc.ConfigDict(read_json(paths.join(cell_dir, "config.json"),
                                    "rerun the cell's study command, which writes it",
                                    keys=("report", "phases")))
  if bootstrap is not None:
    config.report.bootstrap = bootstrap
  arms = load_arms(cell_dir)
  ref = config.report.reference_arm
  done = sorted({a.seed for a in arms if a.arm == ref} & {a.seed for a in arms
                                                        if a.arm == "split_merge"})
  row["seeds"], row["seeds_started"] = done, sorted({a.seed for a in arms})
  row["domains"] = list(config.domains)
  if not done:
    row["status"] = "running" if arms else "not started"
    return row
  report = make_report(config, [a for a in arms if a.seed in done], out_dir)
  # done: every configured seed finished (a shared study may bring more seeds than the cell asks)
  row["status"] = "done" if set(config.seeds) <= set(done) else "partial"
  level = f"{float(config.report.target_fraction):g}"
  row["level"] = float(config.report.target_fraction)
  row["interval"] = report.get("interval")
  keys = ("saving", "distillation_share", "joint", "split", "sets", "grid_step",
          "saving_finer_bars", "capture_needed", "capture_reached")
  for on, of, where, _ in FRONTIER_READINGS:
    f = (report.get("frontier") or {}).get(on, {}).get(level) or {}
    if "saving" not in f:
      continue
    row[on] = {k: f.get(k) for k in keys}
    # The cell's own verdict line on claim (a) at the level (smjax.study.verdicts).
    head = claim_a_head(row["level"], of, ref, where)
    row[on]["verdict"] = next((v for v in report.get("verdicts") or [] if v.startswith(head)),
                              "")
  # The same, with MOPD's other flat rule replayed on the same runs (run.flat_rule_replay), so
  # that the map reads each cell under both rules.
  if report.get("flat_rule"):
    row["replayed"] = {"flat_rule": report["flat_rule"]} | {
        on: {k: f.get(k) for k in keys} for on, *_ in FRONTIER_READINGS
        for f in [(report.get("frontier") or {}).get(on + REPLAYED, {}).get(level) or {}]
        if "saving" in f}
  row["zero_variance_groups"] = _zero_variance(cell_dir, done, row["domains"])
  # Each route's ceiling: the levels are shares of joint GRPO's gain, so a cell where
  # split-then-merge ends above joint GRPO (interfering skills, say) shows it here, not in a
  # saving. Final held-out accuracy (mean over domains) of joint GRPO and of the student
  # distilled from the experts' final checkpoints (`split_merge`), and their difference per seed.
  arms_r = report.get("arms") or {}
  merged = arms_r.get("split_merge") or {}
  if "accuracy_vs_reference" in merged:
    row["final"] = {"joint": (arms_r.get(ref) or {}).get("accuracy_mean"),
                    "split": merged.get("accuracy_mean"),
                    "difference": merged["accuracy_vs_reference"]}
  # Claim (c) across teachers, in the cells that run the teachers' arms: the cell's own (c)
  # lines (the bigger verbose teacher's and the student-size plain one's OPD against joint GRPO,
  # in FLOPs to the level and answer length).
  row["teachers"] = [v for v in report.get("verdicts") or [] if v.startswith("(c)")]
  # Runs whose policy collapsed (each ended there, an outcome of its route; smjax.train.guards).
  row["collapsed"] = [{"arm": name, **c} for name, arm in sorted(arms_r.items())
                      for c in arm.get("collapsed") or []]
  return row


def earlier_rows(path: str) -> dict[str, dict]:
  """The cells' rows of an earlier map's map.json (`path`), by cell, each marked with the map it
  came from (`from`: the file, the earlier map's folder and the date it was written; kept as it
  was when that map had the row from another one).
  ValueError naming the file when it is not a map's map.json."""
  data = read_json(path, "give the map.json that `smjax report MAP` wrote", keys=("cells", "map"))
  if not isinstance(data["cells"], list):
    raise ValueError(f"{path}: 'cells' is a {type(data['cells']).__name__}, expected a list of "
                     "the map's rows")
  came = {"file": path, "map": data["map"], "written": data.get("written")}
  rows = {}
  for r in data["cells"]:
    if not isinstance(r, dict) or "cell" not in r or "status" not in r:
      raise ValueError(f"{path}: a row of 'cells' is not a map cell's row (expected 'cell' and "
                       f"'status'); got {str(r)[:80]}")
    rows[r["cell"]] = {**r, "from": r.get("from") or came}
  return rows


def map_report(workdir: str, out: str | None = None, bootstrap: int | None = None,
               keep: str | None = None) -> dict:
  """The map from `workdir`'s cells (every cell directory that holds a study, in CELLS' order):
  each cell's report under `out`/<cell>/, and `out`/map.json, map.md and map.png (the savings
  with their intervals per cell). `keep`: an earlier map's map.json whose rows stand for the cells
  `workdir` has no directory of (a map run piece by piece on machines whose workdirs are gone);
  each such row says where it came from, and a cell `workdir` holds is always computed afresh."""
  out = out or paths.join(workdir, "report")
  names = [c.name for c in CELLS]
  kept = earlier_rows(keep) if keep else {}
  found = [n for n in names if paths.exists(paths.join(workdir, n, "config.json"))]
  if not found:
    raise ValueError(f"{workdir}: no cell of the regime map has started (expected directories "
                     f"named after cells: {names})")
  from smjax.study.render import map_markdown  # pylint: disable=import-outside-toplevel
  rows = [cell_row(n, paths.join(workdir, n), paths.join(out, n), bootstrap) if n in found
          else kept[n] for n in names if n in found or n in kept]
  data = {"map": workdir, "written": datetime.date.today().isoformat(), "cells": rows,
          "not_started": [n for n in names if n not in found and n not in kept]}
  paths.makedirs(out)
  paths.write_atomic(paths.join(out, MAP_FILE), json.dumps(data, indent=1, default=_jsonable))
  paths.write_atomic(paths.join(out, "map.md"), map_markdown(data))
  png = io.BytesIO()
  plot_map(data, png)
  paths.write_atomic(paths.join(out, "map.png"), png.getvalue(), tmp_suffix=".tmp.png")
  data["paths"] = {"json": paths.join(out, MAP_FILE), "markdown": paths.join(out, "map.md"),
                   "plot": paths.join(out, "map.png")}
  return data


def _jsonable(x):
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  raise TypeError(f"not JSON-serialisable: {type(x)}")


def plot_map(data: dict, path) -> None:
  """Each cell's saving at the level (mean over domains) with its interval and its seeds' values
  (a censored seed as a triangle pointing where its true value lies), the level read as a share
  of joint GRPO's gain and, just below it, of the better route's; each cell labelled with its
  reading by the map's rule (verdicts.cell_reading), and under MOPD's other flat rule where
  that differs; 0 (the routes cost the same) and the paper's 42 % marked. Where a value lies
  beyond -200 %, the axis is linear within ±100 % and logarithmic beyond, so that one very dear
  cell does not squash the others. `path`: a file name or a binary file object (PNG)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  rows = [r for r in data["cells"] if r.get("mean")]
  fig, ax = plt.subplots(figsize=(8, 0.6 * max(3, len(rows)) + 1.8))
  labels = {"mean": "levels of joint GRPO's gain", "mean_best": "levels of the better route's",
            0: "a seed", 1: "a censored seed: at least", -1: "a censored seed: at most"}
  drawn: list[float] = []
  for i, r in enumerate(rows):
    for on, dy, c in (("mean", 0.0, "C0"), ("mean_best", -0.25, "C3")):
      if "saving" not in (r.get(on) or {}):
        continue
      s = r[on]["saving"]
      m, lo, hi = (stats.number(s.get(k)) for k in ("mean", "lo", "hi"))
      if math.isfinite(lo) and math.isfinite(hi):
        ax.plot([100 * lo, 100 * hi], [i + dy] * 2, color=c, lw=2)
        drawn += [100 * lo, 100 * hi]
      if math.isfinite(m):
        ax.plot([100 * m], [i + dy], "o", color=c, label=labels.pop(on, None))
      seeds = stats.per_seed(s)
      for side, marker in ((0, "x"), (1, ">"), (-1, "<")):   # a censored seed: where it points
        at = [100 * x for x, sd in seeds if sd == side and math.isfinite(x)]
        if at:
          ax.plot(at, [i + dy] * len(at), marker, color="C1", ms=5, label=labels.pop(side, None))
          drawn += at
  ax.axvline(0, color="k", lw=0.8)
  ax.axvline(42, color="C2", ls="--", lw=0.8, label="the paper's 42 %")
  short = {JOINT_AT_BARS: "favours joint GRPO (at the bars)"}   # the others fit as they are

  def label(r):   # the cell, its reading, and its reading under the other flat rule if it differs
    w = cell_reading(r)[0]
    other = cell_reading(r["replayed"])[0] if (r.get("replayed") or {}).get("mean") else w
    return f"{r['cell']}\n{short.get(w, w)}" + (
        "" if other == w else f"\n(other flat rule: {short.get(other, other)})")
  ax.set_yticks(range(len(rows)), [label(r) for r in rows], fontsize=7)
  wide = min(drawn, default=0.0) < -200
  if wide:
    ax.set_xscale("symlog", linthresh=100)
    ax.set_xlim(left=1.4 * min(drawn))
  ax.set_xlabel("split-then-merge's FLOP saving against joint GRPO at the target level (%)"
                + ("\n(linear within ±100 %, logarithmic beyond)" if wide else ""))
  ax.set_title("The regime map: each cell's mean [interval] and its seeds")
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110, format="png")
  plt.close(fig)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m smjax.study.regimes",
                              description=__doc__.split("\n\n")[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  cells = sub.add_parser("cells", help="the cells' names, conditions and domains")
  cells.add_argument("--names", action="store_true", help="the names alone, one per line")
  sh = sub.add_parser("share", help="lend a cell the seeds (or the phases) of a study it is the "
                      "same as (shared_even: configs/study.py:two_domain,full; strong_to_weak: "
                      "that study's base and joint GRPO)")
  sh.add_argument("study_workdir")
  sh.add_argument("map_workdir")
  sh.add_argument("--cell", default="shared_even")
  a = p.parse_args(argv)
  if a.cmd == "share":
    try:
      linked = share(a.study_workdir, a.map_workdir, a.cell)
    except (ValueError, FileNotFoundError) as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    kind = "phase" if cell(a.cell).shares else "seed"
    print(f"{a.cell}: linked {len(linked)} {kind} directories from {a.study_workdir}")
    return 0
  if a.cmd == "cells" and a.names:
    print("\n".join(c.name for c in CELLS))
  elif a.cmd == "cells":
    for c in CELLS:
      print(f"{c.name:20s} {c.skill:12s} {c.difficulty:7s} {c.extra:15s} "
            f"{','.join(c.settings.get('domains', ()))}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
