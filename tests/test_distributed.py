"""A real two-process jax.distributed run on localhost: a sharded GRPO step and an orbax checkpoint.

Two OS processes (this file run as a script), each with 2 fake CPU devices, join through
smjax.distributed.maybe_initialize (coordinator on 127.0.0.1, a free port; gloo collectives), so
the global mesh (fsdp=2, tensor=2) has 4 devices and its "fsdp" axis spans the two processes:
parameters are split across processes and each process feeds only its own half of the batch
(grain sharded by smjax.distributed.grain_shard_options, then smjax.sharding.shard_host_batch).
Each process also runs the same step on one local device with the whole batch; the test compares
the two on every shard a process holds. Then both save the
state with smjax.checkpoint.Checkpointer (orbax, one shared directory), restore it onto the same
global shardings and report whether every local shard came back bit for bit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

B, S, V, GROUP = 8, 10, 128, 4


def _batch():
  rng = np.random.default_rng(1)
  attn = np.ones((B, S), bool)
  attn[::3, :2] = False                                    # some left padding
  tokens = np.where(attn, rng.integers(3, V, (B, S)), 0).astype(np.int32)
  positions = np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)
  loss_mask = np.zeros((B, S - 1), bool)
  loss_mask[:, 4:] = True
  old = (-np.log(V) + 0.1 * rng.standard_normal((B, S - 1))).astype(np.float32)
  rewards = np.tile(np.array([1.0, 0.0, 0.0, 1.0], np.float32), B // GROUP)
  return dict(tokens_BS=tokens, positions_BS=positions, attn_mask_BS=attn, loss_mask_BT=loss_mask,
              old_logp_BT=old, rewards_B=rewards)


def _worker(out_dir: str) -> None:
  import jax

  jax.config.update("jax_num_cpu_devices", 2)  # before the backend starts
  from smjax import distributed

  assert distributed.maybe_initialize()  # from SMJAX_* variables set by the test
  assert distributed.maybe_initialize()  # idempotent

  import jax.numpy as jnp

  from smjax import checkpoint as ckpt_lib
  from smjax import sharding as shd
  from smjax.models.presets import get_preset
  from smjax.models.transformer import Transformer, init_params
  from smjax.batch import SequenceBatch
  from smjax.train import steps as st
  from smjax.train.state import OptimizerConfig, create_state, make_optimizer

  me, n = distributed.process_index(), distributed.process_count()
  result = {"process_count": n, "device_count": jax.device_count(),
            "local_devices": jax.local_device_count()}
  cfg = get_preset("toy-tiny", n_layers=1)
  tx = make_optimizer(OptimizerConfig(learning_rate=1e-2, eps=1e-3))
  step_def = st.make_grpo_step(Transformer(cfg), tx, st.GRPOConfig(group_size=GROUP, impl="xla"))
  raw = _batch()
  key = jax.random.key(0)

  # Reference: the whole batch on this process's first device.
  local = jax.local_devices()[0]
  with jax.default_device(local):
    ref_state = create_state(jax.jit(lambda k: init_params(cfg, k))(key), tx)
    init = jax.tree.map(np.asarray, ref_state.params)  # the step donates ref_state
    ref_new, ref_metrics = st.jit_step(step_def)(
        ref_state, SequenceBatch(**{k: jnp.asarray(v) for k, v in raw.items()}))
  ref_params = jax.tree.map(np.asarray, ref_new.params)

  # Sharded over both processes; each passes only its own rows.
  mesh = shd.mesh_from_config(dict(fsdp=2, tensor=2))
  state, shards = shd.init_sharded_state(cfg, tx, mesh, key)
  # This process's records (one record = one GRPO group) from grain, sharded by process.
  import grain
  opts = distributed.grain_shard_options()
  groups = [int(g) for g in grain.MapDataset.range(B // GROUP)[
      opts.shard_index::opts.shard_count]]
  rows = np.concatenate([np.arange(g * GROUP, (g + 1) * GROUP) for g in groups])
  assert len(rows) == distributed.per_process_batch_size(B)
  mine = {k: v[rows] for k, v in raw.items()}
  result["grain_groups"] = groups
  batch = shd.shard_host_batch(SequenceBatch(**mine), mesh)
  jitted = st.jit_step(step_def, state_shardings=shards,
                       batch_sharding=shd.batch_shardings(batch, mesh))
  new_state, metrics = jitted(state, batch)
  result["loss"] = float(metrics["loss"])
  result["ref_loss"] = float(ref_metrics["loss"])
  max_diff, moved, split_across = 0.0, 0.0, 0
  for x, ref, p0 in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(ref_params),
                        jax.tree.leaves(init)):
    all_blocks = {_block(idx) for idx in x.sharding.devices_indices_map(x.shape).values()}
    split_across += len({_block(sh.index) for sh in x.addressable_shards}) < len(all_blocks)
    for shard in x.addressable_shards:
      max_diff = max(max_diff, float(np.max(np.abs(np.asarray(shard.data) - ref[shard.index]))))
    moved = max(moved, float(np.max(np.abs(ref - p0))))
  rows = sorted({_block(sh.index)[0] for sh in batch.tokens_BS.addressable_shards})
  result.update(max_param_diff=max_diff, max_update=moved,
                params_split_across_processes=split_across,
                rows_held=rows, rows_are_mine=all(
                    np.array_equal(np.asarray(sh.data), raw["tokens_BS"][sh.index])
                    for sh in batch.tokens_BS.addressable_shards))

  # Checkpoint: every process saves and restores the same global state.
  saved = jax.tree.map(lambda x: [np.asarray(s.data) for s in x.addressable_shards], new_state)
  with ckpt_lib.Checkpointer(os.path.join(out_dir, "run"), async_save=True) as ckpt:
    ckpt.save(1, new_state, rng=key, data_state={"process": me}, metric=0.5)
    ckpt.wait()
    target, _ = shd.abstract_train_state(cfg, tx, mesh)
    restored = ckpt.restore(1, target)
  result["restored_steps"] = ckpt.all_steps()
  result["restored_equal"] = all(
      all(np.array_equal(a, np.asarray(s.data)) for a, s in zip(sv, r.addressable_shards))
      and r.sharding == t.sharding
      for sv, r, t in zip(jax.tree.leaves(saved, is_leaf=lambda v: isinstance(v, list)),
                          jax.tree.leaves(restored.state), jax.tree.leaves(target)))
  distributed.sync("test_distributed_done")
  with open(os.path.join(out_dir, f"result{me}.json"), "w") as f:
    json.dump(result, f)


def _block(index) -> tuple:
  """A shard's index (a tuple of slices) as hashable (start, stop) pairs."""
  return tuple((sl.start, sl.stop) for sl in index)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  out = tmp_path_factory.mktemp("distributed")
  port = _free_port()
  procs = []
  for pid in range(2):
    env = dict(os.environ, JAX_PLATFORMS="cpu", SMJAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
               SMJAX_NUM_PROCESSES="2", SMJAX_PROCESS_ID=str(pid))
    # XLA_FLAGS: the suite's fast-compile flags (conftest.py), no fake devices
    procs.append(subprocess.Popen([sys.executable, __file__, str(out)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  logs = []
  try:
    for p in procs:
      logs.append(p.communicate(timeout=300)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for pid, (p, log) in enumerate(zip(procs, logs)):
    assert p.returncode == 0, f"process {pid} failed:\n{log[-4000:]}"
  return [json.loads((out / f"result{pid}.json").read_text()) for pid in range(2)]


def test_two_processes_form_one_mesh(results):
  for r in results:
    assert (r["process_count"], r["device_count"], r["local_devices"]) == (2, 4, 2)
    assert r["params_split_across_processes"] > 0  # not vacuous: fsdp crosses the processes
  # grain gave each process its own group; its rows became its block of the global batch
  assert [r["grain_groups"] for r in results] == [[0], [1]]
  assert [r["rows_held"] for r in results] == [[[0, B // 2]], [[B // 2, B]]]
  assert all(r["rows_are_mine"] for r in results)


def test_sharded_step_equals_one_device_step(results):
  for r in results:
    assert r["max_update"] > 1e-3  # the step moved the parameters
    assert abs(r["loss"] - r["ref_loss"]) <= 1e-5
    assert r["max_param_diff"] <= 1e-5
  assert results[0]["loss"] == results[1]["loss"]


def test_checkpoint_saved_and_restored_by_both_processes(results):
  for r in results:
    assert r["restored_steps"] == [1]
    assert r["restored_equal"]


@pytest.mark.parametrize("environ,expected", [
    ({}, None),
    ({"SMJAX_DISTRIBUTED": "auto"}, "tpu"),
    ({"SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}, "slurm"),
    ({"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"}, None),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "mpi"),
])
def test_detect_cluster(environ, expected):
  from smjax.distributed import detect_cluster
  assert detect_cluster(environ) == expected


def test_maybe_initialize_single_process_is_a_no_op_and_bad_settings_raise():
  from smjax.distributed import maybe_initialize
  assert maybe_initialize(environ={}) is False
  assert maybe_initialize(environ={"SMJAX_COORDINATOR_ADDRESS": "h:1", "SMJAX_NUM_PROCESSES": "1",
                                   "SMJAX_PROCESS_ID": "0"}) is False
  with pytest.raises(ValueError, match="SMJAX_NUM_PROCESSES"):
    maybe_initialize(environ={"SMJAX_COORDINATOR_ADDRESS": "h:1"})
  with pytest.raises(ValueError, match="process_id=2 must be in"):
    maybe_initialize("h:1", 2, 2, environ={})
  with pytest.raises(ValueError, match="no coordinator address"):
    maybe_initialize(environ={"SMJAX_NUM_PROCESSES": "2"})


if __name__ == "__main__":
  _worker(sys.argv[1])
