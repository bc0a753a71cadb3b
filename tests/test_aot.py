"""Ahead-of-time compile reports (smjax/aot.py) on 8 fake CPU devices, and on a TPU topology when
libtpu is installed (else the fallback must say it fell back and why).

Everything runs in one subprocess (fake devices must be set before jax starts); the child prints
its measurements as JSON and this file checks them against hand-computed values.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import FAST_XLA_FLAGS
from smjax.aot import _expected_devices, _tpu_name, libtpu_path

M, N, K = 256, 128, 512
MNK2 = 2 * M * N * K

_CHILD = textwrap.dedent(f"""
  import json, jax, jax.numpy as jnp
  from jax.experimental import pallas as pl
  from jax.sharding import PartitionSpec as P
  from smjax import aot
  from smjax.flops import analytic_flops
  from smjax.models.presets import get_preset

  M, N, K = {M}, {N}, {K}
  args = (jax.ShapeDtypeStruct((M, K), jnp.float32, sharding=P("data", None)),
          jax.ShapeDtypeStruct((K, N), jnp.float32, sharding=P()))
  matmul = lambda a, b: a @ b
  out = {{}}

  def record(name, r):
    out[name] = dict(path=r.path, devices=r.devices, kind=r.device_kind, flops=r.flops,
                     per_device=r.flops_per_device, memory=r.memory, note=r.note)
    print(r.summary(), flush=True)

  record("cpu", aot.compile_report(matmul, args, topology="cpu:8", mesh_shape={{"data": 8}}))
  cfg = get_preset("toy-small")
  r = aot.model_report(cfg, topology="cpu:8", mesh_shape={{"data": 8}}, batch=8, seq=64)
  record("model", r)
  out["model"]["analytic"] = analytic_flops(cfg, tokens=8 * 64, context_len=64, backward=True)

  real_libtpu_path = aot.libtpu_path
  aot.libtpu_path = lambda: None  # as on a machine without libtpu
  record("fallback", aot.compile_report(matmul, args, topology="v5e-8", mesh_shape={{"data": 8}}))
  aot.libtpu_path = real_libtpu_path
  record("tpu", aot.compile_report(matmul, args, topology="v5e:2x4", mesh_shape={{"data": 8}}))

  if out["tpu"]["path"] == "tpu":  # a real (not interpreted) Pallas kernel, compiled for v5e
    def kernel(x_ref, y_ref, o_ref):
      o_ref[...] = x_ref[...] * y_ref[...] + 1.0
    def with_kernel(x, w):  # Mosaic kernels are not auto-partitioned: shard_map them
      y = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         cost_estimate=pl.CostEstimate(flops=12345, transcendentals=0,
                                                       bytes_accessed=0))(x, x)
      return y @ w
    sharded = jax.shard_map(with_kernel, in_specs=(P("data", None), P()),
                            out_specs=P("data", None), check_vma=False)
    kargs = (jax.ShapeDtypeStruct((32, 128), jnp.float32, sharding=P("data", None)),
             jax.ShapeDtypeStruct((128, 256), jnp.float32, sharding=P()))
    record("pallas", aot.compile_report(sharded, kargs, topology="v5e:2x2",
                                        mesh_shape={{"data": 4}}))
  print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def child():
  env = dict(os.environ, JAX_PLATFORMS="cpu",   # the suite's fast-compile flags (conftest.py)
             XLA_FLAGS=f"--xla_force_host_platform_device_count=8 {FAST_XLA_FLAGS}")
  proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
  print(proc.stdout)  # the reports, for -s runs
  return json.loads(line[len("RESULT "):])


def test_sharded_matmul_on_8_fake_cpu_devices(child):
  r = child["cpu"]
  assert (r["path"], r["devices"]) == ("cpu", 8)
  # XLA's cost analysis is per device; the report's `flops` is global.
  assert r["per_device"] == MNK2 / 8 and r["flops"] == MNK2
  assert r["memory"]["argument"] == (M // 8 * K + K * N) * 4  # a's shard + replicated b
  assert r["memory"]["output"] == M // 8 * N * 4


def test_sharded_model_grad_is_global_and_near_analytic(child):
  r = child["model"]
  assert r["devices"] == 8
  assert r["analytic"] < r["flops"] < 1.03 * r["analytic"], r["flops"] / r["analytic"]


def test_fallback_without_libtpu_says_so_and_keeps_the_mesh(child):
  r = child["fallback"]
  assert r["path"] == "cpu-fallback" and r["devices"] == 8
  assert "libtpu not found" in r["note"] and "approximate" in r["note"]
  assert r["flops"] == MNK2 and r["per_device"] == MNK2 / 8


def test_tpu_topology_when_libtpu_is_installed(child):
  r = child["tpu"]
  if libtpu_path() is None:  # nothing to compile for: the report must say it fell back
    assert r["path"] == "cpu-fallback" and "libtpu" in r["note"]
  else:
    assert r["path"] == "tpu" and r["kind"].startswith("TPU v5"), r
    assert r["devices"] == 8 and r["flops"] == MNK2 and r["per_device"] == MNK2 / 8
    assert r["memory"]["argument"] == (M // 8 * K + K * N) * 4
    # A compiled Pallas kernel is counted by its CostEstimate, beside XLA's matmul count.
    p = child["pallas"]
    assert p["path"] == "tpu" and p["per_device"] == 12345 + 2 * 8 * 128 * 256
    assert p["flops"] == 4 * p["per_device"]


def test_topology_names():
  assert _tpu_name("v5e-8") == "v5e:2x4" and _tpu_name("v4:2x2x1") == "v4:2x2x1"
  assert _expected_devices("v5e:2x4") == 8 and _expected_devices("v4:2x2x1") == 8
  assert _expected_devices("v5p:2x2x1") == 4
  with pytest.raises(ValueError, match="topology"):
    _expected_devices("h100x8")
