"""A whole study: base → joint GRPO | experts → MOPD, external OPD, self-teacher recovery.

Every arm starts from the same SFT base model (its FLOPs are reported apart, under base/*):

- `joint_grpo`: one policy, GRPO on the mixed prompt stream of all domains;
- `split_merge`: one GRPO expert per domain, then multi-teacher OPD (MOPD) of the base student on its
  own samples, each row scored by the expert of its domain; its FLOPs are the experts' plus the
  distillation's, and its curve starts where the experts finished;
- `external_opd`: OPD of the base student from a larger teacher warmed up on verbose solutions
  (an "external post-trained teacher": its own training is not charged to the arm);
- `self_teacher`: the joint model trained further on one domain (which degrades the other), then
  the degraded domain recovered by OPD from the model's own earlier checkpoint (the self-GRPO
  teacher), by OPD from the external teacher, and by GRPO; FLOPs to recover are compared.

Each phase (smjax.study.phases) has its own work dir `<workdir>/seed_<s>/<phase>/`: a finished phase
is not run again, and an interrupted one resumes from its last checkpoint (smjax.study.store). All
phases of a seed run in one process and share their jitted programs (smjax.study.shared), so each
program compiles once.
"""

from __future__ import annotations

import json
import os

import ml_collections as mlc

from smjax import domains as domains_lib
from smjax.models.presets import get_preset
from smjax.study import phases as ph
from smjax.study.config import validate
from smjax.study.report import ArmResult, build_report, format_table, write_report
from smjax.study.shared import SeedShared, seed_shared
from smjax.study.store import PhaseOutput
from smjax.train.teachers import Teacher


def _train_flops(out: PhaseOutput) -> dict[str, float]:
  return {p: float(v) for p, v in out.ledger.by_phase().items()
          if p.partition("/")[0] in ("rollout", "train")}


def run_seed(config: mlc.ConfigDict, seed: int, workdir: str) -> list[ArmResult]:
  """All configured phases for one seed (in `workdir`); returns the arms for the report."""
  shared = seed_shared(config, seed)
  phases = set(config.phases)
  train = _train_flops
  arms: list[ArmResult] = []
  base = ph.phase_base(shared, workdir)
  arms.append(ArmResult("base", seed, base.curve, {}, note="SFT warm-up; not in any arm's FLOPs"))
  rl = lambda spec, name, **kw: ph.rl_phase(shared, workdir, spec, name, **kw)  # noqa: E731
  joint = None
  if "joint" in phases or "self_teacher" in phases:
    joint = rl(ph.JOINT, ph.JOINT.name, algo="grpo", init_params=base.params,
               domains=config.domains, steps=config.joint.steps, stream_seed=10)
    arms.append(ArmResult("joint_grpo", seed, joint.curve, train(joint)))
  if "experts" in phases or "mopd" in phases:
    experts = {}
    for i, d in enumerate(config.domains):
      name = ph.EXPERT.dir(domains_lib.domain_label(d))
      experts[d] = rl(ph.EXPERT, name, algo="grpo", init_params=base.params, domains=[d],
                      steps=config.experts.steps, stream_seed=20 + i)
      arms.append(ArmResult(name, seed, experts[d].curve, train(experts[d]),
                            note=f"GRPO on {d} only"))
    if "mopd" in phases:
      expert_flops = sum(sum(train(x).values()) for x in experts.values())
      teachers = [Teacher(ph.EXPERT.dir(domains_lib.domain_label(d)), shared.model_cfg, x.params,
                          (d,)) for d, x in experts.items()]
      mopd = rl(ph.MOPD, ph.MOPD.name, algo="opd", init_params=base.params,
                domains=config.domains, steps=config.mopd.steps, stream_seed=30,
                flops_offset=expert_flops, router=shared.teacher_router(teachers))
      by_phase = {}
      for x in list(experts.values()) + [mopd]:
        for p, v in train(x).items():
          by_phase[p] = by_phase.get(p, 0.0) + v
      arms.append(ArmResult("split_merge", seed, mopd.curve, by_phase, expert_flops=expert_flops,
                            distill_flops=sum(train(mopd).values())))
  external = None
  if "external" in phases or "self_teacher" in phases:
    external = ph.phase_external_teacher(shared, workdir)
    arms.append(ArmResult("external_teacher", seed, external.curve, {},
                          note=f"{config.external.teacher_preset} SFT on verbose solutions; "
                          "not charged to any arm"))
  if "external" in phases:
    t = Teacher("external", get_preset(config.external.teacher_preset), external.params,
                tuple(config.domains))
    ext = rl(ph.EXTERNAL_OPD, ph.EXTERNAL_OPD.name, algo="opd", init_params=base.params,
             domains=config.domains, steps=config.external.steps, stream_seed=40,
             router=shared.teacher_router([t]))
    arms.append(ArmResult("external_opd", seed, ext.curve, train(ext),
                          distill_flops=sum(train(ext).values())))
  if "self_teacher" in phases:
    arms.extend(_self_teacher(shared, workdir, joint, external))
  return arms


def _self_teacher(shared: SeedShared, workdir: str, joint: PhaseOutput, external: PhaseOutput):
  """Claim (d): recover a domain degraded by later training, from the model's own earlier GRPO
  checkpoint (self teacher) vs the external teacher vs GRPO; FLOPs to get back to
  recover_target_fraction x the joint model's accuracy on that domain."""
  st = shared.config.self_teacher
  deg_d, rec_d = st.degrade_domain, st.recover_domain
  degraded = ph.rl_phase(shared, workdir, ph.DEGRADE, ph.DEGRADE.name, algo="grpo",
                         init_params=joint.params, domains=[deg_d], steps=st.degrade_steps,
                         stream_seed=50)
  target = st.recover_target_fraction * joint.curve[-1]["accuracy"][rec_d]
  arms = [ArmResult("degrade", shared.seed, degraded.curve, _train_flops(degraded),
                    group="recovery",
                    note=f"joint model trained {st.degrade_steps} more GRPO steps on {deg_d}")]
  external_cfg = get_preset(shared.config.external.teacher_preset)
  routes = (
      (ph.RECOVER_SELF, "opd", Teacher("self", shared.model_cfg, joint.params, (rec_d,))),
      (ph.RECOVER_EXTERNAL, "opd", Teacher("external", external_cfg, external.params, (rec_d,))),
      (ph.RECOVER_GRPO, "grpo", None),
  )
  for i, (spec, algo, teacher) in enumerate(routes):
    router = None if teacher is None else shared.teacher_router([teacher])
    out = ph.rl_phase(shared, workdir, spec, spec.name, algo=algo, init_params=degraded.params,
                      domains=[rec_d], steps=st.recover_steps, stream_seed=60 + i, router=router,
                      heldout_domains=[rec_d], eval_refine=int(st.eval_refine))
    arms.append(ArmResult(spec.name, shared.seed, out.curve, _train_flops(out), group="recovery",
                          target=target,
                          distill_flops=sum(_train_flops(out).values()) if algo == "opd" else 0.0))
  return arms


def run_study(config: mlc.ConfigDict, workdir: str) -> dict:
  """Every seed of the study, then the report (report.json/csv/txt, curves.json, the plot)."""
  validate(config)
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(config.to_dict(), f, indent=1)
  arms = []
  for seed in config.seeds:
    arms.extend(run_seed(config, seed, os.path.join(workdir, f"seed_{seed}")))
  ref = config.report.reference_arm
  report = build_report(arms, target_fraction=config.report.target_fraction,
                        reference_arm=ref if any(a.arm == ref for a in arms) else None,
                        recover_domain=(config.self_teacher.recover_domain
                                        if "self_teacher" in config.phases else None))
  paths = write_report(report, arms, os.path.join(workdir, "report"))
  report["paths"] = paths
  report["table"] = format_table(report)
  return report
