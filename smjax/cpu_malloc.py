"""Malloc for XLA:CPU: tcmalloc for the command line where installed, opt-in glibc settings otherwise.

XLA's CPU runtime allocates each executable's temporary buffers as one block per call
(`posix_memalign` from a runtime worker thread): ~145 MB for the peer benchmark's small packed
GRPO step. glibc serves a block that large with a fresh `mmap` (a worker thread's arena cannot hold more
than 64 MB, and the main arena maps anything above its mmap threshold, at most 32 MB) and unmaps
it when the call returns, so every call faults in and zeroes all of it again: 35.8k minor page
faults per step on a 2-core CPU. torch's CPU allocator does the same (TRL's small step: 62k faults,
299 -> 257 ms under these settings; docs/performance.md, "malloc on CPU").

tcmalloc keeps those pages and is not slowed by many small ops: started with it preloaded
(Debian's libtcmalloc-minimal4) the small packed step took 140 ms against 171 ms with no page
faults, the tiny one was not slowed, and the toy demo ran 9 % faster with an identical report
(docs/performance.md, "malloc on CPU"). A preload has to be in place when the process starts, so the command
line (`python -m smjax.main`, the `smjax` script, `make demo` / `make study`, the launch scripts)
re-executes itself once with `LD_PRELOAD` set when the library is installed and not yet loaded
(`reexec_under_tcmalloc`); `make` installs it where it may (root with apt-get). A library user's
own process (a notebook, a test) is left as it started.

`tune()`, run by `import smjax`, is the fallback that needs nothing installed: with
SMJAX_CPU_MALLOC=tuned it sets one arena (`M_ARENA_MAX` 1), no mmap-served blocks (`M_MMAP_MAX`
0), and no returning the heap's free top to the system below 2 GiB (`M_TRIM_THRESHOLD`). A freed
block is then reused by the next call with its pages still mapped. The costs: the process keeps
its peak heap for its lifetime, and the runtime threads share one arena, whose lock slows steps
made of many small ops: the toy demo study ran 11 % longer (3 min 37 s against 3 min 15 s) and the
peer benchmark's tiny packed step 14 -> 20 ms, while the small and mid steps ran 7-15 % faster.
Hence opt-in (Linux with glibc; numerics are untouched: the demo's report is identical either way).
Set after start-up, the settings are best effort: on one 2-core VM they took in 9 of 12 processes
(the others page-faulted as before, for a reason not found), on another machine in every one; the
same settings given as environment variables at start-up (`ENV`) took in 12 of 12 there.

SMJAX_CPU_MALLOC: "auto" (or unset): tcmalloc for the command line when installed, else glibc as
is; "tcmalloc": the same, but the command line stops with an error when it is not installed;
"tuned": the glibc settings, no tcmalloc; "glibc" (or "default"): glibc as is. SMJAX_TCMALLOC
names the library file when it is not in a standard place.

glibc fixes a thread's arena when the thread first allocates, so threads started before `tune()`
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
LIBRARY_VAR = "SMJAX_TCMALLOC"
_CHOICES = ("auto", "tcmalloc", "tuned", "glibc", "default")  # "default": the old name of "glibc"
_REEXEC_MARK = "SMJAX_CPU_MALLOC_REEXEC"  # set in the re-executed process: never loop
# Where Debian/Ubuntu (libtcmalloc-minimal4), Fedora/RHEL (gperftools-libs) and source builds put it.
_TCMALLOC_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib/x86_64-linux-gnu",
                  "/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
_TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
# tcmalloc reports every allocation above 1 GiB on stderr; a big model's buffers are routine.
TCMALLOC_ENV = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(2**40)}

# mallopt parameter numbers (glibc malloc.h) and the values tune() sets.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
SETTINGS = {"M_ARENA_MAX": (M_ARENA_MAX, 1), "M_MMAP_MAX": (M_MMAP_MAX, 0),
            "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 2**31 - 1)}
# The same settings for a new process (glibc reads these at start-up).
ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}

STATUS = "not called"  # what the last tune() did, in words (recorded by the benchmarks)


def requested() -> str:
  """The SMJAX_CPU_MALLOC setting: "auto" (also when unset), "tcmalloc", "tuned" or "glibc"
  ("default" reads as "glibc"); anything else is an error."""
  value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
  if value not in _CHOICES:
    raise ValueError(f"environment variable {ENV_VAR}={os.environ[ENV_VAR]!r}: expected one of "
                     f"{', '.join(_CHOICES[:-1])} (unset means auto)")
  return "glibc" if value == "default" else value


def tcmalloc_library() -> str | None:
  """The tcmalloc shared library to preload: SMJAX_TCMALLOC when set (an error if it is not a
  file), else the first of the standard places that holds one, else None."""
  override = os.environ.get(LIBRARY_VAR, "").strip()
  if override:
    if not os.path.isfile(override):
      raise ValueError(f"environment variable {LIBRARY_VAR}={override!r}: no such file; expected "
                       "the path of libtcmalloc_minimal.so.4 (or unset it to search "
                       f"{', '.join(_TCMALLOC_DIRS)})")
    return override
  for name in _TCMALLOC_NAMES:
    for d in _TCMALLOC_DIRS:
      path = os.path.join(d, name)
      if os.path.isfile(path):
        return path
  return None


def tcmalloc_loaded() -> str | None:
  """The path of the tcmalloc library mapped into this process (Linux), or None."""
  try:
    with open("/proc/self/maps", encoding="utf-8") as f:
      for line in f:
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if "libtcmalloc" in os.path.basename(path):
          return path
  except OSError:
    pass
  return None


def reexec_under_tcmalloc(argv: list[str]) -> None:
  """For the command line only: replaces this process with `sys.executable *argv` under tcmalloc
  (LD_PRELOAD, plus TCMALLOC_ENV) when SMJAX_CPU_MALLOC is "auto" or "tcmalloc", the library is
  installed and not yet loaded, no other allocator is in LD_PRELOAD, and this process is not
  already the re-executed one. Returns without doing anything otherwise; with "tcmalloc" a missing
  library, or a preload that did not take, is a RuntimeError saying what to install. Call it
  before anything starts threads."""
  choice = requested()
  if choice not in ("auto", "tcmalloc") or not sys.platform.startswith("linux"):
    if choice == "tcmalloc":
      raise RuntimeError(f"{ENV_VAR}=tcmalloc: tcmalloc preloading needs Linux ({sys.platform})")
    return
  if tcmalloc_loaded():
    return
  restarted = bool(os.environ.get(_REEXEC_MARK))
  if not restarted and "malloc" in os.environ.get("LD_PRELOAD", ""):
    return  # the user preloaded an allocator of their choice
  lib = tcmalloc_library()
  if restarted or lib is None:
    if choice == "tcmalloc":
      why = (f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r} did not load it" if lib else
             f"no libtcmalloc in {', '.join(_TCMALLOC_DIRS)}")
      raise RuntimeError(f"{ENV_VAR}=tcmalloc: {why}. Install it (Debian/Ubuntu: apt-get install "
                         "libtcmalloc-minimal4; Fedora/RHEL: gperftools-libs), point "
                         f"{LIBRARY_VAR} at it, or set {ENV_VAR}=auto to run without it")
    return
  env = {**TCMALLOC_ENV, **os.environ}
  env["LD_PRELOAD"] = ":".join(p for p in (lib, os.environ.get("LD_PRELOAD", "")) if p)
  env[_REEXEC_MARK] = "1"
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *argv], env)


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
  """Applies SETTINGS with mallopt when SMJAX_CPU_MALLOC is "tuned" and tcmalloc is not loaded
  (module docstring). Returns and records in STATUS what happened: "tcmalloc (<path>)", "off
  (...)", "applied", "unsupported (...)" or "failed (...)". Safe to call more than once."""
  global STATUS  # pylint: disable=global-statement
  choice = requested()
  loaded = tcmalloc_loaded()
  if loaded:
    STATUS = f"tcmalloc ({loaded})"
    return STATUS
  if choice != "tuned":
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
