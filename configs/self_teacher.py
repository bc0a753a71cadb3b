r"""Claim (d): recover a degraded domain from the model's own earlier GRPO checkpoint.

  python -m smjax.main --config=configs/self_teacher.py --workdir=runs/self_teacher

Joint GRPO model → degraded on `recover_domain` (self_teacher.degrade: "noisy_sft", SFT on that
domain's chains with mistakes beside the others' right ones, or "grpo", more GRPO on
`degrade_domain` only; either must cost it self_teacher.min_loss, checked per seed) → recover
`recover_domain` three ways from the degraded model: OPD from the joint checkpoint (self teacher),
OPD from the external teacher, and GRPO, each for its whole recover_steps; the report reads the
FLOPs each needs to the same target off their curves and the verdict against GRPO recovery.
Runtime: dominated by the external teacher's SFT. Expected result (the paper): the self teacher
needs far fewer FLOPs (up to 50x); under these rules not yet measured (docs/study.md).
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
