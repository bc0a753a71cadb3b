r"""GRPO experts: one per domain, each trained on its own domain only, from the shared base.

  python -m smjax.main --config=configs/expert_grpo.py --workdir=runs/experts
  python -m smjax.main --config=configs/expert_grpo.py:domain=math --workdir=runs/expert_math

Argument `domain=NAME` restricts the study to that one domain (default: math and code).
Expected runtime: ~0.1 s per step per expert on a 2-core CPU (600 steps each: ~1-2 min each).
Expected result: each expert improves its own domain and forgets the others (held-out accuracy on
the other domain falls), the effect split-then-merge must undo.
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
