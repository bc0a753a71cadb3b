"""FLOPs of compiled executables (XLA cost analysis) and the analytic "useful" count beside them.

A FLOP is what XLA's cost analysis of the compiled executable says it does, times how often it ran
(docs/design.md#flop-accounting). The rules this file holds to:

- **Global FLOPs.** XLA's cost analysis of an SPMD program reports the FLOPs of *one device's*
  program (a matmul sharded 8 ways reports 2·M·N·K / 8). `compiled_flops` multiplies by the number
  of devices the executable runs on, so every figure here and in the ledger is the FLOPs executed by
  all devices together. Replicated compute is executed on every device and so counted on every
  device, like padded compute: what runs is what is counted. Every process computes the same global
  figure; do not sum ledgers over hosts.
- **Loops.** XLA counts a `lax.while_loop`/`lax.scan` body once, so loops are counted per iteration
  on the host: a `ProgramCall` of the body program with `calls = iterations actually run`. For a
  loop program with work outside its body, count the loop program once plus the body program
  `iterations - 1` times.
- **Pallas kernels.** Compiled for TPU (an ahead-of-time v5e compile through smjax/aot.py), a
  `pallas_call` is a custom call whose cost-analysis FLOPs are exactly its `pl.CostEstimate.flops`
  (tests/test_aot.py checks this when libtpu is installed).
  In `interpret=True` mode (CPU) the kernel is lowered to ordinary HLO with the grid as a loop, so
  XLA counts the interpreter's ops for *one grid step* and ignores the estimate. Programs that run a
  kernel in interpret mode should set `ProgramCall(flops_override=...)` (their jnp-path count, or
  the rest of the program plus the kernel's CostEstimate flops) when their count matters.
- **Cache.** Counting compiles the program once per (function, shape/dtype/sharding/static-value
  signature); asking again in the hot loop compiles nothing. A program compiled only to be counted
  (`ProgramCall(count_only=True)`: a loop body that runs inside its loop program, never alone)
  is compiled on the CPU with LLVM's optimisation off (`COUNT_ONLY_CPU_OPTIONS`): the HLO passes,
  and so the count, are the same; code generation, which nothing runs, costs less.
- FLOPs are Python ints (XLA's counts are integral), so ledger sums are exact at any size.

The analytic counts use the project's legend (docs/design.md#shape-legend) for the model's
sizes: D model dim, N query heads, K kv heads, H head dim, F mlp dim, V vocab, L layers; token and
key counts are named in words.
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
import weakref
from typing import Any, Callable

import jax

# XLA options for a program compiled only to be counted, on the CPU: LLVM's passes only (what code
# comes out), not the HLO passes that cost analysis reads (tests/test_flops.py checks the count).
COUNT_ONLY_CPU_OPTIONS = {"xla_backend_optimization_level": 0,
                          "xla_llvm_disable_expensive_passes": True}

# fn -> {signature: _Entry}; weak so a dropped jitted function frees its entries.
_COST_CACHE: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()
_JIT_WRAPPERS: "weakref.WeakKeyDictionary[Callable, Callable]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class CompiledCost:
  """The cost of one call of a compiled executable."""
  flops: int               # global: per-device FLOPs x devices
  flops_per_device: float  # as XLA's cost analysis reports it
  devices: int
  program: str             # "<function name>#<signature hash>", stable across processes


def _leaf_signature(x):
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return (tuple(x.shape), str(x.dtype), getattr(x, "sharding", None))
  try:
    hash(x)
    return ("static", type(x).__name__, x)
  except TypeError:
    return ("static", type(x).__name__, repr(x))


def _signature(args, kwargs) -> tuple:
  leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
  return (tree,) + tuple(_leaf_signature(x) for x in leaves)


def _abstract(x):
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    # An uncommitted array (jax.random.key(0), a fresh jnp constant) follows the other arguments
    # to their devices when called; keeping its default-device sharding here would make the
    # lowering fail next to mesh-sharded arguments ("incompatible devices").
    sharding = getattr(x, "sharding", None) if getattr(x, "committed", True) else None
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return x


def _as_jitted(fn: Callable) -> Callable:
  if hasattr(fn, "lower"):
    return fn
  if fn not in _JIT_WRAPPERS:
    _JIT_WRAPPERS[fn] = jax.jit(fn)
  return _JIT_WRAPPERS[fn]


def _raw_cost(compiled) -> dict[str, float]:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax returned one dict per device program
    cost = cost[0] if cost else {}
  return dict(cost or {})


def executable_devices(compiled) -> int:
  """How many devices a compiled executable runs on (read off its input/output shardings)."""
  shardings = jax.tree.leaves((compiled.input_shardings, compiled.output_shardings))
  return max((len(s.device_set) for s in shardings if hasattr(s, "device_set")), default=1)


def executable_flops(compiled) -> tuple[int, float, int]:
  """(global FLOPs, per-device FLOPs, devices) of a `jax.stages.Compiled`."""
  cost = _raw_cost(compiled)
  if "flops" not in cost:
    warnings.warn(f"XLA cost analysis has no 'flops' entry for this executable (keys "
                  f"{sorted(cost)}); counting it as 0 FLOPs", RuntimeWarning, stacklevel=2)
  per_device = float(cost.get("flops", 0.0))
  devices = executable_devices(compiled)
  return int(round(per_device * devices)), per_device, devices


def _lower(jitted, args, kwargs):
  return jitted.lower(*jax.tree.map(_abstract, args), **jax.tree.map(_abstract, kwargs))


def cost_analysis(jitted: Callable, *args, **kwargs) -> dict[str, float]:
  """XLA's raw cost-analysis dict of `jitted` compiled for these argument shapes (not cached).

  Per device, as XLA reports it: use `compiled_flops` for global FLOPs.
  """
  return _raw_cost(_lower(_as_jitted(jitted), args, kwargs).compile())


def compiled_cost(jitted: Callable, *args, **kwargs) -> CompiledCost:
  """The `CompiledCost` of one call of `jitted` on arguments like these (cached per signature).

  `args`/`kwargs` may be arrays (their shardings are kept), `jax.ShapeDtypeStruct`s, or static
  values, passed as the real call would pass them. A callable without `.lower` is jitted first.
  """
  return _compiled_cost(_as_jitted(jitted), args, kwargs, count_only=False)


def _compiled_cost(jitted, args, kwargs, *, count_only: bool) -> CompiledCost:
  per_fn = _COST_CACHE.setdefault(jitted, {})
  sig = _signature(args, kwargs)
  if sig not in per_fn:
    lowered = _lower(jitted, args, kwargs)
    cpu = all(d.platform == "cpu" for d in jax.devices())
    compiled = (lowered.compile(compiler_options=dict(COUNT_ONLY_CPU_OPTIONS))
                if count_only and cpu else lowered.compile())
    flops, per_device, devices = executable_flops(compiled)
    name = getattr(jitted, "__name__", type(jitted).__name__)
    digest = hashlib.blake2b(repr(sig).encode(), digest_size=4).hexdigest()
    per_fn[sig] = CompiledCost(flops, per_device, devices, f"{name}#{digest}")
  return per_fn[sig]


def compiled_flops(jitted: Callable, *args, **kwargs) -> float:
  """Global FLOPs of one call of `jitted` on arguments of these shapes, from XLA's cost analysis.

  Per-device cost x devices the program runs on (module docstring). Cached per (function,
  shape/dtype/sharding/static-value signature), so asking in a hot loop compiles nothing after the
  first time. Returned as a float holding an integer (kept for callers written against the first
  version); the ledger stores ints.
  """
  return float(compiled_cost(jitted, *args, **kwargs).flops)


@dataclasses.dataclass
class ProgramCall:
  """One executable that ran `calls` times in a ledger phase (e.g. the decode step x steps run).

  `fn` is a jitted function and `args`/`kwargs` arrays or ShapeDtypeStructs of one call; the FLOPs
  are computed lazily (and cached) by `flops_per_call()`. `useful` is the analytic count for the
  same work, i.e. for all `calls` together (see `analytic_flops`). `flops_override`, when set,
  replaces the compiled per-call count (interpret-mode Pallas, or work XLA cannot see); `program`
  names the record in the ledger (default: function name and signature hash). Keep one jitted
  object per program: the FLOP cache is keyed by it, so a fresh `jax.jit(f)` compiles again.
  `count_only`: `fn` never runs with these arguments (a loop body counted per iteration), so its
  compile for the count may skip code-generation work (module docstring, "Cache").
  """
  phase: str
  fn: Callable
  args: tuple
  kwargs: dict = dataclasses.field(default_factory=dict)
  calls: int = 1
  useful: float = 0.0
  flops_override: float | None = None
  program: str = ""
  count_only: bool = False

  def _cost(self) -> CompiledCost:
    return _compiled_cost(_as_jitted(self.fn), self.args, self.kwargs, count_only=self.count_only)

  def flops_per_call(self) -> float:
    if self.flops_override is not None:
      return float(self.flops_override)
    return float(self._cost().flops)

  def flops(self) -> float:
    return self.flops_per_call() * self.calls

  def program_name(self) -> str:
    if self.program:
      return self.program
    if self.flops_override is not None:
      return getattr(self.fn, "__name__", "program") + "#override"
    return self._cost().program


def shape_struct(x: Any):
  """A ShapeDtypeStruct for an array (keeps its sharding), other leaves unchanged."""
  return _abstract(x)


# ----------------------------------------------------------------------------- analytic counts

def matmul_params(cfg) -> int:
  """N of the analytic count: the weights each token multiplies once per forward pass.

  Every attention projection (q, k, v, o) and MLP projection (gate, up, down) of every layer, plus
  the unembedding D·V, which is counted whether or not it is tied to the embedding, since the
  matmul runs either way. Excluded: the embedding lookup (a gather, no FLOPs) and the O(D) RMSNorm
  scales and QKV biases (elementwise). So N = `cfg.num_params(include_embedding=False)` - norm
  scales - biases + D·V.
  """
  d, n, k, h, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
  layer_DNH = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f
  return cfg.n_layers * layer_DNH + d * cfg.vocab_size


def analytic_flops(cfg, *, tokens: int, context_len: float, backward: bool,
                   causal: bool = False, logit_tokens: int | None = None) -> int | float:
  """Analytic ("useful") FLOPs of running `tokens` tokens through the model (PaLM/levanter style).

  Forward: `2·N·tokens` (N = `matmul_params(cfg)`) plus attention `2·2·L·tokens·S·N_heads·H` for
  QK^T and PV, where S = `context_len` keys per query. Forward + backward: 3x that (`6·N·tokens`
  + 3x attention). With `causal=False` (default) every query attends to all `context_len` keys,
  which is what the dense attention here computes (the causal mask is applied to a full T x S score
  matrix) and what PaLM and Megatron count. `causal=True` counts only visible keys: `tokens` must
  be whole sequences of length `context_len`, and a query attends on average to
  (context_len + 1) / 2 keys. For a decode step pass the cache slots attended as `context_len`.

  Not counted (XLA counts them, so the measured figure is a little higher): RMSNorm, RoPE, softmax,
  SiLU, residual adds, masking, the loss's log-softmax, and the optimiser update.
  For the "useful" figure pass the real (unpadded) tokens; padding is in the measured count.
  `logit_tokens` (default: all `tokens`) counts the unembedding only for tokens whose logits are
  computed (a prefill that projects just the last position). A float `context_len` (a mean over
  rows) gives a float result; all-int arguments give an exact int.
  """
  if tokens < 0 or context_len < 0:
    raise ValueError(f"analytic_flops: {tokens=} and {context_len=} must be >= 0")
  head = cfg.d_model * cfg.vocab_size
  logit_tokens = tokens if logit_tokens is None else logit_tokens
  dense = 2 * (matmul_params(cfg) - head) * tokens + 2 * head * logit_tokens
  per_key = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * tokens  # QK^T + PV, per key slot
  if causal:
    visible = per_key * (context_len + 1)  # x 1/2: the mean of 1..context_len keys
    attention = visible // 2 if isinstance(visible, int) else visible / 2
  else:
    attention = per_key * context_len
  forward = dense + attention
  return 3 * forward if backward else forward
