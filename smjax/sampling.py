"""Token choice for the sampler: top-k / top-p filtering and inverse-CDF draws over the vocabulary.

Legend (docs/design.md#shape-legend): B rows, V vocab; the two-level cdf names its vocabulary blocks
in words (`_Bblocks`: one value per block, `_Bblock`: one per token of a block).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def filter_top_k_top_p(scaled_BV, top_k, top_p):
  """-inf outside top-k (ties at the k-th value kept), then outside the smallest top-p nucleus of
  the renormalised top-k distribution (HF warper order)."""
  V = scaled_BV.shape[-1]
  sorted_BV = -jnp.sort(-scaled_BV, axis=-1)
  k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)
  kth_B1 = jax.lax.dynamic_slice_in_dim(sorted_BV, k - 1, 1, axis=-1)
  in_k_BV = jnp.arange(V) < k
  probs_BV = jax.nn.softmax(jnp.where(in_k_BV, sorted_BV, -jnp.inf), axis=-1)
  mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
  # top_p >= 1 keeps all of top-k even where rounding pushes the running mass to 1.
  in_p_BV = (mass_before_BV < top_p) | (top_p >= 1.0)
  n_keep_B1 = jnp.sum(in_p_BV & in_k_BV, axis=-1, keepdims=True)
  pth_B1 = jnp.take_along_axis(sorted_BV, jnp.maximum(n_keep_B1, 1) - 1, axis=-1)
  keep_BV = (scaled_BV >= kth_B1) & (scaled_BV >= pth_B1)
  return jnp.where(keep_BV, scaled_BV, -jnp.inf)


def inverse_cdf(u_B, scaled_BV):
  """The token i with cdf[i-1] <= u·total < cdf[i] under softmax(scaled_BV), u ~ U[0, 1).

  Gumbel-max would need V random numbers per row and a full-vocab cumsum is slow on CPU, so the
  cdf is taken in two levels: over blocks of ~sqrt(V) tokens, then inside the chosen block. The
  clamps only act when rounding puts u·total outside the sums; they keep zero-weight tokens
  (top-k/top-p exclusions, vocab padding) unreachable.
  """
  return inverse_cdf_weights(u_B, jnp.exp(scaled_BV - jnp.max(scaled_BV, axis=-1, keepdims=True)))


def inverse_cdf_weights(u_B, w_BV):
  """`inverse_cdf` from unnormalised weights w = exp(scaled - max(scaled)) (>= 0, the largest 1),
  for a caller that has them already."""
  B, V = w_BV.shape
  blk = 1 << max(0, math.ceil(math.log2(math.sqrt(V))))
  nb = -(-V // blk)
  w_Bblocks_block = jnp.pad(w_BV, ((0, 0), (0, nb * blk - V))).reshape(B, nb, blk)
  bsum_Bblocks = jnp.sum(w_Bblocks_block, axis=-1)
  bcum_Bblocks = jnp.cumsum(bsum_Bblocks, axis=-1)
  target_B = u_B * bcum_Bblocks[:, -1]
  last_blk_B = jnp.max(jnp.where(bsum_Bblocks > 0, jnp.arange(nb), 0), axis=-1)
  j_B = jnp.minimum(jnp.sum(bcum_Bblocks <= target_B[:, None], axis=-1), last_blk_B)
  pick = lambda x_Bblocks: jnp.take_along_axis(x_Bblocks, j_B[:, None], axis=1)[:, 0]
  w_Bblock = jnp.take_along_axis(w_Bblocks_block, j_B[:, None, None], axis=1)[:, 0]
  cdf_Bblock = (pick(bcum_Bblocks) - pick(bsum_Bblocks))[:, None] + jnp.cumsum(w_Bblock, axis=-1)
  pos_Bblock = w_Bblock > 0
  first_B = jnp.argmax(pos_Bblock, axis=-1)
  last_B = blk - 1 - jnp.argmax(pos_Bblock[:, ::-1], axis=-1)
  i_B = jnp.clip(jnp.sum(cdf_Bblock <= target_B[:, None], axis=-1), first_B, last_B)
  return (j_B * blk + i_B).astype(jnp.int32)
