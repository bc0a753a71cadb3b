"""Packed completions (`scoring.with_packing`) change nothing but cost.

Reference: the padded `logits_to_keep` computation, plain and shared-prompt (checked against numpy,
the full width and HF in test_logits_to_keep, test_shared_prompt and test_hf). On batches whose
completions have different lengths, packed GRPO and OPD losses, gradients and metrics, the log-prob
and logits functions and micro-batched steps equal the padded ones; the plan is what a
hand-written one is; the compiled step does fewer FLOPs, by about the dropped tokens' share; a plan
that does not fit its batch is a skipped, reported step; impossible settings are ValueErrors that
name the field.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from smjax.flops import executable_flops
from smjax.models.attention import PackedRows, packed_attention
from smjax.models.transformer import Transformer, init_params
from smjax.train import scoring
from smjax.train import steps as st
from smjax.train.state import create_state
from test_shared_prompt import (CFGS, C, G, P, PROMPTS, B, T, assert_skipped, grouped_batch, _same,
                                two_teachers)

batch = grouped_batch(seed=11)
counts = st._counts(batch)


def test_pack_plan_by_hand():
  # keep = 4 window columns of T = 6 targets; row 0 scores window columns 0..2 (needs completion
  # columns 0, 1), row 1 only column 0 (needs none), row 2 all four (columns 0..2), row 3 nothing.
  mask = np.zeros((4, 6), bool)
  mask[0, 2:5] = True
  mask[1, 2] = True
  mask[2, 2:6] = True
  plan = scoring.pack_plan(mask, 4, bucket=4)
  np.testing.assert_array_equal(plan, [[0, 1, 8, 9, 10, -1, -1, -1]])
  # Two micro-batches of two rows: indices are local to each; both padded to the longest (3).
  plan = scoring.pack_plan(mask, 4, micro_batches=2, bucket=1)
  np.testing.assert_array_equal(plan, [[0, 1, -1], [0, 1, 2]])
  with pytest.raises(ValueError, match="micro_batches=3 must divide the 4 rows"):
    scoring.pack_plan(mask, 4, micro_batches=3)
  with pytest.raises(ValueError, match=r"keep=7 must be in \[1, T=6\]"):
    scoring.pack_plan(mask, 7)
  with pytest.raises(ValueError, match="bucket=0 must be >= 1"):
    scoring.pack_plan(mask, 4, bucket=0)


def test_plan_drops_the_padding_and_each_rows_last_token():
  plan = np.asarray(scoring.with_packing(batch, C, bucket=1).pack_src_MT)
  lengths = np.asarray(batch.loss_mask_BT).sum(1)       # completion tokens (incl. the last)
  assert plan.shape == (1, int(np.sum(lengths - 1)))
  assert plan.shape[1] < B * C * 0.8   # this batch's completions are 2..C of C tokens


@pytest.mark.parametrize("family,rows", [("qwen3", 1), ("qwen3", G), ("qwen2", G)])
def test_window_scores_same_as_padded(family, rows):
  cfg = CFGS[family]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(1))
  packed = scoring.with_packing(batch, C)
  f = jax.jit(lambda p, b: scoring.window_scores(model, p, b, C, rows, logits=True))
  lp0, e0, l0, win, _, g0 = f(params, batch)
  lp1, e1, l1, _, _, g1 = f(params, packed)
  m = np.asarray(win.loss_mask_BT)
  for a, b in ((lp0, lp1), (e0, e1)):
    np.testing.assert_allclose(np.asarray(b)[m], np.asarray(a)[m], rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(l1)[m], np.asarray(l0)[m], rtol=1e-5, atol=2e-6)
  assert float(g1["pack_plan_errors"]) == 0
  assert set(g1) == set(g0) | {"pack_plan_errors"}


@pytest.mark.parametrize("family,rows,beta", [("qwen3", G, 0.0), ("qwen2", 1, 0.04)])
def test_grpo_loss_and_grads_same_as_padded(family, rows, beta):
  cfg = CFGS[family]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(2))
  c = st.GRPOConfig(group_size=G, beta=beta, impl="xla", logits_to_keep=C,
                    shared_prompt_rows=rows)
  packed = scoring.with_packing(batch, C)
  _same(params, lambda p: st._grpo_loss(c, model, p, batch, counts),
        lambda p: st._grpo_loss(c, model, p, packed, counts), guards=("pack_plan_errors",))


@pytest.mark.parametrize("obj", ["sampled", "full_vocab"])
def test_opd_loss_and_grads_same_as_padded(obj):
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(3))
  c = st.OPDConfig(objective=obj, impl="xla", logits_to_keep=C, shared_prompt_rows=G,
                   aggregation="seq_mean_token_sum_norm")
  packed = scoring.with_packing(batch, C)
  _same(params, lambda p: st._opd_loss(c, model, p, batch, counts),
        lambda p: st._opd_loss(c, model, p, packed, counts), guards=("pack_plan_errors",))


def test_logprob_and_logits_fns_same_as_padded():
  cfg = CFGS["qwen2"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(4))
  packed = scoring.with_packing(batch, C)
  m = np.asarray(batch.loss_mask_BT)
  for make in (scoring.make_logprob_fn, scoring.make_logits_fn):
    fn = jax.jit(make(model, logits_to_keep=C, shared_prompt_rows=G))
    a, b = np.asarray(fn(params, batch)), np.asarray(fn(params, packed))
    assert a.shape == b.shape and a.shape[:2] == (B, T)
    np.testing.assert_allclose(b[m], a[m], rtol=1e-5, atol=1e-5)
    assert np.abs(a[m]).sum() > 0
  lp = np.asarray(jax.jit(scoring.make_logprob_fn(model, logits_to_keep=C))(params, packed))
  assert not lp[~m].any()   # 0 off the loss mask, as the padded function's


def test_micro_batched_packed_step_same_and_fewer_flops():
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(5))
  tx = optax.adamw(1e-3)
  kw = dict(group_size=G, impl="xla", logits_to_keep=C, shared_prompt_rows=G)
  results, flops = [], []
  for b in (batch, scoring.with_packing(batch, C, bucket=1)):
    sd = st.make_grpo_step(model, tx, st.GRPOConfig(**kw))
    compiled = jax.jit(sd.step).lower(create_state(params, tx), b).compile()
    flops.append(executable_flops(compiled)[0])
  for b in (batch, scoring.with_packing(batch, C, micro_batches=PROMPTS)):
    sd = st.make_grpo_step(model, tx, st.GRPOConfig(**kw, micro_batches=PROMPTS))
    results.append(jax.jit(sd.step)(create_state(params, tx), b))
  (s0, m0), (s1, m1) = results
  assert float(m0["finite"]) == float(m1["finite"]) == 1
  assert float(m1["pack_plan_errors"]) == 0
  np.testing.assert_allclose(float(m1["loss"]), float(m0["loss"]), rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
  # The weight matmuls of the completion columns the plan leaves out no longer run, forward and
  # backward (x3, 2 FLOPs per weight and token): the layers ran on B * C columns and now on the
  # plan's tokens, the LM head on the B * C window columns and now on those tokens and the B
  # prompt rows. The last layer's queries, output projection and MLP run on each prompt's last
  # column alone (PackedRows.scored_rows), not on its other P - 1. The moves between stream and
  # rows cost a little; the per-token norms, RoPE and log-softmax that no longer run save more
  # (~1.3x here, with d_model 32); the measured saving must be within [0.8, 1.5] of the weights'.
  d, f, n, k, h, v = (cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                      cfg.vocab_size)
  layers = 3 * 2 * (d * n * h * 2 + 2 * d * k * h + 3 * d * f) * cfg.n_layers
  last_layer_queries = 3 * 2 * (d * n * h * 2 + 3 * d * f)
  kept = int(np.sum(np.asarray(batch.loss_mask_BT).sum(1) - 1))
  expected = (layers * (B * C - kept) + 3 * 2 * d * v * (B * C - kept - B)
              + last_layer_queries * PROMPTS * (P - 1))
  saved = flops[0] - flops[1]
  print(f"measured / analytic saving: {saved / expected:.3f}")
  assert 0.8 * expected <= saved <= 1.5 * expected, (flops, expected)


def test_a_plan_that_does_not_fit_skips_the_step():
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(6))
  tx = optax.adamw(1e-3)
  sd = st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla", logits_to_keep=C,
                                                  shared_prompt_rows=G))
  step = jax.jit(sd.step)
  plan = np.asarray(scoring.pack_plan(batch.loss_mask_BT, C))
  n = int((plan >= 0).sum())
  dropped_last = plan.copy()
  dropped_last[0, n - 1] = -1                     # a scored target's hidden state left out
  hole = plan.copy()
  hole[0, 0] = -1                                 # row 0's column 0 missing, column 1 present
  repeated = plan.copy()
  repeated[0, 1] = repeated[0, 0]                 # one token twice
  other = scoring.pack_plan(grouped_batch(seed=12).loss_mask_BT, C)  # another batch's plan
  for bad in (dropped_last, hole, repeated, other):
    s0 = create_state(params, tx)
    s1, m = step(s0, batch.replace(pack_src_MT=jnp.asarray(bad)))
    assert_skipped(s0, s1, m, "pack_plan_errors")


def test_impossible_settings_are_value_errors():
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(7))
  tx = optax.adamw(1e-3)
  state = create_state(params, tx)

  def step(b, **kw):
    return st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla", **kw)).step(
        state, b)
  with pytest.raises(ValueError, match="with_packing: packing needs logits_to_keep"):
    scoring.with_packing(batch, None)
  with pytest.raises(ValueError, match="a packed batch .pack_src_MT. needs logits_to_keep"):
    step(scoring.with_packing(batch, C))
  with pytest.raises(ValueError, match="make the plan with the step's micro_batches"):
    step(scoring.with_packing(batch, C, micro_batches=PROMPTS), logits_to_keep=C)
  # The model's packed call: one stream longer than its prompts, no cache.
  packed = PackedRows(prompt_valid_BpP=jnp.ones((PROMPTS, 4), bool),
                      slot_BC=jnp.zeros((B, C), jnp.int32), src_T=jnp.zeros((8,), jnp.int32))
  for tokens in (jnp.zeros((2, 20), jnp.int32), jnp.zeros((1, 12), jnp.int32)):
    with pytest.raises(ValueError, match="packed rows take no cache and tokens as one stream"):
      model.apply({"params": params}, tokens, packed=packed)
  # Attention of that 20-token stream takes all 20 queries or the 8 + 3 scored rows.
  q, kv = jnp.zeros((1, 13, 4, 8)), jnp.zeros((1, 20, 2, 8))
  with pytest.raises(ValueError, match=r"13 queries for a stream of 20 tokens; expected 20 "
                                       r"\(all\) or 11"):
    packed_attention(packed, q, kv, kv, jnp.ones((1, 20), bool), jnp.float32)


@pytest.mark.parametrize("want_logits", [False, True])
def test_teacher_router_scores_same_as_padded(want_logits):
  from smjax.rl.teachers import TeacherRouter  # pylint: disable=import-outside-toplevel
  student = CFGS["qwen3"]
  teachers, domains = two_teachers(student)   # each teacher's rows padded, then packed
  kw = dict(want_logits=want_logits, logits_to_keep=C, shared_prompt_rows=G)
  s0, calls0, rows0 = TeacherRouter(student, teachers, **kw).score(batch, domains)
  s1, calls1, rows1 = TeacherRouter(student, teachers, **kw, pack_completions=True).score(
      batch, domains)
  assert rows0 == rows1 == {"m": 2 * G, "c": G}
  m = np.asarray(batch.loss_mask_BT)
  np.testing.assert_allclose(np.asarray(s1)[m], np.asarray(s0)[m], rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(s0)[m]).sum() > 0
  for c0, c1 in zip(calls0, calls1):   # the same useful work, fewer compiled FLOPs
    assert c1.useful == c0.useful
    assert c1.flops() < c0.flops()
  with pytest.raises(ValueError, match="pack_completions needs logits_to_keep"):
    TeacherRouter(student, teachers, pack_completions=True)
