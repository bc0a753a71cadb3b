"""Multi-host runs: jax's multi-controller runtime, per-process data shards, and checkpoints.

One program runs on every host (TPU-VM worker or GPU node); each process drives its local devices
and `jax.devices()` lists the devices of all of them, so meshes, `jit` and shardings are global
and the code is the same as on one host. Call `maybe_initialize()` first thing in `main`, before
any jax computation: it calls `jax.distributed.initialize` when the process is one of several and
is a no-op otherwise (and on a second call).

How a process learns it is one of several, in this order:
  1. arguments `coordinator_address`, `num_processes`, `process_id` (GPU clusters: launch/gpu.sh
     passes them as the environment variables below);
  2. `SMJAX_COORDINATOR_ADDRESS` (host:port of process 0), `SMJAX_NUM_PROCESSES`,
     `SMJAX_PROCESS_ID` (jax's own `JAX_COORDINATOR_ADDRESS` / `JAX_NUM_PROCESSES` /
     `JAX_PROCESS_ID` work too);
  3. a managed cluster that jax detects by itself: a Cloud TPU pod slice (launch/tpu.sh sets
     `SMJAX_DISTRIBUTED=auto` on every worker; TPU VMs then read the worker list from the metadata
     server), Slurm (`SLURM_NTASKS` > 1) or Open MPI (`OMPI_COMM_WORLD_SIZE` > 1).
On CPU (tests, laptops) cross-process collectives use gloo (`jax_cpu_collectives_implementation`).

Data: every process loads only its share of each global batch. With grain, shard the source by
process (`grain_shard_options()`: shard_index = jax.process_index(), shard_count =
jax.process_count()), load `per_process_batch_size(global_batch)` rows per step and turn them into
global arrays with `smjax.sharding.shard_host_batch(local_batch, mesh)`; process p's rows become
rows [p * local, (p + 1) * local) of the global batch. Each process saves its own grain iterator
state (its `get_state()`) in the checkpoint's meta.

Checkpoints (smjax/checkpoint.py, orbax): *every* process calls `save` and `restore` with the same
step and the same global state; orbax writes each array shard once (from the process holding its
first replica) and the small JSON meta from process 0, and coordinates the commit with barriers.
The directory must be one that all hosts see: a `gs://` bucket on TPU pods, a shared file system
on GPU clusters; a per-host local disk (a TPU VM's own /tmp) gives each host only its shards.
Restore onto the target's shardings (`smjax.sharding.abstract_train_state`), so each process reads
only the shards it holds. tests/test_distributed.py runs all of this with two processes on CPU.
"""

from __future__ import annotations

import logging
import os

import jax

_log = logging.getLogger(__name__)
_COORD = ("SMJAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")
_NUM = ("SMJAX_NUM_PROCESSES", "JAX_NUM_PROCESSES")
_PID = ("SMJAX_PROCESS_ID", "JAX_PROCESS_ID")


def _env(names, environ) -> str | None:
  for name in names:
    if environ.get(name):
      return environ[name]
  return None


def detect_cluster(environ=None) -> str | None:
  """The managed multi-process environment jax can initialise itself in: "tpu" (when
  SMJAX_DISTRIBUTED=auto, as launch/tpu.sh sets), "slurm", "mpi", or None."""
  environ = os.environ if environ is None else environ
  if environ.get("SMJAX_DISTRIBUTED") == "auto":
    return "tpu"
  if int(environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_JOB_ID" in environ:
    return "slurm"
  if int(environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
    return "mpi"
  return None


def _backends_started() -> bool:
  from jax._src import xla_bridge  # no public "has the backend started?" query
  return xla_bridge.backends_are_initialized()


def maybe_initialize(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None, *, local_device_ids=None,
                     initialization_timeout: int = 300, environ=None) -> bool:
  """Joins the multi-process runtime when this process is one of several (module docstring);
  returns True if it is (now or already) part of a multi-process run. Idempotent."""
  if jax.distributed.is_initialized():
    return True
  environ = os.environ if environ is None else environ
  coordinator_address = coordinator_address or _env(_COORD, environ)
  num = num_processes if num_processes is not None else _env(_NUM, environ)
  pid = process_id if process_id is not None else _env(_PID, environ)
  cluster = None
  if coordinator_address is None:
    cluster = detect_cluster(environ)
    if cluster is None:
      if num is not None and int(num) > 1:
        raise ValueError(f"distributed: {num} processes requested but no coordinator address; "
                         f"set {_COORD[0]}=host:port (process 0's address)")
      return False
  else:
    if num is None or pid is None:
      raise ValueError(f"distributed: coordinator {coordinator_address!r} given without the "
                       f"process count and id; set {_NUM[0]} and {_PID[0]} (or pass them)")
    num, pid = int(num), int(pid)
    if not 0 <= pid < num:
      raise ValueError(f"distributed: process_id={pid} must be in [0, num_processes={num})")
    if num == 1:
      return False
  if _backends_started():
    raise RuntimeError("distributed.maybe_initialize() must run before any jax computation "
                       "(jax's backends have already started in this process)")
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU cross-process
  if cluster is not None:
    _log.info("distributed: initialising from the %s environment", cluster)
    jax.distributed.initialize(local_device_ids=local_device_ids,
                               initialization_timeout=initialization_timeout)
  else:
    _log.info("distributed: process %d of %d, coordinator %s", pid, num, coordinator_address)
    jax.distributed.initialize(coordinator_address, num, pid, local_device_ids=local_device_ids,
                               initialization_timeout=initialization_timeout)
  return True


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def is_coordinator() -> bool:
  """True on process 0: the one that prints, writes reports and logs metrics."""
  return jax.process_index() == 0


def per_process_batch_size(global_batch: int) -> int:
  """Rows each process loads per step."""
  count = jax.process_count()
  if global_batch % count:
    raise ValueError(f"global batch {global_batch} must be divisible by the {count} processes")
  return global_batch // count


def grain_shard_options(*, drop_remainder: bool = True):
  """grain ShardOptions giving this process its own 1/process_count of the records: pass them to
  `grain.samplers.IndexSampler(shard_options=...)` / a `grain.DataLoader`, or slice a MapDataset
  with `ds[opts.shard_index::opts.shard_count]`."""
  import grain  # optional here: only data pipelines need it

  return grain.sharding.ShardOptions(shard_index=jax.process_index(),
                                     shard_count=jax.process_count(),
                                     drop_remainder=drop_remainder)


def sync(name: str) -> None:
  """A barrier over all processes (no-op with one)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
