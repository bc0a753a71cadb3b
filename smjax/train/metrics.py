"""Metrics out of the host loop: TensorBoard event files and a JSONL stream, one call per step.

TensorBoard files are written with tensorboardX (no TensorFlow needed): `tensorboard --logdir DIR`.
The JSONL file (`metrics.jsonl`) is what the report and the tests read back. Both go through
smjax.paths, so `logdir` may be local or on a bucket (gs://): an object store cannot append, so
there both files are kept in memory and rewritten whole every `flush_secs` and on close (a run
killed on a bucket loses at most that much of its metrics). On a multi-host run only process 0
writes; the others' writers do nothing.
"""

from __future__ import annotations

import io
import json
import math
import time
from typing import Mapping

import numpy as np

from smjax import distributed, paths


class MetricsWriter:
  """Writes scalar metrics to `<logdir>/metrics.jsonl` and TensorBoard events in `<logdir>`."""

  def __init__(self, logdir: str, *, tensorboard: bool = True, flush_secs: float = 30.0):
    self.logdir = logdir
    self.path = paths.join(logdir, "metrics.jsonl")
    self._on = distributed.is_coordinator()
    self._remote = paths.is_url(logdir)
    self._lines: list[str] = []   # on a bucket: the file's lines, rewritten whole
    self._flush_secs, self._flushed = flush_secs, time.monotonic()
    self._jsonl = None
    self._tb = None
    if not self._on:
      return
    paths.makedirs(logdir)
    if self._remote:
      if paths.exists(self.path):
        self._lines = paths.read_text(self.path).splitlines(keepends=True)
    else:
      self._jsonl = paths.open_append(self.path)
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      if self._remote:
        _register_tensorboard_scheme(logdir)
      self._tb = SummaryWriter(logdir, flush_secs=flush_secs)

  def write(self, step: int, metrics: Mapping[str, float], *,
            texts: Mapping[str, str] | None = None, **extra) -> None:
    """One row of `metrics` (scalars: TensorBoard scalars too), `texts` (TensorBoard text, e.g.
    sample completions) and `extra` (JSON values, in metrics.jsonl only) at `step`."""
    if not self._on:
      return
    row = {"step": int(step)}
    for k, v in metrics.items():
      v = float(np.asarray(v))
      row[k] = v if math.isfinite(v) else str(v)
      if self._tb is not None and math.isfinite(v):
        self._tb.add_scalar(k, v, int(step))
    for k, v in (texts or {}).items():
      row[k] = v
      if self._tb is not None:
        self._tb.add_text(k, v, int(step))
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
    so every step is in the file once. (TensorBoard shows the newest value of a step.)"""
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

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    elif self._remote and self._on:
      self._flush()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


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
