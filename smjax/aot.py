"""Ahead-of-time compile of a step for a device topology, on this machine: FLOPs and memory.

maxtext's train_compile.py idea: compile for the pod you mean to rent, from a CPU, and read the
compiled program's cost and memory analysis before paying for it. Paths, in the order tried:

- "tpu": a named TPU topology ("v5e:2x4", "v4:2x2x1", "v6e:2x2", aliases "v5e-8", "v5p-8" ...)
  through libtpu's compile-only devices (`jax.experimental.topologies.get_topology_desc`). Needs
  the libtpu wheel matching jax (jax 0.10.2: `pip install "libtpu==0.0.42.*"`; it installs and
  compiles on x86 CPU machines without a TPU) or `TPU_LIBRARY_PATH` pointing at a libtpu.so.
  Pallas kernels are compiled for real here and counted by their `pl.CostEstimate`.
- "cpu-fallback": the TPU topology is unavailable (no libtpu, or libtpu rejected the name), so the
  same mesh is compiled on as many (fake) CPU devices. An approximation in both figures: memory
  has CPU layouts (no TPU (8, 128) tiling), CPU fusion and temporaries; FLOPs are the CPU
  compiler's partitioning of the same mesh. Measured against libtpu (v5e:2x4, toy/d256/d512
  decoders): matmuls are identical and pure data parallelism agrees within ~1%, but with fsdp and
  tensor axes the TPU partitioner made different choices (a d128 grad step counted 15% more
  FLOPs on TPU: more replicated compute). Use the "tpu" path for numbers that matter.
- "cpu" ("cpu:8"): this process's CPU devices; "local" (topology=None): jax.devices().

Fake CPU devices must exist before jax's backend starts: when it has not started yet, this module
sets `jax_num_cpu_devices` itself; otherwise start the process with
XLA_FLAGS=--xla_force_host_platform_device_count=N.

All figures are per device except `flops`, which is global (per-device x devices, smjax/flops.py).
CLI: `python -m smjax.aot --preset qwen3-0.6b --topology v5e:2x4 --mesh data=2,fsdp=4 --batch 8
--seq 1024 --mode grad` compiles the model's forward (+ backward) and prints the report beside the
analytic count.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from typing import Any, Callable

import jax
from jax.sharding import AxisType

from smjax.flops import executable_flops

# Accelerator types (chips for v5e/v6e, TensorCores for v4/v5p) -> topology names libtpu accepts.
_ALIASES = {**{f"{g}-{c}": f"{g}:{d}" for g in ("v5e", "v6e") for c, d in (
    (4, "2x2"), (8, "2x4"), (16, "4x4"), (32, "4x8"), (64, "8x8"), (128, "8x16"), (256, "16x16"))},
            **{f"{g}-{c}": f"{g}:{d}" for g in ("v4", "v5p") for c, d in (
    (8, "2x2x1"), (16, "2x2x2"), (32, "2x2x4"), (64, "2x4x4"), (128, "4x4x4"))}}
_TWO_CORE_DEVICES = ("v2", "v3", "v4")  # libtpu's compile-only devices are per TensorCore there


@dataclasses.dataclass(frozen=True)
class CompileReport:
  """What a compile for `topology` costs: FLOPs (global and per device) and memory per device."""
  path: str                 # "tpu" | "cpu-fallback" | "cpu" | "local"
  topology: str
  device_kind: str
  devices: int
  mesh: dict[str, int]
  flops: int                # global
  flops_per_device: float
  memory: dict[str, int]    # per device, bytes
  note: str = ""

  def summary(self) -> str:
    mem = "  ".join(f"{k}={v / 2**20:.2f}MiB" for k, v in self.memory.items())
    lines = [f"AOT compile path: {self.path}  topology={self.topology}  "
             f"{self.devices} x {self.device_kind}  mesh={self.mesh}",
             f"  flops: {self.flops:.4e} global, {self.flops_per_device:.4e} per device",
             f"  memory per device: {mem}"]
    if self.note:
      lines.append(f"  note: {self.note}")
    return "\n".join(lines)


def libtpu_path() -> str | None:
  """The libtpu.so jax would load: $TPU_LIBRARY_PATH, else the installed `libtpu` package."""
  env = os.environ.get("TPU_LIBRARY_PATH")
  if env and os.path.isfile(env):
    return env
  spec = importlib.util.find_spec("libtpu")
  if spec is not None and spec.origin:
    path = os.path.join(os.path.dirname(spec.origin), "libtpu.so")
    return path if os.path.isfile(path) else None
  return None


def _tpu_name(topology: str) -> str:
  return _ALIASES.get(topology, topology)


def _expected_devices(name: str) -> int:
  m = re.fullmatch(r"(v\d+)[a-z]*[:=_]([0-9x]+)(_twisted|_untwisted)?", name)
  if not m:
    raise ValueError(f"topology={name!r}: expected 'cpu', 'cpu:N', a TPU topology such as "
                     f"'v5e:2x4' / 'v4:2x2x1', or one of {sorted(_ALIASES)}")
  chips = math.prod(int(x) for x in m.group(2).split("x"))
  return chips * (2 if m.group(1) in _TWO_CORE_DEVICES else 1)


def _cpu_devices(n: int) -> list:
  from jax._src import xla_bridge  # no public way to ask "has the backend started?"
  if not xla_bridge.backends_are_initialized() and n > 1:
    jax.config.update("jax_num_cpu_devices", n)
  devices = jax.devices("cpu")
  if len(devices) < n:
    raise ValueError(f"need {n} CPU devices, this process has {len(devices)}: start it with "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count={n} (before jax starts)")
  return devices[:n]


def topology_devices(topology: str | None) -> tuple[list, str, str]:
  """(devices, path, note) for a topology name; see the module docstring for the paths."""
  if topology is None:
    return jax.devices(), "local", ""
  if topology == "cpu" or topology.startswith("cpu:"):
    n = int(topology.partition(":")[2] or 1)
    return _cpu_devices(n), "cpu", ""
  name = _tpu_name(topology)
  expected = _expected_devices(name)
  lib = libtpu_path()
  if lib is None:
    reason = ("libtpu not found (pip install the libtpu wheel matching jax, e.g. "
              "'libtpu==0.0.42.*' for jax 0.10.2, or set TPU_LIBRARY_PATH)")
  else:
    # libtpu reads these at load; without them it logs errors about a missing TPU VM metadata.
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    try:
      from jax.experimental import topologies
      return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices), \
          "tpu", f"libtpu {lib}"
    except Exception as e:  # noqa: BLE001 - any libtpu failure means: fall back, and say why
      reason = f"libtpu rejected topology {name!r}: {type(e).__name__}: {str(e)[:300]}"
  note = (f"{reason}; compiled on {expected} fake CPU devices with the same mesh: FLOPs and "
          f"memory are approximate (CPU partitioning, layouts and fusion; no TPU tiling)")
  return _cpu_devices(expected), "cpu-fallback", note


def _mesh(devices, mesh_shape: dict[str, int] | None):
  shape = dict(mesh_shape or {"data": -1, "fsdp": 1, "tensor": 1})
  free = [k for k, v in shape.items() if v == -1]
  if len(free) > 1:
    raise ValueError(f"mesh_shape={shape}: at most one axis may be -1")
  if free:
    rest = math.prod(v for v in shape.values() if v != -1)
    shape[free[0]] = len(devices) // rest
  if math.prod(shape.values()) != len(devices):
    raise ValueError(f"mesh_shape={shape} needs {math.prod(shape.values())} devices; the "
                     f"topology has {len(devices)}")
  return jax.make_mesh(tuple(shape.values()), tuple(shape),
                       axis_types=(AxisType.Auto,) * len(shape), devices=devices), shape


def _memory(compiled) -> dict[str, int]:
  stats = compiled.memory_analysis()
  if stats is None:
    return {}
  mem = {name: int(getattr(stats, f"{name}_size_in_bytes", 0))
         for name in ("argument", "output", "alias", "temp", "generated_code")}
  mem["peak"] = int(getattr(stats, "peak_memory_in_bytes", 0))
  # libtpu's compile-only executables report temp=0 and put temporaries in `peak`; the CPU
  # compiler reports temp and a `peak` without it. `total` is the larger reading of the two.
  mem["total"] = max(mem["peak"], mem["argument"] + mem["output"] - mem["alias"] + mem["temp"])
  return mem


def compile_report(fn: Callable, abstract_args: Any, *, topology: str | None = None,
                   mesh_shape: dict[str, int] | None = None, in_shardings: Any = None,
                   out_shardings: Any = None, donate_argnums=(), static_argnums=(),
                   verbose: bool = False) -> CompileReport:
  """Compiles `fn` for `topology` without running it and reports FLOPs and memory per device.

  `abstract_args` is a tuple of `jax.ShapeDtypeStruct`s (their `sharding` may be a PartitionSpec,
  resolved on the mesh) or a callable `mesh -> tuple`. `in_shardings`/`out_shardings` are
  PartitionSpec pytrees as for `jax.jit` (or callables `mesh -> shardings`). `mesh_shape` maps
  axis names to sizes (one may be -1); default ("data", "fsdp", "tensor") = (all, 1, 1).
  """
  devices, path, note = topology_devices(topology)
  mesh, shape = _mesh(devices, mesh_shape)
  resolve = lambda x: x(mesh) if callable(x) else x  # noqa: E731
  kw = {}
  if in_shardings is not None:
    kw["in_shardings"] = resolve(in_shardings)
  if out_shardings is not None:
    kw["out_shardings"] = resolve(out_shardings)
  with jax.set_mesh(mesh):
    jitted = jax.jit(fn, donate_argnums=donate_argnums, static_argnums=static_argnums, **kw)
    compiled = jitted.lower(*resolve(abstract_args)).compile()
  flops, per_device, n = executable_flops(compiled)
  report = CompileReport(path, topology or "local", devices[0].device_kind, n, shape, flops,
                         per_device, _memory(compiled), note)
  if verbose:
    print(report.summary(), flush=True)
  return report


def model_report(cfg, *, topology: str | None, mesh_shape: dict[str, int] | None, batch: int,
                 seq: int, mode: str = "grad") -> CompileReport:
  """The report of a model forward ("forward") or forward+backward of cross-entropy ("grad") on
  [batch, seq] tokens, parameters sharded by smjax.sharding's logical-axis rules."""
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from smjax import sharding
  from smjax.models.transformer import Transformer, init_params, param_logical_axes

  if mode not in ("forward", "grad"):
    raise ValueError(f"model_report: mode={mode!r}; expected 'forward' or 'grad'")
  model = Transformer(cfg)

  def args(mesh):
    abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    shard = sharding.param_shardings(abstract, param_logical_axes(cfg), mesh)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shard)
    batch_axes = tuple(a for a in sharding.BATCH_AXES if a in mesh.shape)
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32,
                                  sharding=NamedSharding(mesh, P(batch_axes or None, None)))
    return params, tokens

  def forward(params, tokens_BT):
    return model.apply({"params": params}, tokens_BT)[0]

  def loss_grad(params, tokens_BT):
    def loss(p):
      logp_BTV = jax.nn.log_softmax(forward(p, tokens_BT))
      return -jnp.mean(jnp.take_along_axis(logp_BTV, tokens_BT[..., None], axis=-1))
    return jax.grad(loss)(params)

  return compile_report(forward if mode == "forward" else loss_grad, args, topology=topology,
                        mesh_shape=mesh_shape)


def main(argv=None) -> None:
  import argparse

  from smjax.flops import analytic_flops
  from smjax.models.presets import get_preset

  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--preset", default="toy-small")
  p.add_argument("--topology", default="cpu:8")
  p.add_argument("--mesh", default="data=-1", help="axis=size,... e.g. data=2,fsdp=4")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=64)
  p.add_argument("--mode", default="grad", choices=("forward", "grad"))
  a = p.parse_args(argv)
  mesh = {k: int(v) for k, v in (kv.split("=") for kv in a.mesh.split(","))}
  if a.topology.startswith("cpu:"):  # this process is ours: give it the fake devices up front
    jax.config.update("jax_num_cpu_devices", int(a.topology.partition(":")[2]))
  elif a.topology != "cpu":
    jax.config.update("jax_num_cpu_devices", _expected_devices(_tpu_name(a.topology)))
  cfg = get_preset(a.preset)
  report = model_report(cfg, topology=a.topology, mesh_shape=mesh, batch=a.batch, seq=a.seq,
                        mode=a.mode)
  print(report.summary())
  analytic = analytic_flops(cfg, tokens=a.batch * a.seq, context_len=a.seq,
                            backward=a.mode == "grad")
  print(f"  analytic (matmuls + attention): {analytic:.4e}; measured/analytic = "
        f"{report.flops / analytic:.4f}")


if __name__ == "__main__":
  main()
