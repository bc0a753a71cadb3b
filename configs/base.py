r"""The shared toy base only: SFT on chains with independently flawed mistake sites, then the band.

  python -m smjax.main --config=configs/base.py --workdir=runs/base
  python -m smjax.main --config=configs/base.py:four_domain --workdir=runs/base4

Every arm of a study starts from this model, so it is trained once and checked once: its sampled
held-out accuracy must land in config.band (docs/calibration.md), or the run stops naming the seed
and the measured values. Its FLOPs are reported under base/* and charged to no arm. Runtime: the
first phase of `make demo`. Expected result: two_domain lands in the band; four_domain does not
yet (docs/study.md).
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, four_domain=False)
  c = study_defaults()
  c.name = "base"
  c.phases = ("base",)
  if a.four_domain:
    c.domains = ("math", "code", "logic", "strings")
  return c
