r"""Joint GRPO: one policy, GRPO on the mixed prompt stream of all domains, from the shared base.

  python -m smjax.main --config=configs/joint_grpo.py --workdir=runs/joint
  python -m smjax.main --config=configs/joint_grpo.py:steps=2000 --workdir=runs/joint

The study's reference arm: every saving is against it. Runtime: the base plus one RL phase,
minutes on a 2-core CPU. Expected result: held-out accuracy rises on every domain (the
`joint_grpo` row of docs/study.md).
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, steps=1200)
  c = study_defaults()
  c.name = "joint_grpo"
  c.phases = ("base", "joint")
  c.joint.steps = a.steps
  return c
