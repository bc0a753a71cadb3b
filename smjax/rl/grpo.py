"""GRPO algorithm core: group advantages, the clipped per-token objective, aggregation, metrics.

The single source of truth for the GRPO math (docs/design.md#grpo), in plain jnp: `grpo_loss` and
`grpo_loss_from_rewards` run the functions below on whole arrays. The fused Pallas kernel in
kernels/group_advantage.py calls the same per-token and per-row functions on its blocks; which of
the two runs is decided in one place, smjax.kernels.dispatch (this module imports no kernel).

Rows are ordered [prompt0 x G, prompt1 x G, ...]. Every loss returns (loss, aux) where aux holds
float scalars the train step logs. Numbers are computed in float32 (float64 if given float64).

Gradient accumulation: the step may split a batch into micro-batches (each holding whole groups)
and add the micro-batch losses. Pass the *global* `num_valid_tokens` (token_mean) and
`num_sequences` (the seq_mean_* modes) computed from the whole batch's mask; the sum of the
micro-batch losses (and gradients) then equals the full-batch loss. Without them each call
normalises by its own counts. Ratio/clip/KL metrics in aux are always micro-batch means.

Legend (docs/design.md#shape-legend): B rows (prompts x G), G group size, T target positions (the
scored completion columns), V vocab; per-row statistics are `stats` [B, NUM_STATS] (STAT_NAMES).
"""

import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp

from smjax.rl.logprobs import compute_dtype as _compute_dtype

ADVANTAGE_MODES = ("grpo", "drgrpo", "rloo")
KL_ESTIMATORS = ("k3", "k1")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")

# Per-row statistics: both implementations produce `stats` [B, NUM_STATS] with these columns; sums
# run over the row's valid tokens. `finalize` turns them into the loss and the metrics.
STAT_NAMES = ("loss_sum", "pg_sum", "kl_sum", "clip_low", "clip_high", "ratio_sum",
              "ratio_max", "ratio_min", "n_valid", "advantage")
COL = {name: i for i, name in enumerate(STAT_NAMES)}
NUM_STATS = len(STAT_NAMES)


# ----------------------------------------------------------------------------- advantages


def check_group_args(rewards_B, *, group_size, mode, name="rewards_B"):
  """Raises ValueError unless rewards_B is [B] with B a multiple of group_size and mode known."""
  if mode not in ADVANTAGE_MODES:
    raise ValueError(f"advantage {mode=} must be one of {ADVANTAGE_MODES}")
  if not isinstance(group_size, numbers.Integral) or group_size < 1:
    raise ValueError(f"{group_size=} must be a positive int")
  if mode in ("grpo", "rloo") and group_size < 2:
    raise ValueError(f"{group_size=} must be >= 2 for {mode=} (std / leave-one-out need 2 samples)")
  if rewards_B.ndim != 1:
    raise ValueError(f"{name} must be 1-D [B], got shape {rewards_B.shape}")
  if rewards_B.shape[0] % group_size:
    raise ValueError(f"{name} batch {rewards_B.shape[0]} must be a multiple of {group_size=}")


def advantage_from_group(reward_B1, group_BG, *, group_size, mode, eps):
  """Advantage of each row from its own reward [B, 1] and its group's rewards [B, >=G].

  Lanes of group_BG past group_size are padding (the kernel pads G to a power of two) and are
  ignored. Only lane reductions with keepdims, so the kernel can call this on a block.
  grpo: (r - mean) / (std + eps) with the unbiased (G-1) std, as TRL and Tunix; drgrpo: r - mean;
  rloo: r - mean of the other G-1 rewards. A group whose rewards are all equal gets exactly 0.
  """
  g = float(group_size)
  lane = jax.lax.broadcasted_iota(jnp.int32, group_BG.shape, 1)
  member = lane < group_size
  mean = jnp.sum(jnp.where(member, group_BG, 0.0), axis=1, keepdims=True) / g
  hi = jnp.max(jnp.where(member, group_BG, -jnp.inf), axis=1, keepdims=True)
  lo = jnp.min(jnp.where(member, group_BG, jnp.inf), axis=1, keepdims=True)
  centered = reward_B1 - mean
  if mode == "grpo":
    dev = jnp.where(member, group_BG - mean, 0.0)
    std = jnp.sqrt(jnp.sum(dev * dev, axis=1, keepdims=True) / (g - 1.0))
    adv = centered / (std + eps)
  elif mode == "drgrpo":
    adv = centered
  elif mode == "rloo":
    adv = centered * (g / (g - 1.0))  # r_i - (sum - r_i)/(G-1) == G/(G-1) (r_i - mean)
  else:
    raise ValueError(f"advantage {mode=} must be one of {ADVANTAGE_MODES}")
  # Exact zero for constant groups: mean rounding would otherwise leave ~1e-8/(std+eps) noise.
  return jnp.where(hi == lo, 0.0, adv)


def group_rewards_matrix(rewards_B, *, group_size, width=None):
  """[B, width] array whose row b holds the G rewards of b's group (zero-padded to width)."""
  num_groups = rewards_B.shape[0] // group_size
  group_BG = jnp.repeat(rewards_B.reshape(num_groups, group_size), group_size, axis=0)
  if width is not None and width > group_size:
    group_BG = jnp.pad(group_BG, ((0, 0), (0, width - group_size)))
  return group_BG


def group_advantages(rewards_B, *, group_size, mode="grpo", eps=1e-6):
  """Per-row advantages [B] from rewards [B] ordered [prompt0 x G, prompt1 x G, ...]."""
  rewards_B = jnp.asarray(rewards_B)
  check_group_args(rewards_B, group_size=group_size, mode=mode)
  rewards_B = rewards_B.astype(_compute_dtype(rewards_B))
  group_BG = group_rewards_matrix(rewards_B, group_size=group_size)
  adv_B1 = advantage_from_group(rewards_B[:, None], group_BG, group_size=group_size, mode=mode,
                                eps=eps)
  return adv_B1[:, 0]


def reward_metrics(rewards_B, *, group_size):
  """Batch reward statistics and the fraction of groups whose rewards are all equal (no signal)."""
  rewards_B = jnp.asarray(rewards_B)
  check_group_args(rewards_B, group_size=group_size, mode="drgrpo")
  r = rewards_B.astype(_compute_dtype(rewards_B))
  by_group = r.reshape(-1, group_size)  # [groups, G]
  return {
      "reward_mean": jnp.mean(r),
      "reward_std": jnp.std(r),
      "reward_min": jnp.min(r),
      "reward_max": jnp.max(r),
      "frac_groups_zero_std": jnp.mean(
          (jnp.max(by_group, 1) == jnp.min(by_group, 1)).astype(r.dtype)),
  }


# ----------------------------------------------------------------------------- per-token terms


class TokenTerms(NamedTuple):
  loss: jax.Array  # pg + beta * kl
  pg: jax.Array  # -min(rho A, clip(rho) A)
  kl: jax.Array  # k3 or k1 estimate of KL(pi || ref); zeros without ref
  ratio: jax.Array  # rho = exp(logp - old_logp)
  clip_low: jax.Array  # bool: A < 0 and rho < 1 - eps_low (gradient cut)
  clip_high: jax.Array  # bool: A > 0 and rho > 1 + eps_high (gradient cut)


def token_terms(logp, old_logp, ref_logp, adv, mask, *, eps_low, eps_high, beta, kl_estimator):
  """Elementwise GRPO terms; adv broadcasts against logp ([B, 1] against [B, T]).

  Masked positions are replaced by 0 before any exp, so padding holding -inf/NaN stays harmless
  (also for the gradient). ref_logp may be None (then kl is 0).
  """
  valid = mask > 0
  logp = jnp.where(valid, logp, 0.0)
  old_logp = jnp.where(valid, old_logp, 0.0)
  ratio = jnp.exp(logp - old_logp)
  clipped = jnp.minimum(jnp.maximum(ratio, 1.0 - eps_low), 1.0 + eps_high)
  pg = -jnp.minimum(ratio * adv, clipped * adv)
  clip_low = valid & (adv < 0) & (ratio < 1.0 - eps_low)
  clip_high = valid & (adv > 0) & (ratio > 1.0 + eps_high)
  if ref_logp is None:
    kl = jnp.zeros_like(ratio)
  else:
    diff = jnp.where(valid, ref_logp, 0.0) - logp
    kl = jnp.exp(diff) - diff - 1.0 if kl_estimator == "k3" else -diff
  return TokenTerms(pg + beta * kl, pg, kl, ratio, clip_low, clip_high)


def token_loss_grad(logp, old_logp, ref_logp, adv, mask, *, eps_low, eps_high, beta,
                    kl_estimator):
  """d(loss_t * mask_t)/d logp_t, written out for the kernel's backward pass.

  Matches autodiff of token_terms except exactly at rho == 1 +- eps (a measure-zero tie).
  """
  valid = mask > 0
  logp = jnp.where(valid, logp, 0.0)
  ratio = jnp.exp(logp - jnp.where(valid, old_logp, 0.0))
  cut = ((adv < 0) & (ratio < 1.0 - eps_low)) | ((adv > 0) & (ratio > 1.0 + eps_high))
  grad = jnp.where(cut, 0.0, -adv * ratio)
  if ref_logp is not None and beta != 0:
    if kl_estimator == "k3":
      grad = grad + beta * (1.0 - jnp.exp(jnp.where(valid, ref_logp, 0.0) - logp))
    else:
      grad = grad + beta
  return jnp.where(valid, grad * mask, 0.0)


# ----------------------------------------------------------------------------- per-row stats


def row_partials(terms, mask):
  """Per-row sums (and max/min) of token terms over valid tokens: STAT_NAMES[:-1], each [B, 1]."""
  valid = mask > 0
  m = mask.astype(terms.ratio.dtype)

  def total(x):
    return jnp.sum(x * m, axis=1, keepdims=True)

  return (total(terms.loss), total(terms.pg), total(terms.kl),
          total(terms.clip_low.astype(m.dtype)), total(terms.clip_high.astype(m.dtype)),
          total(terms.ratio),
          jnp.max(jnp.where(valid, terms.ratio, -jnp.inf), axis=1, keepdims=True),
          jnp.min(jnp.where(valid, terms.ratio, jnp.inf), axis=1, keepdims=True),
          total(jnp.ones_like(m)))


def empty_row_partials(shape, dtype):
  """Identity element of combine_row_partials."""
  zero, inf = jnp.zeros(shape, dtype), jnp.full(shape, jnp.inf, dtype)
  return (zero,) * 6 + (-inf, inf, zero)


def combine_row_partials(a, b):
  """Merges the partials of two chunks of the same rows (sums add; max/min combine)."""
  mx, mn = COL["ratio_max"], COL["ratio_min"]
  return tuple(jnp.maximum(x, y) if i == mx else jnp.minimum(x, y) if i == mn else x + y
               for i, (x, y) in enumerate(zip(a, b)))


def row_stats(logp_BT, old_logp_BT, ref_logp_BT, adv_B, mask_BT, *, eps_low, eps_high, beta,
              kl_estimator):
  """[B, NUM_STATS] statistics (STAT_NAMES) over whole rows; the XLA path of grpo_loss."""
  dtype = _compute_dtype(logp_BT)
  cast = lambda x: None if x is None else x.astype(dtype)
  adv_B1 = cast(adv_B)[:, None]
  terms = token_terms(cast(logp_BT), cast(old_logp_BT), cast(ref_logp_BT), adv_B1, mask_BT,
                      eps_low=eps_low, eps_high=eps_high, beta=beta, kl_estimator=kl_estimator)
  return jnp.concatenate(row_partials(terms, mask_BT) + (adv_B1,), axis=1)


def row_weights(n_B, *, aggregation, max_len, num_valid_tokens=None, num_sequences=None):
  """Each row's weight [B] in the aggregated loss, from its valid-token count n_B: the loss is
  sum_B w_B * (row's token sum). token_mean: 1 / num_valid_tokens. seq_mean_token_mean:
  1 / (n_B * non-empty rows). seq_mean_token_sum_norm: 1 / (max_len * non-empty rows).
  Normalisers default to this batch's counts and are clamped to >= 1 (an empty batch gives 0).
  The GRPO loss (`finalize`) and the OPD loss (smjax.rl.opd.aggregate) share it."""
  n_B = jax.lax.stop_gradient(n_B)
  tokens = jnp.sum(n_B)
  seqs = jnp.sum((n_B > 0).astype(n_B.dtype))
  tok_norm = jnp.maximum(tokens if num_valid_tokens is None else num_valid_tokens, 1)
  seq_norm = jnp.maximum(seqs if num_sequences is None else num_sequences, 1)
  if aggregation == "token_mean":
    return jnp.ones_like(n_B) / tok_norm
  if aggregation == "seq_mean_token_mean":
    return 1.0 / (jnp.maximum(n_B, 1.0) * seq_norm)
  if aggregation == "seq_mean_token_sum_norm":
    return jnp.ones_like(n_B) / (float(max_len) * seq_norm)
  raise ValueError(f"{aggregation=} must be one of {AGGREGATIONS}")


def finalize(stats, *, aggregation, max_len, num_valid_tokens=None, num_sequences=None):
  """(loss, aux) from per-row statistics; only the loss_sum column carries gradient.

  token_mean: sum(loss_t) / num_valid_tokens. seq_mean_token_mean: mean over non-empty rows of
  each row's token mean. seq_mean_token_sum_norm: mean over non-empty rows of token sum / max_len.
  Empty rows contribute 0 and are not counted; an all-empty batch gives loss 0.
  """
  aux_stats = jax.lax.stop_gradient(stats)
  n_B = aux_stats[:, COL["n_valid"]]
  tokens = jnp.sum(n_B)
  seqs = jnp.sum((n_B > 0).astype(n_B.dtype))
  w_B = row_weights(n_B, aggregation=aggregation, max_len=max_len,
                    num_valid_tokens=num_valid_tokens, num_sequences=num_sequences
                    ).astype(stats.dtype)
  col = lambda name: aux_stats[:, COL[name]]
  per_tok = lambda name: jnp.sum(col(name)) / jnp.maximum(tokens, 1)
  adv_B = col("advantage")
  clip_low, clip_high = per_tok("clip_low"), per_tok("clip_high")
  aux = {
      "pg_loss": jnp.sum(w_B * col("pg_sum")),
      "kl_loss": jnp.sum(w_B * col("kl_sum")),  # loss == pg_loss + beta * kl_loss
      "kl_mean": per_tok("kl_sum"),
      "clip_frac_low": clip_low,
      "clip_frac_high": clip_high,
      "clip_frac": clip_low + clip_high,
      "ratio_mean": per_tok("ratio_sum"),
      "ratio_max": jnp.where(tokens > 0, jnp.max(col("ratio_max")), 0.0),
      "ratio_min": jnp.where(tokens > 0, jnp.min(col("ratio_min")), 0.0),
      "num_valid_tokens": tokens,
      "num_sequences": seqs,
      "advantage_mean": jnp.mean(adv_B),
      "advantage_std": jnp.std(adv_B),
  }
  return jnp.sum(w_B * stats[:, COL["loss_sum"]]), aux


# ----------------------------------------------------------------------------- public losses


def check_aggregation(aggregation, max_len=None):
  """Raises ValueError unless `aggregation` is one of AGGREGATIONS and max_len is None or a
  positive int (GRPO's and OPD's losses share the aggregations)."""
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"{aggregation=} must be one of {AGGREGATIONS}")
  if max_len is not None and (not isinstance(max_len, numbers.Integral) or max_len <= 0):
    raise ValueError(f"{max_len=} must be a positive int (seq_mean_token_sum_norm's fixed length "
                     "normaliser, Dr.GRPO)")


def check_loss_args(logp_BT, old_logp_BT, ref_logp_BT, per_row_B, mask_BT, *, eps_low, eps_high,
                    beta, kl_estimator, aggregation, max_len, per_row_name="advantages_B"):
  """Raises ValueError naming the tensor or field at fault."""
  if logp_BT.ndim != 2:
    raise ValueError(f"logp_BT must be 2-D [B, T], got shape {logp_BT.shape}")
  for name, x in (("old_logp_BT", old_logp_BT), ("ref_logp_BT", ref_logp_BT),
                  ("mask_BT", mask_BT)):
    if x is not None and x.shape != logp_BT.shape:
      raise ValueError(f"{name} shape {x.shape} must equal logp_BT shape {logp_BT.shape}")
  if per_row_B.shape != logp_BT.shape[:1]:
    raise ValueError(f"{per_row_name} shape {per_row_B.shape} must be [B]={logp_BT.shape[:1]}")
  for name, v in (("eps_low", eps_low), ("eps_high", eps_high), ("beta", beta)):
    if not isinstance(v, numbers.Real) or v < 0:
      raise ValueError(f"{name}={v!r} must be a non-negative Python float (it is static)")
  if eps_low >= 1:
    raise ValueError(f"{eps_low=} must be < 1 (clip range [1 - eps_low, 1 + eps_high])")
  if kl_estimator not in KL_ESTIMATORS:
    raise ValueError(f"{kl_estimator=} must be one of {KL_ESTIMATORS}")
  if beta > 0 and ref_logp_BT is None:
    raise ValueError(f"ref_logp_BT is None but {beta=} > 0: the KL term needs reference log-probs")
  check_aggregation(aggregation, max_len)


def grpo_loss(logp_BT, old_logp_BT, ref_logp_BT, advantages_B, mask_BT, *, eps_low, eps_high,
              beta, kl_estimator, aggregation, max_len=None, num_valid_tokens=None,
              num_sequences=None):
  """GRPO loss and metrics from precomputed advantages; differentiable w.r.t. logp_BT only.

  logp_BT: policy log-probs of the sampled tokens; old_logp_BT: behaviour (sampler) log-probs;
  ref_logp_BT: reference log-probs, may be None when beta == 0; mask_BT: 1/True on completion
  tokens. max_len: seq_mean_token_sum_norm's constant (default T). num_valid_tokens /
  num_sequences: global normalisers for gradient accumulation (see module docstring).
  """
  advantages_B = jnp.asarray(advantages_B)
  check_loss_args(logp_BT, old_logp_BT, ref_logp_BT, advantages_B, mask_BT, eps_low=eps_low,
                  eps_high=eps_high, beta=beta, kl_estimator=kl_estimator,
                  aggregation=aggregation, max_len=max_len)
  stats = row_stats(logp_BT, old_logp_BT, ref_logp_BT, jax.lax.stop_gradient(advantages_B),
                    mask_BT, eps_low=eps_low, eps_high=eps_high, beta=beta,
                    kl_estimator=kl_estimator)
  return finalize(stats, aggregation=aggregation, max_len=max_len or logp_BT.shape[1],
                  num_valid_tokens=num_valid_tokens, num_sequences=num_sequences)


def grpo_loss_from_rewards(logp_BT, old_logp_BT, ref_logp_BT, rewards_B, mask_BT, *, group_size,
                           advantage_mode, advantage_eps=1e-6, eps_low, eps_high, beta,
                           kl_estimator, aggregation, max_len=None, num_valid_tokens=None,
                           num_sequences=None):
  """group_advantages + grpo_loss in one call (the fused kernel computes the same in one pass)."""
  rewards_B = jnp.asarray(rewards_B)
  check_group_args(rewards_B, group_size=group_size, mode=advantage_mode)
  check_loss_args(logp_BT, old_logp_BT, ref_logp_BT, rewards_B, mask_BT, eps_low=eps_low,
                  eps_high=eps_high, beta=beta, kl_estimator=kl_estimator,
                  aggregation=aggregation, max_len=max_len, per_row_name="rewards_B")
  adv_B = group_advantages(jax.lax.stop_gradient(rewards_B), group_size=group_size,
                           mode=advantage_mode, eps=advantage_eps)
  return grpo_loss(logp_BT, old_logp_BT, ref_logp_BT, adv_B, mask_BT, eps_low=eps_low,
                   eps_high=eps_high, beta=beta, kl_estimator=kl_estimator,
                   aggregation=aggregation, max_len=max_len, num_valid_tokens=num_valid_tokens,
                   num_sequences=num_sequences)


# ----------------------------------------------------------------------------- entropy


def token_entropy(logits_BTV):
  """Entropy [B, T] of softmax(logits) over V, in float32; -inf logits (banned tokens) are fine.

  A metric: call under stop_gradient (its gradient is NaN where a logit is -inf).
  """
  logits = logits_BTV.astype(_compute_dtype(logits_BTV))
  logp = jax.nn.log_softmax(logits, axis=-1)
  p = jnp.exp(logp)
  return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


def masked_mean(x_BT, mask_BT):
  """Mean of x over positions where mask is set, in float32 (float64 for float64); 0 when nothing
  is set. Masked entries are selected away, not multiplied, so they may hold inf/NaN (the OPD
  metrics' log-probs and KLs can)."""
  valid = mask_BT > 0
  x = x_BT.astype(_compute_dtype(x_BT))
  return jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(jnp.sum(valid), 1)
