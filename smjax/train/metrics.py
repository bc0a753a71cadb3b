"""Metrics out of the host loop: TensorBoard event files and a JSONL stream, one call per step.

TensorBoard files are written with tensorboardX (no TensorFlow needed): `tensorboard --logdir DIR`.
The JSONL file (`metrics.jsonl`) is what the report and the tests read back.
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping

import numpy as np


class MetricsWriter:
  """Writes scalar metrics to `<logdir>/metrics.jsonl` and TensorBoard events in `<logdir>`."""

  def __init__(self, logdir: str, *, tensorboard: bool = True):
    os.makedirs(logdir, exist_ok=True)
    self.logdir = logdir
    self._jsonl = open(os.path.join(logdir, "metrics.jsonl"), "a")
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self._tb = SummaryWriter(logdir, flush_secs=30)

  def write(self, step: int, metrics: Mapping[str, float], **extra) -> None:
    row = {"step": int(step)}
    for k, v in metrics.items():
      v = float(np.asarray(v))
      row[k] = v if math.isfinite(v) else str(v)
      if self._tb is not None and math.isfinite(v):
        self._tb.add_scalar(k, v, int(step))
    row.update(extra)
    self._jsonl.write(json.dumps(row) + "\n")
    self._jsonl.flush()

  def keep_only(self, keep) -> None:
    """Drops the rows of metrics.jsonl for which `keep(row)` is False (atomically): a resumed
    run drops what the steps after its checkpoint logged before they are run, and logged, again,
    so every step is in the file once. (TensorBoard shows the newest value of a step.)"""
    path = os.path.join(self.logdir, "metrics.jsonl")
    self._jsonl.close()
    with open(path) as f:
      rows = [line for line in f if line.strip() and keep(json.loads(line))]
    with open(path + ".tmp", "w") as f:
      f.writelines(rows)
    os.replace(path + ".tmp", path)
    self._jsonl = open(path, "a")

  def close(self) -> None:
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
