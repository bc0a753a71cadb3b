r"""Split-then-merge: GRPO experts, then multi-teacher OPD of the base student from them.

  python -m smjax.main --config=configs/mopd.py --workdir=runs/mopd
  python -m smjax.main --config=configs/mopd.py:objective=sampled --workdir=runs/mopd_sampled

Argument `objective` = full_vocab | sampled | top_k; the default is the study's MOPD objective
(`config.opd.objective` of smjax.study.config), so this config trains as the study's MOPD phase
does. Each student sample is scored by the expert of its domain only. Expected runtime: experts (~2-3 min) + ~0.2 s per OPD step on a 2-core
CPU. Expected result: the student approaches each expert on its domain; the report gives the
distillation FLOPs as a share of the experts' FLOPs.
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
