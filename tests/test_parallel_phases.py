"""Phases side by side (config.parallel_phases; smjax.study.run._side_by_side): in threads, in
order, errors raised; SIGTERM reaches a loop in a thread through the main thread's guard. (The
miniature study runs the demo config, whose experts and MOPD runs are side by side; its curves
and FLOP ledgers were checked equal to a run one phase at a time when this landed.)"""

import os
import signal
import threading
import time

import pytest

from smjax.preemption import PreemptionGuard
from smjax.study.run import _side_by_side


def test_side_by_side_runs_at_once_and_keeps_the_order():
  both = threading.Barrier(2, timeout=20)   # passes only if the two calls overlap

  def fn(x):
    both.wait()
    return x * 10
  assert _side_by_side(fn, [1, 2], workers=2) == [10, 20]
  assert _side_by_side(lambda x: x + 1, [1, 2, 3], workers=1) == [2, 3, 4]


def test_side_by_side_raises_the_first_error_after_the_others_finish():
  done = []

  def fn(x):
    if x == 0:
      raise ValueError("phase 0 failed")
    time.sleep(0.2)
    done.append(x)
    return x
  with pytest.raises(ValueError, match="phase 0 failed"):
    _side_by_side(fn, [0, 1], workers=2)
  assert done == [1]


def test_a_guard_in_a_thread_follows_the_main_threads():
  seen = {}

  def loop():
    with PreemptionGuard() as g:
      deadline = time.time() + 20
      while not g.should_stop() and time.time() < deadline:
        time.sleep(0.01)
      seen["stopped"] = g.received

  with PreemptionGuard():
    t = threading.Thread(target=loop)
    t.start()
    time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGTERM)
    t.join(30)
  assert seen["stopped"] == signal.SIGTERM
  # Without a guard held by the main thread, a thread cannot install one: one clear error.
  errors = []

  def alone():
    try:
      with PreemptionGuard():
        pass
    except RuntimeError as e:
      errors.append(str(e))
  t = threading.Thread(target=alone)
  t.start()
  t.join(10)
  assert errors and "main thread to hold a guard" in errors[0]


@pytest.fixture
def python_ctrl_c():
  """Python's own Ctrl-C handler for the test, whatever this process inherited: a suite started
  in the background of a non-interactive shell (`cmd &`) starts with SIGINT ignored."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_the_phases_in_threads_at_their_next_step(python_ctrl_c):
  """Only the main thread gets KeyboardInterrupt: the threads' loops see it through the guard,
  stop (as at SIGTERM, saved), and the interrupt is raised once they have."""
  stopped = []

  def phase(x):
    if x == 0:
      time.sleep(0.3)   # the main thread is waiting on the phases by now
      os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C: delivered to the main thread
    with PreemptionGuard() as g:
      deadline = time.time() + 20
      while not g.should_stop() and time.time() < deadline:
        time.sleep(0.01)
      stopped.append(g.received)
  with pytest.raises(KeyboardInterrupt):
    _side_by_side(phase, [0, 1], workers=2)
  assert stopped == [signal.SIGINT, signal.SIGINT]
