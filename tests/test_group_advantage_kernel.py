"""Tests for kernels/group_advantage.py: the fused GRPO kernel against its pure-jnp reference and
against smjax.rl.grpo's XLA path, forward (loss and every metric) and gradient.

The reference (`grpo_loss_fused_reference`) shares no code with the kernel or smjax.rl.grpo, and
is itself checked against a case computed by hand. On CPU the kernel runs in Pallas interpret mode
(INTERPRET) over a product of shapes and block sizes (including sizes the blocks do not divide).
TPU (Mosaic) and GPU (Triton) lowering is checked by lowering for those platforms on CPU. Which of
them a step runs is tests/test_dispatch.py's.

Legend (docs/design.md#shape-legend): B rows, G group size, T target positions.
"""

import functools
import math
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
  # Continuous rewards: no row of a varied group has an advantage of exactly 0, where the clip
  # metrics' A < 0 / A > 0 would hang on rounding (the constant group's advantage is exactly 0).
  rewards = rng.uniform(0, 2, b).astype(np.float32)
  rewards[-g:] = 0.5
  return tuple(map(jnp.asarray, (logp, old, ref, rewards, mask)))


@functools.partial(jax.jit, static_argnames=("kw_items", "block_sizes", "which"))
def _loss_and_grad(logp, old, ref, rewards, mask, num_valid_tokens, num_sequences, *, kw_items,
                   block_sizes, which):
  kw = dict(kw_items)

  def f(lp):
    if which == "fused":
      return ga.grpo_loss_fused(lp, old, ref, rewards, mask, num_valid_tokens, num_sequences,
                                block_sizes=block_sizes, interpret=INTERPRET, **kw)
    if which == "reference":
      return ga.grpo_loss_fused_reference(lp, old, ref, rewards, mask, num_valid_tokens,
                                          num_sequences, **kw)
    norms = dict(num_valid_tokens=num_valid_tokens, num_sequences=num_sequences)
    if kw["advantage_mode"] == "precomputed":  # smjax.rl.grpo's XLA path, from advantages
      loss_kw = {k: v for k, v in kw.items() if k not in ("group_size", "advantage_mode")}
      return grpo.grpo_loss(lp, old, ref, rewards, mask, **norms, **loss_kw)
    return grpo.grpo_loss_from_rewards(lp, old, ref, rewards, mask, **norms, **kw)

  return jax.value_and_grad(f, has_aux=True)(logp)


def _check_against_reference(batch, kw, block_sizes, normalisers=(None, None)):
  logp, old, ref, rewards, mask = batch
  args = (logp, old, ref, rewards, mask) + tuple(normalisers)
  kw_items = tuple(sorted(kw.items()))
  (loss, aux), grad = _loss_and_grad(*args, kw_items=kw_items, block_sizes=block_sizes,
                                     which="fused")
  grad = np.asarray(grad)
  assert grad.shape == logp.shape and np.all(np.isfinite(grad))
  assert np.all(grad[~np.asarray(mask)] == 0.0) and np.any(grad != 0.0)
  for which in ("reference", "xla"):
    (loss_r, aux_r), grad_r = _loss_and_grad(*args, kw_items=kw_items, block_sizes=None,
                                             which=which)
    np.testing.assert_allclose(loss, loss_r, rtol=1e-5, atol=1e-7, err_msg=which)
    assert aux.keys() == aux_r.keys(), which
    for k in aux:
      np.testing.assert_allclose(aux[k], aux_r[k], rtol=1e-5, atol=1e-6, err_msg=f"{which} {k}")
    np.testing.assert_allclose(grad, np.asarray(grad_r), rtol=1e-5, atol=1e-7, err_msg=which)


# --------------------------------------------------------------------------- the reference by hand

# Two groups of G = 2 over T = 2, every log-prob -1 where valid. Group 0 has rewards (1, 0), so
# A = +a on row 0 and -a on row 1 with a = 0.5 / (sqrt(0.5) + eps) (grpo: the unbiased std of
# (1, 0) is sqrt(0.5)), 0.5 (drgrpo) or 1 (rloo: 1 - 0). Group 1 is constant (A = 0 exactly): row 2
# has one valid token, row 3 none; masked entries hold garbage.
# Ratios exp(logp - old): row 0 exp(0.1) (inside [0.8, 1.28]) and exp(0.5) > 1.28 with A > 0
# (clipped: -1.28 A); row 1 exp(-0.5) < 0.8 with A < 0 (clipped: -0.8 A) and 1.
# ref - logp = d: -0.2 on row 0, 0 on row 1, 0.3 on row 2.
_NAN, _INF = float("nan"), float("inf")
HAND = dict(
    logp=[[-1.0, -1.0], [-1.0, -1.0], [-1.0, -_INF], [-_INF, -_INF]],
    old=[[-1.1, -1.5], [-0.5, -1.0], [-1.0, _NAN], [_NAN, _NAN]],
    ref=[[-1.2, -1.2], [-1.0, -1.0], [-0.7, _NAN], [_NAN, _NAN]],
    mask=[[1, 1], [1, 1], [1, 0], [0, 0]],
    rewards=[1.0, 0.0, 0.5, 0.5],
)
HAND_A = {"grpo": 0.5 / (math.sqrt(0.5) + 1e-6), "drgrpo": 0.5, "rloo": 1.0}


def _hand_expectations(a, *, beta, kl_estimator, aggregation, max_len):
  """Loss, d loss / d logp [4, 2] and the metrics of HAND, token by token from
  docs/design.md#grpo."""
  d = [-0.2, -0.2, 0.0, 0.0, 0.3]  # the five valid tokens, row-major
  pg = [-math.exp(0.1) * a, -1.28 * a, -0.8 * -a, -1.0 * -a, 0.0]
  # d pg / d logp = -A rho where unclipped, 0 where clipped; d k3 / d logp = 1 - exp(d), k1: 1
  dpg = [-a * math.exp(0.1), 0.0, 0.0, a, 0.0]
  if kl_estimator == "k3":
    kl = [math.exp(x) - x - 1 for x in d]
    dkl = [1 - math.exp(x) for x in d]
  else:
    kl, dkl = [-x for x in d], [1.0] * 5
  rows = [0, 0, 1, 1, 2]
  if aggregation == "token_mean":
    w = [1 / 5] * 5
  elif aggregation == "seq_mean_token_mean":  # 3 non-empty rows of 2, 2 and 1 tokens
    w = [1 / (2 * 3)] * 4 + [1 / 3]
  else:
    w = [1 / (max_len * 3)] * 5
  agg = lambda xs: sum(wi * x for wi, x in zip(w, xs))  # noqa: E731
  grad = np.zeros((4, 2))
  for i, (wi, g, gk) in enumerate(zip(w, dpg, dkl)):
    grad[rows[i], [0, 1, 0, 1, 0][i]] = wi * (g + beta * gk)
  ratios = [math.exp(0.1), math.exp(0.5), math.exp(-0.5), 1.0, 1.0]
  aux = {"pg_loss": agg(pg), "kl_loss": agg(kl), "kl_mean": sum(kl) / 5,
         "clip_frac_low": 1 / 5, "clip_frac_high": 1 / 5, "clip_frac": 2 / 5,
         "ratio_mean": sum(ratios) / 5, "ratio_max": math.exp(0.5), "ratio_min": math.exp(-0.5),
         "num_valid_tokens": 5.0, "num_sequences": 3.0,
         "advantage_mean": 0.0, "advantage_std": a / math.sqrt(2)}  # over (a, -a, 0, 0)
  return agg(pg) + beta * agg(kl), grad, aux


@pytest.mark.parametrize("mode", sorted(HAND_A))
def test_reference_matches_a_hand_computed_case(mode):
  h = {k: jnp.asarray(v, jnp.float32) for k, v in HAND.items()}
  mask = h["mask"] > 0
  for aggregation, kl_estimator, beta in (("token_mean", "k3", 0.5),
                                           ("seq_mean_token_mean", "k1", 0.1),
                                           ("seq_mean_token_sum_norm", "k3", 0.0)):
    kw = dict(group_size=2, advantage_mode=mode, eps_low=0.2, eps_high=0.28, beta=beta,
              kl_estimator=kl_estimator, aggregation=aggregation, max_len=4)
    f = lambda lp: ga.grpo_loss_fused_reference(  # noqa: E731
        lp, h["old"], h["ref"], h["rewards"], mask, **kw)
    (loss, aux), grad = jax.value_and_grad(f, has_aux=True)(h["logp"])
    want_loss, want_grad, want_aux = _hand_expectations(
        HAND_A[mode], beta=beta, kl_estimator=kl_estimator, aggregation=aggregation, max_len=4)
    where = f"{mode} {aggregation} {kl_estimator}"
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, err_msg=where)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7, err_msg=where)
    assert aux.keys() == want_aux.keys()
    for k, v in want_aux.items():
      np.testing.assert_allclose(aux[k], v, rtol=1e-5, atol=1e-7, err_msg=f"{where} {k}")


# --------------------------------------------------------------------------- kernel vs both


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
    # rewards_B taken as the advantages (grpo.grpo_loss's contract)
    dict(advantage_mode="precomputed", aggregation="token_mean", kl_estimator="k3", beta=0.05),
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
