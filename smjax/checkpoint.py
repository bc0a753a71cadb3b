"""Preemption-safe checkpoints on orbax: save everything a run needs, resume exactly, skip bad ones.

A checkpoint at loop step `s` holds two orbax items under `<workdir>/checkpoints/<s>/`:
  - `state`: the whole TrainState pytree (params, optimiser state, step), saved with its shardings;
  - `meta` (JSON): the RNG (a jax key as raw key data, and/or a numpy Generator's state), the
    data-iterator state (e.g. grain `get_state()`: any JSON-able object or bytes), the FLOP ledger
    (a dict or an object with `to_dict()`), the config, recent metrics (`extra`), the held-out
    metric, the tree signature of `state` and a per-leaf bit checksum of every array.

Kept: the last `max_to_keep` steps, plus the best one by the metric passed to `save` (`keep_best`).

Resume (`restore_latest`) walks the steps newest first. A step whose files cannot be read, whose
JSON is garbage, or whose arrays do not match their checksums (orbax restores a wrong value stored
in well-formed files silently; the checksum catches it) is reported with `logging.warning` naming
the step and the fault, moved to `<workdir>/checkpoints_corrupt/`, and the previous step is tried
(and nothing else is printed: orbax's abandoned reads are drained, see `_draining_failed_reads`).
A save cut short (kill -9) leaves an orbax `<s>.orbax-checkpoint-tmp-*` folder: it is reported and
removed when the Checkpointer opens. A config that differs from the checkpoint's in a field that is
not run-neutral is refused with `ConfigMismatchError` listing `field: old -> new`.

Async saving and donated state: orbax's `save` copies every array to host memory (numpy) before it
returns, on the calling thread (`replica_slices.transfer_arrays_to_host`, which blocks on
`np.asarray`); only the file writes happen in the background. The next jitted step may therefore
donate the state right after `save` returns. On CPU, where that numpy copy can alias the device
buffer, XLA skips the donation while orbax still holds the alias (measured with jax 0.10.2 /
orbax 0.12.8: the donated input is not deleted and the saved bytes are unchanged);
tests/test_checkpoint.py checks this end to end.

Typical loop (PreemptionGuard: smjax.preemption):

    ckpt = Checkpointer(workdir, max_to_keep=3, async_save=True, config=cfg_dict)
    restored = ckpt.restore_latest(state)        # None on a fresh run
    if restored: state, key, it_state = restored.state, restored.rng, restored.data_state
    with PreemptionGuard() as guard:
      for step in range(start, total):
        ...
        if step % every == 0 or guard.should_stop():
          ckpt.save(step, state, rng=key, data_state=it.get_state(), ledger=ledger, metric=acc)
        if guard.should_stop(): break
    ckpt.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as ocp_policy

from smjax import paths
from smjax.checkpoint_meta import (_abstract, _checksum_dict, _host_rng_from_json,
                                   _host_rng_to_json, _rng_from_json, _rng_to_json, _signature)
from smjax.json_io import config_diff, from_json, one_line, to_json

FORMAT_VERSION = 1

# Config fields that change how a run is watched, not what it computes. An entry matches a
# dotted field path equal to it, ending in ".<entry>", or under "<entry>." (a whole sub-config).
DEFAULT_RUN_NEUTRAL_FIELDS: tuple[str, ...] = (
    "workdir", "logdir", "log_dir", "log_every", "eval_every", "checkpoint_every",
    "checkpoint_seconds", "checkpoint_max_to_keep", "checkpoint_keep_best", "async_checkpointing",
    "progress_bar", "tensorboard", "profile", "profile_steps", "verbose", "notes",
)

_TMP_DIR = re.compile(r"^(?:.*_)?(\d+)\.orbax-checkpoint-tmp")
# Two CheckpointManagers saving at once in one process (phases side by side in threads,
# smjax.study.run._side_by_side) break orbax 0.12: its async saves signal each other through
# process-wide keys ("awaitable_signals_contract_<n>/item_directory_creation"), so they time out,
# find each other's tmp directories ("File exists") or write into them (tests/test_checkpoint.py
# reproduces it). One save at a time in a process: a save waits for the previous Checkpointer's
# background writes first (a Checkpointer's own saves orbax already orders).
_SAVE_LOCK = threading.Lock()
_last_saver: "weakref.ref[Checkpointer] | None" = None

# A restore whose files are damaged. orbax reads every shard as an asyncio task gathered on an
# event loop of its own, and closes that loop as soon as the first read fails, leaving the other
# reads pending: their TensorStore callbacks then find the loop closed ("RuntimeError: Event loop
# is closed" from TensorStore's threads) and the garbage collector later closes their coroutines,
# whose `except BaseException` turns GeneratorExit into a printed "Exception ignored in: <coroutine
# _read_array_index_and_device_put>" with a TensorStore spec: a hundred tracebacks or more after
# the one warning that a step is corrupt. While smjax restores, orbax's two loop runners (a fresh
# loop on this thread; a uvloop on a thread of its own when this thread already runs a loop, as a
# notebook does) cancel a loop's pending tasks and wait for them before closing it, as asyncio.run
# does.
# Measured with orbax 0.12.8 (tests/test_checkpoint.py); a runner orbax no longer has is left alone.
try:
  from orbax.checkpoint._src import asyncio_utils as _ocp_asyncio
except ImportError:  # a later orbax, laid out otherwise
  _ocp_asyncio = None
_DRAIN_TIMEOUT_S = 30.0
_drain_lock = threading.Lock()
_drain_users = 0
_orbax_runners: dict[str, Callable] = {}  # orbax's own, while the draining ones stand in


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
  pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
  for task in pending:
    task.cancel()
  if pending:
    with contextlib.suppress(asyncio.TimeoutError):
      loop.run_until_complete(asyncio.wait_for(
          asyncio.gather(*pending, return_exceptions=True), _DRAIN_TIMEOUT_S))


def _run_sync_via_new_loop(coro):
  loop = asyncio.new_event_loop()
  try:
    asyncio.set_event_loop(loop)
    try:
      return loop.run_until_complete(coro)
    except BaseException:
      _cancel_pending(loop)
      raise
  finally:
    asyncio.set_event_loop(None)
    loop.close()


def _run_event_loop(loop: asyncio.AbstractEventLoop) -> None:
  try:
    loop.run_forever()
    _cancel_pending(loop)
  except BaseException as e:  # pylint: disable=broad-exception-caught
    logging.info("orbax's background event loop ended: %r", e)
  finally:
    with contextlib.suppress(Exception):
      loop.close()


_DRAINING_RUNNERS = {"_run_sync_via_new_loop": _run_sync_via_new_loop,
                     "_run_event_loop": _run_event_loop}


@contextlib.contextmanager
def _draining_failed_reads():
  """orbax's loop runners swapped for the draining ones above while the block runs (the first of
  several overlapping blocks installs them, the last puts orbax's back)."""
  global _drain_users
  with _drain_lock:
    if _drain_users == 0:
      _orbax_runners.update({name: getattr(_ocp_asyncio, name) for name in _DRAINING_RUNNERS
                             if callable(getattr(_ocp_asyncio, name, None))})
      for name in _orbax_runners:
        setattr(_ocp_asyncio, name, _DRAINING_RUNNERS[name])
    _drain_users += 1
  try:
    yield
  finally:
    with _drain_lock:
      _drain_users -= 1
      if _drain_users == 0:
        for name, runner in _orbax_runners.items():
          setattr(_ocp_asyncio, name, runner)
        _orbax_runners.clear()


class ConfigMismatchError(ValueError):
  """Resuming would change the run: the config differs from the checkpoint's in run fields."""


class CorruptCheckpointError(RuntimeError):
  """A checkpoint step that cannot be restored as it was saved."""


@dataclasses.dataclass(frozen=True)
class Restored:
  """What `restore_latest` hands back; `ledger` is a dict unless a `ledger_type` was given."""
  state: Any
  step: int
  rng: jax.Array | None
  host_rng: np.random.Generator | None
  data_state: Any
  ledger: Any
  extra: Any
  metric: float | None
  config: dict | None


# ------------------------------------------------------------------------------ the manager

class Checkpointer:
  """An orbax CheckpointManager for one run's `<workdir>/checkpoints` (see the module docstring).

  Args:
    workdir: run directory (local path or any epath URL such as gs://).
    max_to_keep: the most recent checkpoints kept.
    keep_best: also keep the checkpoint with the best `metric` passed to `save`.
    best_mode: "max" (accuracy) or "min" (loss).
    async_save: write files in the background (safe with donated state; see module docstring).
    config: this run's config (dict, ConfigDict or dataclass), saved and checked on resume.
    ignore_fields: run-neutral config fields a resumed run may change.
    upgrade_saved_config: applied to a checkpoint's saved config dict before the comparison (a
      schema that gained fields fills them in as an older run had them); None: as saved.
    verify: store and check per-leaf checksums.
  """

  def __init__(self, workdir: str, *, max_to_keep: int = 3, keep_best: bool = True,
               best_mode: str = "max", async_save: bool = True, config: Any = None,
               ignore_fields: Sequence[str] = DEFAULT_RUN_NEUTRAL_FIELDS, verify: bool = True,
               metric_name: str = "heldout_accuracy",
               upgrade_saved_config: Callable[[dict], dict] | None = None):
    if max_to_keep < 1:
      raise ValueError(f"Checkpointer: {max_to_keep=} must be >= 1")
    if best_mode not in ("max", "min"):
      raise ValueError(f"Checkpointer: {best_mode=}; expected 'max' or 'min'")
    workdir = paths.resolve(workdir)  # orbax refuses relative paths; a URL stays as it is
    self.directory = epath.Path(workdir) / "checkpoints"
    self.quarantine = epath.Path(workdir) / "checkpoints_corrupt"
    self.config = None if config is None else to_json(config)
    self.ignore_fields = tuple(ignore_fields)
    self.upgrade_saved_config = upgrade_saved_config
    self.verify = verify
    self.metric_name = metric_name
    self._mgr = None
    self._scan_directory()
    # A save without a metric ranks last, so it is never the "best" one kept.
    worst = float("-inf") if best_mode == "max" else float("inf")
    best_fn: Callable = lambda m: worst if m.get(metric_name) is None else float(m[metric_name])
    policies = [ocp_policy.LatestN(n=max_to_keep)]
    if keep_best:
      policies.append(ocp_policy.BestN(get_metric_fn=best_fn, reverse=best_mode == "min", n=1,
                                       keep_checkpoints_without_metrics=False))
    self._options = ocp.CheckpointManagerOptions(
        best_fn=best_fn if keep_best else None, best_mode=best_mode,
        enable_async_checkpointing=async_save, cleanup_tmp_directories=True, create=True,
        preservation_policy=ocp_policy.AnyPreservationPolicy(policies))
    self._mgr = ocp.CheckpointManager(self.directory, options=self._options)

  def _scan_directory(self) -> None:
    """Reports interrupted saves, and moves aside steps whose metrics file (read by orbax when it
    opens the directory, and fatal to it if garbled) is unreadable."""
    if not self.directory.exists():
      return
    for path in sorted(self.directory.iterdir(), key=lambda p: p.name):
      match = _TMP_DIR.match(path.name)
      if match:
        logging.warning("checkpoint step %s in %s is incomplete: its save was interrupted "
                        "(orbax left %s); skipping it (orbax removes the folder)",
                        match.group(1), self.directory, path.name)
      elif path.name.isdigit() and (path / "metrics" / "metrics").exists():
        file = path / "metrics" / "metrics"
        try:
          json.loads(file.read_text())
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
          self._quarantine(int(path.name), f"its metrics file is unreadable: {file}: not valid "
                           f"JSON ({one_line(e)})")

  # ------------------------------------------------------------------------------ queries

  def all_steps(self) -> list[int]:
    return sorted(self._mgr.all_steps())

  def latest_step(self) -> int | None:
    return self._mgr.latest_step()

  def best_step(self) -> int | None:
    """The kept step with the best metric (None if no kept step has one or keep_best is off)."""
    step = self._mgr.best_step() if self._options.best_fn else None
    metrics = None if step is None else self._mgr.metrics(step)
    return step if metrics and metrics.get(self.metric_name) is not None else None

  # --------------------------------------------------------------------------------- save

  def save(self, step: int, state: Any, *, rng=None, host_rng: np.random.Generator | None = None,
           data_state: Any = None, ledger: Any = None, extra: Any = None,
           metric: float | None = None) -> bool:
    """Saves loop step `step`; returns False (and saves nothing) if that step is already saved.

    With `async_save` this returns once arrays are on the host; `wait()` waits for the files.
    """
    step = int(step)
    if step in self._mgr.all_steps():
      return False
    meta = {
        "format": FORMAT_VERSION, "step": step, "time": time.time(),
        "rng": _rng_to_json(rng), "host_rng": _host_rng_to_json(host_rng),
        "data_state": to_json(data_state, "data_state"), "ledger": to_json(ledger, "ledger"),
        "extra": to_json(extra, "extra"), "config": self.config,
        "metric": None if metric is None else float(metric),
        "signature": _signature(state),
        # Dispatched before the caller's next step can donate `state`; fetched here.
        "checksums": _checksum_dict(state) if self.verify else None,
    }
    metrics = {self.metric_name: meta["metric"]} if self._options.best_fn else None
    global _last_saver
    with _SAVE_LOCK:
      last = _last_saver and _last_saver()
      if last is not None and last is not self and last._mgr is not None:
        last._mgr.wait_until_finished()
      _last_saver = weakref.ref(self)
      return self._mgr.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
          metrics=metrics, force=True)

  def wait(self) -> None:
    """Blocks until every pending (async) save is on disk and old steps are cleaned up."""
    self._mgr.wait_until_finished()

  def close(self) -> None:
    self._mgr.wait_until_finished()
    self._mgr.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # ------------------------------------------------------------------------------ restore

  def restore(self, step: int, target: Any, *, ledger_type: Any = None) -> Restored:
    """Restores one step onto the shardings of `target` (arrays or ShapeDtypeStructs).

    Raises CorruptCheckpointError if the step cannot be restored as saved, ConfigMismatchError if
    the config differs in a run field, ValueError if `target`'s tree does not match.
    """
    where = f"checkpoint step {step} ({self.directory / str(step)})"
    fix = "delete that step directory, or resume with restore_latest (which moves it aside)"
    try:
      with _draining_failed_reads():
        meta = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
      if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION or (
          meta.get("step") != step):
        raise CorruptCheckpointError(f"{where}: its meta JSON is not a smjax v{FORMAT_VERSION} "
                                     f"record for step {step}; {fix}")
    except CorruptCheckpointError:
      raise
    except Exception as e:  # orbax/tensorstore/json raise many types for unreadable files
      raise CorruptCheckpointError(f"{where}: its meta item is unreadable ({type(e).__name__}: "
                                   f"{one_line(e)}); expected the JSON orbax wrote; {fix}") from e
    self._check_config(step, meta.get("config"))
    self._check_signature(step, meta["signature"], target)
    try:
      with _draining_failed_reads():
        state = self._mgr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(_abstract(target)))).state
    except Exception as e:
      raise CorruptCheckpointError(f"{where}: its arrays are unreadable ({type(e).__name__}: "
                                   f"{one_line(e)}); expected the files orbax wrote; {fix}") from e
    if self.verify and meta.get("checksums") is not None:
      got = _checksum_dict(state)
      bad = [k for k, v in meta["checksums"].items() if got.get(k) != v]
      if bad:
        raise CorruptCheckpointError(f"{where}: {len(bad)} array(s) do not match their saved "
                                     f"checksums: {', '.join(bad[:5])}; {fix}")
    ledger = from_json(meta.get("ledger"))
    if ledger_type is not None and ledger is not None:
      ledger = ledger_type.from_dict(ledger)
    return Restored(state=state, step=step, rng=_rng_from_json(meta.get("rng")),
                    host_rng=_host_rng_from_json(meta.get("host_rng")),
                    data_state=from_json(meta.get("data_state")), ledger=ledger,
                    extra=from_json(meta.get("extra")), metric=meta.get("metric"),
                    config=meta.get("config"))

  def restore_latest(self, target: Any, *, ledger_type: Any = None) -> Restored | None:
    """The newest step that restores intact, or None if there is none. Corrupt steps are reported
    (logging.warning), moved to `checkpoints_corrupt/` and skipped."""
    self.wait()
    for step in sorted(self._mgr.all_steps(), reverse=True):
      try:
        restored = self.restore(step, target, ledger_type=ledger_type)
      except CorruptCheckpointError as e:
        self._quarantine(step, e, named=True)
        continue
      logging.info("resuming from checkpoint step %d in %s", step, self.directory)
      return restored
    return None

  def _check_config(self, step: int, saved: Any) -> None:
    if self.config is None or saved is None:
      return
    if self.upgrade_saved_config is not None:
      saved = self.upgrade_saved_config(saved)
    diff = config_diff(saved, self.config, self.ignore_fields)
    if diff:
      raise ConfigMismatchError(
          f"checkpoint step {step} in {self.directory} was written with a different config; "
          "resuming would change the run. Differing fields (checkpoint -> now):\n  "
          + "\n  ".join(diff) + "\nUse a fresh workdir, or pass the fields in `ignore_fields` if "
          "they do not alter the run.")

  def _check_signature(self, step: int, saved: dict, target: Any) -> None:
    now = _signature(target)
    if saved != now:
      rows = [f"{k}: {saved.get(k, '<absent>')} -> {now.get(k, '<absent>')}"
              for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
      raise ValueError(f"checkpoint step {step} in {self.directory} holds a state whose leaves "
                       "differ from the restore target (checkpoint -> target):\n  "
                       + "\n  ".join(rows[:20]))

  def _quarantine(self, step: int, reason: Any, named: bool = False) -> None:
    """Reports a corrupt step and moves it out of orbax's directory (so it can be saved again).
    `named`: `reason` already names the step and its directory."""
    src = self.directory / str(step)
    dst = self.quarantine / f"{step}.{int(time.time() * 1000)}"
    where = "" if named else f"checkpoint step {step} ({src}) is corrupt: "
    logging.warning("%s%s. Moved it to %s; falling back to the previous checkpoint", where, reason,
                    dst)
    if jax.process_index() == 0 and src.exists():
      self.quarantine.mkdir(parents=True, exist_ok=True)
      src.rename(dst)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      multihost_utils.sync_global_devices(f"smjax_checkpoint_quarantine_{step}")
    if self._mgr is not None:
      self._mgr.reload()


# ----------------------------------------------------------------------------- preemption
