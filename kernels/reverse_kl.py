"""Fused per-token full-vocabulary reverse KL, KL(p_s || p_t), without [tokens, V] probabilities.

    KL = sum_v p_s(v) (a_v - b_v),  a = s - lse(s),  b = t - lse(t),  p_s = exp(a)
         = sum_v p_s(v) (s_v - t_v) - lse(s) + lse(t)

Forward: one pass over V blocks with an online log-sum-exp (flash style) keeping, per token, the
running maxima m and sums l = sum exp(x - m) of both distributions and
acc = sum exp(s - m_s) ((s - m_s) - (t - m_t)), rescaled whenever a maximum moves; then
KL = acc / l_s - log l_s + log l_t (the same sum, free of the cancellation between
sum p_s (s - t) and lse_s - lse_t when logits carry large offsets). Backward, blockwise over V
from the saved lse's and KL. With dKL/dp_u = a_u - b_u + 1 and dp_u/ds_v = p_u (delta_uv - p_v):
    dKL/ds_v = p_s(v) ((a_v - b_v + 1) - sum_u p_s(u) (a_u - b_u + 1)) = p_s(v) ((a_v - b_v) - KL)
    dKL/dt_v = -sum_u p_s(u) (delta_uv - p_t(v)) = p_t(v) - p_s(v).
The teacher gradient is computed only when the teacher logits are differentiated (symbolic
zeros); in OPD the teacher is a constant and costs nothing in the backward.

Three implementations, one math (`_online_update`, `_finalize`, `_grad_block` below):
- Pallas "tpu" variant (Mosaic): grid (token blocks, V blocks), V innermost and sequential,
  running statistics in VMEM scratch, lane-replicated [tokens, 128] statistics (the (8, 128)
  tiling).
- Pallas "gpu" variant (Triton): grid over token blocks; V is a fori_loop inside the kernel with
  masked loads (Triton has no sequential grid axis and no scratch); power-of-two blocks.
- "xla": a fori_loop over token chunks (custom_vjp too), so neither pass holds more than
  [chunk, V] temporaries; what smjax.kernels.dispatch runs on CPU.
Tested here on CPU: both Pallas variants in interpret mode, and their lowering to Mosaic MLIR /
Triton IR (lowering_platforms=("tpu",) / ("cuda",)). Compiling and running on a TPU or GPU, and
the default block sizes, are unverified. Vocab and token counts need not divide the blocks: tails
are masked.

Legend (DESIGN.md §4): V vocab; the token axis (any leading dims flattened) is named in words
(`tokens`, `_tokV`), and `block_n` is the tokens per block.
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

LANES = 128  # statistics are replicated over one lane tile: the (8, 128) TPU layout
_NEG = -1e30  # finite "minus infinity" for running maxima: exp(_NEG - _NEG) = 1, not nan
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
  neg = jnp.full((block_n, 1), _NEG, _F32)
  zero = jnp.zeros((block_n, 1), _F32)
  return (neg, zero, neg, zero, zero)  # m_s, l_s, m_t, l_t, acc


def _online_update(carry, s, t, valid):
  """Folds one [n, v] block (f32) into the running (m_s, l_s, m_t, l_t, acc), each [n, 1].

  acc = sum exp(s - m_s) ((s - m_s) - (t - m_t)): measured from the running maxima, so the
  result does not lose precision to large logit offsets (s - t and lse_s - lse_t would cancel).
  """
  m_s, l_s, m_t, l_t, acc = carry
  if valid is not None:
    s = jnp.where(valid, s, -jnp.inf)
    t = jnp.where(valid, t, -jnp.inf)
  m_s_new = jnp.maximum(m_s, jnp.max(s, axis=1, keepdims=True))
  m_t_new = jnp.maximum(m_t, jnp.max(t, axis=1, keepdims=True))
  alpha_s = jnp.exp(m_s - m_s_new)
  e_s = jnp.exp(s - m_s_new)
  e_t = jnp.exp(t - m_t_new)
  # where p_s = 0 (masked tail, -inf student logit) the term is 0, not 0 * (-inf - -inf)
  term = jnp.where(e_s > 0, e_s * ((s - m_s_new) - (t - m_t_new)), 0.0)
  shift = (m_s - m_t) - (m_s_new - m_t_new)  # re-reference the old acc to the new maxima
  return (
      m_s_new,
      alpha_s * l_s + jnp.sum(e_s, axis=1, keepdims=True),
      m_t_new,
      jnp.exp(m_t - m_t_new) * l_t + jnp.sum(e_t, axis=1, keepdims=True),
      alpha_s * (acc + l_s * shift) + jnp.sum(term, axis=1, keepdims=True),
  )


def _finalize(carry):
  """(kl, lse_s, lse_t), each [n, 1], from the running statistics."""
  m_s, l_s, m_t, l_t, acc = carry
  log_l_s, log_l_t = jnp.log(l_s), jnp.log(l_t)
  return acc / l_s - log_l_s + log_l_t, m_s + log_l_s, m_t + log_l_t


def _grad_block(s, t, lse_s, lse_t, kl, g, want_t):
  """Cotangents of a [n, v] block (f32); lse_s, lse_t, kl, g are [n, 1]."""
  a = s - lse_s
  p_s = jnp.exp(a)
  ds = jnp.where(p_s > 0, g * p_s * (a - (t - lse_t) - kl), 0.0)
  dt = g * (jnp.exp(t - lse_t) - p_s) if want_t else None
  return ds, dt


# --------------------------------------------------------------------------- Pallas kernels


def _col(x):
  # Lanes are replicated; a lane reduction is portable on Mosaic and Triton, lane slicing is not.
  return jnp.max(x, axis=1, keepdims=True)


def _fwd_kernel_tpu(s_ref, t_ref, kl_ref, lse_s_ref, lse_t_ref, *scratch, n_cols, block_v):
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    for ref, val in zip(scratch, (_NEG, 0.0, _NEG, 0.0, 0.0)):
      ref[...] = jnp.full(ref.shape, val, _F32)

  s = s_ref[...].astype(_F32)
  t = t_ref[...].astype(_F32)
  valid = None
  if n_cols % block_v:  # the last V block reads past the vocabulary
    valid = j * block_v + lax.broadcasted_iota(jnp.int32, s.shape, 1) < n_cols
  carry = _online_update(tuple(_col(r[...]) for r in scratch), s, t, valid)
  for ref, val in zip(scratch, carry):
    ref[...] = jnp.broadcast_to(val, ref.shape)

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    for ref, val in zip((kl_ref, lse_s_ref, lse_t_ref), _finalize(carry)):
      ref[...] = jnp.broadcast_to(val, ref.shape)


def _fwd_kernel_gpu(s_ref, t_ref, kl_ref, lse_s_ref, lse_t_ref, *, n_rows, n_cols, block_n,
                    block_v):
  rows = pl.program_id(0) * block_n + lax.broadcasted_iota(jnp.int32, (block_n, 1), 0)
  row_ok = rows < n_rows

  def body(j, carry):
    cols = j * block_v + lax.broadcasted_iota(jnp.int32, (1, block_v), 1)
    valid = row_ok & (cols < n_cols)
    idx = (slice(None), pl.ds(j * block_v, block_v))
    s = plgpu.load(s_ref.at[idx], mask=valid, other=0.0).astype(_F32)
    t = plgpu.load(t_ref.at[idx], mask=valid, other=0.0).astype(_F32)
    return _online_update(carry, s, t, valid)

  carry = lax.fori_loop(0, pl.cdiv(n_cols, block_v), body, _init(block_n))
  store_ok = jnp.broadcast_to(row_ok, (block_n, LANES))
  for ref, val in zip((kl_ref, lse_s_ref, lse_t_ref), _finalize(carry)):
    plgpu.store(ref, jnp.broadcast_to(val, (block_n, LANES)), mask=store_ok)


def _bwd_kernel(s_ref, t_ref, lse_s_ref, lse_t_ref, kl_ref, g_ref, *out_refs,
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
  s = load(s_ref, ok).astype(_F32)
  t = load(t_ref, ok).astype(_F32)
  stats = [_col(load(r, stat_ok)) for r in (lse_s_ref, lse_t_ref, kl_ref, g_ref)]
  grads = _grad_block(s, t, *stats, want_t=len(out_refs) == 2)
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
  stat_shape = jax.ShapeDtypeStruct((n, LANES), _F32)
  cost = pl.CostEstimate(
      flops=12 * n * v, transcendentals=2 * n * v,
      bytes_accessed=n * v * (s.dtype.itemsize + t.dtype.itemsize) + 3 * n * LANES * 4)
  if cfg.platform == "tpu":
    call = pl.pallas_call(
        functools.partial(_fwd_kernel_tpu, n_cols=v, block_v=bv),
        grid=(pl.cdiv(n, bn), pl.cdiv(v, bv)),
        in_specs=[pl.BlockSpec((bn, bv), lambda i, j: (i, j))] * 2,
        out_specs=[_stat_spec(bn, 2)] * 3,
        scratch_shapes=[pltpu.VMEM((bn, LANES), _F32)] * 5,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        out_shape=[stat_shape] * 3, cost_estimate=cost, interpret=cfg.interpret,
        name="reverse_kl_fwd")
  else:
    call = pl.pallas_call(
        functools.partial(_fwd_kernel_gpu, n_rows=n, n_cols=v, block_n=bn, block_v=bv),
        grid=(pl.cdiv(n, bn),),
        in_specs=[pl.BlockSpec((bn, v), lambda i: (i, 0))] * 2,
        out_specs=[_stat_spec(bn, 1)] * 3,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        out_shape=[stat_shape] * 3, cost_estimate=cost, interpret=cfg.interpret,
        name="reverse_kl_fwd")
  return tuple(x[:, 0] for x in call(s, t))


def _pallas_grads(s, t, stats, cfg, want_t):
  n, v = s.shape
  bn, bv = cfg.block_n, cfg.block_v
  stats = [jnp.broadcast_to(x[:, None], (n, LANES)) for x in stats]
  out_shape = [jax.ShapeDtypeStruct(s.shape, s.dtype)]
  if want_t:
    out_shape.append(jax.ShapeDtypeStruct(t.shape, t.dtype))
  tile = pl.BlockSpec((bn, bv), lambda i, j: (i, j))
  if cfg.platform == "tpu":
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"))
  else:
    params = plgpu.CompilerParams(num_warps=4, num_stages=2)
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


def _chunks(n, chunk, body, init):
  # The last chunk is shifted back to end at n (rows recomputed identically), so no
  # [tokens, V] array is ever padded or copied.
  def step(i, carry):
    return body(jnp.minimum(i * chunk, n - chunk), carry)

  return lax.fori_loop(0, pl.cdiv(n, chunk), step, init)


def _xla_stats(s, t, cfg):
  n, _ = s.shape
  c = cfg.chunk

  def body(start, outs):
    s_c = lax.dynamic_slice_in_dim(s, start, c).astype(_F32)
    t_c = lax.dynamic_slice_in_dim(t, start, c).astype(_F32)
    vals = _finalize(_online_update(_init(c), s_c, t_c, None))
    return tuple(lax.dynamic_update_slice_in_dim(o, x[:, 0], start, 0)
                 for o, x in zip(outs, vals))

  return _chunks(n, c, body, (jnp.zeros((n,), _F32),) * 3)


def _xla_grads(s, t, stats, cfg, want_t):
  n, _ = s.shape
  c = cfg.chunk

  def body(start, outs):
    s_c = lax.dynamic_slice_in_dim(s, start, c).astype(_F32)
    t_c = lax.dynamic_slice_in_dim(t, start, c).astype(_F32)
    st = [lax.dynamic_slice_in_dim(x, start, c)[:, None] for x in stats]
    grads = _grad_block(s_c, t_c, *st, want_t=want_t)
    return tuple(lax.dynamic_update_slice_in_dim(o, x.astype(o.dtype), start, 0)
                 for o, x in zip(outs, grads))

  init = (jnp.zeros_like(s),) + ((jnp.zeros_like(t),) if want_t else ())
  grads = _chunks(n, c, body, init)
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
  kl, lse_s, lse_t = _stats(s, t, cfg)
  # None vs () is static pytree structure: it tells the backward whether t needs a gradient.
  want_t = () if t_tokV.perturbed else None
  return kl, (s, t, kl, lse_s, lse_t, want_t)


def _reverse_kl_bwd(cfg, res, g):
  s, t, kl, lse_s, lse_t, want_t = res
  if isinstance(g, SymbolicZero):
    g = jnp.zeros_like(kl)
  grads = _pallas_grads if cfg.impl == "pallas" else _xla_grads
  return grads(s, t, (lse_s, lse_t, kl, g.astype(_F32)), cfg, want_t is not None)


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
  """Plain jnp KL(p_s || p_t) over the last axis (materialises everything); float32."""
  log_p = jax.nn.log_softmax(student_logits.astype(_F32), axis=-1)
  log_q = jax.nn.log_softmax(teacher_logits.astype(_F32), axis=-1)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
