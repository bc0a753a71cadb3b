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

  Signal handlers can only be installed on the main thread. A loop running in another thread
  (phases side by side, smjax.study.run) follows the guard the main thread holds around the
  threads: its `should_stop` sees that guard's signal.
  """

  _held: "PreemptionGuard | None" = None   # the innermost guard the main thread holds

  def __init__(self, signals: Sequence[int] = (signal.SIGTERM,)):
    self.signals = tuple(signals)
    self.received: int | None = None
    self._previous: dict[int, Any] = {}
    self._logged = False
    self._follows: PreemptionGuard | None = None
    self._outer: PreemptionGuard | None = None

  def __enter__(self) -> "PreemptionGuard":
    if threading.current_thread() is not threading.main_thread():
      if PreemptionGuard._held is None:
        raise RuntimeError("PreemptionGuard: a loop in another thread needs the main thread to "
                           "hold a guard around it (signal handlers can only be installed there)")
      self._follows = PreemptionGuard._held
      return self
    for sig in self.signals:
      self._previous[sig] = signal.signal(sig, self._handle)
    self._outer, PreemptionGuard._held = PreemptionGuard._held, self
    return self

  def __exit__(self, *exc) -> None:
    if self._follows is not None:
      self._follows = None
      return
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()
    PreemptionGuard._held, self._outer = self._outer, None

  def _handle(self, signum, frame) -> None:  # pylint: disable=unused-argument
    self.received = signum

  def should_stop(self) -> bool:
    if self._follows is not None and self.received is None:
      self.received = self._follows.received
    stop = self.received is not None
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      stop = bool(np.any(multihost_utils.process_allgather(np.array(stop))))
    if stop and not self._logged:
      self._logged = True
      logging.warning("preemption requested (signal %s): stopping at this step boundary",
                      self.received)
    return stop
