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

from smjax import rollout as ro
from smjax.flops import compiled_flops
from smjax.models.transformer import ModelConfig, fuse_for_decode, init_params

HERE = os.path.dirname(os.path.abspath(__file__))
CFG = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=64, max_seq_len=64, qk_norm=True, name="golden")


def _params():
  params = init_params(CFG, jax.random.key(3))
  return jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, params)  # peaked logits


def _cases():
  params = _params()
  rs = np.random.RandomState(1)
  prompts = [[int(t) for t in rs.randint(3, 96, rs.randint(3, 14))] for _ in range(3)]
  out = {}
  s = ro.Sampler(CFG, max_new_tokens=12, eos_id=2, pad_id=0, prompt_buckets=(16,))
  for name, kw in [("sampled", dict(num_samples=4)),
                   ("warm_topk", dict(num_samples=3, temperature=0.7, top_k=20, top_p=0.9)),
                   ("greedy", dict(num_samples=1, greedy=True)),
                   ("stops", dict(num_samples=4, stop_sequences=[[5, 7], [11]]))]:
    r = s.generate(params, prompts, jax.random.key(7), **kw)
    out[name] = dict(tokens=np.asarray(r.completion_BC).tolist(),
                     mask=np.asarray(r.completion_mask_BC).astype(int).tolist(),
                     lengths=np.asarray(r.lengths_B).tolist(),
                     logprobs=np.round(np.asarray(r.logprobs_BC, np.float64), 6).tolist(),
                     steps_run=r.steps_run)
  return out


def test_same_tokens_as_the_previous_sampler():
  with open(os.path.join(HERE, "data", "rollout_golden.json")) as f:
    want = json.load(f)
  got = _cases()
  assert set(got) == set(want)
  for name in want:
    for field in ("tokens", "mask", "lengths", "steps_run"):
      assert got[name][field] == want[name][field], (name, field)
    assert np.abs(np.asarray(got[name]["logprobs"]) - want[name]["logprobs"]).max() <= 1e-5, name
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
  general = compiled_flops(ro._decode_step_jit, jax.eval_shape(lambda: params), general_state,
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
