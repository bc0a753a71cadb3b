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
from smjax import data as data_lib
from smjax import domains as domains_lib
from smjax import sharding
from smjax.models import hf
from smjax.rewards.verify import verify_batch
from smjax.ledger import FlopLedger
from smjax.models.presets import get_preset
from smjax.models.tokenizer import CharTokenizer, HFTokenizer
from smjax.models.transformer import Transformer, init_params, param_logical_axes
from smjax.report import ArmResult, build_report, format_table, write_report
from smjax.rl.teachers import Teacher, TeacherRouter
from smjax.rollout import Sampler
from smjax import phase_store
from smjax.phase_store import PhaseOutput
from smjax.study_config import TEACHER_EXTRA_TOKENS, check_lengths, validate
from smjax.train import state as state_lib
from smjax.train import scoring
from smjax.train import steps as steps_lib
from smjax.train.evaluate import Evaluator
from smjax.train.loop import RLLoopConfig, RLRun, run_sft
from smjax.train.metrics import MetricsWriter

log = logging.getLogger(__name__)


def verbose(example):
  """The external teacher's style: the answer line, then a restatement of the problem (verifiers
  read the first line only, so it stays correct, just longer)."""
  return dataclasses.replace(example, solution=f"{example.solution}\n{example.prompt}"
                             f"{example.solution}")


class SeedContext:
  """Everything the phases of one seed share: data, evaluator, samplers and jitted steps."""

  def __init__(self, config: mlc.ConfigDict, seed: int, workdir: str):
    self.config, self.seed, self.workdir = config, seed, workdir
    m = config.model
    if m.hf_path:
      self.tokenizer = HFTokenizer(m.hf_path)
      self.model_cfg = hf.config_from_hf(m.hf_path, param_dtype=m.param_dtype, dtype=m.dtype,
                                         max_seq_len=m.max_seq_len or None)
    else:
      self.tokenizer = CharTokenizer()
      self.model_cfg = get_preset(m.preset, param_dtype=m.param_dtype, dtype=m.dtype,
                                  **({"max_seq_len": m.max_seq_len} if m.max_seq_len else {}))
    if self.tokenizer.vocab_size > self.model_cfg.vocab_size:
      raise ValueError(
          f"config.model: the tokenizer has {self.tokenizer.vocab_size} ids but the model's "
          f"vocab_size={self.model_cfg.vocab_size} ({m.hf_path or m.preset}): ids past the "
          "embedding would be silently clamped; the tokenizer.json and config.json must come "
          "from the same model")
    self.model = Transformer(self.model_cfg)
    mesh = sharding.mesh_from_config(config.mesh)
    self.mesh = mesh if mesh.size > 1 else None
    # `difficulty` is a knob of the toy domains only; file and reasoning-gym domains take none.
    self.domains = {d: domains_lib.get_domain(d, **({"difficulty": config.difficulty}
                                                    if d in domains_lib.TOY_DOMAINS else {}))
                    for d in config.domains}
    # The held-out split is disjoint from training by construction (smjax.domains); its seed is
    # fixed per study seed so every arm is scored on the same examples.
    self.heldout = {d: dom.generate("test", config.heldout_size, seed=10_000 + seed)
                    for d, dom in self.domains.items()}
    self.verifier = lambda examples, texts: verify_batch(examples, texts, domains=self.domains)
    check_lengths(config, self.tokenizer, self.model_cfg, self.heldout)
    rl = config.rl
    self.sampler = Sampler(self.model_cfg, max_new_tokens=rl.max_new_tokens,
                           eos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id,
                           mesh=self.mesh)
    self.evaluator = Evaluator(self.sampler, self.tokenizer, self.heldout, self.verifier,
                               batch_size=config.eval.batch_size)
    # One optimiser / step per algorithm, shared by every phase that uses it: compiles once.
    self.rl_opt = state_lib.OptimizerConfig(learning_rate=rl.learning_rate,
                                            warmup_steps=rl.warmup_steps, clip_norm=rl.clip_norm)
    self.rl_tx = state_lib.make_optimizer(self.rl_opt)
    grpo_cfg = steps_lib.GRPOConfig(
        group_size=rl.samples_per_prompt, advantage_mode=rl.advantage_mode, eps_low=rl.eps_low,
        eps_high=rl.eps_high, beta=rl.beta, kl_estimator=rl.kl_estimator,
        aggregation=rl.aggregation, micro_batches=rl.micro_batches, impl=rl.impl,
        # Completions are the last max_new_tokens targets (the sampler pads to that width): the
        # LM head never runs on prompt positions, whose logits no loss reads; with shared_prompt
        # each prompt's forward runs once for its samples_per_prompt rows (the sampler's order).
        logits_to_keep=rl.max_new_tokens,
        shared_prompt_rows=rl.samples_per_prompt if rl.shared_prompt else 1)
    self.grpo_step = steps_lib.jit_step(steps_lib.make_grpo_step(
        self.model, self.rl_tx, grpo_cfg, lr_schedule=state_lib.learning_rate_schedule(self.rl_opt),
        mesh=self.mesh), state_shardings=self.state_shardings(self.rl_tx))
    o = config.opd
    self.opd_opt = state_lib.OptimizerConfig(learning_rate=o.learning_rate, clip_norm=rl.clip_norm)
    self.opd_tx = state_lib.make_optimizer(self.opd_opt)
    self.opd_cfg = steps_lib.OPDConfig(objective=o.objective, eps_low=o.eps_low,
                                       eps_high=o.eps_high, top_k=o.top_k,
                                       micro_batches=o.micro_batches, impl=o.impl,
                                       logits_to_keep=rl.max_new_tokens,
                                       shared_prompt_rows=(o.samples_per_prompt
                                                           if o.shared_prompt else 1))
    self.opd_step = steps_lib.jit_step(steps_lib.make_opd_step(self.model, self.opd_tx,
                                                               self.opd_cfg, mesh=self.mesh),
                                       state_shardings=self.state_shardings(self.opd_tx))
    self.ref_fn = jax.jit(scoring.make_logprob_fn(
        self.model, logits_to_keep=rl.max_new_tokens,
        shared_prompt_rows=grpo_cfg.shared_prompt_rows)) if rl.beta else None
    self.eval_every_flops = self._load_eval_interval()

  # ------------------------------------------------------------------------------- helpers
  def abstract_params(self, cfg=None):
    """ShapeDtypeStructs of a model's parameters (with their shardings on a mesh): restore
    templates that allocate nothing, whatever the model's size."""
    cfg = cfg or self.model_cfg
    abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    if self.mesh is None:
      return abstract
    shards = sharding.param_shardings(abstract, param_logical_axes(cfg), self.mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shards)

  def teacher_router(self, teachers) -> TeacherRouter:
    """OPD teachers scoring the student's samples as the OPD step reads them (the completion
    columns only; each prompt once per block of rows with opd.shared_prompt)."""
    return TeacherRouter(self.model_cfg, teachers,
                         want_logits=self.config.opd.objective != "sampled",
                         logits_to_keep=self.opd_cfg.logits_to_keep,
                         shared_prompt_rows=self.opd_cfg.shared_prompt_rows)

  def state_shardings(self, tx, cfg=None):
    """The TrainState's shardings on the mesh (None on one device): parameters by their logical
    axes, optimiser moments following them, counters replicated. Steps are jitted with them as
    input and output shardings and states are created with them (`new_state`), so a step's output
    is its next input as it is: each step program compiles once."""
    if self.mesh is None:
      return None
    return sharding.abstract_train_state(cfg or self.model_cfg, tx, self.mesh)[1]

  def new_state(self, params, tx, cfg=None):
    """A fresh TrainState laid out by `state_shardings(tx, cfg)`."""
    return state_lib.create_sharded_state(params, tx, self.state_shardings(tx, cfg))

  def random_params(self, key, cfg=None):
    """A seeded random init, created sharded on the mesh (jitted with out_shardings, so the whole
    model never sits on one device) or on the default device without one."""
    cfg = cfg or self.model_cfg
    if self.mesh is None:
      return init_params(cfg, key)
    return sharding.init_sharded_params(cfg, self.mesh, key)[0]

  def initial_params(self):
    """The base phase's starting point: the HF checkpoint's weights, or a seeded random init."""
    m = self.config.model
    if m.hf_path:
      shards = jax.tree.map(lambda a: a.sharding, self.abstract_params()) if self.mesh else None
      put = None
      if shards is not None:
        put = lambda path, arr: jax.device_put(arr, _get_path(shards, path))
      _, params = hf.load_params(m.hf_path, self.model_cfg, put=put)
      return params if put is not None else jax.tree.map(jnp.asarray, params)
    return self.random_params(jax.random.key(self.seed))

  def prompts(self, domains, batch_size: int, stream_seed: int,
              transform=None) -> data_lib.PromptStream:
    ds = data_lib.prompt_pipeline([self.domains[d] for d in domains], batch_size=batch_size,
                                  split="train", seed=self.seed * 1000 + stream_seed)
    return data_lib.PromptStream(iter(ds), transform)

  def _interval_file(self):
    return os.path.join(self.workdir, "eval_interval.json")

  def _load_eval_interval(self) -> float:
    if self.config.eval.every_flops:
      return float(self.config.eval.every_flops)
    if os.path.exists(self._interval_file()):
      with open(self._interval_file()) as f:
        return float(json.load(f)["every_flops"])
    return 0.0

  def fix_eval_interval(self, flops_per_step: float) -> None:
    """Derives the FLOP interval between evaluations from the first GRPO step's cost, once per
    seed: (joint GRPO steps x that cost) / eval.points. Every arm is then evaluated on the same
    FLOP grid."""
    if self.eval_every_flops or not self.config.eval.points:
      return
    self.eval_every_flops = flops_per_step * self.config.joint.steps / self.config.eval.points
    os.makedirs(self.workdir, exist_ok=True)
    with open(self._interval_file(), "w") as f:
      json.dump({"every_flops": self.eval_every_flops, "from_step_flops": flops_per_step}, f)

  def writer(self, phase: str) -> MetricsWriter:
    return MetricsWriter(os.path.join(self.workdir, phase, "logs"))


# ----------------------------------------------------------------------------- phase store

# ---------------------------------------------------------------------------------- phases

def _checkpointer(ctx: SeedContext, phase: str) -> ckpt_lib.Checkpointer:
  return phase_store.checkpointer(ctx.workdir, ctx.config, phase)


def _get_path(tree, path):
  for p in path:
    tree = tree[p]
  return tree


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
              heldout_domains=None) -> PhaseOutput:
  """One GRPO or OPD phase from `init_params_`, resumable from its checkpoints."""

  def fn():
    c = ctx.config
    rl = c.rl if algo == "grpo" else c.opd
    loop = RLLoopConfig(
        steps=steps, prompts_per_step=rl.prompts_per_step,
        samples_per_prompt=rl.samples_per_prompt, max_new_tokens=c.rl.max_new_tokens,
        temperature=rl.temperature, eval_every_steps=c.eval.every_steps,
        eval_every_flops=ctx.eval_every_flops, log_every=c.log_every,
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
                ref_fn=ctx.ref_fn if algo == "grpo" else None, flops_offset=flops_offset)
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
                    heldout_domains=[rec_d])
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
