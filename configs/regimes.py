r"""The regime map: one cell of it, a whole study of the main comparison under one condition.

  python -m smjax.main --config=configs/regimes.py:disjoint_even --workdir=runs/regimes/disjoint_even
  make regimes REGIMES_WORKDIR=runs/regimes          # every cell, two at a time
  smjax report runs/regimes                          # the map (partial while cells run)

Arguments: a cell's name (`python -m smjax.study.regimes cells` lists them: skill {shared,
disjoint, interfering} x difficulty {even, uneven}, plus strong_to_weak and sparse); `tiny`:
test sizes (seconds of training, one seed, no band check). Each cell is the full two-domain
study's main comparison (base, joint GRPO, experts at the per-domain batch, the MOPD frontier) on
three seeds, with the cell's domains, difficulties, band and models (smjax.study.regimes.CELLS).

Expected result: docs/regimes.md, once the map has run (about 8 cells x 3 seeds; hours on 2
cores, resumable cell by cell).
"""

from smjax.study import regimes
from smjax.study.config import parse_arg


def get_config(arg=None):
  names = [c.name for c in regimes.CELLS]
  a = parse_arg(arg, tiny=False, **{n: False for n in names})
  chosen = [n for n in names if a[n]]
  if len(chosen) != 1:
    raise ValueError(f"configs/regimes.py: give exactly one cell of {names} (and optionally "
                     "tiny), e.g. configs/regimes.py:disjoint_even")
  return regimes.cell_config(chosen[0], tiny=a.tiny)
