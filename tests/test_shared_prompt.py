"""`shared_prompt_rows` (the prompt's forward once per block of rows) changes nothing but cost.

Reference: the unshared `logits_to_keep` computation (itself checked against numpy and the full
width in test_logits_to_keep, and the model against HF transformers in test_hf). With every block
of r rows holding one prompt, GRPO and OPD losses, gradients and metrics, the log-prob function
and whole micro-batched steps equal the unshared ones; the compiled step does fewer FLOPs, by about
the prompt tokens' share; a block whose rows differ is a skipped, reported step; impossible
settings are ValueErrors naming the field.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from smjax.flops import executable_flops
from smjax.models.transformer import ModelConfig, Transformer, init_params
from smjax.train import scoring
from smjax.train import steps as st
from smjax.train.state import create_state

CFGS = {
    "qwen3": ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         head_dim=8, d_ff=48, qk_norm=True),
    "qwen2": ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1,
                         head_dim=8, d_ff=48, qkv_bias=True, tie_embeddings=True),
}
PROMPTS, G, P, C = 3, 4, 7, 9
B, S = PROMPTS * G, P + C
T = S - 1


def grouped_batch(seed=0, prompts=PROMPTS, group=G):
  """Rows [p0 x G, p1 x G, ...]: each prompt left-padded to P (lengths differ between prompts),
  G completions of varying length (pad after the end) and the per-target inputs of every loss."""
  rng = np.random.RandomState(seed)
  rows = prompts * group
  tok = np.zeros((rows, S), np.int32)
  attn = np.zeros((rows, S), bool)
  lm = np.zeros((rows, T), bool)
  for p in range(prompts):
    n = rng.randint(2, P + 1)
    ids = rng.randint(3, 64, n)
    for g in range(group):
      i = p * group + g
      tok[i, P - n:P] = ids
      attn[i, P - n:P] = True
      c = rng.randint(2, C + 1)
      tok[i, P:P + c] = rng.randint(3, 64, c)
      attn[i, P:P + c] = True
      lm[i, P - 1:P - 1 + c] = True
  pos = np.maximum(np.cumsum(attn, 1) - 1, 0).astype(np.int32)
  f = lambda *shape: jnp.asarray(-rng.rand(*shape).astype(np.float32) * 4)
  return st.SequenceBatch(
      tokens_BS=jnp.asarray(tok), positions_BS=jnp.asarray(pos), attn_mask_BS=jnp.asarray(attn),
      loss_mask_BT=jnp.asarray(lm), old_logp_BT=f(rows, T), ref_logp_BT=f(rows, T),
      rewards_B=jnp.asarray(rng.randint(0, 2, rows).astype(np.float32)),
      teacher_logp_BT=f(rows, T),
      teacher_logits_BTV=jnp.asarray(rng.randn(rows, T, 64).astype(np.float32)))


batch = grouped_batch()
counts = st._counts(batch)


def assert_skipped(s0, s1, metrics, guard):
  """The step reported itself non-finite, counted `guard`, and left the state as it was."""
  assert float(metrics["finite"]) == 0 and float(metrics[guard]) >= 1
  assert int(s1.step) == int(s0.step)
  for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params)):
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def _same(params, f_plain, f_shared, guards=("rows_not_sharing_prompt",)):
  """f_shared's loss, gradient and metrics equal f_plain's, and its `guards` counts are 0."""
  (l0, a0), g0 = jax.jit(jax.value_and_grad(f_plain, has_aux=True))(params)
  (l1, a1), g1 = jax.jit(jax.value_and_grad(f_shared, has_aux=True))(params)
  assert np.isfinite(float(l0))
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5, atol=1e-6)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1)):
    assert float(jnp.max(jnp.abs(a))) > 0, path   # every parameter gets a gradient
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=2e-6,
                               err_msg=jax.tree_util.keystr(path))
  for name in guards:
    assert float(a1[name]) == 0, name
  for k in a0:
    np.testing.assert_allclose(float(a1[k]), float(a0[k]), rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("family,rows,beta", [("qwen3", G, 0.0), ("qwen2", G, 0.04),
                                              ("qwen3", 2, 0.04)])
def test_grpo_loss_and_grads_same_as_unshared(family, rows, beta):
  cfg = CFGS[family]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(1))
  kw = dict(group_size=G, beta=beta, impl="xla", logits_to_keep=C)
  c0, c1 = st.GRPOConfig(**kw), st.GRPOConfig(**kw, shared_prompt_rows=rows)
  _same(params, lambda p: st._grpo_loss(c0, model, p, batch, counts),
        lambda p: st._grpo_loss(c1, model, p, batch, counts))


@pytest.mark.parametrize("obj", ["sampled", "full_vocab"])
def test_opd_loss_and_grads_same_as_unshared(obj):
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(2))
  kw = dict(objective=obj, impl="xla", logits_to_keep=C, aggregation="seq_mean_token_sum_norm")
  c0, c1 = st.OPDConfig(**kw), st.OPDConfig(**kw, shared_prompt_rows=G)
  _same(params, lambda p: st._opd_loss(c0, model, p, batch, counts),
        lambda p: st._opd_loss(c1, model, p, batch, counts))


def test_logprob_fn_same_as_full_width():
  cfg = CFGS["qwen2"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(3))
  full = jax.jit(scoring.make_logprob_fn(model))(params, batch)
  shared = jax.jit(scoring.make_logprob_fn(model, logits_to_keep=C, shared_prompt_rows=G))(params,
                                                                                      batch)
  assert shared.shape == full.shape == (B, T)
  np.testing.assert_allclose(np.asarray(shared), np.asarray(full), rtol=1e-5, atol=1e-5)
  assert float(jnp.sum(jnp.abs(full) * batch.loss_mask_BT)) > 0
  # Rows 0 and 1 of the first block disagree on a prompt token: that block's rows get NaN.
  bad = batch.replace(tokens_BS=batch.tokens_BS.at[1, P - 1].add(1))
  out = jax.jit(scoring.make_logprob_fn(model, logits_to_keep=C, shared_prompt_rows=G))(params, bad)
  assert np.isnan(np.asarray(out)).any()


def test_micro_batched_step_same_and_fewer_flops():
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(4))
  tx = optax.adamw(1e-3)
  results, flops = [], []
  for rows in (1, G):
    sd = st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla", logits_to_keep=C,
                                                    micro_batches=1, shared_prompt_rows=rows))
    compiled = jax.jit(sd.step).lower(create_state(params, tx), batch).compile()
    flops.append(executable_flops(compiled)[0])
    sd = st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla", logits_to_keep=C,
                                                    micro_batches=PROMPTS,
                                                    shared_prompt_rows=rows))
    results.append(jax.jit(sd.step)(create_state(params, tx), batch))
  (s0, m0), (s1, m1) = results
  assert float(m0["finite"]) == float(m1["finite"]) == 1
  np.testing.assert_allclose(float(m1["loss"]), float(m0["loss"]), rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
  # The weight matmuls of the (G - 1) / G prompt rows that no longer run, forward and backward
  # (x3): 2 FLOPs per weight and token, P prompt tokens of B - B/G rows. Attention, norms and the
  # widened cache move the measured saving a little; it must be at least 80 % of that.
  d, f, n, k, h = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  layer_weights = d * n * h * 2 + 2 * d * k * h + 3 * d * f
  expected = 3 * 2 * layer_weights * cfg.n_layers * P * (B - B // G)
  saved = flops[0] - flops[1]
  assert saved >= 0.8 * expected, (flops, expected)
  assert saved <= 1.5 * expected, (flops, expected)


def test_rows_with_different_prompts_skip_the_step():
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(5))
  tx = optax.adamw(1e-3)
  sd = st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla", logits_to_keep=C,
                                                  shared_prompt_rows=G))
  # One row's prompt differs from its block's (a batch not in [p0 x G, p1 x G, ...] order).
  bad = batch.replace(tokens_BS=batch.tokens_BS.at[G + 2, P - 2].set(5),
                      attn_mask_BS=batch.attn_mask_BS.at[G + 2, P - 2].set(True))
  s0 = create_state(params, tx)
  s1, m = jax.jit(sd.step)(s0, bad)
  assert_skipped(s0, s1, m, "rows_not_sharing_prompt")


def test_impossible_settings_are_value_errors():
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(6))
  tx = optax.adamw(1e-3)
  state = create_state(params, tx)

  def step(**kw):
    return st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla", **kw)).step(
        state, batch)
  with pytest.raises(ValueError, match="shared_prompt_rows=5 must divide the 12 rows"):
    step(logits_to_keep=C, shared_prompt_rows=5)
  with pytest.raises(ValueError, match="shared_prompt_rows=4 needs logits_to_keep"):
    step(shared_prompt_rows=4)
  with pytest.raises(ValueError, match="shared_prompt_rows=0 must be >= 1"):
    step(logits_to_keep=C, shared_prompt_rows=0)
  with pytest.raises(ValueError, match="must divide the 4 rows"):   # micro-batches of 4 rows
    step(logits_to_keep=C, shared_prompt_rows=3, micro_batches=3)


def two_teachers(student):
  """Two teachers of different shapes, and domain tags routing prompts 0 and 2 to "math" and
  prompt 1 to "code": each teacher's rows are padded (by whole blocks) to its row bucket."""
  from smjax.rl.teachers import Teacher  # pylint: disable=import-outside-toplevel
  t_cfg = student.replace(d_model=48, d_ff=64, n_layers=1)
  teachers = [Teacher("m", student, init_params(student, jax.random.key(7)), ("math",)),
              Teacher("c", t_cfg, init_params(t_cfg, jax.random.key(8)), ("code",))]
  return teachers, ["math"] * G + ["code"] * G + ["math"] * G


@pytest.mark.parametrize("want_logits", [False, True])
def test_teacher_router_scores_same_as_unshared(want_logits):
  from smjax.rl.teachers import TeacherRouter  # pylint: disable=import-outside-toplevel
  student = CFGS["qwen3"]
  teachers, domains = two_teachers(student)
  plain = TeacherRouter(student, teachers, want_logits=want_logits)
  shared = TeacherRouter(student, teachers, want_logits=want_logits, logits_to_keep=C,
                         shared_prompt_rows=G)
  s0, calls0, rows0 = plain.score(batch, domains)
  s1, calls1, rows1 = shared.score(batch, domains)
  assert rows0 == rows1 == {"m": 2 * G, "c": G}
  window = np.zeros(s0.shape[:2], bool)
  window[:, T - C:] = True
  if want_logits:   # the loss reads the teacher's logits on the completion window only
    np.testing.assert_allclose(np.asarray(s1)[window], np.asarray(s0)[window], rtol=1e-5,
                               atol=1e-5)
    assert not np.asarray(s1)[~window].any()
  else:
    np.testing.assert_allclose(np.asarray(s1), np.asarray(s0), rtol=1e-5, atol=1e-5)
  # "Useful" FLOPs count a shared prompt's real tokens once per block, as the sampler's prefill.
  attn = np.asarray(batch.attn_mask_BS)
  for c0, c1, rows in zip(calls0, calls1, ([0, 2], [1])):
    a = attn.reshape(PROMPTS, G, S)[rows]
    tokens0, prompt_real = a.sum(), a[..., :P].sum()
    assert c1.useful / c0.useful == pytest.approx((tokens0 - prompt_real * (1 - 1 / G)) / tokens0,
                                                  rel=1e-6)
  with pytest.raises(ValueError, match="whole blocks of 4 rows of one domain"):
    shared.score(batch, ["math"] * (G - 1) + ["code"] * (2 * G + 1))
  with pytest.raises(ValueError, match="shared_prompt_rows=4 needs logits_to_keep"):
    TeacherRouter(student, teachers, shared_prompt_rows=G)
