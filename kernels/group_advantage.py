"""Fused GRPO loss kernel: group advantages, clipped surrogate, KL and masked row reduction.

One pass over the [B, T] log-probs computes each row's group-normalised advantage from the raw
rewards, the per-token clipped objective and KL, and per-row sums (STAT_NAMES in smjax/rl/grpo.py);
a few [B]-sized XLA ops then apply the aggregation weights and form the metrics. The backward
kernel writes d loss / d logp_BT; old/ref log-probs, rewards and the mask are constants.

The per-block math is smjax/rl/grpo.py's: the kernel bodies call its per-token and per-row
functions on their blocks (smjax.rl.grpo's XLA path runs the same functions on whole arrays).
`grpo_loss_fused_reference` is written apart from both, straight from the formulas
(docs/design.md#grpo), so the tests compare the kernel with code it does not share. Which
implementation a train step runs is decided in smjax.kernels.dispatch.

Layout: grid over row blocks of `block_b` rows; each program holds its rows' full (padded) T in
VMEM / behind pointers and loops over T in chunks of `block_t`. Each row carries its whole group's
rewards ([B, G] padded to a power of two), so a row block need not align with group boundaries.
B and T are padded with mask 0. TPU: block_b % 8 == 0, block_t % 128 == 0; GPU (Triton): powers
of two. Lowering for TPU (Mosaic) and GPU (Triton) is checked by the tests on CPU; compiling and
running on the hardware has not been verified here (no accelerator).

Sharding: XLA does not partition a pallas_call. With B sharded across devices, call this inside
jax.shard_map over the batch axes, pass the global num_valid_tokens / num_sequences, and psum the
loss (as with gradient accumulation, see smjax/rl/grpo.py), as smjax.kernels.dispatch does; under
plain jit the inputs would be gathered to every device.

Legend (docs/design.md#shape-legend): B rows, G group size, T target positions (the scored
completion columns); the per-row statistics are `stats` [B, STATS_WIDTH].
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from smjax.rl import grpo

ADVANTAGE_MODES = grpo.ADVANTAGE_MODES + ("precomputed",)  # precomputed: rewards_B are advantages
STATS_WIDTH = 16  # grpo.NUM_STATS padded to a power of two (Triton arrays must be 2^k in size)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Rows per program and tokens per inner-loop chunk."""
  block_b: int
  block_t: int

  @classmethod
  def get_default(cls):
    # 16 rows: a full bf16 sublane tile on TPU; 512 tokens per chunk keeps a few vregs live.
    return cls(block_b=16, block_t=512)


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static kernel configuration (hashable: custom_vjp nondiff argument)."""
  eps_low: float
  eps_high: float
  beta: float
  kl_estimator: str
  group_size: int
  advantage_mode: str
  advantage_eps: float
  has_ref: bool
  block_b: int
  block_t: int
  num_chunks: int
  interpret: bool
  backend: str


def _next_pow2(n):
  return 1 << max(0, int(n) - 1).bit_length()


def _check_blocks(block_sizes, *, backend, interpret):
  bb, bt = block_sizes.block_b, block_sizes.block_t
  if bb < 1 or bt < 1:
    raise ValueError(f"{block_sizes=} must have positive block_b and block_t")
  if interpret:
    return
  if backend == "tpu":
    if bb % 8 or bt % 128:
      raise ValueError(f"on TPU block_b={bb} must be a multiple of 8 and block_t={bt} of 128")
  elif backend == "gpu":
    if bb != _next_pow2(bb) or bt != _next_pow2(bt):
      raise ValueError(f"on GPU (Triton) block_b={bb} and block_t={bt} must be powers of two")
  else:
    raise ValueError(f"no Pallas lowering for {backend=}: pass interpret=True or use impl='xla'")


def _compiler_params(cfg):
  if cfg.interpret:
    return None
  if cfg.backend == "tpu":
    return pltpu.CompilerParams(dimension_semantics=("parallel",))
  return pltriton.CompilerParams(num_warps=4, num_stages=1)


def _token_kw(cfg):
  return dict(eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta,
              kl_estimator=cfg.kl_estimator)


def _chunk_loader(cfg, j):
  """Loads tokens [j*block_t, (j+1)*block_t) of every row of a [block_b, T] ref as float32."""
  cols = pl.ds(pl.multiple_of(j * cfg.block_t, cfg.block_t), cfg.block_t)
  return cols, lambda ref: None if ref is None else ref[:, cols].astype(jnp.float32)


def _fwd_kernel(*refs, cfg):
  if cfg.has_ref:
    logp_ref, old_ref, ref_ref, mask_ref, group_ref, reward_ref, stats_ref = refs
  else:
    logp_ref, old_ref, mask_ref, group_ref, reward_ref, stats_ref = refs
    ref_ref = None
  reward_B1 = reward_ref[...].astype(jnp.float32)
  if cfg.advantage_mode == "precomputed":
    adv_B1 = reward_B1
  else:
    adv_B1 = grpo.advantage_from_group(reward_B1, group_ref[...].astype(jnp.float32),
                                       group_size=cfg.group_size, mode=cfg.advantage_mode,
                                       eps=cfg.advantage_eps)

  def body(j, carry):
    _, load = _chunk_loader(cfg, j)
    mask = load(mask_ref)
    terms = grpo.token_terms(load(logp_ref), load(old_ref), load(ref_ref), adv_B1, mask,
                             **_token_kw(cfg))
    return grpo.combine_row_partials(carry, grpo.row_partials(terms, mask))

  parts = jax.lax.fori_loop(0, cfg.num_chunks, body,
                            grpo.empty_row_partials((cfg.block_b, 1), jnp.float32))
  # Pack the [block_b, 1] columns into lanes with selects: no concatenate (Triton lacks it).
  lane = jax.lax.broadcasted_iota(jnp.int32, (cfg.block_b, STATS_WIDTH), 1)
  out = jnp.zeros((cfg.block_b, STATS_WIDTH), jnp.float32)
  for k, col in enumerate(parts + (adv_B1,)):
    out = jnp.where(lane == k, col, out)
  stats_ref[...] = out


def _bwd_kernel(*refs, cfg):
  if cfg.has_ref:
    logp_ref, old_ref, ref_ref, mask_ref, adv_ref, g_ref, dlogp_ref = refs
  else:
    logp_ref, old_ref, mask_ref, adv_ref, g_ref, dlogp_ref = refs
    ref_ref = None
  adv_B1, g_B1 = adv_ref[...], g_ref[...]

  def body(j, carry):
    cols, load = _chunk_loader(cfg, j)
    grad = grpo.token_loss_grad(load(logp_ref), load(old_ref), load(ref_ref), adv_B1,
                                load(mask_ref), **_token_kw(cfg))
    dlogp_ref[:, cols] = (g_B1 * grad).astype(dlogp_ref.dtype)
    return carry

  jax.lax.fori_loop(0, cfg.num_chunks, body, 0)


def _row_specs(cfg, shape, n):
  return [pl.BlockSpec((cfg.block_b, shape[1]), lambda i: (i, 0)) for _ in range(n)]


def cost_estimates(batch, seq_len, *, group_width, has_ref, kl_estimator, itemsize=4):
  """(forward, backward) pl.CostEstimate of the kernels on a [batch, seq_len] problem.

  Attached to the pallas_calls (TPU's cost analysis reads them); exposed so a FLOP ledger can
  add them where a backend's cost analysis does not see inside the kernel.
  """
  tokens = batch * seq_len
  n_token_inputs = 3 + int(has_ref)  # logp, old, [ref], mask
  exps = tokens * (2 if has_ref and kl_estimator == "k3" else 1)
  fwd = pl.CostEstimate(  # ~30 elementwise ops per token; group stats per row
      flops=30 * tokens + 8 * batch * group_width, transcendentals=exps + batch,
      bytes_accessed=n_token_inputs * tokens * itemsize
      + batch * (group_width + 1 + STATS_WIDTH) * 4)
  bwd = pl.CostEstimate(
      flops=15 * tokens, transcendentals=exps,
      bytes_accessed=(n_token_inputs + 1) * tokens * itemsize + 2 * batch * 4)
  return fwd, bwd


def _fwd_call(cfg, logp, old, ref, mask, group, reward):
  b, t = logp.shape
  token_arrays = [logp, old] + ([ref] if cfg.has_ref else []) + [mask]
  cost, _ = cost_estimates(b, t, group_width=group.shape[1], has_ref=cfg.has_ref,
                           kl_estimator=cfg.kl_estimator, itemsize=logp.dtype.itemsize)
  return pl.pallas_call(
      functools.partial(_fwd_kernel, cfg=cfg),
      out_shape=jax.ShapeDtypeStruct((b, STATS_WIDTH), jnp.float32),
      grid=(b // cfg.block_b,),
      in_specs=_row_specs(cfg, logp.shape, len(token_arrays)) + _row_specs(cfg, group.shape, 1)
      + _row_specs(cfg, reward.shape, 1),
      out_specs=pl.BlockSpec((cfg.block_b, STATS_WIDTH), lambda i: (i, 0)),
      compiler_params=_compiler_params(cfg), interpret=cfg.interpret, cost_estimate=cost,
      name="grpo_loss_fwd")(*token_arrays, group, reward)


def _bwd_call(cfg, logp, old, ref, mask, adv, g):
  b, t = logp.shape
  token_arrays = [logp, old] + ([ref] if cfg.has_ref else []) + [mask]
  _, cost = cost_estimates(b, t, group_width=1, has_ref=cfg.has_ref,
                           kl_estimator=cfg.kl_estimator, itemsize=logp.dtype.itemsize)
  return pl.pallas_call(
      functools.partial(_bwd_kernel, cfg=cfg),
      out_shape=jax.ShapeDtypeStruct(logp.shape, logp.dtype),
      grid=(b // cfg.block_b,),
      in_specs=_row_specs(cfg, logp.shape, len(token_arrays)) + _row_specs(cfg, adv.shape, 2),
      out_specs=pl.BlockSpec((cfg.block_b, t), lambda i: (i, 0)),
      compiler_params=_compiler_params(cfg), interpret=cfg.interpret, cost_estimate=cost,
      name="grpo_loss_bwd")(*token_arrays, adv, g)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_row_stats(cfg, logp, old, ref, mask, group, reward):
  """[B, STATS_WIDTH] per-row statistics; only the loss_sum column is differentiable."""
  return _fwd_call(cfg, logp, old, ref, mask, group, reward)


def _fused_row_stats_fwd(cfg, logp, old, ref, mask, group, reward):
  stats = _fwd_call(cfg, logp, old, ref, mask, group, reward)
  adv = stats[:, grpo.COL["advantage"]][:, None]
  return stats, (logp, old, ref, mask, adv, group, reward)


def _fused_row_stats_bwd(cfg, res, g_stats):
  logp, old, ref, mask, adv, group, reward = res
  # The wrapper stop-gradients every other column, so their cotangents are zero.
  g = g_stats[:, grpo.COL["loss_sum"]][:, None]
  if cfg.beta == 0 and cfg.has_ref:  # the KL term has no gradient: skip reading ref
    bwd_cfg, bwd_ref = dataclasses.replace(cfg, has_ref=False), None
  else:
    bwd_cfg, bwd_ref = cfg, ref
  dlogp = _bwd_call(bwd_cfg, logp, old, bwd_ref, mask, adv, g)
  zeros = lambda x: None if x is None else jnp.zeros_like(x)
  return dlogp, zeros(old), zeros(ref), zeros(mask), zeros(group), zeros(reward)


_fused_row_stats.defvjp(_fused_row_stats_fwd, _fused_row_stats_bwd)


@functools.partial(jax.jit, static_argnames=(
    "group_size", "advantage_mode", "advantage_eps", "eps_low", "eps_high", "beta",
    "kl_estimator", "aggregation", "max_len", "block_sizes", "interpret", "backend"))
def grpo_loss_fused(logp_BT, old_logp_BT, ref_logp_BT, rewards_B, mask_BT, num_valid_tokens=None,
                    num_sequences=None, *, group_size, advantage_mode, advantage_eps=1e-6,
                    eps_low, eps_high, beta, kl_estimator, aggregation, max_len=None,
                    block_sizes=None, interpret=None, backend=None):
  """Fused GRPO (loss, aux), same contract as grpo.grpo_loss_from_rewards.

  advantage_mode="precomputed" takes rewards_B as the advantages (grpo.grpo_loss's route).
  interpret: None -> True on CPU. backend: "tpu"/"gpu" target (default: jax.default_backend());
  set it to lower for another platform, e.g. jit(...).trace(...).lower(lowering_platforms=...).
  """
  if advantage_mode not in ADVANTAGE_MODES:
    raise ValueError(f"{advantage_mode=} must be one of {ADVANTAGE_MODES}")
  if advantage_mode != "precomputed":
    grpo.check_group_args(rewards_B, group_size=group_size, mode=advantage_mode)
  grpo.check_loss_args(logp_BT, old_logp_BT, ref_logp_BT, rewards_B, mask_BT, eps_low=eps_low,
                       eps_high=eps_high, beta=beta, kl_estimator=kl_estimator,
                       aggregation=aggregation, max_len=max_len, per_row_name="rewards_B")
  backend = backend or jax.default_backend()
  interpret = backend == "cpu" if interpret is None else interpret
  bs = block_sizes or BlockSizes.get_default()
  _check_blocks(bs, backend=backend, interpret=interpret)
  b, t = logp_BT.shape
  # A block larger than the (power-of-two, >= one TPU lane tile) sequence only adds padding.
  block_t = min(bs.block_t, max(128, _next_pow2(t)))
  b_pad, t_pad = pl.cdiv(b, bs.block_b) * bs.block_b, pl.cdiv(t, block_t) * block_t
  cfg = _Config(eps_low=float(eps_low), eps_high=float(eps_high), beta=float(beta),
                kl_estimator=kl_estimator, group_size=int(group_size),
                advantage_mode=advantage_mode, advantage_eps=float(advantage_eps),
                has_ref=ref_logp_BT is not None, block_b=bs.block_b, block_t=block_t,
                num_chunks=t_pad // block_t, interpret=bool(interpret), backend=backend)

  def pad(x, tokens=True):  # padded rows/tokens get mask 0, rewards 0, log-probs 0
    return jnp.pad(x, ((0, b_pad - b), (0, t_pad - t if tokens else 0)))

  rewards = jax.lax.stop_gradient(rewards_B).astype(jnp.float32)
  if advantage_mode == "precomputed":
    group = rewards[:, None]  # unused by the kernel
  else:
    group = grpo.group_rewards_matrix(rewards, group_size=group_size,
                                      width=_next_pow2(group_size))
  stats = _fused_row_stats(
      cfg, pad(logp_BT), pad(jax.lax.stop_gradient(old_logp_BT)),
      None if ref_logp_BT is None else pad(jax.lax.stop_gradient(ref_logp_BT)),
      pad(mask_BT.astype(jnp.float32)), pad(group, False), pad(rewards[:, None], False))
  return grpo.finalize(stats[:b, :grpo.NUM_STATS], aggregation=aggregation,
                       max_len=max_len or t, num_valid_tokens=num_valid_tokens,
                       num_sequences=num_sequences)


def grpo_loss_fused_reference(logp_BT, old_logp_BT, ref_logp_BT, rewards_B, mask_BT,
                              num_valid_tokens=None, num_sequences=None, *, group_size,
                              advantage_mode, advantage_eps=1e-6, eps_low, eps_high, beta,
                              kl_estimator, aggregation, max_len=None):
  """Pure-jnp reference of `grpo_loss_fused`, written from the formulas (docs/design.md#grpo) and
  sharing no code with the kernel or smjax.rl.grpo: (loss, aux) with the same metrics.

  Advantages per group of G rows: grpo (r - mean) / (std + eps) with the unbiased std, drgrpo
  r - mean, rloo r - mean of the other G - 1, 0 for a group whose rewards are all equal;
  "precomputed": rewards_B are the advantages. Token loss -min(rho A, clip(rho) A) + beta KL with
  rho = exp(logp - old) and KL = exp(ref - logp) - (ref - logp) - 1 (k3) or logp - ref (k1).
  """
  f32 = jnp.float32
  valid = mask_BT > 0
  m = valid.astype(f32)
  logp = jnp.where(valid, logp_BT.astype(f32), 0.0)
  old = jnp.where(valid, jax.lax.stop_gradient(old_logp_BT).astype(f32), 0.0)
  r = jax.lax.stop_gradient(rewards_B).astype(f32)
  if advantage_mode == "precomputed":
    adv = r
  else:
    groups = r.reshape(-1, group_size)
    mean = groups.mean(axis=1, keepdims=True)
    if advantage_mode == "grpo":
      std = jnp.sqrt(((groups - mean) ** 2).sum(axis=1, keepdims=True) / (group_size - 1))
      adv = (groups - mean) / (std + advantage_eps)
    elif advantage_mode == "drgrpo":
      adv = groups - mean
    else:
      adv = groups - (groups.sum(axis=1, keepdims=True) - groups) / (group_size - 1)
    constant = groups.max(axis=1, keepdims=True) == groups.min(axis=1, keepdims=True)
    adv = jnp.where(constant, 0.0, adv).reshape(-1)
  a = adv[:, None]
  ratio = jnp.exp(logp - old)
  pg = -jnp.minimum(ratio * a, jnp.clip(ratio, 1 - eps_low, 1 + eps_high) * a)
  if ref_logp_BT is None:
    kl = jnp.zeros_like(ratio)
  else:
    d = jnp.where(valid, jax.lax.stop_gradient(ref_logp_BT).astype(f32), 0.0) - logp
    kl = jnp.exp(d) - d - 1 if kl_estimator == "k3" else -d
  tok_B = m.sum(axis=1)
  tokens = tok_B.sum()
  seqs = (tok_B > 0).sum().astype(f32)
  tok_norm = jnp.maximum(tokens if num_valid_tokens is None else num_valid_tokens, 1)
  seq_norm = jnp.maximum(seqs if num_sequences is None else num_sequences, 1)

  def aggregate(x_BT):
    rows = (x_BT * m).sum(axis=1)
    if aggregation == "token_mean":
      return rows.sum() / tok_norm
    if aggregation == "seq_mean_token_mean":
      return (rows / jnp.maximum(tok_B, 1)).sum() / seq_norm
    return rows.sum() / ((max_len or logp_BT.shape[1]) * seq_norm)

  sg = jax.lax.stop_gradient
  per_token = lambda x: (sg(x) * m).sum() / jnp.maximum(tokens, 1)  # noqa: E731
  clip_low = valid & (a < 0) & (ratio < 1 - eps_low)
  clip_high = valid & (a > 0) & (ratio > 1 + eps_high)
  aux = {
      "pg_loss": sg(aggregate(pg)), "kl_loss": sg(aggregate(kl)), "kl_mean": per_token(kl),
      "clip_frac_low": per_token(clip_low.astype(f32)),
      "clip_frac_high": per_token(clip_high.astype(f32)),
      "ratio_mean": per_token(ratio),
      "ratio_max": jnp.where(tokens > 0, jnp.max(jnp.where(valid, sg(ratio), -jnp.inf)), 0.0),
      "ratio_min": jnp.where(tokens > 0, jnp.min(jnp.where(valid, sg(ratio), jnp.inf)), 0.0),
      "num_valid_tokens": tokens, "num_sequences": seqs,
      "advantage_mean": jnp.mean(adv), "advantage_std": jnp.std(adv),
  }
  aux["clip_frac"] = aux["clip_frac_low"] + aux["clip_frac_high"]
  return aggregate(pg + beta * kl), aux
