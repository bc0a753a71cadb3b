"""The train state (arrays only) and the optimiser: AdamW, warmup + cosine/constant, norm clipping.

The model and the optimiser are closed over by the steps; the state holds nothing but arrays, so it
can be donated, sharded and checkpointed as one pytree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  step: jax.Array        # int32 scalar: optimiser updates applied
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  learning_rate: float = 1e-3
  warmup_steps: int = 0
  total_steps: int = 1000
  schedule: str = "constant"  # "constant" | "cosine"
  end_lr_fraction: float = 0.1
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  clip_norm: float = 1.0  # global-norm clipping; 0 disables

  def __post_init__(self):
    if self.schedule not in ("constant", "cosine"):
      raise ValueError(f"OptimizerConfig.schedule={self.schedule!r}; expected 'constant' or 'cosine'")
    if self.learning_rate <= 0:
      raise ValueError(f"OptimizerConfig.learning_rate={self.learning_rate} must be positive")
    if self.warmup_steps < 0 or self.total_steps <= 0:
      raise ValueError(f"OptimizerConfig: warmup_steps={self.warmup_steps} must be >= 0 and "
                       f"total_steps={self.total_steps} > 0")


def learning_rate_schedule(cfg: OptimizerConfig) -> optax.Schedule:
  if cfg.schedule == "constant":
    after = optax.constant_schedule(cfg.learning_rate)
  else:
    after = optax.cosine_decay_schedule(cfg.learning_rate,
                                        max(cfg.total_steps - cfg.warmup_steps, 1),
                                        alpha=cfg.end_lr_fraction)
  if cfg.warmup_steps == 0:
    return after
  warm = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
  return optax.join_schedules([warm, after], [cfg.warmup_steps])


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
  """`optax.clip_by_global_norm`, the same arithmetic, that takes the global norm from the
  caller when given (`update(..., grad_norm=norm)`): the steps have it already for their metrics
  and non-finite check, and recomputing it inside their update branch costs another pass over
  all gradients."""
  def update_fn(updates, state, params=None, *, grad_norm=None, **extra_args):
    del params, extra_args
    g_norm = optax.tree.norm(updates) if grad_norm is None else grad_norm
    trigger = jnp.squeeze(g_norm < max_norm)
    clip = lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm)
    return jax.tree.map(clip, updates), state
  return optax.GradientTransformationExtraArgs(optax.init_empty_state, update_fn)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  chain = []
  if cfg.clip_norm:
    chain.append(clip_by_global_norm(cfg.clip_norm))
  chain.append(optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay))
  return optax.chain(*chain)


def create_state(params, tx: optax.GradientTransformation) -> TrainState:
  """A fresh state; under jit with sharded params the optimiser state follows their sharding."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def create_sharded_state(params, tx: optax.GradientTransformation, shardings=None) -> TrainState:
  """`create_state` jitted, so the state is created on the devices, not on the host.

  On a mesh pass `shardings` (a TrainState of shardings, e.g. from
  `smjax.sharding.abstract_train_state`), the same ones the step is jitted with: without them XLA
  picks the new arrays' shardings itself (it made Adam's moments replicated on an fsdp mesh, where
  the step then returned them sharded, recompiling the step on its second call)."""
  return jax.jit(lambda p: create_state(p, tx), out_shardings=shardings)(params)
