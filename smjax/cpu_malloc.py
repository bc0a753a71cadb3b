"""Opt-in glibc malloc settings that stop XLA:CPU from page-faulting a big step's buffers afresh.

XLA's CPU runtime allocates each executable's temporary buffers as one block per call
(`posix_memalign` from a runtime worker thread): ~145 MB for the peer benchmark's small packed
GRPO step. glibc serves a block that large with a fresh `mmap` (a worker thread's arena cannot hold more
than 64 MB, and the main arena maps anything above its mmap threshold, at most 32 MB) and unmaps
it when the call returns, so every call faults in and zeroes all of it again: 35.8k minor page
faults per step on a 2-core CPU. torch's CPU allocator does the same (TRL's small step: 62k faults,
299 -> 257 ms under these settings; README "Performance").

`tune()` keeps those pages: one arena (`M_ARENA_MAX` 1), no mmap-served blocks (`M_MMAP_MAX` 0),
and no returning the heap's free top to the system below 2 GiB (`M_TRIM_THRESHOLD`). A freed
block is then reused by the next call with its pages still mapped. The costs: the process keeps
its peak heap for its lifetime, and the runtime threads share one arena, whose lock slows steps
made of many small ops: the toy demo study ran 11 % longer (3 min 37 s against 3 min 15 s) and the
peer benchmark's tiny packed step 14 -> 20 ms, while the small and mid steps ran 7-15 % faster.
Hence opt-in: `import smjax` applies it only when the environment variable SMJAX_CPU_MALLOC is
"tuned" (Linux with glibc; numerics are untouched: the demo's report is identical either way).

tcmalloc, where it can be installed, does better on every count and needs none of this: started
with `LD_PRELOAD=.../libtcmalloc_minimal.so.4` (Debian's libtcmalloc-minimal4) the small packed step
took 140 ms with no page faults, the tiny one was not slowed, and the toy demo ran 9 % faster
(README "Running a study"). This module is the fallback that needs nothing installed.

glibc fixes a thread's arena when the thread first allocates, so threads started before the call
(an XLA backend already initialised, say) keep theirs; `tune()` warns then. `ENV` holds the same
settings as glibc environment variables, for a process that should start with them (the peer
benchmarks run each peer both as shipped and with them).
"""
from __future__ import annotations

import ctypes
import os
import sys
import warnings

ENV_VAR = "SMJAX_CPU_MALLOC"
_CHOICES = ("tuned", "default")

# mallopt parameter numbers (glibc malloc.h) and the values tune() sets.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
SETTINGS = {"M_ARENA_MAX": (M_ARENA_MAX, 1), "M_MMAP_MAX": (M_MMAP_MAX, 0),
            "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 2**31 - 1)}
# The same settings for a new process (glibc reads these at start-up).
ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}

STATUS = "not called"  # what the last tune() did, in words (recorded by the benchmarks)


def requested() -> str:
  """The SMJAX_CPU_MALLOC setting: "default" (also when unset) or "tuned"; anything else is an
  error."""
  value = os.environ.get(ENV_VAR, "default").strip().lower() or "default"
  if value not in _CHOICES:
    raise ValueError(f"environment variable {ENV_VAR}={os.environ[ENV_VAR]!r}: expected one of "
                     f"{', '.join(_CHOICES)} (unset means default)")
  return value


def _glibc():
  """The process's C library if it is glibc (it has mallopt and gnu_get_libc_version), else
  None."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    libc = ctypes.CDLL(None)
  except OSError:
    return None
  return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def _backend_started() -> bool:
  jax_bridge = sys.modules.get("jax._src.xla_bridge")
  check = getattr(jax_bridge, "backends_are_initialized", None)
  return bool(check and check())


def tune() -> str:
  """Applies SETTINGS with mallopt when SMJAX_CPU_MALLOC is "tuned" (module docstring). Returns
  and records in STATUS what happened: "off (...)", "applied", "unsupported (...)" or
  "failed (...)". Safe to call more than once."""
  global STATUS  # pylint: disable=global-statement
  if requested() == "default":
    STATUS = f"off (glibc defaults; {ENV_VAR}=tuned turns it on)"
    return STATUS
  libc = _glibc()
  if libc is None:
    STATUS = f"unsupported (not glibc on Linux: {sys.platform})"
    return STATUS
  libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
  failed = [name for name, (param, value) in SETTINGS.items() if libc.mallopt(param, value) != 1]
  if failed:
    STATUS = f"failed (mallopt refused {', '.join(failed)})"
    return STATUS
  STATUS = "applied"
  if _backend_started():
    warnings.warn("smjax.cpu_malloc.tune(): a JAX backend was initialised before smjax was "
                  "imported, so XLA's runtime threads keep their own malloc arenas and its CPU "
                  "steps may still page-fault their buffers each call; import smjax first, or "
                  f"start the process with {' '.join(f'{k}={v}' for k, v in ENV.items())}",
                  RuntimeWarning, stacklevel=2)
    STATUS = "applied (after a JAX backend started: its threads keep their arenas)"
  return STATUS
