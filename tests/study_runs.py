"""Readers of a finished study run's files, shared by the end-to-end study tests
(test_experiment.py, test_study_hf.py)."""

import json
import os


def phase_result(wd, phase: str, seed: int = 0) -> dict:
  """`<wd>/seed_<seed>/<phase>/result.json` (ledger, curve, extras, config)."""
  with open(os.path.join(wd, f"seed_{seed}", phase, "result.json")) as f:
    return json.load(f)


def training_flops(ledger: dict) -> dict:
  """The ledger's phases charged to training (rollout/* and train/*), by phase."""
  return {p: v for p, v in ledger["flops"].items() if p.split("/")[0] in ("rollout", "train")}
