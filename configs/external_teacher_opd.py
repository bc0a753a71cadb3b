r"""Claim (c): OPD from an external post-trained teacher against GRPO, per FLOP and in length.

  python -m smjax.main --config=configs/external_teacher_opd.py --workdir=runs/external

The teacher is a larger decoder (toy-small) SFT'd on *verbose* gold solutions; it stands for
someone else's post-trained model, so its training is reported under base/* and charged to no
arm (docs/calibration.md). The base student is distilled from it on its own samples, allowed the
teacher's token cap (external.max_new_tokens), and compared with joint GRPO from the same base
and with a control: the student's architecture SFT'd the same way on plain chains, distilled
under the same rules (control_opd; external.control=False drops it), which tells a bigger teacher
from a verbose one. Runtime: dominated by the teachers' SFT. Expected result (the paper): worse
accuracy per FLOP than GRPO and longer answers; under these rules not yet measured
(docs/study.md).
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, steps=300)
  c = study_defaults()
  c.name = "external_teacher_opd"
  c.phases = ("base", "joint", "external")
  c.external.steps = a.steps
  return c
