"""A real pretrained model learns with smjax on CPU (configs/smollm2.py): GRPO of
SmolLM2-135M-Instruct on arithmetic asked in words, then MOPD of the base from the GRPO model, each
through the short API (smjax.grpo / smjax.distill: the study's packed shared-prompt steps, its
ledger and evaluator). Writes one JSON:

  .venv/bin/python benchmarks/real_model.py                     # ~30 min on 2 cores
  .venv/bin/python benchmarks/real_model.py --config=smollm2:smoke --out /tmp/r.json

Per evaluation of each run: held-out accuracy (share of `eval_samples` samples right, over
`eval_size` held-out prompts) with a 95 % percentile-bootstrap interval over prompts, pass@k, mean
completion length and the share cut at the token cap, a few completions, and the FLOP ledger's
training FLOPs so far. The gain from the first evaluation to the last with a paired bootstrap
interval (the same prompts and sampling keys at both): whether accuracy rose beyond its interval.
Per run: the mean reward and length of its training steps, seconds per step (median, and the
first step's, which compiles; a step is its rollout, its batch and its update, evaluation apart),
training FLOPs per step (rollout, update, teacher forwards), and the fraction of the matmul floor:
the time those FLOPs take at this machine's float32 matmul rate (a 1024^3 jnp.matmul measured in
the same process) over the step's measured time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from _peer_common import cpu_name  # noqa: E402  pylint: disable=wrong-import-position


def _bootstrap(values, reps: int = 2000, seed: int = 0):
  import numpy as np  # pylint: disable=import-outside-toplevel
  v = np.asarray(values, np.float64)
  idx = np.random.default_rng(seed).integers(0, len(v), size=(reps, len(v)))
  lo, hi = np.quantile(v[idx].mean(1), [0.025, 0.975])
  return {"mean": float(v.mean()), "lo": float(lo), "hi": float(hi)}


def _point(p: dict, domain: str) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel
  k = p["samples"]
  per_prompt = np.asarray(p["correct"][domain], np.float64) / k
  return {"step": p["step"], "train_flops": p["flops"], "prompts": len(per_prompt),
          "accuracy": _bootstrap(per_prompt), "pass_at_k": p["pass_at_k"][domain],
          "length": p["length"][domain], "at_cap": p["at_cap"][domain],
          "completions": p.get("completions", {}).get(domain, [])[:2]}


def _gain(first: dict, last: dict, domain: str) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel
  a = np.asarray(first["correct"][domain], np.float64) / first["samples"]
  b = np.asarray(last["correct"][domain], np.float64) / last["samples"]
  out = _bootstrap(b - a)
  out["beyond_interval"] = out["lo"] > 0
  return out


def _matmul_rate() -> float:
  """float32 FLOP/s of a 1024^3 jnp.matmul on this machine (best of 5, after a warm-up)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  n = 1024
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = min((lambda t0: (f(a).block_until_ready(), time.perf_counter() - t0)[1])(
      time.perf_counter()) for _ in range(5))
  return 2 * n ** 3 / best


def _run_summary(result, workdir: str, domain: str, rate: float) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel
  rows = [json.loads(line) for line in open(os.path.join(workdir, "logs", "metrics.jsonl"))]
  steps = [r for r in rows if "time/step_s" in r]
  secs = [r["time/step_s"] for r in steps]
  # flops/training is the run's training FLOPs up to each step: a step's own is the difference.
  total = [0.0] + [r["flops/training"] for r in steps if r.get("flops/training")]
  flops = list(np.diff(total))
  median = float(np.median(secs[1:] or secs)) if secs else float("nan")
  per_step = float(np.median(flops)) if flops else float("nan")
  curve = [_point(p, domain) for p in result.curve]
  return {
      "curve": curve,
      "gain_first_to_last": _gain(result.curve[0], result.curve[-1], domain),
      "train": [{"step": r["step"], "reward": r.get(f"reward/{domain}", r.get("reward/mean")),
                 "length": r.get("response_length"), "seconds": r["time/step_s"]}
                for r in steps],
      "seconds_per_step": {"median": median, "first": secs[0] if secs else None},
      "train_flops_per_step": per_step,
      "matmul_floor_fraction": per_step / rate / median if secs and flops else None,
      "train_flops": result.flops,
      "ledger": result.ledger.by_phase(),
  }


def plot(data: dict, path: str) -> None:
  """Held-out accuracy against training FLOPs, GRPO and MOPD, each with its 95 % band."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(6.5, 3.8))
  for i, (run, label) in enumerate((("grpo", "GRPO"), ("mopd", "MOPD of the base from the "
                                                            "GRPO model"))):
    if run not in data:
      continue
    c = data[run]["curve"]
    x = [p["train_flops"] for p in c]
    ax.plot(x, [100 * p["accuracy"]["mean"] for p in c], "o-", color=f"C{i}", label=label)
    ax.fill_between(x, [100 * p["accuracy"]["lo"] for p in c],
                    [100 * p["accuracy"]["hi"] for p in c], color=f"C{i}", alpha=0.2)
  ax.set_xlabel("training FLOPs (rollouts, updates, teacher forwards)")
  ax.set_ylabel("held-out accuracy (%)")
  ax.set_title("SmolLM2-135M-Instruct, a + b in words, 2 CPU cores")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", default="smollm2", help="a config name or path and its argument")
  p.add_argument("--out", default=os.path.join(ROOT, "docs", "real_model.json"))
  p.add_argument("--workdir", default=os.path.join(ROOT, "runs", "real_model"))
  p.add_argument("--no-distill", action="store_true", help="GRPO only")
  p.add_argument("--plot-only", metavar="JSON", help="redraw JSON's plot (beside it, .png)")
  args = p.parse_args(argv)
  if args.plot_only:
    with open(args.plot_only) as f:
      data = json.load(f)
    plot(data, os.path.splitext(args.plot_only)[0] + ".png")
    return 0
  # pylint: disable=import-outside-toplevel
  import smjax
  from smjax import config_files
  from smjax.domains.word_arith import WordArithDomain
  from smjax.models import gguf_convert

  c = config_files.load(args.config)
  t0 = time.perf_counter()
  model = c.model or gguf_convert.smollm2_dir()
  domain = WordArithDomain(difficulty=int(c.difficulty))
  rate = _matmul_rate()
  out = {"benchmark": "real_model",
         "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + (argv or sys.argv[1:])),
         "config": c.to_dict(), "model": model, "date": time.strftime("%Y-%m-%d"),
         "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
         "matmul_flops_per_s": rate}
  grpo_dir = os.path.join(args.workdir, "grpo")
  t = time.perf_counter()
  g = smjax.grpo(model, domain, config=c.grpo, workdir=grpo_dir, seed=int(c.seed))
  out["grpo"] = _run_summary(g, grpo_dir, domain.name, rate) | {
      "wall_s": time.perf_counter() - t}
  print(f"GRPO: held-out {g.curve[0]['mean']:.3f} -> {g.curve[-1]['mean']:.3f}, "
        f"gain {out['grpo']['gain_first_to_last']}", flush=True)
  if not args.no_distill:
    mopd_dir = os.path.join(args.workdir, "mopd")
    t = time.perf_counter()
    d = smjax.distill(model, {domain.name: g}, domain, config=c.distill, workdir=mopd_dir,
                      seed=int(c.seed))
    out["mopd"] = _run_summary(d, mopd_dir, domain.name, rate) | {
        "wall_s": time.perf_counter() - t}
    print(f"MOPD: held-out {d.curve[0]['mean']:.3f} -> {d.curve[-1]['mean']:.3f}, "
          f"gain {out['mopd']['gain_first_to_last']}", flush=True)
  out["wall_s"] = time.perf_counter() - t0
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1, default=float)
  plot(out, os.path.splitext(args.out)[0] + ".png")
  print(f"wrote {args.out} and its plot")
  return 0


if __name__ == "__main__":
  sys.exit(main())
