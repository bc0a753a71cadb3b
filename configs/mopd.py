r"""Split-then-merge: GRPO experts, then multi-teacher OPD of the base student from them.

  python -m smjax.main --config=configs/mopd.py --workdir=runs/mopd
  python -m smjax.main --config=configs/mopd.py:objective=sampled --workdir=runs/mopd_sampled

Argument `objective` = full_vocab | sampled | top_k; the default is the study's MOPD objective
(`config.opd.objective` of smjax.study.config), so this config trains as the study's MOPD phase
does; `steps` is the cap. Each student sample is scored by the expert of its domain only, and
distillation stops once the student has captured opd.capture_fraction of the experts' gain and
its stop-set curve is flat (mopd.plateau_evals, mopd.plateau_tol), so its FLOPs are a measurement
(docs/calibration.md). Runtime: the experts plus the distillation, minutes on a 2-core CPU.
Expected result: the `split_merge` row of docs/study.md and claim (b)'s verdict.
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  c = study_defaults()
  a = parse_arg(arg, objective=c.opd.objective, steps=c.mopd.steps)
  c.name = "mopd"
  c.phases = ("base", "experts", "mopd")
  c.opd.objective = a.objective
  c.mopd.steps = a.steps
  c.report.reference_arm = "split_merge"
  return c
