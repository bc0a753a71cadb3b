"""The decoder's KV cache (smjax.models.transformer): per-layer keys and values, which slots hold
real tokens, the next write slot, and the sampler's decode layout with keys transposed.

Letters (the project's legend, docs/design.md#shape-legend): B rows, S key slots, K kv heads,
H head dim.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
  """Per-layer keys and values over S slots, which slots hold real tokens, and the next write slot.

  All rows share `index` (prompts are left-padded to one length), so prefill and decode write the
  same slots for every row and `valid_BS` carries the per-row padding.

  `keys_transposed` (static): keys stored [B, K, H, S], slots minor, the layout the sampler's
  decode step reads best (`decode_attend`: a plain [r, H] @ [H, S] score product per row and kv
  head); otherwise [B, K, S, H] like the values. Either layout gives the same attention. A
  transposed cache takes one token per call (decode steps): prefill a plain one and
  `transpose_keys` it (T > 1 against transposed keys made XLA:CPU pick a dot it cannot run in
  bf16).
  """
  # Heads before slots, so a decode step reads each head's keys contiguously (the [B, S, K, H]
  # layout makes XLA transpose the whole cache every layer and step).
  k: tuple[jax.Array, ...]  # L x [B, K, S, H], or [B, K, H, S] with keys_transposed
  v: tuple[jax.Array, ...]  # L x [B, K, S, H]
  valid_BS: jax.Array       # bool
  index: jax.Array          # int32 scalar
  keys_transposed: bool = flax.struct.field(pytree_node=False, default=False)

  @property
  def max_len(self) -> int:
    return self.valid_BS.shape[1]


def init_cache(cfg, batch: int, max_len: int, dtype: Any = None) -> KVCache:
  """An empty cache of `max_len` slots for `batch` rows of the decoder `cfg` (a ModelConfig: its
  n_layers, n_kv_heads, head_dim and compute dtype; the cache needs nothing else of it, so this
  module does not import the decoder's)."""
  dtype = cfg.jnp_dtype if dtype is None else dtype
  shape = (batch, cfg.n_kv_heads, max_len, cfg.head_dim)
  zeros = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers))
  return KVCache(k=zeros, v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)),
                 valid_BS=jnp.zeros((batch, max_len), bool), index=jnp.zeros((), jnp.int32))


def transpose_keys(cache: KVCache) -> KVCache:
  """A plain cache with its keys moved to the decode layout [B, K, H, S] (see KVCache)."""
  if cache.keys_transposed:
    return cache
  return cache.replace(k=tuple(k.transpose(0, 1, 3, 2) for k in cache.k), keys_transposed=True)
