"""SIGTERM as a flag the training loop polls: preempted TPU/spot VMs save and exit cleanly."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any, Sequence

import jax
import numpy as np


class PreemptionGuard:
  """Turns SIGTERM (by default) into a flag the loop polls at step boundaries.

  The handler only records the signal: saving from inside a signal handler could interleave with
  a jitted step or an orbax save. The loop calls `should_stop()` after each step, saves and exits
  0. With several processes `should_stop` ORs the flag over all of them (one tiny all-gather), so
  every host stops at the same step. Previous handlers are restored on exit.
  """

  def __init__(self, signals: Sequence[int] = (signal.SIGTERM,)):
    self.signals = tuple(signals)
    self.received: int | None = None
    self._previous: dict[int, Any] = {}
    self._logged = False

  def __enter__(self) -> "PreemptionGuard":
    if threading.current_thread() is not threading.main_thread():
      raise RuntimeError("PreemptionGuard must be entered on the main thread (signal handlers "
                         "can only be installed there)")
    for sig in self.signals:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()

  def _handle(self, signum, frame) -> None:  # pylint: disable=unused-argument
    self.received = signum

  def should_stop(self) -> bool:
    stop = self.received is not None
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      stop = bool(np.any(multihost_utils.process_allgather(np.array(stop))))
    if stop and not self._logged:
      self._logged = True
      logging.warning("preemption requested (signal %s): stopping at this step boundary",
                      self.received)
    return stop
