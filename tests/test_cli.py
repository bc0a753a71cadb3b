"""The command line's surface: one-line user errors (exit 2), --debug tracebacks, `smjax --help`,
and INFO records going to the workdir's log file rather than the terminal; one run is stopped by
SIGTERM seconds into its base phase (exit 0, checkpoint saved)."""

import errno
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import cache_env
from study_runs import study_compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, SMJAX_CPU_MALLOC="glibc", JAX_PLATFORMS="cpu")


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(tmp_path_factory):
  """The runs of this module share the suite's study compilation cache (study_runs): the base
  and joint GRPO they run sample as test_experiment's miniature study does, so most of their
  programs are found there compiled (XLA_FLAGS: the suite's, conftest.py)."""
  ENV.update(cache_env(study_compilation_cache(tmp_path_factory)))


def _cli(*args, workdir):
  cmd = [sys.executable, "-m", "smjax.main", "--config=configs/study.py:two_domain,demo",
         f"--workdir={workdir}", *args]
  return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("arg, names", [("--config.heldout_size=0", "heldout_size"),
                                        ("--config.nope=1", "nope"),
                                        ("--config.rl.nope=1", "rl.nope"),
                                        ("--config.domains=('math','nodomain')", "nodomain"),
                                        ("--config.log_every=0", "config.log_every"),
                                        ("--config.eval.batch_size=0", "config.eval.batch_size"),
                                        ("--config.rl.advantage_mode=bogus",
                                         "config.rl.advantage_mode"),
                                        ("--config.rl.micro_batches=7",
                                         "config.rl.micro_batches=7 must divide")])
def test_user_error_is_one_line(tmp_path, arg, names):
  p = _cli(arg, workdir=tmp_path / "w")
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2, p.stderr
  assert len(lines) == 1 and lines[0].startswith("smjax: error: ") and names in lines[0], p.stderr
  assert "Traceback" not in p.stderr
  assert not (tmp_path / "w").exists()   # refused at start: no workdir left behind


def test_an_existing_file_as_workdir_is_one_line(tmp_path):
  """A workdir that cannot be created (works as root too, unlike a read-only directory)."""
  (tmp_path / "f").write_text("x")
  p = _cli(workdir=tmp_path / "f" / "w")
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert p.stderr.startswith("smjax: error: ") and "Traceback" not in p.stderr, p.stderr


def test_debug_shows_traceback(tmp_path):
  p = _cli("--config.heldout_size=0", "--debug", workdir=tmp_path / "w")
  assert p.returncode != 0 and "Traceback" in p.stderr


def test_console_help_lists_commands():
  code = "import sys; sys.argv = ['smjax', '--help']; from smjax.main import cli; cli()"
  p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 0 and "study" in p.stdout and "report" in p.stdout


def _smjax(*args, prelude=""):
  """The `smjax` console script's entry (smjax.main.cli) run with `args`, after `prelude`."""
  code = (f"{prelude}import sys; sys.argv = ['smjax', *{list(args)!r}]; "
          "from smjax.main import cli; cli()")
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True,
                        text=True, timeout=120)


@pytest.mark.parametrize("cmd, says", [
    (["-m", "smjax", "--help"], "usage: smjax <command>"),
    (["-m", "smjax", "study", "--help"], "usage: smjax study --config=FILE:ARG --workdir=DIR"),
    (["-m", "smjax", "study", "-h"], "usage: smjax study --config=FILE:ARG --workdir=DIR"),
    (["-m", "smjax.main", "--help"], "usage: smjax study --config=FILE:ARG --workdir=DIR"),
    (["-m", "smjax", "prepare", "--help"], "usage: smjax prepare "),
    (["-m", "smjax", "convert", "--help"], "usage: smjax convert "),
    (["-m", "smjax", "lend", "--help"], "usage: smjax lend "),
    (["-m", "smjax", "status", "--help"], "usage: smjax status ")])
def test_help_prints_the_usage_and_exits_0(cmd, says):
  """`--help` where the usage text sends the user: `smjax study --help`, `python -m smjax`."""
  p = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=ENV, capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 0 and p.stdout.startswith(says) and p.stderr == "", p.stderr


def test_version_prints_the_package_version():
  import tomllib  # pylint: disable=import-outside-toplevel
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    want = f"smjax {tomllib.load(f)['project']['version']}\n"
  for p in (_smjax("--version"), _smjax("study", "--version"),
            subprocess.run([sys.executable, "-m", "smjax.main", "--version"], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=120)):
    assert p.returncode == 0 and p.stdout == want and p.stderr == "", (p.stdout, p.stderr)


@pytest.mark.parametrize("arg, line", [
    ("--config.rl.learnig_rate=1", "--config.rl.learnig_rate: the config has no field "
     "'learnig_rate'; did you mean --config.rl.learning_rate?"),
    ("--config.rll.learning_rate=1", "--config.rll.learning_rate: the config has no field 'rll'; "
     "did you mean --config.rl.learning_rate?")])
def test_misspelt_field_is_one_clean_line_with_the_closest_field(tmp_path, arg, line):
  p = _cli(arg, workdir=tmp_path / "w")
  assert p.returncode == 2 and p.stderr == f"smjax: error: {line}\n", p.stderr


@pytest.mark.parametrize("args, missing", [
    (["--config=configs/study.py:two_domain,demo"], "--workdir is required"),
    (["--workdir=runs/nowhere"], "--config is required"),
    ([], "--config and --workdir are required")])
def test_missing_required_flag_is_one_line_exit_2(args, missing):
  p = _smjax("study", *args)
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert p.stderr.startswith(f"smjax: error: {missing}, e.g. --config=") and p.stdout == ""
  assert not os.path.exists(os.path.join(ROOT, "runs", "nowhere"))


def test_a_missing_config_file_is_named_before_a_missing_workdir(tmp_path):
  """ml_collections keeps a config file's load error for the config's first use: the study asks
  for it first, so the file the user mistyped is named, not the flag they have yet to add."""
  p = _smjax("study", f"--config={tmp_path / 'nope.py'}:two_domain")
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert p.stderr.startswith(f"smjax: error: config file {tmp_path / 'nope.py'}: no such file")


def test_rg_domain_without_reasoning_gym_names_the_extra(tmp_path):
  """reasoning-gym is an optional extra (installed here, so its import is made to fail): an
  `rg:` domain is refused in one line naming the extra, not a traceback."""
  p = _smjax("study", "--config=configs/study.py:two_domain,demo", f"--workdir={tmp_path / 'w'}",
             "--config.domains=('rg:basic_arithmetic','math')",
             prelude="import sys; sys.modules['reasoning_gym'] = None; ")
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert p.stderr.startswith("smjax: error: rg: domains need reasoning-gym") and \
      "pip install 'smjax[rg]'" in p.stderr, p.stderr
  assert not (tmp_path / "w").exists()


def test_info_goes_to_log_file_not_terminal(tmp_path, capsys):
  from absl import logging as absl_logging
  from smjax import main
  root = logging.getLogger()
  before = list(root.handlers)
  handler = absl_logging.get_absl_handler()
  level = handler.level
  try:
    path = main.setup_logging(str(tmp_path), verbose=False)
    absl_logging.info("an info record for the file")
    absl_logging.warning("a warning for both")
  finally:
    for h in root.handlers:
      if h not in before:
        h.close()
        root.removeHandler(h)
    handler.setLevel(level)
  text = open(path).read()
  assert "an info record for the file" in text and "a warning for both" in text
  assert "an info record for the file" not in capsys.readouterr().err


def test_bad_data_file_is_one_line_naming_file_and_line(tmp_path):
  """A JSONL domain with a non-UTF-8 byte on line 2: refused at start, one line naming the file
  and the line, and no workdir left behind."""
  bad = tmp_path / "math.jsonl"
  bad.write_bytes(b'{"question": "1+1?", "answer": "2"}\n{"question": "caf\xe9", "answer": "1"}\n')
  p = _cli(f"--config.domains=('jsonl_math:{bad}',)", "--config.band.check=False",
           workdir=tmp_path / "w")
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert f"{bad}:2: not UTF-8" in p.stderr and "Traceback" not in p.stderr, p.stderr
  assert not (tmp_path / "w").exists()


def test_workdir_of_another_study_is_refused_in_one_line_and_left_as_it_was(tmp_path):
  """A workdir whose config.json was written by a study with another base: refused before
  anything runs, naming the field, and its config.json is not overwritten."""
  import json  # pylint: disable=import-outside-toplevel
  from smjax.study.config import study_defaults  # pylint: disable=import-outside-toplevel
  wd = tmp_path / "w"
  wd.mkdir()
  other = study_defaults()
  other.base.steps = 7
  (wd / "config.json").write_text(json.dumps(other.to_dict()))
  before = (wd / "config.json").read_text()
  p = _cli(workdir=wd)
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert "holds another study" in p.stderr and "base.steps" in p.stderr, p.stderr
  assert (wd / "config.json").read_text() == before


def test_sigterm_during_the_base_saves_and_exits_0(tmp_path):
  """A SIGTERM while the base trains: the CLI saves a checkpoint where it is and exits 0 with the
  'stopped by SIGTERM' line, no traceback (smjax.preemption)."""
  import signal  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  wd = tmp_path / "w"
  cmd = [sys.executable, "-m", "smjax.main", "--config=configs/study.py:two_domain,demo",
         f"--workdir={wd}", "--config.phases=('base',)", "--config.base.steps=100000",
         "--config.base.batch_size=16", "--config.band.check=False", "--config.progress=False"]
  proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  ckpts = wd / "seed_0" / "base" / "checkpoints"
  deadline = time.monotonic() + 240
  while not ckpts.exists() and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.5)
  time.sleep(5)  # into the SFT steps (compiled, stepping)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=240)
  assert proc.returncode == 0, out[-2000:] + err[-2000:]
  assert "stopped by SIGTERM" in err and "Traceback" not in err, err[-2000:]
  saved = [p for p in ckpts.rglob("*") if p.is_dir() and p.name.isdigit()]
  assert saved and not list(ckpts.rglob("*.orbax-checkpoint-tmp*")), list(ckpts.rglob("*"))


# A base phase of a few steps on a small held-out set: seconds, and it writes checkpoints.
# Its SFT steps hold 16 rows and its evaluations and rollouts 4 prompts x 2 samples, as
# test_experiment's MINI does (their programs are found in the study compilation cache).
_QUICK_BASE = ("--config.phases=('base',)", "--config.base.steps=5", "--config.band.check=False",
               "--config.base.batch_size=16",
               "--config.heldout_size=16", "--config.stop_size=16", "--config.eval.samples=2",
               "--config.eval.batch_size=4", "--config.rl.prompts_per_step=4",
               "--config.rl.samples_per_prompt=2", "--config.report.bootstrap=100",
               "--config.progress=False")


def _one_error_line(p, *parts):
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith("smjax: error: "), p.stderr[-3000:]
  for part in parts:
    assert part in lines[0], (part, lines[0])
  return lines[0]


@pytest.fixture(scope="module")
def quick_base(tmp_path_factory):
  """A workdir whose base phase (_QUICK_BASE) has finished; tests work on copies of it."""
  wd = tmp_path_factory.mktemp("quick_base") / "w"
  p = _cli(*_QUICK_BASE, workdir=wd)
  assert p.returncode == 0, p.stderr[-3000:]
  return wd


def test_unreadable_parameters_of_a_finished_phase_are_one_line_and_left_in_place(tmp_path,
                                                                                  quick_base):
  """A finished base whose saved parameters were damaged (truncated array files): the rerun
  refuses in one line naming the phase directory and what to delete; nothing is moved aside.
  Before that, a garbled result.json and a garbled config.json in the same workdir: one line each
  naming the file and what to delete."""
  wd = tmp_path / "w"
  shutil.copytree(quick_base, wd)
  for name, fix in ((wd / "seed_0" / "base" / "result.json",
                     f"delete {wd / 'seed_0' / 'base'} to rerun phase 'base'"),
                    (wd / "config.json", "delete the workdir or use a fresh --workdir")):
    good = name.read_bytes()
    name.write_bytes(b'\xff{"truncated": ')
    _one_error_line(_cli(*_QUICK_BASE, workdir=wd), f"{name}: not UTF-8", fix)
    name.write_bytes(good)
  final = wd / "seed_0" / "base" / "final"
  data = [f for f in final.rglob("*") if f.is_file() and f.parent.name == "d"]
  assert data, sorted(final.rglob("*"))
  for f in data:
    f.write_bytes(f.read_bytes()[:7])
  before = sorted(str(f.relative_to(wd)) for f in wd.rglob("*") if f.name != "smjax.log")
  p = _cli(*_QUICK_BASE, workdir=wd)
  _one_error_line(p, "phase 'base' finished", "final parameters are unreadable", str(final),
                  f"delete {wd / 'seed_0' / 'base'} to rerun phase 'base'")
  assert "Traceback" not in p.stderr
  assert sorted(str(f.relative_to(wd)) for f in wd.rglob("*") if f.name != "smjax.log") == before


def test_a_collapsed_policy_ends_its_phase_and_the_report_says_so(tmp_path, quick_base):
  """A 5-step base scores nothing, so GRPO gets no reward and no gradient: the collapse guard
  ends joint GRPO after `collapse_window` steps as an outcome of that route (a study measures
  routes; one whose policy collapsed is a result, not a crash): one warning line naming the
  phase, the step and the sign, exit 0, the phase saved as finished (result.json: what a rerun
  reuses) with its collapse, and the report's verdicts saying it."""
  shutil.copytree(quick_base, tmp_path / "w")   # the finished base is reused
  wd = tmp_path / "w"
  args = ("--config.phases=('base', 'joint')", "--config.collapse_window=5")
  p = _cli(*_QUICK_BASE, *args, workdir=wd)
  assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
  assert "phase base: finished before, reused" not in p.stderr  # INFO: to the log file only
  assert "phase base: finished before, reused" in (wd / "smjax.log").read_text()
  warned = [ln for ln in p.stderr.splitlines() if "the policy collapsed at step" in ln]
  assert len(warned) == 1 and "joint_grpo" in warned[0] and "no sample has scored" in warned[0]
  assert "collapse_window=0 runs on" in warned[0], warned
  result = json.loads((wd / "seed_0" / "joint_grpo" / "result.json").read_text())
  fell = result["extra"]["collapsed"]
  assert fell["what"].startswith("no sample has scored and the gradient has been 0 for 5 steps")
  assert 5 <= fell["step"] < 100, fell      # ended there, not at its step cap
  assert result["curve"][-1]["step"] <= fell["step"] + 1, result["curve"][-1]
  report = json.loads((wd / "report" / "report.json").read_text())
  assert report["arms"]["joint_grpo"]["collapsed"] == [{"seed": 0} | fell]
  line = f"joint_grpo on seed 0 at step {fell['step']} (no sample has scored"
  assert any(v.startswith("Collapsed") and line in v for v in report["verdicts"]), report


def _private_mounts() -> list[str]:
  """The command that runs a shell script in a private mount namespace (root: unshare -m; else a
  user namespace too), or [] where this system allows neither."""
  cmd = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
  try:
    probe = subprocess.run(cmd + ["sh", "-c", "mount -t tmpfs tmpfs /mnt 2>/dev/null || "
                                  "mount -t tmpfs tmpfs /tmp"], capture_output=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return []
  return cmd if probe.returncode == 0 else []


def _cli_in_namespace(tmp_path, setup: str, *args, workdir: str):
  """The CLI run after `setup` (shell, run as root of a private mount namespace, with $M a fresh
  mount point under tmp_path) in that namespace."""
  ns = _private_mounts()
  if not ns:
    pytest.skip("no private mount namespace here (unshare): cannot make a full or read-only disk")
  m = tmp_path / "m"
  m.mkdir(parents=True)
  cli = shlex.join([sys.executable, "-m", "smjax.main",
                    "--config=configs/study.py:two_domain,demo", f"--workdir={workdir}", *args])
  script = f"set -e; M={m}; {setup}; set +e; {cli}; rc=$?; exit $rc"
  return subprocess.run(ns + ["sh", "-c", script], cwd=ROOT, env=ENV, capture_output=True,
                        text=True, timeout=300)


def test_full_disk_is_one_line_naming_where_it_was_writing(tmp_path):
  """A workdir on a 600 kB filesystem: the base's first checkpoint fills it. One line saying the
  disk is full and where, after orbax's background threads and TensorBoard's writer have all
  failed on it (their tracebacks go to the log file, which stops once it cannot be written).
  Which write fails first depends on the threads' timing: a checkpoint's names its directory;
  one to an open file names no file, and the line names the workdir."""
  p = _cli_in_namespace(tmp_path, "mount -t tmpfs -o size=600k tmpfs $M", *_QUICK_BASE,
                        workdir=f"{tmp_path}/m/w")
  _one_error_line(p, "disk full (no space left on device) writing ",
                  "give a --workdir on another disk")
  line = p.stderr.strip()
  assert (f"writing {tmp_path}/m/w/seed_0/base/checkpoints" in line
          or f"writing in {tmp_path}/m/w: " in line), line
  assert "Traceback" not in p.stderr
  # A full disk's error that names no file: the line names the run's workdir.
  from smjax.main import user_error  # pylint: disable=import-outside-toplevel
  full = OSError(errno.ENOSPC, "No space left on device")
  assert user_error(full, "/data/w") == ("disk full (no space left on device) writing in /data/w: "
                                         "free space or give a --workdir on another disk")
  assert "writing the workdir: " in user_error(full)


def test_read_only_workdir_is_one_line(tmp_path):
  """An existing workdir, and a new one, on a read-only filesystem (as root too)."""
  setup = "mount -t tmpfs tmpfs $M; mkdir $M/w; mount -o remount,ro,bind $M"
  for wd in ("w", "new"):
    p = _cli_in_namespace(tmp_path / wd, setup, *_QUICK_BASE, workdir=f"{tmp_path / wd}/m/{wd}")
    _one_error_line(p, "read-only file system: ", f"{tmp_path / wd}/m/{wd}",
                    "give a writable --workdir")
    assert "Traceback" not in p.stderr


def test_status_says_where_each_seeds_phases_stand(tmp_path):
  """`smjax status` on a hand-built workdir: a finished SFT phase, a finished RL phase at its cap
  and one stopped by its rule (lent by another workdir), one mid-run and written long ago
  (stopped, resuming from its checkpoint), one just started; a map lists each cell; what is not
  a workdir is a one-line error."""
  import json  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  from smjax.study.status import status  # pylint: disable=import-outside-toplevel
  now = time.time()

  def phase(root, name, result=None, steps=(), ckpt=(), age=0.0):
    d = root / name
    (d / "logs").mkdir(parents=True)
    if result is not None:
      (d / "result.json").write_text(json.dumps(result))
    if steps:
      m = d / "logs" / "metrics.jsonl"
      m.write_text("".join(json.dumps({"step": k, "heldout/math": .5}) + "\n" for k in steps))
      os.utime(m, (now - age, now - age))
    for k in ckpt:
      (d / "checkpoints" / "checkpoints" / str(k)).mkdir(parents=True)
    return d

  cell = tmp_path / "map" / "cell"
  seed = cell / "seed_0"
  seed.mkdir(parents=True)
  (cell / "config.json").write_text(json.dumps({
      "name": "regimes/cell", "base": {"steps": 900}, "joint": {"steps": 800},
      "experts": {"steps": 800}, "mopd": {"steps": 400}, "external": {"steps": 400}}))
  point = lambda step, mean: {"step": step, "flops": 1.0, "mean": mean}  # noqa: E731
  phase(seed, "base", {"curve": [point(900, .31)], "ledger": {"flops": {"base/sft": 5e12}},
                       "extra": {}})
  phase(seed, "joint_grpo", {"curve": [point(800, .979)], "extra": {"reached": False},
                             "ledger": {"flops": {"train/policy": 5e12, "rollout/decode": 4.6e11,
                                                  "eval/heldout": 9e12}}})
  other = phase(tmp_path / "study" / "seed_0", "mopd@0.9", {
      "curve": [point(108, .95)], "extra": {"reached": True}, "ledger": {"flops": {}}})
  os.symlink(other, seed / "mopd@0.9")
  # Its rule met at step 342, too late for the run-on to end it before its cap.
  phase(seed, "mopd", {"curve": [point(300, .7), point(342, .74), point(400, .75)],
                       "extra": {"reached": True, "stop_point": 1}, "ledger": {"flops": {}}})
  # Run on to its cap past its rule (external.to_cap): met at step 60, its run-on done at 90.
  phase(seed, "external_opd", {
      "curve": [point(60, .9), point(90, .92), point(400, .3)], "ledger": {"flops": {}},
      "extra": {"reached": True, "stop_point": 0, "rule_end": {
          "index": 1, "step": 90, "flops_by_phase": {}, "met": True}}})
  phase(seed, "expert_math", steps=(0, 5, 57), ckpt=(36, 42), age=3600)
  phase(seed, "expert_code")
  lines = status(str(cell), now)
  assert lines[0] == f"{cell} (regimes/cell): seeds 0" and lines[1].startswith(
      "seed_0: 5 of 7 started phases done"), lines
  by = {ln.split()[1]: ln for ln in lines[2:]}
  assert by["base"].split() == ["done", "base", "step", "900/900,", "no", "training", "FLOPs",
                                "charged,", "held-out", "31.0%"], by["base"]
  assert ("step 800/800 (at its cap), 5.46e+12 training FLOPs, held-out 97.9%"
          in by["joint_grpo"]), by["joint_grpo"]   # eval/* is not training
  assert "step 108/400 (stopped by its rule)" in by["mopd@0.9"]
  assert "step 400/400 (at its cap; its rule met at step 342)" in by["mopd"], by["mopd"]
  assert ("step 400/400 (at its cap; its rule met at step 60, which would have ended it at step "
          "90)") in by["external_opd"], by["external_opd"]
  assert by["mopd@0.9"].endswith(f"(lent by {(tmp_path / 'study').resolve()})"), by["mopd@0.9"]
  assert by["expert_math"].split()[0] == "stopped" and (
      "step 57/800, wrote 60 min ago, resumes from step 42" in by["expert_math"])
  assert by["expert_code"].split()[0] == "started" and "nothing written yet" in by["expert_code"]
  # Written a moment ago: running.
  os.utime(seed / "expert_math" / "logs" / "metrics.jsonl", (now - 5, now - 5))
  assert any(ln.split()[:2] == ["running", "expert_math"] for ln in status(str(cell), now))
  # Written "after" now (a time a hair past the clock's, or a bucket's clock ahead of this
  # machine's): "0 s ago", not "-0 s ago" or "-5 s ago".
  os.utime(seed / "expert_math" / "logs" / "metrics.jsonl", (now + 5, now + 5))
  assert any(ln.split()[:2] == ["running", "expert_math"] and "wrote 0 s ago" in ln
             for ln in status(str(cell), now))
  # A seed whose process failed: its log's last line, the one-line error.
  (cell / "seed_0.log").write_text("phase base: done\nsmjax: error: seed_0/base/result.json: "
                                   "not valid JSON\n")
  assert status(str(cell), now)[-1] == (
      f"  its log ({cell / 'seed_0.log'}) ends with an error: smjax: error: "
      "seed_0/base/result.json: not valid JSON")
  (cell / "seed_0.log").write_text("phase base: done\njoint_grpo step 5/800\n")
  assert "ends with an error" not in status(str(cell), now)[-1]
  # The map: each cell (a directory holding a config.json), through the console script; a cell
  # whose `make regimes` log (<map>/<cell>.log) ends with an error shows it.
  (tmp_path / "map" / "cell.log").write_text("smjax: error: seed 1: base outside its band\n")
  # ... without jax: what only reads a workdir starts in a fraction of a second.
  p = _smjax("status", str(tmp_path / "map"), prelude=(
      "import atexit; atexit.register(lambda: print('jax imported:', 'jax' in sys.modules, "
      "file=sys.stderr)); "))
  assert p.returncode == 0 and p.stdout.startswith(f"{cell} (regimes/cell)"), p.stderr
  assert p.stderr.strip() == "jax imported: False", p.stderr
  assert p.stdout.rstrip().endswith("ends with an error: smjax: error: seed 1: base outside its "
                                    "band"), p.stdout
  for bad, says in ((tmp_path / "nowhere", "no such workdir"), (tmp_path, "neither a study's")):
    p = _smjax("status", str(bad))
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and says in p.stderr, p.stderr
