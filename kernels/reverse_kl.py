"""Fused per-token full-vocabulary reverse KL, KL(p_s || p_t), without [tokens, V] probabilities.

    KL = sum_v p_s(v) (a_v - b_v),  a = s - lse(s),  b = t - lse(t),  p_s = exp(a)
         = sum_v p_s(v) (s_v - t_v) - lse(s) + lse(t)

Forward: one pass over V blocks with an online log-sum-exp (flash style) keeping, per token, the
running maxima m and sums l = sum exp(x - m) of both distributions and
acc = sum exp(s - m_s) ((s - m_s) - (t - m_t)), rescaled whenever a maximum moves; then
KL = acc / l_s - log l_s + log l_t. Large offsets cost no precision, as every difference is of
like quantities (s - m_s, how far m_s moved), never s - t, m_s - m_t or lse_s - lse_t, which
round to float32's ulp (~1e-3 at |logit| ~ 1e4): so the forward saves lse = m + log l as those
two floats, and the backward (blockwise over V) forms a = (s - m_s) - log l_s from them.
With dKL/dp_u = a_u - b_u + 1 and dp_u/ds_v = p_u (delta_uv - p_v):
    dKL/ds_v = p_s(v) ((a_v - b_v + 1) - sum_u p_s(u) (a_u - b_u + 1)) = p_s(v) ((a_v - b_v) - KL)
    dKL/dt_v = -sum_u p_s(u) (delta_uv - p_t(v)) = p_t(v) - p_s(v).
The teacher gradient is computed only when the teacher logits are differentiated (symbolic
zeros); in OPD the teacher is a constant and costs nothing in the backward.

Three implementations, one math (`_online_update`, `_finalize`, `_grad_block` below):
- Pallas "tpu" variant (Mosaic): grid (token blocks, V blocks), V innermost and sequential,
  running statistics in VMEM scratch, [tokens, 128] statistics (the (8, 128) tiling): lane-
  replicated, or a pair (m, log l) in the low and high 64 lanes.
- Pallas "gpu" variant (Triton): grid over token blocks; V is a fori_loop inside the kernel with
  masked loads (Triton has no sequential grid axis and no scratch); power-of-two blocks.
- "xla": a fori_loop over token chunks (custom_vjp too), so neither pass holds more than
  [chunk, V] temporaries; what smjax.kernels.dispatch runs on CPU.
Tested here on CPU: both Pallas variants in interpret mode, and their lowering to Mosaic MLIR /
Triton IR (lowering_platforms=("tpu",) / ("cuda",)). Compiling and running on a TPU or GPU, and
the default block sizes, are unverified. Vocab and token counts need not divide the blocks: tails
are masked.

Legend (docs/design.md#shape-legend): V vocab; the token axis (any leading dims flattened) is named
in words (`tokens`, `_tokV`), and `block_n` is the tokens per block.
"""

import dataclasses
import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu

LANES = 128  # statistics fill one lane tile: the (8, 128) TPU layout
_NEG = -1e30  # finite "minus infinity" for running maxima: exp(_NEG - _NEG) = 1, not nan
_INIT = (_NEG, 0.0, _NEG, 0.0, 0.0)  # m_s, l_s, m_t, l_t, acc
_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Pallas tile: `block_n` tokens by `block_v` vocabulary entries (both passes)."""

  block_n: int
  block_v: int

  @classmethod
  def get_default(cls, platform: str = "tpu") -> "BlockSizes":
    """Untuned starting points (no TPU/GPU was available to tune them)."""
    if platform == "gpu":
      return cls(block_n=4, block_v=1024)  # powers of two; 4K elements a tile
    return cls(block_n=128, block_v=2048)  # 1 MiB f32 tile; fits default scoped VMEM


# --------------------------------------------------------------------------- shared math


def _init(block_n):
  return tuple(jnp.full((block_n, 1), x, _F32) for x in _INIT)


def _online_update(carry, s, t, valid):
  """Folds one [n, v] block (f32) into the running (m_s, l_s, m_t, l_t, acc), each [n, 1].

  acc = sum exp(s - m_s) ((s - m_s) - (t - m_t)) is measured from the running maxima and, when
  they move, re-referenced by d_t - d_s (how far each moved: exact at any offset), not by
  (m_s - m_t) - (m_s_new - m_t_new), whose rounding (~1e-3 at ±1e4) would go into the KL.
  """
  m_s, l_s, m_t, l_t, acc = carry
  if valid is not None:
    s, t = (jnp.where(valid, x, -jnp.inf) for x in (s, t))
  m_s_new = jnp.maximum(m_s, jnp.max(s, axis=1, keepdims=True))
  m_t_new = jnp.maximum(m_t, jnp.max(t, axis=1, keepdims=True))
  d_s, d_t = m_s_new - m_s, m_t_new - m_t  # huge from _NEG, but then l_s = acc = 0
  alpha_s = jnp.exp(-d_s)
  e_s, e_t = jnp.exp(s - m_s_new), jnp.exp(t - m_t_new)
  # where p_s = 0 (masked tail, -inf student logit) the term is 0, not 0 * (-inf - -inf)
  term = jnp.where(e_s > 0, e_s * ((s - m_s_new) - (t - m_t_new)), 0.0)
  return (
      m_s_new,
      alpha_s * l_s + jnp.sum(e_s, axis=1, keepdims=True),
      m_t_new,
      jnp.exp(-d_t) * l_t + jnp.sum(e_t, axis=1, keepdims=True),
      alpha_s * (acc + l_s * (d_t - d_s)) + jnp.sum(term, axis=1, keepdims=True),
  )


def _finalize(carry):
  """The saved statistics (kl, m_s, log l_s, m_t, log l_t), each [n, 1]."""
  m_s, l_s, m_t, l_t, acc = carry
  log_l_s, log_l_t = jnp.log(l_s), jnp.log(l_t)
  return acc / l_s - log_l_s + log_l_t, m_s, log_l_s, m_t, log_l_t


def _grad_block(s, t, stats, g, want_t):
  """Cotangents of a [n, v] block (f32); `stats` (from _finalize) and g are [n, 1]."""
  kl, m_s, log_l_s, m_t, log_l_t = stats
  a = (s - m_s) - log_l_s  # s - m_s is exact near the max, whatever the offset
  b = (t - m_t) - log_l_t
  p_s = jnp.exp(a)
  ds = jnp.where(p_s > 0, g * p_s * ((a - b) - kl), 0.0)
  dt = g * (jnp.exp(b) - p_s) if want_t else None
  return ds, dt


# --------------------------------------------------------------------------- Pallas kernels


# Lane reductions and selects are portable on Mosaic and Triton; lane slicing is not.
def _col(x):  # [n, LANES] lane-replicated -> [n, 1]
  return jnp.max(x, axis=1, keepdims=True)


def _pair(x, y):  # two [n, 1] -> [n, LANES]: x in the low 64 lanes, y in the high 64
  return jnp.where(lax.broadcasted_iota(jnp.int32, (x.shape[0], LANES), 1) < LANES // 2, x, y)


def _unpair(xy):  # inverse of _pair
  low = lax.broadcasted_iota(jnp.int32, xy.shape, 1) < LANES // 2
  return _col(jnp.where(low, xy, -jnp.inf)), _col(jnp.where(low, -jnp.inf, xy))


def _stat_tiles(stats):  # _finalize's [n, 1] statistics -> the three [n, LANES] the kernels pass
  kl, m_s, log_l_s, m_t, log_l_t = stats
  return jnp.broadcast_to(kl, (kl.shape[0], LANES)), _pair(m_s, log_l_s), _pair(m_t, log_l_t)


def _fwd_kernel_tpu(s_ref, t_ref, *refs, n_cols, block_v):
  out_refs, scratch = refs[:3], refs[3:]
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    for ref, val in zip(scratch, _INIT):
      ref[...] = jnp.full(ref.shape, val, _F32)

  s, t = s_ref[...].astype(_F32), t_ref[...].astype(_F32)
  valid = None
  if n_cols % block_v:  # the last V block reads past the vocabulary
    valid = j * block_v + lax.broadcasted_iota(jnp.int32, s.shape, 1) < n_cols
  carry = _online_update(tuple(_col(r[...]) for r in scratch), s, t, valid)
  for ref, val in zip(scratch, carry):
    ref[...] = jnp.broadcast_to(val, ref.shape)

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    for ref, val in zip(out_refs, _stat_tiles(_finalize(carry))):
      ref[...] = val


def _fwd_kernel_gpu(s_ref, t_ref, *out_refs, n_rows, n_cols, block_n, block_v):
  rows = pl.program_id(0) * block_n + lax.broadcasted_iota(jnp.int32, (block_n, 1), 0)
  row_ok = rows < n_rows

  def body(j, carry):
    cols = j * block_v + lax.broadcasted_iota(jnp.int32, (1, block_v), 1)
    valid = row_ok & (cols < n_cols)
    idx = (slice(None), pl.ds(j * block_v, block_v))
    s, t = (plgpu.load(r.at[idx], mask=valid, other=0.0).astype(_F32) for r in (s_ref, t_ref))
    return _online_update(carry, s, t, valid)

  carry = lax.fori_loop(0, pl.cdiv(n_cols, block_v), body, _init(block_n))
  store_ok = jnp.broadcast_to(row_ok, (block_n, LANES))
  for ref, val in zip(out_refs, _stat_tiles(_finalize(carry))):
    plgpu.store(ref, val, mask=store_ok)


def _bwd_kernel(s_ref, t_ref, kl_ref, st_s_ref, st_t_ref, g_ref, *out_refs,
                n_rows, n_cols, block_n, block_v, masked):
  if masked:  # Triton: BlockSpec'd refs are raw pointers, so tails must be masked by hand
    rows = pl.program_id(0) * block_n + lax.broadcasted_iota(jnp.int32, (block_n, 1), 0)
    cols = pl.program_id(1) * block_v + lax.broadcasted_iota(jnp.int32, (1, block_v), 1)
    ok = (rows < n_rows) & (cols < n_cols)
    stat_ok = jnp.broadcast_to(rows < n_rows, (block_n, LANES))
    load = lambda ref, m: plgpu.load(ref, mask=m, other=0.0)  # noqa: E731
  else:  # Mosaic: out-of-range reads are garbage rows/columns whose writes are dropped
    ok = stat_ok = None
    load = lambda ref, m: ref[...]  # noqa: E731
  s, t = load(s_ref, ok).astype(_F32), load(t_ref, ok).astype(_F32)
  kl, st_s, st_t, g = (load(r, stat_ok) for r in (kl_ref, st_s_ref, st_t_ref, g_ref))
  stats = (_col(kl), *_unpair(st_s), *_unpair(st_t))
  grads = _grad_block(s, t, stats, _col(g), want_t=len(out_refs) == 2)
  for ref, val in zip(out_refs, grads):
    if masked:
      plgpu.store(ref, val.astype(ref.dtype), mask=ok)
    else:
      ref[...] = val.astype(ref.dtype)


def _stat_spec(block_n, grid_rank):
  index = (lambda i: (i, 0)) if grid_rank == 1 else (lambda i, j: (i, 0))
  return pl.BlockSpec((block_n, LANES), index)


def _pallas_stats(s, t, cfg):
  n, v = s.shape
  bn, bv = cfg.block_n, cfg.block_v
  cost = pl.CostEstimate(
      flops=12 * n * v, transcendentals=2 * n * v,
      bytes_accessed=n * v * (s.dtype.itemsize + t.dtype.itemsize) + 3 * n * LANES * 4)
  common = dict(out_shape=[jax.ShapeDtypeStruct((n, LANES), _F32)] * 3, cost_estimate=cost,
                interpret=cfg.interpret, name="reverse_kl_fwd")
  if cfg.platform == "tpu":
    call = pl.pallas_call(
        functools.partial(_fwd_kernel_tpu, n_cols=v, block_v=bv),
        grid=(pl.cdiv(n, bn), pl.cdiv(v, bv)),
        in_specs=[pl.BlockSpec((bn, bv), lambda i, j: (i, j))] * 2,
        out_specs=[_stat_spec(bn, 2)] * 3,
        scratch_shapes=[pltpu.VMEM((bn, LANES), _F32)] * 5,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        **common)
  else:
    call = pl.pallas_call(
        functools.partial(_fwd_kernel_gpu, n_rows=n, n_cols=v, block_n=bn, block_v=bv),
        grid=(pl.cdiv(n, bn),),
        in_specs=[pl.BlockSpec((bn, v), lambda i: (i, 0))] * 2,
        out_specs=[_stat_spec(bn, 1)] * 3,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2), **common)
  kl, st_s, st_t = call(s, t)
  return kl[:, 0], st_s[:, 0], st_s[:, -1], st_t[:, 0], st_t[:, -1]


def _pallas_grads(s, t, stats, g, cfg, want_t):
  n, v = s.shape
  bn, bv = cfg.block_n, cfg.block_v
  stats = (*_stat_tiles([x[:, None] for x in stats]), jnp.broadcast_to(g[:, None], (n, LANES)))
  out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (s, t)[:1 + want_t]]
  tile = pl.BlockSpec((bn, bv), lambda i, j: (i, j))
  params = (pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"))
            if cfg.platform == "tpu" else plgpu.CompilerParams(num_warps=4, num_stages=2))
  out_bytes = sum(n * v * x.dtype.itemsize for x in out_shape)
  call = pl.pallas_call(
      functools.partial(_bwd_kernel, n_rows=n, n_cols=v, block_n=bn, block_v=bv,
                        masked=cfg.platform == "gpu"),
      grid=(pl.cdiv(n, bn), pl.cdiv(v, bv)),
      in_specs=[tile, tile] + [_stat_spec(bn, 2)] * 4,
      out_specs=[tile] * len(out_shape),
      out_shape=out_shape, compiler_params=params, interpret=cfg.interpret,
      cost_estimate=pl.CostEstimate(
          flops=(8 + 3 * want_t) * n * v, transcendentals=(1 + want_t) * n * v,
          bytes_accessed=n * v * (s.dtype.itemsize + t.dtype.itemsize) + out_bytes),
      name="reverse_kl_bwd")
  grads = call(s, t, *stats)
  return grads[0], (grads[1] if want_t else None)


# --------------------------------------------------------------------------- chunked XLA path


def _chunks(s, t, cfg, body, outs):
  """Writes body(rows of s, rows of t (f32), slicer of those rows) into `outs`, chunk by chunk.

  The last chunk is shifted back to end at n (rows recomputed identically), so no [tokens, V]
  array is ever padded or copied.
  """
  n, c = s.shape[0], cfg.chunk

  def step(i, outs):
    start = jnp.minimum(i * c, n - c)
    rows = lambda x: lax.dynamic_slice_in_dim(x, start, c)  # noqa: E731
    vals = body(rows(s).astype(_F32), rows(t).astype(_F32), rows)
    return tuple(lax.dynamic_update_slice_in_dim(o, x.astype(o.dtype), start, 0)
                 for o, x in zip(outs, vals))

  return lax.fori_loop(0, pl.cdiv(n, c), step, outs)


def _xla_stats(s, t, cfg):
  def body(s_c, t_c, _):
    return [x[:, 0] for x in _finalize(_online_update(_init(cfg.chunk), s_c, t_c, None))]

  return _chunks(s, t, cfg, body, (jnp.zeros((s.shape[0],), _F32),) * 5)


def _xla_grads(s, t, stats, g, cfg, want_t):
  def body(s_c, t_c, rows):  # (ds, dt or None): the zip in _chunks drops the None
    return _grad_block(s_c, t_c, [rows(x)[:, None] for x in stats], rows(g)[:, None], want_t)

  grads = _chunks(s, t, cfg, body, (jnp.zeros_like(s),) + (jnp.zeros_like(t),) * want_t)
  return grads[0], (grads[1] if want_t else None)


# --------------------------------------------------------------------------- custom_vjp


@dataclasses.dataclass(frozen=True)
class _Config:
  impl: str  # "pallas" | "xla"
  platform: str  # Pallas variant: "tpu" | "gpu"
  block_n: int
  block_v: int
  chunk: int
  interpret: bool


def _stats(s, t, cfg):
  return (_pallas_stats if cfg.impl == "pallas" else _xla_stats)(s, t, cfg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _reverse_kl_nv(s_tokV, t_tokV, cfg):
  return _stats(s_tokV, t_tokV, cfg)[0]


def _reverse_kl_fwd(s_tokV, t_tokV, cfg):
  s, t = s_tokV.value, t_tokV.value
  stats = _stats(s, t, cfg)
  # None vs () is static pytree structure: it tells the backward whether t needs a gradient.
  want_t = () if t_tokV.perturbed else None
  return stats[0], (s, t, stats, want_t)


def _reverse_kl_bwd(cfg, res, g):
  s, t, stats, want_t = res
  g = jnp.zeros_like(stats[0]) if isinstance(g, SymbolicZero) else g.astype(_F32)
  grads = _pallas_grads if cfg.impl == "pallas" else _xla_grads
  return grads(s, t, stats, g, cfg, want_t is not None)


_reverse_kl_nv.defvjp(_reverse_kl_fwd, _reverse_kl_bwd, symbolic_zeros=True)


# --------------------------------------------------------------------------- public API


def _platform_of_backend():
  return "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "tpu"


def _fit_blocks(bs: BlockSizes, n: int, v: int, platform: str) -> tuple[int, int]:
  """Checks `bs` for the platform and shrinks it to small arrays."""
  bn, bv = bs.block_n, bs.block_v
  if bn < 1 or bv < 1:
    raise ValueError(f"reverse_kl: {bs=} must have positive block sizes")
  if platform == "gpu":
    for name, b in (("block_n", bn), ("block_v", bv)):
      if b & (b - 1):
        raise ValueError(f"reverse_kl: {name}={b} must be a power of 2 for the GPU kernel")
    return min(bn, pl.next_power_of_2(n)), min(bv, pl.next_power_of_2(v))
  bn, bv = min(bn, n), min(bv, v)  # a block equal to the full dimension is always legal
  if bn % 8 and bn != n:
    raise ValueError(f"reverse_kl: block_n={bn} must be a multiple of 8 (TPU sublanes) or {n=}")
  if bv % 128 and bv != v:
    raise ValueError(f"reverse_kl: block_v={bv} must be a multiple of 128 (TPU lanes) or {v=}")
  return bn, bv


@functools.partial(jax.jit, static_argnames=(
    "impl", "block_sizes", "chunk_tokens", "platform", "interpret"))
def reverse_kl(
    student_logits: jax.Array,
    teacher_logits: jax.Array,
    *,
    impl: Literal["pallas", "xla"] = "pallas",
    block_sizes: BlockSizes | None = None,
    chunk_tokens: int | None = None,
    platform: Literal["tpu", "gpu"] | None = None,
    interpret: bool | None = None,
) -> jax.Array:
  """Per-token KL(softmax(student) || softmax(teacher)) over the last axis, in float32.

  student_logits, teacher_logits: [..., V], same shape (any float dtypes). Returns [...].
  impl: "pallas" (fused kernel; interpreted on CPU) or "xla" (token-chunked, memory-bounded);
    which one a train step runs ("auto") is decided by smjax.kernels.dispatch.reverse_kl.
  platform: which Pallas variant ("tpu" grid reduction, "gpu" in-kernel loop); defaults to the
    backend's (the tpu variant on CPU).
  chunk_tokens: tokens per chunk of the xla path (default: about 2**20 logits a chunk).
  Differentiable w.r.t. both logits (custom_vjp, never materialises [tokens, V] probabilities).
  """
  if student_logits.shape != teacher_logits.shape:
    raise ValueError(
        f"reverse_kl: student_logits {student_logits.shape} and teacher_logits "
        f"{teacher_logits.shape} must have the same shape (same vocabulary)")
  if student_logits.ndim < 1 or student_logits.shape[-1] < 1:
    raise ValueError(f"reverse_kl: logits {student_logits.shape} need a non-empty vocab axis")
  for name, x in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f"reverse_kl: {name} dtype {x.dtype} must be floating")
  if impl not in ("pallas", "xla"):
    raise ValueError(f"reverse_kl: {impl=} must be 'pallas' or 'xla' (smjax.kernels.dispatch."
                     "reverse_kl resolves 'auto')")
  if platform not in (None, "tpu", "gpu"):
    raise ValueError(f"reverse_kl: {platform=} must be None, 'tpu' or 'gpu'")
  on_cpu = jax.default_backend() == "cpu"
  *lead, v = student_logits.shape
  n = math.prod(lead)
  if n == 0:
    return jnp.zeros(tuple(lead), _F32)
  platform = platform or _platform_of_backend()
  bn, bv = _fit_blocks(block_sizes or BlockSizes.get_default(platform), n, v, platform)
  if chunk_tokens is not None and chunk_tokens < 1:
    raise ValueError(f"reverse_kl: {chunk_tokens=} must be >= 1")
  chunk = min(n, chunk_tokens or max(1, 2**20 // v))
  cfg = _Config(impl, platform, bn, bv, chunk, on_cpu if interpret is None else interpret)
  kl = _reverse_kl_nv(student_logits.reshape(n, v), teacher_logits.reshape(n, v), cfg)
  return kl.reshape(tuple(lead))


def reverse_kl_reference(student_logits: jax.Array, teacher_logits: jax.Array) -> jax.Array:
  """Plain jnp KL(p_s || p_t) over the last axis (materialises everything); float32. A token
  with p_s = 0 (-inf student logit) adds 0 by a select (0 * -inf: nan value and gradient)."""
  log_p = jax.nn.log_softmax(student_logits.astype(_F32), axis=-1)
  log_q = jax.nn.log_softmax(teacher_logits.astype(_F32), axis=-1)
  p = jnp.exp(log_p)
  return jnp.sum(p * jnp.where(p > 0, log_p - log_q, 0.0), axis=-1)
