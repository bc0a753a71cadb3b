"""Rollout throughput: smjax's jitted KV-cache sampler against `transformers.generate` (torch CPU).

Both run the same random weights (a Qwen3-style model built with transformers, saved, and loaded into
smjax with smjax.models.hf), the same left-padded prompt batch, G samples per prompt and a fixed
number of new tokens (EOS disabled on both sides, so every row runs the full length). smjax's
compile time is excluded from its timing and reported; HF gets a warm-up run.

Defaults: a GRPO-sized batch (16 prompts x 4 samples = 64 rows, 64 new tokens) at three sizes,
sampled and greedy, every thread the process may use on both sides (what a user's process runs
with). Beside every figure: the fraction of the matmul floor, the generation's useful (analytic)
FLOPs divided by the time and by this process's f32 matmul rate ([2048, 2048] @ [2048, 2048],
jitted, measured before and after, the faster kept). `docs/rollout_vs_hf.json` is this command's
result; `python -m smjax.study.render --update-docs` renders it into docs/performance.md.

Threads: `--threads N` pins the process to N CPUs before jax and torch load (jax's XLA CPU backend
sizes its thread pool from the affinity mask) and calls torch.set_num_threads(N), so both use the
same cores; the output says so. On a machine shared with other jobs, torch's OpenMP threads can
slow down several-fold when N exceeds the idle cores: run N=1 too and compare.

`--tunix` adds Tunix's sampler (`tunix.generate.sampler.Sampler`, the engine of its GRPO
rollouts) on the same weights, prompts and rows, run in Tunix's own venv (`<envs-dir>/tunix`,
created on first use as for benchmarks/grpo_step_vs_tunix.py) as a subprocess with this process's
CPU affinity; benchmarks/_peer_tunix_sampler.py says what it times. If Tunix cannot be installed
or run, the script says why and exits non-zero; it never reports a number it did not measure.

  .venv/bin/python benchmarks/rollout_vs_hf.py --tunix --out docs/rollout_vs_hf.json
  .venv/bin/python benchmarks/rollout_vs_hf.py --threads 1 --size toy --out /tmp/r.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _peer_common  # noqa: E402  (the peer benchmarks' timer and venvs)
from _peer_common import timed  # noqa: E402
from study_seeds import _cpu  # noqa: E402  (the CPU's model name)
import smjax  # noqa: F401  (SMJAX_CPU_MALLOC=tuned must act before a JAX backend starts)

HERE = os.path.dirname(os.path.abspath(__file__))

SIZES = {  # vocab, d_model, d_ff, layers, heads, kv_heads
    "mid": (8192, 384, 1024, 4, 6, 2),   # ~12.6M params: compute matters
    "small": (4096, 256, 768, 4, 4, 2),  # ~5.5M params
    "toy": (128, 64, 256, 2, 4, 4),      # the toy study's char model: per-step overhead matters
}


def matmul_rate(jax) -> float:
  """FLOP/s of a jitted f32 [2048, 2048] @ [2048, 2048], best of 10."""
  n = 2048
  a = jax.numpy.ones((n, n), jax.numpy.float32)
  mm = jax.jit(lambda x: x @ x)
  mm(a).block_until_ready()
  return 2 * n ** 3 / min(timed(lambda: mm(a).block_until_ready(), 10))


def build_hf_model(size):
  import torch
  import transformers
  torch.manual_seed(0)
  vocab, d_model, d_ff, layers, heads, kv_heads = SIZES[size]
  cfg = transformers.Qwen3Config(
      vocab_size=vocab, hidden_size=d_model, intermediate_size=d_ff,
      num_hidden_layers=layers, num_attention_heads=heads,
      num_key_value_heads=kv_heads, head_dim=d_model // heads,
      max_position_embeddings=1024, rope_theta=1e6, tie_word_embeddings=False,
      rms_norm_eps=1e-6)
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  model.generation_config.eos_token_id = None  # both sides run the full max_new_tokens
  return model


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--size", nargs="+", default=["toy", "small", "mid"], choices=sorted(SIZES))
  ap.add_argument("--threads", type=int, default=0, help="CPUs for both (0: all available)")
  ap.add_argument("--prompts", type=int, default=16)
  ap.add_argument("--samples", type=int, default=4, help="G samples per prompt")
  ap.add_argument("--prompt-len", type=int, nargs=2, default=(16, 32), help="min max")
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--decode-stages", type=int, default=None,
                  help="the Sampler's decode_stages (default: its own, one per 128 new tokens); "
                       "with more than one, one loop over the whole cache is timed beside it")
  ap.add_argument("--modes", nargs="+", default=["sample", "greedy"], choices=["sample", "greedy"])
  ap.add_argument("--tunix", action="store_true", help="also time Tunix's sampler (own venv)")
  ap.add_argument("--envs-dir", default="bench_results/envs",
                  help="where the peers' venvs live (created on first use)")
  ap.add_argument("--out", default="bench_results/rollout_vs_hf.json")
  args = ap.parse_args()
  tunix_python = None
  if args.tunix:
    try:
      tunix_python = _peer_common.ensure_venv(os.path.join(args.envs_dir, "tunix"),
                                              _peer_common.TUNIX_REQUIREMENTS)
    except RuntimeError as e:
      sys.exit(f"rollout_vs_hf: Tunix could not be installed, so there is no Tunix figure: {e}")

  cpus = sorted(os.sched_getaffinity(0))
  if args.threads:
    os.sched_setaffinity(0, cpus[:args.threads])  # before jax creates its thread pool
  threads = len(os.sched_getaffinity(0))
  import jax  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from smjax.models import hf  # pylint: disable=import-outside-toplevel
  from smjax.rollout import Sampler, decode_stages  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(threads)
  print(f"CPU threads: torch.set_num_threads({threads}); jax/XLA CPU backend uses the same "
        f"{threads} cores (process affinity); jax {jax.__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}")

  peak = matmul_rate(jax)
  results = dict(benchmark="rollout_vs_hf", command="python benchmarks/rollout_vs_hf.py "
                 + " ".join(sys.argv[1:]), config=vars(args), threads=threads,
                 cpu=_cpu(), date=datetime.date.today().isoformat(), platform=platform.platform(),
                 jax=jax.__version__, torch=torch.__version__, sizes={})
  for size in args.size:
    model = build_hf_model(size)
    model_dir = tempfile.TemporaryDirectory()  # pylint: disable=consider-using-with
    path = model_dir.name
    model.save_pretrained(path)
    cfg, params = hf.load_params(path)
    params = jax.device_put(params)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: Qwen3-style '{size}', {n_params / 1e6:.2f}M params, d_model "
          f"{cfg.d_model}, {cfg.n_layers} layers, vocab {cfg.vocab_size}")

    rng = np.random.RandomState(0)
    lo, hi = args.prompt_len
    prompts = [[int(t) for t in rng.randint(3, cfg.vocab_size, rng.randint(lo, hi + 1))]
               for _ in range(args.prompts)]
    G, T = args.samples, args.new_tokens
    rows = args.prompts * G
    bucket = 1 << (hi - 1).bit_length()
    make = lambda n: Sampler(cfg, max_new_tokens=T, eos_id=None, pad_id=0,
                             prompt_buckets=(bucket,), decode_stages=n)
    sampler = make(args.decode_stages)
    stages = len(decode_stages(bucket, T, sampler.stages))
    one_loop = make(1) if stages > 1 else None  # the reference the stages are measured against
    results["sizes"][size] = sized = dict(params=n_params, rows=rows, prompt_bucket=bucket,
                                          decode_stages=stages, modes={})

    for mode in args.modes:
      greedy = mode == "greedy"
      key = iter(range(10_000))

      def ours(s=sampler, k=None):
        r = s.generate(params, prompts, jax.random.key(next(key) if k is None else k),
                       num_samples=G, greedy=greedy)
        r.completion_BC.block_until_ready()
        return r

      t0 = time.perf_counter()
      res = ours()
      first = time.perf_counter() - t0
      ours_times = timed(ours, args.reps)
      assert np.asarray(res.completion_mask_BC).all() and res.steps_run == T - 1
      one_loop_times = None
      if one_loop:
        one_res = ours(one_loop, 0)
        same = one_res.completion_BC, ours(sampler, 0).completion_BC
        one_loop_times = timed(lambda: ours(one_loop), args.reps)
        one_loop_flops = sum(c.flops() for c in one_res.program_calls)

      # HF prefills every row (its num_return_sequences expands the inputs the same way).
      prompt_BP = torch.tensor(np.asarray(res.prompt_BP), dtype=torch.long)
      mask_BP = torch.tensor(np.asarray(res.prompt_mask_BP), dtype=torch.long)
      hf_kw = dict(attention_mask=mask_BP, max_new_tokens=T, min_new_tokens=T, pad_token_id=0)
      hf_kw.update(dict(do_sample=False) if greedy else
                   dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0))

      def theirs():
        with torch.no_grad():
          out = model.generate(prompt_BP, **hf_kw)
        assert out.shape == (rows, prompt_BP.shape[1] + T), out.shape

      t0 = time.perf_counter()
      theirs()
      hf_warm = time.perf_counter() - t0
      hf_times = timed(theirs, args.reps)

      tokens = rows * T
      ours_s, hf_s = statistics.median(ours_times), statistics.median(hf_times)
      flops = sum(c.flops() for c in res.program_calls)
      useful = sum(c.useful for c in res.program_calls)
      entry = dict(smjax_s=ours_s, smjax_runs_s=ours_times, smjax_first_call_s=first,
                   smjax_compile_s_approx=first - ours_s, hf_s=hf_s, hf_runs_s=hf_times,
                   hf_warmup_s=hf_warm, tokens=tokens, smjax_tokens_per_s=tokens / ours_s,
                   hf_tokens_per_s=tokens / hf_s, speedup=hf_s / ours_s,
                   smjax_compiled_flops=flops, smjax_useful_flops=useful,
                   smjax_gflops_per_s=flops / ours_s / 1e9)
      entry["smjax_floor_fraction"] = useful / ours_s / peak
      entry["hf_floor_fraction"] = useful / hf_s / peak
      if one_loop_times:
        one_s = statistics.median(one_loop_times)
        entry.update(smjax_one_loop_s=one_s, smjax_one_loop_runs_s=one_loop_times,
                     smjax_one_loop_compiled_flops=one_loop_flops,
                     stages_speedup=one_s / ours_s,
                     stages_same_tokens=bool(np.array_equal(*map(np.asarray, same))),
                     # rows whose whole completion is the one loop's: a row can part ways where a
                     # draw falls within float rounding of a token boundary (see smjax/rollout.py)
                     stages_rows_same=int(np.all(np.equal(*map(np.asarray, same)), axis=1).sum()))
      sized["modes"][mode] = entry
      if tunix_python:
        entry["tunix_s"] = None  # filled in below, once per size
      print(f"[{mode}] {rows} rows ({args.prompts} prompts x {G}) x {T} new tokens, prompts "
            f"{lo}-{hi} tokens (bucket {bucket})")
      print(f"  smjax: {ours_s * 1e3:8.1f} ms  {tokens / ours_s:9.0f} tok/s   (first call incl. "
            f"compile {first:.2f} s; {flops / 1e9:.2f} GFLOP compiled, {useful / 1e9:.2f} useful)")
      print(f"  HF   : {hf_s * 1e3:8.1f} ms  {tokens / hf_s:9.0f} tok/s   (warm-up {hf_warm:.2f} s)")
      print(f"  speedup smjax / HF: {hf_s / ours_s:.2f}x; fraction of the matmul floor: smjax "
            f"{entry['smjax_floor_fraction']:.0%}, HF {entry['hf_floor_fraction']:.0%}")
      if one_loop_times:
        print(f"  smjax in one loop over the whole cache: {entry['smjax_one_loop_s'] * 1e3:8.1f} "
              f"ms ({one_loop_flops / 1e9:.2f} GFLOP); {stages} stages are "
              f"{entry['stages_speedup']:.2f}x faster, same tokens: {entry['stages_same_tokens']}")

    if tunix_python:
      vocab, d_model, d_ff, layers, heads, kv_heads = SIZES[size]
      spec = dict(model_dir=path, prompts=prompts, samples=G, new_tokens=T,
                  prompt_bucket=bucket, modes=args.modes, reps=args.reps,
                  dims=dict(vocab=vocab, d_model=d_model, d_ff=d_ff, layers=layers, heads=heads,
                            kv_heads=kv_heads, head_dim=d_model // heads))
      try:
        peer = _peer_common.run_peer(tunix_python, os.path.join(HERE, "_peer_tunix_sampler.py"),
                                     spec, path, timeout_s=1800)
      except RuntimeError as e:
        sys.exit(f"rollout_vs_hf: the Tunix sampler could not run, so there is no Tunix "
                 f"figure: {e}")
      sized["tunix"] = dict(jax=peer["jax"], tunix=peer["tunix"], threads=peer["threads"])
      for mode, e in sized["modes"].items():
        t = peer["modes"][mode]
        e.update(tunix_s=t["median_s"], tunix_runs_s=t["runs_s"],
                 tunix_first_call_s=t["first_call_s"], tunix_what=t["what"],
                 tunix_tokens_per_s=e["tokens"] / t["median_s"],
                 speedup_vs_tunix=t["median_s"] / e["smjax_s"])
        print(f"[{mode}] Tunix sampler: {t['median_s'] * 1e3:8.1f} ms  "
              f"{e['tunix_tokens_per_s']:9.0f} tok/s (first call {t['first_call_s']:.2f} s); "
              f"smjax / Tunix: {e['speedup_vs_tunix']:.2f}x")
    model_dir.cleanup()

  results["matmul_flops_per_s"] = peak = max(peak, matmul_rate(jax))
  for sized in results["sizes"].values():  # the floor fractions against the faster peak
    for e in sized["modes"].values():
      e["smjax_floor_fraction"] = e["smjax_useful_flops"] / e["smjax_s"] / peak
      e["hf_floor_fraction"] = e["smjax_useful_flops"] / e["hf_s"] / peak
      if e.get("tunix_s"):
        e["tunix_floor_fraction"] = e["smjax_useful_flops"] / e["tunix_s"] / peak
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
