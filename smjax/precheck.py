"""Before a pod launch: compile the train step for the target mesh here and check it fits.

    python -m smjax.precheck --preset qwen3-8b --mesh data=4,fsdp=16,tensor=1 --batch 64 \
        --seq 2048 [--topology v5p-128] [--hbm-gib 95] [--objective grpo] [--dtype bfloat16]

compiles the GRPO (or OPD) update step ahead of time for the mesh, with the state and batch built
abstractly (`jax.eval_shape`: nothing is allocated, so an 8B model compiles on a laptop), and
prints its FLOPs (XLA cost analysis, global and per device, beside the analytic count) and its
memory per device. It exits 1 if the per-device total exceeds `--hbm-gib` (default: the HBM of the
`--topology`'s TPU generation), so an out-of-memory config fails here, not on the pod; 2 on bad
arguments.

Which compiler (smjax/aot.py, printed as "AOT compile path"):
- `--topology v5p-128` (or v5e-64, v6e:8x8, ...) with libtpu installed: compiled by libtpu for
  that TPU topology ("tpu"): the memory figures are the TPU's.
- the same without libtpu ("cpu-fallback"), or no `--topology` ("cpu"): compiled by the CPU
  compiler on as many fake CPU devices as the mesh has (XLA_FLAGS=
  --xla_force_host_platform_device_count=N, set here before jax starts). FLOPs are the same
  partitioned program's; memory is the CPU compiler's estimate (different fusion, layouts and
  temporaries, no TPU-style rematerialisation: for Qwen3-8B it read 2.5x the TPU compiler's
  figure, see launch/README.md), so on this path "DOES NOT FIT" means: check with libtpu.

The losses compile on their XLA paths (impl="xla"): the Pallas kernels would only lower the
temporaries of the loss (the reverse-KL kernel never holds [tokens, V] probabilities), so the
figure errs on the safe side. With --micro-batches > 1 XLA counts the accumulation loop's body
once, so the printed FLOPs are one micro-batch's plus the update (the FLOP ledger multiplies).

`--completion-len C` compiles the step as the study runs it: the LM head and loss on the last C
positions only (the batch's `Layout.completion_len`, smjax.batch); with `--shared-prompt` each
prompt's forward also runs once for its --group-size rows (`Layout.rows_per_prompt`), the prompt
being the first seq - C tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys

OBJECTIVES = ("grpo", "opd-sampled", "opd-full-vocab")
# HBM per jax device (one chip) of the TPU generations the launch scripts create.
HBM_GIB = {"v5e": 16.0, "v5litepod": 16.0, "v6e": 32.0, "v5p": 95.0}


@dataclasses.dataclass(frozen=True)
class Verdict:
  report: object            # smjax.aot.CompileReport
  analytic_flops: int
  total_bytes: int          # per device
  hbm_bytes: int | None     # per device; None: not checked
  fits: bool


def parse_mesh(spec: str) -> dict[str, int]:
  """"data=8,fsdp=8,tensor=1" -> {"data": 8, "fsdp": 8, "tensor": 1}; every size explicit."""
  from smjax.sharding import parse_mesh as parse  # imports jax, but does not start its backend

  shape = parse(spec)
  if any(size < 1 for size in shape.values()):
    raise ValueError(f"--mesh {spec!r}: every axis size must be >= 1 here (no -1)")
  return shape


def default_hbm_gib(topology: str | None) -> float | None:
  if topology is None:
    return None
  m = re.match(r"(v\d+[a-z]*)", topology)
  return HBM_GIB.get(m.group(1)) if m else None


def _abstract_batch(cfg, *, objective: str, batch: int, seq: int, beta: float, layout):
  import jax
  import jax.numpy as jnp

  from smjax.batch import SequenceBatch

  def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)

  B, S, T = batch, seq, seq - 1
  fields = dict(tokens_BS=sds((B, S), jnp.int32), positions_BS=sds((B, S), jnp.int32),
                attn_mask_BS=sds((B, S), jnp.bool_), loss_mask_BT=sds((B, T), jnp.bool_))
  if objective in ("grpo", "opd-sampled"):
    fields["old_logp_BT"] = sds((B, T), jnp.float32)
  if objective == "grpo":
    fields["rewards_B"] = sds((B,), jnp.float32)
    if beta:
      fields["ref_logp_BT"] = sds((B, T), jnp.float32)
  elif objective == "opd-sampled":
    fields["teacher_logp_BT"] = sds((B, T), jnp.float32)
  else:
    fields["teacher_logits_BTV"] = sds((B, T, cfg.vocab_size), jnp.float32)
  return SequenceBatch(**fields, layout=layout)


def precheck(cfg, *, mesh_shape: dict[str, int], batch: int, seq: int, objective: str = "grpo",
             group_size: int = 8, beta: float = 0.0, micro_batches: int = 1,
             topology: str | None = None, hbm_gib: float | None = None,
             completion_len: int = 0, shared_prompt: bool = False) -> Verdict:
  """Compiles the `objective` train step of model `cfg` for `mesh_shape` (see module docstring)
  and compares its per-device memory with `hbm_gib`. The devices must exist in this process:
  fake CPU devices are set up by `main`, or by XLA_FLAGS before jax starts."""
  import jax

  from smjax import aot
  from smjax import sharding as shd
  from smjax.batch import Layout
  from smjax.flops import analytic_flops
  from smjax.models.transformer import Transformer
  from smjax.train import steps as st
  from smjax.train.state import OptimizerConfig, make_optimizer

  if objective not in OBJECTIVES:
    raise ValueError(f"precheck: {objective=} must be one of {OBJECTIVES}")
  if seq < 2:
    raise ValueError(f"precheck: {seq=} must be >= 2 (one prompt token and one target)")
  if (objective == "grpo" or shared_prompt) and batch % group_size:
    raise ValueError(f"precheck: {batch=} rows must be a multiple of {group_size=}")
  if not 0 <= completion_len < seq:
    raise ValueError(f"precheck: --completion-len {completion_len} must be in [0, seq={seq}) "
                     "(0: the loss over every position)")
  if shared_prompt and not completion_len:
    raise ValueError("precheck: --shared-prompt needs --completion-len (the prompt is the first "
                     "seq - completion_len tokens)")
  model = Transformer(cfg)
  tx = make_optimizer(OptimizerConfig())
  layout = Layout(completion_len=completion_len,
                  rows_per_prompt=group_size if shared_prompt else 1, group_size=group_size)
  if objective == "grpo":
    step_def = st.make_grpo_step(model, tx, st.GRPOConfig(
        group_size=group_size, beta=beta, micro_batches=micro_batches, impl="xla"))
  else:
    step_def = st.make_opd_step(model, tx, st.OPDConfig(
        objective=objective.removeprefix("opd-").replace("-", "_"), micro_batches=micro_batches,
        impl="xla"))
  abstract_batch = _abstract_batch(cfg, objective=objective, batch=batch, seq=seq, beta=beta,
                                   layout=layout)

  cache = {}

  def state_and_batch(mesh):  # (state shardings, batch shardings, abstract args), once per mesh
    if mesh not in cache:
      state, state_shards = shd.abstract_train_state(cfg, tx, mesh)
      batch_shards = shd.batch_shardings(abstract_batch, mesh)
      placed = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            abstract_batch, batch_shards)
      cache[mesh] = (state_shards, batch_shards, (state, placed))
    return cache[mesh]

  report = aot.compile_report(
      step_def.step, lambda mesh: state_and_batch(mesh)[2], topology=topology,
      mesh_shape=mesh_shape, donate_argnums=(0,),
      in_shardings=lambda mesh: state_and_batch(mesh)[:2],
      out_shardings=lambda mesh: (state_and_batch(mesh)[0], None))
  total = int(report.memory.get("total", 0))
  hbm = None if hbm_gib is None else int(hbm_gib * 2**30)
  # Tokens through the body (a shared prompt once per group), logits on the kept positions only;
  # every query counted against all seq keys (what the dense attention computes).
  C = completion_len or seq
  tokens = batch * C + (batch // group_size if shared_prompt else batch) * (seq - C)
  analytic = analytic_flops(cfg, tokens=tokens, context_len=seq, backward=True,
                            logit_tokens=batch * C)
  return Verdict(report, analytic, total, hbm, hbm is None or total <= hbm)


def format_verdict(v: Verdict, *, cfg, batch: int, seq: int, objective: str,
                   micro_batches: int = 1, completion_len: int = 0,
                   shared_prompt: bool = False) -> str:
  r = v.report
  gib = lambda b: f"{b / 2**30:.3f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"  # noqa: E731
  mem = r.memory
  lines = [r.summary().splitlines()[0],
           f"  step: {objective} update, model {cfg.name} ({cfg.n_layers} layers, "
           f"{cfg.num_params() / 1e6:,.1f}M params, params {cfg.param_dtype}, compute {cfg.dtype}),"
           f" batch {batch} x seq {seq}" + (
               f", loss on the last {completion_len} positions" if completion_len else "") + (
               ", each prompt once per group" if shared_prompt else ""),
           f"  flops: {r.flops:.4e} global, {r.flops_per_device:.4e} per device; analytic "
           f"6*N*tokens + attention = {v.analytic_flops:.4e} (measured/analytic "
           f"{r.flops / max(v.analytic_flops, 1):.3f})" + (
               f"; {micro_batches} micro-batches: the loop body is counted once"
               if micro_batches > 1 else ""),
           "  memory per device: " + ", ".join(f"{k} {gib(mem.get(k, 0))}" for k in (
               "argument", "output", "alias", "temp", "peak", "total"))]
  if r.note:
    lines.append(f"  note: {r.note}")
  if r.path != "tpu":
    lines.append(f"  memory source: the CPU compiler ({r.path} path), an estimate; it read 2.5x "
                 f"the TPU compiler's figure for Qwen3-8B (launch/README.md): confirm a DOES NOT "
                 f"FIT with libtpu (--topology) before shrinking the run")
  if v.hbm_bytes is None:
    lines.append(f"  HBM check: skipped (no --hbm-gib and no known TPU generation); per-device "
                 f"total {gib(v.total_bytes)}")
  else:
    verdict = "fits" if v.fits else "DOES NOT FIT"
    lines.append(f"  HBM check: per-device total {gib(v.total_bytes)} vs {gib(v.hbm_bytes)} "
                 f"HBM: {verdict}")
  return "\n".join(lines)


def _ensure_cpu_devices(n: int) -> None:
  """Fake CPU devices must be set before jax's backend starts: put the flag in XLA_FLAGS."""
  flag = "--xla_force_host_platform_device_count"
  flags = os.environ.get("XLA_FLAGS", "")
  m = re.search(flag + r"=(\d+)", flags)
  if m and int(m.group(1)) >= n:
    return
  if "jax" in sys.modules:
    from jax._src import xla_bridge
    if xla_bridge.backends_are_initialized():
      raise RuntimeError(f"precheck needs {n} CPU devices but jax has already started: run it as "
                         f"a fresh process (python -m smjax.precheck) or set XLA_FLAGS={flag}={n}")
  flags = re.sub(flag + r"=\d+", "", flags)
  os.environ["XLA_FLAGS"] = f"{flags} {flag}={n}".strip()


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m smjax.precheck",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--preset", required=True, help="model preset, e.g. qwen3-8b")
  p.add_argument("--mesh", required=True, help="data=N,fsdp=N,tensor=N")
  p.add_argument("--batch", type=int, required=True, help="rows of the step (prompts x group)")
  p.add_argument("--seq", type=int, required=True, help="tokens per row (prompt + completion)")
  p.add_argument("--objective", default="grpo", choices=OBJECTIVES)
  p.add_argument("--group-size", type=int, default=8)
  p.add_argument("--beta", type=float, default=0.0, help="GRPO KL weight (>0 adds ref log-probs)")
  p.add_argument("--micro-batches", type=int, default=1)
  p.add_argument("--completion-len", type=int, default=0,
                 help="LM head and loss on the last N positions only (0: all)")
  p.add_argument("--shared-prompt", action="store_true",
                 help="each prompt's forward once for its --group-size rows (needs "
                      "--completion-len)")
  p.add_argument("--topology", default=None, help="TPU topology, e.g. v5p-128, v5e:8x8")
  p.add_argument("--hbm-gib", type=float, default=None,
                 help="per-device HBM to check against (default: the topology's)")
  p.add_argument("--layers", type=int, default=None, help="truncate the preset to N layers")
  p.add_argument("--param-dtype", default=None, choices=("float32", "bfloat16"))
  p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                 help="activation compute dtype")
  a = p.parse_args(argv)
  try:
    mesh_shape = parse_mesh(a.mesh)
  except ValueError as e:
    p.error(str(e))
  devices = math.prod(mesh_shape.values())
  if a.topology is None:
    _ensure_cpu_devices(devices)
    topology = f"cpu:{devices}"
  else:
    topology = a.topology
    _ensure_cpu_devices(devices)  # used only if libtpu is unavailable (cpu-fallback)

  from smjax.models.presets import get_preset

  overrides = {k: v for k, v in (("n_layers", a.layers), ("param_dtype", a.param_dtype),
                                 ("dtype", a.dtype)) if v is not None}
  try:
    cfg = get_preset(a.preset, **overrides)
    hbm = a.hbm_gib if a.hbm_gib is not None else default_hbm_gib(a.topology)
    verdict = precheck(cfg, mesh_shape=mesh_shape, batch=a.batch, seq=a.seq,
                       objective=a.objective, group_size=a.group_size, beta=a.beta,
                       micro_batches=a.micro_batches, topology=topology, hbm_gib=hbm,
                       completion_len=a.completion_len, shared_prompt=a.shared_prompt)
  except ValueError as e:
    print(f"precheck: error: {e}", file=sys.stderr)
    return 2
  except NotImplementedError as e:  # jax.make_mesh on a TPU torus (smjax/aot.py builds the mesh)
    print(f"precheck: error: mesh {mesh_shape} does not map onto the {a.topology} torus: each mesh "
          f"axis must be a product of the torus axes ({str(e)[:200]})", file=sys.stderr)
    return 2
  print(format_verdict(verdict, cfg=cfg, batch=a.batch, seq=a.seq, objective=a.objective,
                       micro_batches=a.micro_batches, completion_len=a.completion_len,
                       shared_prompt=a.shared_prompt), flush=True)
  return 0 if verdict.fits else 1


if __name__ == "__main__":
  sys.exit(main())
