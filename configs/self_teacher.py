r"""Claim (d): recover a degraded domain from the model's own earlier GRPO checkpoint.

  python -m smjax.main --config=configs/self_teacher.py --workdir=runs/self_teacher

Joint GRPO model → more GRPO on `degrade_domain` only (the other domain degrades) → recover
`recover_domain` three ways from the degraded model: OPD from the joint checkpoint (self teacher),
OPD from the external teacher, and GRPO, each to the same target (docs/calibration.md). The
report gives the FLOPs to that target and the verdict against GRPO recovery. Runtime: dominated
by the external teacher's SFT and the degradation. Expected result (the paper): the self teacher
needs far fewer FLOPs (up to 50x); not yet measured in the chain regime (docs/study.md).
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, degrade_domain="code", recover_domain="math")
  c = study_defaults()
  c.name = "self_teacher"
  c.phases = ("base", "joint", "self_teacher")
  c.self_teacher.degrade_domain = a.degrade_domain
  c.self_teacher.recover_domain = a.recover_domain
  return c
