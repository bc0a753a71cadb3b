"""Shared pytest setup: tests import helpers from this folder; jax stays on the CPU.

The suite is mostly XLA compiling on two cores, so every process it starts compiles faster than a
run does (`FAST_XLA_FLAGS`): LLVM's expensive passes off (about 30 % less wall time for
compile-bound tests; the HLO programs are the same) and XLA:CPU's older fusion emitters (about
25 % less again; the HLO passes differ a little, so a FLOP count can differ from a run's in the
fourth digit). A test only compares numbers with a reference or with another process of the
suite, never with a run outside it. Subprocess tests add their own flags to
`os.environ["XLA_FLAGS"]` (e.g. the fake device count). The run's processes also share one
persistent compilation cache, made for the run and removed after it (below; the study tests keep
one of their own).
"""

import os
import shutil
import sys
import tempfile

FAST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                  "--xla_cpu_use_fusion_emitters=false")

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = f"{FAST_XLA_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()
sys.path.insert(0, os.path.dirname(__file__))

# The modules that take longest (`make test` runs them with `--durations`), first: pytest-xdist
# hands out whole modules (--dist loadfile) in collection order (--no-loadscope-reorder), so
# the long ones start at once on the two workers and the short ones fill in behind them,
# instead of a long one starting last and running alone. The notebooks come after test_cli, so
# that the quickstart's small study finds the miniature study's programs in their shared
# compilation cache (study_runs.study_compilation_cache).
SLOW_FIRST = ("test_experiment.py", "test_cli.py", "test_notebooks.py", "test_study_hf.py",
              "test_strong_to_weak.py",
              "test_layouts.py", "test_benchmarks.py", "test_learning.py", "test_sharded_steps.py",
              "test_precheck.py", "test_lowering.py", "test_checkpoint.py", "test_distributed.py",
              "test_mesh_compile_once.py", "test_transformer.py", "test_rollout_decode.py",
              "test_real_model.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(SLOW_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))


def cache_env(path) -> dict[str, str]:
  """The variables that make a process use the persistent compilation cache at `path` for every
  program it compiles (jax's default skips those under a second, most of the suite's)."""
  return {"JAX_COMPILATION_CACHE_DIR": str(path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}


# One persistent compilation cache for every process of the run that does not name its own (the
# study tests share theirs, study_runs.study_compilation_cache): the controller makes it before
# pytest-xdist starts its workers, which inherit the variables, as do their subprocesses.
_made_cache = []


def pytest_configure():
  if os.environ.get("PYTEST_XDIST_WORKER") or "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return   # a worker (the controller's variables are set) or the user's own cache
  _made_cache.append(tempfile.mkdtemp(prefix="smjax_suite_jax_cache_"))
  os.environ.update(cache_env(_made_cache[0]))


def pytest_unconfigure():
  if _made_cache:
    shutil.rmtree(_made_cache.pop(), ignore_errors=True)
    for var in cache_env(""):
      os.environ.pop(var, None)
