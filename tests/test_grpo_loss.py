"""Tests for smjax/rl/grpo.py: hand-computed values, an independent numpy loss, finite differences.

Legend (docs/design.md#shape-legend): B rows, G group size, T target positions, V vocab.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smjax.rl import grpo

LN2 = math.log(2.0)


# ----------------------------------------------------------------------------- advantages


def test_group_advantages_hand_values():
  # Three groups of G=3: [1,0,0] (mean 1/3, unbiased var 1/3), [2,2,2] (constant), [0,1,2].
  rewards_B = jnp.array([1.0, 0.0, 0.0, 2.0, 2.0, 2.0, 0.0, 1.0, 2.0])
  s = math.sqrt(1.0 / 3.0)
  expect = {
      "grpo": [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0, 0, 0, -1, 0, 1],
      "drgrpo": [2 / 3, -1 / 3, -1 / 3, 0, 0, 0, -1, 0, 1],
      # RLOO: own reward minus the mean of the other two.
      "rloo": [1.0, -0.5, -0.5, 0, 0, 0, -1.5, 0, 1.5],
  }
  for mode, want in expect.items():
    got = grpo.group_advantages(rewards_B, group_size=3, mode=mode, eps=0.0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=mode)
  # eps enters the grpo denominator: the [0,1,2] group has std 1.
  got = grpo.group_advantages(rewards_B, group_size=3, mode="grpo", eps=0.5)
  np.testing.assert_allclose(got[6:], [-1 / 1.5, 0, 1 / 1.5], rtol=1e-6)
  # G=2: [0, 1] has unbiased std sqrt(0.5).
  got = grpo.group_advantages(jnp.array([0.0, 1.0]), group_size=2, mode="grpo", eps=0.0)
  np.testing.assert_allclose(got, [-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)], rtol=1e-6)


@pytest.mark.parametrize("mode", grpo.ADVANTAGE_MODES)
def test_constant_groups_give_exact_zero(mode):
  # 0.1 * 3 / 3 != 0.1 in float: the mean rounds, yet the advantage must be exactly 0, not NaN.
  rewards_B = jnp.array([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.0, 0.0, 0.0])
  for eps in (0.0, 1e-6):
    got = np.asarray(grpo.group_advantages(rewards_B, group_size=3, mode=mode, eps=eps))
    assert np.all(got == 0.0), (mode, eps, got)


def test_reward_metrics_hand_values():
  m = grpo.reward_metrics(jnp.array([1.0, 0.0, 0.0, 2.0, 2.0, 2.0]), group_size=3)
  mean = 7 / 6
  var = ((1 - mean) ** 2 + 2 * mean ** 2 + 3 * (2 - mean) ** 2) / 6
  np.testing.assert_allclose(m["reward_mean"], mean, rtol=1e-6)
  np.testing.assert_allclose(m["reward_std"], math.sqrt(var), rtol=1e-6)
  assert float(m["reward_min"]) == 0.0 and float(m["reward_max"]) == 2.0
  assert float(m["frac_groups_zero_std"]) == 0.5


def test_advantage_bad_inputs():
  r6 = jnp.zeros(6)
  with pytest.raises(ValueError, match="multiple of group_size=4"):
    grpo.group_advantages(r6, group_size=4)
  with pytest.raises(ValueError, match="mode='ppo'"):
    grpo.group_advantages(r6, group_size=3, mode="ppo")
  with pytest.raises(ValueError, match="rewards_B must be 1-D"):
    grpo.group_advantages(jnp.zeros((2, 3)), group_size=3)
  with pytest.raises(ValueError, match="group_size=1 must be >= 2"):
    grpo.group_advantages(r6, group_size=1, mode="rloo")
  with pytest.raises(ValueError, match="multiple of group_size=4"):
    grpo.reward_metrics(r6, group_size=4)


# ----------------------------------------------------------------------------- loss, by hand


def _hand_batch():
  """B=2, T=3, eps 0.2; row 0's last token is masked and holds garbage (-inf / NaN).

  Row 0 (A=+1): rho 1.5 -> clipped to 1.2 (clip_high), pg -1.2; rho 0.5 -> pg -0.5.
  Row 1 (A=-1): rho 1.5 -> pg 1.5; rho 0.5 -> clip 0.8 (clip_low), pg 0.8; rho 1 -> pg 1.
  ref - logp: row 0 [0, ln2], row 1 [0, 0, -ln2]; k3(ln2) = 1 - ln2, k3(-ln2) = ln2 - 1/2.
  """
  logp = np.array([[-1.0, -2.0, -np.inf], [-1.0, -2.0, -0.5]], np.float32)
  old = logp - np.log(np.array([[1.5, 0.5, 1.0], [1.5, 0.5, 1.0]], np.float32))
  old[0, 2] = np.nan
  ref = logp + np.array([[0.0, LN2, 0.0], [0.0, 0.0, -LN2]], np.float32)
  ref[0, 2] = np.nan
  mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
  return [jnp.asarray(x) for x in (logp, old, ref, np.array([1.0, -1.0], np.float32), mask)]


KW = dict(eps_low=0.2, eps_high=0.2)


def test_grpo_loss_hand_values():
  batch = _hand_batch()
  kl_row0, kl_row1 = 0.1 * (1 - LN2), 0.1 * (LN2 - 0.5)  # beta * k3
  want = {
      "token_mean": (-1.2 - 0.5 + 1.5 + 0.8 + 1.0 + 0.1 * 0.5) / 5,
      "seq_mean_token_mean": ((-1.7 + kl_row0) / 2 + (3.3 + kl_row1) / 3) / 2,
      "seq_mean_token_sum_norm": ((-1.7 + kl_row0) / 4 + (3.3 + kl_row1) / 4) / 2,
  }
  for aggregation, value in want.items():
    loss, aux = grpo.grpo_loss(*batch, beta=0.1, kl_estimator="k3", aggregation=aggregation,
                               max_len=4, **KW)
    np.testing.assert_allclose(loss, value, rtol=1e-6, err_msg=aggregation)
  # Metrics (token_mean): one high-clip and one low-clip token out of 5 valid.
  loss, aux = grpo.grpo_loss(*batch, beta=0.1, kl_estimator="k3", aggregation="token_mean", **KW)
  expect_aux = dict(clip_frac_low=0.2, clip_frac_high=0.2, clip_frac=0.4, ratio_mean=1.0,
                    ratio_max=1.5, ratio_min=0.5, kl_mean=0.1, kl_loss=0.1, pg_loss=1.6 / 5,
                    num_valid_tokens=5, num_sequences=2, advantage_mean=0.0,
                    advantage_std=1.0)
  for k, v in expect_aux.items():
    np.testing.assert_allclose(aux[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
  # k1 = logp - ref sums to 0 over the valid tokens here: loss is the pg part alone.
  loss, aux = grpo.grpo_loss(*batch, beta=0.1, kl_estimator="k1", aggregation="token_mean", **KW)
  np.testing.assert_allclose(loss, 1.6 / 5, rtol=1e-6)
  np.testing.assert_allclose(aux["kl_mean"], 0.0, atol=1e-7)


def test_beta_zero_needs_no_reference():
  logp, old, ref, adv, mask = _hand_batch()
  kw = dict(beta=0.0, kl_estimator="k3", aggregation="token_mean", **KW)
  loss_none, aux_none = grpo.grpo_loss(logp, old, None, adv, mask, **kw)
  loss_ref, aux_ref = grpo.grpo_loss(logp, old, ref, adv, mask, **kw)
  np.testing.assert_allclose(loss_none, 1.6 / 5, rtol=1e-6)
  np.testing.assert_allclose(loss_ref, 1.6 / 5, rtol=1e-6)
  assert float(aux_none["kl_mean"]) == 0.0
  np.testing.assert_allclose(aux_ref["kl_mean"], 0.1, rtol=1e-6)  # still logged when given
  with pytest.raises(ValueError, match="ref_logp_BT is None but beta=0.1"):
    grpo.grpo_loss(logp, old, None, adv, mask, **{**kw, "beta": 0.1})


# ----------------------------------------------------------------------------- vs numpy


def _np_loss(logp, old, ref, adv, mask, *, eps_low, eps_high, beta, kl_estimator, aggregation,
             max_len):
  """Independent numpy GRPO loss, written row by row."""
  per_row = []
  for b in range(logp.shape[0]):
    idx = np.flatnonzero(mask[b])
    if idx.size == 0:
      continue
    a = adv[b]
    ratio = np.exp(logp[b, idx] - old[b, idx])
    pg = -np.minimum(ratio * a, np.clip(ratio, 1 - eps_low, 1 + eps_high) * a)
    if kl_estimator == "k3":
      kl = np.exp(ref[b, idx] - logp[b, idx]) - (ref[b, idx] - logp[b, idx]) - 1
    else:
      kl = logp[b, idx] - ref[b, idx]
    per_row.append(pg + beta * kl)
  if not per_row:
    return 0.0
  if aggregation == "token_mean":
    return np.concatenate(per_row).sum() / sum(len(r) for r in per_row)
  if aggregation == "seq_mean_token_mean":
    return np.mean([r.mean() for r in per_row])
  return np.mean([r.sum() / max_len for r in per_row])


def _random_batch(rng, b, t, *, dtype=np.float32):
  logp = rng.normal(-1.5, 0.7, (b, t))
  old = logp + rng.normal(0.0, 0.3, (b, t))
  ref = logp + rng.normal(0.0, 0.3, (b, t))
  lengths = rng.integers(1, t + 1, b)
  lengths[1] = 0  # one fully masked row
  mask = np.arange(t)[None, :] < lengths[:, None]
  adv = rng.normal(0.0, 1.0, b)
  return [x.astype(dtype) for x in (logp, old, ref, adv)] + [mask]


@pytest.mark.parametrize("aggregation", grpo.AGGREGATIONS)
@pytest.mark.parametrize("kl_estimator", grpo.KL_ESTIMATORS)
def test_loss_matches_numpy(aggregation, kl_estimator):
  logp, old, ref, adv, mask = _random_batch(np.random.default_rng(1), 6, 7)
  kw = dict(eps_low=0.2, eps_high=0.28, beta=0.05, kl_estimator=kl_estimator,
            aggregation=aggregation, max_len=9)
  want = _np_loss(logp, old, ref, adv, mask, **kw)
  logp[~mask] = -np.inf  # padding garbage must not leak into the loss
  loss, aux = grpo.grpo_loss(*map(jnp.asarray, (logp, old, ref, adv, mask)), **kw)
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
  assert all(np.isfinite(np.asarray(v)) for v in aux.values())


def test_all_masked_batch_is_zero_not_nan():
  logp, old, ref, adv, mask = _random_batch(np.random.default_rng(2), 4, 3)
  mask[:] = False
  for aggregation in grpo.AGGREGATIONS:
    fn = lambda lp: grpo.grpo_loss(lp, old, ref, adv, mask, beta=0.1, kl_estimator="k3",
                                   aggregation=aggregation, **KW)
    (loss, aux), g = jax.jit(jax.value_and_grad(fn, has_aux=True))(jnp.asarray(logp))
    assert float(loss) == 0.0 and np.all(np.asarray(g) == 0.0)
    assert all(np.isfinite(np.asarray(v)) for v in aux.values())


def test_masked_garbage_gives_finite_zero_gradient():
  logp, old, ref, adv, mask = _hand_batch()
  for aggregation in grpo.AGGREGATIONS:
    fn = lambda lp: grpo.grpo_loss(lp, old, ref, adv, mask, beta=0.1, kl_estimator="k3",
                                   aggregation=aggregation, **KW)[0]
    g = np.asarray(jax.jit(jax.grad(fn))(logp))
    assert np.all(np.isfinite(g)) and g[0, 2] == 0.0, aggregation


@pytest.mark.parametrize("aggregation", grpo.AGGREGATIONS)
def test_micro_batches_with_global_normalisers_sum_to_full_batch(aggregation):
  logp, old, ref, adv, mask = map(jnp.asarray, _random_batch(np.random.default_rng(3), 8, 5))
  kw = dict(beta=0.1, kl_estimator="k3", aggregation=aggregation, **KW)
  full = lambda lp: grpo.grpo_loss(lp, old, ref, adv, mask, **kw)[0]
  n_tok, n_seq = jnp.sum(mask), jnp.sum(jnp.any(mask, axis=1))

  def accumulated(lp):
    total = 0.0
    for rows in (slice(0, 4), slice(4, 8)):  # micro-batches of whole groups
      total += grpo.grpo_loss(lp[rows], old[rows], ref[rows], adv[rows], mask[rows],
                              num_valid_tokens=n_tok, num_sequences=n_seq, **kw)[0]
    return total

  (acc_loss, acc_grad), (full_loss, full_grad) = jax.jit(
      lambda lp: (jax.value_and_grad(accumulated)(lp), jax.value_and_grad(full)(lp)))(logp)
  np.testing.assert_allclose(acc_loss, full_loss, rtol=1e-5)
  np.testing.assert_allclose(acc_grad, full_grad, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- gradients


def _fd_grad(f, x, h=1e-6):
  """Central differences of f (scalar or vector valued) w.r.t. each element of x."""
  cols = []
  for i in np.ndindex(x.shape):
    xp, xm = x.copy(), x.copy()
    xp[i] += h
    xm[i] -= h
    cols.append((np.asarray(f(xp)) - np.asarray(f(xm))) / (2 * h))
  return np.moveaxis(np.array(cols), 0, -1).reshape(np.shape(cols[0]) + x.shape)


def test_gradient_matches_finite_differences_float64():
  with jax.enable_x64(True):
    # Ratios exp(logp - old), clip range [0.8, 1.25], A = [0.8, -1.2]: row 0 has a high-clipped
    # token (1.3), an inside one (0.9) and an unclipped low one (0.7, A > 0); row 1 an inside one
    # (1.1) and a low-clipped one (0.6, A < 0); row 1's last token is masked. No edge ties.
    logp = np.array([[-1.0, -0.5, -2.0], [-1.5, -0.7, -3.0]])
    old = logp - np.log([[1.3, 0.9, 0.7], [1.1, 0.6, 1.0]])
    ref = logp + np.array([[0.3, -0.2, 0.1], [0.0, 0.4, -0.3]])
    adv = np.array([0.8, -1.2])
    mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
    configs = [dict(eps_low=0.2, eps_high=0.25, beta=0.3, kl_estimator=k, aggregation=a)
               for k in grpo.KL_ESTIMATORS for a in grpo.AGGREGATIONS]
    # All six configurations as one vector-valued function: two compiles instead of twelve.
    f = jax.jit(lambda lp: jnp.stack(
        [grpo.grpo_loss(lp, old, ref, adv, mask, **kw)[0] for kw in configs]))
    jac = np.asarray(jax.jit(jax.jacrev(f))(logp))  # [configs, B, T]
    assert jac.dtype == np.float64
    fd = _fd_grad(lambda lp: np.asarray(f(lp)), logp)
    np.testing.assert_allclose(jac, fd, rtol=1e-6, atol=1e-9)
    for kl_estimator in grpo.KL_ESTIMATORS:
      # The hand-written token gradient the kernel's backward uses, against the same FD.
      tok_kw = dict(eps_low=0.2, eps_high=0.25, beta=0.3, kl_estimator=kl_estimator)
      tok = lambda lp: np.sum(np.asarray(grpo.token_terms(
          lp, old, ref, adv[:, None], mask, **tok_kw).loss) * mask)
      g_tok = grpo.token_loss_grad(logp, old, ref, adv[:, None], mask, **tok_kw)
      np.testing.assert_allclose(g_tok, _fd_grad(tok, logp), rtol=1e-6, atol=1e-9,
                                 err_msg=kl_estimator)


# ----------------------------------------------------------------------------- entropy, errors


def test_token_entropy_and_masked_mean():
  logits_BTV = jnp.array([[[0.0, 0.0, 0.0, 0.0],
                           [0.0, -jnp.inf, -jnp.inf, -jnp.inf],
                           [math.log(0.5), math.log(0.25), math.log(0.25), -jnp.inf]]])
  ent_BT = grpo.token_entropy(logits_BTV)
  np.testing.assert_allclose(ent_BT, [[math.log(4.0), 0.0, 1.5 * LN2]], rtol=1e-6, atol=1e-7)
  mask_BT = jnp.array([[True, False, True]])
  np.testing.assert_allclose(grpo.masked_mean(ent_BT, mask_BT), (math.log(4) + 1.5 * LN2) / 2,
                             rtol=1e-6)
  assert float(grpo.masked_mean(ent_BT, jnp.zeros_like(mask_BT))) == 0.0


def test_loss_bad_inputs():
  logp, old, ref, adv, mask = _hand_batch()
  kw = dict(eps_low=0.2, eps_high=0.2, beta=0.1, kl_estimator="k3", aggregation="token_mean")
  cases = [
      (dict(old_logp_BT=old[:, :2]), "old_logp_BT shape"),
      (dict(mask_BT=mask[:1]), "mask_BT shape"),
      (dict(advantages_B=adv[:1]), "advantages_B shape"),
      (dict(logp_BT=logp[0]), "logp_BT must be 2-D"),
      (dict(aggregation="sum"), "aggregation='sum'"),
      (dict(kl_estimator="k9"), "kl_estimator='k9'"),
      (dict(eps_low=1.0), "eps_low=1.0 must be < 1"),
      (dict(eps_high=-0.1), "eps_high=-0.1"),
      (dict(max_len=0), "max_len=0"),
  ]
  args = dict(logp_BT=logp, old_logp_BT=old, ref_logp_BT=ref, advantages_B=adv, mask_BT=mask)
  for override, match in cases:
    call = {**args, **kw, **override}
    with pytest.raises(ValueError, match=match):
      grpo.grpo_loss(**call)
  with pytest.raises(ValueError, match="rewards_B batch 2 must be a multiple of group_size=3"):
    grpo.grpo_loss_from_rewards(logp, old, ref, adv, mask, group_size=3, advantage_mode="grpo",
                                **kw)


def test_loss_from_rewards_equals_advantages_then_loss():
  logp, old, ref, _, mask = map(jnp.asarray, _random_batch(np.random.default_rng(4), 6, 4))
  rewards_B = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
  kw = dict(beta=0.1, kl_estimator="k3", aggregation="seq_mean_token_mean", **KW)
  adv_B = grpo.group_advantages(rewards_B, group_size=2, mode="rloo")
  np.testing.assert_allclose(adv_B, [1.0, -1.0, -1.0, 1.0, 0.0, 0.0], atol=1e-7)  # r_i - r_other
  loss, _ = grpo.grpo_loss_from_rewards(logp, old, ref, rewards_B, mask, group_size=2,
                                        advantage_mode="rloo", **kw)
  want = _np_loss(*map(np.asarray, (logp, old, ref, adv_B, mask)), max_len=4, **kw)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
