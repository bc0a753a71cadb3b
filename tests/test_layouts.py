"""A batch's layout (smjax.batch.Layout) changes what runs, never what is computed.

Reference: the plain full-width forward (every target column scored), itself checked against numpy
(test_grpo_loss, test_opd_loss) and the model against HF transformers (test_hf). On batches whose
prompts and completions have different lengths, with

- `completion_len` (the LM head and loss on the completion columns only),
- `rows_per_prompt` (each prompt's forward once per block of rows), and
- `packed` (the completions as one stream without their padding),

GRPO and OPD losses, gradients and metrics, the reference / teacher scoring functions, micro-batched
steps and the teacher router equal the plain ones; the compiled steps do fewer FLOPs, by about the
skipped work's analytic count. A batch that is not laid out as its layout says is refused on the
host, when it is built, with a ValueError naming the row and field; a non-finite step is skipped and
names its guards.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from smjax.batch import Layout, SequenceBatch, check_layout, eighth_bucket, pack, make_pack_plan
from smjax.flops import executable_flops
from smjax.models.attention import PackedRows, packed_attention
from smjax.models.transformer import Transformer, init_params
from smjax.rl.logprobs import token_logprobs, token_logprobs_and_entropy
from smjax.train import steps as st
from smjax.train.guards import check_finite
from smjax.train.score import score, target_logits, target_logprobs
from smjax.train.state import create_state
from smjax.train.teachers import Teacher, TeacherRouter
from batches import B, C, CFGS, G, P, PROMPTS, S, T, grouped_batch

batch = grouped_batch()
counts = st.token_counts(batch)


def laid_out(b=batch, *, rows=1, packed=False, micro_batches=1, bucket=None) -> SequenceBatch:
  """`b` with the completion window, `rows` per prompt and optionally packed, checked."""
  out = b.replace(layout=Layout(completion_len=C, rows_per_prompt=rows))
  check_layout(out, micro_batches=micro_batches)
  return pack(out, micro_batches=micro_batches, bucket=bucket or C) if packed else out


LAYOUTS = {"window": dict(), "shared": dict(rows=G), "shared2": dict(rows=2),
           "packed": dict(packed=True), "shared_packed": dict(rows=G, packed=True)}


def _same(params, loss_fn, b0, b1):
  """loss_fn's loss, gradient and metrics on batch b1 equal those on b0."""
  f = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, counts), has_aux=True))
  (l0, a0), g0 = f(params, b0)
  (l1, a1), g1 = f(params, b1)
  assert np.isfinite(float(l0))
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5, atol=1e-6)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1)):
    assert float(jnp.max(jnp.abs(a))) > 0, path   # every parameter gets a gradient
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=2e-6,
                               err_msg=jax.tree_util.keystr(path))
  assert set(a1) == set(a0)
  for k in a0:
    np.testing.assert_allclose(float(a1[k]), float(a0[k]), rtol=1e-5, atol=1e-5, err_msg=k)


# ------------------------------------------------------------------------- same values

@pytest.mark.parametrize("layout,family,beta,agg", [
    ("window", "qwen3", 0.0, "token_mean"), ("window", "qwen3", 0.04, "seq_mean_token_sum_norm"),
    ("shared", "qwen3", 0.0, "token_mean"), ("shared", "qwen2", 0.04, "token_mean"),
    ("shared2", "qwen3", 0.04, "seq_mean_token_mean"), ("packed", "qwen2", 0.04, "token_mean"),
    ("shared_packed", "qwen3", 0.0, "token_mean")])
def test_grpo_loss_and_grads_same_in_every_layout(layout, family, beta, agg):
  cfg = CFGS[family]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(1))
  c = st.GRPOConfig(group_size=G, beta=beta, aggregation=agg, impl="xla")
  loss = lambda p, b, n: st.grpo_loss(model, p, b, n, cfg=c)  # noqa: E731
  _same(params, loss, batch, laid_out(**LAYOUTS[layout]))


@pytest.mark.parametrize("layout,obj", [
    ("window", "sampled"), ("window", "full_vocab"), ("window", "top_k"), ("shared", "sampled"),
    ("shared", "full_vocab"), ("packed", "sampled"), ("shared_packed", "full_vocab")])
def test_opd_loss_and_grads_same_in_every_layout(layout, obj):
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(2))
  c = st.OPDConfig(objective=obj, impl="xla", aggregation="seq_mean_token_sum_norm")
  loss = lambda p, b, n: st.opd_loss(model, p, b, n, cfg=c)  # noqa: E731
  _same(params, loss, batch, laid_out(**LAYOUTS[layout]))


@pytest.mark.parametrize("family,layout", [("qwen3", "packed"), ("qwen3", "shared_packed"),
                                           ("qwen2", "shared")])
def test_scores_same_as_plain(family, layout):
  cfg = CFGS[family]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(1))
  f = jax.jit(lambda p, b: score(model, p, b, logits=True))
  s0, s1 = f(params, batch), f(params, laid_out(**LAYOUTS[layout]))
  m = np.asarray(batch.loss_mask_BT)[:, T - C:]
  cut = lambda x: np.asarray(x)[:, T - C:]  # noqa: E731   the plain scores cover all T columns
  for a, b in ((s0.logp_BC, s1.logp_BC), (s0.entropy_BC, s1.entropy_BC),
               (s0.logits_BCV, s1.logits_BCV)):
    assert np.asarray(b).shape[1] == C
    np.testing.assert_allclose(np.asarray(b)[m], cut(a)[m], rtol=1e-5, atol=2e-6)
  np.testing.assert_array_equal(np.asarray(s1.targets_BC), cut(s0.targets_BC))


def test_target_logprobs_and_logits_same_as_plain():
  cfg = CFGS["qwen2"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(4))
  m = np.asarray(batch.loss_mask_BT)
  lp = jax.jit(lambda p, b: target_logprobs(model, p, b))
  lg = jax.jit(lambda p, b: target_logits(model, p, b))
  full_lp, full_lg = np.asarray(lp(params, batch)), np.asarray(lg(params, batch))
  assert full_lp.shape == (B, T) and np.abs(full_lp[m]).sum() > 0
  for layout in ("window", "shared", "packed", "shared_packed"):
    b = laid_out(**LAYOUTS[layout])
    got_lp, got_lg = np.asarray(lp(params, b)), np.asarray(lg(params, b))
    assert got_lp.shape == (B, T) and got_lg.shape == (B, T, 64)
    np.testing.assert_allclose(got_lp, full_lp, rtol=1e-5, atol=1e-5, err_msg=layout)
    np.testing.assert_allclose(got_lg[m], full_lg[m], rtol=1e-5, atol=1e-5, err_msg=layout)
    assert not got_lg[:, :T - C].any()   # 0 outside the scored window
  # A plan of several micro-batches runs each in turn.
  b = laid_out(rows=G, packed=True, micro_batches=PROMPTS)
  np.testing.assert_allclose(np.asarray(lp(params, b)), full_lp, rtol=1e-5, atol=1e-5)


def test_fused_logprob_entropy_matches_numpy():
  rng = np.random.RandomState(0)
  logits = rng.randn(3, 5, 11).astype(np.float32) * 3
  tokens = rng.randint(0, 11, (3, 5))
  lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  want_lp = np.take_along_axis(logits, tokens[..., None], -1)[..., 0] - lse
  p = np.exp(logits - lse[..., None])
  want_ent = -(p * np.log(p)).sum(-1)
  lp, ent = token_logprobs_and_entropy(jnp.asarray(logits), jnp.asarray(tokens))
  np.testing.assert_allclose(np.asarray(lp), want_lp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ent), want_ent, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(token_logprobs(jnp.asarray(logits), jnp.asarray(tokens))),
                             want_lp, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------- steps

def test_micro_batched_steps_same_and_fewer_flops():
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(5))
  tx = optax.adamw(1e-3)
  flops, results = {}, {}
  for name, kw in (("plain", None), ("window", {}), ("shared", dict(rows=G)),
                   ("shared_packed", dict(rows=G, packed=True))):
    one = batch if kw is None else laid_out(**kw, bucket=1)
    sd = st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla"))
    flops[name] = executable_flops(jax.jit(sd.step).lower(create_state(params, tx),
                                                          one).compile())[0]
    micro = batch if kw is None else laid_out(**kw, micro_batches=PROMPTS)
    sd = st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla",
                                                    micro_batches=PROMPTS))
    results[name] = jax.jit(sd.step)(create_state(params, tx), micro)
  # Each layout against the one it refines. Adam's first step moves every parameter by about the
  # learning rate (1e-3) whatever the gradient's size, so a tiny gradient entry's float rounding can
  # move it by ~1e-4 relative: updates must agree to 1 % of the learning rate.
  names = list(results)
  for ref, name in zip(names, names[1:]):
    (s0, m0), (s1, m1) = results[ref], results[name]
    assert float(m0["finite"]) == float(m1["finite"]) == 1, name
    np.testing.assert_allclose(float(m1["loss"]), float(m0["loss"]), rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params)):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5, err_msg=name)
  d, f, n, k, h, v = (cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                      cfg.vocab_size)
  layer_weights = d * n * h * 2 + 2 * d * k * h + 3 * d * f
  # The window: the LM head (forward and backward, x3; 2 FLOPs per weight and token) no longer
  # runs on the T - C prompt columns.
  expected = 3 * 2 * d * v * B * (T - C)
  assert 0.8 * expected <= flops["plain"] - flops["window"] <= 1.5 * expected, flops
  # Sharing: the weight matmuls of the (G - 1) / G prompt rows that no longer run. Attention,
  # norms and the widened cache move the measured saving a little.
  expected = 3 * 2 * layer_weights * cfg.n_layers * P * (B - B // G)
  assert 0.8 * expected <= flops["window"] - flops["shared"] <= 1.5 * expected, flops
  # Packing: the layers ran on B * C completion columns and now on the plan's tokens, the LM
  # head on the B * C window columns and now on those tokens and the B prompt rows; the last
  # layer's queries, output projection and MLP run on each prompt's last column alone.
  layers = 3 * 2 * layer_weights * cfg.n_layers
  last_layer_queries = 3 * 2 * (d * n * h * 2 + 3 * d * f)
  kept = int(np.sum(np.asarray(batch.loss_mask_BT).sum(1) - 1))
  expected = (layers * (B * C - kept) + 3 * 2 * d * v * (B * C - kept - B)
              + last_layer_queries * PROMPTS * (P - 1))
  saved = flops["shared"] - flops["shared_packed"]
  assert 0.8 * expected <= saved <= 1.5 * expected, (flops, expected)


def test_a_non_finite_step_is_skipped_and_names_its_guards():
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(6))
  tx = optax.adamw(1e-3)
  step = jax.jit(st.make_grpo_step(model, tx, st.GRPOConfig(group_size=G, impl="xla")).step)
  s0 = create_state(params, tx)
  bad = batch.replace(old_logp_BT=batch.old_logp_BT.at[0, P].set(jnp.nan))
  s1, m = step(s0, bad)
  m = {k: float(v) for k, v in jax.device_get(m).items()}
  assert m["finite"] == 0 and m["finite/batch.old_logp_BT"] == 0
  assert m["finite/batch.rewards_B"] == 1
  # A non-finite step is skipped: parameters, Adam moments and the step counter are unchanged.
  assert int(s1.step) == 0
  for a, b in zip(jax.tree.leaves((s0.params, s0.opt_state)),
                  jax.tree.leaves((s1.params, s1.opt_state))):
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
  with pytest.raises(FloatingPointError, match=r"joint: step 3 was not finite .*batch\."
                                               r"old_logp_BT \(from the sampler\)"):
    check_finite("joint", 3, m)
  finite_inputs = dict(m, **{"finite/batch.old_logp_BT": 1.0})
  with pytest.raises(FloatingPointError, match="inputs were finite.*lower the learning rate"):
    check_finite("joint", 3, finite_inputs)
  check_finite("joint", 3, {"finite": 1.0, "loss": 0.5})


# ------------------------------------------------------------------- layouts checked on the host

def test_pack_plan_by_hand():
  # C = 4 window columns of T = 6 targets; row 0 scores window columns 0..2 (needs completion
  # columns 0, 1), row 1 only column 0 (needs none), row 2 all four (columns 0..2), row 3 nothing.
  mask = np.zeros((4, 6), bool)
  mask[0, 2:5] = True
  mask[1, 2] = True
  mask[2, 2:6] = True
  np.testing.assert_array_equal(make_pack_plan(mask, 4, bucket=4), [[0, 1, 8, 9, 10, -1, -1, -1]])
  # Two micro-batches of two rows: indices are local to each; both padded to the longest (3).
  np.testing.assert_array_equal(make_pack_plan(mask, 4, micro_batches=2, bucket=1),
                                [[0, 1, -1], [0, 1, 2]])
  with pytest.raises(ValueError, match="micro_batches=3 must divide the 4 rows"):
    make_pack_plan(mask, 4, micro_batches=3)
  with pytest.raises(ValueError, match=r"completion_len=7 must be in \[1, T=6\]"):
    make_pack_plan(mask, 7)
  with pytest.raises(ValueError, match="bucket=0 must be >= 1"):
    make_pack_plan(mask, 4, bucket=0)
  assert eighth_bucket(64, 12) == 96 and eighth_bucket(4, 12) == 12


def test_plan_drops_the_padding_and_each_rows_last_token():
  plan = np.asarray(laid_out(packed=True, bucket=1).pack_plan)
  lengths = np.asarray(batch.loss_mask_BT).sum(1)       # completion tokens (incl. the last)
  assert plan.shape == (1, int(np.sum(lengths - 1)))
  assert plan.shape[1] < B * C * 0.8   # this batch's completions are 2..C of C tokens
  # The default bucket: an eighth of the rows' completion columns.
  assert pack(laid_out()).pack_plan.shape[1] % eighth_bucket(B, C) == 0


def test_a_batch_not_laid_out_as_it_says_is_refused_naming_the_row():
  window = laid_out()
  with pytest.raises(ValueError, match=r"loss_mask_BT: row 0 scores a target in the prompt "
                                       r"columns \(the first 7 of T=15\)"):
    check_layout(window.replace(layout=Layout(completion_len=C - 1)))
  # One row's prompt differs from its block's (a batch not in [p0 x G, p1 x G, ...] order).
  moved = window.replace(tokens_BS=window.tokens_BS.at[G + 2, P - 2].set(5),
                         layout=Layout(completion_len=C, rows_per_prompt=G))
  with pytest.raises(ValueError, match=r"tokens_BS: row 6 does not repeat the prompt columns of "
                                       r"row 4 \(Layout.rows_per_prompt=4"):
    check_layout(moved)
  with pytest.raises(ValueError, match="rows_per_prompt=5 must divide the 12 rows"):
    check_layout(window.replace(layout=Layout(completion_len=C, rows_per_prompt=5)))
  with pytest.raises(ValueError, match="rows_per_prompt=3 must divide the 4 rows of each of the 3"):
    check_layout(window.replace(layout=Layout(completion_len=C, rows_per_prompt=3)),
                 micro_batches=3)
  with pytest.raises(ValueError, match="Layout.rows_per_prompt=4 needs completion_len"):
    Layout(rows_per_prompt=G)
  with pytest.raises(ValueError, match="Layout.packed=True needs completion_len"):
    Layout(packed=True)
  with pytest.raises(ValueError, match="Layout.rows_per_prompt=0 must be >= 1"):
    Layout(completion_len=C, rows_per_prompt=0)
  with pytest.raises(ValueError, match="pack: the batch's layout has no completion_len"):
    pack(batch)
  with pytest.raises(ValueError, match=r"completion_len=16 must be in \[1, S - 1 = 15\]"):
    check_layout(batch.replace(layout=Layout(completion_len=S)))
  # Plans that do not fit their batch.
  packed = laid_out(packed=True)
  plan = np.asarray(packed.pack_plan)
  n = int((plan >= 0).sum())
  dropped_last, hole, repeated = plan.copy(), plan.copy(), plan.copy()
  dropped_last[0, n - 1] = -1                     # a scored target's hidden state left out
  hole[0, 0] = -1                                 # row 0's column 0 missing, column 1 present
  repeated[0, 1] = repeated[0, 0]                 # one token twice
  other = laid_out(grouped_batch(seed=12), packed=True).pack_plan   # another batch's plan
  for bad in (dropped_last, hole, repeated, other):
    with pytest.raises(ValueError, match=r"pack_plan: micro-batch 0's stream does not hold row "
                                         r"\d+'s needed completion columns exactly once"):
      check_layout(packed.replace(pack_plan=jnp.asarray(bad)))
  with pytest.raises(ValueError, match=r"pack_plan has shape \(1, \d+\); expected "
                                       r"\[micro_batches=3"):
    check_layout(packed, micro_batches=3)
  with pytest.raises(ValueError, match="layout.packed=False but pack_plan is set"):
    check_layout(window.replace(pack_plan=packed.pack_plan))


def test_the_group_size_comes_from_the_batch_and_a_disagreeing_config_is_refused():
  """The rollout owns the group size: rollout_batch records its samples per prompt in the
  layout, a GRPOConfig with group_size 0 takes it from there, the same update as one told G by
  hand, and a config that says another size (or a batch that says none, with none configured)
  is a ValueError naming both, before any advantage is computed over the wrong groups."""
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(8))
  tx = optax.adamw(1e-3)
  told = batch.replace(layout=dataclasses.replace(batch.layout, group_size=G))
  step = lambda c, b: jax.jit(st.make_grpo_step(model, tx, c).step)(  # noqa: E731
      create_state(params, tx), b)
  s_batch, m_batch = step(st.GRPOConfig(impl="xla"), told)
  s_cfg, m_cfg = step(st.GRPOConfig(group_size=G, impl="xla"), batch)
  np.testing.assert_allclose(float(m_batch["loss"]), float(m_cfg["loss"]), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(s_batch.params), jax.tree.leaves(s_cfg.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  with pytest.raises(ValueError, match=rf"the batch's rewards come in groups of {G} "
                     rf"\(Layout\.group_size.*GRPOConfig\.group_size={2 * G}"):
    step(st.GRPOConfig(group_size=2 * G, impl="xla"), told)
  with pytest.raises(ValueError, match=r"does not say its reward groups' size"):
    step(st.GRPOConfig(impl="xla"), batch.replace(layout=dataclasses.replace(batch.layout,
                                                                              group_size=0)))
  with pytest.raises(ValueError, match=r"GRPOConfig.group_size=-1 must be >= 0"):
    st.GRPOConfig(group_size=-1)


def test_impossible_configs_and_model_calls_are_value_errors():
  with pytest.raises(ValueError, match=r"GRPOConfig.advantage_mode='bogus'; expected one of"):
    st.GRPOConfig(advantage_mode="bogus")
  with pytest.raises(ValueError, match=r"OPDConfig.objective='kl'; expected one of"):
    st.OPDConfig(objective="kl")
  with pytest.raises(ValueError, match="GRPOConfig.micro_batches=0 must be >= 1"):
    st.GRPOConfig(micro_batches=0)
  cfg = CFGS["qwen3"]
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(7))
  # The model's packed call: one stream longer than its prompts, no cache.
  packed = PackedRows(prompt_valid=jnp.ones((PROMPTS, 4), bool),
                      slot_BC=jnp.zeros((B, C), jnp.int32), slot_src=jnp.zeros((8,), jnp.int32))
  for tokens in (jnp.zeros((2, 20), jnp.int32), jnp.zeros((1, 12), jnp.int32)):
    with pytest.raises(ValueError, match="packed rows take no cache and tokens as one stream"):
      model.apply({"params": params}, tokens, packed=packed)
  # Attention of that 20-token stream takes all 20 queries or the 8 + 3 scored rows.
  q, kv = jnp.zeros((1, 13, 4, 8)), jnp.zeros((1, 20, 2, 8))
  with pytest.raises(ValueError, match=r"13 queries for a stream of 20 tokens; expected 20 "
                                       r"\(all\) or 11"):
    packed_attention(packed, q, kv, kv, jnp.ones((1, 20), bool), jnp.float32)


# ---------------------------------------------------------------------------------- teachers

def _two_teachers(student):
  """Two teachers of different shapes, and domain tags routing prompts 0 and 2 to "math" and
  prompt 1 to "code": each teacher's rows are padded (by whole blocks) to its row bucket."""
  t_cfg = student.replace(d_model=48, d_ff=64, n_layers=1)
  teachers = [Teacher("m", student, init_params(student, jax.random.key(7)), ("math",)),
              Teacher("c", t_cfg, init_params(t_cfg, jax.random.key(8)), ("code",))]
  return teachers, ["math"] * G + ["code"] * G + ["math"] * G


@pytest.mark.parametrize("want_logits", [False, True])
def test_teacher_router_scores_same_in_every_layout(want_logits):
  student = CFGS["qwen3"]
  teachers, domains = _two_teachers(student)
  router = TeacherRouter(student, teachers, want_logits=want_logits)
  s0, calls0, rows0 = router.score(batch, domains)
  m = np.asarray(batch.loss_mask_BT)
  attn = np.asarray(batch.attn_mask_BS)
  for layout in ("window", "shared", "shared_packed"):
    b = laid_out(**LAYOUTS[layout])
    s1, calls1, rows1 = router.score(b, domains)
    assert rows0 == rows1 == {"m": 2 * G, "c": G}
    np.testing.assert_allclose(np.asarray(s1)[m], np.asarray(s0)[m], rtol=1e-5, atol=1e-5,
                               err_msg=layout)
    assert not np.asarray(s1)[:, :T - C].any()   # nothing computed outside the window
    for c0, c1, prompts in zip(calls0, calls1, ([0, 2], [1])):
      # "Useful" FLOPs count a shared prompt's real tokens once per block, as the sampler's
      # prefill; the compiled count falls with every layout.
      a = attn.reshape(PROMPTS, G, S)[prompts]
      r = b.layout.rows_per_prompt
      tokens0, prompt_real = a.sum(), a[..., :P].sum()
      assert c1.useful / c0.useful == pytest.approx(
          (tokens0 - prompt_real * (1 - 1 / r)) / tokens0, rel=1e-6)
      assert c1.flops() < c0.flops(), layout
  shared = laid_out(rows=G)
  with pytest.raises(ValueError, match=r"prompt blocks of 4 rows \(Layout.rows_per_prompt\) must "
                                       "each be of one domain"):
    router.score(shared, ["math"] * (G - 1) + ["code"] * (2 * G + 1))
  with pytest.raises(ValueError, match="no teacher is routed domain 'logic'"):
    router.score(batch, ["logic"] * B)


def test_layout_is_static_and_part_of_the_program():
  """Two layouts of the same arrays are two programs (the layout is in the treedef, not a leaf)."""
  leaves0, tree0 = jax.tree.flatten(batch)
  leaves1, tree1 = jax.tree.flatten(laid_out(rows=G))
  assert len(leaves0) == len(leaves1) and tree0 != tree1
  assert dataclasses.replace(Layout(completion_len=C), rows_per_prompt=G) == Layout(C, G)
