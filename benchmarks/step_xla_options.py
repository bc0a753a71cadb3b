"""The GRPO peer benchmark's packed step under per-executable XLA CPU options.

The step of `grpo_step_vs_trl.py` / `grpo_step_vs_tunix.py` (`step_packed`: the shared-prompt step
on the packed batch, same model sizes, batch and optimizer) is lowered once and compiled once per
option set with `lowered.compile(compiler_options=...)`: the options apply to that executable
only, not to the process (unlike XLA_FLAGS). The compiled steps are then timed in interleaved
rounds (one call of each per round, `--rounds` rounds after `--warmup`), so that drift on a shared
machine weighs on all of them alike, and each is reported as its median and its ratio to the
default compile of the same run (the executable the peer benchmarks time). Every variant's first
loss and gradient norm are compared with the default's: an option may move the rounding, not the
update.

  .venv/bin/python benchmarks/step_xla_options.py --rounds 20   # small; writes
                                                   # bench_results/step_xla_options.json
  .venv/bin/python benchmarks/step_xla_options.py --size mid

An option set the installed jaxlib does not know is reported as failed (with XLA's message) and the
others still run. The option names are XLA's (`xla_cpu_*`); the `xla_cpu_experimental_*` ones come
with no stability promise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _peer_common as common  # noqa: E402  pylint: disable=wrong-import-position
import smjax  # noqa: F401  (SMJAX_CPU_MALLOC=tuned must act before a JAX backend starts)

# name -> compiler_options; "default" is the reference every ratio is taken against.
OPTION_SETS = {
    "default": {},
    "ynn_off": {"xla_cpu_experimental_ynn_fusion_type": ""},
    # YNNPACK for dots only: its reduction fusions (the norms' weight gradients, softmax sums)
    # go back to XLA's own emitters.
    "ynn_dots_only": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "vector_512": {"xla_cpu_prefer_vector_width": 512},
    "ynn_off_vector_512": {"xla_cpu_experimental_ynn_fusion_type": "",
                           "xla_cpu_prefer_vector_width": 512},
    "onednn": {"xla_cpu_use_onednn": True},
}


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  ap.add_argument("--size", default="small", choices=sorted(common.SIZES))
  ap.add_argument("--prompts", type=int, default=4)
  ap.add_argument("--group-size", type=int, default=4)
  ap.add_argument("--prompt-len", type=int, nargs=2, default=(16, 32), help="min max")
  ap.add_argument("--completion-len", type=int, default=64)
  ap.add_argument("--sets", nargs="+", default=list(OPTION_SETS), choices=list(OPTION_SETS),
                  help="option sets to compile ('default' is always added)")
  ap.add_argument("--rounds", type=int, default=12, help="timed interleaved rounds")
  ap.add_argument("--warmup", type=int, default=2, help="untimed interleaved rounds")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out", default="bench_results/step_xla_options.json")
  return ap.parse_args(argv)


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.rounds < 1 or args.warmup < 0:
    raise SystemExit(f"--rounds must be >= 1 and --warmup >= 0 (got {args.rounds}, {args.warmup})")
  import jax  # pylint: disable=import-outside-toplevel
  import _peer_smjax as ps  # pylint: disable=import-outside-toplevel
  from smjax.flops import executable_flops  # pylint: disable=import-outside-toplevel
  names = ["default"] + [n for n in args.sets if n != "default"]
  vocab = common.SIZES[args.size][0]
  G = args.group_size
  with tempfile.TemporaryDirectory() as work:
    params = ps.build_hf_model(args.size, work, seed=args.seed)
    batch = common.make_step_batch(prompts=args.prompts, group_size=G,
                                   prompt_len=tuple(args.prompt_len),
                                   completion_len=args.completion_len, vocab=vocab,
                                   seed=args.seed,
                                   pad_to=common.prompt_bucket(args.prompt_len[1]))
    side = ps.Side(work, batch, group_size=G, lr=1e-6, shared_prompt_rows=G, packed=True)
  # The default is the executable Side compiled (and the peer benchmarks time); the others are
  # compiled from the same lowering.
  compiled, failed = {"default": (side.step, side.compile_s)}, {}
  for name in names[1:]:
    t0 = time.perf_counter()
    try:
      exe = side.lowered.compile(compiler_options=OPTION_SETS[name])
    except Exception as e:  # pylint: disable=broad-except
      failed[name] = str(e).splitlines()[0][:300]
      print(f"  {name:20s} failed to compile: {failed[name]}")
      continue
    compiled[name] = (exe, time.perf_counter() - t0)
  states = {n: side.fresh_state() for n in compiled}
  times = {n: [] for n in compiled}
  first = {}
  for r in range(args.warmup + args.rounds):
    for n, (exe, _) in compiled.items():
      t0 = time.perf_counter()
      new_state, metrics = exe(states[n], side.batch)
      jax.block_until_ready(metrics)
      dt = time.perf_counter() - t0
      states[n] = new_state
      if n not in first:
        first[n] = (float(metrics["loss"]), float(metrics["grad_norm"]))
      if r >= args.warmup:
        times[n].append(dt)
  ref = statistics.median(times["default"])
  results = dict(config=vars(args), platform=platform.platform(), jax=jax.__version__,
                 params=params, failed=failed, sets={})
  print(f"packed GRPO step, '{args.size}' ({params / 1e6:.2f}M params), {args.rounds} "
        f"interleaved rounds; ratio = default median / variant median")
  for n, (exe, compile_s) in compiled.items():
    med = statistics.median(times[n])
    rec = dict(options=OPTION_SETS[n], median_s=med, min_s=min(times[n]), runs_s=times[n],
               compile_s=compile_s, compiled_flops=executable_flops(exe)[0],
               first_loss=first[n][0], first_grad_norm=first[n][1],
               speedup_vs_default=ref / med,
               loss_rel_diff=abs(first[n][0] - first["default"][0])
               / max(abs(first["default"][0]), 1e-12),
               grad_norm_rel_diff=abs(first[n][1] - first["default"][1])
               / max(abs(first["default"][1]), 1e-12))
    results["sets"][n] = rec
    print(f"  {n:20s} {med * 1e3:8.1f} ms  x{rec['speedup_vs_default']:.3f}  (min "
          f"{rec['min_s'] * 1e3:.1f} ms; first loss rel diff {rec['loss_rel_diff']:.1e}, grad "
          f"norm {rec['grad_norm_rel_diff']:.1e})")
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=1)
  print(f"wrote {args.out}")
  return results


if __name__ == "__main__":
  main()
