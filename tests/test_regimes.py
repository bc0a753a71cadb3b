"""The regime map's cells (smjax.study.regimes, configs/regimes.py): each a valid study config
whose domains, difficulties and models say its condition; the grid complete. (A map rendered from
real cell workdirs: test_experiment.test_a_regime_map_renders_its_cells_partial_ones_too.)"""

import importlib.util
import itertools
import os

import pytest

from smjax.study import regimes
from smjax.study import config as study_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _configs_regimes():
  spec = importlib.util.spec_from_file_location("configs_regimes",
                                                os.path.join(ROOT, "configs", "regimes.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_the_grid_is_complete_and_the_extra_cells_are_beside_it():
  grid = {(c.skill, c.difficulty) for c in regimes.CELLS if not c.extra}
  assert grid == set(itertools.product(regimes.SKILLS, regimes.DIFFICULTIES))
  assert {c.extra for c in regimes.CELLS if c.extra} == {"strong-to-weak", "sparse"}
  assert len({c.name for c in regimes.CELLS}) == len(regimes.CELLS)


@pytest.mark.parametrize("name", [c.name for c in regimes.CELLS])
@pytest.mark.parametrize("tiny", [False, True])
def test_every_cell_is_a_valid_study_of_its_condition(name, tiny):
  c = _configs_regimes().get_config(name + (",tiny" if tiny else ""))
  study_config.validate(c)
  cell = regimes.cell(name)
  assert c.phases == ("base", "joint", "experts", "mopd")
  assert c.experts.prompts_per_step == 0   # experts at the per-domain batch in every cell
  skills = {"shared": {"math", "code"}, "disjoint": {"math", "strings"},
            "interfering": {"add", "sub"}}
  assert set(c.domains) == skills[cell.skill]
  levels = study_config.difficulties(c)
  assert (len(set(levels.values())) > 1) == (cell.difficulty == "uneven"), levels
  if cell.extra == "strong-to-weak":
    assert c.experts.preset and c.experts.preset != c.model.preset
  if cell.extra == "sparse":
    assert c.band.high <= 0.15 and min(levels.values()) >= 3
  if tiny:
    assert c.seeds == (0,) and not c.band.check
  else:
    assert len(c.seeds) >= 3 and c.band.check


def test_an_unknown_or_missing_cell_is_one_line():
  mod = _configs_regimes()
  with pytest.raises(ValueError, match=r"give exactly one cell of \['shared_even'"):
    mod.get_config("tiny")
  with pytest.raises(ValueError, match=r"'nope' is not one of"):
    mod.get_config("nope")
  with pytest.raises(ValueError, match=r"regime cell 'nope' is not one of"):
    regimes.cell("nope")


def test_the_map_page_lists_every_cell_with_its_domains():
  text = open(os.path.join(ROOT, "docs", "regimes.md")).read()
  for c in regimes.CELLS:
    row = next((line for line in text.splitlines() if line.startswith(f"| {c.name} |")), None)
    assert row is not None, f"docs/regimes.md has no row for cell {c.name}"
    assert all(d in row for d in c.settings["domains"]), (c.name, row)
