"""The decoder against `transformers` (torch CPU), and its cache and padding contracts."""

import contextlib

import numpy as np
import pytest
import torch
import jax
import jax.numpy as jnp

from hf_models import tiny_hf_model
from smjax.models import hf
from smjax.models.cache import KVCache, init_cache, transpose_keys
from smjax.models.transformer import Transformer, fuse_for_decode, init_params
from smjax.models.presets import get_preset

CASES = [("qwen2", False), ("qwen2", True), ("qwen3", False), ("qwen3", True), ("llama", False),
         ("llama", True)]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  out = {}
  for fam, tie in CASES:
    model = tiny_hf_model(fam, tie=tie, seed=len(out))
    path = str(tmp_path_factory.mktemp(f"{fam}_{tie}"))
    model.save_pretrained(path)
    out[(fam, tie)] = (model, path)
  return out


def _forward(cfg, params, toks, positions=None, mask=None):
  logits, _ = Transformer(cfg).apply({"params": params}, jnp.asarray(toks), positions, mask)
  return np.asarray(logits)


@pytest.mark.parametrize("fam,tie", CASES)
def test_logits_match_transformers(hf_dirs, fam, tie):
  model, path = hf_dirs[(fam, tie)]
  cfg, params = hf.load_params(path)
  assert cfg.tie_embeddings == tie and cfg.qk_norm == (fam == "qwen3")
  assert cfg.qkv_bias == (fam == "qwen2") and (cfg.rope_scaling is not None) == (fam == "llama")
  # 40 positions > the llama config's original_max_position_embeddings (32): scaling matters.
  toks = np.random.RandomState(1).randint(0, cfg.vocab_size, (3, 40))
  with torch.no_grad():
    ref = model(torch.tensor(toks)).logits.numpy()
  ours = _forward(cfg, params, toks)
  assert np.abs(ours - ref).max() <= 1e-4, np.abs(ours - ref).max()


@pytest.mark.parametrize("fam,tie", [("qwen3", False), ("llama", True)])
def test_left_padding_matches_transformers(hf_dirs, fam, tie):
  """A left-padded batch: real tokens' logits equal HF's with its attention mask, and equal the
  unpadded forward of each row alone."""
  model, path = hf_dirs[(fam, tie)]
  cfg, params = hf.load_params(path)
  rng = np.random.RandomState(2)
  lengths = [9, 5, 2]
  T = max(lengths)
  toks = np.zeros((3, T), np.int64)
  mask = np.zeros((3, T), bool)
  for i, n in enumerate(lengths):
    toks[i, T - n:] = rng.randint(0, cfg.vocab_size, n)
    mask[i, T - n:] = True
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  ours = _forward(cfg, params, toks, jnp.asarray(positions), jnp.asarray(mask))
  with torch.no_grad():
    ref = model(torch.tensor(toks), attention_mask=torch.tensor(mask.astype(np.int64)),
                position_ids=torch.tensor(positions)).logits.numpy()
  assert np.abs(ours[mask] - ref[mask]).max() <= 1e-4
  for i, n in enumerate(lengths):
    alone = _forward(cfg, params, toks[i:i + 1, T - n:])
    assert np.abs(ours[i, T - n:] - alone[0]).max() <= 1e-5
  assert np.isfinite(ours).all()  # pad rows attend to nothing: uniform, not NaN


@pytest.mark.parametrize("fam,tie,sampler_layout", [("qwen2", False, False), ("llama", True, False),
                                                    ("qwen2", False, True), ("qwen3", False, True)])
def test_cached_decoding_equals_full_forward(hf_dirs, fam, tie, sampler_layout):
  """Prefill then one-token decode steps reproduce the cache-free forward; `sampler_layout`: the
  sampler's decode path (keys stored transposed, decode steps on `fuse_for_decode` parameters:
  fused q/k/v with Qwen2's biases and Qwen3's q/k norms, fused gate/up)."""
  _, path = hf_dirs[(fam, tie)]
  cfg, params = hf.load_params(path)
  rng = np.random.RandomState(3)
  lengths, new = [6, 3], 7
  P = max(lengths)
  prompt = np.zeros((2, P), np.int32)
  mask = np.zeros((2, P), bool)
  for i, n in enumerate(lengths):
    prompt[i, P - n:] = rng.randint(0, cfg.vocab_size, n)
    mask[i, P - n:] = True
  cont = rng.randint(0, cfg.vocab_size, (2, new)).astype(np.int32)
  full_toks = np.concatenate([prompt, cont], 1)
  full_mask = np.concatenate([mask, np.ones((2, new), bool)], 1)
  full_pos = np.maximum(np.cumsum(full_mask, 1) - 1, 0)
  full = _forward(cfg, params, full_toks, jnp.asarray(full_pos), jnp.asarray(full_mask))

  model = Transformer(cfg)
  apply = jax.jit(lambda p, t, pos, m, c: model.apply({"params": p}, t, pos, m, c))
  cache = init_cache(cfg, 2, P + new + 3)
  logits, cache = apply(params, prompt, full_pos[:, :P], mask, cache)
  steps = [np.asarray(logits)]
  step_params = fuse_for_decode(params) if sampler_layout else params
  if sampler_layout:
    cache = transpose_keys(cache)
    assert "qkv" in step_params["layers_0"]["attn"] and "q" not in step_params["layers_0"]["attn"]
    assert cache.k[0].shape == (2, cfg.n_kv_heads, cfg.head_dim, P + new + 3)
    with pytest.raises(ValueError, match="one token per call"):
      apply(step_params, cont[:, :2], full_pos[:, P:P + 2], np.ones((2, 2), bool), cache)
  for t in range(new):
    logits, cache = apply(step_params, cont[:, t:t + 1], full_pos[:, P + t:P + t + 1],
                          np.ones((2, 1), bool), cache)
    steps.append(np.asarray(logits))
  assert isinstance(cache, KVCache) and int(cache.index) == P + new
  cached = np.concatenate(steps, 1)
  assert np.abs(cached[full_mask] - full[full_mask]).max() <= 1e-5


def test_bf16_compute_close_to_fp32():
  cfg = get_preset("toy-tiny")
  params = init_params(cfg, jax.random.key(0))
  toks = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 12))
  f32 = _forward(cfg, params, toks)
  bf16_cfg = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
  bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  bf16 = _forward(bf16_cfg, bf16_params, toks)
  assert bf16.dtype == np.float32  # logits are returned in fp32 whatever the compute dtype
  assert np.abs(bf16 - f32).max() < 0.05 * np.abs(f32).max() + 0.05


def test_every_parameter_has_logical_axes():
  from smjax.models.transformer import param_logical_axes
  cfg = get_preset("toy-tiny").replace(qkv_bias=True, qk_norm=True)
  axes = param_logical_axes(cfg)
  params = init_params(cfg, jax.random.key(0))
  flat_axes = jax.tree_util.tree_leaves(axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  flat_params = jax.tree_util.tree_leaves(params)
  assert len(flat_axes) == len(flat_params)
  for spec, p in zip(flat_axes, flat_params):
    assert len(spec) == p.ndim and all(isinstance(a, str) for a in spec)


@contextlib.contextmanager
def _unfenced_rope():
  """The decoder with RoPE tables computed in place, no fence (what the fence must equal)."""
  from smjax.models import transformer as tr  # pylint: disable=import-outside-toplevel
  original = tr.rope_cos_sin
  tr.rope_cos_sin = lambda pos, inv: (lambda a: (jnp.cos(a), jnp.sin(a)))(
      pos[..., None].astype(jnp.float32) * inv)
  try:
    yield
  finally:
    tr.rope_cos_sin = original


def test_decode_step_rope_tables_computed_once_and_values_unchanged():
  """A one-token decode step (the sampler's loop body) evaluates its RoPE tables once too: unfenced,
  XLA:CPU evaluated them again in every layer's q and k rotation, per head (8 cosines here), a
  tenth of the sampler benchmark's decode step. Logits and cache equal those of unfenced tables."""
  cfg = get_preset("toy-small")
  assert cfg.n_layers >= 4
  params = fuse_for_decode(init_params(cfg, jax.random.key(0)))
  B, S = 3, 16
  rng = np.random.RandomState(1)
  cache = transpose_keys(init_cache(cfg, B, S))
  cache = cache.replace(
      k=tuple(jnp.asarray(rng.randn(*k.shape), k.dtype) for k in cache.k),
      v=tuple(jnp.asarray(rng.randn(*v.shape), v.dtype) for v in cache.v),
      valid_BS=jnp.asarray(rng.rand(B, S) < 0.7), index=jnp.asarray(9, jnp.int32))
  toks = jnp.asarray(rng.randint(0, cfg.vocab_size, (B, 1)), jnp.int32)
  positions = jnp.asarray([[9], [5], [7]], jnp.int32)
  step = lambda p, pos, c: Transformer(cfg).apply({"params": p}, toks, pos, jnp.ones((B, 1), bool), c)
  hlo = jax.jit(step).lower(params, positions, cache).compile().as_text()
  # Both branches of the CPU fence hold one cosine each; nothing else may.
  assert hlo.count(" cosine(") <= 2, hlo.count(" cosine(")
  fenced = jax.jit(step)(params, positions, cache)
  with _unfenced_rope():
    unfenced_step = jax.jit(lambda p, pos, c: step(p, pos, c))
    assert unfenced_step.lower(params, positions, cache).compile().as_text().count(" cosine(") > 2
    unfenced = unfenced_step(params, positions, cache)
  for a, b in zip(jax.tree.leaves(fenced), jax.tree.leaves(unfenced)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rope_tables_computed_once_and_values_unchanged():
  """The RoPE cos/sin tables are evaluated once per call, not fused into every layer's q and k (and
  their gradients), and fencing them changes no value: the gradient equals that of rotations
  computed from unfenced tables. Without the fence XLA:CPU evaluated 16 cosines in this gradient."""
  cfg = get_preset("toy-small")
  assert cfg.n_layers >= 4
  model = Transformer(cfg)
  B, T = 2, 24
  toks = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (B, T)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  mask = jnp.ones((B, T), bool)
  params = init_params(cfg, jax.random.key(0))
  # Positions as an argument, as every step and the sampler pass them (constant positions let XLA
  # fold the fence's predicate away, and the tables with it).
  loss = lambda p, pos: jnp.sum(model.apply({"params": p}, toks, pos, mask)[0] ** 2)
  # Compiled with a run's fusion emitters (the suite's flags turn them off, conftest.py), whose
  # code the bitwise comparison is about.
  run = lambda: jax.jit(jax.grad(loss)).lower(params, positions).compile(
      compiler_options={"xla_cpu_use_fusion_emitters": True})
  grad = run()
  # Both branches of the CPU fence hold one cosine each; nothing else may.
  cosines = grad.as_text().count(" cosine(")
  assert cosines <= 2, cosines
  fenced = grad(params, positions)
  with _unfenced_rope():
    unfenced = run()(params, positions)
  for a, b in zip(jax.tree.leaves(fenced), jax.tree.leaves(unfenced)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
