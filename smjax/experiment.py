"""The phases of a study and their wiring: base → joint GRPO | experts → MOPD, external OPD, self-teacher.

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

Each phase has its own work dir `<workdir>/seed_<s>/<phase>/`: a finished phase (result.json) is not
run again, and an interrupted one resumes from its last checkpoint (smjax.phase_store). All phases of
a seed run in one process and share their jitted programs, so each program compiles once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from smjax import checkpoint as ckpt_lib
from smjax import domains as domains_lib
from smjax.ledger import FlopLedger
from smjax.models.presets import get_preset
from smjax.models.transformer import Transformer
from smjax.report import ArmResult, build_report, format_table, write_report
from smjax.rl.teachers import Teacher, TeacherRouter
from smjax.rollout import Sampler
from smjax import phase_store
from smjax.phase_store import PhaseOutput
from smjax.study_config import TEACHER_EXTRA_TOKENS, validate
from smjax.train import state as state_lib
from smjax.train import steps as steps_lib
from smjax.train.evaluate import Evaluator
from smjax.train.loop import RLLoopConfig, RLRun, run_sft
from smjax.seed_context import SeedContext

log = logging.getLogger(__name__)


def verbose(example):
  """The external teacher's style: the answer line, then a restatement of the problem (verifiers
  read the first line only, so it stays correct, just longer)."""
  return dataclasses.replace(example, solution=f"{example.solution}\n{example.prompt}"
                             f"{example.solution}")


# ---------------------------------------------------------------------------------- phases

def _checkpointer(ctx: SeedContext, phase: str) -> ckpt_lib.Checkpointer:
  return phase_store.checkpointer(ctx.workdir, ctx.config, phase)


def phase_base(ctx: SeedContext) -> PhaseOutput:
  """The shared base model: SFT warm-up on every domain's gold solutions (FLOPs: base/sft), from a
  random init (toy) or from the HF checkpoint of `model.hf_path` (`base.steps=0`: its weights as
  they are)."""
  b = ctx.config.base

  def fn():
    opt = state_lib.OptimizerConfig(learning_rate=b.learning_rate, warmup_steps=b.warmup_steps,
                                    total_steps=max(b.schedule_steps or b.steps, 1),
                                    schedule="cosine")
    tx = state_lib.make_optimizer(opt)
    step = steps_lib.jit_step(steps_lib.make_sft_step(ctx.model, tx),
                              state_shardings=ctx.state_shardings(tx))
    state = ctx.new_state(ctx.initial_params(), tx)
    ledger = FlopLedger()
    with ctx.writer("base") as writer:
      if b.steps:
        state, _ = run_sft(phase="base/sft", state=state, step=step,
                           examples_iter=ctx.prompts(ctx.config.domains, b.batch_size, 1),
                           tokenizer=ctx.tokenizer, seq_len=b.seq_len, num_steps=b.steps,
                           ledger=ledger, writer=writer, progress=ctx.config.progress)
      acc, lengths, calls = ctx.evaluator(state.params)
      ledger.add(calls)
      writer.write(b.steps, {f"heldout/{d}": a for d, a in acc.items()})
    point = {"step": b.steps, "flops": 0.0, "accuracy": acc, "mean": float(np.mean(list(
        acc.values()))), "length": lengths}
    return PhaseOutput(state.params, ledger, [point], {})
  return phase_store.run_phase(ctx.workdir, ctx.config, "base", ctx.abstract_params(), fn)


def _rl_phase(ctx: SeedContext, phase: str, *, algo: str, init_params_, domains, steps: int,
              stream_seed: int, flops_offset: float = 0.0, router: TeacherRouter | None = None,
              heldout_domains=None, eval_refine: int = 1) -> PhaseOutput:
  """One GRPO or OPD phase from `init_params_`, resumable from its checkpoints; evaluated every
  study eval interval / `eval_refine` training FLOPs."""

  def fn():
    c = ctx.config
    rl = c.rl if algo == "grpo" else c.opd
    loop = RLLoopConfig(
        steps=steps, prompts_per_step=rl.prompts_per_step,
        samples_per_prompt=rl.samples_per_prompt, max_new_tokens=c.rl.max_new_tokens,
        temperature=rl.temperature, eval_every_steps=c.eval.every_steps,
        eval_every_flops=ctx.eval_every_flops / eval_refine, log_every=c.log_every,
        seed=ctx.seed * 7919 + stream_seed, progress=c.progress)
    tx = ctx.rl_tx if algo == "grpo" else ctx.opd_tx
    step = ctx.grpo_step if algo == "grpo" else ctx.opd_step
    state = ctx.new_state(jax.tree.map(jnp.copy, init_params_), tx)
    prompts = ctx.prompts(domains, rl.prompts_per_step, stream_seed)
    evaluator = ctx.evaluator
    if heldout_domains is not None:
      evaluator = Evaluator(ctx.sampler, ctx.tokenizer,
                            {d: ctx.heldout[d] for d in heldout_domains}, ctx.verifier,
                            batch_size=c.eval.batch_size)
    ledger = FlopLedger()
    run = RLRun(name=phase, algo=algo, loop=loop, step=step, sampler=ctx.sampler,
                tokenizer=ctx.tokenizer, prompts_iter=prompts, verify=ctx.verifier,
                evaluator=evaluator, ledger=ledger, router=router,
                ref_params=init_params_ if ctx.ref_fn is not None and algo == "grpo" else None,
                ref_fn=ctx.ref_fn if algo == "grpo" else None, flops_offset=flops_offset,
                pack=ctx.grpo_pack if algo == "grpo" else ctx.opd_pack)
    mgr = _checkpointer(ctx, phase)
    start = 0
    restored = mgr.restore_latest(state)
    if restored is not None:
      state, start = restored.state, restored.step
      prompts.set_state(restored.data_state)
      run.ledger = FlopLedger.from_dict(restored.ledger)
      run.curve = restored.extra["curve"]
      run.next_eval_flops = restored.extra["next_eval_flops"]
      log.warning("phase %s: resumed from its checkpoint at step %d", phase, start)

    def checkpoint(run_, state_, step_, *, force):
      if step_ == 1 and algo == "grpo" and not ctx.eval_every_flops:
        ctx.fix_eval_interval(run_.ledger.total(training_only=True))
        run_.set_eval_interval(ctx.eval_every_flops)
      if force or (c.checkpoint_every and step_ % c.checkpoint_every == 0):
        mgr.save(step_, state_, data_state=prompts.get_state(), ledger=run_.ledger,
                 extra={"curve": run_.curve, "next_eval_flops": run_.next_eval_flops})

    run.checkpoint_fn = checkpoint
    with ckpt_lib.PreemptionGuard() as guard, ctx.writer(phase) as writer:
      run.writer, run.should_stop = writer, guard.should_stop
      result = run.run(state, start_step=start)
      mgr.wait()
      if guard.should_stop():
        mgr.close()
        raise SystemExit(f"phase {phase}: stopped by SIGTERM at a checkpoint; rerun the same "
                         "command to resume")
    mgr.close()
    return PhaseOutput(result.state.params, result.ledger, result.curve,
                       {"last_metrics": result.last_metrics})

  return phase_store.run_phase(ctx.workdir, ctx.config, phase, ctx.abstract_params(), fn)


def _teacher_sft(ctx: SeedContext) -> PhaseOutput:
  """The external teacher: a larger model SFT'd on verbose solutions (reported under base/*,
  not charged to any arm: it stands for someone else's post-trained model)."""
  e, b = ctx.config.external, ctx.config.base
  cfg = get_preset(e.teacher_preset)
  if cfg.vocab_size != ctx.model_cfg.vocab_size:
    raise ValueError(f"config.external.teacher_preset={e.teacher_preset!r} has vocab_size="
                     f"{cfg.vocab_size}, the student {ctx.model_cfg.vocab_size}: OPD needs one "
                     "vocabulary")
  model = Transformer(cfg)

  def fn():
    opt = state_lib.OptimizerConfig(learning_rate=e.teacher_learning_rate, warmup_steps=20,
                                    total_steps=e.teacher_sft_steps, schedule="cosine")
    tx = state_lib.make_optimizer(opt)
    step = steps_lib.jit_step(steps_lib.make_sft_step(model, tx),
                              state_shardings=ctx.state_shardings(tx, cfg))
    state = ctx.new_state(ctx.random_params(jax.random.key(ctx.seed + 1), cfg), tx, cfg)
    ledger = FlopLedger()
    stream = ctx.prompts(ctx.config.domains, b.batch_size, 2, transform=verbose)
    with ctx.writer("external_teacher") as writer:
      state, _ = run_sft(phase="base/external_teacher", state=state, step=step,
                         examples_iter=stream, tokenizer=ctx.tokenizer, seq_len=e.teacher_seq_len,
                         num_steps=e.teacher_sft_steps, ledger=ledger, writer=writer,
                         progress=ctx.config.progress)
    sampler = Sampler(cfg, max_new_tokens=ctx.config.rl.max_new_tokens + TEACHER_EXTRA_TOKENS,
                      eos_id=ctx.tokenizer.eos_id, pad_id=ctx.tokenizer.pad_id)
    evaluator = Evaluator(sampler, ctx.tokenizer, ctx.heldout, ctx.verifier,
                          batch_size=ctx.config.eval.batch_size, phase="eval/external_teacher")
    acc, lengths, calls = evaluator(state.params)
    ledger.add(calls)
    point = {"step": e.teacher_sft_steps, "flops": 0.0, "accuracy": acc,
             "mean": float(np.mean(list(acc.values()))), "length": lengths}
    return PhaseOutput(state.params, ledger, [point], {"preset": e.teacher_preset})
  return phase_store.run_phase(ctx.workdir, ctx.config, "external_teacher",
                               ctx.abstract_params(cfg), fn)


def run_seed(config: mlc.ConfigDict, seed: int, workdir: str) -> list[ArmResult]:
  """All configured phases for one seed; returns the arms for the report."""
  ctx = SeedContext(config, seed, workdir)
  phases = set(config.phases)
  arms: list[ArmResult] = []
  base = phase_base(ctx)
  arms.append(ArmResult("base", seed, base.curve, {}, note="SFT warm-up; not in any arm's FLOPs"))
  train = lambda out: {p: float(v) for p, v in out.ledger.by_phase().items()
                       if p.partition("/")[0] in ("rollout", "train")}
  joint = None
  if "joint" in phases or "self_teacher" in phases:
    joint = _rl_phase(ctx, "joint_grpo", algo="grpo", init_params_=base.params,
                      domains=config.domains, steps=config.joint.steps, stream_seed=10)
    arms.append(ArmResult("joint_grpo", seed, joint.curve, train(joint)))
  if "experts" in phases or "mopd" in phases:
    experts = {}
    for i, d in enumerate(config.domains):
      experts[d] = _rl_phase(ctx, f"expert_{domains_lib.domain_label(d)}", algo="grpo",
                             init_params_=base.params, domains=[d],
                             steps=config.experts.steps, stream_seed=20 + i)
      arms.append(ArmResult(f"expert_{domains_lib.domain_label(d)}", seed, experts[d].curve,
                            train(experts[d]), note=f"GRPO on {d} only"))
    if "mopd" in phases:
      expert_flops = sum(sum(train(x).values()) for x in experts.values())
      teachers = [Teacher(f"expert_{domains_lib.domain_label(d)}", ctx.model_cfg, x.params,
                          (d,))
                  for d, x in experts.items()]
      router = ctx.teacher_router(teachers)
      mopd = _rl_phase(ctx, "mopd", algo="opd", init_params_=base.params,
                       domains=config.domains, steps=config.mopd.steps, stream_seed=30,
                       flops_offset=expert_flops, router=router)
      by_phase = {}
      for x in list(experts.values()) + [mopd]:
        for p, v in train(x).items():
          by_phase[p] = by_phase.get(p, 0.0) + v
      arms.append(ArmResult("split_merge", seed, mopd.curve, by_phase, expert_flops=expert_flops,
                            distill_flops=sum(train(mopd).values())))
  external = None
  if "external" in phases or "self_teacher" in phases:
    external = _teacher_sft(ctx)
    arms.append(ArmResult("external_teacher", seed, external.curve, {},
                          note=f"{config.external.teacher_preset} SFT on verbose solutions; "
                          "not charged to any arm"))
  if "external" in phases:
    t = Teacher("external", get_preset(config.external.teacher_preset), external.params,
                tuple(config.domains))
    router = ctx.teacher_router([t])
    ext = _rl_phase(ctx, "external_opd", algo="opd", init_params_=base.params,
                    domains=config.domains, steps=config.external.steps, stream_seed=40,
                    router=router)
    arms.append(ArmResult("external_opd", seed, ext.curve, train(ext),
                          distill_flops=sum(train(ext).values())))
  if "self_teacher" in phases:
    arms.extend(_self_teacher(ctx, joint, external, train))
  return arms


def _self_teacher(ctx: SeedContext, joint: PhaseOutput, external: PhaseOutput, train):
  """Claim (d): recover a domain degraded by later training, from the model's own earlier GRPO
  checkpoint (self teacher) vs the external teacher vs GRPO; FLOPs to get back to
  recover_target_fraction x the joint model's accuracy on that domain."""
  st = ctx.config.self_teacher
  deg_d, rec_d = st.degrade_domain, st.recover_domain
  degraded = _rl_phase(ctx, "degrade", algo="grpo", init_params_=joint.params, domains=[deg_d],
                       steps=st.degrade_steps, stream_seed=50)
  target = st.recover_target_fraction * joint.curve[-1]["accuracy"][rec_d]
  arms = [ArmResult("degrade", ctx.seed, degraded.curve, train(degraded), group="recovery",
                    note=f"joint model trained {st.degrade_steps} more GRPO steps on {deg_d}")]
  routes = {
      "recover_self": ("opd", Teacher("self", ctx.model_cfg, joint.params, (rec_d,))),
      "recover_external": ("opd", Teacher("external", get_preset(ctx.config.external.teacher_preset),
                                          external.params, (rec_d,))),
      "recover_grpo": ("grpo", None),
  }
  for i, (name, (algo, teacher)) in enumerate(routes.items()):
    router = None if teacher is None else ctx.teacher_router([teacher])
    out = _rl_phase(ctx, name, algo=algo, init_params_=degraded.params, domains=[rec_d],
                    steps=st.recover_steps, stream_seed=60 + i, router=router,
                    heldout_domains=[rec_d], eval_refine=int(st.eval_refine))
    arms.append(ArmResult(name, ctx.seed, out.curve, train(out), group="recovery", target=target,
                          distill_flops=sum(train(out).values()) if algo == "opd" else 0.0))
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
