"""Readers of a finished study run's files, shared by the end-to-end study tests
(test_experiment.py, test_study_hf.py), and the compilation cache their runs share."""

import json
import os


def phase_result(wd, phase: str, seed: int = 0) -> dict:
  """`<wd>/seed_<seed>/<phase>/result.json` (ledger, curve, extras, config)."""
  with open(os.path.join(wd, f"seed_{seed}", phase, "result.json")) as f:
    return json.load(f)


def training_flops(ledger: dict) -> dict:
  """The ledger's phases charged to training (rollout/* and train/*), by phase."""
  return {p: v for p, v in ledger["flops"].items() if p.split("/")[0] in ("rollout", "train")}


def study_compilation_cache(tmp_path_factory):
  """One persistent compilation cache for the small studies that several modules run
  (test_experiment's MINI, test_remote_workdir's base and joint GRPO of the same config,
  test_cli's quick base and the notebooks' quickstart study, which sample as MINI does): a module
  that runs after another finds its programs compiled. Under pytest-xdist every worker's base
  temp directory has the session's as its parent, so the workers share it."""
  base = tmp_path_factory.getbasetemp()
  path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "study_jax_cache"
  path.mkdir(exist_ok=True)
  return path
