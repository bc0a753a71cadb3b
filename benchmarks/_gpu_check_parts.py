"""Helpers of benchmarks/gpu_check.py: timing and memory of compiled programs, kernel errors
against a reference, a synthetic rollout of the sampler's layout, the bf16 matmul peak, and the
goals and table of the results. jax is imported inside the functions: gpu_check sets the platform
and allocator variables before jax loads.
"""

from __future__ import annotations

import math
import statistics
import time

MiB = 2.0 ** 20

# --------------------------------------------------------------------------- measurement

def device_peak():
  """The device's peak bytes in use so far (process-wide), or None where jax does not say (CPU)."""
  import jax  # pylint: disable=import-outside-toplevel
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def measure(fn, args, reps, *, flops=False):
  """(record, outputs of the warm-up call): jit(fn) compiled for `args`, its memory analysis (and
  with `flops`, XLA's FLOP count, smjax.flops), and the median time of `reps` runs after it."""
  import jax  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  out = jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  rec = dict(compile_s=compile_s, median_s=statistics.median(times), runs_s=times,
             temp_bytes=int(mem.temp_size_in_bytes), argument_bytes=int(mem.argument_size_in_bytes),
             output_bytes=int(mem.output_size_in_bytes), device_peak_bytes=device_peak())
  if flops:
    from smjax.flops import executable_flops  # pylint: disable=import-outside-toplevel
    rec["flops"] = executable_flops(compiled)[0]
  return rec, out


def max_err(x, ref):
  """(max |x - ref|, that over max |ref|), in float32."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  x, ref = jnp.asarray(x, jnp.float32), jnp.asarray(ref, jnp.float32)
  err, scale = float(jnp.max(jnp.abs(x - ref))), float(jnp.max(jnp.abs(ref)))
  return dict(max_abs=err, max_rel=err / scale if scale else err)


def compare(impls, inputs, reps, reference):
  """Forward and value_and_grad (w.r.t. the first input) of each `impls` loss; errors against
  `reference`'s outputs. impls: {name: fn(*inputs) -> per-token or scalar loss}."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  rows, outs = {}, {}
  for name, fn in impls.items():
    fwd, o_fwd = measure(fn, inputs, reps)
    grad, (_, o_grad) = measure(jax.value_and_grad(lambda *x, f=fn: jnp.sum(f(*x))), inputs, reps)
    rows[name], outs[name] = dict(fwd=fwd, grad=grad), (o_fwd, o_grad)
  ref_fwd, ref_grad = outs[reference]
  for name in impls:
    if name != reference:
      rows[name]["err_fwd"] = max_err(outs[name][0], ref_fwd)
      rows[name]["err_grad"] = max_err(outs[name][1], ref_grad)
  return rows


def synthetic_rollout(cfg, *, prompts, group_size, prompt_len, completion_len, seed=0):
  """A RolloutResult of the sampler's layout: random prompts (lengths P/2..P, left-padded, each
  repeated G times) and completions (lengths C/2..C), behaviour log-probs near a random model's."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from smjax.rollout import RolloutResult  # pylint: disable=import-outside-toplevel
  rng = np.random.RandomState(seed)
  G, P, C, V = group_size, prompt_len, completion_len, cfg.vocab_size
  rows = prompts * G
  p_len = rng.randint(max(1, P // 2), P + 1, prompts)
  prompt = np.zeros((prompts, P), np.int32)
  for i, n in enumerate(p_len):
    prompt[i, P - n:] = rng.randint(3, V, n)
  lengths = rng.randint(max(1, C // 2), C + 1, rows)
  mask = np.arange(C)[None] < lengths[:, None]
  completion = np.where(mask, rng.randint(3, V, (rows, C)), 0).astype(np.int32)
  logp = np.where(mask, -math.log(V) + 0.1 * rng.randn(rows, C), 0.0).astype(np.float32)
  rep = lambda x: jnp.asarray(np.repeat(x, G, axis=0))  # noqa: E731
  return RolloutResult(
      prompt_BP=rep(prompt), prompt_mask_BP=rep(prompt != 0), completion_BC=jnp.asarray(completion),
      completion_mask_BC=jnp.asarray(mask), lengths_B=jnp.asarray(lengths, jnp.int32),
      logprobs_BC=jnp.asarray(logp), program_calls=[], steps_run=C - 1, num_prompts=prompts,
      num_samples=G), p_len, lengths


def matmul_peak(n, reps):
  """A bf16 [n, n] @ [n, n]: XLA's FLOP count of it over its median time."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  x = jax.random.normal(jax.random.key(n), (2, n, n), jnp.float32).astype(jnp.bfloat16)
  rec, _ = measure(jnp.matmul, (x[0], x[1]), reps, flops=True)
  return dict(n=n, flops_per_s=rec["flops"] / rec["median_s"], **rec)


# --------------------------------------------------------------------------- goals and table

def goals(results, applicable):
  """Issue 27 step 4's goals: {name: {target, value, met}}; met is None where not applicable
  (CPU, smoke) or where the section gave no figure."""
  sec = results["sections"]
  out = {}

  def goal(name, target, get):
    try:
      value, met = get()
    except (KeyError, TypeError):
      value, met = None, None
    out[name] = dict(target=target, value=value, met=bool(met) if applicable and met is not None
                     else None, applicable=applicable)

  rkl = lambda: sec["kernels"]["reverse_kl"]  # noqa: E731
  goal("reverse_kl_at_least_as_fast_as_chunked_xla",
       "Pallas loss+grad time <= the chunked XLA path's at V = 151,936 (bf16 and fp32)",
       lambda: ({d: r["xla"]["grad"]["median_s"] / r["pallas"]["grad"]["median_s"]
                 for d, r in rkl().items()},
                all(r["pallas"]["grad"]["median_s"] <= r["xla"]["grad"]["median_s"]
                    for r in rkl().values())))
  goal("reverse_kl_8x_less_temp_memory_than_naive",
       "naive loss+grad temp bytes / Pallas's >= 8 (compiled memory_analysis)",
       lambda: ({d: r["naive"]["grad"]["temp_bytes"] / max(r["pallas"]["grad"]["temp_bytes"], 1)
                 for d, r in rkl().items()},
                all(r["naive"]["grad"]["temp_bytes"] >= 8 * r["pallas"]["grad"]["temp_bytes"]
                    for r in rkl().values())))
  goal("grpo_step_mfu_40pct_bf16", "compiled FLOP/s >= 40 % of the spec-sheet bf16 peak",
       lambda: ({k: sec["step"][k] for k in ("mfu_vs_spec", "mfu_vs_matmul", "useful_mfu_vs_spec")},
                sec["step"]["mfu_vs_spec"] >= 0.4))
  goal("demo_under_2_min", "the demo study finishes (rc 0) in < 120 s",
       lambda: (sec["demo"]["wall_s"], sec["demo"]["returncode"] == 0
                and sec["demo"]["wall_s"] < 120 and not sec["demo"]["stand_in"]))
  return out


def table(results):
  lines, sec = [f"gpu_check on {results['device']} (jax {results['jax']}, smoke="
                f"{results['smoke']})"], results["sections"]
  for name, rec in sec.items():
    if "error" in rec or "skipped" in rec:
      lines.append(f"  {name:8s} {'ERROR ' + rec['error'] if 'error' in rec else rec['skipped']}")
      continue
    if name == "kernels":
      for kname, rows in [(f"reverse_kl {d}", r) for d, r in rec["reverse_kl"].items()] + [
          ("group_advantage", rec["group_advantage"])]:
        ref = "naive" if "naive" in rows else "reference"
        p, x, n = rows["pallas"], rows["xla"], rows[ref]
        lines.append(
            f"  kernels  {kname:16s} grad ms pallas {p['grad']['median_s'] * 1e3:8.2f} xla "
            f"{x['grad']['median_s'] * 1e3:8.2f} {ref} {n['grad']['median_s'] * 1e3:8.2f} | temp "
            f"MiB {p['grad']['temp_bytes'] / MiB:8.1f} vs {n['grad']['temp_bytes'] / MiB:8.1f} | "
            f"err fwd {p['err_fwd']['max_abs']:.1e} grad {p['err_grad']['max_abs']:.1e}")
    elif name == "step":
      lines.append(f"  step     {rec['rows']} rows, {rec['real_tokens']} tokens: "
                   f"{rec['step_s'] * 1e3:.1f} ms/step, {rec['compiled_flops'] / 1e12:.2f} TFLOP, "
                   f"{rec['flops_per_s'] / 1e12:.1f} TFLOP/s = {100 * rec['mfu_vs_spec']:.1f}% of "
                   f"{rec['peak_tflops']:.0f}, {100 * rec['mfu_vs_matmul']:.1f}% of the matmul's "
                   f"{rec['matmul']['flops_per_s'] / 1e12:.1f} (compile {rec['compile_s']:.0f} s)")
    elif name == "sampler":
      lines.append(f"  sampler  {rec['rows']} rows x {rec['new_tokens']} new tokens: "
                   f"{rec['median_s']:.2f} s, {rec['tokens_per_s']:.0f} tokens/s (first call "
                   f"{rec['first_call_s']:.1f} s)")
    elif name == "real_model":
      acc = " -> ".join(f"{100 * p['accuracy']['mean']:.1f}%" for p in rec["curve"])
      lines.append(f"  real_model {rec['settings']['steps']} GRPO steps, "
                   f"{rec['seconds_per_step']['median']:.2f} s/step (first "
                   f"{rec['seconds_per_step']['first']:.1f} s), MFU {100 * rec['mfu_vs_spec']:.1f}%"
                   f" of the spec peak; held-out {acc}")
    elif name == "demo":
      lines.append(f"  demo     {'stand-in ' if rec['stand_in'] else ''}wall {rec['wall_s']:.1f} s, "
                   f"rc {rec['returncode']}{' (timed out)' if rec['timed_out'] else ''}; "
                   f"verdicts: {rec.get('verdicts')}")
  for name, g in results.get("goals", {}).items():
    v = g["value"]
    v = {k: round(x, 3) for k, x in v.items()} if isinstance(v, dict) else v
    lines.append(f"  goal {name}: met={g['met']} value={v}")
  return "\n".join(lines)
