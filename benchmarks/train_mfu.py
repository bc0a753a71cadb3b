"""Train-step FLOP utilisation on CPU: smjax's jitted SFT and GRPO steps against the matmul peak.

For each step: FLOPs are XLA's cost analysis of the jitted step (`jit_step(make_*_step)`,
compiled ahead of time; `smjax.flops.executable_flops` of the very executable that is timed, the
figure `compiled_flops` reports: forward, backward, loss, grad-norm clipping and AdamW), divided
by the median wall time of `--reps` steps after `--warmup` steps. The peak is the same machine's
f32 matmul rate measured in the same run: a jitted `[n, n] @ [n, n]` (2·n³ FLOPs by the same cost
analysis), timed `--matmul-per-step` times after every timed step, so that load from other jobs on
a shared machine weighs on both alike; its median is the peak. The "useful" figure beside it is
the analytic count (6·N·tokens + attention, `smjax.flops.analytic_flops`) over the same time.

Threads: `--threads N` pins the process to N CPUs before jax loads (XLA's CPU thread pool is
sized from the affinity mask); the output says how many were used.

  .venv/bin/python benchmarks/train_mfu.py              # writes bench_results/train_mfu.json
  .venv/bin/python benchmarks/train_mfu.py --size tiny --reps 2 --out /tmp/mfu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import smjax  # noqa: F401  (SMJAX_CPU_MALLOC=tuned must act before a JAX backend starts)

# Qwen3-style (q/k norm, untied head): vocab, d_model, layers, heads, kv_heads, head_dim, d_ff
SIZES = {
    "d512": (16384, 512, 6, 8, 4, 64, 1536),
    "d768": (32768, 768, 4, 12, 4, 64, 2304),
    "tiny": (512, 64, 2, 4, 2, 16, 128),  # smoke tests only
}


def model_config(size: str, seq: int):
  from smjax.models.transformer import ModelConfig  # pylint: disable=import-outside-toplevel
  vocab, d, layers, heads, kv, hd, ff = SIZES[size]
  return ModelConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv,
                     head_dim=hd, d_ff=ff, max_seq_len=max(seq, 64), rope_theta=1e6,
                     qk_norm=True, tie_embeddings=False, name=f"mfu-{size}")


def make_batches(cfg, *, batch: int, seq: int, group_size: int, seed: int = 0):
  """(SFT batch, GRPO batch without old log-probs): random tokens, a quarter of each row prompt."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from smjax.batch import SequenceBatch  # pylint: disable=import-outside-toplevel
  if batch % group_size:
    raise ValueError(f"--batch {batch} must be a multiple of --group-size {group_size}")
  rng = np.random.RandomState(seed)
  tokens = rng.randint(3, cfg.vocab_size, (batch, seq)).astype(np.int32)
  positions = np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq))
  loss_mask = np.zeros((batch, seq - 1), bool)
  loss_mask[:, seq // 4:] = True  # targets of the completion (the last 3/4 of each row)
  sft = SequenceBatch(tokens_BS=jnp.asarray(tokens), positions_BS=jnp.asarray(positions),
                      attn_mask_BS=jnp.ones((batch, seq), bool),
                      loss_mask_BT=jnp.asarray(loss_mask))
  rewards = rng.randint(0, 2, batch).astype(np.float32)
  return sft, sft.replace(rewards_B=jnp.asarray(rewards))


class MatmulPeak:
  """A jitted f32 [n, n] @ [n, n]; `sample(k)` times k calls and keeps each duration."""

  def __init__(self, n: int):
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    from smjax.flops import executable_flops  # pylint: disable=import-outside-toplevel
    ka, kb = jax.random.split(jax.random.key(n))
    self.a = jax.random.normal(ka, (n, n), jnp.float32)
    self.b = jax.random.normal(kb, (n, n), jnp.float32)
    self.f = jax.jit(jnp.matmul).lower(self.a, self.b).compile()
    self.n, self.flops, self.times = n, executable_flops(self.f)[0], []
    self.f(self.a, self.b).block_until_ready()

  def sample(self, k: int):
    for _ in range(k):
      t0 = time.perf_counter()
      self.f(self.a, self.b).block_until_ready()
      self.times.append(time.perf_counter() - t0)

  def record(self) -> dict:
    s = statistics.median(self.times)
    return dict(n=self.n, flops=self.flops, analytic_flops=2 * self.n ** 3, median_s=s,
                runs_s=self.times, flops_per_s=self.flops / s)


def bench_step(step, state, batch, *, reps: int, warmup: int, peak: MatmulPeak,
               matmul_per_step: int) -> dict:
  """Times `reps` steps after `warmup`, sampling the matmul peak after each timed step."""
  import jax  # pylint: disable=import-outside-toplevel
  holder = {"state": state}

  def run():
    new_state, metrics = step(holder["state"], batch)
    jax.block_until_ready((new_state, metrics))
    holder["state"] = new_state
    return metrics

  t0 = time.perf_counter()
  metrics = run()
  first = time.perf_counter() - t0
  for _ in range(max(warmup - 1, 0)):
    run()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
    peak.sample(matmul_per_step)
  return dict(median_s=statistics.median(times), runs_s=times, first_call_s=first,
              loss=float(metrics["loss"]), finite=float(metrics["finite"]))


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--size", default="d512", choices=sorted(SIZES))
  ap.add_argument("--batch", type=int, default=4, help="rows (a multiple of --group-size)")
  ap.add_argument("--seq", type=int, default=256, help="tokens per row")
  ap.add_argument("--group-size", type=int, default=4, help="GRPO G")
  ap.add_argument("--steps", nargs="+", default=["sft", "grpo"], choices=["sft", "grpo"])
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--warmup", type=int, default=2, help="untimed steps (compiled ahead of time)")
  ap.add_argument("--matmul-size", type=int, default=2048)
  ap.add_argument("--matmul-per-step", type=int, default=3,
                  help="timed matmuls after each timed step")
  ap.add_argument("--threads", type=int, default=0, help="CPUs to pin to (0: all available)")
  ap.add_argument("--out", default="bench_results/train_mfu.json")
  return ap.parse_args(argv)


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.threads:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[:args.threads])  # before jax creates its thread pool
  threads = len(os.sched_getaffinity(0))
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  from smjax.flops import analytic_flops, executable_flops
  from smjax.models.transformer import Transformer, init_params
  from smjax.train import state as state_lib  # pylint: disable=import-outside-toplevel
  from smjax.train.score import target_logprobs  # pylint: disable=import-outside-toplevel
  from smjax.train import steps as steps_lib  # pylint: disable=import-outside-toplevel

  cfg = model_config(args.size, args.seq)
  print(f"CPU threads: jax/XLA CPU backend on {threads} cores (process affinity "
        f"{sorted(os.sched_getaffinity(0))}); jax {jax.__version__}; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
  n_params = cfg.num_params()
  tokens = args.batch * args.seq
  print(f"model: Qwen3-style '{args.size}', {n_params / 1e6:.1f}M params, d_model {cfg.d_model}, "
        f"{cfg.n_layers} layers, d_ff {cfg.d_ff}, vocab {cfg.vocab_size}, f32; batch "
        f"{args.batch} x {args.seq} = {tokens} tokens a step")

  tx = state_lib.make_optimizer(state_lib.OptimizerConfig(learning_rate=1e-5))
  sft_batch, grpo_batch = make_batches(cfg, batch=args.batch, seq=args.seq,
                                       group_size=args.group_size)
  model = Transformer(cfg)
  # Dense attention computes every query against every key: count it that way (non-causal).
  useful = analytic_flops(cfg, tokens=tokens, context_len=args.seq, backward=True)
  results = dict(config=vars(args), threads=threads, params=n_params, tokens_per_step=tokens,
                 platform=platform.platform(), jax=jax.__version__,
                 xla_flags=os.environ.get("XLA_FLAGS", ""), steps={})
  peak = MatmulPeak(args.matmul_size)
  peak.sample(args.matmul_per_step)
  records = {}
  params0 = jax.jit(lambda key: init_params(cfg, key))(jax.random.key(0))  # one compile, not ~100
  for name in args.steps:
    params = jax.tree.map(jnp.copy, params0)  # each step donates its own copy
    if name == "sft":
      step_def, batch = steps_lib.make_sft_step(model, tx), sft_batch
    else:
      step_def = steps_lib.make_grpo_step(model, tx, steps_lib.GRPOConfig(
          group_size=args.group_size))
      # Behaviour log-probs from the same parameters (ratios start at 1, as on-policy).
      old = jax.jit(lambda p, b: target_logprobs(model, p, b))(params, grpo_batch)
      batch = grpo_batch.replace(old_logp_BT=old)
    state = state_lib.create_state(params, tx)
    t0 = time.perf_counter()
    step = steps_lib.jit_step(step_def).fn.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    flops = executable_flops(step)[0]
    rec = bench_step(step, state, batch, reps=args.reps, warmup=args.warmup, peak=peak,
                     matmul_per_step=args.matmul_per_step)
    rec.update(step=name, compile_s=compile_s, flops=flops, useful_flops=useful,
               flops_per_s=flops / rec["median_s"],
               useful_flops_per_s=useful / rec["median_s"])
    records[name] = rec
    print(f"  {name:4s}: {rec['median_s'] * 1e3:8.1f} ms/step  {flops / 1e9:7.2f} GFLOP compiled "
          f"({useful / 1e9:.2f} useful)  {flops / rec['median_s'] / 1e9:6.1f} GFLOP/s; compile "
          f"{compile_s:.1f} s")

  mm = peak.record()
  print(f"matmul peak (f32 {args.matmul_size}^3, {len(mm['runs_s'])} calls interleaved with the "
        f"steps): {mm['flops_per_s'] / 1e9:.1f} GFLOP/s (median {mm['median_s'] * 1e3:.1f} ms; "
        f"min {min(mm['runs_s']) * 1e3:.1f}, max {max(mm['runs_s']) * 1e3:.1f})")
  for name, rec in records.items():
    rec["fraction_of_peak"] = rec["flops_per_s"] / mm["flops_per_s"]
    rec["useful_fraction_of_peak"] = rec["useful_flops_per_s"] / mm["flops_per_s"]
    results["steps"][name] = rec
    print(f"  {name:4s}: {100 * rec['fraction_of_peak']:.1f}% of the f32 matmul peak "
          f"(compiled FLOPs), {100 * rec['useful_fraction_of_peak']:.1f}% (analytic useful FLOPs)")
  results["matmul_peak"] = mm

  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  print(f"wrote {args.out}")
  return results


if __name__ == "__main__":
  main()
