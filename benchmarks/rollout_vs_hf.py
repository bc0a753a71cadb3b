"""Rollout throughput: smjax's jitted KV-cache sampler against `transformers.generate` (torch CPU).

Both run the same random weights (a Qwen3-style model built with transformers, saved, and loaded into
smjax with smjax.models.hf), the same left-padded prompt batch, G samples per prompt and a fixed
number of new tokens (EOS disabled on both sides, so every row runs the full length). smjax's
compile time is excluded from its timing and reported; HF gets a warm-up run.

Rounds (`--rounds`, default 5): the sides take turns, each running `--reps` calls per round in an
order that rotates from round to round, so a slow spell of a shared machine falls on every side
rather than on whichever ran then (the peers' times swung ±25 % between runs minutes apart when
each side ran all its calls in one block). Each side's time is its median over every call; a ratio
is the median over rounds of that round's ratio, printed and written with its lowest and highest
round. At a GRPO-sized batch (>= 64 rows x >= 64 tokens, sampled) the output ends with the
sampler's goals (3x HF, 2x Tunix, 40 % of the matmul floor): the median, the range over rounds and
in how many rounds each was met.

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
CPU affinity, kept running for the size's rounds (`_peer_common.PeerSession`);
benchmarks/_peer_tunix_sampler.py says what it times. If Tunix cannot be installed
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
from _peer_common import cpu_name, timed  # noqa: E402
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
  ap.add_argument("--rounds", type=int, default=5,
                  help="timed rounds; each side runs --reps calls per round, in rotating order")
  ap.add_argument("--reps", type=int, default=1, help="calls per side and round")
  ap.add_argument("--decode-stages", type=int, default=None,
                  help="the Sampler's decode_stages (default: its own, one per 32 new tokens, "
                       "at most 8); "
                       "with more than one, one loop over the whole cache is timed beside it")
  ap.add_argument("--modes", nargs="+", default=["sample", "greedy"], choices=["sample", "greedy"])
  ap.add_argument("--tunix", action="store_true", help="also time Tunix's sampler (own venv)")
  ap.add_argument("--envs-dir", default="bench_results/envs",
                  help="where the peers' venvs live (created on first use)")
  ap.add_argument("--out", default="bench_results/rollout_vs_hf.json")
  args = ap.parse_args()
  if args.rounds < 1 or args.reps < 1:
    ap.error(f"--rounds ({args.rounds}) and --reps ({args.reps}) must be >= 1")
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
  from smjax.decode import decode_stages  # pylint: disable=import-outside-toplevel
  from smjax.rollout import Sampler  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(threads)
  print(f"CPU threads: torch.set_num_threads({threads}); jax/XLA CPU backend uses the same "
        f"{threads} cores (process affinity); jax {jax.__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}")

  peak = matmul_rate(jax)
  results = dict(benchmark="rollout_vs_hf", command="python benchmarks/rollout_vs_hf.py "
                 + " ".join(sys.argv[1:]), config=vars(args), threads=threads,
                 cpu=cpu_name(), date=datetime.date.today().isoformat(),
                 platform=platform.platform(), jax=jax.__version__, torch=torch.__version__,
                 sizes={})
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
    tunix = None
    if tunix_python:  # one Tunix process per size, serving every mode's rounds
      vocab, d_model, d_ff, layers, heads, kv_heads = SIZES[size]
      spec = dict(model_dir=path, prompts=prompts, samples=G, new_tokens=T,
                  prompt_bucket=bucket, modes=args.modes,
                  dims=dict(vocab=vocab, d_model=d_model, d_ff=d_ff, layers=layers, heads=heads,
                            kv_heads=kv_heads, head_dim=d_model // heads))
      try:
        tunix = _peer_common.PeerSession(tunix_python,
                                         os.path.join(HERE, "_peer_tunix_sampler.py"), spec,
                                         path, timeout_s=1800)
      except RuntimeError as e:
        sys.exit(f"rollout_vs_hf: the Tunix sampler could not run, so there is no Tunix "
                 f"figure: {e}")
      sized["tunix"] = dict(jax=tunix.ready["jax"], tunix=tunix.ready["tunix"],
                            threads=tunix.ready["threads"])

    for mode in args.modes:
      greedy = mode == "greedy"
      key = iter(range(1_000_000))

      def ours(s=sampler, k=None, greedy=greedy, key=key):
        r = s.generate(params, prompts, jax.random.key(next(key) if k is None else k),
                       num_samples=G, greedy=greedy)
        r.completion_BC.block_until_ready()
        return r

      t0 = time.perf_counter()
      res = ours()
      first = time.perf_counter() - t0
      assert np.asarray(res.completion_mask_BC).all() and res.steps_run == T - 1
      sides = {"smjax": lambda: timed(ours, args.reps)}
      if one_loop:
        one_res = ours(one_loop, 0)
        same = one_res.completion_BC, ours(sampler, 0).completion_BC
        one_loop_flops = sum(c.flops() for c in one_res.program_calls)
        sides["one_loop"] = lambda: timed(lambda: ours(one_loop), args.reps)

      # HF prefills every row (its num_return_sequences expands the inputs the same way).
      prompt_BP = torch.tensor(np.asarray(res.prompt_BP), dtype=torch.long)
      mask_BP = torch.tensor(np.asarray(res.prompt_mask_BP), dtype=torch.long)
      hf_kw = dict(attention_mask=mask_BP, max_new_tokens=T, min_new_tokens=T, pad_token_id=0)
      hf_kw.update(dict(do_sample=False) if greedy else
                   dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0))

      def theirs(hf_kw=hf_kw, prompt_BP=prompt_BP):
        with torch.no_grad():
          out = model.generate(prompt_BP, **hf_kw)
        assert out.shape == (rows, prompt_BP.shape[1] + T), out.shape

      t0 = time.perf_counter()
      theirs()
      hf_warm = time.perf_counter() - t0
      sides["hf"] = lambda: timed(theirs, args.reps)
      if tunix:
        def tunix_runs(mode=mode):
          try:
            return tunix.call("run", mode=mode, reps=args.reps, timeout_s=1800)
          except RuntimeError as e:
            sys.exit(f"rollout_vs_hf: the Tunix sampler failed, so there is no Tunix figure: {e}")
        sides["tunix"] = tunix_runs
      # Rounds: every side runs `reps` calls per round, the order rotating from round to round, so
      # a slow spell of a shared machine falls on every side; ratios are taken within a round.
      runs = {name: [] for name in sides}
      names = list(sides)
      for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
          runs[name].append(sides[name]())
      entry = _entry(runs, rows * T, res, peak)
      entry.update(smjax_first_call_s=first, smjax_compile_s_approx=first - entry["smjax_s"],
                   hf_warmup_s=hf_warm)
      if one_loop:
        entry.update(smjax_one_loop_compiled_flops=one_loop_flops,
                     stages_same_tokens=bool(np.array_equal(*map(np.asarray, same))),
                     # rows whose whole completion is the one loop's: a row can part ways where a
                     # draw falls within float rounding of a token boundary (see smjax/rollout.py)
                     stages_rows_same=int(np.all(np.equal(*map(np.asarray, same)), axis=1).sum()))
      if tunix:
        t = tunix.ready["modes"][mode]
        entry.update(tunix_first_call_s=t["first_call_s"], tunix_what=t["what"])
      sized["modes"][mode] = entry
      _print(mode, entry, args, rows, bucket, stages)
    if tunix:
      tunix.close()
    model_dir.cleanup()

  results["matmul_flops_per_s"] = peak = max(peak, matmul_rate(jax))
  for sized in results["sizes"].values():  # the floor fractions against the faster peak
    for e in sized["modes"].values():
      for side in ("smjax", "hf", "tunix", "smjax_one_loop"):
        if f"{side}_s" in e:
          e[f"{side}_floor_fraction"] = e["smjax_useful_flops"] / e[f"{side}_s"] / peak
  results["goals"] = goals(results, args)
  for g in results["goals"]:
    print(f"goal {g['goal']} at {g['size']}: {g['value']:.2f} (rounds {g['low']:.2f}-"
          f"{g['high']:.2f}, met in {g['rounds_met']} of {g['rounds']}): "
          f"{'met' if g['met'] else 'missed'}")
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  print(f"wrote {args.out}")


GOALS = (("smjax / HF generate >= 3x", "speedup", 3.0),  # issue #28, sampled, GRPO-sized batch
         ("smjax / Tunix sampler >= 2x", "speedup_vs_tunix", 2.0),
         ("decode >= 40 % of the matmul floor", "smjax_floor_fraction", 0.4))


def goals(results: dict, args) -> list[dict]:
  """The sampler's goals at each size where the batch is GRPO-sized (>= 64 rows and >= 64 new
  tokens, sampled): the figure (median over rounds), its lowest and highest round, and in how many
  rounds it was met; `met` goes by the median."""
  out = []
  for size, sized in results["sizes"].items():
    e = sized["modes"].get("sample")
    if e is None or sized["rows"] < 64 or args.new_tokens < 64:
      continue
    for goal, key, target in GOALS:
      if key not in e:
        continue
      if key == "smjax_floor_fraction":  # per round: that round's median smjax time
        per_round = [e["smjax_useful_flops"] / t / results["matmul_flops_per_s"]
                     for t in e["smjax_rounds_s"]]
      else:
        per_round = e[f"{key}_rounds"]
      out.append(dict(size=size, goal=goal, target=target, value=e[key], low=min(per_round),
                      high=max(per_round), rounds=len(per_round),
                      rounds_met=sum(v >= target for v in per_round), met=e[key] >= target))
  return out


def _entry(runs: dict, tokens: int, res, peak: float) -> dict:
  """One mode's figures from its rounds (`runs[side][round]`: that round's wall times): each
  side's median over every call, the smjax-relative ratios as the median over rounds of each
  round's ratio of medians, with their lowest and highest round."""
  med = {name: statistics.median(t for rnd in rs for t in rnd) for name, rs in runs.items()}
  flops = sum(c.flops() for c in res.program_calls)
  useful = sum(c.useful for c in res.program_calls)
  e = dict(tokens=tokens, rounds=len(runs["smjax"]), smjax_compiled_flops=flops,
           smjax_useful_flops=useful, smjax_gflops_per_s=flops / med["smjax"] / 1e9,
           smjax_rounds_s=[statistics.median(rnd) for rnd in runs["smjax"]])
  for name, key in (("smjax", "smjax"), ("hf", "hf"), ("tunix", "tunix"),
                    ("one_loop", "smjax_one_loop")):
    if name in runs:
      e[f"{key}_s"] = med[name]
      e[f"{key}_runs_s"] = [t for rnd in runs[name] for t in rnd]
      e[f"{key}_tokens_per_s"] = tokens / med[name]
      e[f"{key}_floor_fraction"] = useful / med[name] / peak
  for name, key in (("hf", "speedup"), ("tunix", "speedup_vs_tunix"),
                    ("one_loop", "stages_speedup")):
    if name in runs:
      per_round = [statistics.median(theirs) / statistics.median(ours)
                   for theirs, ours in zip(runs[name], runs["smjax"])]
      e[key] = statistics.median(per_round)
      e[f"{key}_rounds"] = per_round
  return e


def _print(mode: str, e: dict, args, rows: int, bucket: int, stages: int) -> None:
  lo, hi = args.prompt_len

  def ratio(key):
    rs = e[f"{key}_rounds"]
    return f"{e[key]:.2f}x (rounds {min(rs):.2f}-{max(rs):.2f}x)"
  print(f"[{mode}] {rows} rows ({args.prompts} prompts x {args.samples}) x {args.new_tokens} new "
        f"tokens, prompts {lo}-{hi} tokens (bucket {bucket}); {e['rounds']} rounds of "
        f"{args.reps} call(s) per side")
  print(f"  smjax: {e['smjax_s'] * 1e3:8.1f} ms  {e['smjax_tokens_per_s']:9.0f} tok/s   (first "
        f"call incl. compile {e['smjax_first_call_s']:.2f} s; {e['smjax_compiled_flops'] / 1e9:.2f}"
        f" GFLOP compiled, {e['smjax_useful_flops'] / 1e9:.2f} useful)")
  print(f"  HF   : {e['hf_s'] * 1e3:8.1f} ms  {e['hf_tokens_per_s']:9.0f} tok/s   (warm-up "
        f"{e['hf_warmup_s']:.2f} s)")
  if "tunix_s" in e:
    print(f"  Tunix: {e['tunix_s'] * 1e3:8.1f} ms  {e['tunix_tokens_per_s']:9.0f} tok/s   (first "
          f"call {e['tunix_first_call_s']:.2f} s)")
  print(f"  smjax / HF: {ratio('speedup')}" + (f"; smjax / Tunix: {ratio('speedup_vs_tunix')}"
                                               if "tunix_s" in e else "")
        + f"; smjax at {e['smjax_floor_fraction']:.0%} of the matmul floor")
  if "smjax_one_loop_s" in e:
    print(f"  smjax in one loop over the whole cache: {e['smjax_one_loop_s'] * 1e3:8.1f} ms "
          f"({e['smjax_one_loop_compiled_flops'] / 1e9:.2f} GFLOP); {stages} stages are "
          f"{ratio('stages_speedup')} faster, same tokens: {e['stages_same_tokens']}")


if __name__ == "__main__":
  main()
