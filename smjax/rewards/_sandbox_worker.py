"""The process that runs inside the sandbox and forks one confined child per candidate.

Started by `smjax.rewards.sandbox` as `python -I -S -B _sandbox_worker.py MODE UID_BASE TMP PRE
[EXPOSE]` under bubblewrap/unshare (or bare, with a warning); EXPOSE is a JSON list of host paths
that candidates may read (unshare mode). Standard library only: it runs with no
site-packages and an empty environment. The interpreter start-up is paid once per worker; each
candidate costs a fork. Its ready message says whether uids are dropped and what on sys.path a
candidate's uid cannot read, so that the host can refuse a sandbox whose candidates would score 0.

Protocol on fd 0/1 (messages of _sandbox_wire.py). Per job the host sends a header
{"kind", "program", "entry", "arg_names", "calls" | "check": true, "limits"}; for check jobs a
second message {"prelude", "tests"} follows that only the *test child* reads (straight from
fd 0), so test code never enters this worker's memory, and hence never a later candidate's
(which is a fork of it). The worker answers one result message per job.

Per job:
  candidate child (uid C, own session, rlimits, fresh dir, stdin /dev/null, output to a capped
    file) execs the program and then answers call requests with plain-data values only;
  io jobs: this worker sends the calls and returns the encoded outputs; the host compares them
    with expected outputs that never enter the sandbox (hidden tests);
  check jobs: a test child (uid T != C) execs the trusted prelude and the tests, with the entry
    point bound to a proxy that forwards each call to the candidate process. The test child
    writes the verdict on a pipe the candidate never had, so nothing the candidate does in its
    own process (exit tricks, monkeypatching, fake output, a lying __eq__) can fake a pass.
Afterwards every process of uid C and T is killed (kill(-1) from a helper of that uid) and the dirs
are removed.
"""

import json
import os
import select
import shutil
import signal
import sys
import time


def _load_sibling(name):
  """Imports a module next to this file without putting this directory on sys.path: outside
  bwrap that directory is smjax/rewards, whose math.py would shadow the candidates' `math`."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = sys.modules[name] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_wire = _load_sibling("_sandbox_wire")
_child = _load_sibling("_sandbox_child")
read_exact, read_msg, write_msg = _wire.read_exact, _wire.read_msg, _wire.write_msg
candidate_main, confine, test_main = _child.candidate_main, _child.confine, _child.test_main
probe_main = _child.probe_main

_PREIMPORT = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string",
              "random", "hashlib", "typing", "fractions", "decimal", "statistics", "operator",
              "copy", "datetime", "array", "textwrap", "cmath", "numbers", "dataclasses")


class _Reaper:
  """A long-lived helper running as one sandbox uid that, on request, calls kill(-1, SIGKILL):
  that reaches every process of the uid at once (forks racing with it fail), including those
  that left the session with setsid. Kept alive between jobs to save a fork per candidate; a
  candidate that kills or stops it (same uid) only costs a respawn."""

  def __init__(self, uid):
    self.uid, self.pid = uid, None

  def _spawn(self):
    req_r, self.req_w = os.pipe()
    self.resp_r, resp_w = os.pipe()
    self.pid = os.fork()
    if self.pid == 0:
      try:
        os.setsid()
        os.closerange(3, req_r)
        os.closerange(req_r + 1, resp_w)
        os.closerange(resp_w + 1, 1 << 16)
        os.setresuid(self.uid, self.uid, self.uid)
        while os.read(req_r, 1):
          for _ in range(2):
            try:
              os.kill(-1, signal.SIGKILL)
            except OSError:
              pass
          os.write(resp_w, b"d")
      finally:
        os._exit(0)
    os.close(req_r)
    os.close(resp_w)

  def _drop(self):
    for fd in (self.req_w, self.resp_r):
      os.close(fd)
    try:
      os.kill(self.pid, signal.SIGKILL)
      os.waitpid(self.pid, 0)
    except (OSError, ChildProcessError):
      pass
    self.pid = None

  def sweep(self):
    for _ in range(3):
      if self.pid is None:
        self._spawn()
      try:
        os.write(self.req_w, b"k")
        if read_exact(self.resp_r, 1, time.monotonic() + 2.0) == b"d":
          return
      except OSError:
        pass
      self._drop()
    raise RuntimeError(f"cannot clear the processes of uid {self.uid}")


def _kill_uid(uid, pids, ctx):
  """Kills the given process groups and, when uids are dropped, every process of `uid`."""
  for pid in pids:
    for kill in (os.killpg, os.kill):
      try:
        kill(pid, signal.SIGKILL)
      except OSError:
        pass
  for pid in pids:  # reap our children before anything else looks at them
    try:
      os.waitpid(pid, 0)
    except ChildProcessError:
      pass
  if uid is not None and ctx["root"]:
    reaper = ctx["reapers"].setdefault(uid, _Reaper(uid))
    reaper.sweep()
    if os.getpid() == 1:  # we are the namespace's init: the killed orphans are ours to reap
      t_end = time.monotonic() + 2.0
      while _reap() or (_uid_pids(uid) - {reaper.pid} and time.monotonic() < t_end):
        time.sleep(0.001)
  _reap()


def _uid_pids(uid):
  pids = set()
  for d in os.listdir("/proc"):
    if d.isdigit():
      try:
        with open(f"/proc/{d}/status") as f:
          if any(line.startswith("Uid:") and int(line.split()[1]) == uid for line in f):
            pids.add(int(d))
      except (OSError, ValueError):
        pass
  return pids


def _reap():
  """Reaps orphans reparented to us (we are pid 1 under `unshare --fork`); True if any was."""
  reaped = False
  while True:
    try:
      pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return reaped
    if pid == 0:
      return reaped
    reaped = True


def _head(path, n):
  try:
    with open(path, "rb") as f:
      return f.read(n).decode(errors="replace")
  except OSError:
    return ""


def run_job(job, ctx):
  """Runs one job (header already read) and returns the result message."""
  n = ctx["count"] = ctx["count"] + 1
  limits = job["limits"]
  start = time.monotonic()
  deadline = start + limits["timeout_s"]
  uids = ctx["uids"] if ctx["root"] else (None, None)
  check = bool(job.get("check"))
  dirs = [f"{ctx['tmp']}/job{n}-{s}" for s in ("ct" if check else "c")]
  for d, uid in zip(dirs, uids):
    os.mkdir(d, 0o700)
    if uid is not None:
      os.chown(d, uid, uid)
  job = dict(job, uids=uids, dirs=dirs)
  req_r, req_w = os.pipe()
  resp_r, resp_w = os.pipe()
  pids = []
  cand = os.fork()
  if cand == 0:
    try:
      confine(uids[0], limits, dirs[0], dirs[0] + "/out.txt", (req_r, resp_w))
      candidate_main(job, req_r, resp_w)
    finally:
      os._exit(3)
  pids.append(cand)
  os.close(req_r)
  os.close(resp_w)
  result = {"status": "ok"}
  try:
    if not check:
      # Read even when the send failed: a candidate that failed to load has written its error
      # and exited (EPIPE here); past the deadline read_msg returns None at once.
      write_msg(req_w, {"calls": job["calls"]}, deadline)
      resp = read_msg(resp_r, deadline, limit=limits["result_bytes"])
      if resp is None:
        result = {"status": "timeout" if time.monotonic() >= deadline else "crash"}
      elif "load_error" in resp:
        result = {"status": "error", "detail": resp["load_error"]}
      else:
        result["outputs"] = resp["results"]
    else:
      res_r, res_w = os.pipe()
      tester = os.fork()
      if tester == 0:
        try:
          os.close(res_r)
          test_main(job, req_w, resp_r, res_w, deadline)
        finally:
          os._exit(3)
      pids.append(tester)
      os.close(res_w)
      if read_exact(res_r, 1, time.monotonic() + 30) != b"R":
        raise RuntimeError("test child did not read its spec: protocol out of sync")
      verdict = b""
      while len(verdict) < 4096:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([res_r], [], [], left)[0]:
          result["status"] = "timeout"
          break
        b = os.read(res_r, 4096)
        if not b:
          break
        verdict += b
      os.close(res_r)
      passed = verdict == b"PASS"
      if passed:  # the test child must also have exited cleanly
        left = max(deadline - time.monotonic(), 0.05)
        t_end = time.monotonic() + left
        while time.monotonic() < t_end:
          pid, status = os.waitpid(tester, os.WNOHANG)
          if pid:
            passed = os.waitstatus_to_exitcode(status) == 0
            pids.remove(tester)
            break
          time.sleep(0.0005)
        else:
          passed = False
      result["passed"] = passed
      if not passed and result["status"] == "ok":
        result["detail"] = verdict.decode(errors="replace")[:400]
  except (ValueError, KeyError) as e:
    result = {"status": "error", "detail": f"{type(e).__name__}: {e}"}
  finally:
    for fd in (req_w, resp_r):
      os.close(fd)
    _kill_uid(uids[0], pids[:1], ctx)
    if check:
      _kill_uid(uids[1], pids[1:], ctx)
    result["output"] = _head(dirs[0] + "/out.txt", limits["output_bytes"])
    for d in dirs:
      shutil.rmtree(d, ignore_errors=True)
  result["seconds"] = time.monotonic() - start
  return result


_TMPFS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def _import_dirs():
  """The directories candidates import from: sys.path as given and as resolved (a symlinked
  standard library needs both its link and its target reachable)."""
  dirs = [os.path.abspath(p) for p in sys.path if os.path.exists(p)]
  return dirs + [os.path.realpath(p) for p in dirs]


def _cover_point(path, tmpfs):
  """The highest ancestor of `path` that hides it from other uids: one of the private tmpfs
  mounts, or a directory they cannot traverse (a 0700 home holding a pyenv, say); else None."""
  parts = path.strip("/").split("/")
  for i in range(1, len(parts)):
    a = "/" + "/".join(parts[:i])
    if a in tmpfs or not os.stat(a).st_mode & 0o001:
      return a
  return None


def _setup_unshare_mounts(expose):
  """Under `unshare --mount` as root: read-only remount of every mount, private tmpfs on the
  world-writable directories, and the paths in `expose` made reachable for the candidates' uids.
  Returns what could not be exposed ("" when all was).

  A path under a 0700 directory (or under /tmp, now covered) is bound at the same path on a
  read-only tmpfs laid over its highest hidden ancestor: the standard library (and ro_binds)
  can be imported and read while that ancestor's other contents stay hidden."""
  import ctypes  # pylint: disable=import-outside-toplevel
  libc = ctypes.CDLL(None, use_errno=True)
  ms_rdonly, ms_remount, ms_bind, ms_rec, ms_private = 1, 32, 4096, 16384, 1 << 18

  def mount(src, dst, fstype, flags, data=None):
    if libc.mount(src and src.encode(), dst.encode(), fstype, flags, data) != 0:
      raise OSError(ctypes.get_errno(), f"mount on {dst}: {os.strerror(ctypes.get_errno())}")

  libc.mount(None, b"/", None, ms_rec | ms_private, None)
  with open("/proc/self/mountinfo") as f:
    points = [line.split()[4] for line in f]
  for p in sorted(set(points)):
    if not p.startswith(("/proc", "/sys", "/dev")):
      libc.mount(None, p.encode(), None, ms_remount | ms_bind | ms_rdonly, None)
  tmpfs = [p for p in _TMPFS if os.path.isdir(p)]
  plan = {}  # path -> (cover, fd): the fd keeps the path bindable once its ancestor is covered
  for path in sorted(set(expose)):
    if not any(path == q or path.startswith(q + "/") for q in plan):
      try:
        cover = _cover_point(path, tmpfs)
        if cover:
          plan[path] = (cover, os.open(path, os.O_PATH))
      except OSError:
        pass  # gone: the probe reports what candidates cannot read
  for p in tmpfs:
    libc.mount(b"tmpfs", p.encode(), b"tmpfs", 0, b"size=64m,mode=1777")
  errors, covers = [], sorted({c for c, _ in plan.values()} - set(tmpfs))
  for c in covers:
    try:
      mount("tmpfs", c, b"tmpfs", 0, b"size=1m,mode=0755")
    except OSError as e:
      errors.append(str(e))
  for path, (cover, fd) in plan.items():
    try:
      d, parts = cover, path[len(cover) + 1:].split("/")
      for i, part in enumerate(parts):
        d += "/" + part
        if i == len(parts) - 1 and not os.path.isdir(f"/proc/self/fd/{fd}"):
          os.close(os.open(d, os.O_WRONLY | os.O_CREAT, 0o644))  # a file (a zip) binds on a file
        elif not os.path.isdir(d):
          os.mkdir(d)
          os.chmod(d, 0o755)
      mount(f"/proc/self/fd/{fd}", path, None, ms_bind | ms_rec)
      mount(None, path, None, ms_remount | ms_bind | ms_rdonly)
    except OSError as e:
      errors.append(f"{path}: {e}")
    finally:
      os.close(fd)
  for c in covers:
    libc.mount(None, c.encode(), None, ms_remount | ms_bind | ms_rdonly, None)
  return "; ".join(errors)


def _probe(uid):
  """Runs the probe child (_sandbox_child.probe_main). Returns (uid_drop, stdlib_error)."""
  dirs = [p for p in sys.path if os.path.isdir(p)]
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      os.close(r)
      probe_main(uid, dirs, w)
    finally:
      os._exit(2)
  os.close(w)
  err = b"".join(iter(lambda: os.read(r, 4096), b""))
  os.close(r)
  return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, err.decode(errors="replace")


def main(argv):
  mode, uid_base, tmp = argv[1], int(argv[2]), argv[3]
  preimport = argv[4] == "1" if len(argv) > 4 else True
  expose = json.loads(argv[5]) if len(argv) > 5 else []
  for name in _PREIMPORT if preimport else ():  # paid once here, not once per candidate
    try:
      __import__(name)
    except ImportError:
      pass
  mount_error = ""
  if mode == "unshare" and os.getuid() == 0:
    mount_error = _setup_unshare_mounts(_import_dirs() + expose)
  try:  # a dropped uid must take effect (not so under an unprivileged user ns)
    root, stdlib_error = _probe(uid_base)
  except OSError:
    root, stdlib_error = False, ""
  root = root and os.getuid() == 0
  if stdlib_error and mount_error:
    stdlib_error += f" (rebinding it failed: {mount_error})"
  ctx = {"count": 0, "uids": (uid_base, uid_base + 1), "root": root, "tmp": tmp, "reapers": {}}
  write_msg(1, {"ready": True, "uid_drop": root, "pid": os.getpid(),
                "stdlib_error": stdlib_error})
  signal.signal(signal.SIGPIPE, signal.SIG_IGN)
  while True:
    job = read_msg(0)
    if job is None:
      return
    write_msg(1, run_job(job, ctx))


if __name__ == "__main__":
  main(sys.argv)
