"""Does the demo study tell its arms apart on every seed? `make demo`'s config run once per seed,
each as its own process into its own workdir, and the per-seed verdicts written to JSON.

  .venv/bin/python benchmarks/study_seeds.py                   # seeds 0-4 -> docs/study_seeds.json
  .venv/bin/python benchmarks/study_seeds.py --seeds 0 --workdir /tmp/seeds --out /tmp/s.json

For each seed: the base's sampled accuracy and band measurement, each trained arm's final
accuracy per domain with its 95% interval (bootstrap over held-out prompts), whether joint GRPO
and each expert raised their domains' accuracy by more than the interval (the lower bound of the
gain above 0: "learns"), the verdict lines, and the wall time. A finished seed's workdir is
reused (the study resumes), so a rerun only reports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gain_interval(report: dict, arm: str, domain: str, seed_dir: str) -> dict:
  """The arm's final accuracy on `domain` minus the base's, with a paired bootstrap interval over
  the held-out prompts (both are evaluated on the same prompts with the same sampling keys)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  arms = {a["arm"]: a for a in json.load(open(os.path.join(seed_dir, "arms.json")))["arms"]}
  k_arm, k_base = arms[arm]["curve"][-1], arms["base"]["curve"][-1]
  a = np.asarray(k_arm["correct"][domain], np.float64) / k_arm["samples"]
  b = np.asarray(k_base["correct"][domain], np.float64) / k_base["samples"]
  rng = np.random.default_rng(0)
  idx = rng.integers(0, len(a), size=(2000, len(a)))
  reps = (a[idx] - b[idx]).mean(1)
  lo, hi = np.quantile(reps, [0.025, 0.975])
  del report
  return {"gain": float(a.mean() - b.mean()), "lo": float(lo), "hi": float(hi),
          "learns": bool(lo > 0)}


def _cpu() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.machine()


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
  ap.add_argument("--config", default="configs/study.py:two_domain,demo")
  ap.add_argument("--workdir", default="runs/study_seeds")
  ap.add_argument("--out", default="docs/study_seeds.json")
  args = ap.parse_args()
  rows = []
  for seed in args.seeds:
    wd = os.path.join(args.workdir, f"seed{seed}")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "smjax.main", f"--config={args.config}",
         f"--config.seeds=({seed},)", "--config.progress=False", f"--workdir={wd}"],
        cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode:
      rows.append({"seed": seed, "error": proc.stderr.strip().splitlines()[-1:],
                   "wall_s": wall})
      print(f"seed {seed}: failed: {proc.stderr.strip().splitlines()[-1:]}")
      continue
    report = json.load(open(os.path.join(wd, "report", "report.json")))
    seed_dir = os.path.join(wd, f"seed_{seed}")
    domains = list(report["arms"]["base"]["accuracy"])
    row = {"seed": seed, "wall_s": round(wall, 1), "verdicts": report["verdicts"],
           "base": {d: report["arms"]["base"]["accuracy"][d]["mean"] for d in domains},
           "band": json.load(open(os.path.join(seed_dir, "base", "result.json")))["extra"]["band"],
           "arms": {}}
    for arm, a in report["arms"].items():
      if arm == "base" or a["group"] != "main":
        continue
      own = domains if arm in ("joint_grpo", "split_merge") else [arm.removeprefix("expert_")]
      row["arms"][arm] = {
          "accuracy": {d: {k: a["accuracy"][d][k] for k in ("mean", "lo", "hi")} for d in domains},
          "gain_over_base": {d: gain_interval(report, arm, d, seed_dir) for d in own}}
    rows.append(row)
    learns = {arm: all(g["learns"] for g in v["gain_over_base"].values())
              for arm, v in row["arms"].items()}
    print(f"seed {seed}: {wall:.0f} s, base {row['base']}, learns beyond the interval: {learns}")
  out = {"command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
         "config": args.config, "machine": {"cpu": _cpu(), "cores": os.cpu_count()},
         "date": time.strftime("%Y-%m-%d"), "seeds": rows}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(f"wrote {args.out}")
  return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
