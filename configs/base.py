r"""The shared toy base only: a char-level decoder SFT-warmed on every domain's gold solutions.

  python -m smjax.main --config=configs/base.py --workdir=runs/base
  python -m smjax.main --config=configs/base.py:four_domain --workdir=runs/base4

Every arm of a study starts from this model; its FLOPs are reported under base/* and charged to no
arm. Expected runtime: ~70 s on a 2-core CPU (750 SFT steps). Expected result: partial held-out
accuracy, seed-dependent (two_domain, seeds 0/1/2: math 67/9/21%, code 50/24/20%; see README
"The toy study").
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
