"""smjax/rl/opd.py and smjax/rl/logprobs.py against float64 numpy references written here:
each OPD objective's loss, gradient and metrics, the aggregations and micro-batch normalisers,
token log-probs, and the errors for bad input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smjax.kernels import dispatch
from smjax.rl import opd
from smjax.rl.logprobs import token_logprobs

B, T, V = 3, 5, 40
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], np.float32)


# --------------------------------------------------------------------------- numpy reference


def np_log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def np_softmax_jac(p):
  """[..., V, V] Jacobian dp_v/dx_u of p = softmax(x)."""
  return np.einsum("...v,vu->...vu", p, np.eye(p.shape[-1])) - p[..., :, None] * p[..., None, :]


def np_kl_and_grad(s, t):
  """Per-token KL(softmax s || softmax t) and dKL/ds via the softmax Jacobian."""
  a, b = np_log_softmax(s), np_log_softmax(t)
  p = np.exp(a)
  kl = (p * (a - b)).sum(-1)
  grad = np.einsum("...v,...vu->...u", a - b + 1.0, np_softmax_jac(p))
  return kl, grad


def np_aggregate(loss, mask, mode, num_tokens=None, num_seqs=None, max_len=None):
  rows = [np.asarray(loss[b], np.float64)[mask[b] > 0] for b in range(loss.shape[0])]
  full = [r for r in rows if r.size]
  if mode == "token_mean":
    return sum(r.sum() for r in full) / max(num_tokens or sum(r.size for r in full), 1)
  seqs = max(num_seqs or len(full), 1)
  if mode == "seq_mean_token_mean":
    return sum(r.mean() for r in full) / seqs
  return sum(r.sum() for r in full) / ((max_len or loss.shape[1]) * seqs)


def np_weights(mask):
  """d token_mean / d loss_t."""
  return mask / mask.sum()


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  s = 2.0 * rng.normal(size=(B, T, V))
  t = s + 1.5 * rng.normal(size=(B, T, V))
  tokens = rng.integers(0, V, size=(B, T))
  # behaviour log-probs off by 0 or +-0.6 so that many ratios leave [1 - 0.2, 1 + 0.3]
  old = np.take_along_axis(np_log_softmax(s), tokens[..., None], -1)[..., 0]
  old = old + rng.choice([-0.6, 0.0, 0.6], size=(B, T))
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  return dict(s=f32(s), t=f32(t), tokens=jnp.asarray(tokens, jnp.int32), old=f32(old),
              mask=jnp.asarray(MASK))


def _loss_and_grad(objective, wrt, **kw):
  """jit(value_and_grad) of opd_loss w.r.t. the keyword argument `wrt`."""
  def f(x, rest):
    return opd.opd_loss(objective, **{wrt: x}, **rest, **static)

  static = {k: v for k, v in kw.items() if not isinstance(v, jax.Array)}
  arrays = {k: v for k, v in kw.items() if isinstance(v, jax.Array) and k != wrt}
  return jax.jit(jax.value_and_grad(f, has_aux=True))(kw[wrt], arrays)


# --------------------------------------------------------------------------- token log-probs


def test_token_logprobs_value_and_gradient(data):
  s, tok = data["s"], data["tokens"]
  ls = np_log_softmax(s)
  expect = np.take_along_axis(ls, np.asarray(tok)[..., None], -1)[..., 0]
  np.testing.assert_allclose(token_logprobs(s, tok), expect, rtol=1e-5, atol=1e-5)
  w = jnp.asarray(np.arange(B * T, dtype=np.float32).reshape(B, T))
  grad = jax.jit(jax.grad(lambda x: jnp.sum(w * token_logprobs(x, tok))))(s)
  onehot = np.eye(V)[np.asarray(tok)]
  np.testing.assert_allclose(grad, np.asarray(w)[..., None] * (onehot - np.exp(ls)),
                             rtol=1e-4, atol=1e-5)


def test_token_logprobs_bf16_out_of_range_and_memory(data):
  tokens = jnp.array([[1, V, V + 3]] * B)  # the last two are out of range
  out = token_logprobs(data["s"][:, :3].astype(jnp.bfloat16), tokens)
  assert out.dtype == jnp.float32
  assert np.isfinite(out[:, 0]).all() and np.isnan(out[:, 1:]).all()
  n_tok, vocab = 64, 4096
  spec = jax.ShapeDtypeStruct((n_tok, vocab), jnp.float32)
  toks = jax.ShapeDtypeStruct((n_tok,), jnp.int32)
  mem = jax.jit(jax.grad(lambda x, y: jnp.sum(token_logprobs(x, y)))).lower(
      spec, toks).compile().memory_analysis()
  assert mem.temp_size_in_bytes < 0.5 * n_tok * vocab * 4  # no [N, V] temporary


# --------------------------------------------------------------------------- objectives


@pytest.mark.parametrize("from_logits", [False, True])
def test_sampled_matches_numpy_clipped_objective(data, from_logits):
  s, t, tok, old, mask = data["s"], data["t"], data["tokens"], data["old"], data["mask"]
  lp_np = np.take_along_axis(np_log_softmax(s), np.asarray(tok)[..., None], -1)[..., 0]
  lt_np = np.take_along_axis(np_log_softmax(t), np.asarray(tok)[..., None], -1)[..., 0]
  adv = lt_np - lp_np
  rho = np.exp(lp_np - np.asarray(old, np.float64))
  unclipped, clipped = rho * adv, np.clip(rho, 0.8, 1.3) * adv
  loss_t = -np.minimum(unclipped, clipped)
  dloss_dlp = np.where(unclipped <= clipped, -adv * rho, 0.0) * np_weights(MASK)
  kw = dict(old_logp_BT=old, mask_BT=mask, eps_low=0.2, eps_high=0.3)
  if from_logits:  # log-probs computed inside from the logits and tokens
    (loss, aux), g = _loss_and_grad("sampled", "student_logits_BTV", student_logits_BTV=s,
                                    teacher_logits_BTV=t, tokens_BT=tok, **kw)
    onehot = np.eye(V)[np.asarray(tok)]
    expect_g = dloss_dlp[..., None] * (onehot - np.exp(np_log_softmax(s)))
  else:
    (loss, aux), g = _loss_and_grad("sampled", "student_logp_BT",
                                    student_logp_BT=jnp.asarray(lp_np, jnp.float32),
                                    teacher_logp_BT=jnp.asarray(lt_np, jnp.float32), **kw)
    expect_g = dloss_dlp
  assert 0 < float(aux["clip_frac"]) < 1  # both branches exercised
  np.testing.assert_allclose(loss, np_aggregate(loss_t, MASK, "token_mean"), rtol=1e-5)
  np.testing.assert_allclose(g, expect_g, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(aux["reverse_kl"], np_aggregate(lp_np - lt_np, MASK, "token_mean"),
                             rtol=1e-5)
  np.testing.assert_allclose(aux["student_logp"], np_aggregate(lp_np, MASK, "token_mean"),
                             rtol=1e-5)
  np.testing.assert_allclose(aux["teacher_logp"], np_aggregate(lt_np, MASK, "token_mean"),
                             rtol=1e-5)


def test_sampled_on_policy_hand_computed():
  # rho = 1 (old = current): loss_t = -A_t = logp_s - logp_T; token mean over the 2 valid tokens
  lp = jnp.array([[-1.0, -2.0, -9.0]])
  lt = jnp.array([[-0.5, -3.0, jnp.nan]])  # NaN on the masked token must not leak
  mask = jnp.array([[1, 1, 0]])
  (loss, aux), g = _loss_and_grad("sampled", "student_logp_BT", student_logp_BT=lp,
                                  teacher_logp_BT=lt, mask_BT=mask)
  assert float(loss) == pytest.approx(((-1.0 + 0.5) + (-2.0 + 3.0)) / 2)
  np.testing.assert_allclose(g, [[-0.5 / 2, 1.0 / 2, 0.0]], rtol=1e-6)  # -A_t / 2
  assert float(aux["ratio_mean"]) == 1.0 and float(aux["clip_frac"]) == 0.0


@pytest.mark.parametrize("impl", ["jnp", "xla", "pallas"])
def test_full_vocab_matches_numpy_and_reference_autodiff(data, impl):
  s, t, tok, mask = data["s"], data["t"], data["tokens"], data["mask"]
  kl_np, dkl_np = np_kl_and_grad(s, t)
  # "jnp": opd's own full_vocab_kl; else the kernel dispatch the train step passes in.
  reverse_kl = None if impl == "jnp" else functools.partial(dispatch.reverse_kl, impl=impl,
                                                            chunk_tokens=4)
  (loss, aux), g = _loss_and_grad("full_vocab", "student_logits_BTV", student_logits_BTV=s,
                                  teacher_logits_BTV=t, tokens_BT=tok, mask_BT=mask,
                                  reverse_kl=reverse_kl)
  np.testing.assert_allclose(loss, np_aggregate(kl_np, MASK, "token_mean"), rtol=1e-5)
  np.testing.assert_allclose(aux["reverse_kl"], np_aggregate(kl_np, MASK, "token_mean"),
                             rtol=1e-5)
  np.testing.assert_allclose(g, np_weights(MASK)[..., None] * dkl_np, rtol=1e-4, atol=1e-7)

  def ref_loss(x):  # jnp reference written here: log_softmax of both, everything materialised
    ls, lt = jax.nn.log_softmax(x, -1), jax.nn.log_softmax(t, -1)
    kl = jnp.sum(jnp.exp(ls) * (ls - lt), -1)
    return jnp.sum(kl * mask) / jnp.sum(mask)

  np.testing.assert_allclose(g, jax.jit(jax.grad(ref_loss))(s), rtol=1e-4, atol=1e-7)


def test_top_k_matches_numpy(data):
  s, t, mask, k = data["s"], data["t"], data["mask"], 6
  s_np, t_np = np.asarray(s, np.float64), np.asarray(t, np.float64)
  idx = np.argsort(-s_np, axis=-1)[..., :k]
  sk, tk = np.take_along_axis(s_np, idx, -1), np.take_along_axis(t_np, idx, -1)
  kl_np, dkl_k = np_kl_and_grad(sk, tk)  # both renormalised over the student's top k
  dkl = np.zeros_like(s_np)
  np.put_along_axis(dkl, idx, dkl_k, -1)  # no gradient outside the top k
  full_np, _ = np_kl_and_grad(s_np, t_np)
  mass = np.take_along_axis(np.exp(np_log_softmax(s_np)), idx, -1).sum(-1)
  (loss, aux), g = _loss_and_grad("top_k", "student_logits_BTV", student_logits_BTV=s,
                                  teacher_logits_BTV=t, mask_BT=mask, top_k=k)
  np.testing.assert_allclose(loss, np_aggregate(kl_np, MASK, "token_mean"), rtol=1e-5)
  np.testing.assert_allclose(g, np_weights(MASK)[..., None] * dkl, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(aux["reverse_kl_full"], np_aggregate(full_np, MASK, "token_mean"),
                             rtol=1e-5)
  np.testing.assert_allclose(aux["top_k_mass"], np_aggregate(mass, MASK, "token_mean"),
                             rtol=1e-5)
  assert np.isnan(aux["student_logp"])  # no tokens given: not computable


# --------------------------------------------------------------------------- aggregation


@pytest.mark.parametrize("mode", opd.AGGREGATIONS)
def test_aggregations_and_micro_batch_normalisers(mode):
  rng = np.random.default_rng(0)
  loss = rng.normal(size=(4, 6)).astype(np.float32)
  mask = (rng.uniform(size=(4, 6)) > 0.4).astype(np.float32)
  mask[2] = 0  # an empty row is not counted
  loss[mask == 0] = np.nan  # masked entries may hold garbage
  got = opd.aggregate(jnp.asarray(loss), jnp.asarray(mask), aggregation=mode, max_len=8)
  np.testing.assert_allclose(got, np_aggregate(loss, mask, mode, max_len=8), rtol=1e-6)
  # micro-batches with the whole batch's normalisers add up to the full-batch loss
  kw = dict(aggregation=mode, max_len=8, num_valid_tokens=jnp.sum(mask > 0),
            num_sequences=jnp.sum(mask.sum(1) > 0))
  parts = [opd.aggregate(jnp.asarray(loss[i:i + 2]), jnp.asarray(mask[i:i + 2]), **kw)
           for i in (0, 2)]
  np.testing.assert_allclose(sum(parts), got, rtol=1e-6)


def test_empty_mask_gives_zero_loss(data):
  loss, aux = opd.opd_loss("full_vocab", student_logits_BTV=data["s"],
                           teacher_logits_BTV=data["t"], mask_BT=jnp.zeros((B, T)))
  assert float(loss) == 0.0 and float(aux["num_valid_tokens"]) == 0.0


def test_opd_loss_seq_mean_token_mean_matches_numpy(data):
  s, t = data["s"], data["t"]
  kl_np, _ = np_kl_and_grad(s, t)
  loss, aux = opd.opd_loss("full_vocab", student_logits_BTV=s, teacher_logits_BTV=t,
                           mask_BT=data["mask"], aggregation="seq_mean_token_mean")
  np.testing.assert_allclose(loss, np_aggregate(kl_np, MASK, "seq_mean_token_mean"), rtol=1e-5)
  assert float(aux["num_sequences"]) == 3.0 and float(aux["num_valid_tokens"]) == MASK.sum()


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("objective,kw,match", [
    ("full_vocab", dict(teacher_logits_BTV=jnp.zeros((B, T, V + 1))), "vocab"),
    ("reverse", {}, "objective"),
    ("full_vocab", dict(teacher_logits_BTV=None), "needs student_logits_BTV and teacher"),
    ("sampled", dict(tokens_BT=None), "needs student_logp_BT"),
    ("sampled", dict(old_logp_BT=jnp.zeros((B, T + 1))), "old_logp_BT shape"),
    ("sampled", dict(eps_low=1.0), "eps_low"),
    ("top_k", dict(top_k=V + 1), "top_k"),
    ("top_k", dict(top_k=0), "top_k"),
    ("full_vocab", dict(mask_BT=jnp.ones((B, T + 1)), tokens_BT=None), "student_logits_BTV shape"),
    ("full_vocab", dict(mask_BT=jnp.ones((B * T,))), "2-D"),
    ("full_vocab", dict(aggregation="sum"), "aggregation"),
    ("full_vocab", dict(reverse_kl="xla"), "reverse_kl='xla' must be None or a callable"),
    ("top_k", dict(reverse_kl=lambda s, t: jnp.zeros(s.shape[:1])), "reverse_kl returned shape"),
])
def test_bad_input_raises_clear_errors(data, objective, kw, match):
  args = dict(student_logits_BTV=data["s"], teacher_logits_BTV=data["t"],
              tokens_BT=data["tokens"], mask_BT=data["mask"])
  args.update(kw)
  with pytest.raises(ValueError, match=match):
    opd.opd_loss(objective, **args)


def test_token_logprobs_shape_errors():
  with pytest.raises(ValueError, match="vocab axis"):
    token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32))
  with pytest.raises(ValueError, match="integer"):
    token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2, 3)))



def test_full_vocab_kl_with_banned_student_tokens_is_finite():
  """Logits of -inf (tokens the student bans) add 0 to the reverse KL and to its gradient: the
  value and the gradient match float64 numpy over the allowed tokens (0 * -inf gave nan)."""
  rng = np.random.default_rng(3)
  s = rng.normal(size=(2, 3, 7)).astype(np.float32)
  t = rng.normal(size=(2, 3, 7)).astype(np.float32)
  s[..., 2] = -np.inf
  s[0, 1, 5] = -np.inf
  kl, grad = jax.value_and_grad(lambda x: opd.full_vocab_kl(x, jnp.asarray(t)).sum())(
      jnp.asarray(s))
  s64, t64 = s.astype(np.float64), t.astype(np.float64)
  lp = s64 - np.logaddexp.reduce(s64, axis=-1, keepdims=True)
  lq = t64 - np.logaddexp.reduce(t64, axis=-1, keepdims=True)
  p = np.exp(lp)
  with np.errstate(invalid="ignore"):  # 0 * -inf on the banned tokens, masked out
    want = np.where(p > 0, p * (lp - lq), 0).sum(-1)
    # d/ds_j sum_i p_i (lp_i - lq_i) = p_j ((lp_j - lq_j) - KL)
    g = np.where(p > 0, p * ((lp - lq) - want[..., None]), 0)
  np.testing.assert_allclose(float(kl), want.sum(), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), g, atol=1e-6)
