"""notebooks/*.ipynb run top to bottom on the CPU at their small sizes, in a kernel of this Python.

Each notebook is executed once (one module fixture, two kernels at a time) with nbclient in the
"python3" kernel, which jupyter_client starts with this interpreter (the kernelspec's argv[0]
"python" is replaced by sys.executable); every notebook prints `python: <sys.prefix>`, which must
be this environment's. SMJAX_NOTEBOOK_SMALL=1 selects the small sizes; work directories go under
pytest's tmp dir.

Beyond "no cell raised", each test checks key outputs: the study's table, report files and the plot
shown inline (quickstart); GRPO advantages recomputed here with numpy from the rewards the notebook
printed, on-policy ratios of 1, finite losses, non-negative KLs and a FLOP ledger with every
training phase (grpo_and_opd); the kernels' differences from their jnp references (computed in
the notebook) within float32 tolerances, and one benchmark row per kernel and phase (kernels).
The kernels' own tests against independent numpy references are test_*_kernel.py.
"""

import asyncio
import base64
import json
import os
import re
import sys

import nbformat
import numpy as np
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from conftest import cache_env
from study_runs import study_compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = ("quickstart", "grpo_and_opd", "kernels")
CELL_TIMEOUT_S = 600  # a hung cell fails the test instead of the CI job
# Kernels run side by side: a notebook's time is mostly XLA compiling, on one core, so two
# kernels use the two cores of a CI machine.
PARALLEL = 2


def _path(name):
  return os.path.join(ROOT, "notebooks", f"{name}.ipynb")


class Executed:
  """A notebook after execution: its cells, all stream text, and its images."""

  def __init__(self, nb, workdir):
    self.nb, self.workdir = nb, workdir
    self.text = ""
    self.images = []
    for cell in nb.cells:
      for out in cell.get("outputs", []):
        if out.output_type == "stream":
          self.text += out.text
        elif out.output_type in ("display_data", "execute_result"):
          self.text += out.data.get("text/plain", "") + "\n"
          if "image/png" in out.data:
            self.images.append(base64.b64decode(out.data["image/png"]))

  def line(self, prefix):
    lines = [l for l in self.text.splitlines() if l.startswith(prefix)]
    assert len(lines) == 1, f"expected one output line starting {prefix!r}, got {lines}"
    return lines[0][len(prefix):]


async def _execute(name, tmp, slots, cache) -> Executed:
  nb = nbformat.read(_path(name), as_version=4)
  cwd, workdir = tmp / "cwd", tmp / "work"
  cwd.mkdir()
  # The suite's study compilation cache (study_runs): the quickstart's small study samples as
  # test_experiment's miniature study does, which runs first (conftest.SLOW_FIRST).
  # TMPDIR: what a notebook writes to a temporary directory (the kernels' benchmark JSON) stays
  # in the test's own.
  env = dict(os.environ, SMJAX_NOTEBOOK_SMALL="1", SMJAX_NOTEBOOK_WORKDIR=str(workdir),
             JAX_PLATFORMS="cpu", TMPDIR=str(tmp), **cache_env(cache))
  env.pop("SMJAX_REPO", None)   # XLA_FLAGS: the suite's fast-compile flags (conftest.py)
  async with slots:
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(cwd)}})
    await client.async_execute(env=env)  # raises CellExecutionError (cell, traceback) on errors
  ex = Executed(nb, str(workdir))
  assert ex.line("python: ") == sys.prefix, (
      f"{name}.ipynb ran in a kernel of another Python; jupyter's python3 kernelspec must "
      "resolve to this environment")
  return ex


async def _execute_all(tmp_path_factory):
  slots = asyncio.Semaphore(PARALLEL)
  cache = study_compilation_cache(tmp_path_factory)
  runs = [_execute(n, tmp_path_factory.mktemp(n), slots, cache) for n in NOTEBOOKS]
  results = await asyncio.gather(*runs, return_exceptions=True)  # every kernel shuts down
  for name, res in zip(NOTEBOOKS, results):
    if isinstance(res, BaseException):
      raise AssertionError(f"notebooks/{name}.ipynb failed: {res}") from res
  return dict(zip(NOTEBOOKS, results))


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
  """Every notebook, executed once, PARALLEL kernels at a time."""
  return asyncio.run(_execute_all(tmp_path_factory))


# ------------------------------------------------------------------------------- static

@pytest.mark.parametrize("name", NOTEBOOKS)
def test_saved_without_outputs_and_small_by_default(name):
  nb = nbformat.read(_path(name), as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code, f"{name}.ipynb has no code cells"
  for c in code:
    assert c.outputs == [] and c.execution_count is None, (
        f"{name}.ipynb is saved with outputs (clear them before committing): {c.source[:80]!r}")
  src = "\n".join(c.source for c in code)
  assert 'os.environ.get("SMJAX_NOTEBOOK_SMALL", "1") != "0"' in src, (
      f"{name}.ipynb must default to SMALL and read SMJAX_NOTEBOOK_SMALL")
  assert nb.metadata["kernelspec"]["name"] == "python3"


def test_python3_kernelspec_runs_this_interpreter():
  spec = KernelSpecManager().get_kernel_spec("python3")
  # jupyter_client replaces a bare "python" with sys.executable when it launches the kernel.
  assert spec.argv[0] in ("python", sys.executable), (spec.resource_dir, spec.argv)
  assert spec.argv[1:3] == ["-m", "ipykernel_launcher"], spec.argv


# ------------------------------------------------------------------------------ executed

def test_quickstart_prints_the_report_and_shows_the_plot(executed):
  ex = executed["quickstart"]
  table_lines = [l for l in ex.text.splitlines()
                 if l.split() and l.split()[0] in ("base", "joint_grpo", "expert_math",
                                                   "expert_code", "split_merge")]
  assert {l.split()[0] for l in table_lines} == {"base", "joint_grpo", "expert_math",
                                                 "expert_code", "split_merge"}, ex.text[-3000:]
  report_dir = os.path.join(ex.workdir, "quickstart_small", "report")
  with open(os.path.join(report_dir, "report.json")) as f:
    report = json.load(f)
  with open(os.path.join(report_dir, "report.txt")) as f:
    assert f.read().strip() in ex.text  # the printed table is the report's
  sm, joint = report["arms"]["split_merge"], report["arms"]["joint_grpo"]
  assert sm["flops_total"]["mean"] > 0 and joint["flops_total"]["mean"] > 0
  assert f"split-then-merge: {sm['flops_total']['mean']:.3g} training FLOPs" in ex.text
  # The image shown inline is the plot the report wrote.
  with open(os.path.join(report_dir, "accuracy_vs_flops.png"), "rb") as f:
    png = f.read()
  assert png.startswith(b"\x89PNG") and ex.images == [png]


def test_grpo_and_opd_numbers(executed):
  s = json.loads(executed["grpo_and_opd"].line("SUMMARY "))
  G = s["group_size"]
  r = np.asarray(s["first_rewards"], np.float64).reshape(-1, G)
  assert set(np.unique(r)) <= {0.0, 1.0}
  # GRPO advantages, written here: (r - group mean) / (unbiased group std + 1e-6), 0 if constant.
  std = r.std(axis=1, ddof=1, keepdims=True)
  want = np.where(std > 0, (r - r.mean(axis=1, keepdims=True)) / (std + 1e-6), 0.0)
  np.testing.assert_allclose(np.asarray(s["first_advantages"]).reshape(-1, G), want, atol=1e-5)
  assert s["grpo"], "no GRPO step ran"
  for m in s["grpo"]:
    assert all(np.isfinite(m[k]) for k in ("loss", "clip_frac", "kl_mean", "ratio_mean")), m
    assert m["kl_mean"] >= 0.0 and 0.0 <= m["clip_frac"] <= 1.0
    if m["update"] == 0:  # the first update on a batch is on-policy: ratio 1, nothing clipped
      assert abs(m["ratio_mean"] - 1.0) < 1e-3 and m["clip_frac"] == 0.0, m
  assert s["opd"], "no OPD step ran"
  for m in s["opd"]:
    assert all(np.isfinite(m[k]) for k in m), m
    assert m["student_logp"] <= 0.0 and m["teacher_logp"] <= 0.0
  table = s["token_table"]
  assert table["exact_kl"] and min(table["exact_kl"]) >= -1e-5
  assert max(table["student_logp"]) <= 0.0 and max(table["teacher_logp"]) <= 0.0
  assert s["kl_exact"] >= 0.0 and s["kl_exact_after"] >= 0.0 and np.isfinite(s["kl_estimate"])
  assert s["rows_per_teacher"] == {"expert_math": r.size}
  for phase in ("rollout/prefill", "rollout/decode", "train/policy", "train/reference",
                "train/teacher"):
    assert s["flops"].get(phase, 0) > 0, (phase, s["flops"])


def test_kernels_match_their_references(executed):
  text = executed["kernels"].text
  diffs = {m.group(1): (float(m.group(2)), float(m.group(3)))
           for m in re.finditer(r"^MAXDIFF (\S+) loss=(\S+) grad=(\S+)", text, re.M)}
  assert set(diffs) == {"group_advantage", "reverse_kl[pallas]", "reverse_kl[xla]"}, text
  # float32; reverse KL values are O(1-10) over V = 1000 terms.
  tol = {"group_advantage": (1e-6, 1e-8), "reverse_kl[pallas]": (2e-5, 5e-6),
         "reverse_kl[xla]": (2e-5, 5e-6)}
  for name, (d_loss, d_grad) in diffs.items():
    assert d_loss <= tol[name][0] and d_grad <= tol[name][1], (name, d_loss, d_grad)
  metrics = re.search(r"^MAXDIFF group_advantage .* metrics=(\S+)$", text, re.M)
  assert metrics and float(metrics.group(1)) <= 1e-5, text  # clip fractions, KL, ...
  m = re.search(r"^BENCH rows=(\d+) kernels=(.*)$", text, re.M)
  assert m, text
  assert int(m.group(1)) == 4 and "group_advantage" in m.group(2) and "reverse_kl" in m.group(2)
