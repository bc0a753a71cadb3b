"""Where a decode step's time goes: a `jax.profiler` trace of the sampler's decode loop on a
GRPO-sized batch, its ops' time grouped by what they compute.

One `Sampler.generate` call (16 prompts or `--prompts`, x 4 samples: 64 rows; 64 new tokens or
`--new-tokens`, in the Sampler's decode stages or `--decode-stages`; plain sampling, EOS off; the
'small' Qwen3-style model of benchmarks/rollout_vs_hf.py with random weights, or `--preset`'s;
prompts of `--prompt-len` / 2 to `--prompt-len` tokens) is traced after warm-up. Every XLA op of
the loop body is named by its HLO metadata (the jax source scope, e.g.
`Transformer/layers_0/mlp/dot_general`) and put in one part; a part's time is the wall time
during which any of its ops ran on any thread (intervals merged), divided by the decode steps.
The matmul floor is the generation's analytic FLOPs at this process's f32 [2048, 2048] matmul rate.

  .venv/bin/python benchmarks/decode_profile.py --out docs/decode_profile.json
  .venv/bin/python benchmarks/decode_profile.py --new-tokens 512 --decode-stages 1 --out /tmp/p.json
  # the toy at the study's evaluation shape (128 prompts x 4 samples, 44 new tokens)
  .venv/bin/python benchmarks/decode_profile.py --preset toy-tiny --prompts 128 --prompt-len 20 \
      --new-tokens 44 --out docs/decode_profile_toy.json
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smjax  # noqa: F401,E402  (SMJAX_CPU_MALLOC=tuned must act before a JAX backend starts)
from rollout_vs_hf import matmul_rate  # noqa: E402  (shared with the sampler benchmark)
from _peer_common import cpu_name, timed  # noqa: E402

PARTS = (  # (part, test on the op's jax scope), first match wins
    ("MLP (gate/up and down matmuls, SiLU)", lambda op: "/mlp/" in op),
    ("attention over the cache (score and value products)",
     lambda op: "/attn/" in op and re.search(r"BK\w*,BK", op)),
    ("q/k/v and output projections", lambda op: "/attn/" in op and op.endswith("/dot_general")),
    ("attention, rest (RoPE, q/k norms, softmax, cache writes)", lambda op: "/attn/" in op),
    ("LM head and final norm", lambda op: re.search(r"Transformer/(dot_general|final_norm)", op)),
    ("norms, residuals, embedding", lambda op: "Transformer/" in op),
    ("sampling, stops and loop bookkeeping", lambda op: True),
)


# The sampler's jitted decode loops, as smjax.rollout names them (imported from smjax.decode and
# called through rollout's globals): replaced for one call to capture the arguments to compile.
LOOPS = ("decode_loop", "decode_loop_growing")


def op_scopes(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> its jax scope (metadata op_name)."""
  out = {}
  for line in hlo_text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]*)\"", line)
    if m and m.group(1) not in out:
      out[m.group(1)] = m.group(2)
  return out


def merged_ns(intervals) -> int:
  total, cur = 0, None
  for a, b in sorted(intervals):
    if cur is None or a > cur[1]:
      total += 0 if cur is None else cur[1] - cur[0]
      cur = [a, b]
    else:
      cur[1] = max(cur[1], b)
  return total + (0 if cur is None else cur[1] - cur[0])


def traced_parts(trace_dir: str, scopes: dict[str, str], parts, keep=lambda scope: True) -> dict:
  """{part: milliseconds} of the ops of one program (`scopes`: its HLO instruction -> jax scope)
  in a `jax.profiler` trace, each op in the first part whose test its scope passes."""
  from jax._src.lib import _profile_data  # pylint: disable=import-outside-toplevel
  profile = _profile_data.ProfileData.from_file(
      glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0])
  intervals = collections.defaultdict(list)
  # Every thread's events: XLA:CPU runs small ops on the calling thread, the rest on its pool.
  for plane in profile.planes:
    for line in plane.lines:
      for ev in line.events:
        scope = scopes.get(ev.name)
        if scope is None or not keep(scope):   # the executor's own spans, other programs
          continue
        part = next(name for name, test in parts if test(scope))
        intervals[part].append((ev.start_ns, ev.end_ns))
  return {name: merged_ns(intervals[name]) / 1e6 for name, _ in parts if name in intervals}


def decode_matmuls(cfg, rows: int) -> list[tuple[str, int, int, int, int]]:
  """A decode step's matmuls on one device as (name, M, K, N, count per step): the fused q/k/v and
  gate/up products of `fuse_for_decode`, the output and down projections per layer, the LM head."""
  D, H, N, K, F = cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff
  L = cfg.n_layers
  return [("q/k/v", rows, D, (N + 2 * K) * H, L), ("output projection", rows, N * H, D, L),
          ("MLP gate/up", rows, D, 2 * F, L), ("MLP down", rows, F, D, L),
          ("LM head", rows, D, cfg.vocab_size, 1)]


def matmuls_alone(jax, shapes, reps: int = 50) -> tuple[list[dict], float]:
  """Each matmul shape jitted alone, best of `reps` calls, less the dispatch time of a trivial
  jitted call (also returned): what XLA:CPU reaches on these shapes by themselves."""
  jnp = jax.numpy
  tiny = jnp.ones((1,), jnp.float32)
  nop = jax.jit(lambda x: x * 2.0)
  nop(tiny).block_until_ready()
  dispatch = min(timed(lambda: nop(tiny).block_until_ready(), reps))
  mm = jax.jit(lambda x, w: x @ w)
  out = []
  for name, m, k, n, count in shapes:
    x, w = jnp.ones((m, k), jnp.float32), jnp.full((k, n), 0.01, jnp.float32)
    mm(x, w).block_until_ready()
    s = max(min(timed(lambda: mm(x, w).block_until_ready(), reps)) - dispatch, 1e-9)
    out.append(dict(matmul=name, shape=[m, k, n], per_step=count, ms=s * 1e3,
                    flops_per_s=2 * m * k * n / s))
  return out, dispatch


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("--decode-stages", type=int, default=None,
                  help="the Sampler's decode_stages (default: its own, one per 32 new tokens, "
                       "at most 8)")
  ap.add_argument("--preset", default="", help="a smjax.models.presets name (default: the 'small' "
                  "model of benchmarks/rollout_vs_hf.py)")
  ap.add_argument("--prompts", type=int, default=16, help="prompts (x 4 samples: the rows)")
  ap.add_argument("--prompt-len", type=int, default=32, help="the prompt bucket")
  ap.add_argument("--out", default="bench_results/decode_profile.json")
  args = ap.parse_args()
  import jax  # pylint: disable=import-outside-toplevel
  from smjax import decode as dec  # pylint: disable=import-outside-toplevel
  from smjax import rollout as ro  # pylint: disable=import-outside-toplevel
  from smjax.models.transformer import ModelConfig, init_params  # pylint: disable=import-outside-toplevel

  from smjax.models.presets import get_preset  # pylint: disable=import-outside-toplevel

  cfg = get_preset(args.preset) if args.preset else ModelConfig(
      vocab_size=4096, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=768,
      max_seq_len=1024, qk_norm=True, rope_theta=1e6)
  params = init_params(cfg, jax.random.key(0))
  rng = np.random.RandomState(0)
  P = args.prompt_len
  prompts = [[int(t) for t in rng.randint(3, cfg.vocab_size, rng.randint(P // 2, P + 1))]
             for _ in range(args.prompts)]
  rows, new_tokens = 4 * args.prompts, args.new_tokens
  sampler = ro.Sampler(cfg, max_new_tokens=new_tokens, eos_id=None, pad_id=0, prompt_buckets=(P,),
                       decode_stages=args.decode_stages)
  captured = {}
  loops = {name: getattr(ro, name) for name in LOOPS}

  def capture(name):
    def call(*a, **k):
      captured.update(loop=loops[name], a=a, k=k)
      return loops[name](*a, **k)
    return call

  for name in loops:
    setattr(ro, name, capture(name))
  run = lambda: sampler.generate(params, prompts, jax.random.key(1), num_samples=4)
  result = run()
  for name, loop in loops.items():
    setattr(ro, name, loop)
  times = []
  for _ in range(10):
    t0 = time.perf_counter()
    run().completion_BC.block_until_ready()
    times.append(time.perf_counter() - t0)
  seconds = min(times)
  peak = matmul_rate(jax)
  alone, dispatch_s = matmuls_alone(jax, decode_matmuls(cfg, rows))
  alone_ms = sum(m["ms"] * m["per_step"] for m in alone)
  useful = sum(c.useful for c in result.program_calls)
  scopes = op_scopes(captured["loop"].lower(*captured["a"], **captured["k"]).compile().as_text())

  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      run().completion_BC.block_until_ready()
    traced = traced_parts(trace_dir, scopes, PARTS, keep=lambda scope: "/while/body/" in scope)
  steps = result.steps_run
  parts = {name: ms / steps for name, ms in traced.items()}
  total = sum(parts.values())
  categories = [dict(category=name, ms_per_step=parts[name], share=parts[name] / total)
                for name, _ in PARTS if name in parts]
  out = dict(benchmark="decode_profile", command="python benchmarks/decode_profile.py "
             + " ".join(sys.argv[1:]), cpu=cpu_name(), threads=len(os.sched_getaffinity(0)),
             jax=jax.__version__, date=datetime.date.today().isoformat(), rows=rows,
             model=args.preset or "small", new_tokens=new_tokens,
             decode_stages=len(dec.decode_stages(P, new_tokens, sampler.stages)),
             generate_s=seconds, steps=steps,
             ms_per_step=seconds / (steps + 1) * 1e3, matmul_flops_per_s=peak,
             floor_fraction=useful / seconds / peak, traced_ms_per_step=total,
             categories=categories, matmuls_alone=alone, dispatch_ms=dispatch_s * 1e3,
             matmuls_alone_ms_per_step=alone_ms,
             # the floor fraction of a step that took only its matmuls' time alone
             matmuls_alone_floor_fraction=useful / (steps + 1) / (alone_ms / 1e3) / peak)
  print(f"{rows} rows x {new_tokens} tokens: {seconds * 1e3:.1f} ms per generate, "
        f"{useful / seconds / peak:.0%} of the matmul floor ({peak / 1e9:.0f} GFLOP/s)")
  for c in categories:
    print(f"  {c['ms_per_step']:6.3f} ms/step {100 * c['share']:4.0f} %  {c['category']}")
  for m in alone:
    print(f"  alone: {m['matmul']:18s} {m['shape']} x{m['per_step']}: {m['ms']:.3f} ms, "
          f"{m['flops_per_s'] / 1e9:.0f} GFLOP/s")
  print(f"  the step's matmuls alone: {alone_ms:.2f} ms per step of {out['ms_per_step']:.2f}; a "
        f"step that took only that would be at {out['matmuls_alone_floor_fraction']:.0%} of the "
        f"matmul floor")
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=2)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
