r"""Claim (d): recover a degraded domain from the model's own earlier GRPO checkpoint.

  python -m smjax.main --config=configs/self_teacher.py --workdir=runs/self_teacher

Joint GRPO model → more GRPO on `degrade_domain` only (the other domain degrades) → recover
`recover_domain` three ways from the degraded model: OPD from the joint checkpoint (self teacher),
OPD from the external teacher, and GRPO. The report gives FLOPs to get back to
recover_target_fraction x the joint model's accuracy on that domain, and the ratios.
Expected runtime: ~20-25 min on a 2-core CPU (10-15 min of it the external teacher's 1000 SFT
steps), plus a few minutes since degrade_steps went from 300 to 1000 (2026-12-01; not re-measured
with this config). Expected result (paper): the self teacher needs far fewer FLOPs (up to 50x);
measured in the two-domain full study (README, claim (d)): 2.9-8.5x fewer FLOPs to the target than
GRPO recovery, per seed.
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
