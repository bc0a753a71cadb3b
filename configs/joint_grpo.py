r"""Joint GRPO: one policy, GRPO on the mixed prompt stream of all domains, from the shared base.

  python -m smjax.main --config=configs/joint_grpo.py --workdir=runs/joint
  python -m smjax.main --config=configs/joint_grpo.py:steps=2000 --workdir=runs/joint

Expected runtime: base ~30 s + ~0.1-0.15 s per step on a 2-core CPU (1200 steps: ~3 min).
Expected result: held-out accuracy rises on both domains, slower per step than a single expert.
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, steps=1200)
  c = study_defaults()
  c.name = "joint_grpo"
  c.phases = ("base", "joint")
  c.joint.steps = a.steps
  return c
