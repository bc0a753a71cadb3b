"""Does the demo study tell its arms apart on every seed? `make demo`'s config run once per seed,
each as its own process into its own workdir, and the per-seed verdicts written to JSON.

  .venv/bin/python benchmarks/study_seeds.py                   # seeds 0-4 -> docs/study_seeds.json
  .venv/bin/python benchmarks/study_seeds.py --seeds 0 --workdir /tmp/seeds --out /tmp/s.json
  .venv/bin/python benchmarks/study_seeds.py --base-only --jobs 2 \
      --config configs/study.py:four_domain,full --workdir runs/four_band \
      --out docs/four_domain_band.json

Other `--config.<field>=<value>` arguments go to every seed's run. `--base-only` runs the base
phase alone (band.check off, so that a miss is recorded, not fatal) and records per seed its
band measurement and what it misses of the config's band: is the base recipe calibrated on
every seed? `--jobs N` runs N seeds at once.

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
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from smjax.study.run import band_problems  # noqa: E402  pylint: disable=wrong-import-position
from _peer_common import cpu_name  # noqa: E402  pylint: disable=wrong-import-position


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


def _wait_any(procs: dict) -> int:
  """The key of the first of `procs` (key -> Popen) to exit."""
  while True:
    for key, proc in procs.items():
      if proc.poll() is not None:
        return key
    time.sleep(1.0)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
  ap.add_argument("--config", default="configs/study.py:two_domain,demo")
  ap.add_argument("--workdir", default="runs/study_seeds")
  ap.add_argument("--out", default="docs/study_seeds.json")
  ap.add_argument("--base-only", action="store_true",
                  help="run the base phase alone and record its band measurement per seed")
  ap.add_argument("--jobs", type=int, default=1, help="seeds run at once (processes)")
  args, overrides = ap.parse_known_args()
  if args.jobs < 1:
    ap.error(f"--jobs={args.jobs} must be >= 1")
  for o in overrides:
    if not o.startswith("--config."):
      ap.error(f"unrecognized argument {o!r} (config overrides, --config.<field>=<value>, are "
               "passed to every seed's run)")
  extra = ["--config.phases=('base',)", "--config.band.check=False"] if args.base_only else []
  extra += overrides
  os.makedirs(args.workdir, exist_ok=True)
  procs, running = {}, {}
  for i, seed in enumerate(args.seeds):   # `jobs` at a time, in order; stderr to a file each
    wd = os.path.join(args.workdir, f"seed{seed}")
    err_path = f"{wd}.stderr"
    with open(err_path, "w") as err_file:
      running[seed] = (wd, err_path, time.perf_counter(), subprocess.Popen(
          [sys.executable, "-m", "smjax.main", f"--config={args.config}",
           f"--config.seeds=({seed},)", "--config.progress=False", *extra, f"--workdir={wd}"],
          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err_file))
    while len(running) >= args.jobs or (i == len(args.seeds) - 1 and running):
      done = _wait_any({s: r[3] for s, r in running.items()})
      wd_done, err_done, t0, proc = running.pop(done)
      with open(err_done) as f:
        procs[done] = (wd_done, time.perf_counter() - t0, proc.returncode, f.read())
  rows = []
  for seed in args.seeds:
    wd, wall, rc, err = procs[seed]
    if rc:
      rows.append({"seed": seed, "error": err.strip().splitlines()[-1:], "wall_s": wall})
      print(f"seed {seed}: failed: {err.strip().splitlines()[-1:]}")
      continue
    seed_dir = os.path.join(wd, f"seed_{seed}")
    band = json.load(open(os.path.join(seed_dir, "base", "result.json")))["extra"]["band"]
    if args.base_only:
      band_cfg = json.load(open(os.path.join(wd, "config.json")))["band"]
      misses = band_problems(band, band_cfg)
      rows.append({"seed": seed, "wall_s": round(wall, 1), "band": band, "band_config": band_cfg,
                   "misses": misses})
      print(f"seed {seed}: {wall:.0f} s, band {band['accuracy']}, "
            f"{'in the band' if not misses else 'misses: ' + '; '.join(misses)}")
      continue
    report = json.load(open(os.path.join(wd, "report", "report.json")))
    domains = list(report["arms"]["base"]["accuracy"])
    row = {"seed": seed, "wall_s": round(wall, 1), "verdicts": report["verdicts"],
           "base": {d: report["arms"]["base"]["accuracy"][d]["mean"] for d in domains},
           "band": band, "arms": {}}
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
         "config": args.config, "base_only": args.base_only,
         "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
         "date": time.strftime("%Y-%m-%d"), "seeds": rows}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(f"wrote {args.out}")
  return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
