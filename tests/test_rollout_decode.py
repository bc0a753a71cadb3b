"""The sampler's fast decode path (keys stored transposed, fused projections, the shared exp pass
of plain sampling) against the sampler before it: the same tokens for the same key, and the same
compiled FLOPs per decode step as the general path.

`data/rollout_golden.json` was recorded by `_cases()` below with the sampler at commit 4e08c6a
(the general attention path, unfused parameters, a separate log-softmax), before these changes.
Tokens, masks and lengths must be equal; log-probs (stored to 6 decimals) within 1e-5.
"""

import json
import os

import numpy as np
import jax
import pytest

from smjax import decode as dec
from smjax import rollout as ro
from smjax.flops import compiled_flops
from smjax.models.transformer import ModelConfig, fuse_for_decode, init_params

HERE = os.path.dirname(os.path.abspath(__file__))
CFG = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=64, max_seq_len=64, qk_norm=True, name="golden")


def _params():
  params = init_params(CFG, jax.random.key(3))
  return jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, params)  # peaked logits


def _cases(decode_stages=None, names=None):
  params = _params()
  rs = np.random.RandomState(1)
  prompts = [[int(t) for t in rs.randint(3, 96, rs.randint(3, 14))] for _ in range(3)]
  out = {}
  s = ro.Sampler(CFG, max_new_tokens=12, eos_id=2, pad_id=0, prompt_buckets=(16,),
                 decode_stages=decode_stages)
  for name, kw in [("sampled", dict(num_samples=4)),
                   ("warm_topk", dict(num_samples=3, temperature=0.7, top_k=20, top_p=0.9)),
                   ("greedy", dict(num_samples=1, greedy=True)),
                   ("stops", dict(num_samples=4, stop_sequences=[[5, 7], [11]]))]:
    if names and name not in names:
      continue
    r = s.generate(params, prompts, jax.random.key(7), **kw)
    out[name] = dict(tokens=np.asarray(r.completion_BC).tolist(),
                     mask=np.asarray(r.completion_mask_BC).astype(int).tolist(),
                     lengths=np.asarray(r.lengths_B).tolist(),
                     logprobs=np.round(np.asarray(r.logprobs_BC, np.float64), 6).tolist(),
                     steps_run=r.steps_run)
  return out


def _assert_same(got, want):
  for name in got:
    for field in ("tokens", "mask", "lengths", "steps_run"):
      assert got[name][field] == want[name][field], (name, field)
    assert np.abs(np.asarray(got[name]["logprobs"]) - want[name]["logprobs"]).max() <= 1e-5, name


def test_same_tokens_as_the_previous_sampler():
  with open(os.path.join(HERE, "data", "rollout_golden.json")) as f:
    want = json.load(f)
  got = _cases()
  assert set(got) == set(want)
  _assert_same(got, want)
  # decoded in two stages (slots 16+8, then 16+11), the same tokens (the cases of one program)
  _assert_same(_cases(decode_stages=2, names=("sampled", "stops")), want)
  # the cases exercise what they are meant to: an EOS, a stop sequence, early-stopped rows
  assert min(want["sampled"]["lengths"]) < 12 and min(want["stops"]["lengths"]) < 12


def test_decode_step_flops_equal_the_general_path():
  """The fused, transposed-key step does the general step's arithmetic: equal compiled FLOPs."""
  params = _params()
  s = ro.Sampler(CFG, max_new_tokens=8, eos_id=None, pad_id=0, prompt_buckets=(16,))
  r = s.generate(params, [[5, 6, 7], [8, 9]], jax.random.key(0), num_samples=2)
  call = next(c for c in r.program_calls if c.phase == "rollout/decode")
  fused_params, state, sp = call.args
  assert "qkv" in fused_params["layers_0"]["attn"] and state.cache.keys_transposed
  general_state = state.replace(cache=state.cache.replace(
      k=tuple(jax.ShapeDtypeStruct(v.shape, v.dtype) for v in state.cache.v),
      keys_transposed=False))
  general = compiled_flops(dec.decode_step_jit, jax.eval_shape(lambda: params), general_state,
                           sp, cfg=CFG, mesh=None)
  assert call.flops_per_call() == general > 0


def test_fuse_for_decode_moves_weights_without_changing_them():
  params = init_params(CFG.replace(qkv_bias=True), jax.random.key(0))
  fused = fuse_for_decode(params)
  attn, mlp = params["layers_1"]["attn"], params["layers_1"]["mlp"]
  f_attn, f_mlp = fused["layers_1"]["attn"], fused["layers_1"]["mlp"]
  N, K = CFG.n_heads, CFG.n_kv_heads
  np.testing.assert_array_equal(f_attn["qkv"][:, :N], attn["q"])
  np.testing.assert_array_equal(f_attn["qkv"][:, N + K:], attn["v"])
  np.testing.assert_array_equal(f_attn["qkv_bias"][N:N + K], attn["k_bias"])
  np.testing.assert_array_equal(f_mlp["gate_up"][:, CFG.d_ff:], mlp["up"])
  assert set(f_attn) == {"qkv", "qkv_bias", "o", "q_norm", "k_norm"}
  assert set(f_mlp) == {"gate_up", "down"}
  assert params["layers_1"]["attn"].keys() >= {"q", "k", "v"}  # the input is left as it was


def test_decode_stages_split_the_completion_in_spans_of_eight():
  # 39 fed tokens in 4 spans: width ceil(39 / 4) = 10, rounded up to 16 -> three stages
  assert dec.decode_stages(16, 40, 4) == ((17, 32), (33, 48), (40, 55))
  assert dec.decode_stages(16, 40, 1) == ((40, 55),)
  assert dec.decode_stages(5, 1, 3) == ((1, 5),)  # no decode step: the prefill's cache only
  assert dec.decode_stages(8, 9, 8) == ((9, 16),)
  with pytest.raises(ValueError, match="decode_stages=0 must be >= 1"):
    ro.Sampler(CFG, max_new_tokens=8, eos_id=None, pad_id=0, decode_stages=0)
  # the default: one stage per 32 new tokens, at most 8
  default = lambda C: ro.Sampler(CFG, max_new_tokens=C, eos_id=None, pad_id=0).stages
  assert [default(C) for C in (1, 32, 33, 64, 100, 256, 257, 4096)] == [1, 1, 2, 2, 4, 8, 8, 8]


def test_staged_decode_same_tokens_and_less_attention():
  """Three stages against one loop over the whole cache: the same completions; each stage's step
  is compiled on its cache (fewer FLOPs for the shorter ones), the last is the one-loop step, and
  the stages' steps and useful FLOPs add up to the one loop's."""
  params = _params()
  prompts = [[5, 6, 7, 9], [8, 9], [3] * 11]
  kw = dict(max_new_tokens=40, eos_id=None, pad_id=0, prompt_buckets=(16,))
  one = ro.Sampler(CFG, decode_stages=1, **kw).generate(params, prompts, jax.random.key(1),
                                                        num_samples=2)
  staged = ro.Sampler(CFG, decode_stages=3, **kw).generate(params, prompts, jax.random.key(1),
                                                           num_samples=2)
  np.testing.assert_array_equal(staged.completion_BC, one.completion_BC)
  np.testing.assert_array_equal(staged.completion_mask_BC, one.completion_mask_BC)
  np.testing.assert_allclose(staged.logprobs_BC, one.logprobs_BC, atol=1e-5)
  dec1 = [c for c in one.program_calls if c.phase == "rollout/decode"]
  dec3 = [c for c in staged.program_calls if c.phase == "rollout/decode"]
  assert len(dec1) == 1 and len(dec3) == 3
  assert [c.args[1].cache.max_len for c in dec3] == [32, 48, 55]
  assert [c.calls for c in dec3] == [16, 16, 7] and sum(c.calls for c in dec3) == dec1[0].calls
  per_call = [c.flops_per_call() for c in dec3]
  assert per_call[0] < per_call[1] < per_call[2] == dec1[0].flops_per_call()
  assert sum(c.flops() for c in dec3) < dec1[0].flops()
  assert sum(c.useful for c in dec3) == pytest.approx(dec1[0].useful, rel=1e-12)
  # the useful count of a stage: its fed tokens at their context, by hand (all rows run 40 tokens)
  p_B = np.repeat([4, 2, 11], 2)
  t = np.arange(1, 17)  # stage 0 feeds iterations t = 1..16, each attending p + t keys
  ctx = sum((p + t).sum() for p in p_B)
  want = ro.analytic_flops(CFG, tokens=16 * 6, context_len=ctx / (16 * 6), backward=False)
  assert dec3[0].useful == pytest.approx(want, rel=1e-12)


def test_staged_decode_stops_early_and_records_only_the_stages_that_ran():
  params = _params()
  kw = dict(max_new_tokens=40, eos_id=list(range(2, 10)), pad_id=0, prompt_buckets=(16,))
  args = (params, [[5, 6, 7, 9], [8, 9]], jax.random.key(4))
  r = ro.Sampler(CFG, decode_stages=3, **kw).generate(*args, num_samples=4)
  r1 = ro.Sampler(CFG, decode_stages=1, **kw).generate(*args, num_samples=4)
  np.testing.assert_array_equal(r.completion_BC, r1.completion_BC)
  assert r.steps_run == r1.steps_run < 32, "the case is meant to stop in the second stage"
  steps = [c for c in r.program_calls if c.phase == "rollout/decode"]
  assert sum(c.calls for c in steps) == r.steps_run
  assert len(steps) == 2 and all(c.calls > 0 for c in steps)  # stages start at t = 1, 17, 33


def test_staged_decode_flops_equal_the_unrolled_generation():
  """The ledger's decode records (each stage's step x its steps) against one compiled program
  that runs the same stages unrolled, cache growth included. An unrolled program compiles to a
  little more than its steps counted one by one (0.5 % here, one stage or two alike), so the
  check is on what staging saves: the same FLOPs in the ledger as in the compiled programs."""
  params = _params()
  ledger, compiled = {}, {}
  for n in (1, 2):
    s = ro.Sampler(CFG, max_new_tokens=12, eos_id=None, pad_id=0, prompt_buckets=(16,),
                   decode_stages=n)
    r = s.generate(params, [[5, 6, 7], [8, 9]], jax.random.key(0), num_samples=2)
    stages = dec.decode_stages(16, 12, n)
    steps = [c for c in r.program_calls if c.phase == "rollout/decode"]
    fused_params, state, sp = steps[0].args

    def unrolled(params, state, sp, stages=stages):
      t = 1
      for end, cache_len in stages:
        state = dec.grow_cache(state, cache_len)
        for _ in range(t, end):
          state = dec.decode_step(params, state, sp, cfg=CFG, mesh=None)
        t = end
      return state

    assert [c.calls for c in steps] == ([11] if n == 1 else [8, 3])
    ledger[n] = sum(c.flops() for c in steps)
    compiled[n] = compiled_flops(jax.jit(unrolled), fused_params, state, sp)
    assert ledger[n] == pytest.approx(compiled[n], rel=0.01)
  assert ledger[1] - ledger[2] == compiled[1] - compiled[2] > 0


def test_first_max_is_argmax_with_ties_and_nans():
  x = np.array([[0.5, 2.0, 2.0, -1.0],       # tie: the first
                [-np.inf, -np.inf, -3.0, -3.0],
                [1.0, np.nan, 5.0, np.nan],   # a NaN: the first NaN, as argmax
                [np.inf, 0.0, np.inf, 1.0]], np.float32)
  rs = np.random.RandomState(0)
  x = np.concatenate([x, rs.randn(64, 4).astype(np.float32).round(1)])  # many ties
  got = dec.first_max(jax.numpy.asarray(x), jax.numpy.max(x, axis=-1, keepdims=True))
  np.testing.assert_array_equal(np.asarray(got), np.argmax(x, axis=-1))
  assert got.dtype == np.int32
