"""`logits_to_keep` (LM head and loss on the completion columns only) changes nothing but speed.

With the last C target columns kept, every GRPO and OPD loss, its gradient and metrics equal the
full-width computation (itself checked against numpy in test_grpo_loss / test_opd_loss), whole
steps with micro-batches give the same parameters, a too-small C is caught (non-finite step,
`tokens_outside_logits` > 0) and an impossible one is a ValueError. The fused log-prob+entropy
pass is checked against numpy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from smjax.models.transformer import ModelConfig, Transformer, init_params
from smjax.rl.logprobs import token_logprobs, token_logprobs_and_entropy
from smjax.train import steps as st
from smjax.train.state import create_state

cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=48, qk_norm=True)
model = Transformer(cfg)
params = init_params(cfg, jax.random.key(0))
rng = np.random.RandomState(0)
B, P, C = 8, 6, 10
S = P + C
T = S - 1
V = 64
tok = rng.randint(3, 64, (B, S)).astype(np.int32)
attn = np.ones((B, S), bool)
attn[:4, :2] = False
tok[~attn] = 0
pos = np.maximum(np.cumsum(attn, 1) - 1, 0).astype(np.int32)
lm = np.zeros((B, T), bool)
lens = rng.randint(3, C + 1, B)
for i in range(B):
  lm[i, P - 1:P - 1 + lens[i]] = True
batch = st.SequenceBatch(
    tokens_BS=jnp.asarray(tok), positions_BS=jnp.asarray(pos), attn_mask_BS=jnp.asarray(attn),
    loss_mask_BT=jnp.asarray(lm), old_logp_BT=jnp.asarray(-rng.rand(B, T).astype(np.float32) * 4),
    ref_logp_BT=jnp.asarray(-rng.rand(B, T).astype(np.float32) * 4),
    rewards_B=jnp.asarray(rng.rand(B).astype(np.float32)),
    teacher_logp_BT=jnp.asarray(-rng.rand(B, T).astype(np.float32) * 4),
    teacher_logits_BTV=jnp.asarray(rng.randn(B, T, V).astype(np.float32)))
counts = st._counts(batch)


def _same(f_all, f_keep):
  (l0, a0), g0 = jax.jit(jax.value_and_grad(f_all, has_aux=True))(params)
  (l1, a1), g1 = jax.jit(jax.value_and_grad(f_keep, has_aux=True))(params)
  np.testing.assert_allclose(float(l1), float(l0), atol=1e-6)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)
  for k in a0:
    if k in a1:
      np.testing.assert_allclose(float(a1[k]), float(a0[k]), atol=1e-5, err_msg=k)


@pytest.mark.parametrize("agg,beta", [("token_mean", 0.0), ("seq_mean_token_sum_norm", 0.04)])
def test_grpo_loss_same_with_logits_to_keep(agg, beta):
  c0 = st.GRPOConfig(group_size=4, beta=beta, aggregation=agg, impl="xla")
  c1 = st.GRPOConfig(group_size=4, beta=beta, aggregation=agg, impl="xla", logits_to_keep=C)
  _same(lambda p: st._grpo_loss(c0, model, p, batch, counts),
        lambda p: st._grpo_loss(c1, model, p, batch, counts))


@pytest.mark.parametrize("obj", ["sampled", "full_vocab", "top_k"])
def test_opd_loss_same_with_logits_to_keep(obj):
  c0 = st.OPDConfig(objective=obj, impl="xla", aggregation="seq_mean_token_sum_norm")
  c1 = st.OPDConfig(objective=obj, impl="xla", logits_to_keep=C,
                    aggregation="seq_mean_token_sum_norm")
  _same(lambda p: st._opd_loss(c0, model, p, batch, counts),
        lambda p: st._opd_loss(c1, model, p, batch, counts))


def test_step_with_micro_batches_same_and_too_small_keep_is_caught():
  tx = optax.adamw(1e-3)
  new = []
  for keep in (None, C):
    sd = st.make_grpo_step(model, tx, st.GRPOConfig(group_size=4, micro_batches=2, impl="xla",
                                                    logits_to_keep=keep))
    new.append(jax.jit(sd.step)(create_state(params, tx), batch)[0])
  for a, b in zip(jax.tree.leaves(new[0].params), jax.tree.leaves(new[1].params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)
  sd = st.make_grpo_step(model, tx, st.GRPOConfig(group_size=4, impl="xla", logits_to_keep=C - 1))
  s0 = create_state(params, tx)
  s1, m = jax.jit(sd.step)(s0, batch)
  assert float(m["finite"]) == 0 and float(m["tokens_outside_logits"]) > 0
  # A non-finite step is skipped: parameters, Adam moments and the step counter are unchanged.
  assert int(s1.step) == 0
  for a, b in zip(jax.tree.leaves((s0.params, s0.opt_state)),
                  jax.tree.leaves((s1.params, s1.opt_state))):
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
  with pytest.raises(ValueError, match="logits_to_keep"):
    st.make_grpo_step(model, tx, st.GRPOConfig(group_size=4, logits_to_keep=T + 1)).step(
        create_state(params, tx), batch)


def test_fused_logprob_entropy_matches_numpy():
  x = rng.randn(3, 5, 7).astype(np.float32) * 3
  x[0, 0, 2] = -np.inf
  y = rng.randint(0, 7, (3, 5))
  y[0, 0] = 1
  lp, ent = token_logprobs_and_entropy(jnp.asarray(x), jnp.asarray(y))
  xd = x.astype(np.float64)
  m = xd.max(-1, keepdims=True)
  ls = xd - m - np.log(np.exp(xd - m).sum(-1, keepdims=True))
  p = np.exp(ls)
  np.testing.assert_allclose(np.asarray(ent), -np.where(p > 0, p * ls, 0).sum(-1), atol=1e-5)
  np.testing.assert_allclose(np.asarray(lp), np.take_along_axis(ls, y[..., None], -1)[..., 0],
                             atol=1e-5)
  w = rng.randn(3, 5).astype(np.float32)
  g1 = jax.grad(lambda x: jnp.sum(w * token_logprobs_and_entropy(x, jnp.asarray(y))[0]))(
      jnp.asarray(x))
  g2 = jax.grad(lambda x: jnp.sum(w * token_logprobs(x, jnp.asarray(y))))(jnp.asarray(x))
  g3 = jax.grad(lambda x: jnp.sum(token_logprobs_and_entropy(x, jnp.asarray(y))[1]))(
      jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(g1), np.asarray(g2))
  assert float(jnp.max(jnp.abs(g3))) == 0   # the entropy is a metric: no gradient
