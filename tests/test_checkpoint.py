"""Checkpoints: exact round trip, retention, corruption fallback, config guard, preemption.

In-process tests use a toy-tiny-shaped TrainState filled with random numbers (no model compile);
the preemption test runs tests/ckpt_train_script.py (the real SFT step) as subprocesses and
compares an interrupted-and-resumed run with an uninterrupted one, bit for bit.
"""

import asyncio
import dataclasses
import gc
import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorstore as ts

from smjax.checkpoint import (DEFAULT_RUN_NEUTRAL_FIELDS, Checkpointer, ConfigMismatchError,
                              CorruptCheckpointError, _draining_failed_reads, config_diff)
from smjax.models.presets import get_preset
from smjax.models.transformer import Transformer
from smjax.preemption import PreemptionGuard
from smjax.train.state import OptimizerConfig, TrainState, make_optimizer

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ckpt_train_script.py")
ROOT = os.path.dirname(HERE)


def _toy_state(seed: int) -> TrainState:
  """A TrainState shaped like toy-tiny + AdamW, every leaf random (bf16 for the embedding)."""
  model = Transformer(get_preset("toy-tiny"))
  tx = make_optimizer(OptimizerConfig())
  params = jax.eval_shape(lambda: nn.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32))["params"]))
  abstract = jax.eval_shape(lambda p: TrainState(jnp.zeros((), jnp.int32), p, tx.init(p)), params)
  rng = np.random.default_rng(seed)
  def fill(a):
    if jnp.issubdtype(a.dtype, jnp.integer):
      return jnp.asarray(rng.integers(0, 1 << 20, a.shape, dtype=np.int32))
    dtype = jnp.bfloat16 if a.shape == (128, 64) else a.dtype  # exercise a 2-byte dtype
    return jnp.asarray(rng.standard_normal(a.shape).astype(np.float32), dtype)
  return jax.tree.map(fill, abstract)


def _host(tree):
  return [np.array(x) for x in jax.tree.leaves(tree)]


def _assert_bitwise(got_tree, want_host):
  got = jax.tree.leaves(got_tree)
  assert len(got) == len(want_host)
  for g, w in zip(got, want_host):
    assert g.dtype == w.dtype and g.shape == w.shape
    assert np.array_equal(np.asarray(g).reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8))


@dataclasses.dataclass
class _Ledger:  # the FlopLedger protocol: to_dict() and a from_dict() classmethod
  flops: dict

  def to_dict(self):
    return {"flops": dict(self.flops)}

  @classmethod
  def from_dict(cls, d):
    return cls(flops=dict(d["flops"]))


CONFIG = {"seed": 0, "optimizer": {"learning_rate": 1e-3, "schedule": "cosine"},
          "batch_size": 16, "log_every": 10, "workdir": "/somewhere"}


def test_round_trip_is_bitwise(tmp_path):
  state = _toy_state(0)
  want = _host(state)
  key, raw_key = jax.random.key(7), jax.random.PRNGKey(8)
  host_rng = np.random.default_rng(9)
  host_rng.random(3)  # not at its initial state
  data_state = {"next_index": 12, "blob": b"\x00\xffgrain"}
  ledger = {"train/policy": {"flops": 1.2345678901234567e15, "calls": 7}}
  extra = {"curve": [[100.0, 0.25], [200.0, 0.5]], "last_heldout_accuracy": 0.5}
  with Checkpointer(str(tmp_path), async_save=True, config=CONFIG) as ckpt:
    ckpt.save(5, state, rng=key, host_rng=host_rng, data_state=data_state, ledger=ledger,
              extra=extra, metric=0.5)
    ckpt.save(6, state, rng=raw_key, ledger=_Ledger({"rollout/decode": 3.0}))

  ckpt = Checkpointer(str(tmp_path), config=CONFIG)
  r = ckpt.restore(5, state)
  _assert_bitwise(r.state, want)
  assert all(g.sharding == t.sharding for g, t in zip(jax.tree.leaves(r.state),
                                                        jax.tree.leaves(state)))
  assert r.step == 5 and r.metric == 0.5
  assert np.array_equal(jax.random.key_data(r.rng), jax.random.key_data(key))
  assert jax.random.key_impl(r.rng) == jax.random.key_impl(key)
  assert r.host_rng.random(5).tolist() == host_rng.random(5).tolist()
  assert r.data_state == data_state and r.ledger == ledger and r.extra == extra
  assert r.config == json.loads(json.dumps(CONFIG))
  latest = ckpt.restore_latest(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state))
  assert latest.step == 6 and latest.rng.dtype == jnp.uint32
  assert np.array_equal(latest.rng, raw_key)
  assert ckpt.restore(6, state, ledger_type=_Ledger).ledger == _Ledger({"rollout/decode": 3.0})
  ckpt.close()


def test_async_save_does_not_read_donated_or_deleted_buffers(tmp_path):
  """orbax copies arrays to host before `save` returns, so the caller may donate or free them."""
  state = _toy_state(1)
  want = _host(state)
  bump = jax.jit(lambda s: jax.tree.map(lambda x: x * 3, s), donate_argnums=0)
  with Checkpointer(str(tmp_path), async_save=True) as ckpt:
    ckpt.save(1, state)
    new = bump(state)  # donates the buffers orbax is still writing in the background
    ckpt.save(2, new)
    new_host = _host(new)
    for x in jax.tree.leaves(new):
      x.delete()
    ckpt.wait()
    _assert_bitwise(ckpt.restore(1, new).state, want)
    _assert_bitwise(ckpt.restore(2, new).state, new_host)


def test_an_error_inside_the_manager_finishes_its_async_save_first(tmp_path):
  """A phase that fails right after an async save (the RL/SFT phases hold their Checkpointer in a
  `with`): the original error propagates, and by then the save is on disk, complete (no orbax tmp
  folder left behind) and restorable."""
  state = _toy_state(2)
  want = _host(state)
  with pytest.raises(RuntimeError, match="the phase failed"):
    with Checkpointer(str(tmp_path), async_save=True) as ckpt:
      ckpt.save(3, state)
      raise RuntimeError("the phase failed")
  names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  assert names == ["3"], names
  assert (tmp_path / "checkpoints" / "3" / "commit_success.txt").exists() or \
      (tmp_path / "checkpoints" / "3" / "_CHECKPOINT_METADATA").exists()
  with Checkpointer(str(tmp_path), async_save=False) as again:
    assert again.all_steps() == [3]
    _assert_bitwise(again.restore(3, state).state, want)



def test_two_checkpointers_saving_at_once_in_threads_both_land(tmp_path):
  """Phases side by side (threads) save the same steps at the same moments. Without the
  process-wide save lock, orbax 0.12's async saves of two managers collide (timeouts on its
  process-wide signal keys, "File exists" or "Directory not empty" in each other's tmp folders);
  with it, every step of both lands complete and restorable."""
  errors, states = [], {}
  gate = threading.Barrier(2, timeout=60)

  def phase(i):
    try:
      with Checkpointer(str(tmp_path / f"phase{i}"), max_to_keep=8, keep_best=False) as ckpt:
        for step in range(1, 7):
          gate.wait()   # both save step `step` at once
          states[i, step] = _toy_state(10 * i + step)
          ckpt.save(step, states[i, step])
    except Exception as e:  # pylint: disable=broad-except
      errors.append(f"phase {i}: {e!r}"[:300])
      gate.abort()
  threads = [threading.Thread(target=phase, args=(i,)) for i in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  assert not errors, errors
  for i in range(2):
    with Checkpointer(str(tmp_path / f"phase{i}"), async_save=False, keep_best=False) as again:
      assert again.all_steps() == list(range(1, 7))
      for step in (1, 6):
        _assert_bitwise(again.restore(step, states[i, step]).state, _host(states[i, step]))
    assert not [p for p in (tmp_path / f"phase{i}" / "checkpoints").iterdir()
                if "tmp" in p.name]

def test_keeps_last_n_and_best(tmp_path):
  state = {"w": jnp.ones((8, 8))}
  metrics = {1: 0.1, 2: 0.7, 3: 0.3, 4: None, 5: 0.2, 6: 0.4, 7: None}
  with Checkpointer(str(tmp_path / "a"), max_to_keep=2, keep_best=True) as ckpt:
    for step, m in metrics.items():
      ckpt.save(step, state, metric=m)
    ckpt.wait()
    assert ckpt.all_steps() == [2, 6, 7]  # last two + the best (0.7)
    assert ckpt.best_step() == 2
  with Checkpointer(str(tmp_path / "b"), max_to_keep=2, keep_best=True, best_mode="min") as ckpt:
    for step, m in metrics.items():
      ckpt.save(step, state, metric=m)
    ckpt.wait()
    assert ckpt.all_steps() == [1, 6, 7]
  with Checkpointer(str(tmp_path / "c"), max_to_keep=3, keep_best=False) as ckpt:
    for step, m in metrics.items():
      ckpt.save(step, state, metric=m)
    ckpt.wait()
    assert ckpt.all_steps() == [5, 6, 7] and ckpt.best_step() is None
    assert ckpt.save(7, state) is False  # already saved (e.g. SIGTERM right after a periodic save)


def _data_files(step_dir):
  d = os.path.join(step_dir, "state", "ocdbt.process_0", "d")
  return [os.path.join(d, f) for f in os.listdir(d)]


def _truncate(step_dir):
  for f in _data_files(step_dir):
    with open(f, "r+b") as fh:
      fh.truncate(os.path.getsize(f) // 2)


def _remove(step_dir):
  for f in _data_files(step_dir):
    os.remove(f)


def _garbage_meta(step_dir):
  with open(os.path.join(step_dir, "meta", "metadata"), "w") as fh:
    fh.write('{"format": 1, "step": ')


def _flip_bit(step_dir):  # bit rot inside valid files: orbax restores it silently; checksums notice
  # Rewrite one bit of one stored value through tensorstore, so every file stays well formed. (A
  # byte flipped in a data file at random sometimes lands in zstd framing or the OCDBT index,
  # which orbax itself rejects: the files are compressed and laid out differently on every save.)
  arr = ts.open({"driver": "zarr", "kvstore": {
      "driver": "ocdbt", "base": "file://" + os.path.join(step_dir, "state"),
      "path": "params.embed/"}}).result()
  bits = arr.read().result().view(np.uint16).copy()
  bits[3, 5] ^= 0x0040
  arr.write(bits.view(arr.dtype.numpy_dtype)).result()


def _garbage_metrics(step_dir):  # orbax itself fails to open the directory on this one
  with open(os.path.join(step_dir, "metrics", "metrics"), "w") as fh:
    fh.write("{garbage")


def _interrupted_save(step_dir):  # what a kill -9 during an orbax save leaves behind
  os.rename(step_dir, step_dir + ".orbax-checkpoint-tmp-1764000000000000")


@pytest.mark.parametrize("corrupt,fault", [
    (_truncate, "arrays are unreadable"), (_remove, "arrays are unreadable"),
    (_garbage_meta, "meta item is unreadable"), (_flip_bit, "checksums"),
    (_garbage_metrics, "metrics file is unreadable"), (_interrupted_save, "interrupted")])
def test_corrupt_latest_falls_back_to_previous(tmp_path, caplog, corrupt, fault):
  states = {1: _toy_state(1), 2: _toy_state(2)}
  want = _host(states[1])
  with Checkpointer(str(tmp_path), async_save=False) as ckpt:
    for step, st in states.items():
      ckpt.save(step, st, data_state={"next_index": step}, metric=0.1 * step)
  corrupt(os.path.join(tmp_path, "checkpoints", "2"))
  with caplog.at_level(logging.WARNING):
    ckpt = Checkpointer(str(tmp_path), async_save=False)
    restored = ckpt.restore_latest(states[1])
  assert restored.step == 1 and restored.data_state == {"next_index": 1}
  _assert_bitwise(restored.state, want)
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert any("step 2" in w and fault in w for w in warnings), warnings
  assert ckpt.save(2, states[2])  # the bad step was moved aside, so it can be written again
  ckpt.close()


def test_fallback_from_unreadable_arrays_prints_nothing(tmp_path, capfd, monkeypatch):
  """orbax abandons a failed restore's other reads on a closed event loop; smjax's restore drains
  them. Without that, these four fallbacks printed up to a hundred "Exception ignored in:
  <coroutine _read_array_index_and_device_put>" tracebacks in most runs (orbax 0.12.8; how many
  reads are still pending when the first fails is a race: the next test is deterministic)."""
  unraisable = []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  states = {1: _toy_state(1), 2: _toy_state(2)}
  for i, corrupt in enumerate([_truncate, _remove] * 2):
    with Checkpointer(str(tmp_path / str(i)), async_save=False) as ckpt:
      for step, st in states.items():
        ckpt.save(step, st)
    corrupt(str(tmp_path / str(i) / "checkpoints" / "2"))
    with Checkpointer(str(tmp_path / str(i)), async_save=False) as ckpt:
      assert ckpt.restore_latest(states[1]).step == 1
  time.sleep(0.5)  # abandoned reads would finish on TensorStore's threads, then be collected
  gc.collect()
  err = capfd.readouterr().err
  assert not unraisable, [f"{u.exc_type.__name__}: {u.exc_value}" for u in unraisable[:3]]
  assert "Event loop is closed" not in err and "Traceback" not in err, err[-2000:]


@pytest.mark.parametrize("in_running_loop", [False, True])  # True: orbax's uvloop runner
def test_orbax_runners_cancel_what_a_failed_gather_left(in_running_loop):
  """Through orbax's own run_sync: a gather whose first task fails leaves its sibling pending;
  inside _draining_failed_reads the sibling is cancelled and awaited before the loop closes, and
  orbax's runners are back afterwards."""
  from orbax.checkpoint._src import asyncio_utils  # pylint: disable=import-outside-toplevel
  originals = (asyncio_utils._run_sync_via_new_loop, asyncio_utils._run_event_loop)
  sibling = []

  async def slow_read():
    try:
      await asyncio.sleep(60)
    except asyncio.CancelledError:
      sibling.append("cancelled")
      raise

  async def bad_read():
    await asyncio.sleep(0)
    raise OSError("unreadable shard")

  async def restore():
    await asyncio.gather(slow_read(), bad_read())

  def run():
    with pytest.raises(OSError, match="unreadable shard"):
      asyncio_utils.run_sync(restore())

  async def in_loop():
    run()

  with _draining_failed_reads():
    asyncio.run(in_loop()) if in_running_loop else run()
  assert sibling == ["cancelled"]
  assert (asyncio_utils._run_sync_via_new_loop, asyncio_utils._run_event_loop) == originals


def test_changed_config_is_refused_and_run_neutral_override_accepted(tmp_path):
  state = {"w": jnp.arange(6.0)}
  with Checkpointer(str(tmp_path), config=CONFIG) as ckpt:
    ckpt.save(3, state)
  changed = {**CONFIG, "optimizer": {"learning_rate": 2e-3, "schedule": "cosine"},
             "log_every": 1, "new_field": 1}
  with pytest.raises(ConfigMismatchError) as err:
    Checkpointer(str(tmp_path), config=changed).restore_latest(state)
  msg = str(err.value)
  assert "step 3" in msg and "optimizer.learning_rate: 0.001 -> 0.002" in msg
  assert "new_field: '<absent>' -> 1" in msg and "log_every" not in msg
  neutral = ml_collections.ConfigDict({**CONFIG, "log_every": 1, "workdir": "/elsewhere"})
  assert Checkpointer(str(tmp_path), config=neutral).restore_latest(state).step == 3
  lenient = Checkpointer(str(tmp_path), config=changed,
                         ignore_fields=DEFAULT_RUN_NEUTRAL_FIELDS + ("optimizer", "new_field"))
  assert lenient.restore_latest(state).step == 3
  with pytest.raises(ValueError, match="leaves differ"):  # wrong target: an error, not corruption
    Checkpointer(str(tmp_path)).restore_latest({"w": jnp.arange(7.0)})
  assert Checkpointer(str(tmp_path)).all_steps() == [3]
  assert config_diff({"a": [1, 2]}, {"a": (1, 2)}) == []  # tuples and lists are the same JSON
  assert config_diff({"a": 1}, {"a": 1.0}) == ["a: 1 -> 1.0"]


def test_preemption_guard_sets_flag_and_restores_handler():
  before = signal.getsignal(signal.SIGTERM)
  with PreemptionGuard() as guard:
    assert not guard.should_stop()
    os.kill(os.getpid(), signal.SIGTERM)
    assert guard.should_stop() and guard.received == signal.SIGTERM
  assert signal.getsignal(signal.SIGTERM) is before


_SHARDED = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from smjax.checkpoint import Checkpointer
    from smjax.sharding import make_mesh
    mesh_a, mesh_b = make_mesh(fsdp=4, tensor=2), make_mesh(data=2, fsdp=4)
    w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    state = {"w": jax.device_put(w, NamedSharding(mesh_a, P("fsdp", "tensor")))}
    with Checkpointer(sys.argv[1]) as ckpt:
      ckpt.save(1, state)
    target = {"w": jax.ShapeDtypeStruct(w.shape, w.dtype,
                                        sharding=NamedSharding(mesh_b, P(None, "fsdp")))}
    got = Checkpointer(sys.argv[1]).restore_latest(target).state["w"]
    assert got.sharding == target["w"].sharding, got.sharding
    assert np.array_equal(np.asarray(got), w)
    print("OK", len(got.addressable_shards))
""")


def test_restore_onto_a_different_mesh_uses_target_shardings(tmp_path):
  out = subprocess.run([sys.executable, "-c", _SHARDED, str(tmp_path)], capture_output=True,
                       text=True, timeout=300, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  assert "OK 8" in out.stdout


# ------------------------------------------------------------------ preemption end to end

STEPS, EVERY = 40, 5


def _launch(workdir, cache, tag, *extra):
  cmd = [sys.executable, SCRIPT, "--workdir", str(workdir), "--steps", str(STEPS),
         "--checkpoint_every", str(EVERY), "--compile_cache", str(cache), *extra]
  stderr_path = f"{workdir}.{tag}.stderr"
  with open(stderr_path, "w") as err:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
  proc.stderr_path = stderr_path
  return proc


def _drive(proc, *, at_step=None, sig=None, timeout=300):
  """Reads the script's stdout; sends `sig` once it reports step `at_step`; returns the lines."""
  watchdog = threading.Timer(timeout, proc.kill)
  watchdog.start()
  lines = []
  try:
    for line in proc.stdout:
      lines.append(line.strip())
      if sig is not None and line.startswith("step ") and int(line.split()[1]) >= at_step:
        proc.send_signal(sig)
        sig = None
    proc.wait()
  finally:
    watchdog.cancel()
  return lines


def _stderr(proc):
  return open(proc.stderr_path).read()


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  base = tmp_path_factory.mktemp("preempt")
  proc = _launch(base / "reference", base / "jax_cache", "run")
  lines = _drive(proc)
  assert proc.returncode == 0, _stderr(proc)[-3000:]
  assert lines[0] == "fresh start" and lines[-1] == f"done step {STEPS}"
  return base


def _final(workdir):
  with open(os.path.join(workdir, "final.json")) as f:
    final = json.load(f)
  return final, dict(np.load(os.path.join(workdir, "final_state.npz")))


def test_sigterm_then_kill9_then_resume_equals_uninterrupted_run(reference_run):
  """One run, interrupted twice (SIGTERM: clean save + exit 0; then kill -9 mid-save), then
  finished: its final state, per-step metrics, FLOP ledger and step count equal the reference
  run's bit for bit. (One chain instead of two runs: each process start costs seconds.)"""
  base = reference_run
  run, cache = base / "interrupted", base / "jax_cache"

  # 1. SIGTERM mid-run: the script saves at the step it is on and exits 0.
  proc = _launch(run, cache, "sigterm", "--step_sleep", "0.05")
  lines = _drive(proc, at_step=12, sig=signal.SIGTERM)
  assert proc.returncode == 0, _stderr(proc)[-3000:]
  assert lines[-1].startswith("preempted at step ")
  stopped = int(lines[-1].split()[-1])
  assert 12 <= stopped < STEPS - EVERY
  assert max(int(d) for d in os.listdir(run / "checkpoints") if d.isdigit()) == stopped

  # 2. Resume, then kill -9 right after a (seeded) random save step returns: the async write of
  #    that step is then usually still in flight, so it is left half-written.
  kill_at = random.Random(20261130).choice(range(stopped + EVERY - stopped % EVERY, STEPS, EVERY))
  proc = _launch(run, cache, "kill9", "--step_sleep", "0.05")
  lines = _drive(proc, at_step=kill_at, sig=signal.SIGKILL)
  assert lines[0] == f"resumed from step {stopped}", _stderr(proc)[-3000:]
  assert proc.returncode == -signal.SIGKILL, lines[-3:]
  names = os.listdir(run / "checkpoints")
  complete = max(int(d) for d in names if d.isdigit())
  interrupted = [d for d in names if "orbax-checkpoint-tmp" in d]

  # 3. Resume from the latest complete checkpoint and finish.
  proc = _launch(run, cache, "resume")
  lines = _drive(proc)
  assert proc.returncode == 0, _stderr(proc)[-3000:]
  assert lines[0] == f"resumed from step {complete}" and lines[-1] == f"done step {STEPS}"
  for name in interrupted:
    assert f"step {name.split('.')[0]} " in _stderr(proc) and "interrupted" in _stderr(proc)

  ref_final, ref_state = _final(base / "reference")
  got_final, got_state = _final(run)
  assert got_final["step"] == ref_final["step"] == STEPS
  assert got_final["history"] == ref_final["history"]  # loss, accuracy and FLOPs at every step
  assert got_final["ledger"] == ref_final["ledger"]
  assert sorted(got_state) == sorted(ref_state)
  for name, want in ref_state.items():
    assert np.array_equal(got_state[name].reshape(-1).view(np.uint8),
                          want.reshape(-1).view(np.uint8)), name


def test_relative_workdir_is_accepted(tmp_path, monkeypatch):
  """orbax needs absolute paths; a relative workdir (e.g. runs/demo) must still save and restore."""
  monkeypatch.chdir(tmp_path)
  state = {"w": jnp.arange(6.0).reshape(2, 3)}
  with Checkpointer("runs/rel", max_to_keep=1, keep_best=False, async_save=False) as ckpt:
    ckpt.save(3, state)
  with Checkpointer("runs/rel", max_to_keep=1, keep_best=False, async_save=False) as ckpt:
    restored = ckpt.restore_latest(state)
  assert restored.step == 3 and os.path.isdir(tmp_path / "runs" / "rel" / "checkpoints" / "3")
  np.testing.assert_array_equal(np.asarray(restored.state["w"]), np.arange(6.0).reshape(2, 3))


def test_restore_of_a_corrupt_step_names_its_directory(tmp_path):
  state = {"w": jnp.arange(6.0)}
  with Checkpointer(str(tmp_path), async_save=False) as ckpt:
    ckpt.save(4, state)
  _garbage_meta(os.path.join(tmp_path, "checkpoints", "4"))
  with pytest.raises(CorruptCheckpointError) as e:
    Checkpointer(str(tmp_path), async_save=False).restore(4, state)
  msg = str(e.value)
  assert "\n" not in msg, msg
  assert msg.startswith(f"checkpoint step 4 ({tmp_path}/checkpoints/4): its meta item is "
                        "unreadable ("), msg
  assert msg.endswith("delete that step directory, or resume with restore_latest (which moves it "
                      "aside)"), msg

