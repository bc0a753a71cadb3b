"""The regime map's cells (smjax.study.regimes, configs/regimes.py): each a valid study config
whose domains, difficulties and models say its condition; the grid complete. (A map rendered from
real cell workdirs: test_experiment.test_a_regime_map_renders_its_cells_partial_ones_too.)"""

import itertools
import os

import pytest

from smjax import config_files
from smjax.study import regimes
from smjax.study import config as study_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _regimes_config(arg):
  """This clone's configs/regimes.py (by path: not an installed copy) with `arg`."""
  return config_files.load(os.path.join(ROOT, "configs", "regimes.py"), arg)


def test_the_grid_is_complete_and_the_extra_cells_are_beside_it():
  grid = {(c.skill, c.difficulty) for c in regimes.CELLS if not c.extra}
  assert grid == set(itertools.product(regimes.SKILLS, regimes.DIFFICULTIES))
  assert {c.extra for c in regimes.CELLS if c.extra} == {"strong-to-weak", "sparse"}
  assert len({c.name for c in regimes.CELLS}) == len(regimes.CELLS)


@pytest.mark.parametrize("name", [c.name for c in regimes.CELLS])
@pytest.mark.parametrize("tiny", [False, True])
def test_every_cell_is_a_valid_study_of_its_condition(name, tiny):
  c = _regimes_config(name + (",tiny" if tiny else ""))
  study_config.validate(c)
  cell = regimes.cell(name)
  teachers = name in ("shared_even", "interfering_even") and not tiny
  assert c.phases == ("base", "joint", "experts", "mopd") + (("external",) if teachers else ()) + (
      ("joint_strong",) if name == "strong_to_weak" and not tiny else ())
  assert c.eval.greedy == (name in ("shared_even", "strong_to_weak") and not tiny)
  assert c.experts.prompts_per_step == 0   # experts at the per-domain batch in every cell
  skills = {"shared": {"math", "code"}, "disjoint": {"math", "strings"},
            "interfering": {"add", "sub"}}
  assert set(c.domains) == skills[cell.skill]
  levels = study_config.difficulties(c)
  assert (len(set(levels.values())) > 1) == (cell.difficulty == "uneven"), levels
  if cell.extra == "strong-to-weak":
    assert c.experts.preset and c.experts.preset != c.model.preset
  hard = study_config.hard_domains(c.band, study_config.domain_keys(c))
  if cell.extra == "sparse":   # every domain hard, judged by the hard band
    assert set(hard) == set(c.domains) and c.band.hard_high <= 0.15 and min(levels.values()) >= 3
  if cell.name in ("shared_uneven", "disjoint_uneven"):   # the domain at the hard level
    assert hard == (max(levels, key=levels.get),), (hard, levels)
  if tiny:
    assert c.seeds == (0,) and not c.band.check
  else:
    assert len(c.seeds) >= 3 and c.band.check


def test_the_recorded_cells_are_still_the_cells_the_code_defines():
  """Every cell recorded in docs/regimes/records ran under the config its code defines today (up to
  run-neutral fields), so a change to a cell that has run (its bars, say) is caught here, not as a
  refused resume; the cells run after those carry the finer bars and the FLOP-spanning plateau."""
  import json  # pylint: disable=import-outside-toplevel
  from smjax.json_io import config_diff  # pylint: disable=import-outside-toplevel
  records = os.path.join(ROOT, "docs", "regimes", "records")
  recorded = sorted(d for d in os.listdir(records) if os.path.isdir(os.path.join(records, d)))
  assert recorded
  for name in recorded:
    with open(os.path.join(records, name, "config.json"), encoding="utf-8") as f:
      old = study_config.upgrade_old_config(json.load(f))
    # A cell without the teachers' arms reads nothing of their section (external.to_cap came
    # after every cell had run; interfering_even, which has them, keeps what it ran).
    unread = () if {"external", "self_teacher"} & set(old["phases"]) else ("external",)
    assert config_diff(old, regimes.cell_config(name).to_dict(),
                       study_config.RUN_NEUTRAL_FIELDS + unread) == [], name
    if name not in ("strong_to_weak", "sparse"):   # the first six cells
      assert tuple(old["experts"]["bars"]) == (0.75, 0.9, 0.95, 1.0)
      assert old["mopd"]["plateau_flops_fraction"] == 0.0   # filled in for configs without it
  for name in ("strong_to_weak", "sparse"):
    c = regimes.cell_config(name)
    assert c.experts.bars == regimes.FINER_BARS and 0.925 in regimes.FINER_BARS
    assert c.mopd.plateau_flops_fraction == 0.25
  bad = regimes.cell_config("sparse")
  bad.mopd.plateau_flops_fraction = -0.5
  with pytest.raises(ValueError, match="plateau_flops_fraction=-0.5 >= 0"):
    study_config.validate(bad)


def test_the_recorded_distillations_end_where_their_own_rule_replayed_ends_them():
  """report.replay_distillation, asked for the flat rule each recorded cell ran with, puts every
  recorded MOPD run's end where it ended (its run-on past its capture-and-flat stop, or its cap),
  so that its replay under the other rule reads the same runs the way the study would have."""
  import ml_collections as mlc  # pylint: disable=import-outside-toplevel
  from smjax.json_io import read_json  # pylint: disable=import-outside-toplevel
  from smjax.study.report import replay_distillation, split_sets  # pylint: disable=C0415
  from smjax.study.run import flat_rule_replay, load_arms  # pylint: disable=C0415
  records = os.path.join(ROOT, "docs", "regimes", "records")
  runs = 0
  for name in sorted(d for d in os.listdir(records) if os.path.isdir(os.path.join(records, d))):
    cell = os.path.join(records, name)
    rule = flat_rule_replay(mlc.ConfigDict(read_json(os.path.join(cell, "config.json"), "")))
    by_seed: dict = {}
    for a in load_arms(cell):
      by_seed.setdefault(a.seed, {})[a.arm] = a
    for seed, arms in by_seed.items():
      own = replay_distillation(arms, **dict(rule, replay=rule["ran"]))
      assert own is not None, (name, seed)
      for arm in split_sets(arms):
        assert own[arm] == (len(arms[arm].curve) - 1, arms[arm].reached), (name, seed, arm)
        runs += 1
  assert runs >= 36   # three cells of three seeds, four sets each


def test_an_unknown_or_missing_cell_is_one_line():
  with pytest.raises(ValueError, match=r"give exactly one cell of \['shared_even'"):
    _regimes_config("tiny")
  with pytest.raises(ValueError, match=r"'nope' is not one of"):
    _regimes_config("nope")
  with pytest.raises(ValueError, match=r"regime cell 'nope' is not one of"):
    regimes.cell("nope")


def test_the_map_page_lists_every_cell_with_its_domains():
  """The cells' table of docs/regimes.md: a row per cell naming its domains (the page's map
  table, generated from the map report, has rows per cell too, without the domains)."""
  text = open(os.path.join(ROOT, "docs", "regimes.md")).read()
  for c in regimes.CELLS:
    rows = [line for line in text.splitlines() if line.startswith(f"| {c.name} |")]
    assert rows, f"docs/regimes.md has no row for cell {c.name}"
    assert any(all(d in row for d in c.settings["domains"]) for row in rows), (c.name, rows)


def _study_config(arg):
  return config_files.load(os.path.join(ROOT, "configs", "study.py"), arg)


def test_shared_even_is_the_full_two_domain_study_and_shares_its_seeds(tmp_path, capsys):
  """shared_even computes every phase as configs/study.py:two_domain,full does (they differ in
  run-neutral fields only), so `share` lends it that study's seeds as links and writes the cell's
  config.json; a study of another config, a cell that is the same as no study, and a seed the
  cell ran on its own are one-line refusals."""
  import json  # pylint: disable=import-outside-toplevel
  from smjax.json_io import config_diff  # pylint: disable=import-outside-toplevel
  full = _study_config("two_domain,full")
  cell = regimes.cell_config("shared_even")
  assert config_diff(full.to_dict(), cell.to_dict(), study_config.RUN_NEUTRAL_FIELDS) == []
  assert regimes.cell("shared_even").same_as == "configs/study.py:two_domain,full"
  study = tmp_path / "two_full"
  for k in (0, 1):
    (study / f"seed_{k}" / "base").mkdir(parents=True)
  main = _study_config("two_domain,full,main")   # phases and seeds may differ
  main.seeds = (1,)
  (study / "config.json").write_text(json.dumps(main.to_dict()))
  maps = tmp_path / "map"
  assert regimes.main(["share", str(study), str(maps)]) == 0
  assert "linked 2 seed directories" in capsys.readouterr().out
  for k in (0, 1):
    link = maps / "shared_even" / f"seed_{k}"
    assert link.is_symlink() and link.resolve() == (study / f"seed_{k}").resolve()
  saved = json.loads((maps / "shared_even" / "config.json").read_text())
  assert saved["name"] == "regimes/shared_even" and "external" in saved["phases"]
  assert regimes.share(str(study), str(maps), "shared_even") == []   # again: nothing to do
  with pytest.raises(ValueError, match=r"same as no study; cells that are: \['shared_even', "
                     r"'strong_to_weak'\]"):
    regimes.share(str(study), str(maps), "sparse")
  other = _study_config("two_domain,full")
  other.rl.learning_rate = 3e-4
  (study / "config.json").write_text(json.dumps(other.to_dict()))
  with pytest.raises(ValueError, match=r"config.json: not a study the cell 'shared_even' can "
                     r"share it with .*rl.learning_rate: 0.0003 -> 0.0001"):
    regimes.share(str(study), str(maps), "shared_even")
  (study / "config.json").write_text(json.dumps(main.to_dict()))
  (study / "seed_2").mkdir()
  (maps / "shared_even" / "seed_2").mkdir()
  assert regimes.main(["share", str(study), str(maps)]) == 2
  err = capsys.readouterr().err.strip()
  assert "seed_2 exists and is not a link" in err and len(err.splitlines()) == 1


def test_strong_to_weak_shares_the_full_studys_student_base_and_joint_grpo(tmp_path, capsys):
  """strong_to_weak differs from the full two-domain study in its experts (and what follows
  them), not in the fields the student's base and joint GRPO read, so `share` lends it those two
  phases of that study's seeds (finished ones only) with each seed's evaluation grid, copied; a
  study differing in a field they read, and a cell seed on another grid, are refused."""
  import json  # pylint: disable=import-outside-toplevel
  from smjax.json_io import config_diff  # pylint: disable=import-outside-toplevel
  full = _study_config("two_domain,full")
  cell = regimes.cell_config("strong_to_weak")
  whole = config_diff(full.to_dict(), cell.to_dict(), study_config.RUN_NEUTRAL_FIELDS)
  assert any(d.startswith("experts.preset") for d in whole), whole   # not the same study
  assert regimes.cell("strong_to_weak").shares == ("base", "joint_grpo")
  study = tmp_path / "two_full"
  for k, done in ((0, ("base", "joint_grpo")), (1, ("base",))):
    for p in ("base", "joint_grpo"):
      (study / f"seed_{k}" / p).mkdir(parents=True)
    for p in done:
      (study / f"seed_{k}" / p / "result.json").write_text("{}")
    (study / f"seed_{k}" / "eval_interval.json").write_text(json.dumps({"every_flops": k + 1.5}))
  (study / "config.json").write_text(json.dumps(full.to_dict()))
  maps = tmp_path / "map"
  assert regimes.main(["share", str(study), str(maps), "--cell", "strong_to_weak"]) == 0
  assert "strong_to_weak: linked 3 phase directories" in capsys.readouterr().out
  here = maps / "strong_to_weak"
  for k, p in ((0, "base"), (0, "joint_grpo"), (1, "base")):
    assert (here / f"seed_{k}" / p).is_symlink()
    assert (here / f"seed_{k}" / p).resolve() == (study / f"seed_{k}" / p).resolve()
  assert not (here / "seed_1" / "joint_grpo").exists()   # unfinished: the cell runs it itself
  for k in (0, 1):
    grid = here / f"seed_{k}" / "eval_interval.json"
    assert not grid.is_symlink() and json.loads(grid.read_text()) == {"every_flops": k + 1.5}
  assert json.loads((here / "config.json").read_text())["experts"]["preset"] == "toy-small"
  assert regimes.share(str(study), str(maps), "strong_to_weak") == []   # again: nothing to do
  (study / "seed_1" / "joint_grpo" / "result.json").write_text("{}")   # finished since
  assert regimes.share(str(study), str(maps), "strong_to_weak") == [
      str(here / "seed_1" / "joint_grpo")]
  other = _study_config("two_domain,full")
  other.joint.steps = 600
  (study / "config.json").write_text(json.dumps(other.to_dict()))
  with pytest.raises(ValueError, match=r"can share its base, joint_grpo with .*joint.steps: "
                     r"600 -> 800"):
    regimes.share(str(study), str(maps), "strong_to_weak")
  (study / "config.json").write_text(json.dumps(full.to_dict()))
  (study / "seed_2" / "base").mkdir(parents=True)
  (study / "seed_2" / "base" / "result.json").write_text("{}")
  (study / "seed_2" / "eval_interval.json").write_text(json.dumps({"every_flops": 9.0}))
  (here / "seed_2").mkdir()
  (here / "seed_2" / "eval_interval.json").write_text(json.dumps({"every_flops": 8.0}))
  with pytest.raises(ValueError, match=r"seed_2/eval_interval.json: this seed is on "
                     "another evaluation grid"):
    regimes.share(str(study), str(maps), "strong_to_weak")
  assert not (here / "seed_2" / "base").exists()   # refused before anything was written


def test_zero_advantage_share_per_domain_or_over_all_domains_for_older_runs(tmp_path):
  """Joint GRPO's zero-advantage share, from its metrics.jsonl: per domain where the run logged it
  (mean of the rows, hand-computed), else the share over all domains, labelled so (a study run
  before the per-domain metric, e.g. one that shared_even links)."""
  import json
  def write(seed, rows):
    d = tmp_path / f"seed_{seed}" / "joint_grpo" / "logs"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  write(0, [{"step": 0, "heldout/math": 0.3},
            {"step": 0, "zero_variance_groups/math": 0.5, "zero_variance_groups/code": 1.0,
             "reward/zero_variance_groups": 0.75},
            {"step": 10, "zero_variance_groups/math": 0.25, "zero_variance_groups/code": 0.5}])
  assert regimes._zero_variance(str(tmp_path), [0], ["math", "code"]) == {
      "math": 0.375, "code": 0.75}
  write(1, [{"step": 0, "reward/zero_variance_groups": 0.5},
            {"step": 10, "reward/zero_variance_groups": 0.25}])
  assert regimes._zero_variance(str(tmp_path), [1], ["math", "code"]) == {"all domains": 0.375}
  assert regimes._zero_variance(str(tmp_path), [2], ["math", "code"]) == {}


def test_a_committed_map_renders_into_a_docs_page(tmp_path, monkeypatch):
  """A page's generated block from a map.json (`render --update-docs`, as docs/regimes.md is): the
  map's table, a cell's final-accuracy difference in points with its seeds above, its verdict,
  its collapsed runs, the cells not started; a second pass changes nothing."""
  import json
  from smjax.study import render
  s = lambda m, lo, hi, per: {"mean": m, "lo": lo, "hi": hi, "per_seed": per}  # noqa: E731
  cell = {"cell": "disjoint_even", "skill": "disjoint", "difficulty": "even", "extra": "",
          "about": "math and strings", "seeds": [0, 1, 2], "status": "done", "level": 0.9,
          "mean": {"saving": s(-0.5, -0.9, -0.1, [-0.4, -0.5, -0.6]),
                   "distillation_share": s(0.25, 0.2, 0.3, [0.2, 0.25, 0.3]),
                   "verdict": "(a) at 90% of joint_grpo's gain (mean over domains): dearer"},
          "every": {"saving": s(-0.2, -0.4, 0.0, [-0.1, -0.2, -0.3])},
          "mean_best": {"saving": s(-0.1, -0.3, 0.1, [0.05, -0.15, -0.2]),
                        "verdict": "(a) at 90% of the better route's gain (mean over domains): "
                                   "not distinguishable"},
          "final": {"difference": s(-0.035, -0.074, 0.004, [-0.03, 0.01, -0.085])},
          "zero_variance_groups": {"math": 0.75, "strings": 0.5}, "teachers": [],
          # Read again with MOPD's other flat rule: dearer on every seed on both readings.
          "replayed": {"flat_rule": {"ran": 0.0, "replayed": 0.25, "evals": 3},
                       "mean": {"saving": s(-0.5, -0.9, -0.1, [-0.4, -0.5, -0.6]),
                                "saving_finer_bars": s(-0.3, -0.5, -0.1, [-0.2, -0.3, -0.4])},
                       "mean_best": {"saving": s(-0.3, -0.5, -0.1, [-0.2, -0.3, -0.4]),
                                     "saving_finer_bars": s(-0.2, -0.3, -0.1,
                                                            [-0.1, -0.2, -0.3])}},
          "collapsed": [{"arm": "expert_math", "seed": 1, "step": 82,
                         "what": "no sample has scored and the gradient has been 0 for 25 steps"}]}
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "map.json").write_text(json.dumps(
      {"map": "runs/regimes", "cells": [cell], "not_started": ["sparse"]}))
  page = (f"# Map\n\n{render.GENERATED.format(src='docs/map.json')}\nstale\n{render.END}\n"
          "after\n")
  monkeypatch.chdir(tmp_path)
  out = render.update_docs(page)
  assert "stale" not in out and out.endswith(f"{render.END}\nafter\n")
  # The better route's levels: the mean's saving, every domain's missing ("-").
  assert ("| disjoint_even | disjoint | even | 3 | -50.0% [-90.0, -10.0] | -20.0% [-40.0, +0.0] "
          "| -10.0% [-30.0, +10.0]; - | 25.0% [+20.0, +30.0] | -3.5 [-7.4, +0.4] (1 of 3 seeds "
          "above) | math 75% strings 50% |") in out
  assert ("- **disjoint_even** (math and strings): (a) at 90% of joint_grpo's gain (mean over "
          "domains): dearer; (a) at 90% of the better route's gain (mean over domains): not "
          "distinguishable") in out
  assert ("- **disjoint_even**: expert_math on seed 1 at step 82 (no sample has scored and the "
          "gradient has been 0 for 25 steps)") in out
  assert "Not started: sparse." in out
  # The rule's reading: the better route's levels split the seeds' signs.
  assert ("By the map's rule (at 90 % of the gain, on the mean over domains; the rule is in "
          "docs/regimes.md): favours splitting: none; favours joint GRPO: none; favours joint "
          "GRPO at the bars' resolution: none; unresolved: disjoint_even.") in out
  assert ("distinguishable. By the map's rule: **unresolved** (the seeds differ in sign: on joint "
          "GRPO's levels 0 cheaper, 3 dearer; on the better route's 1 cheaper, 2 dearer; more "
          "seeds would settle it); with MOPD stopped on a curve flat over 3 evaluations and 25% "
          "more of its own FLOPs instead (replayed on the same runs): **favours joint GRPO** "
          "(dearer on 3 of 3 seeds on both readings, and with stops anywhere between the "
          "bars)") in out
  assert ("With MOPD's other flat rule replayed on the same runs (a cell that ran without the "
          "FLOPs span read with it, and the other way round): favours joint GRPO: "
          "disjoint_even.") in out
  assert render.update_docs(out) == out


def test_a_cell_is_read_by_the_maps_rule():
  """verdicts.cell_reading on hand-built rows, one per outcome: splitting favoured (every seed
  cheaper on the better route's levels, a censored "≥ +8 %" seed among them); joint GRPO favoured
  (dearer on every seed on both readings, the bars' bound below zero, a seed with no bound);
  the same with a bound at or above zero on one seed (unresolved); a row from before the better
  route's reading and the bound (joint GRPO at the bars' resolution at best); seeds of both
  signs, and a censored seed whose bound leaves its sign open (unresolved)."""
  from smjax.study import verdicts  # pylint: disable=import-outside-toplevel
  s = lambda per, sides=None: ({"per_seed": per} | ({"per_seed_bound": sides}  # noqa: E731
                                                     if sides else {}))
  split = {"mean": {"saving": s([-0.1, 0.2, -0.3])},
           "mean_best": {"saving": s([0.1, 0.2, 0.08], [0, 0, 1])}}
  assert verdicts.cell_reading(split)[0] == verdicts.FAVOURS_SPLIT
  joint = {"mean": {"saving": s([-0.5, -0.2, -0.4], [0, 0, -1]),
                    "saving_finer_bars": s([-0.3, -0.05, None])},
           "mean_best": {"saving": s([-0.5, -0.2, -0.4], [0, 0, -1]),
                         "saving_finer_bars": s([-0.3, -0.05, None])}}
  assert verdicts.cell_reading(joint)[0] == verdicts.FAVOURS_JOINT
  joint["mean_best"]["saving_finer_bars"] = s([-0.3, 0.0, None])
  reading, why = verdicts.cell_reading(joint)
  assert reading == verdicts.UNRESOLVED and "could reach zero on 1" in why
  old = {"mean": {"saving": s([-0.5, -0.2, -0.4])}}
  reading, why = verdicts.cell_reading(old)
  assert reading == verdicts.JOINT_AT_BARS and "predates the better route's levels" in why
  mixed = {"mean": {"saving": s([-0.5, -0.2, -0.4])},
           "mean_best": {"saving": s([-0.5, -0.2, 0.08], [0, 0, 1])}}
  reading, why = verdicts.cell_reading(mixed)
  assert reading == verdicts.UNRESOLVED and "1 cheaper, 2 dearer" in why and "differ" in why
  opened = {"mean": {"saving": s([-0.5, -0.2, -0.4], [0, 0, 1]),   # "≥ -40 %": sign open
                     "capture_needed": s([None, None, 1.2]), "capture_reached": s([None, None,
                                                                                 0.97])}}
  reading, why = verdicts.cell_reading(opened)
  assert reading == verdicts.UNRESOLVED and "1 open" in why and "leave the sign open" in why
  assert why.endswith("; the open seeds' students would need 120 % of their teachers' gain to "
                      "get there, and had 97 %")
  assert verdicts.cell_reading({})[0] == verdicts.UNRESOLVED
  # The map's plot labels each cell with its reading and draws censored seeds as triangles.
  import io  # pylint: disable=import-outside-toplevel
  from unittest import mock  # pylint: disable=import-outside-toplevel
  import matplotlib.axes  # pylint: disable=import-outside-toplevel
  # A cell read differently under MOPD's other flat rule says so; one read alike does not.
  rows = [{"cell": n, **r} for n, r in (("a", split | {"replayed": split}),
                                        ("b", joint | {"replayed": split}), ("c", old),
                                        ("d", mixed))]
  buf, ticks, markers = io.BytesIO(), [], []
  real_ticks, real_plot = matplotlib.axes.Axes.set_yticks, matplotlib.axes.Axes.plot
  with mock.patch.object(matplotlib.axes.Axes, "set_yticks", autospec=True,
                         side_effect=lambda ax, t, labels, **k: ticks.extend(labels)
                         or real_ticks(ax, t, labels, **k)), \
       mock.patch.object(matplotlib.axes.Axes, "plot", autospec=True,
                         side_effect=lambda ax, *a, **k: markers.append(a[2] if len(a) > 2
                                                                        else None)
                         or real_plot(ax, *a, **k)):
    regimes.plot_map({"cells": rows}, buf)
  assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
  assert ticks == ["a\nfavours splitting",
                   "b\nunresolved\n(other flat rule: favours splitting)",
                   "c\nfavours joint GRPO (at the bars)", "d\nunresolved"]
  assert ">" in markers and "<" in markers and "x" in markers


def test_a_map_keeps_an_earlier_maps_rows_for_the_cells_its_folder_lacks(tmp_path, capsys):
  """`smjax report MAP --keep EARLIER/map.json`: a cell the folder has is computed afresh (the
  earlier row for it is dropped); a cell it lacks comes from the earlier map, marked with where it
  came from, in the table and the plot; not-started excludes both. A file that is not a map's
  map.json, or --keep on a study's workdir, is a one-line error before anything is written."""
  import json
  from smjax.study import report_cli
  root = tmp_path / "map"
  (root / "interfering_even").mkdir(parents=True)
  (root / "interfering_even" / "config.json").write_text(
      json.dumps(regimes.cell_config("interfering_even", tiny=True).to_dict()))
  s = lambda m, lo, hi, per: {"mean": m, "lo": lo, "hi": hi, "per_seed": per}  # noqa: E731
  done = {"cell": "disjoint_even", "skill": "disjoint", "difficulty": "even", "extra": "",
          "about": "math and strings", "seeds": [0, 1, 2], "status": "done", "level": 0.9,
          "mean": {"saving": s(-0.5, -0.9, -0.1, [-0.4, -0.5, -0.6]), "verdict": "(a) dearer"},
          "teachers": [], "collapsed": []}
  stale = {"cell": "interfering_even", "skill": "interfering", "difficulty": "even",
           "extra": "", "about": "add and sub", "seeds": [0], "status": "partial",
           "mean": {"saving": s(0.3, 0.1, 0.5, [0.3]), "verdict": "(a) cheaper"},
           "teachers": [], "collapsed": []}
  earlier = tmp_path / "earlier.json"
  earlier.write_text(json.dumps({"map": "runs/old", "cells": [stale, done],
                                 "not_started": ["sparse"]}))
  assert report_cli.main([str(root), "--keep", str(earlier), "--bootstrap=0"]) == 0
  out = capsys.readouterr().out
  m = json.load(open(root / "report" / "map.json"))
  rows = {r["cell"]: r for r in m["cells"]}
  assert list(rows) == ["disjoint_even", "interfering_even"]   # the grid's order
  assert rows["disjoint_even"]["from"] == {"file": str(earlier), "map": "runs/old",
                                           "written": None}
  assert rows["disjoint_even"]["mean"] == done["mean"]
  fresh = rows["interfering_even"]
  assert fresh["status"] == "not started" and "from" not in fresh
  assert "disjoint_even" not in m["not_started"] and "interfering_even" not in m["not_started"]
  assert "sparse" in m["not_started"] and m["written"]
  assert "| disjoint_even | disjoint | even | 3 | -50.0% [-90.0, -10.0] |" in out
  assert (f"Rows kept from an earlier map (`smjax report --keep`: their cells' workdirs are not in "
          f"{root}): disjoint_even; from {earlier} (the map of runs/old).") in out
  # Kept again, a row keeps where it first came from.
  again = regimes.earlier_rows(str(root / "report" / "map.json"))
  assert again["disjoint_even"]["from"]["file"] == str(earlier)
  assert again["interfering_even"]["from"]["file"] == str(root / "report" / "map.json")
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"map": "x", "cells": [{"saving": 1}]}))
  with pytest.raises(ValueError, match=r"bad\.json: a row of 'cells' is not a map cell's row"):
    report_cli.main([str(root), "--keep", str(bad), "--out", str(tmp_path / "o")])
  with pytest.raises(ValueError, match=r"bad\.json: field 'cells' is missing"):
    bad.write_text(json.dumps({"map": "x"}))
    report_cli.main([str(root), "--keep", str(bad), "--out", str(tmp_path / "o")])
  assert not (tmp_path / "o").exists()
  with pytest.raises(ValueError, match="--keep: .* is a study, not a regime map's folder"):
    report_cli.main([str(root / "interfering_even"), "--keep", str(earlier),
                     "--record", str(tmp_path / "rec")])
  with pytest.raises(ValueError, match=r"bad\.json: field 'cells' is missing"):
    report_cli.main([str(root), "--keep", str(bad), "--record", str(tmp_path / "rec")])
  assert not (tmp_path / "rec").exists()   # refused before the record is written


def test_a_records_arms_are_read_gzipped_and_a_bad_file_is_named(tmp_path):
  """A record keeps a seed's arms as arms.json.gz (smjax.study.records); a study's arms.json is
  read first; a file that is not gzipped JSON, or JSON without "arms", is a one-line error naming
  it."""
  import gzip
  import json
  from smjax.study import records
  seed = tmp_path / "seed_0"
  seed.mkdir()
  assert records.read_arms(str(seed)) is None
  (seed / "arms.json.gz").write_bytes(gzip.compress(json.dumps({"arms": [{"arm": "x"}]}).encode()))
  assert records.read_arms(str(seed)) == [{"arm": "x"}]
  (seed / "arms.json").write_text(json.dumps({"arms": [{"arm": "y"}]}))
  assert records.read_arms(str(seed)) == [{"arm": "y"}]
  (seed / "arms.json").unlink()
  (seed / "arms.json.gz").write_bytes(b"not gzip")
  with pytest.raises(ValueError, match=r"seed_0/arms.json.gz: not gzipped UTF-8 JSON"):
    records.read_arms(str(seed))
  (seed / "arms.json.gz").write_bytes(gzip.compress(b'{"curves": []}'))
  with pytest.raises(ValueError, match=r"seed_0/arms.json.gz: field 'arms' is missing"):
    records.read_arms(str(seed))
