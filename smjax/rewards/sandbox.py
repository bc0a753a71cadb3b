"""Isolated execution of untrusted code (model completions) for code rewards.

`SandboxPool` keeps a few sandboxed worker processes (`_sandbox_worker.py`); each forks one
confined child per candidate, so the interpreter start-up is paid once per worker and a candidate
costs a fork (hundreds of verifications per second on 2 cores). `fresh_interpreter=True` starts a
new sandbox per candidate instead (slower; nothing at all is shared between candidates).

Two job kinds (`Job`):
- io (hidden tests): `calls` are sent to the candidate, its outputs come back as type-exact plain
  data and are compared on the host with expected outputs that never enter the sandbox;
- check (HumanEval/MBPP style): `tests` run in a separate test process (another uid) that reaches
  the candidate only through a call proxy, and only the test process can report a pass.

What is isolated (docs/sandbox.md has it per mode, and what to install)
-----------------------------------------------------------------------
Mode `bwrap` (bubblewrap; used when it works): each worker runs in new pid, net, ipc and uts
namespaces on a new root that holds only /usr and the Python installation (read-only), a minimal
/dev and a private, size-capped tmpfs /tmp; no /proc, no home or work directories, no environment.
Mode `unshare` (util-linux, the fallback): the same namespaces, every mount read-only, private
tmpfs on /tmp, /var/tmp, /dev/shm and /run/lock; host files that other users may read stay
readable, and the standard library (and ro_binds) is bound where a 0700 parent (a pyenv in /root)
or the private /tmp would hide it. In both, every candidate is a forked child in its own session
with stdin on /dev/null, stdout/stderr in a capped file (its head comes back as
`Result.output`), an empty environment, a fresh 0700 directory, rlimits (`Limits`), its own uid
without groups or capabilities (where the worker is root), and a wall-clock kill of every process
of that uid. No network (loopback down). Not isolated: the kernel (no seccomp), host CPU and
memory pressure (no cgroup). Mode `none` (neither works): rlimits and dropped uids only; it
warns loudly every time a pool starts. A pool whose candidates could not import the standard
library refuses to start (bwrap, unshare) or says so in its warning (none).
Verdicts cannot be faked from inside a candidate: io jobs compare outputs on the host with
expected values that never enter the sandbox; check jobs get their verdict from a separate test
process (another uid) that reaches the candidate only through a proxy passing plain data, so exit
tricks, printed "PASS" lines, monkeypatching and objects with a lying __eq__ all score 0.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import logging
import math
import os
import secrets
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Any, Sequence

from smjax.rewards import _sandbox_wire as wire
from smjax.rewards.result_cache import ResultCache

log = logging.getLogger("smjax")
ISOLATION_MODES = ("bwrap", "unshare", "none")
_HERE = os.path.dirname(os.path.abspath(__file__))
_SANDBOX_FILES = ("_sandbox_worker.py", "_sandbox_child.py", "_sandbox_wire.py")
_WORKER = os.path.join(_HERE, "_sandbox_worker.py")


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-candidate limits. cpu_s defaults to ceil(timeout_s) + 1."""
  timeout_s: float = 2.0
  cpu_s: int | None = None
  memory_mb: int = 512
  file_mb: int = 1
  nproc: int = 16
  nofile: int = 64
  output_bytes: int = 2048
  result_bytes: int = 1 << 20

  def wire(self) -> dict:
    d = dataclasses.asdict(self)
    d["cpu_s"] = self.cpu_s or math.ceil(self.timeout_s) + 1
    return d


@dataclasses.dataclass(frozen=True)
class Job:
  """One candidate. `kind` "expr": program is a Python expression in `arg_names`; "module": program
  is module code defining `entry`. Give `calls` (io job: list of argument lists) or `tests` (check
  job: test code, optionally with a trusted `prelude` executed before it in the test process)."""
  program: str
  kind: str = "module"
  entry: str = "f"
  arg_names: tuple[str, ...] = ("x",)
  calls: tuple[tuple[Any, ...], ...] | None = None
  tests: str | None = None
  prelude: str = ""
  limits: Limits = Limits()

  def __post_init__(self):
    if self.kind not in ("expr", "module"):
      raise ValueError(f"Job.kind={self.kind!r} must be 'expr' or 'module'")
    if (self.calls is None) == (self.tests is None):
      raise ValueError("a Job needs exactly one of calls= (io job) or tests= (check job)")


@dataclasses.dataclass
class Result:
  """status: ok | timeout | crash | error. outputs: per call (ok, value) for io jobs; passed: check
  jobs. `output` holds the head of the candidate's stdout/stderr."""
  status: str
  outputs: list[tuple[bool, Any]] | None = None
  passed: bool | None = None
  detail: str = ""
  output: str = ""
  seconds: float = 0.0

  def matches(self, expected: Sequence[Any]) -> bool:
    """True iff every call returned and each value equals `expected` with the same types."""
    if self.status != "ok" or not isinstance(self.outputs, list):
      return False
    if len(self.outputs) != len(expected):
      return False
    try:
      return all(ok and val == wire.encode(exp) for (ok, val), exp in zip(self.outputs, expected))
    except (TypeError, ValueError):
      return False


def _ancestors(path: str) -> list[str]:
  parts, out = path.strip("/").split("/"), []
  for i in range(1, len(parts)):
    out.append("/" + "/".join(parts[:i]))
  return out


def _python() -> tuple[str, str]:
  """The base interpreter (no venv needed: the worker uses the standard library only)."""
  exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
  return exe, os.path.realpath(sys.base_prefix)


def _argv(mode: str, uid_base: int, tmp: str, ro_binds: Sequence[str] = (),
          preimport: bool = True) -> list[str]:
  """The command that starts one worker. preimport: load common modules up front (pays off for
  a long-lived worker; in mode none it is also what lets dropped uids import them at all, since
  the Python installation may sit under a 0700 home directory that no namespace can expose)."""
  exe, prefix = _python()
  pre = "1" if preimport or mode == "none" else "0"
  worker = [exe, "-I", "-S", "-B"]
  if mode == "bwrap":
    argv = ["bwrap"]
    for top in ("/bin", "/lib", "/lib32", "/lib64", "/sbin"):
      if os.path.islink(top):
        argv += ["--symlink", os.readlink(top), top]
      elif os.path.isdir(top):
        argv += ["--ro-bind", top, top]
    argv += ["--ro-bind", "/usr", "/usr"]
    for d in _ancestors(prefix):  # bwrap would create them 0700: uids could not reach Python
      argv += ["--perms", "0755", "--dir", d]
    if not prefix.startswith("/usr/"):
      argv += ["--ro-bind", prefix, prefix]
    for path in ro_binds:
      argv += ["--ro-bind", path, path]
    argv += ["--perms", "0755", "--dir", "/sandbox"]
    for name in _SANDBOX_FILES:
      argv += ["--ro-bind", os.path.join(_HERE, name), f"/sandbox/{name}"]
    argv += ["--dev", "/dev", "--size", str(256 << 20), "--perms", "0755", "--tmpfs", "/tmp",
             "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
             "--chdir", "/tmp", "--"]
    return argv + worker + ["/sandbox/_sandbox_worker.py", mode, str(uid_base), "/tmp", pre]
  if mode == "unshare":
    argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--net", "--ipc", "--uts",
            "--mount-proc"]
    if os.getuid() != 0:
      argv += ["--user", "--map-root-user"]
    # The worker rebinds the standard library and ro_binds where a 0700 parent or the private
    # /tmp would hide them from the candidates' uids.
    return argv + ["--"] + worker + [_WORKER, mode, str(uid_base), "/tmp", pre,
                                     json.dumps(list(ro_binds))]
  return worker + [_WORKER, mode, str(uid_base), tmp, pre]


@functools.lru_cache(maxsize=None)
def isolation_available(mode: str) -> bool:
  """Whether `mode` works on this machine (tried once per process)."""
  if mode == "none":
    return True
  if mode not in ISOLATION_MODES or shutil.which(mode) is None:
    return False
  exe, _ = _python()
  argv = _argv(mode, 0, "/tmp")
  argv = argv[:argv.index(exe)] + [exe, "-I", "-S", "-c", "import socket"]
  try:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=20,
                          env={}, check=False).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


def resolve_isolation(isolation: str = "auto") -> str:
  """"auto" → bwrap if it works, else unshare, else none (with a loud warning)."""
  if isolation == "auto":
    isolation = next(m for m in ISOLATION_MODES if isolation_available(m))
  elif isolation not in ISOLATION_MODES:
    raise ValueError(f"isolation={isolation!r} must be one of {('auto',) + ISOLATION_MODES}")
  elif not isolation_available(isolation):
    raise RuntimeError(f"isolation={isolation!r} does not work on this machine (is "
                       f"{'bubblewrap' if isolation == 'bwrap' else 'util-linux'} installed?)")
  if isolation == "none":
    msg = ("smjax sandbox: NO ISOLATION AVAILABLE (neither bwrap nor unshare works here). "
           "Untrusted code runs with rlimits only" + (" and a dropped uid" if os.getuid() == 0
           else "") + ": it can read host files, write world-writable paths and open sockets. "
           "Install bubblewrap: apt-get install -y bubblewrap")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    log.warning(msg)
  return isolation


class _Worker:
  """One sandboxed worker process and its pipes."""

  def __init__(self, mode: str, uid_base: int, ro_binds: Sequence[str] = (),
               preimport: bool = True):
    self.mode, self.uid_base = mode, uid_base
    self.tmp = tempfile.mkdtemp(prefix="smjax-sandbox-") if mode == "none" else None
    if self.tmp:
      os.chmod(self.tmp, 0o711)
    self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
        _argv(mode, uid_base, self.tmp or "/tmp", ro_binds, preimport), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, start_new_session=True,
        close_fds=True)
    self._stderr = b""
    threading.Thread(target=self._drain, daemon=True).start()
    hello = wire.read_msg(self.proc.stdout.fileno(), time.monotonic() + 60)
    if not hello or not hello.get("ready"):
      self.close()
      raise RuntimeError(f"sandbox worker ({mode}) failed to start: "
                         f"{self._stderr.decode(errors='replace')[-2000:]}")
    self.uid_drop = hello["uid_drop"]
    # What candidates cannot import ("" when the whole standard library is readable). Mode none
    # has no mount namespace to fix it in and only warns (SandboxPool); the others refuse.
    self.stdlib_error = hello.get("stdlib_error", "")
    if self.stdlib_error and mode != "none":
      self.close()
      raise RuntimeError(f"smjax sandbox ({mode}) refuses to start: candidates could not import "
                         f"the standard library: {self.stdlib_error}. {_STDLIB_ADVICE[mode]}")

  def _drain(self):
    for line in self.proc.stderr:
      self._stderr = (self._stderr + line)[-8192:]

  def run(self, job: Job) -> Result:
    header = {"kind": job.kind, "program": job.program, "entry": job.entry,
              "arg_names": list(job.arg_names), "limits": job.limits.wire()}
    if job.calls is not None:
      header["calls"] = [[wire.encode(a) for a in args] for args in job.calls]
    else:
      header["check"] = True
    data = []
    for msg in [header] + ([{"prelude": job.prelude, "tests": job.tests}] if job.tests else []):
      body = json.dumps(msg, separators=(",", ":")).encode()
      data.append(struct.pack(">I", len(body)) + body)
    out = self.proc.stdout.fileno()
    try:
      self.proc.stdin.write(b"".join(data))
      self.proc.stdin.flush()
      # The worker enforces the job deadline; this margin covers its cleanup and slow forks.
      msg = wire.read_msg(out, time.monotonic() + job.limits.timeout_s + 30)
    except (OSError, ValueError):
      msg = None
    if msg is None:
      raise _WorkerLost(self._stderr.decode(errors="replace")[-500:])
    msg["outputs"] = msg.get("outputs")
    return Result(**{k: msg[k] for k in ("status", "outputs", "passed", "detail", "output",
                                         "seconds") if k in msg})

  def close(self):
    if self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, 9)
      except OSError:
        pass
    self.proc.wait()
    for f in (self.proc.stdin, self.proc.stdout):
      try:
        f.close()
      except OSError:
        pass
    if self.tmp:
      shutil.rmtree(self.tmp, ignore_errors=True)


_STDLIB_ADVICE = {
    "bwrap": "Use a Python whose standard library lies inside its prefix (no symlink out of it).",
    "unshare": "Install bubblewrap (apt-get install -y bubblewrap), or make that directory "
               "readable by other users (chmod -R o+rX).",
    "none": "Install bubblewrap: apt-get install -y bubblewrap"}


class _WorkerLost(RuntimeError):
  pass


class SandboxPool:
  """A pool of sandboxed workers. `run(jobs)` spreads jobs over them and returns results in order.

  Use as a context manager (or call close()); a lost worker is restarted and its job reported as
  status "crash". isolation: "auto" | "bwrap" | "unshare" | "none". ro_binds: host paths that
  candidates may read (bwrap binds them read-only at the same path; unshare rebinds them where a
  0700 parent or its private /tmp would hide them; none sees the host file system as it is).
  The first worker starts here, so a sandbox that cannot work fails at construction.

  Results of io jobs that completed are kept (the last `cache_size`; 0: none) and an identical
  job later gets a copy without running again: smjax.rewards.result_cache says which and why.
  """

  def __init__(self, num_workers: int | None = None, *, isolation: str = "auto",
               fresh_interpreter: bool = False, ro_binds: Sequence[str] = (),
               cache_size: int = 1 << 16):
    self.isolation = resolve_isolation(isolation)
    self.ro_binds = tuple(os.path.abspath(p) for p in ro_binds)
    # Verification is latency-bound (pipes, forks): two workers per core measured ~40% faster
    # than one on a 2-core machine.
    self.num_workers = num_workers or max(2, min(2 * (os.cpu_count() or 1), 16))
    self.fresh_interpreter = fresh_interpreter
    # Each worker slot gets two uids of its own (candidate, tests); a random base keeps two pools
    # on one machine from sharing (and so killing or limiting) each other's uids.
    self.uid_base = 1_000_000 + 2 * 256 * secrets.randbelow(1_000_000)
    self._free = list(reversed(range(self.num_workers)))  # pop() takes slot 0, started below
    self._workers: dict[int, _Worker] = {}
    self._lock = threading.Lock()
    self._executor = concurrent.futures.ThreadPoolExecutor(self.num_workers)
    self.cache = ResultCache(cache_size)
    self._closed = False
    try:  # one worker now, so that a sandbox that cannot work fails here, saying why
      first = self._slot_worker(0)
    except BaseException:
      self.close()
      raise
    if first.stdlib_error:
      msg = (f"smjax sandbox (none): candidates can import only the modules the worker loaded "
             f"in advance ({first.stdlib_error}). {_STDLIB_ADVICE['none']}")
      warnings.warn(msg, RuntimeWarning, stacklevel=2)
      log.warning(msg)

  @property
  def uids(self) -> range:
    """The uids this pool's candidates and test processes run as."""
    return range(self.uid_base, self.uid_base + 2 * self.num_workers)

  def _slot_worker(self, slot: int) -> _Worker:
    w = self._workers.get(slot)
    if w is None or w.proc.poll() is not None:
      w = self._workers[slot] = _Worker(self.isolation, self.uid_base + 2 * slot, self.ro_binds,
                                        preimport=not self.fresh_interpreter)
    return w

  def _run_one(self, job: Job) -> Result:
    with self._lock:
      slot = self._free.pop()
    try:
      w = self._slot_worker(slot)
      try:
        return w.run(job)
      except _WorkerLost as e:
        w.close()
        self._workers.pop(slot, None)
        return Result(status="crash", detail=f"sandbox worker lost: {e}")
      finally:
        if self.fresh_interpreter:
          w.close()
          self._workers.pop(slot, None)
    finally:
      with self._lock:
        self._free.append(slot)

  def run(self, jobs: Sequence[Job]) -> list[Result]:
    """Runs every job (in parallel over the workers) that the cache does not hold (class
    docstring); results are in the order of `jobs`."""
    if self._closed:
      raise RuntimeError("SandboxPool.run after close()")
    keys = self.cache.keys(jobs)
    kept = self.cache.lookup(keys)
    todo = [i for i, k in enumerate(keys) if k is None or k not in kept]
    fresh = dict(zip(todo, self._executor.map(self._run_one, [jobs[i] for i in todo])))
    self.cache.store([keys[i] for i in fresh], list(fresh.values()))
    return [fresh[i] if i in fresh else kept[k] for i, k in enumerate(keys)]

  @property
  def cache_hits(self) -> int:
    """Jobs answered from the results cache so far."""
    return self.cache.hits

  def close(self):
    self._closed = True
    self._executor.shutdown(wait=True)
    for w in self._workers.values():
      w.close()
    self._workers.clear()

  def __enter__(self) -> SandboxPool:
    return self

  def __exit__(self, *exc):
    self.close()

  def __del__(self):
    if not getattr(self, "_closed", True):
      try:
        self.close()
      except Exception:  # pylint: disable=broad-except
        pass  # at interpreter shutdown; the workers die with us anyway (--die-with-parent)


_DEFAULT: SandboxPool | None = None


def default_pool() -> SandboxPool:
  """A process-wide pool, created on first use and closed at interpreter exit."""
  global _DEFAULT  # pylint: disable=global-statement
  if _DEFAULT is None or _DEFAULT._closed:  # pylint: disable=protected-access
    import atexit  # pylint: disable=import-outside-toplevel
    _DEFAULT = SandboxPool()
    atexit.register(_DEFAULT.close)
  return _DEFAULT
