"""Benchmark result JSON as markdown for the docs' generated blocks (`python -m smjax.study.render
--update-docs`): `benchmarks/rollout_vs_hf.py` (the sampler against HF `generate` and Tunix, with
its rounds and goals), `benchmarks/decode_profile.py` (where a decode step's time goes) and the
real model's (`benchmarks/real_model.py`, `benchmarks/real_model_profile.py`)."""

from __future__ import annotations


def _matmuls_alone(data: dict) -> list[str]:
  """decode_profile's matmuls timed alone, as a sentence and a table (none in older results)."""
  if "matmuls_alone" not in data:
    return []
  peak = data["matmul_flops_per_s"]
  rows = [f"| {m['matmul']} | {' x '.join(map(str, m['shape']))} | {m['per_step']} | "
          f"{m['ms']:.3f} | {m['flops_per_s'] / 1e9:.0f} ({100 * m['flops_per_s'] / peak:.0f} %) |"
          for m in data["matmuls_alone"]]
  return ["", f"The step's matmuls, each jitted alone at the step's shapes (best of 50 calls, "
              f"{1e3 * data['dispatch_ms']:.0f} µs of dispatch taken off): "
              f"{data['matmuls_alone_ms_per_step']:.2f} ms per step; a step that took only that "
              f"would be at {100 * data['matmuls_alone_floor_fraction']:.0f} % of the matmul "
              "floor.", "", "| matmul | M x K x N | per step | ms alone | GFLOP/s (of the "
              "floor's rate) |", "|---|---|---|---|---|"] + rows


def _pct_ci(a: dict) -> str:
  return f"{100 * a['mean']:.1f} % [{100 * a['lo']:.1f}, {100 * a['hi']:.1f}]"


def real_model_markdown(data: dict) -> str:
  """`benchmarks/real_model.py`'s JSON: per run (GRPO, then MOPD) its held-out curve as a table,
  the gain from its first evaluation to its last with the paired interval, and its step's speed."""
  m = data["machine"]
  lines = [f"`{data['command']}` ({m['cpu']}, {m['cores']} cores, {data['date']}; wall time "
           f"{data['wall_s'] / 60:.0f} min; matmul floor: the FLOPs at this process's f32 matmul "
           f"rate, {data['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s)"]
  names = {"grpo": "GRPO", "mopd": "MOPD of the base from the GRPO model"}
  for run in ("grpo", "mopd"):
    if run not in data:
      continue
    r, s = data[run], data["config"]["grpo" if run == "grpo" else "distill"]
    g = r["gain_first_to_last"]
    lines += ["", f"**{names[run]}** ({s['steps']} steps of {s['prompts_per_step']} prompts x "
              f"{s['samples_per_prompt']} samples, learning rate {s['learning_rate']:g}, "
              f"temperature {s['temperature']:g}, at most {s['max_new_tokens']} new tokens; "
              f"held-out: {r['curve'][0]['prompts']} prompts x {s['eval_samples']} samples):",
              "",
              "| step | training FLOPs | held-out accuracy [95 %] | pass@k | length (tokens) | "
              "cut at the cap |", "|---|---|---|---|---|---|"]
    lines += [f"| {p['step']} | {p['train_flops']:.3g} | {_pct_ci(p['accuracy'])} | "
              f"{100 * p['pass_at_k']:.0f} % | {p['length']:.1f} | {100 * p['at_cap']:.0f} % |"
              for p in r["curve"]]
    sps = r["seconds_per_step"]
    lines += ["", f"Gain from the first evaluation to the last: {100 * g['mean']:+.1f} points "
              f"[{100 * g['lo']:+.1f}, {100 * g['hi']:+.1f}] (paired bootstrap over the held-out "
              f"prompts: {'beyond' if g['beyond_interval'] else 'not beyond'} its interval). "
              f"A step (rollout, batch, update) took {sps['median']:.1f} s (median; the first, "
              f"compiling, {sps['first']:.0f} s) for {r['train_flops_per_step']:.3g} training "
              f"FLOPs: {100 * r['matmul_floor_fraction']:.0f} % of the matmul floor."]
  return "\n".join(lines) + "\n"


def real_model_profile_markdown(data: dict) -> str:
  """`benchmarks/real_model_profile.py`'s JSON: a GRPO step's parts in seconds, then where the
  update's and a decode step's op time went, part by part."""
  c, parts = data["config"], data["step_parts_s"]
  ev = data["evaluation_s"]
  lines = [f"`{data['command']}` ({data['cpu']}, {data['threads']} threads, jax {data['jax']}, "
           f"{data['date']}; matmul floor: the FLOPs at this process's f32 matmul rate, "
           f"{data['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s)", "",
           f"A GRPO step of {c['prompts_per_step']} prompts x {c['samples_per_prompt']} samples "
           f"(at most {c['max_new_tokens']} new tokens) took {data['step_s']:.2f} s (median of "
           f"{data['steps_timed']} steps after the compiling one): the rollout "
           f"{parts['rollout']:.2f} s ({100 * data['rollout_floor_fraction']:.0f} % of the matmul "
           f"floor), the batch {1e3 * parts['batch']:.0f} ms, the update {parts['update']:.2f} s "
           f"({100 * data['update_floor_fraction']:.0f} % of the floor), the rest (rewards, "
           f"detokenising) {data['step_s'] - sum(parts.values()):.2f} s. An evaluation "
           f"({data['evaluation_samples']} samples) took {min(ev):.0f} s.", "",
           "| program | part | ms | share of its op time |", "|---|---|---|---|"]
  for key, name in (("update_parts", "update (per step)"),
                    ("decode_parts",
                     f"decode loop (per decode step, {data['decode_steps']} steps)")):
    lines += [f"| {name} | {r['part']} | {r['ms']:.1f} | {100 * r['share']:.0f} % |"
              for r in data[key]]
  return "\n".join(lines) + "\n"


def bench_markdown(data: dict) -> str:
  """A benchmark result JSON (`benchmarks/rollout_vs_hf.py`, `benchmarks/decode_profile.py`,
  `benchmarks/real_model.py`, `benchmarks/real_model_profile.py`) as markdown: the command and
  machine, then its table."""
  if data["benchmark"] == "real_model":
    return real_model_markdown(data)
  if data["benchmark"] == "real_model_profile":
    return real_model_profile_markdown(data)
  head = (f"`{data['command']}` ({data['cpu']}, {data['threads']} threads, jax {data['jax']}, "
          f"{data['date']}; matmul floor: the useful FLOPs at this process's f32 matmul rate, "
          f"{data['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s)")
  if data["benchmark"] == "decode_profile":
    rows = [f"| {c['category']} | {c['ms_per_step']:.3f} | {100 * c['share']:.0f} % |"
            for c in data["categories"]]
    floor = 100 * data["floor_fraction"]
    stages = data.get("decode_stages", 1)
    staged = f" in {stages} decode stages" if stages > 1 else ""
    model = f"{data['model']}, " if data.get("model", "small") != "small" else ""
    return "\n".join([head, "", f"{model}{data['rows']} rows x {data['new_tokens']} new tokens"
                      f"{staged}, "
                      f"{data['ms_per_step']:.2f} ms per decode step ({floor:.0f} % of the matmul "
                      "floor); the wall time in which each part's ops ran, per step (parts run "
                      "side by side on the threads, so they add up to more than the step):", "",
                      "| part of the step | ms per step | share |", "|---|---|---|"] + rows
                     + _matmuls_alone(data)) + "\n"
  tunix = any(e.get("tunix_s") for r in data["sizes"].values() for e in r["modes"].values())
  staged = any(e.get("smjax_one_loop_s") for r in data["sizes"].values()
               for e in r["modes"].values())
  rows = []
  for size, r in data["sizes"].items():
    for mode, e in r["modes"].items():
      row = (f"| {size} ({r['params'] / 1e6:.1f}M) | {mode} | "
             f"{e['smjax_tokens_per_s']:,.0f} | {e['hf_tokens_per_s']:,.0f} | "
             f"{_ratio(e, 'speedup')} | {100 * e['smjax_floor_fraction']:.0f} % | "
             f"{100 * e['hf_floor_fraction']:.0f} % |")
      if tunix and e.get("tunix_s"):
        row += (f" {e['tunix_tokens_per_s']:,.0f} | {_ratio(e, 'speedup_vs_tunix')} | "
                f"{100 * e['tunix_floor_fraction']:.0f} % |")
      elif tunix:
        row += " - | - | - |"
      if staged and e.get("smjax_one_loop_s"):
        row += (f" {e['tokens'] / e['smjax_one_loop_s']:,.0f} | {r['decode_stages']} stages "
                f"{_ratio(e, 'stages_speedup')} |")
      elif staged:
        row += " - | - |"
      rows.append(row)
  r0 = next(iter(data["sizes"].values()))
  c = data["config"]
  columns = ("| model | mode | smjax tok/s | HF tok/s | smjax / HF | smjax, of floor | "
             "HF, of floor |" + (" Tunix tok/s | smjax / Tunix | Tunix, of floor |"
                                 if tunix else "") +
             (" smjax in one loop, tok/s | decode stages vs one loop |" if staged else ""))
  e0 = next(iter(r0["modes"].values()))
  rounds = (f"; {e0['rounds']} rounds of {c['reps']} call(s) per side in rotating order, each "
            "ratio the median over rounds of the round's ratio (lowest-highest round in "
            "brackets)" if "rounds" in e0 else "")
  return "\n".join([head, "", f"{r0['rows']} rows ({c['prompts']} prompts x {c['samples']} "
                    f"samples) x {c['new_tokens']} new tokens, prompts {c['prompt_len'][0]}-"
                    f"{c['prompt_len'][1]} tokens, EOS off on every side{rounds}:", "",
                    columns, "|---" * columns.count(" | ") + "|---|"] + rows
                   + _goals(data)) + "\n"


def _ratio(e: dict, key: str) -> str:
  """A ratio in bold, with its lowest and highest round when the run had rounds."""
  rs = e.get(f"{key}_rounds")
  return f"**{e[key]:.2f}x**" + (f" [{min(rs):.2f}, {max(rs):.2f}]" if rs else "")


def _goals(data: dict) -> list[str]:
  """The sampler's goals at the GRPO-sized batch, one line each (none in older results)."""
  if not data.get("goals"):
    return []
  fmt = lambda g, v: f"{100 * v:.0f} %" if g["target"] < 1 else f"{v:.2f}x"
  return ["", "Goals (sampled, GRPO-sized batch; met or missed by the median over rounds):", ""] + [
      f"- {g['size']}: {g['goal']}: **{'met' if g['met'] else 'missed'}**, {fmt(g, g['value'])} "
      f"(rounds {fmt(g, g['low'])} to {fmt(g, g['high'])}; met in {g['rounds_met']} of "
      f"{g['rounds']})" for g in data["goals"]]
