"""The optimiser and the update the steps apply (smjax.train.state, smjax.train.steps.train_step).

Reference: optax itself. smjax's global-norm clip is optax's arithmetic with the norm optionally
handed in by the step; a finite step is exactly optax's chain (clip, AdamW) applied to the
gradient of the step's loss; a non-finite step (a NaN reward here) leaves parameters, moments and
the step count as they were; a step built on a plain optax transformation, which takes no extra
arguments, runs too.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from smjax.models.transformer import Transformer, init_params
from smjax.train import state as state_lib
from smjax.train import steps as st
from batches import CFGS, G, grouped_batch

_tree = {"a": jnp.asarray([3.0, -4.0, 1e-3]), "b": jnp.asarray([[0.5, 2.0], [-1.0, 0.25]])}


@pytest.mark.parametrize("max_norm", [0.5, 100.0])   # clipping, and not
def test_clip_is_optax_clip_with_or_without_the_norm_handed_in(max_norm):
  ref, _ = optax.clip_by_global_norm(max_norm).update(_tree, optax.EmptyState())
  ours = state_lib.clip_by_global_norm(max_norm)
  norm = optax.tree.norm(_tree)
  for kw in ({}, {"grad_norm": norm}):
    out, _ = ours.update(_tree, ours.init(_tree), None, **kw)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
      np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
  # The norm handed in is the one used (the step passes the norm of these very gradients).
  out, _ = ours.update(_tree, ours.init(_tree), None, grad_norm=2 * norm)
  if max_norm < float(norm):
    np.testing.assert_allclose(np.asarray(out["a"]), np.asarray(ref["a"]) / 2, rtol=1e-6)


def _setup(tx):
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(3))
  return params, st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla"))


def test_finite_step_is_optax_chain_and_non_finite_step_changes_nothing():
  # eps 1e-3, above most gradient entries: Adam's update then scales with the (clipped) gradient.
  opt = state_lib.OptimizerConfig(learning_rate=1e-2, clip_norm=0.1, weight_decay=0.1, eps=1e-3)
  tx = state_lib.make_optimizer(opt)
  params, sd = _setup(tx)
  batch = grouped_batch(seed=4)
  state = state_lib.create_state(params, tx)
  new, metrics = jax.jit(sd.step)(state, batch)
  assert float(metrics["finite"]) == 1 and int(new.step) == 1
  # The same update by optax's own clip and AdamW on the gradient of the step's loss.
  # (Jitted: op by op these references took about half of this test's time.)
  grads = jax.jit(jax.grad(lambda p: sd.loss_fn(p, batch, st.token_counts(batch))[0]))(params)
  assert float(optax.tree.norm(grads)) > opt.clip_norm   # the clip acts
  ref_tx = optax.chain(optax.clip_by_global_norm(opt.clip_norm),
                       optax.adamw(opt.learning_rate, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                                   weight_decay=opt.weight_decay))
  no_clip = optax.adamw(opt.learning_rate, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                        weight_decay=opt.weight_decay)
  apply = jax.jit(lambda tx_, g, p: optax.apply_updates(p, tx_.update(g, tx_.init(p), p)[0]),
                  static_argnums=0)
  ref, unclipped = apply(ref_tx, grads, params), apply(no_clip, grads, params)
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(new.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
  # (Without the clip the weights would move elsewhere: the check can fail.)
  assert max(float(jnp.max(jnp.abs(a - u))) for a, u in
             zip(jax.tree.leaves(ref), jax.tree.leaves(unclipped))) > 1e-5
  # A NaN reward makes the loss NaN: nothing moves, not even Adam's count.
  bad = batch.replace(rewards_B=batch.rewards_B.at[0].set(jnp.nan))
  after, m = jax.jit(sd.step)(new, bad)
  assert float(m["finite"]) == 0 and int(after.step) == 1
  for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(after)):
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_step_takes_a_plain_optax_transformation():
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1e-2))   # no extra-args support
  params, sd = _setup(tx)
  new, metrics = jax.jit(sd.step)(state_lib.create_state(params, tx), grouped_batch(seed=4))
  assert float(metrics["finite"]) == 1 and int(new.step) == 1
  moved = [float(jnp.max(jnp.abs(a - b))) for a, b in
           zip(jax.tree.leaves(params), jax.tree.leaves(new.params))]
  assert max(moved) > 0
