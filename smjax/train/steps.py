"""The train steps' public API: losses of a `SequenceBatch`, and `step(state, batch) -> (state,
metrics)` jitted once.

Losses (`sft_loss`, `grpo_loss`, `opd_loss`) are `loss(model, params, batch, counts, ...) ->
(loss, aux)`: they score the batch by its layout (smjax.train.score) and call the array cores in
smjax/rl through the one kernel dispatch (smjax.kernels.dispatch). `counts` are the whole batch's
token and sequence counts (`token_counts`), so a micro-batch's loss is its share of the full
batch's.

`train_step(loss_fn, tx, ...)` makes the step; `jit_step` jits it once with donated state and
explicit shardings; `step_program_calls` says what the FLOP ledger adds for one call.

Micro-batching: with `micro_batches > 1` the batch is split on its leading axis (whole prompt
blocks per micro-batch; a packed batch carries one plan row per micro-batch) and gradients are
accumulated in a `lax.scan`. Because XLA counts a scan body once, `step_program_calls` reports the
step program plus (micro_batches - 1) calls of the micro-batch gradient program.

A step whose loss or gradient is not finite leaves the state unchanged and reports `finite = 0`,
with a `finite/<what>` flag for the loss, the gradient norm and each float input of the batch, so
the host can say which one it was (smjax.train.loop).

Legend (docs/design.md#shape-legend): B rows, G group size, C completion length (the scored window),
T = S - 1 target positions, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from smjax.batch import SequenceBatch
from smjax.flops import ProgramCall, shape_struct
from smjax.kernels import dispatch
from smjax.models.transformer import Transformer
from smjax.rl import grpo as grpo_lib
from smjax.rl import opd as opd_lib
from smjax.train.score import score
from smjax.train.state import TrainState


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  # 0: the batch's (Layout.group_size, the rollout's samples per prompt: the one owner of the
  # group size); a batch that does not say needs it here, and one that does must agree.
  group_size: int = 0
  advantage_mode: str = "grpo"       # grpo | drgrpo | rloo
  eps_low: float = 0.2
  eps_high: float = 0.28
  beta: float = 0.0                  # KL-to-reference weight; 0 = no reference forward at all
  kl_estimator: str = "k3"
  aggregation: str = "token_mean"
  max_len: int | None = None         # seq_mean_token_sum_norm constant (default: T)
  micro_batches: int = 1
  impl: str = "auto"                 # group-advantage kernel (smjax.kernels.dispatch)

  def __post_init__(self):
    _check_choice("GRPOConfig.advantage_mode", self.advantage_mode, grpo_lib.ADVANTAGE_MODES)
    _check_choice("GRPOConfig.kl_estimator", self.kl_estimator, grpo_lib.KL_ESTIMATORS)
    _check_choice("GRPOConfig.aggregation", self.aggregation, grpo_lib.AGGREGATIONS)
    _check_choice("GRPOConfig.impl", self.impl, dispatch.IMPLS)
    if self.micro_batches < 1:
      raise ValueError(f"GRPOConfig.micro_batches={self.micro_batches} must be >= 1")
    if self.group_size < 0:
      raise ValueError(f"GRPOConfig.group_size={self.group_size} must be >= 0 (0: the batch's)")


def group_size_of(batch: SequenceBatch, cfg: GRPOConfig) -> int:
  """The reward groups' size for a GRPO step: the batch's (`Layout.group_size`, set from the
  rollout) or, for a batch that does not say, cfg.group_size; a ValueError when neither says or
  both say and disagree (advantages over the wrong groups would train silently)."""
  have, want = batch.layout.group_size, cfg.group_size
  if have and want and have != want:
    raise ValueError(f"GRPO step: the batch's rewards come in groups of {have} "
                     f"(Layout.group_size, the rollout's samples per prompt), but "
                     f"GRPOConfig.group_size={want}; leave GRPOConfig.group_size at 0 to take "
                     "the batch's")
  if not (have or want):
    raise ValueError("GRPO step: the batch does not say its reward groups' size "
                     "(Layout.group_size=0: built by hand, not by rollout_batch); set "
                     "Layout.group_size or GRPOConfig.group_size")
  return have or want


@dataclasses.dataclass(frozen=True)
class OPDConfig:
  objective: str = "sampled"         # sampled | full_vocab | top_k
  aggregation: str = "token_mean"
  eps_low: float = 0.2
  eps_high: float = 0.28
  top_k: int = 16
  micro_batches: int = 1
  impl: str = "auto"                 # reverse-KL kernel (smjax.kernels.dispatch)

  def __post_init__(self):
    _check_choice("OPDConfig.objective", self.objective, opd_lib.OBJECTIVES)
    _check_choice("OPDConfig.aggregation", self.aggregation, grpo_lib.AGGREGATIONS)
    _check_choice("OPDConfig.impl", self.impl, dispatch.IMPLS)
    if self.micro_batches < 1:
      raise ValueError(f"OPDConfig.micro_batches={self.micro_batches} must be >= 1")


def _check_choice(field: str, value, choices) -> None:
  if value not in choices:
    raise ValueError(f"{field}={value!r}; expected one of {tuple(choices)}")


# ------------------------------------------------------------------------------------- losses

def token_counts(batch: SequenceBatch) -> dict[str, jax.Array]:
  """The whole batch's loss-mask tokens and scored sequences (each at least 1): the normalisers
  every micro-batch's loss divides by."""
  mask = batch.loss_mask_BT.astype(jnp.float32)
  return {"tokens": jnp.maximum(jnp.sum(mask), 1.0),
          "sequences": jnp.maximum(jnp.sum(jnp.any(batch.loss_mask_BT, axis=1)), 1.0)}


def sft_loss(model: Transformer, params, batch: SequenceBatch, counts):
  """Token-mean negative log-likelihood of the loss-mask targets; aux: token_accuracy (argmax)."""
  s = score(model, params, batch, entropy=False, logits=True)
  mask = batch.scored(batch.loss_mask_BT).astype(jnp.float32)
  loss = -jnp.sum(s.logp_BC * mask) / counts["tokens"]
  correct = (jnp.argmax(s.logits_BCV, -1) == s.targets_BC).astype(jnp.float32)
  # A micro-batch mean, like the RL losses' metrics (the step averages them over micro-batches).
  return loss, {"token_accuracy": jnp.sum(correct * mask) / jnp.maximum(jnp.sum(mask), 1.0)}


def grpo_loss(model: Transformer, params, batch: SequenceBatch, counts, *, cfg: GRPOConfig,
              mesh=None):
  """The GRPO loss (docs/design.md#grpo) of a batch with rewards_B and old_logp_BT (and ref_logp_BT
  when cfg.beta > 0). `mesh`: where the step runs sharded (the Pallas loss kernel then runs per
  device under shard_map; None: the mesh set by jax.set_mesh, if any)."""
  s = score(model, params, batch)
  mask_BC = batch.scored(batch.loss_mask_BT)
  loss, aux = dispatch.grpo_loss_from_rewards(
      s.logp_BC, batch.scored(batch.old_logp_BT),
      batch.scored(batch.ref_logp_BT) if cfg.beta else None, batch.rewards_B, mask_BC,
      group_size=group_size_of(batch, cfg), advantage_mode=cfg.advantage_mode,
      eps_low=cfg.eps_low,
      eps_high=cfg.eps_high, beta=cfg.beta, kl_estimator=cfg.kl_estimator,
      aggregation=cfg.aggregation, max_len=cfg.max_len or batch.loss_mask_BT.shape[1],
      num_valid_tokens=counts["tokens"], num_sequences=counts["sequences"], impl=cfg.impl,
      mesh=mesh)
  return loss, dict(aux, entropy=grpo_lib.masked_mean(s.entropy_BC, mask_BC))


def opd_loss(model: Transformer, params, batch: SequenceBatch, counts, *, cfg: OPDConfig,
             mesh=None):
  """The on-policy distillation loss (docs/design.md#on-policy-distillation) of a batch with the
  teacher's scores (teacher_logp_BT for "sampled", teacher_logits_BTV otherwise) and old_logp_BT."""
  s = score(model, params, batch, logits=cfg.objective != "sampled")
  mask_BC = batch.scored(batch.loss_mask_BT)
  # max_len: the full T, whatever the scored window (seq_mean_token_sum_norm's constant).
  kw = dict(mask_BT=mask_BC, aggregation=cfg.aggregation, num_valid_tokens=counts["tokens"],
            num_sequences=counts["sequences"], max_len=batch.loss_mask_BT.shape[1],
            eps_low=cfg.eps_low, eps_high=cfg.eps_high, top_k=cfg.top_k,
            reverse_kl=functools.partial(dispatch.reverse_kl, impl=cfg.impl, mesh=mesh))
  if cfg.objective == "sampled":
    loss, aux = opd_lib.opd_loss("sampled", student_logp_BT=s.logp_BC,
                                 old_logp_BT=batch.scored(batch.old_logp_BT),
                                 teacher_logp_BT=batch.scored(batch.teacher_logp_BT), **kw)
  else:
    loss, aux = opd_lib.opd_loss(cfg.objective, student_logits_BTV=s.logits_BCV,
                                 student_logp_BT=s.logp_BC,
                                 teacher_logits_BTV=batch.scored(batch.teacher_logits_BTV),
                                 tokens_BT=s.targets_BC, **kw)
  return loss, dict(aux, entropy=grpo_lib.masked_mean(s.entropy_BC, mask_BC))


# -------------------------------------------------------------------------------------- steps

def _split(batch: SequenceBatch, n: int) -> SequenceBatch:
  def split(x):
    if x.shape[0] % n:
      raise ValueError(f"batch rows {x.shape[0]} are not divisible by micro_batches={n}")
    return x.reshape((n, x.shape[0] // n) + x.shape[1:])
  return jax.tree.map(split, batch)


def _accumulate_grads(loss_fn, params, batch, counts, micro_batches: int):
  grad_fn = jax.value_and_grad(lambda p, b: loss_fn(p, b, counts), has_aux=True)
  if micro_batches == 1:
    (loss, aux), grads = grad_fn(params, batch)
    return loss, aux, grads

  def body(carry, micro):
    loss_acc, grads_acc = carry
    (loss, aux), grads = grad_fn(params, micro)
    return (loss_acc + loss, jax.tree.map(jnp.add, grads_acc, grads)), aux

  zeros = jax.tree.map(jnp.zeros_like, params)
  (loss, grads), aux = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros),
                                    _split(batch, micro_batches))
  return loss, jax.tree.map(lambda x: jnp.mean(x, axis=0), aux), grads


_INPUTS = ("old_logp_BT", "ref_logp_BT", "rewards_B", "teacher_logp_BT", "teacher_logits_BTV")


def _finite_flags(loss, grad_norm, batch: SequenceBatch) -> dict[str, jax.Array]:
  """{what: all finite} for the loss, the gradient norm and each float input of the batch: the
  guards a non-finite step's error names (smjax.train.guards.check_finite)."""
  flags = {"loss": jnp.isfinite(loss), "grad_norm": jnp.isfinite(grad_norm)}
  for name in _INPUTS:
    x = getattr(batch, name)
    if x is not None:
      flags[f"batch.{name}"] = jnp.all(jnp.isfinite(x))
  return flags


@dataclasses.dataclass(frozen=True)
class StepDef:
  """An un-jitted step and the loss it differentiates (kept for the micro-batch FLOP program)."""
  step: Callable          # (state, batch) -> (state, metrics)
  loss_fn: Callable       # (params, batch, counts) -> (loss, aux)
  micro_batches: int = 1


def train_step(loss_fn: Callable, tx: optax.GradientTransformation, *, micro_batches: int = 1,
               lr_schedule=None) -> StepDef:
  """`step(state, batch) -> (state, metrics)` minimising `loss_fn(params, batch, counts)`."""
  if micro_batches < 1:
    raise ValueError(f"{micro_batches=} must be >= 1")

  def step(state: TrainState, batch: SequenceBatch):
    counts = token_counts(batch)
    loss, aux, grads = _accumulate_grads(loss_fn, state.params, batch, counts, micro_batches)
    grad_norm = optax.tree.norm(grads)
    flags = _finite_flags(loss, grad_norm, batch)
    finite = flags["loss"] & flags["grad_norm"]

    def apply(_):
      # grad_norm=: smjax's clip (state.clip_by_global_norm) reuses this norm instead of taking
      # it again inside the branch; other transforms ignore it.
      updates, new_opt = optax.with_extra_args_support(tx).update(
          grads, state.opt_state, state.params, grad_norm=grad_norm)
      return optax.apply_updates(state.params, updates), new_opt

    # A non-finite step leaves parameters and optimiser state as they were. A cond, not a select
    # of new against old: the select made XLA copy every donated parameter and Adam moment first.
    new_params, new_opt = jax.lax.cond(finite, apply,
                                       lambda _: (state.params, state.opt_state), None)
    new_state = TrainState(step=state.step + finite.astype(jnp.int32), params=new_params,
                           opt_state=new_opt)
    metrics = dict(aux, loss=loss, grad_norm=grad_norm, finite=finite.astype(jnp.float32),
                   response_length=jnp.sum(batch.loss_mask_BT) / jnp.maximum(
                       jnp.sum(jnp.any(batch.loss_mask_BT, axis=1)), 1))
    metrics.update({f"finite/{k}": v.astype(jnp.float32) for k, v in flags.items()})
    if lr_schedule is not None:
      metrics["learning_rate"] = lr_schedule(state.step)
    return new_state, metrics
  return StepDef(step, loss_fn, micro_batches)


def make_sft_step(model: Transformer, tx, *, micro_batches: int = 1, lr_schedule=None) -> StepDef:
  return train_step(functools.partial(sft_loss, model), tx, micro_batches=micro_batches,
                    lr_schedule=lr_schedule)


def make_grpo_step(model: Transformer, tx, cfg: GRPOConfig, *, lr_schedule=None,
                   mesh=None) -> StepDef:
  """`mesh`: where the step runs sharded (see `grpo_loss`)."""
  return train_step(functools.partial(grpo_loss, model, cfg=cfg, mesh=mesh), tx,
                    micro_batches=cfg.micro_batches, lr_schedule=lr_schedule)


def make_opd_step(model: Transformer, tx, cfg: OPDConfig, *, lr_schedule=None,
                  mesh=None) -> StepDef:
  return train_step(functools.partial(opd_loss, model, cfg=cfg, mesh=mesh), tx,
                    micro_batches=cfg.micro_batches, lr_schedule=lr_schedule)


# ----------------------------------------------------------------------------- jit + flops

@dataclasses.dataclass(frozen=True)
class JittedStep:
  """A step jitted once with donated state and explicit shardings (`jit_step`)."""
  fn: Callable
  phase: str = "train/policy"
  micro_batches: int = 1
  micro_fn: Callable | None = None

  def __call__(self, state, batch):
    return self.fn(state, batch)


def jit_step(step_def: StepDef, *, state_shardings=None, batch_sharding=None,
             phase: str = "train/policy") -> JittedStep:
  """Jits a step with donated state.

  `state_shardings` (a TrainState of shardings) are the state's input *and* output shardings, so
  the returned state is a valid input of the next call: on a mesh the step compiles once. Create
  the state with the same shardings (`state.create_sharded_state(..., shardings=...)`); a state
  committed to others is refused by jax.jit. Without them XLA chooses the output state's
  shardings, which need not be the input's, and the second call recompiles.

  `batch_sharding` None leaves the batch unspecified: jax.jit reads a None leaf of in_shardings as
  "take the argument's own sharding", not "replicated" (jax 0.10, tests/test_mesh_compile_once.py),
  so the batch keeps the layout the sampler gave it. Metrics' output shardings are left to XLA.
  """
  kw: dict[str, Any] = {"donate_argnums": (0,)}
  if state_shardings is not None or batch_sharding is not None:
    kw["in_shardings"] = (state_shardings, batch_sharding)
  if state_shardings is not None:
    kw["out_shardings"] = (state_shardings, None)
  loss_fn = step_def.loss_fn
  micro_fn = jax.jit(lambda params, micro, counts: jax.value_and_grad(
      lambda p: loss_fn(p, micro, counts), has_aux=True)(params))
  return JittedStep(jax.jit(step_def.step, **kw), phase, step_def.micro_batches, micro_fn)


def step_program_calls(step: JittedStep, state, batch: SequenceBatch, *,
                       phase: str | None = None) -> list[ProgramCall]:
  """What one call of `step` adds to the FLOP ledger (under `phase`, default the step's): the
  step program once, plus (micro_batches - 1) micro-batch gradient programs, because XLA counts
  the accumulation scan's body once."""
  phase = phase or step.phase
  args = jax.tree.map(shape_struct, (state, batch))
  calls = [ProgramCall(phase, step.fn, args, calls=1)]
  if step.micro_batches > 1:
    micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        (x.shape[0] // step.micro_batches,) + x.shape[1:], x.dtype), batch)
    counts = {"tokens": jax.ShapeDtypeStruct((), jnp.float32),
              "sequences": jax.ShapeDtypeStruct((), jnp.float32)}
    calls.append(ProgramCall(phase, step.micro_fn,
                             (jax.tree.map(shape_struct, state.params), micro, counts),
                             calls=step.micro_batches - 1))
  return calls
