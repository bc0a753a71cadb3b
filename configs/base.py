r"""The shared toy base only: a char-level decoder SFT-warmed on every domain's gold solutions.

  python -m smjax.main --config=configs/base.py --workdir=runs/base
  python -m smjax.main --config=configs/base.py:four_domain --workdir=runs/base4

Every arm of a study starts from this model; its FLOPs are reported under base/* and charged to no
arm. Expected runtime: ~30 s on a 2-core CPU. Expected result: partial held-out accuracy (roughly
10-40% per domain; see README "The toy study" for measured figures).
"""

from smjax.study_config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, four_domain=False)
  c = study_defaults()
  c.name = "base"
  c.phases = ("base",)
  if a.four_domain:
    c.domains = ("math", "code", "logic", "strings")
  return c
