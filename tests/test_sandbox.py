"""Sandbox tests: correct behaviour, and attacks that must score 0, end in time and leave the host
as it was (files outside the sandbox and processes are checked after every attack).

Attacks run under every isolation mode this machine offers (bwrap, unshare); at least one must
work, since the project's setup installs bubblewrap.
"""

import collections
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import pytest

from smjax.rewards import sandbox
from smjax.rewards.sandbox import Job, Limits, SandboxPool

MODES = [m for m in ("bwrap", "unshare") if sandbox.isolation_available(m)]
T = 1.0  # per-attack wall-clock timeout
SECRET = "smjax-secret-" + os.urandom(6).hex()


def test_some_isolation_is_available():
  assert MODES, "neither bwrap nor unshare works: run `apt-get install -y bubblewrap`"
  assert sandbox.resolve_isolation("auto") in ("bwrap", "unshare")


def _procs():
  """pid -> (uid, ppid, state) for every process on the host."""
  out = {}
  for d in os.listdir("/proc"):
    if d.isdigit():
      try:
        with open(f"/proc/{d}/status") as f:
          fields = dict(line.split(":", 1) for line in f if ":" in line)
      except OSError:
        continue
      out[int(d)] = (int(fields["Uid"].split()[0]), int(fields["PPid"]), fields["State"].split()[0])
  return out


def _descendants(root_pid, procs):
  kids = collections.defaultdict(list)
  for pid, (_, ppid, _) in procs.items():
    kids[ppid].append(pid)
  out, todo = set(), [root_pid]
  while todo:
    for k in kids[todo.pop()]:
      out.add(k)
      todo.append(k)
  return out


def _assert_no_candidate_processes(pool, *, allow_reapers):
  """No process of the pool's uids is left, except (while the pool is open) one idle reaper per uid
  whose parent is a root sandbox worker. Zombies being reaped by the namespace's init get 3 s."""
  for _ in range(300):
    procs = _procs()
    mine = [(pid, uid, ppid) for pid, (uid, ppid, _) in procs.items() if uid in pool.uids]
    per_uid = collections.Counter(uid for _, uid, _ in mine)
    ok = all(c <= (1 if allow_reapers else 0) for c in per_uid.values()) and all(
        procs.get(ppid, (None,))[0] == 0 for _, _, ppid in mine)
    if ok:
      return
    time.sleep(0.01)
  raise AssertionError(f"processes left behind by candidates: {mine}")


@pytest.fixture(scope="module")
def canary():
  """A world-writable host directory with a world-writable file that candidates can see read-only:
  only the mount (not file permissions) stops them from changing it."""
  base = "/var/cache" if os.access("/var/cache", os.W_OK) else tempfile.gettempdir()
  d = tempfile.mkdtemp(prefix="smjax-canary-", dir=base)
  os.chmod(d, 0o777)
  path = os.path.join(d, "canary.txt")
  with open(path, "w") as f:
    f.write("untouched")
  os.chmod(path, 0o666)
  yield d
  shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module", params=MODES)
def pool(request, canary):
  os.environ["SMJAX_SECRET"] = SECRET  # must not reach candidates
  before = _descendants(os.getpid(), _procs())
  p = SandboxPool(2, isolation=request.param, ro_binds=[canary])
  yield p
  p.close()
  _assert_no_candidate_processes(p, allow_reapers=False)
  left = _descendants(os.getpid(), _procs()) - before
  assert not left, f"sandbox processes still running after close(): {left}"
  del os.environ["SMJAX_SECRET"]


def _run(pool, job):
  start = time.monotonic()
  (r,) = pool.run([job])
  wall = time.monotonic() - start
  assert r.seconds <= job.limits.timeout_s + 2.0, r  # termination, not speed: generous
  assert wall <= job.limits.timeout_s + 10.0, wall
  _assert_no_candidate_processes(pool, allow_reapers=True)
  return r


def _io(program, calls, expected, *, kind="module", limits=Limits(timeout_s=T)):
  return Job(program, kind=kind, calls=tuple(calls), limits=limits), expected


# ----------------------------------------------------------------------------------- positives
def test_io_job_returns_type_exact_outputs(pool):
  r = _run(pool, Job("def f(a, b):\n  return [a + b, (a, str(b)), {a: None}]\n",
                     calls=((1, 2), (3, 4))))
  assert r.status == "ok"
  assert r.matches([[3, (1, "2"), {1: None}], [7, (3, "4"), {3: None}]])
  assert not r.matches([[3, [1, "2"], {1: None}], [7, (3, "4"), {3: None}]])  # tuple != list
  assert not r.matches([[3.0, (1, "2"), {1: None}], [7, (3, "4"), {3: None}]])  # int != float


def test_check_job_passes_and_fails(pool):
  tests = "def check(candidate):\n  assert candidate(2) == 5\n  assert candidate(0) == 1\n"
  good, bad = pool.run([Job("def f(x):\n  return 2 * x + 1\n", tests=tests),
                        Job("def f(x):\n  return 2 * x\n", tests=tests)])
  assert good.status == "ok" and good.passed is True, good
  assert bad.passed is False and "AssertionError" in bad.detail, bad


STDLIB = ("import math, json, collections, fractions\n"
          "def f(x):\n  return math.isqrt(x), json.dumps([x]), str(fractions.Fraction(x, 4))\n")


def test_candidates_import_the_real_standard_library(pool):
  # (smjax/rewards/math.py must never shadow the candidates' `math`.)
  r = _run(pool, Job(STDLIB, calls=((10,),)))
  assert r.matches([(3, "[10]", "5/2")]), r


IMPORTS = ("import base64, unicodedata, difflib, queue, csv, threading\n"
           "def f(s):\n  return (base64.b64encode(s.encode()).decode(), unicodedata.name(s[0]),\n"
           "          difflib.SequenceMatcher(None, s, s + 'x').ratio(), queue.Queue().qsize(),\n"
           "          next(csv.reader([s + ',1'])), threading.active_count())\n")
IMPORTS_OUT = [("aGk=", "LATIN SMALL LETTER H", 0.8, 0, ["hi", "1"], 1)]


def test_candidates_import_modules_the_worker_did_not_preload(pool):
  # None of these is loaded in advance by the worker; under unshare, with Python under a 0700
  # directory (a pyenv in /root), they used to fail with ModuleNotFoundError.
  r = _run(pool, Job(IMPORTS, calls=(("hi",),)))
  assert r.matches(IMPORTS_OUT), r


def test_print_output_is_kept_without_flush(pool):
  prog = "print('loaded')\ndef f(x):\n  print('called', x)\n  return x\n"
  r = _run(pool, Job(prog, calls=((3,),)))
  assert r.matches([3]) and r.output == "loaded\ncalled 3\n", r
  tests = "def check(candidate):\n  assert candidate(4) == 4\n"
  r = _run(pool, Job(prog, tests=tests))
  assert r.passed is True and r.output == "loaded\ncalled 4\n", r
  r = _run(pool, Job("print('before the loop')\nwhile True:\n  pass\n", calls=((0,),),
                     limits=Limits(timeout_s=T)))
  assert r.status == "timeout" and r.output == "before the loop\n", r


def test_candidate_that_fails_to_load_reports_its_own_error(pool):
  prog = "print('about to fail')\nraise ValueError('bad candidate 42')\n"
  # The prelude's sleep lets the candidate exit before the tests call it: its error must still
  # be what is reported, not the broken pipe to the process that has gone.
  tests = "def check(candidate):\n  assert candidate(1) == 1\n"
  r = _run(pool, Job(prog, tests=tests, prelude="import time\ntime.sleep(0.3)\n"))
  assert r.passed is False and "ValueError: bad candidate 42" in r.detail, r
  assert r.output == "about to fail\n", r
  r = _run(pool, Job(prog, calls=((1,),)))
  assert r.status == "error" and r.detail == "ValueError: bad candidate 42", r
  assert r.output == "about to fail\n", r


def test_candidate_gets_fresh_empty_directory(pool):
  prog = ("import os\ndef f(_):\n  open('mine.txt', 'w').write('x')\n"
          "  return sorted(os.listdir('.')), len(os.environ)\n")
  first, second = pool.run([Job(prog, calls=((0,),)), Job(prog, calls=((0,),))])
  for r in (first, second):  # out.txt is the capped stdout file; mine.txt from this run only
    assert r.matches([(["mine.txt", "out.txt"], 0)]), r


# ----------------------------------------------------------------------------------- attacks
def test_attack_infinite_loop(pool):
  for kind, prog in (("expr", "[0 for _ in iter(int, 1)]"), ("module", "while True:\n  pass\n")):
    r = _run(pool, Job(prog, kind=kind, entry="f", calls=((0,),), limits=Limits(timeout_s=T)))
    assert r.status == "timeout" and not r.matches([0]), r


def test_attack_fork_bomb(pool):
  prog = ("import os\nwhile True:\n  try:\n    if os.fork() == 0:\n      os.setsid()\n"
          "  except OSError:\n    pass\n")
  r = _run(pool, Job(prog, calls=((0,),), limits=Limits(timeout_s=T)))
  assert not r.matches([0]) and r.status in ("timeout", "crash"), r


def test_attack_memory_bomb(pool):
  prog = "def f(_):\n  x = [bytearray(1 << 26) for _ in range(200)]\n  return len(x)\n"
  # What is tested is the memory limit, so the wall clock is generous: zero-filling 64 MB blocks
  # on a loaded 2-core machine once ran past T and came back a timeout instead of MemoryError.
  r = _run(pool, Job(prog, calls=((0,),), limits=Limits(timeout_s=10 * T, memory_mb=256)))
  assert not r.matches([200]) and r.outputs == [[0, "MemoryError"]], r


def test_attack_huge_output(pool):
  prog = "import sys\ndef f(_):\n  while True:\n    sys.stdout.write('x' * 100000)\n"
  r = _run(pool, Job(prog, calls=((0,),), limits=Limits(timeout_s=T, output_bytes=100)))
  # RLIMIT_FSIZE stops the writes (Python ignores SIGXFSZ, so the write raises EFBIG instead).
  assert r.outputs == [[0, "OSError"]] or r.status == "crash", r.status
  assert len(r.output) <= 100


def test_attack_files_outside_directory(pool, canary):
  escape = os.path.join(tempfile.gettempdir(), f"smjax-escape-{os.urandom(4).hex()}")
  target = os.path.join(canary, "canary.txt")
  prog = f"""import os
def f(_):
  done = []
  for act in (lambda: open({target!r}, 'w').write('owned'), lambda: os.remove({target!r}),
              lambda: open({canary!r} + '/new.txt', 'w').write('x'),
              lambda: open({escape!r}, 'w').write('x'), lambda: os.chmod({canary!r}, 0o700)):
    try:
      act(); done.append(1)
    except OSError:
      done.append(0)
  return done
"""
  r = _run(pool, Job(prog, calls=((0,),), limits=Limits(timeout_s=T)))
  # The write to /tmp may succeed inside the sandbox's private tmpfs (unshare mode); the host's
  # /tmp must not see it.
  assert r.matches([[0, 0, 0, 0, 0]]) or r.matches([[0, 0, 0, 1, 0]]), r
  with open(target) as f:
    assert f.read() == "untouched"
  assert sorted(os.listdir(canary)) == ["canary.txt"]
  assert os.stat(canary).st_mode & 0o777 == 0o777
  assert not os.path.exists(escape)


def test_attack_reads_environment(pool):
  prog = ("import os\ndef f(_):\n"
          "  return os.environ.get('SMJAX_SECRET', '') or repr(dict(os.environ))\n")
  r = _run(pool, Job(prog, calls=((0,),), limits=Limits(timeout_s=T)))
  assert not r.matches([SECRET]), r
  assert SECRET not in repr(r.outputs) and SECRET not in r.output


def test_attack_kills_parent_then_pool_still_works(pool):
  # (Return codes prove nothing here: killpg on a group it cannot signal may still return 0.)
  prog = """import os
def f(x):
  for act in (lambda: os.kill(os.getppid(), 9), lambda: os.killpg(os.getpgid(os.getppid()), 9),
              lambda: os.kill(1, 9), lambda: os.killpg(1, 9), lambda: os.kill(-1, 9)):
    try:
      act()
    except OSError:
      pass
  return x
"""
  r = _run(pool, Job(prog, calls=((1,),), limits=Limits(timeout_s=T)))
  # The worker (its parent) answered, so it survived (under unshare, killpg(0) may kill the
  # candidate itself: a crash); the wrong answer scores 0.
  assert r.status in ("ok", "crash") and "worker lost" not in r.detail, r
  assert not r.matches([2])
  ok = _run(pool, Job("x + 1", kind="expr", calls=((1,),)))
  assert ok.matches([2]), ok


def test_attack_exit_tricks_fake_success(pool):
  tests = "def check(candidate):\n  assert candidate(2) == 5\n"
  frame = "b'\\x00\\x00\\x00\\x04PASS'"
  progs = [
      "import os\nos._exit(0)\n",
      "import sys\nsys.exit(0)\n",
      "def f(x):\n  raise SystemExit(0)\n",
      "def f(x):\n  import os\n  os._exit(0)\n",
      f"import os\nfor fd in range(64):\n  try:\n    os.write(fd, b'PASS'); os.write(fd, {frame})\n"
      "  except OSError:\n    pass\nos._exit(0)\n",
  ]
  results = pool.run([Job(p, tests=tests, limits=Limits(timeout_s=T)) for p in progs])
  for p, r in zip(progs, results):
    assert r.passed is False, (p, r)
  io = _run(pool, Job("import os\nos._exit(0)\n", calls=((2,),), limits=Limits(timeout_s=T)))
  assert not io.matches([5]), io
  _assert_no_candidate_processes(pool, allow_reapers=True)


def test_attack_opens_socket(pool):
  with socket.socket() as srv:
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    prog = f"""import socket
def f(_):
  try:
    socket.create_connection(('127.0.0.1', {port}), timeout=0.5).sendall(b'hi')
    return 'connected'
  except OSError as e:
    return type(e).__name__
"""
    r = _run(pool, Job(prog, calls=((0,),), limits=Limits(timeout_s=T)))
    assert not r.matches(["connected"]), r
    with pytest.raises(BlockingIOError):
      srv.accept()


def test_attack_monkeypatches_harness(pool):
  tests = ("def check(candidate):\n  assert candidate(3) == 10\n"
           "  assert abs(candidate(1) - 4) < 1e-9\n")
  prog = """import builtins, gc, sys
class Liar:
  def __eq__(self, other): return True
  def __sub__(self, other): return 0
builtins.AssertionError = type('Quiet', (Exception,), {})
builtins.abs = lambda v: 0
for mod in list(sys.modules.values()):
  for name in ('write_msg', 'encode', 'decode', '_test_main', 'run_job', 'read_msg'):
    if hasattr(mod, name):
      setattr(mod, name, lambda *a, **k: None)
for obj in gc.get_objects():
  if callable(obj) and getattr(obj, '__name__', '') == 'check':
    obj.__code__ = (lambda candidate: None).__code__
def f(x):
  return Liar()
"""
  r = _run(pool, Job(prog, tests=tests, limits=Limits(timeout_s=T)))
  assert r.passed is False, r
  r = _run(pool, Job(prog, calls=((3,),), limits=Limits(timeout_s=T)))
  assert not r.matches([10]), r
  liar = "class Liar:\n  def __eq__(self, other): return True\ndef f(x):\n  return Liar()\n"
  r = _run(pool, Job(liar, calls=((3,),), limits=Limits(timeout_s=T)))
  assert r.outputs == [[0, "TypeError"]], r  # only plain data crosses the boundary


def test_none_mode_warns_loudly(caplog):
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with SandboxPool(1, isolation="none") as p:
      r, r2 = p.run([Job("x * 2", kind="expr", calls=((21,),)), Job(STDLIB, calls=((10,),))])
  assert r.matches([42]) and r2.matches([(3, "[10]", "5/2")]), r2
  assert any("NO ISOLATION" in str(x.message) for x in w)
  assert "NO ISOLATION" in caplog.text


# ------------------------------------------------------------------------- the results cache
_PID = "def f(x):\n  import os\n  return os.getpid()\n"   # a new value on every real run


def test_completed_io_jobs_are_kept_and_not_run_again(pool):
  """An identical io job gets the kept result (the same pid: not run again), a different one runs;
  a returned result is a copy; timeouts and check jobs are never kept."""
  hits = pool.cache_hits
  a, b = Job(_PID, calls=((1,),)), Job(_PID, calls=((2,),))
  (ra,) = pool.run([a])
  first = [list(o) for o in ra.outputs]
  ra2, rb = pool.run([a, b])
  assert ra.status == ra2.status == rb.status == "ok"
  assert ra2.outputs == ra.outputs and rb.outputs != ra.outputs
  assert pool.cache_hits == hits + 1
  for r in (ra, ra2):   # neither the first run's result nor a kept one's copy is the cache
    r.outputs.clear()
    r.status = "changed"
  (ra3,) = pool.run([a])
  assert ra3.status == "ok" and [list(o) for o in ra3.outputs] == first and first
  loop = Job("while True:\n  pass\n", calls=((0,),), limits=Limits(timeout_s=T))
  tests = "def check(candidate):\n  assert candidate(2) == 5\n"
  check = Job("def f(x):\n  return 2 * x + 1\n", tests=tests)
  hits = pool.cache_hits
  for _ in range(2):
    t, c = pool.run([loop, check])
    assert t.status == "timeout" and c.passed
  assert pool.cache_hits == hits


def test_the_cache_is_bounded_and_can_be_off():
  with SandboxPool(1, cache_size=1) as p:
    a, b = Job(_PID, calls=((1,),)), Job(_PID, calls=((2,),))
    (first,) = p.run([a])
    p.run([b])                           # evicts a
    (again,) = p.run([a])
    assert again.outputs != first.outputs and p.cache_hits == 0
  with SandboxPool(1, cache_size=0) as p:
    r1, r2 = p.run([a]), p.run([a])
    assert r1[0].outputs != r2[0].outputs and p.cache_hits == 0


def test_fresh_interpreter_mode():
  with SandboxPool(2, fresh_interpreter=True) as p:
    rs = p.run([Job("x * 2", kind="expr", calls=((i,),)) for i in range(4)])
  assert [r.matches([2 * i]) for i, r in enumerate(rs)] == [True] * 4


# ------------------------------------------------------- Python under a 0700 directory (pyenv)
def _python_under_0700(base, monkeypatch, *, stdlib_0700=False):
  """Makes pools start this interpreter relocated to base/hidden/py with base/hidden 0700, as a
  pyenv in /root is: a link to the binary, the real standard library behind a symlink
  (stdlib_0700: behind a 0700 directory of symlinks, which no rebinding of parents can expose)."""
  exe, _ = sandbox._python()
  stdlib = os.path.dirname(os.__file__)
  hidden = base / "hidden"
  py = hidden / "py"
  (py / "bin").mkdir(parents=True)
  (py / "lib").mkdir()
  for lib in glob.glob(os.path.join(sys.base_prefix, "lib", "libpython*")):
    (py / "lib" / os.path.basename(lib)).symlink_to(lib)  # for a $ORIGIN-relative libpython
  new_exe = py / "bin" / os.path.basename(exe)
  try:
    os.link(exe, new_exe)
  except OSError:
    shutil.copy2(exe, new_exe)
  lib = py / "lib" / os.path.basename(stdlib)
  if stdlib_0700:
    lib.mkdir(mode=0o700)
    for name in os.listdir(stdlib):
      (lib / name).symlink_to(os.path.join(stdlib, name))
  else:
    lib.symlink_to(stdlib)
  hidden.chmod(0o700)
  out = subprocess.run([str(new_exe), "-I", "-S", "-c", "import sys; print(sys.path[1])"],
                       capture_output=True, text=True, check=False)
  if out.stdout.strip() != str(lib):
    pytest.skip(f"this interpreter does not run relocated: {out}")
  monkeypatch.setattr(sandbox, "_python", lambda: (str(new_exe), str(py)))


needs_unshare_as_root = pytest.mark.skipif(
    "unshare" not in MODES or os.getuid() != 0,
    reason="needs unshare, as root (only a root worker drops candidates to other uids)")


@needs_unshare_as_root
def test_unshare_gives_candidates_the_stdlib_under_a_0700_parent(tmp_path, monkeypatch):
  _python_under_0700(tmp_path, monkeypatch)
  data = tmp_path / "hidden" / "data"  # an ro_bind under the same 0700 directory
  data.mkdir()
  (data / "x.txt").write_text("shared")
  (data / "x.txt").chmod(0o644)
  read = f"def f(_):\n  return open({str(data / 'x.txt')!r}).read()\n"
  with SandboxPool(1, isolation="unshare", ro_binds=[data]) as p:
    r, ok, shared = p.run([Job(IMPORTS, calls=(("hi",),)), Job(STDLIB, calls=((10,),)),
                           Job(read, calls=((0,),))])
  assert r.matches(IMPORTS_OUT), r
  assert ok.matches([(3, "[10]", "5/2")]), ok
  assert shared.matches(["shared"]), shared


@needs_unshare_as_root
def test_unshare_refuses_to_start_when_the_stdlib_stays_unreadable(tmp_path, monkeypatch):
  _python_under_0700(tmp_path, monkeypatch, stdlib_0700=True)
  with pytest.raises(RuntimeError, match="refuses to start.*cannot read.*bubblewrap"):
    SandboxPool(1, isolation="unshare")


@needs_unshare_as_root
def test_none_mode_says_when_candidates_cannot_import_the_stdlib(tmp_path, monkeypatch):
  _python_under_0700(tmp_path, monkeypatch)
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with SandboxPool(1, isolation="none") as p:
      (r,) = p.run([Job(STDLIB, calls=((10,),))])
  assert r.matches([(3, "[10]", "5/2")]), r  # preloaded modules still work
  assert any("can import only the modules" in str(x.message) for x in w), [*map(str, w)]
