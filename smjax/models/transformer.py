"""One pure-functional Flax Linen decoder for the Qwen2/Qwen2.5, Qwen3 and Llama 3 families.

The families differ only by flags on `ModelConfig`: QKV bias (Qwen2), per-head q/k RMSNorm (Qwen3),
llama3 RoPE frequency scaling (Llama 3.1/3.2), tied or untied embeddings. Everything else is shared:
RMSNorm, rotary embeddings (the rotate-half convention of HF), grouped-query attention and SwiGLU.

`model.apply({"params": p}, tokens_BT, positions_BT, mask_BT, cache)` returns `(logits_BTV, cache)`.
Without a cache the call is an ordinary causal forward. With a `KVCache` the T new tokens are written
at slots `[cache.index, cache.index + T)` and attend to every earlier valid slot, so the same call
serves prefill (T = prompt length) and decode (T = 1). `mask_BT` marks real tokens; left padding is
masked out of the keys, and `positions_BT` carries the RoPE positions (for a left-padded row,
`cumsum(mask) - 1`), so padding never changes a real token's logits.

Packed rows (`packed=PackedRows(...)`, no cache): the tokens come as one stream [1, T], the
prompts and then only the completion tokens that matter, without padding; every per-token op runs
on the stream and only attention moves to the padded rows (smjax.models.attention). The call
returns the rows a score reads (`PackedRows.scored_rows`: each prompt's last column, then the
completion slots), which the last layer computes alone.

Letters (the project's legend, docs/design.md#shape-legend): B rows, T query time, S key slots,
D model dim, N query heads, K kv heads, H head dim, F mlp dim, V vocab, L layers; RoPE tables are
[B, T, H/2] (`_BT_half`).

Every weight matmul (projections, MLP, LM head) runs as one 2-D `[rows, D] @ [D, out]` product on
the flattened rows (`dense`): XLA's CPU backward of the 3-D einsums (BTD,DNH->BTNH, ...) is much
slower than the same FLOPs as 2-D matmuls (docs/performance.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from smjax.models.attention import PackedRows, attend, decode_attend, packed_attention
from smjax.models.cache import KVCache

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3 RoPE frequency scaling ("rope_type": "llama3" in HF configs)."""
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and family flags of a decoder. Hashable, so it can be closed over by jitted code."""
  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  d_ff: int
  max_seq_len: int = 2048
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  rms_norm_eps: float = 1e-6
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = False
  param_dtype: str = "float32"
  dtype: str = "float32"  # compute dtype of activations; norms, softmax and logits stay float32
  name: str = "custom"

  def __post_init__(self):
    for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff"):
      if getattr(self, field) <= 0:
        raise ValueError(f"ModelConfig.{field}={getattr(self, field)} must be positive")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"ModelConfig: n_heads={self.n_heads} must be a multiple of "
                       f"n_kv_heads={self.n_kv_heads} (grouped-query attention)")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE")
    for field in ("param_dtype", "dtype"):
      if getattr(self, field) not in _DTYPES:
        raise ValueError(f"ModelConfig.{field}={getattr(self, field)!r}; expected one of "
                         f"{sorted(_DTYPES)}")

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  def num_params(self, *, include_embedding: bool = True) -> int:
    """Analytic parameter count (used by the FLOP ledger's 'useful' figure and by presets)."""
    d, n, k, h, f = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.d_ff
    attn = d * n * h + 2 * d * k * h + n * h * d
    if self.qkv_bias:
      attn += n * h + 2 * k * h
    if self.qk_norm:
      attn += 2 * h
    layer = attn + 3 * d * f + 2 * d
    total = self.n_layers * layer + d
    if include_embedding:
      total += self.vocab_size * d * (1 if self.tie_embeddings else 2)
    return total


def positions_from_mask(mask_BT) -> jax.Array:
  """RoPE positions of left-padded rows: each real token's index among its row's real tokens
  (`cumsum(mask) - 1`; 0 on the left padding)."""
  return jnp.maximum(jnp.cumsum(mask_BT, axis=1, dtype=jnp.int32) - 1, 0)


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
  """Inverse frequencies [H/2], with llama3 scaling when configured (as HF computes them)."""
  h = cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
  sc = cfg.rope_scaling
  if sc is None:
    return inv_freq
  low_wavelen = sc.original_max_position_embeddings / sc.low_freq_factor
  high_wavelen = sc.original_max_position_embeddings / sc.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = jnp.where(wavelen > low_wavelen, inv_freq / sc.factor, inv_freq)
  smooth = (sc.original_max_position_embeddings / wavelen - sc.low_freq_factor) / (
      sc.high_freq_factor - sc.low_freq_factor)
  smoothed = (1 - smooth) * scaled / sc.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, smoothed, scaled)


def rope_cos_sin(positions_BT: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, T, H/2] (float32) of the RoPE angles; computed once, shared by all layers."""
  angles_BT_half = positions_BT[..., None].astype(jnp.float32) * inv_freq
  tables = lambda a: (jnp.cos(a), jnp.sin(a))
  # Without a fence XLA fuses cos/sin into every consumer and evaluates them again per head, per
  # layer, forward and backward. XLA:CPU drops optimization barriers before it fuses (a toy-small
  # forward then held 8 cosines, its gradient 16), so there the tables come out of a conditional,
  # which no fusion crosses; its predicate is always true in practice and both branches are the
  # same, so it never changes a value (the step stays bit-identical, and faster). A one-token
  # decode step needs the fence as much: its tables are small, but unfenced every layer's q and k
  # RoPE evaluated them again per head (24x the trig of the 64 x 32 tables at the sampler
  # benchmark's size, a tenth of the step). Elsewhere the barrier stands.
  def fenced_cpu(a):
    return jax.lax.cond(jnp.min(positions_BT) > jnp.iinfo(jnp.int32).min, tables, tables, a)
  return jax.lax.platform_dependent(
      angles_BT_half, cpu=fenced_cpu, default=lambda a: jax.lax.optimization_barrier(tables(a)))


def rotate(x_BTNH: jax.Array, cos_BT_half: jax.Array, sin_BT_half: jax.Array) -> jax.Array:
  """Rotate-half RoPE with precomputed cos/sin, in float32 and cast back.

  HF's x * cat(cos, cos) + cat(-x2, x1) * cat(sin, sin), written per half (x = [x1, x2]): the
  same float32 products and sums without the full-width cos/sin and rotated copies, which a small
  GRPO step on CPU pays for in time."""
  x = x_BTNH.astype(jnp.float32)
  half = x.shape[-1] // 2
  x1, x2 = x[..., :half], x[..., half:]
  c, s = cos_BT_half[:, :, None, :], sin_BT_half[:, :, None, :]
  return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x_BTNH.dtype)


class RMSNorm(nn.Module):
  eps: float
  param_dtype: Any
  axis_name: str = "norm"

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                       (x.shape[-1],), self.param_dtype)
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    # HF casts back to the input dtype before the weight multiply.
    return scale.astype(x.dtype) * xf.astype(x.dtype)


def dense(x_BTD: jax.Array, w: jax.Array, *, preferred_element_type=None) -> jax.Array:
  """x [..., D] @ w [D, out...] -> [..., out...] as one 2-D matmul over the flattened leading rows.

  The trailing weight axes (heads, head dim) are flattened too, so forward and backward are plain
  [rows, D] @ [D, out] products, which XLA's CPU backend runs well (see the module docstring)."""
  lead, D = x_BTD.shape[:-1], x_BTD.shape[-1]
  if w.shape[0] != D:
    raise ValueError(f"dense: x {x_BTD.shape} and weight {w.shape} disagree on D={D}")
  out = w.shape[1:]
  y = jnp.dot(x_BTD.reshape(-1, D), w.reshape(D, -1),
              preferred_element_type=preferred_element_type)
  return y.reshape(*lead, *out)


def _dense_init(fan_in_axes_size):
  del fan_in_axes_size
  return nn.initializers.normal(stddev=0.02)


class Attention(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, rope_BT_half, mask_BT, layer_cache, cache_index, packed=None,
               scored_only=False):
    """`scored_only` (packed only): queries and output for `packed.scored_rows` alone."""
    cfg = self.cfg
    D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    dt, pdt = cfg.jnp_dtype, cfg.jnp_param_dtype

    def proj(name, heads, axes, x=x_BTD):
      w = self.param(name, nn.with_logical_partitioning(_dense_init(D), ("embed", axes, "head_dim")),
                     (D, heads, H), pdt)
      y = dense(x, w.astype(dt))  # BTD,DNH->BTNH
      if cfg.qkv_bias:
        b = self.param(name + "_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, (axes, "head_dim")), (heads, H), pdt)
        y = y + b.astype(dt)
      return y

    q_rows = packed.scored_rows if scored_only else lambda x: x
    if self.has_variable("params", "qkv"):  # decode layout (fuse_for_decode): one product
      if packed is not None:
        raise ValueError("Attention: fused decode parameters (fuse_for_decode) take no packed rows")
      qkv_BTGH = dense(x_BTD, self.get_variable("params", "qkv").astype(dt))  # G = N + 2K
      if cfg.qkv_bias:
        qkv_BTGH = qkv_BTGH + self.get_variable("params", "qkv_bias").astype(dt)
      q_BTNH, k_BTKH, v_BTKH = jnp.split(qkv_BTGH, (N, N + K), axis=-2)
    else:
      q_BTNH = proj("q", N, "q_heads", q_rows(x_BTD))
      k_BTKH = proj("k", K, "kv_heads")
      v_BTKH = proj("v", K, "kv_heads")
    if cfg.qk_norm:
      q_BTNH = RMSNorm(cfg.rms_norm_eps, pdt, "head_dim", name="q_norm")(q_BTNH)
      k_BTKH = RMSNorm(cfg.rms_norm_eps, pdt, "head_dim", name="k_norm")(k_BTKH)
    q_BTNH = rotate(q_BTNH, *map(q_rows, rope_BT_half))
    k_BTKH = rotate(k_BTKH, *rope_BT_half)
    wo = self.param("o", nn.with_logical_partitioning(_dense_init(N * H),
                                                      ("q_heads", "head_dim", "embed")),
                    (N, H, D), pdt)
    if packed is not None:
      heads = packed_attention(packed, q_BTNH, k_BTKH, v_BTKH, mask_BT, dt)  # [1, ., N·H]
      return dense(heads, wo.astype(dt).reshape(N * H, D)), None

    B, T = x_BTD.shape[:2]
    k_BKTH = k_BTKH.transpose(0, 2, 1, 3)
    v_BKTH = v_BTKH.transpose(0, 2, 1, 3)
    if layer_cache is None:
      keys_BKSH, values_BKSH, valid_BS = k_BKTH, v_BKTH, mask_BT
      q_slot_T = jnp.arange(T)
      k_slot_S = jnp.arange(T)
      new_layer_cache = None
    else:
      ck, cv, cvalid, keys_transposed = layer_cache
      if keys_transposed:  # [B, K, H, S]: decode steps only (KVCache)
        if T != 1:
          raise ValueError(f"Attention: a cache with transposed keys takes one token per call, "
                           f"got {T}; fill a plain cache, then `transpose_keys` it")
        new_keys = jax.lax.dynamic_update_slice(ck, k_BKTH.transpose(0, 1, 3, 2).astype(ck.dtype),
                                                (0, 0, 0, cache_index))
      else:
        new_keys = keys_BKSH = jax.lax.dynamic_update_slice(ck, k_BKTH.astype(ck.dtype),
                                                            (0, 0, cache_index, 0))
      values_BKSH = jax.lax.dynamic_update_slice(cv, v_BKTH.astype(cv.dtype),
                                                 (0, 0, cache_index, 0))
      valid_BS = cvalid
      q_slot_T = cache_index + jnp.arange(T)
      k_slot_S = jnp.arange(cv.shape[2])
      new_layer_cache = (new_keys, values_BKSH)

    visible_BTS = (k_slot_S[None, None, :] <= q_slot_T[None, :, None]) & valid_BS[:, None, :]
    if layer_cache is not None and layer_cache[3]:  # a decode step
      heads = decode_attend(q_BTNH, new_keys, values_BKSH, visible_BTS[:, 0], dt)  # [B, 1, N·H]
    else:
      heads = attend(q_BTNH, keys_BKSH, values_BKSH, visible_BTS, dt)  # [B, T, N·H]
    # BTNH,NHD->BTD as [M, N·H] @ [N·H, D].
    return dense(heads, wo.astype(dt).reshape(N * H, D)), new_layer_cache


class MLP(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.cfg
    dt, pdt = cfg.jnp_dtype, cfg.jnp_param_dtype
    D, F = cfg.d_model, cfg.d_ff
    init = nn.initializers.normal(stddev=0.02)
    down = lambda: self.param("down", nn.with_logical_partitioning(init, ("mlp", "embed")), (F, D),
                              pdt)
    if self.has_variable("params", "gate_up"):  # decode layout (fuse_for_decode): one product
      g_BTF, u_BTF = jnp.split(dense(x_BTD, self.get_variable("params", "gate_up").astype(dt)),
                               2, axis=-1)
      w_down = down()
    else:  # gate, up, down: the order init draws them in
      gate = self.param("gate", nn.with_logical_partitioning(init, ("embed", "mlp")), (D, F), pdt)
      up = self.param("up", nn.with_logical_partitioning(init, ("embed", "mlp")), (D, F), pdt)
      w_down = down()
      g_BTF = dense(x_BTD, gate.astype(dt))
      u_BTF = dense(x_BTD, up.astype(dt))
    return dense(nn.silu(g_BTF) * u_BTF, w_down.astype(dt))


class Block(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, rope_BT_half, mask_BT, layer_cache, cache_index, packed=None,
               scored_only=False):
    cfg = self.cfg
    pdt = cfg.jnp_param_dtype
    h = RMSNorm(cfg.rms_norm_eps, pdt, name="input_norm")(x_BTD)
    attn_out, new_layer_cache = Attention(cfg, name="attn")(h, rope_BT_half, mask_BT, layer_cache,
                                                            cache_index, packed, scored_only)
    if scored_only:
      x_BTD = packed.scored_rows(x_BTD)
    x_BTD = x_BTD + attn_out
    h = RMSNorm(cfg.rms_norm_eps, pdt, name="post_attn_norm")(x_BTD)
    return x_BTD + MLP(cfg, name="mlp")(h), new_layer_cache


class Transformer(nn.Module):
  """The decoder. See the module docstring for the call contract."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BT, positions_BT=None, mask_BT=None, cache: KVCache | None = None, *,
               return_hidden: bool = False, packed: PackedRows | None = None):
    cfg = self.cfg
    dt, pdt = cfg.jnp_dtype, cfg.jnp_param_dtype
    B, T = tokens_BT.shape
    if mask_BT is None:
      mask_BT = jnp.ones((B, T), bool)
    mask_BT = mask_BT.astype(bool)
    if positions_BT is None:
      positions_BT = positions_from_mask(mask_BT)
      if cache is not None:
        raise ValueError("Transformer: positions_BT is required when decoding with a cache")
    embedding = self.param("embed", nn.with_logical_partitioning(
        nn.initializers.normal(stddev=0.02), ("vocab", "embed")), (cfg.vocab_size, cfg.d_model), pdt)
    x_BTD = jnp.take(embedding, tokens_BT, axis=0).astype(dt)

    if packed is not None and (cache is not None or B != 1 or T <= packed.prompt_tokens):
      raise ValueError("Transformer: packed rows take no cache and tokens as one stream [1, L] of "
                       f"the {packed.prompt_tokens} prompt tokens and the completion slots; got "
                       f"tokens {tokens_BT.shape}, cache {cache is not None}")

    cache_index = None
    if cache is not None:
      cache_index = cache.index
      valid_BS = jax.lax.dynamic_update_slice(cache.valid_BS, mask_BT, (0, cache_index))
    new_k, new_v = [], []
    rope_BT_half = rope_cos_sin(positions_BT, rope_inv_freq(cfg))  # (cos, sin), shared by the layers
    for layer in range(cfg.n_layers):
      layer_cache = None if cache is None else (cache.k[layer], cache.v[layer], valid_BS,
                                                cache.keys_transposed)
      # A packed stream's last layer runs its queries, MLP and the final norm on the rows a
      # score reads alone (PackedRows.scored_rows), so a packed call returns those rows.
      last = packed is not None and layer == cfg.n_layers - 1
      x_BTD, new_layer_cache = Block(cfg, name=f"layers_{layer}")(
          x_BTD, rope_BT_half, mask_BT, layer_cache, cache_index, packed, last)
      if new_layer_cache is not None:
        new_k.append(new_layer_cache[0])
        new_v.append(new_layer_cache[1])
    x_BTD = RMSNorm(cfg.rms_norm_eps, pdt, name="final_norm")(x_BTD)
    new_cache = None
    if cache is not None:
      new_cache = KVCache(k=tuple(new_k), v=tuple(new_v), valid_BS=valid_BS,
                          index=cache.index + T, keys_transposed=cache.keys_transposed)
    if return_hidden:
      return x_BTD, new_cache
    if cfg.tie_embeddings:
      head_DV = embedding.T
    else:
      head_DV = self.param("lm_head", nn.with_logical_partitioning(
          nn.initializers.normal(stddev=0.02), ("embed", "vocab")), (cfg.d_model, cfg.vocab_size),
                           pdt)
    logits_BTV = dense(x_BTD, head_DV.astype(dt), preferred_element_type=jnp.float32)
    return logits_BTV, new_cache


def lm_head(params, cfg: ModelConfig, hidden_BTD: jax.Array) -> jax.Array:
  """Logits from final hidden states (for losses that chunk the vocabulary projection), under the
  name scope `lm_head`, which profiles read (benchmarks/real_model_profile.py)."""
  head_DV = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
  with jax.named_scope("lm_head"):
    return dense(hidden_BTD, head_DV.astype(cfg.jnp_dtype), preferred_element_type=jnp.float32)


def fuse_for_decode(params):
  """The same parameters with each layer's q, k and v projections (and biases) as one `qkv`
  [D, N + 2K, H] and the MLP's gate and up as one `gate_up` [D, 2F]: the decoder reads either
  layout and computes the same values, the fused one as two matmuls fewer per layer. The sampler
  uses it for its decode loop, where the rows are few (the batch) and XLA:CPU runs a [rows, D]
  @ [D, 2F] product faster than two of [D, F] (docs/performance.md). Unsharded use: concatenating
  weights split over a mesh's tensor axis would move them."""
  out = dict(params)
  for name, layer in params.items():
    if not name.startswith("layers_"):
      continue
    attn, mlp = dict(layer["attn"]), dict(layer["mlp"])
    attn["qkv"] = jnp.concatenate([attn.pop("q"), attn.pop("k"), attn.pop("v")], axis=1)
    if "q_bias" in attn:
      attn["qkv_bias"] = jnp.concatenate([attn.pop("q_bias"), attn.pop("k_bias"),
                                          attn.pop("v_bias")], axis=0)
    mlp["gate_up"] = jnp.concatenate([mlp.pop("gate"), mlp.pop("up")], axis=1)
    out[name] = dict(layer, attn=attn, mlp=mlp)
  return out


@functools.lru_cache(maxsize=None)
def _jitted_init(cfg: ModelConfig):
  """The model's parameters (boxed with their logical axes) from a key: one jitted program."""
  return jax.jit(lambda rng: Transformer(cfg).init(rng, jnp.zeros((1, 1), jnp.int32),
                                                   jnp.zeros((1, 1), jnp.int32))["params"])


def init_params(cfg: ModelConfig, rng: jax.Array, *, boxed: bool = False):
  """Parameters on the default device (tests and the toy study; sharded init is in sharding.py).
  One jitted program per config: op by op, the init's forward pass would compile and dispatch a
  hundred small programs (about a second of a short run's start on a CPU)."""
  params = _jitted_init(cfg)(rng)
  return params if boxed else nn.unbox(params)


def param_logical_axes(cfg: ModelConfig):
  """A pytree of logical axis-name tuples matching the parameters, computed without allocating."""
  return nn.get_partition_spec(jax.eval_shape(_jitted_init(cfg), jax.random.key(0)))


def count_params(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
