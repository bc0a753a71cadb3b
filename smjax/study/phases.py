"""The phases of a study, each with the config fields it reads declared beside it.

A phase is a function of the seed's shared record (smjax.study.shared) and its inputs that returns
a `PhaseOutput` (final parameters, FLOP ledger, accuracy curve), run through the phase store
(smjax.study.store) so that a finished phase is reused and an interrupted one resumes. Its
`PhaseSpec` says which config sections or fields its result depends on and which phases' outputs
it starts from; `read_fields` adds theirs and the ones every phase reads (`COMMON_READS`), and
a finished phase is reused exactly when none of those fields changed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from smjax import checkpoint as ckpt_lib
from smjax.ledger import FlopLedger
from smjax.models.presets import get_preset
from smjax.models.transformer import Transformer
from smjax.rollout import Sampler
from smjax.study import store
from smjax.study.config import TEACHER_EXTRA_TOKENS
from smjax.study.shared import SeedShared, state_shardings
from smjax.study.store import PhaseOutput
from smjax.train import state as state_lib
from smjax.train import steps as steps_lib
from smjax.train.evaluate import Evaluator
from smjax.train.loop import (Reference, RLLoopConfig, RLProgress, grpo_batch, opd_batch, run_rl,
                              run_sft)
from smjax.train.metrics import MetricsWriter
from smjax.train.teachers import TeacherRouter

log = logging.getLogger(__name__)

# Every phase reads these: the model and data, and the evaluation every curve is made of
# (rl.max_new_tokens is also the evaluation sampler's length).
COMMON_READS = ("model", "mesh", "domains", "difficulty", "heldout_size", "eval.every_steps",
                "eval.every_flops", "eval.points", "rl.max_new_tokens")


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
  """A phase's name (its directory; `expert_` names one per domain), the config sections or
  fields its result depends on, and the phases whose outputs it starts from."""
  name: str
  reads: tuple[str, ...]
  after: tuple[PhaseSpec, ...] = ()

  def dir(self, suffix: str = "") -> str:
    return self.name + suffix


def read_fields(spec: PhaseSpec) -> tuple[str, ...]:
  """Every config field `spec`'s result depends on: its own, its inputs' (transitively) and the
  common ones."""
  out = list(COMMON_READS)
  todo = [spec]
  while todo:
    s = todo.pop()
    out.extend(s.reads)
    todo.extend(s.after)
  return tuple(dict.fromkeys(out))


# ------------------------------------------------------------------------------ the base model

BASE = PhaseSpec("base", reads=("base",))


def phase_base(shared: SeedShared, workdir: str) -> PhaseOutput:
  """The shared base model: SFT warm-up on every domain's gold solutions (FLOPs: base/sft), from a
  random init (toy) or from the HF checkpoint of `model.hf_path` (`base.steps=0`: its weights as
  they are)."""
  c = shared.config
  b = c.base

  def fn():
    opt = state_lib.OptimizerConfig(learning_rate=b.learning_rate, warmup_steps=b.warmup_steps,
                                    total_steps=max(b.schedule_steps or b.steps, 1),
                                    schedule="cosine")
    tx = state_lib.make_optimizer(opt)
    step = steps_lib.jit_step(steps_lib.make_sft_step(Transformer(shared.model_cfg), tx),
                              state_shardings=state_shardings(shared.mesh, tx, shared.model_cfg))
    state = shared.new_state(shared.initial_params(), tx)
    ledger = FlopLedger()
    with _writer(workdir, BASE.name) as writer:
      if b.steps:
        state, _ = run_sft(phase="base/sft", state=state, step=step,
                           examples_iter=shared.prompts(c.domains, b.batch_size, 1),
                           tokenizer=shared.tokenizer, seq_len=b.seq_len, num_steps=b.steps,
                           ledger=ledger, writer=writer, progress=c.progress)
      acc, lengths, calls = shared.evaluator(state.params)
      ledger.add(calls)
      writer.write(b.steps, {f"heldout/{d}": a for d, a in acc.items()})
    return PhaseOutput(state.params, ledger, [_point(b.steps, acc, lengths)], {})
  return store.run_phase(workdir, c, BASE.name, read_fields(BASE), shared.abstract_params(), fn)


def _point(step: int, acc: dict, lengths: dict) -> dict:
  return {"step": step, "flops": 0.0, "accuracy": acc, "mean": float(np.mean(list(acc.values()))),
          "length": lengths}


def _writer(workdir: str, phase: str) -> MetricsWriter:
  return MetricsWriter(os.path.join(workdir, phase, "logs"))


# -------------------------------------------------------------------------- GRPO and OPD runs

def rl_phase(shared: SeedShared, workdir: str, spec: PhaseSpec, phase: str, *, algo: str,
             init_params, domains, steps: int, stream_seed: int, flops_offset: float = 0.0,
             router: TeacherRouter | None = None, heldout_domains=None,
             eval_refine: int = 1) -> PhaseOutput:
  """One GRPO (`algo="grpo"`) or OPD (`"opd"`, scored by `router`) phase from `init_params`,
  resumable from its checkpoints; evaluated every seed eval interval / `eval_refine` training
  FLOPs (the first GRPO phase of a seed fixes that interval, smjax.study.store)."""
  c = shared.config
  reads = read_fields(spec)
  grpo = algo == "grpo"

  def fn():
    rl = c.rl if grpo else c.opd
    every = store.load_eval_every(workdir, c)
    loop = RLLoopConfig(
        steps=steps, samples_per_prompt=rl.samples_per_prompt, temperature=rl.temperature,
        eval_every_steps=c.eval.every_steps, eval_every_flops=every / eval_refine,
        log_every=c.log_every, checkpoint_every=c.checkpoint_every,
        seed=shared.seed * 7919 + stream_seed, progress=c.progress)
    tx, step = (shared.rl_tx, shared.grpo_step) if grpo else (shared.opd_tx, shared.opd_step)
    if grpo:
      ref = Reference(shared.model_cfg, init_params) if c.rl.beta else None
      make_batch = functools.partial(grpo_batch, layout=shared.grpo_layout, reference=ref)
    else:
      make_batch = functools.partial(opd_batch, router=router, layout=shared.opd_layout)
    state = shared.new_state(jax.tree.map(jnp.copy, init_params), tx)
    prompts = shared.prompts(domains, rl.prompts_per_step, stream_seed)
    evaluator = shared.evaluator
    if heldout_domains is not None:
      evaluator = Evaluator(shared.sampler, shared.tokenizer,
                            {d: shared.heldout[d] for d in heldout_domains}, shared.verify,
                            batch_size=c.eval.batch_size)
    mgr = store.checkpointer(workdir, c, phase, reads)
    progress = None
    restored = mgr.restore_latest(state)
    if restored is not None:
      state = restored.state
      prompts.set_state(restored.data_state)
      progress = RLProgress(step=restored.step, ledger=FlopLedger.from_dict(restored.ledger),
                            curve=restored.extra["curve"],
                            next_eval_flops=restored.extra["next_eval_flops"])
      log.warning("phase %s: resumed from its checkpoint at step %d", phase, restored.step)

    def save(step_, state_, prog):
      mgr.save(step_, state_, data_state=prompts.get_state(), ledger=prog.ledger,
               extra={"curve": prog.curve, "next_eval_flops": prog.next_eval_flops})

    fix = None
    if grpo and not every:
      fix = lambda step_flops: store.save_eval_every(workdir, c, step_flops)
    with ckpt_lib.PreemptionGuard() as guard, _writer(workdir, phase) as writer:
      result = run_rl(state, name=phase, loop=loop, step=step, make_batch=make_batch,
                      sampler=shared.sampler, tokenizer=shared.tokenizer, prompts=prompts,
                      verify=shared.verify, evaluator=evaluator, writer=writer,
                      progress=progress, flops_offset=flops_offset, fix_eval_every=fix,
                      save=save, should_stop=guard.should_stop)
      mgr.wait()
      if result.stopped:
        mgr.close()
        raise SystemExit(f"phase {phase}: stopped by SIGTERM at a checkpoint; rerun the same "
                         "command to resume")
    mgr.close()
    return PhaseOutput(result.state.params, result.ledger, result.curve,
                       {"last_metrics": result.last_metrics})

  return store.run_phase(workdir, c, phase, reads, shared.abstract_params(), fn)


# ------------------------------------------------------------------- the external teacher

EXTERNAL_TEACHER = PhaseSpec("external_teacher", reads=(
    "external.teacher_preset", "external.teacher_sft_steps", "external.teacher_learning_rate",
    "external.teacher_seq_len"), after=(BASE,))


def verbose(example):
  """The external teacher's style: the answer line, then a restatement of the problem (verifiers
  read the first line only, so it stays correct, just longer)."""
  return dataclasses.replace(example, solution=f"{example.solution}\n{example.prompt}"
                             f"{example.solution}")


def phase_external_teacher(shared: SeedShared, workdir: str) -> PhaseOutput:
  """The external teacher: a larger model SFT'd on verbose solutions (reported under base/*,
  not charged to any arm: it stands for someone else's post-trained model)."""
  c = shared.config
  e, b = c.external, c.base
  cfg = get_preset(e.teacher_preset)
  if cfg.vocab_size != shared.model_cfg.vocab_size:
    raise ValueError(f"config.external.teacher_preset={e.teacher_preset!r} has vocab_size="
                     f"{cfg.vocab_size}, the student {shared.model_cfg.vocab_size}: OPD needs one "
                     "vocabulary")

  def fn():
    opt = state_lib.OptimizerConfig(learning_rate=e.teacher_learning_rate, warmup_steps=20,
                                    total_steps=e.teacher_sft_steps, schedule="cosine")
    tx = state_lib.make_optimizer(opt)
    step = steps_lib.jit_step(steps_lib.make_sft_step(Transformer(cfg), tx),
                              state_shardings=state_shardings(shared.mesh, tx, cfg))
    state = shared.new_state(shared.random_params(jax.random.key(shared.seed + 1), cfg), tx, cfg)
    ledger = FlopLedger()
    stream = shared.prompts(c.domains, b.batch_size, 2, transform=verbose)
    with _writer(workdir, EXTERNAL_TEACHER.name) as writer:
      state, _ = run_sft(phase="base/external_teacher", state=state, step=step,
                         examples_iter=stream, tokenizer=shared.tokenizer,
                         seq_len=e.teacher_seq_len, num_steps=e.teacher_sft_steps,
                         ledger=ledger, writer=writer, progress=c.progress)
    sampler = Sampler(cfg, max_new_tokens=c.rl.max_new_tokens + TEACHER_EXTRA_TOKENS,
                      eos_id=shared.tokenizer.eos_id, pad_id=shared.tokenizer.pad_id)
    evaluator = Evaluator(sampler, shared.tokenizer, shared.heldout, shared.verify,
                          batch_size=c.eval.batch_size, phase="eval/external_teacher")
    acc, lengths, calls = evaluator(state.params)
    ledger.add(calls)
    return PhaseOutput(state.params, ledger, [_point(e.teacher_sft_steps, acc, lengths)],
                       {"preset": e.teacher_preset})
  return store.run_phase(workdir, c, EXTERNAL_TEACHER.name, read_fields(EXTERNAL_TEACHER),
                         shared.abstract_params(cfg), fn)


# ------------------------------------------------------------------ the RL phases' declarations

JOINT = PhaseSpec("joint_grpo", reads=("rl", "joint"), after=(BASE,))
EXPERT = PhaseSpec("expert_", reads=("rl", "experts"), after=(BASE,))   # expert_<domain>
MOPD = PhaseSpec("mopd", reads=("opd", "mopd"), after=(EXPERT,))
EXTERNAL_OPD = PhaseSpec("external_opd", reads=("rl", "opd", "external.steps"),
                         after=(EXTERNAL_TEACHER,))
# Claim (d): the joint model trained further on one domain, then that domain's loss recovered.
DEGRADE = PhaseSpec("degrade", reads=("self_teacher.degrade_domain", "self_teacher.degrade_steps"),
                    after=(JOINT,))
_RECOVER = ("self_teacher.recover_domain", "self_teacher.recover_steps",
            "self_teacher.eval_refine")
RECOVER_SELF = PhaseSpec("recover_self", reads=("opd",) + _RECOVER, after=(DEGRADE,))
RECOVER_EXTERNAL = PhaseSpec("recover_external", reads=("opd",) + _RECOVER,
                             after=(DEGRADE, EXTERNAL_TEACHER))
RECOVER_GRPO = PhaseSpec("recover_grpo", reads=_RECOVER, after=(DEGRADE,))
