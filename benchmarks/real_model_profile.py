"""Where a real model's GRPO step goes on CPU: SmolLM2-135M-Instruct at configs/smollm2.py's GRPO
settings, each part of a step timed, the update program and the sampler's decode loop traced.

`smjax.grpo` runs `--steps` steps (evaluating only before the first and after the last, which
are timed too). Each step's three parts are timed as the loop runs them: the rollout
(`Sampler.generate`: prefill and decode), the batch (rewards, advantages, packing) and the update
(the jitted step), each to its results' readiness; the first step compiles and is left out of the
medians. The last step's update and rollout run under `jax.profiler`: every XLA op is put in one
part of its program by its jax scope (the LM head's matmuls are named `lm_head`, the log-prob and
entropy passes over the vocabulary `token_logprobs`), and a part's time is the wall time during
which any of its ops ran on any thread (intervals merged). The matmul floor is the training FLOPs
(rollout, the ledger's own count) at this process's f32 matmul rate.

  .venv/bin/python benchmarks/real_model_profile.py         # writes docs/real_model_profile.json
  .venv/bin/python benchmarks/real_model_profile.py --config=smollm2:smoke --out /tmp/p.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
# pylint: disable=wrong-import-position
from decode_profile import LOOPS, PARTS as DECODE_PARTS, op_scopes, traced_parts  # noqa: E402
from real_model import _matmul_rate  # noqa: E402
from _peer_common import cpu_name  # noqa: E402

UPDATE_PARTS = (  # (part, test on the op's jax scope), first match wins
    ("LM head matmuls (forward and backward)", lambda op: "lm_head" in op),
    ("log-probs and entropy over the vocabulary", lambda op: "token_logprobs" in op),
    ("MLP (matmuls, SiLU)", lambda op: "/mlp/" in op),
    ("attention (projections, scores, softmax, RoPE)", lambda op: "/attn/" in op),
    ("norms, residuals, embedding", lambda op: "Transformer" in op),
    ("optimizer (AdamW, clipping), loss, advantages", lambda op: True),
)


class Instrument:
  """Times the loop's rollouts, batches, updates and evaluations as `smjax.grpo` runs them, and
  traces the update and the rollout of step `trace_step`."""

  def __init__(self, trace_step: int):
    # pylint: disable=import-outside-toplevel
    from smjax import rollout
    from smjax.train import evaluate, loop, steps
    self.trace_step, self.times = trace_step, collections.defaultdict(list)
    self.scopes, self.traces, self.decode_steps = {}, {}, 0
    self.mods = [(rollout.Sampler, "generate"), (loop, "grpo_batch"),
                 (steps.JittedStep, "__call__"), (evaluate.Evaluator, "__call__")]
    self.mods += [(rollout, name) for name in LOOPS]
    self.saved = [(m, n, getattr(m, n)) for m, n in self.mods]
    gen, batch, step, ev = (getattr(m, n) for m, n in self.mods[:4])
    loops = {name: getattr(rollout, name) for name in LOOPS}
    self.evaluating = False
    me = self

    def timed(kind, fn, *a, trace=False, lower=None, **k):
      import jax  # pylint: disable=import-outside-toplevel
      if trace:
        if lower is not None:
          me.scopes[kind] = op_scopes(lower(*a, **k).compile().as_text())
        me.traces[kind] = tempfile.mkdtemp(prefix=f"smjax-{kind}-")
        with jax.profiler.trace(me.traces[kind]):
          out = jax.block_until_ready(fn(*a, **k))
        return out
      t0 = time.perf_counter()
      out = jax.block_until_ready(fn(*a, **k))
      me.times[kind].append(time.perf_counter() - t0)
      return out

    def tracing():
      return len(me.times["update"]) == me.trace_step and not me.evaluating

    def generate(self_, *a, **k):
      if me.evaluating:
        return gen(self_, *a, **k)
      out = timed("rollout", gen, self_, *a, trace=tracing(), **k)
      if tracing():
        me.decode_steps = int(out.steps_run)
      return out

    def make_batch(*a, **k):
      return timed("batch", batch, *a, **k)

    def update(self_, state, b):
      if not tracing():
        return timed("update", step, self_, state, b)
      out = timed("update", step, self_, state, b, trace=True,
                  lower=lambda _s, st, bb: self_.fn.lower(st, bb))
      me.times["update"].append(float("nan"))   # traced: not a timing
      return out

    def evaluate_(self_, params):
      me.evaluating = True
      try:
        return timed("evaluation", ev, self_, params)
      finally:
        me.evaluating = False

    def capture(name):
      def call(*a, **k):
        if tracing() and "decode" not in me.scopes:
          me.scopes["decode"] = op_scopes(
              loops[name].lower(*a, **k).compile().as_text())
        return loops[name](*a, **k)
      return call

    self.patches = [generate, make_batch, update, evaluate_] + [capture(n) for n in LOOPS]

  def __enter__(self):
    for (m, n), fn in zip(self.mods, self.patches):
      setattr(m, n, fn)
    return self

  def __exit__(self, *exc):
    for m, n, fn in self.saved:
      setattr(m, n, fn)


def _parts_table(ms: dict, total_per: float) -> list[dict]:
  total = sum(ms.values())
  return [dict(part=k, ms=v / total_per, share=v / total) for k, v in ms.items()]


def profile(model, domain, settings, *, steps: int, rate: float) -> dict:
  """`steps` GRPO steps of `smjax.grpo(model, domain, config=settings)` (its steps, evaluation
  and logging settings replaced), timed and traced (module docstring): the measured fields of
  the benchmark's JSON. `rate`: the matmul floor's FLOP/s."""
  import smjax  # pylint: disable=import-outside-toplevel
  s = settings.copy_and_resolve_references()
  s.update(dict(steps=steps, eval_every=0, checkpoint_every=0, log_every=1, progress=False))
  with Instrument(trace_step=steps - 1) as ins, tempfile.TemporaryDirectory() as wd:
    t0 = time.perf_counter()
    result = smjax.grpo(model, domain, config=s, workdir=wd, seed=int(s.seed))
    wall = time.perf_counter() - t0
    with open(os.path.join(wd, "logs", "metrics.jsonl")) as f:
      loop_s = [r["time/step_s"] for r in map(json.loads, f) if "time/step_s" in r]
  # Steps 1 .. steps - 2: the first compiles, the last is traced.
  timed = {k: v[1:steps - 1] for k, v in ins.times.items() if k != "evaluation"}
  med = {k: statistics.median(v) for k, v in timed.items()}
  ledger = result.ledger.by_phase()
  per_step = lambda *phases: sum(ledger.get(ph, 0) for ph in phases) / steps  # noqa: E731
  update = traced_parts(ins.traces["update"], ins.scopes["update"], UPDATE_PARTS)
  decode = traced_parts(ins.traces["rollout"], ins.scopes["decode"], DECODE_PARTS,
                        keep=lambda scope: "/while/body/" in scope)
  for d in ins.traces.values():
    shutil.rmtree(d, ignore_errors=True)
  return dict(
      config=s.to_dict(), wall_s=wall, steps_timed=len(timed["update"]),
      # The loop's own step time (rollout, rewards, batch, update), over the same steps.
      step_parts_s=med, step_s=statistics.median(loop_s[1:steps - 1]),
      step_parts_each_s=timed, steps_each_s=loop_s[1:steps - 1],
      evaluation_s=ins.times["evaluation"], evaluation_samples=s.eval_size * s.eval_samples,
      update_flops=per_step("train/policy"),
      rollout_flops=per_step("rollout/prefill", "rollout/decode"),
      update_floor_fraction=per_step("train/policy") / med["update"] / rate,
      rollout_floor_fraction=per_step("rollout/prefill", "rollout/decode") / med["rollout"] / rate,
      update_parts=_parts_table(update, 1.0), decode_steps=ins.decode_steps,
      decode_parts=_parts_table(decode, max(ins.decode_steps, 1)))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", default="smollm2", help="a config name or path and its argument")
  p.add_argument("--steps", type=int, default=5, help="GRPO steps (the first compiles, the "
                 "last is traced)")
  p.add_argument("--out", default=os.path.join(ROOT, "docs", "real_model_profile.json"))
  args = p.parse_args(argv)
  if args.steps < 3:
    p.error(f"--steps={args.steps}: at least 3 (one compiling, one timed, one traced)")
  # pylint: disable=import-outside-toplevel
  import jax
  from smjax import config_files
  from smjax.domains.word_arith import WordArithDomain
  from smjax.models import gguf_convert

  c = config_files.load(args.config)
  model = c.model or gguf_convert.smollm2_dir()
  rate = _matmul_rate()
  settings = c.grpo.copy_and_resolve_references()
  settings.seed = int(c.seed)
  measured = profile(model, WordArithDomain(difficulty=int(c.difficulty)), settings,
                     steps=args.steps, rate=rate)
  out = dict(
      benchmark="real_model_profile",
      command=" ".join([os.path.relpath(sys.argv[0], ROOT)] + (argv or sys.argv[1:])),
      model=model, cpu=cpu_name(), threads=len(os.sched_getaffinity(0)), jax=jax.__version__,
      date=time.strftime("%Y-%m-%d"), matmul_flops_per_s=rate) | measured
  med = out["step_parts_s"]
  print(f"step {out['step_s']:.2f} s: " + ", ".join(f"{k} {v:.3f} s" for k, v in med.items())
        + f"; update at {out['update_floor_fraction']:.0%} of the matmul floor, rollout at "
        f"{out['rollout_floor_fraction']:.0%} ({rate / 1e9:.0f} GFLOP/s)")
  for name in ("update_parts", "decode_parts"):
    for r in out[name]:
      print(f"  {name[:-6]:7s} {r['ms']:9.2f} ms {100 * r['share']:4.0f} %  {r['part']}")
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1, default=float)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
