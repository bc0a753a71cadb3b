"""Pure jitted steps: `step(state, batch) -> (state, metrics)` for SFT, GRPO and OPD.

A batch is a `SequenceBatch`: full sequences (left-padded prompt + completion) and, aligned to the
*targets* `tokens_BS[:, 1:]`, a loss mask and whatever per-token inputs the objective needs
(behaviour, reference or teacher log-probs). Logits at position s predict token s + 1, so every
per-token array has T = S - 1 columns.

Micro-batching: with `micro_batches > 1` the batch is split on its leading axis (whole GRPO groups
per micro-batch) and gradients are accumulated in a `lax.scan`; the losses take the whole batch's
token and sequence counts, so the accumulated gradient equals the full-batch gradient. Because XLA
counts a scan body once, `step_program_calls` reports the step program plus (micro_batches - 1)
calls of the micro-batch gradient program for the FLOP ledger.

Which positions the losses score (`logits_to_keep`: the completion columns only;
`shared_prompt_rows`: each prompt's forward once per block of rows) is `smjax.train.scoring`.

A step whose loss or gradient is not finite leaves the state unchanged and reports `finite = 0`;
the host loop stops the run with a message naming the step (see loop.py).

Legend: B rows, S sequence length, T = S - 1 target positions (inside the losses: the last
`logits_to_keep` of them, when set), V vocab, D model dim.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from smjax.flops import ProgramCall, shape_struct
from smjax.models.transformer import Transformer
from smjax import sharded_kernels
from smjax.rl import grpo as grpo_lib
from smjax.rl import opd as opd_lib
from smjax.rl.logprobs import token_logprobs
from smjax.train import scoring
from smjax.train.state import TrainState


@flax.struct.dataclass
class SequenceBatch:
  tokens_BS: jax.Array
  positions_BS: jax.Array
  attn_mask_BS: jax.Array           # real (non-pad) tokens
  loss_mask_BT: jax.Array           # completion targets, aligned to tokens_BS[:, 1:]
  old_logp_BT: jax.Array | None = None      # behaviour log-probs (sampler, temperature 1)
  ref_logp_BT: jax.Array | None = None      # reference model (GRPO KL)
  rewards_B: jax.Array | None = None        # GRPO
  teacher_logp_BT: jax.Array | None = None  # OPD "sampled"
  teacher_logits_BTV: jax.Array | None = None  # OPD "full_vocab" / "top_k"
  # The packed completion stream [micro_batches, Tp] (scoring.with_packing; None: run padded).
  pack_src_MT: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  group_size: int = 8
  advantage_mode: str = "grpo"       # grpo | drgrpo | rloo
  eps_low: float = 0.2
  eps_high: float = 0.28
  beta: float = 0.0                  # KL-to-reference weight; 0 = no reference forward at all
  kl_estimator: str = "k3"
  aggregation: str = "token_mean"
  max_len: int | None = None         # seq_mean_token_sum_norm constant (default: T)
  micro_batches: int = 1
  impl: str = "auto"                 # group-advantage kernel dispatch
  logits_to_keep: int | None = None  # LM head on the last k target positions only (docstring)
  shared_prompt_rows: int = 1        # rows per prompt whose forward runs once (docstring; 1: off)


@dataclasses.dataclass(frozen=True)
class OPDConfig:
  objective: str = "sampled"         # sampled | full_vocab | top_k
  aggregation: str = "token_mean"
  eps_low: float = 0.2
  eps_high: float = 0.28
  top_k: int = 16
  micro_batches: int = 1
  impl: str = "auto"                 # reverse-KL kernel dispatch
  logits_to_keep: int | None = None  # LM head on the last k target positions only (docstring)
  shared_prompt_rows: int = 1        # rows per prompt whose forward runs once (docstring; 1: off)


# ------------------------------------------------------------------------------------- losses

def _sft_loss(model, params, batch: SequenceBatch, counts):
  logits = scoring.forward_logits(model, params, batch)
  logp = token_logprobs(logits, batch.tokens_BS[:, 1:])
  mask = batch.loss_mask_BT.astype(jnp.float32)
  loss = -jnp.sum(logp * mask) / counts["tokens"]
  correct = (jnp.argmax(logits, -1) == batch.tokens_BS[:, 1:]).astype(jnp.float32)
  # A micro-batch mean, like the RL losses' metrics (the step averages them over micro-batches).
  return loss, {"token_accuracy": jnp.sum(correct * mask) / jnp.maximum(jnp.sum(mask), 1.0)}


def _grpo_loss(cfg: GRPOConfig, model, params, batch: SequenceBatch, counts, mesh=None):
  keep = scoring.keep_width(cfg.logits_to_keep, batch, "GRPOConfig")
  logp, entropy_BT, _, win, _, guards = scoring.window_scores(model, params, batch, keep,
                                                              cfg.shared_prompt_rows)
  loss, aux = sharded_kernels.grpo_loss_from_rewards(
      logp, win.old_logp_BT, win.ref_logp_BT if cfg.beta else None, win.rewards_B,
      win.loss_mask_BT, group_size=cfg.group_size, advantage_mode=cfg.advantage_mode,
      eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta, kl_estimator=cfg.kl_estimator,
      aggregation=cfg.aggregation, max_len=cfg.max_len or batch.loss_mask_BT.shape[1],
      num_valid_tokens=counts["tokens"], num_sequences=counts["sequences"], impl=cfg.impl,
      mesh=mesh)
  aux = dict(aux, entropy=grpo_lib.masked_mean(entropy_BT, win.loss_mask_BT))
  return scoring.guard_window(loss, aux, batch, keep, guards)


def _opd_loss(cfg: OPDConfig, model, params, batch: SequenceBatch, counts, mesh=None):
  keep = scoring.keep_width(cfg.logits_to_keep, batch, "OPDConfig")
  logp, entropy_BT, logits, win, targets, guards = scoring.window_scores(
      model, params, batch, keep, cfg.shared_prompt_rows, logits=cfg.objective != "sampled")
  # max_len: the full T, whatever the kept window (seq_mean_token_sum_norm's constant).
  kw = dict(mask_BT=win.loss_mask_BT, aggregation=cfg.aggregation,
            num_valid_tokens=counts["tokens"], num_sequences=counts["sequences"],
            max_len=batch.loss_mask_BT.shape[1], eps_low=cfg.eps_low, eps_high=cfg.eps_high,
            top_k=cfg.top_k, impl=cfg.impl, mesh=mesh)
  if cfg.objective == "sampled":
    loss, aux = opd_lib.opd_loss("sampled", student_logp_BT=logp, old_logp_BT=win.old_logp_BT,
                                 teacher_logp_BT=win.teacher_logp_BT, **kw)
  else:
    loss, aux = opd_lib.opd_loss(cfg.objective, student_logits_BTV=logits, student_logp_BT=logp,
                                 teacher_logits_BTV=win.teacher_logits_BTV, tokens_BT=targets,
                                 **kw)
  aux = dict(aux, entropy=grpo_lib.masked_mean(entropy_BT, win.loss_mask_BT))
  return scoring.guard_window(loss, aux, batch, keep, guards)


# -------------------------------------------------------------------------------------- steps

def _counts(batch: SequenceBatch):
  mask = batch.loss_mask_BT.astype(jnp.float32)
  return {"tokens": jnp.maximum(jnp.sum(mask), 1.0),
          "sequences": jnp.maximum(jnp.sum(jnp.any(batch.loss_mask_BT, axis=1)), 1.0)}


def _split(batch, n: int):
  def split(x):
    if x is None:
      return None
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


@dataclasses.dataclass(frozen=True)
class StepDef:
  """An un-jitted step and the loss it differentiates (kept for the micro-batch FLOP program)."""
  step: Callable          # (state, batch) -> (state, metrics)
  loss_fn: Callable       # (params, batch, counts) -> (loss, aux)
  micro_batches: int = 1


def _make_step(loss_fn, tx: optax.GradientTransformation, micro_batches: int,
               lr_schedule=None) -> StepDef:
  if micro_batches < 1:
    raise ValueError(f"{micro_batches=} must be >= 1")

  def step(state: TrainState, batch: SequenceBatch):
    counts = _counts(batch)
    loss, aux, grads = _accumulate_grads(loss_fn, state.params, batch, counts, micro_batches)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def apply(_):
      # grad_norm=: smjax's clip (state.clip_by_global_norm) reuses this norm instead of taking
      # it again inside the branch; other transforms ignore it.
      updates, new_opt = optax.with_extra_args_support(tx).update(
          grads, state.opt_state, state.params, grad_norm=grad_norm)
      return optax.apply_updates(state.params, updates), new_opt

    # A non-finite step leaves parameters and optimiser state as they were. A cond, not a select
    # of new against old: the select made XLA copy every donated parameter and Adam moment first
    # (~4 % of a small GRPO step on CPU).
    new_params, new_opt = jax.lax.cond(finite, apply,
                                       lambda _: (state.params, state.opt_state), None)
    new_state = TrainState(step=state.step + finite.astype(jnp.int32), params=new_params,
                           opt_state=new_opt)
    metrics = dict(aux, loss=loss, grad_norm=grad_norm, finite=finite.astype(jnp.float32),
                   response_length=jnp.sum(batch.loss_mask_BT) / jnp.maximum(
                       jnp.sum(jnp.any(batch.loss_mask_BT, axis=1)), 1))
    if lr_schedule is not None:
      metrics["learning_rate"] = lr_schedule(state.step)
    return new_state, metrics
  return StepDef(step, loss_fn, micro_batches)


def make_sft_step(model: Transformer, tx, *, micro_batches: int = 1, lr_schedule=None) -> StepDef:
  return _make_step(lambda p, b, c: _sft_loss(model, p, b, c), tx, micro_batches, lr_schedule)


def make_grpo_step(model: Transformer, tx, cfg: GRPOConfig, *, lr_schedule=None,
                   mesh=None) -> StepDef:
  """`mesh`: where the step runs sharded, so the Pallas loss kernel runs per device under
  shard_map (smjax.sharded_kernels); None means the mesh set by jax.set_mesh, if any."""
  return _make_step(lambda p, b, c: _grpo_loss(cfg, model, p, b, c, mesh), tx, cfg.micro_batches,
                    lr_schedule)


def make_opd_step(model: Transformer, tx, cfg: OPDConfig, *, lr_schedule=None,
                  mesh=None) -> StepDef:
  if cfg.objective not in opd_lib.OBJECTIVES:
    raise ValueError(f"OPDConfig.objective={cfg.objective!r}; expected one of {opd_lib.OBJECTIVES}")
  return _make_step(lambda p, b, c: _opd_loss(cfg, model, p, b, c, mesh), tx, cfg.micro_batches,
                    lr_schedule)


# ----------------------------------------------------------------------------- jit + flops

@dataclasses.dataclass
class JittedStep:
  """A step jitted once with donated state and explicit shardings, and its FLOP reporting."""
  fn: Callable
  phase: str = "train/policy"
  micro_batches: int = 1
  micro_fn: Callable | None = None

  def __call__(self, state, batch):
    return self.fn(state, batch)

  def program_calls(self, state, batch) -> list[ProgramCall]:
    """The step program once, plus (micro_batches - 1) micro-batch gradient programs: XLA counts
    the accumulation scan's body once, the ledger needs it micro_batches times."""
    args = jax.tree.map(shape_struct, (state, batch))
    calls = [ProgramCall(self.phase, self.fn, args, calls=1)]
    if self.micro_batches > 1:
      micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
          (x.shape[0] // self.micro_batches,) + x.shape[1:], x.dtype), batch)
      counts = {"tokens": jax.ShapeDtypeStruct((), jnp.float32),
                "sequences": jax.ShapeDtypeStruct((), jnp.float32)}
      calls.append(ProgramCall(self.phase, self.micro_fn,
                               (jax.tree.map(shape_struct, state.params), micro, counts),
                               calls=self.micro_batches - 1))
    return calls


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
