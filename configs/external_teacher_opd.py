r"""Claim (c): OPD from an external post-trained teacher against GRPO, per FLOP and in length.

  python -m smjax.main --config=configs/external_teacher_opd.py --workdir=runs/external

The teacher is a larger decoder (toy-small) warmed up on *verbose* gold solutions; its own training
is reported under base/* and not charged (it stands for someone else's post-trained model). The
base student is distilled from it on its own samples and compared with joint GRPO from the same
base. Expected runtime: ~20 min on a 2-core CPU, 10-15 min of it the teacher's 1000 SFT steps.
Expected result (paper): worse accuracy per FLOP than GRPO and longer answers; the README reports
what we measured.
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, steps=300)
  c = study_defaults()
  c.name = "external_teacher_opd"
  c.phases = ("base", "joint", "external")
  c.external.steps = a.steps
  return c
