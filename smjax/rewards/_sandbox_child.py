"""The two confined children of a sandbox job (forked by _sandbox_worker.py, standard library only).

candidate child: its own uid, session, rlimits and fresh directory; execs the candidate program,
  then answers {"calls": [[args...], ...]} requests on a pipe with encoded plain-data results.
test child (check jobs): another uid; reads the tests straight from the worker's stdin, execs
  the trusted prelude and the tests with the entry point bound to a proxy that forwards each
  call to the candidate child, and writes the verdict on a pipe the candidate never had.
probe child (once per worker): checks that a candidate's uid can read the standard library.
"""

import os
import resource
import sys

from _sandbox_wire import decode, encode, read_msg, write_msg


def confine(uid, limits, workdir, out_path, keep):
  """In a fresh child: own session, stdin closed, output to a capped file, rlimits, drop to uid."""
  os.setsid()
  null = os.open(os.devnull, os.O_RDONLY)
  out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  if uid is not None:
    os.fchown(out, uid, uid)
  os.dup2(null, 0)
  os.dup2(out, 1)
  os.dup2(out, 2)
  keep = sorted(set(keep))
  lo = 3
  for fd in keep:
    if fd > lo:
      os.closerange(lo, fd)
    lo = max(lo, fd + 1)
  os.closerange(lo, 1 << 16)
  cpu = int(limits["cpu_s"])
  mb = 1 << 20
  for res, val in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                   (resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2),
                   (resource.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2),
                   (resource.RLIMIT_NOFILE, (limits["nofile"],) * 2),
                   (resource.RLIMIT_CORE, (0, 0)),
                   (resource.RLIMIT_NPROC, (limits["nproc"],) * 2)):
    try:
      resource.setrlimit(res, val)
    except (ValueError, OSError):
      if res != resource.RLIMIT_NPROC:  # NPROC only applies to dropped uids anyway
        raise
  os.chdir(workdir)
  os.environ.clear()
  if uid is not None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
  os.umask(0o077)


def _flush():
  """Pushes the candidate's buffered print() output into its output file. The child ends with
  os._exit (no interpreter teardown, so no implicit flush) or is killed once it has answered, so
  this runs before every answer."""
  for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
    try:
      stream.flush()
    except BaseException:  # pylint: disable=broad-except
      pass  # the candidate may have closed or replaced the stream


def candidate_main(job, req_r, resp_w):
  """Candidate child: load the program, then answer {"calls": [[args...], ...]} until EOF."""
  import builtins  # pylint: disable=import-outside-toplevel
  for stream in (sys.stdout, sys.stderr):  # line by line: output before a timeout is kept too
    try:
      stream.reconfigure(line_buffering=True)
    except (AttributeError, ValueError, OSError):
      pass
  try:
    if job["kind"] == "expr":
      code = compile(job["program"], "<candidate>", "eval")
      names = list(job["arg_names"])

      def fn(*args):
        env = {"__builtins__": builtins, **dict(zip(names, args))}
        return eval(code, env)  # pylint: disable=eval-used
    else:
      ns = {"__name__": "__candidate__", "__builtins__": builtins}
      exec(compile(job["program"], "<candidate>", "exec"), ns)  # pylint: disable=exec-used
      fn = ns[job["entry"]]
      if not callable(fn):
        raise TypeError(f"{job['entry']} is not callable")
  except BaseException as e:  # pylint: disable=broad-except
    _flush()
    write_msg(resp_w, {"load_error": f"{type(e).__name__}: {str(e)[:200]}"})
    os._exit(0)
  while True:
    msg = read_msg(req_r)
    if msg is None:
      _flush()
      os._exit(0)
    results = []
    for args in msg["calls"]:
      try:
        results.append([1, encode(fn(*[decode(a) for a in args]))])
      except BaseException as e:  # pylint: disable=broad-except
        results.append([0, type(e).__name__])
    _flush()
    write_msg(resp_w, {"results": results})


class CandidateError(Exception):
  """Raised by the proxy in the test child when the candidate failed to answer a call."""


def test_main(job, req_w, resp_r, result_w, deadline):
  """Test child: prelude + tests run here, the entry point is a proxy to the candidate process."""
  import builtins  # pylint: disable=import-outside-toplevel
  spec = read_msg(0)  # message B, straight from the host; before confine() replaces fd 0
  os.write(result_w, b"R")
  confine(job["uids"][1], job["limits"], job["dirs"][1], job["dirs"][1] + "/out.txt",
           (req_w, resp_r, result_w))

  def candidate(*args):
    # Read even when the send failed: a candidate that failed to load wrote its error and exited
    # (EPIPE here); past the deadline read_msg returns None at once.
    write_msg(req_w, {"calls": [[encode(a) for a in args]]}, deadline)
    resp = read_msg(resp_r, deadline)
    if resp is None:
      raise CandidateError("no answer (exited, crashed or timed out)")
    if "load_error" in resp:
      raise CandidateError(resp["load_error"])
    ok, val = resp["results"][0]
    if not ok:
      raise CandidateError(f"raised {val}")
    return decode(val)

  try:
    ns = {"__name__": "__test__", "__builtins__": builtins}
    if spec["prelude"]:
      exec(compile(spec["prelude"], "<prelude>", "exec"), ns)  # pylint: disable=exec-used
    ns[job["entry"]] = candidate
    ns["candidate"] = candidate
    exec(compile(spec["tests"], "<tests>", "exec"), ns)  # pylint: disable=exec-used
    if callable(ns.get("check")):
      ns["check"](candidate)
    os.write(result_w, b"PASS")
    os._exit(0)
  except BaseException as e:  # pylint: disable=broad-except
    os.write(result_w, f"FAIL {type(e).__name__}: {str(e)[:300]}".encode(errors="replace"))
    os._exit(1)


def probe_main(uid, dirs, w):
  """Probe child: drops groups, gid and uid as confine() does and writes on `w` the first of
  `dirs` (sys.path) it cannot read, so that a sandbox whose candidates could not import the
  standard library refuses to start instead of scoring every candidate 0. Exits 0 if the uid
  drop took effect, 1 if not (an unprivileged user ns: candidates keep the worker's uid, so the
  check runs as that)."""
  try:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    dropped = True
  except OSError:
    dropped = False
  for d in dirs:
    try:
      name = next((n for n in sorted(os.listdir(d)) if os.path.isfile(os.path.join(d, n))), None)
      if name:
        os.close(os.open(os.path.join(d, name), os.O_RDONLY))
    except OSError as e:
      os.write(w, f"uid {os.getuid()} cannot read {d} ({type(e).__name__}: {e})".encode())
      break
  os._exit(0 if dropped else 1)
