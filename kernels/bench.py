"""Kernel microbenchmarks: peak memory and time of each fused op against its naive jnp form.

    python -m smjax.kernels.bench --which reverse_kl --vocab 32768 151936 --tokens 512
    python kernels/bench.py --which reverse_kl --rss      # adds per-case peak RSS (subprocesses)

Both sides are measured in the same run, on the same inputs, as value_and_grad programs ("loss"
= forward only, "grad" = loss and its gradient w.r.t. the differentiated input). Memory is the
compiled executable's memory_analysis(): `peak_bytes` = temp + argument + output - alias, the
primary figure; `temp_bytes` (working memory beyond inputs and outputs) is reported beside it,
because inputs and the [N, V] gradient are the same size on both sides and bound the ratio of
totals. Time is the median wall time of --repeats runs after one warm-up. Results go to --out
as JSON (default bench_results/kernels.json) and to stdout as a table with ratios naive/fused.

Each benchmark is a function in BENCHES that yields (name, case dict, naive fn, fused fn,
make_inputs); the gradient is taken w.r.t. the first input. Add a kernel by adding one.
    python -m smjax.kernels.bench --which group_advantage --batch 256 --seq 1024
"""

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_OUT = "bench_results/kernels.json"


# --------------------------------------------------------------------------- benchmarks


def reverse_kl_cases(args):
  """Per-token reverse KL summed over tokens: naive log_softmax of both vs smjax.kernels."""
  from smjax.kernels import dispatch
  from smjax.kernels import reverse_kl as rk

  for v in args.vocab:
    case = dict(tokens=args.tokens, vocab=v, dtype=args.dtype, impl=args.impl)

    def make_inputs(v=v):
      k1, k2 = jax.random.split(jax.random.key(0))
      s = jax.random.normal(k1, (args.tokens, v), jnp.float32).astype(args.dtype)
      t = (s + jax.random.normal(k2, (args.tokens, v), s.dtype)).astype(args.dtype)
      return s, t

    def naive(s, t):
      return jnp.sum(rk.reverse_kl_reference(s, t))

    def fused(s, t):
      return jnp.sum(dispatch.reverse_kl(s, t, impl=args.impl))

    yield f"reverse_kl V={v}", case, naive, fused, make_inputs


def group_advantage_cases(args):
  """GRPO loss from rewards (group advantages + clipped objective + k3 KL + token_mean):
  grpo.py's XLA path vs the fused kernel (interpreted on CPU: its time there means nothing)."""
  from smjax.kernels import group_advantage as ga
  from smjax.rl import grpo

  b, t, g = args.batch, args.seq, args.group
  case = dict(batch=b, seq=t, group=g, impl="pallas")
  kw = dict(group_size=g, advantage_mode="grpo", eps_low=0.2, eps_high=0.28, beta=0.04,
            kl_estimator="k3", aggregation="token_mean")

  def make_inputs():
    k = jax.random.split(jax.random.key(0), 5)
    logp = -jax.random.uniform(k[0], (b, t), jnp.float32, 0.0, 5.0)
    old = logp + 0.1 * jax.random.normal(k[1], (b, t))
    ref = logp + 0.1 * jax.random.normal(k[2], (b, t))
    rewards = jax.random.bernoulli(k[3], 0.5, (b,)).astype(jnp.float32)
    lengths = jax.random.randint(k[4], (b, 1), 1, t + 1)
    mask = (jnp.arange(t)[None] < lengths).astype(jnp.float32)
    return logp, old, ref, rewards, mask

  def naive(*inputs):
    return grpo.grpo_loss_from_rewards(*inputs, **kw)[0]

  def fused(*inputs):
    return ga.grpo_loss_fused(*inputs, **kw)[0]

  yield f"group_advantage B={b} T={t}", case, naive, fused, make_inputs


BENCHES = {"reverse_kl": reverse_kl_cases, "group_advantage": group_advantage_cases}


# --------------------------------------------------------------------------- measurement


def _program(fn, phase):
  """jit of the loss alone ("loss") or of loss and gradient w.r.t. the first input ("grad")."""
  return jax.jit(fn if phase == "loss" else jax.value_and_grad(fn))


def memory_of(compiled):
  m = compiled.memory_analysis()
  out = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("temp", "argument", "output",
                                                             "alias")}
  out = {f"{k}_bytes": v for k, v in out.items()}
  out["peak_bytes"] = (out["temp_bytes"] + out["argument_bytes"] + out["output_bytes"]
                       - out["alias_bytes"])
  return out


def time_of(compiled, inputs, repeats):
  jax.block_until_ready(compiled(*inputs))  # warm-up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*inputs))
    times.append(time.perf_counter() - start)
  return statistics.median(times), times


def _proc_status_kib(field):
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _rss_child(queue, which, case_index, side, phase, argv):
  args = parse_args(argv)
  _, _, naive, fused, make_inputs = list(BENCHES[which](args))[case_index]
  inputs = jax.block_until_ready(make_inputs())
  compiled = _program(naive if side == "naive" else fused, phase).lower(*inputs).compile()
  before = _proc_status_kib("VmRSS")
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # Linux: reset the peak (VmHWM) to the current RSS
  jax.block_until_ready(compiled(*inputs))
  queue.put((_proc_status_kib("VmHWM") - before) * 1024)


def rss_of(which, case_index, side, phase, argv):
  """Peak RSS growth during one run, in a fresh process (inputs resident, program compiled).

  Linux only (/proc/self/clear_refs); a rough cross-check of memory_analysis, since the
  allocator may reuse or keep memory.
  """
  ctx = mp.get_context("spawn")
  queue = ctx.Queue()
  proc = ctx.Process(target=_rss_child, args=(queue, which, case_index, side, phase, argv))
  proc.start()
  value = queue.get()
  proc.join()
  return value


def run(args, argv):
  results = []
  for which in args.which:
    for i, (name, case, naive, fused, make_inputs) in enumerate(BENCHES[which](args)):
      inputs = jax.block_until_ready(make_inputs())
      for phase in ("loss", "grad"):
        row = dict(which=which, name=name, phase=phase, **case)
        for side, fn in (("naive", naive), ("fused", fused)):
          compiled = _program(fn, phase).lower(*inputs).compile()
          median, times = time_of(compiled, inputs, args.repeats)
          row[side] = dict(memory_of(compiled), time_s=median, times_s=times)
          if args.rss:
            row[side]["rss_growth_bytes"] = rss_of(which, i, side, phase, argv)
          del compiled
        for key in ("peak_bytes", "temp_bytes", "time_s"):
          fused_v = row["fused"][key]
          row[f"ratio_{key}"] = row["naive"][key] / fused_v if fused_v else float("inf")
        results.append(row)
        print_row(row)
      del inputs
  return results


def print_row(row):
  mib = 2.0**20
  n, f = row["naive"], row["fused"]
  print(f"{row['name']:<24} {row['phase']:<5} "
        f"peak {n['peak_bytes'] / mib:8.1f} -> {f['peak_bytes'] / mib:8.1f} MiB "
        f"(x{row['ratio_peak_bytes']:5.2f})  "
        f"temp {n['temp_bytes'] / mib:8.1f} -> {f['temp_bytes'] / mib:7.1f} MiB "
        f"(x{row['ratio_temp_bytes']:6.1f})  "
        f"time {n['time_s'] * 1e3:8.1f} -> {f['time_s'] * 1e3:8.1f} ms "
        f"(x{row['ratio_time_s']:5.2f})", flush=True)


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--which", nargs="+", default=["reverse_kl"], choices=sorted(BENCHES))
  p.add_argument("--vocab", nargs="+", type=int, default=[32768, 151936])
  p.add_argument("--tokens", type=int, default=512)
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--impl", default="auto", choices=["auto", "pallas", "xla"])
  p.add_argument("--batch", type=int, default=256, help="group_advantage rows")
  p.add_argument("--seq", type=int, default=1024, help="group_advantage tokens per row")
  p.add_argument("--group", type=int, default=8, help="group_advantage group size")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--rss", action="store_true", help="also measure peak RSS growth per run")
  p.add_argument("--out", default=DEFAULT_OUT)
  args = p.parse_args(argv)
  if args.repeats < 1 or args.tokens < 1 or min(args.vocab) < 1:
    p.error("--repeats, --tokens and --vocab must be >= 1")
  return args


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  print(f"backend={jax.default_backend()} devices={jax.devices()} jax={jax.__version__}; "
        "memory = compiled memory_analysis (peak = temp + argument + output - alias)",
        flush=True)
  results = run(args, argv)
  report = dict(
      command="python -m smjax.kernels.bench " + " ".join(argv),
      backend=jax.default_backend(), device=str(jax.devices()[0]), jax=jax.__version__,
      host=platform.node(), cpu_count=os.cpu_count(), numpy=np.__version__,
      time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
      memory_note="peak_bytes = temp + argument + output - alias from "
                  "jit(...).lower(...).compile().memory_analysis(); temp_bytes = working "
                  "memory beyond inputs and outputs",
      results=results)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(report, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
