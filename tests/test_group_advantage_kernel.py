"""Tests for kernels/group_advantage.py: the fused GRPO kernel against its pure-jnp reference.

On CPU the kernel runs in Pallas interpret mode (INTERPRET); forward loss, every metric and the
gradient are compared over a product of shapes and block sizes (including sizes the blocks do not
divide). TPU (Mosaic) and GPU (Triton) lowering is checked by lowering for those platforms on CPU.

Legend: B batch rows, G group size, T time.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smjax.kernels import group_advantage as ga
from smjax.rl import grpo

INTERPRET = True


def _batch(seed, b, t, g):
  """Ragged mask with a fully masked row 1, garbage (-inf/NaN) where masked, one constant group."""
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.5, 0.7, (b, t)).astype(np.float32)
  old = (logp + rng.normal(0.0, 0.3, (b, t))).astype(np.float32)
  ref = (logp + rng.normal(0.0, 0.3, (b, t))).astype(np.float32)
  lengths = rng.integers(1, t + 1, b)
  lengths[1] = 0
  mask = np.arange(t)[None, :] < lengths[:, None]
  logp[~mask], old[~mask], ref[~mask] = -np.inf, np.nan, np.nan
  rewards = rng.integers(0, 3, b).astype(np.float32)
  rewards[-g:] = 0.5
  return tuple(map(jnp.asarray, (logp, old, ref, rewards, mask)))


@functools.partial(jax.jit, static_argnames=("kw_items", "block_sizes", "fused"))
def _loss_and_grad(logp, old, ref, rewards, mask, num_valid_tokens, num_sequences, *, kw_items,
                   block_sizes, fused):
  kw = dict(kw_items)

  def f(lp):
    if fused:
      return ga.grpo_loss_fused(lp, old, ref, rewards, mask, num_valid_tokens, num_sequences,
                                block_sizes=block_sizes, interpret=INTERPRET, **kw)
    return ga.grpo_loss_fused_reference(lp, old, ref, rewards, mask, num_valid_tokens,
                                        num_sequences, **kw)

  return jax.value_and_grad(f, has_aux=True)(logp)


def _check_against_reference(batch, kw, block_sizes, normalisers=(None, None)):
  logp, old, ref, rewards, mask = batch
  args = (logp, old, ref, rewards, mask) + tuple(normalisers)
  kw_items = tuple(sorted(kw.items()))
  (loss, aux), grad = _loss_and_grad(*args, kw_items=kw_items, block_sizes=block_sizes,
                                     fused=True)
  (loss_r, aux_r), grad_r = _loss_and_grad(*args, kw_items=kw_items, block_sizes=None,
                                           fused=False)
  np.testing.assert_allclose(loss, loss_r, rtol=1e-5, atol=1e-7)
  assert aux.keys() == aux_r.keys()
  for k in aux:
    np.testing.assert_allclose(aux[k], aux_r[k], rtol=1e-5, atol=1e-6, err_msg=k)
  grad, grad_r = np.asarray(grad), np.asarray(grad_r)
  assert grad.shape == logp.shape and np.all(np.isfinite(grad))
  np.testing.assert_allclose(grad, grad_r, rtol=1e-5, atol=1e-7)
  assert np.all(grad[~np.asarray(mask)] == 0.0) and np.any(grad != 0.0)
  return loss, aux


SHAPES = [(6, 10, 3), (8, 16, 4)]  # (B, T, G); G=3 is padded to 4 lanes inside the kernel
BLOCKS = [ga.BlockSizes(block_b=4, block_t=4), ga.BlockSizes(block_b=8, block_t=16)]


@pytest.mark.parametrize("block_sizes", BLOCKS, ids=lambda s: f"b{s.block_b}t{s.block_t}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}G{}".format(*s))
def test_fused_matches_reference(shape, block_sizes):
  b, t, g = shape
  kw = dict(group_size=g, advantage_mode="grpo", eps_low=0.2, eps_high=0.28, beta=0.04,
            kl_estimator="k3", aggregation="seq_mean_token_mean")
  _check_against_reference(_batch(b + t, b, t, g), kw, block_sizes)


MODES = [
    # Global normalisers (micro-batching) are passed as traced scalars.
    dict(advantage_mode="drgrpo", aggregation="token_mean", kl_estimator="k1", beta=0.1,
         normalisers=(40.0, 9.0)),
    dict(advantage_mode="rloo", aggregation="seq_mean_token_sum_norm", kl_estimator="k3",
         beta=0.0, max_len=12, no_ref=True),
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m['advantage_mode']}-{m['aggregation']}")
def test_fused_modes_match_reference(mode):
  mode = dict(mode)
  normalisers = tuple(None if n is None else jnp.float32(n)
                      for n in mode.pop("normalisers", (None, None)))
  logp, old, ref, rewards, mask = _batch(7, 6, 10, 3)
  if mode.pop("no_ref", False):
    ref = None
  kw = dict(group_size=3, eps_low=0.2, eps_high=0.2, **mode)
  _check_against_reference((logp, old, ref, rewards, mask), kw,
                           ga.BlockSizes(block_b=8, block_t=8), normalisers)


def test_grpo_py_routes_to_kernel():
  logp, old, ref, rewards, mask = _batch(3, 6, 10, 3)
  adv = grpo.group_advantages(rewards, group_size=3, mode="grpo")
  # beta=0 with ref given: KL is reported but carries no gradient (the backward skips ref).
  kw = dict(eps_low=0.2, eps_high=0.28, beta=0.0, kl_estimator="k3", aggregation="token_mean")

  @functools.partial(jax.jit, static_argnames="impl")
  def run(lp, impl):  # both grpo.py entries, each through value_and_grad
    from_adv = lambda x: grpo.grpo_loss(x, old, ref, adv, mask, impl=impl, **kw)
    from_rewards = lambda x: grpo.grpo_loss_from_rewards(
        x, old, ref, rewards, mask, group_size=3, advantage_mode="grpo", impl=impl, **kw)
    return [jax.value_and_grad(f, has_aux=True)(lp) for f in (from_adv, from_rewards)]

  for ((loss_p, aux_p), grad_p), ((loss_x, aux_x), grad_x) in zip(run(logp, "pallas"),
                                                                  run(logp, "xla")):
    np.testing.assert_allclose(loss_p, loss_x, rtol=1e-5)
    for k in ("clip_frac", "kl_mean", "ratio_max", "advantage_std"):
      np.testing.assert_allclose(aux_p[k], aux_x[k], rtol=1e-5, err_msg=k)
    assert float(aux_p["kl_mean"]) > 0.0
    np.testing.assert_allclose(grad_p, grad_x, rtol=1e-5, atol=1e-7)
  assert ga.resolve_impl("auto") == "xla"  # CPU: auto keeps the jnp path
  assert ga.resolve_impl("pallas") == "pallas"


def test_bad_inputs():
  logp, old, ref, rewards, mask = _batch(0, 6, 5, 3)
  kw = dict(group_size=3, advantage_mode="grpo", eps_low=0.2, eps_high=0.2, beta=0.1,
            kl_estimator="k3", aggregation="token_mean", interpret=INTERPRET)
  call = lambda **o: ga.grpo_loss_fused(
      o.pop("logp", logp), old, ref, o.pop("rewards", rewards), o.pop("mask", mask), **{**kw, **o})
  cases = [
      (dict(advantage_mode="ppo"), "advantage_mode='ppo'"),
      (dict(group_size=4), "multiple of group_size=4"),
      (dict(rewards=rewards[:3], group_size=1, advantage_mode="precomputed"), "rewards_B shape"),
      (dict(mask=mask[:, :4]), "mask_BT shape"),
      (dict(aggregation="mean"), "aggregation='mean'"),
      (dict(block_sizes=ga.BlockSizes(block_b=0, block_t=4)), "positive block_b"),
      (dict(block_sizes=ga.BlockSizes(block_b=4, block_t=128), interpret=False, backend="tpu"),
       "multiple of 8"),
      (dict(block_sizes=ga.BlockSizes(block_b=8, block_t=96), interpret=False, backend="gpu"),
       "powers of two"),
      (dict(interpret=False, backend="cpu"), "no Pallas lowering"),
  ]
  for override, match in cases:
    with pytest.raises(ValueError, match=match):
      call(**override)
  with pytest.raises(ValueError, match="impl='triton'"):
    ga.resolve_impl("triton")


@pytest.mark.parametrize("backend,platform,custom_call", [
    ("tpu", "tpu", "tpu_custom_call"), ("gpu", "cuda", "xla.gpu.triton")])
def test_lowers_for_accelerators(backend, platform, custom_call):
  # Sizes no default block divides, bf16 log-probs, G=6 (padded to 8 lanes): forward + backward.
  b, t, g = 24, 300, 6
  logp = jnp.zeros((b, t), jnp.bfloat16)
  old, ref = jnp.zeros((b, t), jnp.float32), jnp.zeros((b, t), jnp.bfloat16)
  mask, rewards = jnp.ones((b, t), bool), jnp.zeros((b,), jnp.float32)
  kw = dict(group_size=g, advantage_mode="rloo", eps_low=0.2, eps_high=0.28, beta=0.04,
            kl_estimator="k3", aggregation="token_mean", backend=backend, interpret=False,
            block_sizes=ga.BlockSizes(block_b=16, block_t=128))
  fn = jax.value_and_grad(lambda x: ga.grpo_loss_fused(x, old, ref, rewards, mask, **kw),
                          has_aux=True)
  text = jax.jit(fn).trace(logp).lower(lowering_platforms=(platform,)).as_text()
  assert text.count(custom_call) == 2  # the forward and the backward kernel
  if backend == "tpu":  # Mosaic carries the CostEstimate to XLA's cost analysis
    fwd, bwd = ga.cost_estimates(32, 384, group_width=8, has_ref=True, kl_estimator="k3",
                                 itemsize=2)
    flops = {int(x) for x in re.findall(r"flops\\22:(\d+)", text)}
    assert flops == {fwd.flops, bwd.flops} and fwd.flops > 30 * b * t
