"""The command line's surface: one-line user errors (exit 2), --debug tracebacks, `smjax --help`,
and INFO records going to the workdir's log file rather than the terminal; one run is stopped by
SIGTERM seconds into its base phase (exit 0, checkpoint saved)."""

import logging
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, SMJAX_CPU_MALLOC="glibc", JAX_PLATFORMS="cpu")


def _cli(*args, workdir):
  cmd = [sys.executable, "-m", "smjax.main", "--config=configs/study.py:two_domain,demo",
         f"--workdir={workdir}", *args]
  return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("arg, names", [("--config.heldout_size=0", "heldout_size"),
                                        ("--config.nope=1", "nope"),
                                        ("--config.rl.nope=1", "rl.nope"),
                                        ("--config.domains=('math','nodomain')", "nodomain")])
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
         "--config.band.check=False", "--config.progress=False"]
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
