"""FLOP counting (smjax/flops.py) and the ledger (smjax/ledger.py) against hand-computed counts."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from conftest import FAST_XLA_FLAGS
from smjax import flops as flops_lib
from smjax.flops import ProgramCall, analytic_flops, compiled_flops, matmul_params
from smjax.ledger import FlopLedger, describe_reach, flops_to_reach
from smjax.models.cache import init_cache
from smjax.models.transformer import ModelConfig, Transformer, init_params


def test_matmul_counts_exactly_2mnk_and_is_cached_per_signature():
  M, N, K = 64, 48, 80
  f = jax.jit(lambda a, b: a @ b)
  a, b = jnp.ones((M, K)), jnp.ones((K, N))
  assert compiled_flops(f, a, b) == 2 * M * N * K
  assert compiled_flops(f, a, b) == 2 * M * N * K
  assert len(flops_lib._COST_CACHE[f]) == 1  # the second ask compiled nothing
  assert compiled_flops(f, jnp.ones((2 * M, K)), b) == 2 * (2 * M) * N * K
  assert len(flops_lib._COST_CACHE[f]) == 2


def test_static_kwargs_are_part_of_the_signature():
  def chain(x, w, *, n):
    for _ in range(n):
      x = x @ w
    return x
  f = jax.jit(chain, static_argnames="n")
  x, w = jax.ShapeDtypeStruct((16, 32), jnp.float32), jax.ShapeDtypeStruct((32, 32), jnp.float32)
  assert compiled_flops(f, x, w, n=2) == 2 * (2 * 16 * 32 * 32)
  assert compiled_flops(f, x, w, n=3) == 3 * (2 * 16 * 32 * 32)


def test_matmul_params_and_analytic_flops_by_hand():
  cfg = ModelConfig(vocab_size=100, d_model=8, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=4,
                    d_ff=20, qkv_bias=True)
  # per layer: q 8*16 + k,v 2*8*8 + o 16*8 + mlp 3*8*20 = 128+128+128+480 = 864; head 8*100
  assert matmul_params(cfg) == 3 * 864 + 800
  norms_and_biases = 3 * (2 * 8 + 16 + 2 * 8) + 8
  assert matmul_params(cfg) == cfg.num_params(include_embedding=False) - norms_and_biases + 800
  # 10 tokens, 6 keys each: dense 2*3392*10; attention 4 * L(3) * N*H(16) * 10 * 6
  fwd = 2 * 3392 * 10 + 4 * 3 * 16 * 10 * 6
  assert analytic_flops(cfg, tokens=10, context_len=6, backward=False) == fwd
  assert analytic_flops(cfg, tokens=10, context_len=6, backward=True) == 3 * fwd
  # logits of 1 token of 10 (prefill): the unembedding 8*100 counted once
  assert analytic_flops(cfg, tokens=10, context_len=6, backward=False, logit_tokens=1) == (
      fwd - 2 * 800 * 9)
  # causal: sequences of 6 see 1..6 keys, 3.5 on average
  assert analytic_flops(cfg, tokens=12, context_len=6, backward=False, causal=True) == (
      2 * 3392 * 12 + 4 * 3 * 16 * (2 * (1 + 2 + 3 + 4 + 5 + 6)))


def test_transformer_forward_and_backward_within_3pct_of_analytic():
  # d_model 128, GQA, T 64: matmuls dominate, but norms/RoPE/softmax are not negligible.
  cfg = ModelConfig(vocab_size=128, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2,
                    head_dim=32, d_ff=512, max_seq_len=64)
  B, T = 2, 64
  model = Transformer(cfg)
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
  forward = jax.jit(lambda p, t: model.apply({"params": p}, t)[0])

  def loss(p, t):
    logp_BTV = jax.nn.log_softmax(model.apply({"params": p}, t)[0])
    return -jnp.mean(jnp.take_along_axis(logp_BTV, t[..., None], axis=-1))
  grad = jax.jit(jax.grad(loss))

  for fn, backward in ((forward, False), (grad, True)):
    measured = compiled_flops(fn, params, tokens)
    analytic = analytic_flops(cfg, tokens=B * T, context_len=T, backward=backward)
    # XLA counts every matmul exactly plus the elementwise ops the analytic count leaves out.
    assert analytic < measured < 1.03 * analytic, (backward, measured / analytic)


def test_decode_loop_of_10_steps_counts_10_step_programs():
  cfg = ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=16,
                    d_ff=256, max_seq_len=16)
  model = Transformer(cfg)
  B, S, steps = 2, 16, 10
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))

  def step(params, token_B, cache):
    positions_B1 = jnp.broadcast_to(cache.index, (B, 1))
    logits_B1V, cache = model.apply({"params": params}, token_B[:, None], positions_B1,
                                    jnp.ones((B, 1), bool), cache)
    return jnp.argmax(logits_B1V[:, 0], axis=-1).astype(jnp.int32), cache

  def loop(params, token_B, cache):
    return jax.lax.fori_loop(0, steps, lambda _, c: step(params, *c), (token_B, cache))

  def unrolled(params, token_B, cache):
    carry = (token_B, cache)
    for _ in range(steps):
      carry = step(params, *carry)
    return carry

  args = (params, jax.ShapeDtypeStruct((B,), jnp.int32),
          jax.eval_shape(lambda: init_cache(cfg, B, S)))
  jitted_step = jax.jit(step)  # one jit object: the FLOP cache is keyed by it
  step_flops = compiled_flops(jitted_step, *args)
  assert compiled_flops(jax.jit(loop), *args) < 1.1 * step_flops  # XLA counts the body once
  ledger = FlopLedger()
  ledger.add(ProgramCall("rollout/decode", jitted_step, args, calls=steps,
                         useful=analytic_flops(cfg, tokens=B * steps, context_len=S,
                                               backward=False)))
  assert ledger.by_phase() == {"rollout/decode": steps * int(step_flops)}
  reference = compiled_flops(jax.jit(unrolled), *args)  # independent: XLA sees all 10 steps
  assert abs(ledger.total() - reference) <= 0.01 * reference
  assert 0 < ledger.useful_by_phase()["rollout/decode"] < ledger.total()



def test_a_count_only_program_counts_what_the_optimised_compile_counts():
  """The sampler's decode step is compiled only to be counted (ProgramCall(count_only=True)),
  with LLVM's optimisation off on the CPU: the same FLOPs as its compile with every optimisation
  on (the options given explicitly: the suite's XLA_FLAGS turn them off for every compile)."""
  from smjax.models.presets import get_preset  # pylint: disable=import-outside-toplevel
  from smjax.rollout import Sampler  # pylint: disable=import-outside-toplevel
  cfg = get_preset("toy-tiny")
  sampler = Sampler(cfg, max_new_tokens=8, eos_id=None, pad_id=0)
  res = sampler.generate(init_params(cfg, jax.random.key(0)), [[5, 6, 7, 8]] * 3,
                         jax.random.key(1), num_samples=2)
  decode = [c for c in res.program_calls if c.phase == "rollout/decode"]
  assert len(decode) == 1 and decode[0].count_only
  optimised = {"xla_backend_optimization_level": 3, "xla_llvm_disable_expensive_passes": False}
  for c in decode:
    lowered = flops_lib._lower(c.fn, c.args, c.kwargs)  # pylint: disable=protected-access
    count = lambda options: flops_lib.executable_flops(lowered.compile(compiler_options=options))[0]
    assert c.flops_per_call() == count(optimised) > 0
    # ...and with a run's fusion emitters (the suite's flags turn them off, conftest.py).
    run = {"xla_cpu_use_fusion_emitters": True}
    assert count(dict(flops_lib.COUNT_ONLY_CPU_OPTIONS, **run)) == count(dict(optimised, **run)) > 0

def test_pallas_interpret_mode_counts_the_interpreter_not_the_cost_estimate():
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * y_ref[...] + 1.0
  block = pl.BlockSpec((8, 128), lambda i: (i, 0))
  f = jax.jit(lambda x, y: pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,), in_specs=[block] * 2,
      out_specs=block, interpret=True,
      cost_estimate=pl.CostEstimate(flops=12345, transcendentals=0, bytes_accessed=0))(x, y))
  x = jax.ShapeDtypeStruct((32, 128), jnp.float32)
  counted = compiled_flops(f, x, x)
  # The grid is a loop in interpret mode: XLA sees one 8x128 block (mul + add) + loop bookkeeping.
  assert 2 * 8 * 128 <= counted < 2 * 8 * 128 + 64
  ledger = FlopLedger()
  ledger.add(ProgramCall("train/teacher", f, (x, x), calls=3, flops_override=12345))
  assert ledger.by_phase() == {"train/teacher": 3 * 12345}


def _ledger_with_hand_numbers():
  ledger = FlopLedger()
  ledger.add_flops("rollout/prefill", 1000, calls=2, useful=1500, step=0, program="prefill")
  ledger.add_flops("rollout/decode", 30, calls=10, useful=250, step=0, program="decode")
  ledger.add_flops("train/policy", 7000, useful=6000, step=0, program="policy")
  ledger.add_flops("train/reference", 2000, step=0, program="ref")
  ledger.add_flops("rollout/decode", 30, calls=7, useful=100, step=1, program="decode")
  ledger.add_flops("eval/math", 500, calls=4, step=1)
  ledger.add_flops("base/sft", 90000, step=None)
  return ledger


def test_ledger_totals_by_hand_and_sum_of_records():
  ledger = _ledger_with_hand_numbers()
  expected = {"rollout/prefill": 2000, "rollout/decode": 510, "train/policy": 7000,
              "train/reference": 2000, "eval/math": 2000, "base/sft": 90000}
  assert ledger.by_phase() == dict(sorted(expected.items()))
  sums = {}
  for r in ledger.records:
    sums[r.phase] = sums.get(r.phase, 0) + r.flops_per_call * r.calls
  assert sums == expected
  assert ledger.total() == 2000 + 510 + 7000 + 2000  # eval and base excluded
  assert ledger.total(training_only=False) == 11510 + 2000 + 90000
  assert ledger.useful_by_phase()["rollout/decode"] == 350
  assert ledger.useful_total() == 1500 + 350 + 6000
  m = ledger.metrics()
  assert m["flops/train/policy"] == 7000.0 and m["flops/total_training"] == 11510.0
  assert m["flops/total_eval"] == 2000.0 and m["flops/total_base"] == 90000.0
  assert m["flops/useful_fraction_training"] == pytest.approx(7850 / 11510)


def test_ledger_round_trip_compaction_and_exact_big_sums():
  ledger = _ledger_with_hand_numbers()
  restored = FlopLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
  assert restored.by_phase() == ledger.by_phase()
  assert restored.useful_by_phase() == ledger.useful_by_phase()
  assert restored.total() == 11510
  decode = [r for r in restored.records if r.phase == "rollout/decode"]
  assert [(r.calls, r.useful, r.step, r.last_step, r.adds) for r in decode] == [(17, 350, 0, 1, 2)]

  big = FlopLedger(max_records=16)
  per_call = 10**18 + 1  # float64 would round this; the ledger must not
  for step in range(1000):
    big.add_flops("train/policy", per_call, calls=3, step=step, program="p")
    big.add_flops("eval/x", 1, step=step)
  assert len(big.records) <= 17
  assert big.total() == 3000 * per_call
  again = FlopLedger.from_dict(json.loads(json.dumps(big.to_dict())))
  assert again.total() == 3000 * per_call and again.by_phase()["eval/x"] == 1000
  assert again.merge(ledger).total() == 3000 * per_call + 11510

  tampered = ledger.to_dict()
  tampered["flops"]["train/policy"] += 1
  with pytest.raises(ValueError, match="sum of the records"):
    FlopLedger.from_dict(tampered)
  with pytest.raises(ValueError, match="namespace"):
    ledger.add_flops("policy", 1)


def test_ledger_adds_program_calls():
  f = jax.jit(lambda a, b: a @ b)
  a, b = jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 4), jnp.float32)
  ledger = FlopLedger()
  added = ledger.add([ProgramCall("train/policy", f, (a, b), calls=5, useful=100),
                      ProgramCall("eval/toy", f, (a, b))], step=3)
  assert added == 6 * 2 * 8 * 16 * 4
  assert ledger.by_phase() == {"eval/toy": 1024, "train/policy": 5 * 1024}
  assert ledger.records[0].program.startswith("<lambda>#") and ledger.records[0].step == 3


def test_flops_to_reach_interpolates_the_first_crossing():
  curve = [(0, 0.1), (100, 0.3), (200, 0.5), (300, 0.4), (400, 0.7)]
  assert flops_to_reach(curve, 0.4) == pytest.approx(150.0)  # not the later 300-400 crossing
  assert flops_to_reach(curve, 0.5) == pytest.approx(200.0)
  assert flops_to_reach(curve, 0.6) == pytest.approx(300 + 0.2 / 0.3 * 100)
  assert flops_to_reach(curve, 0.05) == 0.0  # reached at the first point
  assert flops_to_reach(curve, 0.8) is None
  assert flops_to_reach([], 0.1) is None
  assert describe_reach(None) == "never reached"
  with pytest.raises(ValueError, match="non-decreasing"):
    flops_to_reach([(10, 0.0), (5, 1.0)], 0.5)


_SHARDED = textwrap.dedent("""
  import json, jax, jax.numpy as jnp
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  from smjax.flops import compiled_cost
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  M, N, K = 256, 64, 128
  f = jax.jit(lambda a, b: a @ b)
  out = {}
  for name, spec in (("sharded", P("data", None)), ("replicated", P())):
    a = jax.device_put(jnp.ones((M, K)), NamedSharding(mesh, spec))
    b = jax.device_put(jnp.ones((K, N)), NamedSharding(mesh, P()))
    c = compiled_cost(f, a, b)
    out[name] = [c.flops, c.flops_per_device, c.devices]
  print(json.dumps(out))
""")


def test_sharded_matmul_counts_global_flops_on_8_devices():
  env = dict(os.environ, JAX_PLATFORMS="cpu",   # the suite's fast-compile flags (conftest.py)
             XLA_FLAGS=f"--xla_force_host_platform_device_count=8 {FAST_XLA_FLAGS}")
  proc = subprocess.run([sys.executable, "-c", _SHARDED], env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  mnk2 = 2 * 256 * 64 * 128
  # XLA reports one device's program; the counter multiplies by the 8 devices it runs on.
  assert out["sharded"] == [mnk2, mnk2 / 8, 8]
  # Replicated compute runs on all 8 devices, and is counted so.
  assert out["replicated"] == [8 * mnk2, mnk2, 8]
