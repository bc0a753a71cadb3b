"""The sampler's device programs (smjax.rollout.Sampler runs them): the decode loop's state, how a
token is drawn and recorded, the jitted prefill, and the decode loop in stages.

Decode step (docs/performance.md, `benchmarks/decode_profile.py`): the cache keeps its keys
transposed ([B, K, H, S], `KVCache.keys_transposed`) so that attention over it is two plain
products per row and kv head (`decode_attend`), the loop runs on `fuse_for_decode` parameters
(q/k/v and gate/up each one matmul) when unsharded, and plain sampling (temperature 1, no top-k /
top-p) draws from the same exp pass that gives the log-prob. None of it changes a token: the same
key gives the same completions as the general path, up to float rounding in the logits.

Stages (`decode_stages`): each stage is its own `while_loop` on a cache padded to the slots
filled by the stage's end, so attention reads the filled part of the cache (to within a stage)
rather than all P + C - 1 slots; the tokens are those of one loop. `decode_step_jit` is one loop
iteration jitted alone: its cost analysis on a stage's cache is that stage's per-step FLOPs.

Legend (docs/design.md#shape-legend): B rows (prompts x G), G samples per prompt, P prompt length
(bucketed), C new (completion) tokens, V vocab; stop sets are named in words
(`stop_tokens`: [stop sequences, window]).
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from smjax import sharding as shd
from smjax.sampling import filter_top_k_top_p, inverse_cdf, inverse_cdf_weights
from smjax.models.cache import KVCache, init_cache, transpose_keys
from smjax.models.transformer import Transformer, fuse_for_decode, lm_head, positions_from_mask


@flax.struct.dataclass
class SamplingParams:
  """Per-call sampling settings as arrays, so changing them (greedy included) does not recompile."""
  greedy: jax.Array        # bool scalar
  filtering: jax.Array     # bool scalar: top-k or top-p active (skips the vocab sort otherwise)
  temperature: jax.Array   # f32 scalar
  top_k: jax.Array         # i32 scalar, 0 = off
  top_p: jax.Array         # f32 scalar, 1 = off
  pad_id: jax.Array        # i32 scalar
  eos_ids: jax.Array       # i32 [eos slots], -1 = unused slot
  stop_tokens: jax.Array   # i32 [stop sequences, window], right-aligned, -1 = matches anything
  stop_valid: jax.Array    # bool [stop sequences]


@flax.struct.dataclass
class SamplingState:
  """The decode loop's carry: everything per row lives on device."""
  t: jax.Array               # i32 scalar: completion tokens produced so far = next column
  last_B: jax.Array          # i32: token to feed next
  position_B: jax.Array      # i32: its RoPE position
  cache: KVCache
  uniform_BC: jax.Array      # f32: the uniform that draws each token (see module docstring)
  tokens_BC: jax.Array
  mask_BC: jax.Array
  logprobs_BC: jax.Array
  done_B: jax.Array
  lengths_B: jax.Array
  recent_tokens: jax.Array   # i32 [B, window]: the last emitted tokens, for stop sequences


# --------------------------------------------------------------------------------- sampling

def first_max(logits_BV, max_B1):
  """`jnp.argmax(logits_BV, -1)` (the first maximum; the first NaN if any) given the row maxima
  `max_B1` (NaN where a row has one): a compare and an integer min, which XLA:CPU vectorises,
  where its argmax is a two-operand reduction several times slower at a [64, 4096] decode step."""
  V = logits_BV.shape[-1]
  hit_BV = (logits_BV == max_B1) | jnp.isnan(logits_BV)
  return jnp.min(jnp.where(hit_BV, jnp.arange(V, dtype=jnp.int32), V), axis=-1)


def _sample(logits_BV, u_B, sp: SamplingParams):
  """(token, policy log-prob at temperature 1) per row.

  The log-prob's exp(logits - max) pass is the sampling weights at temperature 1 without top-k /
  top-p (the GRPO default), so that case draws from it instead of taking a second pass."""
  logits_BV = logits_BV.astype(jnp.float32)
  max_B1 = jnp.max(logits_BV, axis=-1, keepdims=True)
  w_BV = jnp.exp(logits_BV - max_B1)
  lse_B = max_B1[:, 0] + jnp.log(jnp.sum(w_BV, axis=-1))

  def warped(_):
    scaled_BV = logits_BV / sp.temperature
    scaled_BV = jax.lax.cond(sp.filtering, filter_top_k_top_p, lambda x, *_: x, scaled_BV,
                             sp.top_k, sp.top_p)
    return inverse_cdf(u_B, scaled_BV)

  def sampled(_):
    plain = ~sp.filtering & (sp.temperature == 1.0)
    return jax.lax.cond(plain, lambda _: inverse_cdf_weights(u_B, w_BV), warped, None)

  greedy = lambda _: first_max(logits_BV, max_B1)
  tok_B = jax.lax.cond(sp.greedy, greedy, sampled, None)
  picked_B = jnp.take_along_axis(logits_BV, tok_B[:, None], axis=-1)[:, 0]
  return tok_B, picked_B - lse_B


def _advance(state: SamplingState, logits_BV, sp: SamplingParams):
  """Samples completion token `state.t` for every row, records it, updates per-row stops."""
  u_B = jax.lax.dynamic_index_in_dim(state.uniform_BC, state.t, axis=1, keepdims=False)
  tok_B, lp_B = _sample(logits_BV, u_B, sp)
  live_B = ~state.done_B
  tok_B = jnp.where(live_B, tok_B, sp.pad_id)
  recent_tokens = jnp.concatenate([state.recent_tokens[:, 1:], tok_B[:, None]], axis=1)
  hit_eos_B = jnp.any(tok_B[:, None] == sp.eos_ids[None, :], axis=-1)
  match = (sp.stop_tokens[None] == recent_tokens[:, None]) | (sp.stop_tokens[None] < 0)
  hit_stop_B = jnp.any(jnp.all(match, axis=-1) & sp.stop_valid[None], axis=-1)
  col = lambda buf, v: buf.at[:, state.t].set(v)
  return state.replace(
      t=state.t + 1, last_B=tok_B, tokens_BC=col(state.tokens_BC, tok_B),
      mask_BC=col(state.mask_BC, live_B),
      logprobs_BC=col(state.logprobs_BC, jnp.where(live_B, lp_B, 0.0)),
      done_B=state.done_B | (live_B & (hit_eos_B | hit_stop_B)),
      lengths_B=state.lengths_B + live_B.astype(jnp.int32), recent_tokens=recent_tokens)


def _constrain(state: SamplingState, mesh) -> SamplingState:
  """Rows over the batch mesh axes; other dims left to the compiler."""
  if mesh is None:
    return state
  def put(x):
    if x.ndim == 0:
      return x
    spec = PartitionSpec(shd.BATCH_AXES, *([PartitionSpec.UNCONSTRAINED] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
  return jax.tree.map(put, state)


# ------------------------------------------------------------------------- jitted programs

_STATIC = ("cfg", "mesh")


@functools.partial(jax.jit,
                   static_argnames=_STATIC + ("max_new_tokens", "num_samples", "cache_len"))
def prefill(params, prompt_BP, mask_BP, real_B, rng, sp: SamplingParams, *, cfg, max_new_tokens,
             num_samples, cache_len, mesh) -> SamplingState:
  """Prompt forward once, cache (`cache_len` slots: the first decode stage's) repeated G times,
  completion token 0 sampled for every row."""
  B, P = prompt_BP.shape
  G, C = num_samples, max_new_tokens
  positions_BP = positions_from_mask(mask_BP)
  cache = init_cache(cfg, B, cache_len)
  hidden_BPD, cache = Transformer(cfg).apply({"params": params}, prompt_BP, positions_BP, mask_BP,
                                             cache, return_hidden=True)
  logits_BV = lm_head(params, cfg, hidden_BPD[:, -1:])[:, 0]  # left-padded: last slot is real
  rep = lambda x: jnp.repeat(x, G, axis=0)
  cache = transpose_keys(KVCache(k=tuple(map(rep, cache.k)), v=tuple(map(rep, cache.v)),
                                valid_BS=rep(cache.valid_BS), index=cache.index))
  R = B * G
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = jax.random.key_data(rng)
  rng = jax.random.wrap_key_data(rng)
  uniform_BC = jax.vmap(lambda r: jax.random.uniform(jax.random.fold_in(rng, r), (C,)))(
      jnp.arange(R))
  window = sp.stop_tokens.shape[1]
  state = SamplingState(
      t=jnp.zeros((), jnp.int32), last_B=jnp.zeros((R,), jnp.int32),
      position_B=rep(jnp.sum(mask_BP, axis=1, dtype=jnp.int32)), cache=cache,
      uniform_BC=uniform_BC,
      tokens_BC=jnp.full((R, C), sp.pad_id, jnp.int32), mask_BC=jnp.zeros((R, C), bool),
      logprobs_BC=jnp.zeros((R, C), jnp.float32),
      done_B=~rep(real_B), lengths_B=jnp.zeros((R,), jnp.int32),
      recent_tokens=jnp.full((R, window), -1, jnp.int32))
  state = _advance(_constrain(state, mesh), rep(logits_BV), sp)
  return _constrain(state, mesh)


def decode_step(params, state: SamplingState, sp: SamplingParams, *, cfg, mesh) -> SamplingState:
  """One loop iteration: feed the last token, sample the next."""
  B = state.last_B.shape[0]
  logits_B1V, cache = Transformer(cfg).apply({"params": params}, state.last_B[:, None],
                                             state.position_B[:, None], jnp.ones((B, 1), bool),
                                             state.cache)
  state = state.replace(cache=cache, position_B=state.position_B + 1)
  return _constrain(_advance(state, logits_B1V[:, 0], sp), mesh)


def decode_params(params, mesh):
  """The decode loop's parameters: fused projections on one device (`fuse_for_decode`), as they
  are on a mesh, whose sharded weights a concatenation would move."""
  return fuse_for_decode(params) if mesh is None else params


# A separately jitted single step: its cost analysis is the per-iteration cost of the loop.
decode_step_jit = jax.jit(decode_step, static_argnames=_STATIC)


def grow_cache(state: SamplingState, cache_len: int) -> SamplingState:
  """The state with its cache padded to `cache_len` slots (new slots empty and invalid)."""
  cache = state.cache
  extra = cache_len - cache.max_len
  if extra == 0:
    return state
  pad = lambda x, axis: jnp.pad(x, [(0, extra if a == axis else 0) for a in range(x.ndim)])
  k_axis = 3 if cache.keys_transposed else 2
  return state.replace(cache=cache.replace(k=tuple(pad(k, k_axis) for k in cache.k),
                                           v=tuple(pad(v, 2) for v in cache.v),
                                           valid_BS=pad(cache.valid_BS, 1)))


def decode_stages(prompt_len: int, max_new_tokens: int, stages: int) -> tuple[tuple[int, int], ...]:
  """The decode loop's stages as (end, cache slots): stage i runs loop iterations t < end_i (t =
  completion tokens so far; iteration t writes slot prompt_len + t - 1 and attends to the slots
  up to it) on a cache of that many slots, so attention reads the filled part of the cache, to
  within a stage, instead of all prompt_len + max_new_tokens - 1 slots. The stages split the
  completion into `stages` spans of equal width (a multiple of 8 tokens); fewer when the
  completion is too short for that many."""
  P, C = prompt_len, max_new_tokens
  width = -(-max(1, -(-(C - 1) // max(stages, 1))) // 8) * 8  # x 8
  out, filled = [], 0
  while True:
    filled = min(filled + width, C - 1)
    out.append((filled + 1, P + filled))
    if filled >= C - 1:
      return tuple(out)


def _decode_loop_fn(params, state: SamplingState, cache: KVCache, sp: SamplingParams, *, cfg,
                    stages, mesh) -> SamplingState:
  """The decode loop: one `while_loop` per stage (`decode_stages`), the cache padded between."""
  params = decode_params(params, mesh)
  state = state.replace(cache=cache)
  body = lambda s: decode_step(params, s, sp, cfg=cfg, mesh=mesh)
  for end, cache_len in stages:
    state = _constrain(grow_cache(state, cache_len), mesh)
    cond = lambda s, end=end: (s.t < end) & ~jnp.all(s.done_B)
    state = jax.lax.while_loop(cond, body, state)
  return state


# The state's buffers are reused for the result; a cache that grows between stages cannot be.
decode_loop = jax.jit(_decode_loop_fn, static_argnames=_STATIC + ("stages",),
                       donate_argnames=("state", "cache"))
decode_loop_growing = jax.jit(_decode_loop_fn, static_argnames=_STATIC + ("stages",),
                               donate_argnames=("state",))
