"""The phases of a study: what each one runs.

A phase is a function of the seed's shared record (smjax.study.shared) and its inputs that returns
a `PhaseOutput` (final parameters, FLOP ledger, accuracy curve), run through the phase store
(smjax.study.store) so that a finished phase is reused and an interrupted one resumes. Its
declaration (`PhaseSpec`, smjax.study.layout) says which config sections or fields its result
depends on and which phases' outputs it starts from; `read_fields` adds theirs and the ones every
phase reads (`COMMON_READS`), and a finished phase is reused exactly when none of those fields
changed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from smjax import paths
from smjax.domains import TOY_DOMAINS
from smjax.domains.base import ToyDomain, rng_for
from smjax.domains.chains import ANSWER_MARK
from smjax.ledger import FlopLedger
from smjax.models.presets import get_preset
from smjax.models.transformer import Transformer
from smjax.preemption import PreemptionGuard
from smjax.rollout import Sampler
from smjax.study import store
from smjax.study.config import TEACHER_EXTRA_TOKENS, correct_fractions, domain_keys
from smjax.study.layout import (BASE, CONTROL_TEACHER, DEGRADE, EXTERNAL_TEACHER, PhaseSpec,
                                read_fields)
from smjax.study.shared import SeedShared, make_evaluator, state_shardings
from smjax.study.store import PhaseOutput
from smjax.train import state as state_lib
from smjax.train import steps as steps_lib
from smjax.train.loop import (Reference, RLLoopConfig, first_hold, grpo_batch, opd_batch,
                              run_on_end, run_rl_checkpointed, run_sft)
from smjax.train.metrics import MetricLines, MetricsWriter, progress_bar_shown, wandb_run_id
from smjax.train.teachers import TeacherRouter

log = logging.getLogger(__name__)

# The base's band is measured with this many samples per held-out prompt (pass@8).
BAND_SAMPLES = 8


# ------------------------------------------------------------------------------ the base model

def flaw_mixture(domains: dict, correct_fraction: dict[str, float]):
  """The base's training mixture (chain form): each example's chain with its mistake sites
  flawed independently, so that a fraction `correct_fraction[domain]` of the examples that admit
  a mistake are correct (ToyDomain.sample_solution); drawn per example from a stable hash, so a
  resumed or rerun base sees the same mixture. A domain without chains (a file's, or your own
  `module:attr` Domain, beside toy ones) keeps its gold solutions."""
  def transform(example):
    if not isinstance(domains[example.domain], ToyDomain):
      return example
    m = example.metadata
    rng = rng_for("flaw", example.domain, m.get("split"), m.get("seed"), m.get("index"))
    return dataclasses.replace(example, solution=domains[example.domain].sample_solution(
        example, rng, correct_fraction[example.domain]))
  return transform


def phase_base(shared: SeedShared, workdir: str, spec: PhaseSpec = BASE) -> PhaseOutput:
  """The shared base model: SFT warm-up on every domain's solutions (FLOPs: base/sft), from a
  random init (toy) or from the HF checkpoint of `model.hf_path` (`base.steps=0`: its weights as
  they are). Chain-form toy domains train on the flawed-chain mixture (`flaw_mixture`). Its
  output's extra holds the band measurement: accuracy (mean of BAND_SAMPLES samples) and
  pass@BAND_SAMPLES per domain (checked by smjax.study.run). `spec` BASE_STRONG with the
  experts' record (smjax.study.shared.experts_shared): the same SFT of the experts' bigger
  model."""
  c = shared.config
  b, n = c.base, spec.steps(c)
  chain = c.form == "chain" and any(d in TOY_DOMAINS for d in c.domains)

  def fn():
    opt = state_lib.OptimizerConfig(learning_rate=b.learning_rate, warmup_steps=b.warmup_steps,
                                    total_steps=max(b.schedule_steps or n, 1),
                                    schedule="cosine")
    tx = state_lib.make_optimizer(opt)
    step = steps_lib.jit_step(steps_lib.make_sft_step(Transformer(shared.model_cfg), tx),
                              state_shardings=state_shardings(shared.mesh, tx, shared.model_cfg))
    state = shared.new_state(shared.initial_params(), tx)
    ledger = FlopLedger()
    with _writer(c, workdir, spec.name) as writer:
      if n:
        mix = flaw_mixture(shared.domains, correct_fractions(c)) if chain else None
        state, ledger = _sft(shared, workdir, spec, phase="base/sft", state=state, step=step,
                             stream=shared.prompts(domain_keys(c), b.batch_size, 1, mix),
                             seq_len=b.seq_len, num_steps=n, writer=writer)
      fields, calls = shared.evaluator(state.params)
      ledger.add(calls)
      # The band reads sampled accuracy and pass@k only: its greedy pass would repeat the one above.
      band, calls = make_evaluator(c, shared.sampler, shared.tokenizer, shared.heldout,
                                   shared.verify, samples=BAND_SAMPLES, greedy=False,
                                   phase="eval/band")(state.params)
      ledger.add(calls)
      writer.write(n, {f"heldout/{d}": a for d, a in fields["accuracy"].items()})
      _eval_line(c, spec.name, n, fields, ledger)
    extra = {"band": {"samples": BAND_SAMPLES, "accuracy": band["accuracy"],
                      "pass_at_k": band["pass_at_k"]}}
    return PhaseOutput(state.params, ledger, [_point(n, fields)], extra)
  return store.run_phase(workdir, c, spec.name, read_fields(spec), shared.abstract_params(), fn)


def _sft(shared: SeedShared, workdir: str, spec: PhaseSpec, *, phase: str, state, step, stream,
         seq_len: int, num_steps: int, writer):
  """An SFT phase's training, checkpointed every config.checkpoint_every steps (and
  config.checkpoint_seconds of wall time) under
  `<phase>/checkpoints/` and resumed exactly from the latest one (state, prompt stream, FLOP
  ledger); a SIGTERM saves and stops as in an RL phase. Returns (state, ledger)."""
  c = shared.config
  ledger, start = FlopLedger(), 0
  mgr = store.checkpointer(workdir, c, spec.name, read_fields(spec))
  restored = mgr.restore_latest(state)
  if restored is not None:
    state, start = restored.state, restored.step
    stream.set_state(restored.data_state)
    ledger = FlopLedger.from_dict(restored.ledger)
    log.warning("phase %s: resumed from its checkpoint at step %d", spec.name, start)
    writer.keep_only(lambda r: r["step"] < start)

  def save(done, state_):
    mgr.save(done, state_, data_state=stream.get_state(), ledger=ledger)

  with mgr, PreemptionGuard() as guard:
    state, _ = run_sft(phase=phase, state=state, step=step, examples_iter=stream,
                       tokenizer=shared.tokenizer, seq_len=seq_len, num_steps=num_steps,
                       ledger=ledger, writer=writer, log_every=c.log_every,
                       progress=c.progress, start_step=start,
                       save=save, checkpoint_every=c.checkpoint_every,
                       checkpoint_seconds=float(c.checkpoint_seconds),
                       should_stop=guard.should_stop)
    stopped = guard.should_stop()
  if stopped:
    raise SystemExit(f"phase {spec.name}: stopped by SIGTERM at a checkpoint; rerun the same "
                     "command to resume")
  return state, ledger


def _point(step: int, fields: dict) -> dict:
  return {"step": step, "flops": 0.0, "mean": float(np.mean(list(fields["accuracy"].values())))
          } | fields


def train_flops(ledger: FlopLedger) -> dict[str, float]:
  """A ledger's training FLOPs (rollout/* and train/*) by phase."""
  return {p: float(v) for p, v in ledger.by_phase().items()
          if p.partition("/")[0] in ("rollout", "train")}


def _writer(config, workdir: str, phase: str) -> MetricsWriter:
  """The phase's metrics.jsonl and TensorBoard events under `<phase>/logs`, and with
  config.wandb.project set a Weights & Biases run of its own: named `<seed dir>/<phase>`, in the
  group config.wandb.group (default: the study workdir's name), with an id stable across reruns
  of the phase (a resumed phase logs into its run)."""
  w = config.get("wandb")
  wandb = None
  if w is not None and w.project:
    parts = workdir.rstrip("/").split("/")
    study = parts[-2] if len(parts) > 1 else parts[-1]
    wandb = dict(project=w.project, entity=w.entity, group=w.group or study,
                 name=f"{parts[-1]}/{phase}", run_id=wandb_run_id(workdir, phase),
                 config=config.to_dict())
  return MetricsWriter(paths.join(workdir, phase, "logs"), wandb=wandb)


def _eval_line(config, phase: str, step: int, fields: dict, ledger: FlopLedger) -> None:
  """An SFT phase's final evaluation as a MetricLines line (run without a progress bar), its
  FLOPs the phase's own (base/*)."""
  MetricLines(phase, step, 1, on=not progress_bar_shown(config.progress)).evaluation(
      step, fields, flops=ledger.namespace_total("base"))


# -------------------------------------------------------------------------- GRPO and OPD runs

@dataclasses.dataclass(frozen=True)
class Algorithm:
  """An RL algorithm as a phase runs it, declared once (`grpo`, `opd`): the config section that
  holds its batch, samples per prompt, temperature and learning rate; its optimiser and jitted
  step (the seed's, compiled once); how a rollout becomes its batch (`batch(init_params,
  router)`, a make_batch for run_rl); and whether its first run may fix the seed's evaluation
  grid (smjax.study.store: the first GRPO phase does)."""
  section: str
  tx: Any
  step: Any
  batch: Callable[[Any, TeacherRouter | None], Callable]
  fixes_grid: bool


def grpo(shared: SeedShared) -> Algorithm:
  """GRPO on verifier rewards: config.rl, a reference forward only when rl.beta > 0."""
  c = shared.config

  def batch(init_params, router):
    del router
    ref = Reference(shared.model_cfg, init_params) if c.rl.beta else None
    return functools.partial(grpo_batch, layout=shared.grpo_layout, reference=ref)
  return Algorithm("rl", shared.rl_tx, shared.grpo_step, batch, fixes_grid=True)


def opd(shared: SeedShared) -> Algorithm:
  """On-policy distillation, the student's samples scored by the router's teachers: config.opd."""
  def batch(init_params, router):
    del init_params
    if router is None:
      raise ValueError("opd: an OPD phase needs its teachers (a TeacherRouter)")
    return functools.partial(opd_batch, router=router, layout=shared.opd_layout)
  return Algorithm("opd", shared.opd_tx, shared.opd_step, batch, fixes_grid=False)


def rl_phase(shared: SeedShared, workdir: str, spec: PhaseSpec, phase: str, *, algo: Algorithm,
             init_params, domains, stream_seed: int, flops_offset: float = 0.0,
             router: TeacherRouter | None = None, heldout_domains=None,
             eval_refine: int = 1, stop_at=None, prompts_per_step: int | None = None,
             snapshot_at: dict | None = None, max_new_tokens: int | None = None,
             to_cap: bool = False) -> PhaseOutput:
  """One run of `algo` (`grpo(shared)`, or `opd(shared)` scored by `router`) from `init_params`,
  resumable from its checkpoints; evaluated every seed eval interval / `eval_refine` training
  FLOPs (the first GRPO phase of a seed fixes that interval, smjax.study.store). `stop_at`
  (curve point -> bool, smjax.study.rules) ends it once it has run on past the first evaluation
  that meets it by config.run_on (run_rl); `spec.cap` is then its cap. `prompts_per_step`: its batch
  (default: config.rl's or config.opd's). `snapshot_at` ({label: rule or None}): the parameters
  are kept (store.snapshot_dir) at the first evaluation that meets each rule. Its output's extra
  says whether it met `stop_at` (`reached`), at which curve point (`stop_point`), and where each
  snapshot was taken (`snapshots`: {label: {"step", "flops"}}). `max_new_tokens`: the student's
  token cap in this phase's rollouts and evaluations (default: rl.max_new_tokens, the study's),
  its sampler's context raised by as many tokens as the cap. `to_cap`: `stop_at` and its run-on
  do not end the run, which goes on to its cap; where they would have ended it is kept
  (extra["rule_end"]: {"index" in the curve, "step", "flops_by_phase" then, "met"}; "met"
  false: the rule never ended it, and it is the run's end) with the parameters then
  (store.RULE_SNAPSHOT), so the report reads the arm at both ends (smjax.study.report.rule_views)
  and either model can be exported."""
  c = shared.config
  reads = read_fields(spec)

  def fn():
    rl = c[algo.section]
    every = store.grid_or_refuse(workdir, c, phase, may_fix=algo.fixes_grid)
    loop = RLLoopConfig(
        steps=spec.steps(c), samples_per_prompt=rl.samples_per_prompt, temperature=rl.temperature,
        eval_every_steps=c.eval.every_steps, eval_every_flops=every / eval_refine,
        eval_growth=float(c.eval.growth),
        log_every=c.log_every, checkpoint_every=c.checkpoint_every,
        checkpoint_seconds=float(c.checkpoint_seconds),
        seed=shared.seed * 7919 + stream_seed, progress=c.progress,
        # A collapsed policy is a result of the route that ran it: the phase ends there and the
        # report says so (config.collapse_window=0 runs on to the cap instead).
        collapse_window=int(c.collapse_window), collapse_ends=True)
    make_batch = algo.batch(init_params, router)
    state = shared.new_state(jax.tree.map(jnp.copy, init_params), algo.tx)
    prompts = shared.prompts(domains, prompts_per_step or rl.prompts_per_step, stream_seed)
    sampler = shared.sampler
    if max_new_tokens is not None and max_new_tokens != sampler.max_new_tokens:
      # The sampler's context grows by the extra tokens, so every prompt that fit still fits
      # (RoPE: the context length is the cache's size, not a parameter's).
      more = max(0, max_new_tokens - sampler.max_new_tokens)
      cfg = dataclasses.replace(shared.model_cfg,
                                max_seq_len=shared.model_cfg.max_seq_len + more)
      sampler = Sampler(cfg, max_new_tokens=max_new_tokens, eos_id=shared.tokenizer.eos_id,
                        pad_id=shared.tokenizer.pad_id, mesh=shared.mesh)
    evaluator = shared.evaluator
    if heldout_domains is not None or sampler is not shared.sampler:
      evaluator = shared.evaluator_for(sampler=sampler, domains=heldout_domains)
    snaps: dict = {}   # saved with every checkpoint, restored on resume
    rule_end: dict = {}   # likewise (to_cap)
    # Only a phase with a stop rule runs on past it (and declares run_on).
    run_on = (int(c.run_on.evals), float(c.run_on.flops_fraction)) if stop_at else (0, 0.0)

    def on_eval(point, state_, prog):
      for label, rule in (snapshot_at or {}).items():
        if label not in snaps and rule is not None and rule(point):
          store.save_params(store.snapshot_dir(workdir, phase, label), state_.params)
          snaps[label] = {"step": point["step"], "flops": point["flops"],
                          "flops_by_phase": train_flops(prog.ledger)}
      if to_cap and not rule_end:   # the point at which the rule would have ended the run
        at, last = first_hold(prog.curve, stop_at), len(prog.curve) - 1
        if at is not None and run_on_end(prog.curve, at, *run_on, offset=flops_offset) == last:
          # Its parameters then too: `smjax export --phase <arm>@rule` (smjax.study.export).
          store.save_params(store.snapshot_dir(workdir, phase, store.RULE_SNAPSHOT),
                            state_.params)
          rule_end.update(index=last, step=point["step"],
                          flops_by_phase=train_flops(prog.ledger), met=True)

    fix = None
    if algo.fixes_grid and not every:
      fix = lambda step_flops: store.save_eval_every(workdir, c, step_flops) / eval_refine
    result = run_rl_checkpointed(
        state, checkpointer=store.checkpointer(workdir, c, phase, reads),
        open_writer=lambda: _writer(c, workdir, phase),
        kept={"snapshots": snaps, "rule_end": rule_end},
        name=phase, loop=loop, step=algo.step, make_batch=make_batch,
        sampler=sampler, tokenizer=shared.tokenizer, prompts=prompts,
        verify=shared.verify, evaluator=evaluator,
        flops_offset=flops_offset, fix_eval_every=fix, stop_at=stop_at,
        run_on=run_on, stop_ends=not to_cap,
        on_eval=on_eval if snapshot_at or to_cap else None)
    if result.stopped:
      raise SystemExit(f"phase {phase}: stopped by SIGTERM at a checkpoint; rerun the same "
                       "command to resume")
    if to_cap and not rule_end:   # the rule never ended it: its end is the run's
      rule_end.update(index=len(result.curve) - 1, step=result.curve[-1]["step"],
                      flops_by_phase=train_flops(result.ledger), met=False)
    return PhaseOutput(result.state.params, result.ledger, result.curve,
                       {"last_metrics": result.last_metrics, "reached": result.reached,
                        "stop_point": result.stop_point, "snapshots": snaps,
                        "collapsed": result.collapsed, "rule_end": rule_end or None})

  return store.run_phase(workdir, c, phase, reads, shared.abstract_params(), fn)


# ------------------------------------------------------------------- the external teacher

def verbose(example):
  """The external teacher's style: the solution, then the problem restated with its answer on a
  line of its own (verifiers read the first line only, so it stays correct, just longer)."""
  answer = example.solution.rsplit(ANSWER_MARK, 1)[-1]
  return dataclasses.replace(example, solution=f"{example.solution}\n{example.prompt}{answer}")


def phase_external_teacher(shared: SeedShared, workdir: str) -> PhaseOutput:
  """The external teacher: a larger model SFT'd on verbose solutions (reported under base/*,
  not charged to any arm: it stands for someone else's post-trained model)."""
  e = shared.config.external
  cfg = get_preset(e.teacher_preset)
  if cfg.vocab_size != shared.model_cfg.vocab_size:
    raise ValueError(f"config.external.teacher_preset={e.teacher_preset!r} has vocab_size="
                     f"{cfg.vocab_size}, the student {shared.model_cfg.vocab_size}: OPD needs one "
                     "vocabulary")
  return _teacher_sft(shared, workdir, EXTERNAL_TEACHER, cfg, verbose, 1, 2,
                      {"preset": e.teacher_preset, "style": "verbose"})


def phase_control_teacher(shared: SeedShared, workdir: str) -> PhaseOutput:
  """The control teacher: the student's architecture SFT'd as the external teacher is (steps,
  learning rate, from a random init) on the plain gold chains; under base/*, charged to no arm."""
  return _teacher_sft(shared, workdir, CONTROL_TEACHER, shared.model_cfg, None, 3, 4,
                      {"preset": "student", "style": "plain"})


def _teacher_sft(shared: SeedShared, workdir: str, spec: PhaseSpec, cfg, transform,
                 init_offset: int, stream_seed: int, extra: dict) -> PhaseOutput:
  c = shared.config
  e, b, n = c.external, c.base, spec.steps(c)

  def fn():
    opt = state_lib.OptimizerConfig(learning_rate=e.teacher_learning_rate, warmup_steps=20,
                                    total_steps=n, schedule="cosine")
    tx = state_lib.make_optimizer(opt)
    step = steps_lib.jit_step(steps_lib.make_sft_step(Transformer(cfg), tx),
                              state_shardings=state_shardings(shared.mesh, tx, cfg))
    state = shared.new_state(
        shared.random_params(jax.random.key(shared.seed + init_offset), cfg), tx, cfg)
    stream = shared.prompts(domain_keys(c), b.batch_size, stream_seed, transform=transform)
    with _writer(c, workdir, spec.name) as writer:
      state, ledger = _sft(shared, workdir, spec, phase=f"base/{spec.name}", state=state,
                           step=step, stream=stream, seq_len=e.teacher_seq_len,
                           num_steps=n, writer=writer)
    # A teacher samples TEACHER_EXTRA_TOKENS past the student's cap, in a context at least that
    # much longer than the student's (RoPE: the context is the cache's size, not a parameter).
    long = shared.model_cfg.max_seq_len + TEACHER_EXTRA_TOKENS
    sampler = Sampler(dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, long)),
                      max_new_tokens=c.rl.max_new_tokens + TEACHER_EXTRA_TOKENS,
                      eos_id=shared.tokenizer.eos_id, pad_id=shared.tokenizer.pad_id)
    evaluator = shared.evaluator_for(sampler=sampler, phase=f"eval/{spec.name}")
    fields, calls = evaluator(state.params)
    ledger.add(calls)
    _eval_line(c, spec.name, n, fields, ledger)
    return PhaseOutput(state.params, ledger, [_point(n, fields)], extra)
  return store.run_phase(workdir, c, spec.name, read_fields(spec), shared.abstract_params(cfg),
                         fn)


def phase_degrade_sft(shared: SeedShared, workdir: str, joint: PhaseOutput,
                      name: str = DEGRADE.name) -> PhaseOutput:
  """Claim (d)'s degradation by noisy data (self_teacher.degrade="noisy_sft"): the joint model
  SFT'd `degrade_steps` steps at `degrade_learning_rate` (constant) on every domain's chains,
  recover_domain's with their mistake sites flawed so that `degrade_correct_fraction` of them
  are right (the base's mixture, `flaw_mixture`) and the others' right, then evaluated. (On
  recover_domain alone the model forgets the other domains too: code fell to 0 %.) Its SFT
  FLOPs are reported under base/* and charged to no arm: the degradation is where every
  recovery route starts, not a route. `name`: its directory (a further depth's is
  `degrade@<fraction>`, its shared.config carrying that fraction: smjax.study.run)."""
  c = shared.config
  spec = dataclasses.replace(DEGRADE, name=name)
  st, b, n = c.self_teacher, c.base, spec.steps(c)
  rec = st.recover_domain

  def fn():
    opt = state_lib.OptimizerConfig(learning_rate=float(st.degrade_learning_rate),
                                    warmup_steps=0, total_steps=max(n, 1),
                                    schedule="constant")
    tx = state_lib.make_optimizer(opt)
    step = steps_lib.jit_step(steps_lib.make_sft_step(Transformer(shared.model_cfg), tx),
                              state_shardings=state_shardings(shared.mesh, tx, shared.model_cfg))
    state = shared.new_state(jax.tree.map(jnp.copy, joint.params), tx)
    mix = flaw_mixture(shared.domains, {d: float(st.degrade_correct_fraction) if d == rec else 1.0
                                        for d in domain_keys(c)})
    with _writer(c, workdir, name) as writer:
      state, ledger = _sft(shared, workdir, spec, phase="base/degrade", state=state,
                           step=step, stream=shared.prompts(domain_keys(c), b.batch_size, 50, mix),
                           seq_len=b.seq_len, num_steps=n, writer=writer)
      fields, calls = shared.evaluator(state.params)
      ledger.add(calls)
      writer.write(n,
                   {f"heldout/{d}": a for d, a in fields["accuracy"].items()})
      _eval_line(c, name, n, fields, ledger)
    return PhaseOutput(state.params, ledger, [_point(n, fields)], {})
  return store.run_phase(workdir, c, name, read_fields(DEGRADE), shared.abstract_params(), fn)
