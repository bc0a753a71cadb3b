"""Metrics out of the host loop: TensorBoard event files and a JSONL stream, one call per step.

TensorBoard files are written with tensorboardX (no TensorFlow needed): `tensorboard --logdir DIR`.
The JSONL file (`metrics.jsonl`) is what the report and the tests read back. Both go through
smjax.paths, so `logdir` may be local or on a bucket (gs://): an object store cannot append, so
there both files are kept in memory and rewritten whole every `flush_secs` and on close (a run
killed on a bucket loses at most that much of its metrics). On a multi-host run only process 0
writes; the others' writers do nothing.

With `wandb=` a MetricsWriter also sends its scalars and texts to a Weights & Biases run
(`WandbWriter`, the optional `wandb` extra). A run without a progress bar prints `MetricLines`:
one plain line every few steps and one per evaluation, on stdout.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import math
import sys
import threading
import time
from typing import Any, Mapping

import numpy as np

from smjax import distributed, paths


_IMPORT_LOCK = threading.Lock()


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch. tensorboardX imports torch wherever it
  is installed, only so that it can take torch tensors (a writer here is given floats and
  strings); that import costs a run about 2 s and a few hundred MB. While tensorboardX loads,
  `import torch` fails as if torch were absent (tensorboardX falls back to numpy); a process
  that has imported torch already keeps it, and torch imports as usual afterwards."""
  with _IMPORT_LOCK:
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      return SummaryWriter
    sys.modules["torch"] = None   # type: ignore[assignment]  # `import torch`: ImportError
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    finally:
      if "torch" in sys.modules and sys.modules["torch"] is None:
        del sys.modules["torch"]
    return SummaryWriter


class MetricsWriter:
  """Writes scalar metrics to `<logdir>/metrics.jsonl` and TensorBoard events in `<logdir>`."""

  def __init__(self, logdir: str, *, tensorboard: bool = True, flush_secs: float = 30.0,
               wandb: Mapping[str, Any] | None = None):
    """`wandb`: WandbWriter's arguments (project, name, ...) to send every row to a Weights &
    Biases run as well (its files under `logdir` when that is local); None: no wandb."""
    self.logdir = logdir
    self.path = paths.join(logdir, "metrics.jsonl")
    self._on = distributed.is_coordinator()
    self._remote = paths.is_url(logdir)
    self._lines: list[str] = []   # on a bucket: the file's lines, rewritten whole
    self._flush_secs, self._flushed = flush_secs, time.monotonic()
    self._jsonl = None
    self._tb = None
    self._wandb = None
    if not self._on:
      return
    paths.makedirs(logdir)
    if self._remote:
      if paths.exists(self.path):
        self._lines = paths.read_text(self.path).splitlines(keepends=True)
    else:
      self._jsonl = paths.open_append(self.path)
    if tensorboard:
      SummaryWriter = _summary_writer_class()  # pylint: disable=invalid-name
      if self._remote:
        _register_tensorboard_scheme(logdir)
      self._tb = SummaryWriter(logdir, flush_secs=flush_secs)
    if wandb is not None:
      self._wandb = WandbWriter(**({"local_dir": None if self._remote else logdir} | dict(wandb)))

  def write(self, step: int, metrics: Mapping[str, float], *,
            texts: Mapping[str, str] | None = None, **extra) -> None:
    """One row of `metrics` (scalars: TensorBoard scalars too), `texts` (TensorBoard text, e.g.
    sample completions) and `extra` (JSON values, in metrics.jsonl only) at `step`."""
    if not self._on:
      return
    row, scalars = {"step": int(step)}, {}
    for k, v in metrics.items():
      v = float(np.asarray(v))
      row[k] = v if math.isfinite(v) else str(v)
      if math.isfinite(v):
        scalars[k] = v
        if self._tb is not None:
          self._tb.add_scalar(k, v, int(step))
    for k, v in (texts or {}).items():
      row[k] = v
      if self._tb is not None:
        self._tb.add_text(k, v, int(step))
    if self._wandb is not None:
      self._wandb.log(int(step), scalars, texts or {})
    row.update(extra)
    line = json.dumps(row) + "\n"
    if self._remote:
      self._lines.append(line)
      if time.monotonic() - self._flushed >= self._flush_secs:
        self._flush()
    else:
      self._jsonl.write(line)
      self._jsonl.flush()

  def _flush(self) -> None:
    paths.write_atomic(self.path, "".join(self._lines))
    self._flushed = time.monotonic()

  def keep_only(self, keep) -> None:
    """Drops the rows of metrics.jsonl for which `keep(row)` is False (atomically): a resumed
    run drops what the steps after its checkpoint logged before they are run, and logged, again,
    so every step is in the file once. (TensorBoard shows the newest value of a step; a wandb
    run keeps both.)"""
    if not self._on:
      return
    if self._remote:
      self._lines = [line for line in self._lines if line.strip() and keep(json.loads(line))]
      self._flush()
      return
    self._jsonl.close()
    rows = [line for line in paths.read_text(self.path).splitlines(keepends=True)
            if line.strip() and keep(json.loads(line))]
    paths.write_atomic(self.path, "".join(rows))
    self._jsonl = paths.open_append(self.path)

  def close(self, *, failed: bool = False) -> None:
    """Closes the files (and the wandb run: `failed` marks it so, exit code 1)."""
    if self._jsonl is not None:
      self._jsonl.close()
    elif self._remote and self._on:
      self._flush()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close(failed=failed)
      self._wandb = None

  def __enter__(self):
    return self

  def __exit__(self, exc_type, *exc):
    # A SIGTERM's stop (SystemExit, smjax.preemption) is a run to resume, not a failed one.
    self.close(failed=exc_type is not None and not issubclass(exc_type, SystemExit))


# --------------------------------------------------------------------------- Weights & Biases

def require_wandb():
  """The `wandb` module; MissingExtraError, one line naming the extra, where it is not installed
  (a study checks this at its start when config.wandb.project is set, before any work)."""
  try:
    import wandb  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    from smjax.domains.base import MissingExtraError  # pylint: disable=import-outside-toplevel
    raise MissingExtraError(
        f"config.wandb.project is set, but wandb is not installed ({e}); install it with: "
        "pip install 'smjax[wandb]', or leave config.wandb.project empty") from e
  return wandb


def wandb_run_id(*parts: str) -> str:
  """A stable wandb run id for a phase (its work dir's path, its name): a resumed or rerun phase
  logs into the run it started."""
  return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:16]


class WandbWriter:
  """One Weights & Biases run that gets what MetricsWriter.write writes: the finite scalars (as
  TensorBoard does) and the texts (sample completions, as HTML), against an x-axis of their own,
  "step" (`define_metric`): a phase logs an evaluation at its steps done before the training row
  of the step index below it, which wandb's own step, strictly increasing, would drop.
  `run_id`: a stable id (`wandb_run_id`), so that a resumed phase continues its run
  (resume="allow"; the steps it logs again then show twice: wandb cannot drop rows as
  MetricsWriter.keep_only drops them from metrics.jsonl). `local_dir`: where wandb keeps its
  files (None: wandb's default, ./wandb or $WANDB_DIR). WANDB_MODE=offline runs without the
  network (`wandb sync` uploads later)."""

  def __init__(self, *, project: str, name: str, group: str = "", entity: str = "",
               run_id: str = "", config: Mapping[str, Any] | None = None,
               local_dir: str | None = None):
    self._wandb = require_wandb()
    self.run = self._wandb.init(project=project, entity=entity or None, group=group or None,
                                name=name, id=run_id or None,
                                resume="allow" if run_id else None, config=dict(config or {}),
                                dir=local_dir)
    self.run.define_metric("step")
    self.run.define_metric("*", step_metric="step")

  def log(self, step: int, scalars: Mapping[str, float], texts: Mapping[str, str]) -> None:
    row: dict[str, Any] = {"step": int(step), **scalars}
    for k, v in texts.items():
      row[k] = self._wandb.Html(f"<pre>{html.escape(v)}</pre>")
    self.run.log(row)

  def close(self, *, failed: bool = False) -> None:
    self.run.finish(exit_code=1 if failed else 0)


# ------------------------------------------------------------------------- terminal lines

def progress_bar_shown(progress: bool) -> bool:
  """Whether a loop shows a progress bar: `progress` asked for one and stderr (tqdm's stream) is
  a terminal or a notebook's. Without one it prints `MetricLines` instead, so that a log file
  (`make study`, a TPU pod's) gets plain lines, not a bar's carriage returns."""
  isatty = getattr(sys.stderr, "isatty", None)
  return bool(progress) and (bool(isatty and isatty()) or _in_notebook())


def _in_notebook() -> bool:
  """Whether this process is a notebook's kernel (Jupyter, Colab), not merely one that imported
  ipykernel (a test suite's earlier module, a library)."""
  if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
    return False
  try:
    from ipykernel.zmqshell import ZMQInteractiveShell  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  return isinstance(sys.modules["IPython"].get_ipython(), ZMQInteractiveShell)


def sci(x: float) -> str:
  """A FLOP count or a rate in two digits, `2.3e12` (no `+` or leading 0 in the exponent)."""
  if not math.isfinite(x) or x == 0:
    return f"{x:g}"
  mant, _, exp = f"{x:.1e}".partition("e")
  return f"{mant}e{int(exp)}"


class MetricLines:
  """Plain metric lines on stdout for a phase that shows no progress bar (`progress_bar_shown`),
  so that a headless run (config.progress=False, `make study`, a TPU pod) can be watched in its
  log: one line on the first step, every `every` steps (steps done) and on the last,

    joint_grpo step 125/800  reward 0.61  acc(stop) 0.58  kl(ref) 0.012  tok/s 3.1e3  flops 2.3e12

  (the figures a step has: reward, an SFT step's loss and token accuracy, the last evaluation's
  mean accuracy on the stop set, or the held-out set without one, GRPO's KL to its reference when
  it has one, OPD's reverse KL to its teachers; tokens per second over the steps since the last
  line; cumulative training FLOPs), and one line per evaluation,

    joint_grpo eval step 125/800  acc math 0.610 code 0.550 mean 0.580  acc(stop) 0.570  flops ...

  `on=False` (a bar is shown, or not process 0 of a multi-host run) prints nothing. Each line is
  flushed: stdout into a file is block-buffered."""

  def __init__(self, phase: str, total: int, every: int, *, on: bool, last_point=None):
    self.phase, self.total, self.every = phase, int(total), max(1, int(every))
    self.on = bool(on) and distributed.is_coordinator()
    self.acc: tuple[str, float] | None = None   # the last evaluation's (label, mean accuracy)
    if last_point is not None:                  # a resumed run: its last curve point
      self._note(last_point)
    self._tokens = self._seconds = 0.0

  def _print(self, line: str) -> None:
    print(line, file=sys.stdout, flush=True)

  def _note(self, point: Mapping) -> None:
    stop = (point.get("stop") or {}).get("accuracy")
    acc = stop or point.get("accuracy") or {}
    if acc:
      self.acc = ("stop" if stop else "heldout", float(np.mean(list(acc.values()))))

  def step(self, done: int, metrics: Mapping[str, float], *, flops: float, tokens: float = 0.0,
           seconds: float = 0.0, last: bool = False) -> str | None:
    """Step `done` (steps done, 1-based) took `seconds` and `tokens`; its line, printed and
    returned, when it is the first, a multiple of `every`, the last (`last`, or `done` reaches
    the total); else None."""
    if not self.on:
      return None
    self._tokens += float(tokens)
    self._seconds += float(seconds)
    if not (done == 1 or done % self.every == 0 or done >= self.total or last):
      return None
    m = metrics
    parts = [f"{self.phase} step {done}/{self.total}"]
    if "reward/mean" in m:
      parts.append(f"reward {m['reward/mean']:.2f}")
    if "token_accuracy" in m:
      parts.append(f"loss {m['loss']:.3f}  acc(token) {m['token_accuracy']:.2f}")
    if self.acc is not None:
      parts.append(f"acc({self.acc[0]}) {self.acc[1]:.2f}")
    if "reverse_kl" in m:
      parts.append(f"kl(teacher) {m['reverse_kl']:.3g}")
    elif m.get("kl_mean"):       # GRPO with a reference (rl.beta > 0); 0 without one
      parts.append(f"kl(ref) {m['kl_mean']:.3g}")
    if self._seconds > 0 and self._tokens > 0:
      parts.append(f"tok/s {sci(self._tokens / self._seconds)}")
    parts.append(f"flops {sci(flops)}")
    self._tokens = self._seconds = 0.0
    line = "  ".join(parts)
    self._print(line)
    return line

  def evaluation(self, done: int, point: Mapping, *, flops: float) -> str | None:
    """The line of an evaluation after `done` steps (`point`: {"accuracy": {domain: acc}, and
    "stop": {"accuracy": ...} with a stop set}); printed and returned (None when off). Later
    step lines show its mean accuracy."""
    self._note(point)
    if not self.on:
      return None
    from smjax.domains import domain_label  # pylint: disable=import-outside-toplevel
    acc = point["accuracy"]
    parts = [f"{self.phase} eval step {done}/{self.total}",
             "acc " + " ".join(f"{domain_label(d)} {a:.3f}" for d, a in acc.items()) +
             (f" mean {float(np.mean(list(acc.values()))):.3f}" if len(acc) > 1 else "")]
    stop = (point.get("stop") or {}).get("accuracy")
    if stop:
      parts.append(f"acc(stop) {float(np.mean(list(stop.values()))):.3f}")
    parts.append(f"flops {sci(flops)}")
    line = "  ".join(parts)
    self._print(line)
    return line


class _EventFile:
  """A TensorBoard event file on a bucket (tensorboardX's record writer for a URL): its records
  kept in memory and uploaded whole at each flush, through smjax.paths."""

  def __init__(self, path: str):
    self.path = path
    self.buffer = io.BytesIO()

  def write(self, data: bytes) -> None:
    self.buffer.write(data)

  def flush(self) -> None:
    paths.write_atomic(self.path, self.buffer.getvalue())

  def close(self) -> None:
    self.flush()


class _EventFiles:
  """tensorboardX's writer factory for a URL scheme: `_EventFile`s, no directories."""

  def open(self, path: str) -> _EventFile:
    return _EventFile(path)

  def directory_check(self, path: str) -> None:
    pass


def _register_tensorboard_scheme(logdir: str) -> None:
  """Routes tensorboardX's event files under `logdir`'s URL scheme through smjax.paths (in place
  of its own gs:// writer, which needs google-cloud-storage's credentials and client)."""
  from tensorboardX import record_writer  # pylint: disable=import-outside-toplevel
  record_writer.register_writer_factory(logdir.split("://", 1)[0], _EventFiles())
