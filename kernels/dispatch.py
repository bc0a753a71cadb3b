"""Which implementation of each loss kernel runs: decided here and only here.

`resolve_impl(impl)` turns "auto" into "pallas" on TPU/GPU and "xla" on CPU. The two public losses
take `impl=` and `mesh=` and run:

- `grpo_loss_from_rewards`: the fused Pallas kernel (kernels/group_advantage.py) or the plain XLA
  path (smjax.rl.grpo, whose block functions the kernel also runs);
- `reverse_kl`: the fused Pallas kernel or the token-chunked XLA path (kernels/reverse_kl.py). The
  OPD loss takes its per-token KL as an argument, so a step passes
  `functools.partial(dispatch.reverse_kl, impl=..., mesh=...)` to smjax.rl.opd.opd_loss.

smjax.rl never imports this module (nor any kernel): the loss math does not know which kernel runs.

On a device mesh a kernel runs under `jax.shard_map` over the batch axes, because XLA's SPMD
partitioner does not partition a `pallas_call` (under plain `jit` with row-sharded inputs the
operands would be gathered onto every device, each computing the whole batch, or the compile
fails):

- GRPO: each device runs the fused kernel on its rows (rows split over the batch axes, replicated
  over "tensor"). Group advantages need a row's whole group on its device, so the rows a device
  holds must be a multiple of `group_size` (rows are ordered [prompt0 x G, prompt1 x G, ...] and
  split contiguously). The loss is normalised by the *global* token and sequence counts (computed
  before the shard_map, as for gradient accumulation) and summed with `psum`; every metric is
  combined exactly (sums, token-weighted means, max/min, mean/std over rows), so the result equals
  the one-device kernel. If the rows do not divide that way the XLA path runs instead (XLA
  partitions it) and a note is logged once per shape.
- reverse KL: per-token, so each device runs the kernel on its rows and, where T divides the
  "tensor" axis, its share of the tokens (the vocab stays whole on a device: the kernel's online
  log-sum-exp runs over all of V). No collective beyond the resharding of the logits.

`mesh=None` means the mesh set by `jax.set_mesh` around the trace, if any; with no mesh, a
one-device mesh, or an implementation that resolves to "xla", these are the plain functions.

Legend (docs/design.md#shape-legend): B rows, G group size, T target positions, V vocab.
"""

from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from smjax.kernels import group_advantage as ga_kernel
from smjax.kernels import reverse_kl as rkl_kernel
from smjax.rl import grpo
from smjax.sharding import BATCH_AXES

IMPLS = ("auto", "pallas", "xla")

_log = logging.getLogger(__name__)
_TOKEN_MEANS = ("kl_mean", "clip_frac_low", "clip_frac_high", "ratio_mean")
_SUMS = ("pg_loss", "kl_loss", "num_valid_tokens", "num_sequences")
_GRPO_AUX = frozenset(_TOKEN_MEANS + _SUMS + (
    "clip_frac", "ratio_max", "ratio_min", "advantage_mean", "advantage_std"))


def resolve_impl(impl: str) -> str:
  """'auto' -> 'pallas' on TPU/GPU, 'xla' on CPU; 'pallas' and 'xla' pass through."""
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r} must be one of {IMPLS}")
  if impl == "auto":
    return "pallas" if jax.default_backend() in ("tpu", "gpu") else "xla"
  return impl


def resolve_mesh(mesh=None):
  """The mesh to split kernels over: `mesh`, else the ambient one (jax.set_mesh); None if there is
  none or it has a single device."""
  if mesh is None:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
      return None
  return mesh if math.prod(mesh.shape.values()) > 1 else None


def _batch_axes(mesh) -> tuple[str, ...]:
  return tuple(a for a in BATCH_AXES if mesh.shape.get(a, 1) > 1)


def grpo_kernel_plan(rows: int, group_size: int, mesh_shape) -> tuple[bool, str]:
  """(True, "") when the fused GRPO kernel can run per device under shard_map for `rows` rows on a
  mesh of `mesh_shape` (axis -> size); otherwise (False, why)."""
  shards = math.prod(mesh_shape.get(a, 1) for a in BATCH_AXES)
  if rows % shards:
    return False, f"{rows=} do not divide the {shards} batch shards"
  if (rows // shards) % group_size:
    return False, (f"{rows // shards} rows per device is not a multiple of {group_size=} (a "
                   "group's advantage needs all of its rows on one device)")
  return True, ""


@functools.lru_cache(maxsize=None)
def _note(message: str) -> None:
  _log.warning(message)


def grpo_loss_from_rewards(logp_BT, old_logp_BT, ref_logp_BT, rewards_B, mask_BT, *, group_size,
                           advantage_mode, advantage_eps=1e-6, eps_low, eps_high, beta,
                           kl_estimator, aggregation, max_len=None, num_valid_tokens=None,
                           num_sequences=None, impl="auto", mesh=None):
  """GRPO (loss, aux) from raw rewards (smjax.rl.grpo.grpo_loss_from_rewards' contract) by the
  implementation `impl` resolves to, split over the mesh's batch axes for the kernel (module
  docstring). Same (loss, aux) and gradient w.r.t. logp_BT whichever runs."""
  kw = dict(group_size=group_size, advantage_mode=advantage_mode, advantage_eps=advantage_eps,
            eps_low=eps_low, eps_high=eps_high, beta=beta, kl_estimator=kl_estimator,
            aggregation=aggregation)
  xla = lambda: grpo.grpo_loss_from_rewards(  # noqa: E731
      logp_BT, old_logp_BT, ref_logp_BT, rewards_B, mask_BT, max_len=max_len,
      num_valid_tokens=num_valid_tokens, num_sequences=num_sequences, **kw)
  if resolve_impl(impl) == "xla":
    return xla()
  # As on the XLA path (the kernel alone would also take advantage_mode="precomputed").
  grpo.check_group_args(jnp.asarray(rewards_B), group_size=group_size, mode=advantage_mode)
  mesh = resolve_mesh(mesh)
  if mesh is None:
    return ga_kernel.grpo_loss_fused(logp_BT, old_logp_BT, ref_logp_BT, rewards_B, mask_BT,
                                     num_valid_tokens, num_sequences, max_len=max_len, **kw)
  ok, why = grpo_kernel_plan(logp_BT.shape[0], group_size, dict(mesh.shape))
  if not ok:
    _note(f"kernels.dispatch: GRPO loss on mesh {dict(mesh.shape)} uses the XLA path instead of "
          f"the Pallas kernel: {why}")
    return xla()
  # Global normalisers: inside the shard_map each device would otherwise count only its rows.
  valid_BT = mask_BT > 0
  if num_valid_tokens is None:
    num_valid_tokens = jnp.sum(valid_BT).astype(jnp.float32)
  if num_sequences is None:
    num_sequences = jnp.sum(jnp.any(valid_BT, axis=1)).astype(jnp.float32)
  axes = _batch_axes(mesh)
  rows, rows_t = PartitionSpec(axes), PartitionSpec(axes, None)
  has_ref = ref_logp_BT is not None

  def local(logp, old, ref, rewards, mask, tokens, seqs):
    loss, aux = ga_kernel.grpo_loss_fused(
        logp, old, ref if has_ref else None, rewards, mask, tokens, seqs,
        max_len=max_len or logp_BT.shape[1], **kw)
    return jax.lax.psum(loss, axes), combine_grpo_aux(aux, axes)

  ref_arg = ref_logp_BT if has_ref else jnp.zeros_like(old_logp_BT)
  scalar = PartitionSpec()
  return jax.shard_map(
      local, mesh=mesh, in_specs=(rows_t, rows_t, rows_t, rows, rows_t, scalar, scalar),
      out_specs=(scalar, scalar), check_vma=False)(
          logp_BT, old_logp_BT, ref_arg, rewards_B, mask_BT,
          jnp.asarray(num_valid_tokens, jnp.float32), jnp.asarray(num_sequences, jnp.float32))


def combine_grpo_aux(aux: dict, axes) -> dict:
  """The whole batch's GRPO metrics from each device's (inside shard_map over `axes`; every
  device holds the same number of rows)."""
  unknown = set(aux) - _GRPO_AUX
  if unknown:
    raise ValueError(f"kernels.dispatch.combine_grpo_aux: no rule to combine metrics "
                     f"{sorted(unknown)} over devices; add one")
  tokens = aux["num_valid_tokens"]
  total = jax.lax.psum(tokens, axes)
  out = {k: jax.lax.psum(aux[k], axes) for k in _SUMS}
  for k in _TOKEN_MEANS:
    out[k] = jax.lax.psum(aux[k] * tokens, axes) / jnp.maximum(total, 1)
  out["clip_frac"] = out["clip_frac_low"] + out["clip_frac_high"]
  some = tokens > 0  # a device without tokens reports 0 for ratio_max/min: leave it out
  out["ratio_max"] = jnp.where(total > 0, jax.lax.pmax(
      jnp.where(some, aux["ratio_max"], -jnp.inf), axes), 0.0)
  out["ratio_min"] = jnp.where(total > 0, jax.lax.pmin(
      jnp.where(some, aux["ratio_min"], jnp.inf), axes), 0.0)
  mean = jax.lax.pmean(aux["advantage_mean"], axes)
  second = jax.lax.pmean(aux["advantage_std"] ** 2 + aux["advantage_mean"] ** 2, axes)
  out["advantage_mean"] = mean
  out["advantage_std"] = jnp.sqrt(jnp.maximum(second - mean ** 2, 0.0))
  return out


def reverse_kl(student_logits, teacher_logits, *, impl="auto", block_sizes=None,
               chunk_tokens=None, mesh=None):
  """Per-token KL(softmax(student) || softmax(teacher)) [..., V] -> [...] in float32
  (smjax.kernels.reverse_kl), by the implementation `impl` resolves to; on a mesh the Pallas
  kernel runs per device on its rows (batch axes) and tokens ("tensor" axis) where they divide."""
  impl = resolve_impl(impl)
  kw = dict(impl=impl, block_sizes=block_sizes, chunk_tokens=chunk_tokens)
  mesh = resolve_mesh(mesh)
  if mesh is None or impl == "xla" or student_logits.ndim != 3:
    return rkl_kernel.reverse_kl(student_logits, teacher_logits, **kw)
  b, t, _ = student_logits.shape
  axes = _batch_axes(mesh)
  row_axes = axes if axes and b % math.prod(mesh.shape[a] for a in axes) == 0 else None
  tensor = mesh.shape.get("tensor", 1)
  tok_axis = "tensor" if tensor > 1 and t % tensor == 0 else None
  if row_axes is None and axes:
    _note(f"kernels.dispatch: reverse_kl on mesh {dict(mesh.shape)}: {b} rows do not divide the "
          "batch shards; every device computes all rows")
  spec = PartitionSpec(row_axes, tok_axis, None)
  return jax.shard_map(lambda s, q: rkl_kernel.reverse_kl(s, q, **kw), mesh=mesh,
                       in_specs=(spec, spec), out_specs=PartitionSpec(row_axes, tok_axis),
                       check_vma=False)(student_logits, teacher_logits)
