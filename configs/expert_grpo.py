r"""GRPO experts: one per domain, each trained on its own domain only, from the shared base.

  python -m smjax.main --config=configs/expert_grpo.py --workdir=runs/experts
  python -m smjax.main --config=configs/expert_grpo.py:domain=math --workdir=runs/expert_math

Argument `domain=NAME` restricts the study to that one domain (default: math and code); `steps`.
The experts are what split-then-merge distils, and they show the effect it must undo: each
expert raises its own domain and loses the others. Runtime: the base plus one RL phase per
domain, minutes on a 2-core CPU. Expected result: the `expert_*` rows of docs/study.md.
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, domain="", steps=600)
  c = study_defaults()
  c.name = "experts"
  c.phases = ("base", "experts")
  if a.domain:
    c.domains = (a.domain,)
  c.experts.steps = a.steps
  return c
