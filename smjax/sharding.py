"""Meshes, logical-axis rules and the shardings of parameters, states and batches.

Every parameter carries logical axis names (`nn.with_logical_partitioning` in the model); one rules
table maps them to the mesh axes `("data", "fsdp", "tensor")`. A logical dimension whose size the
mesh axes do not divide is replicated instead (e.g. 2 KV heads on a tensor axis of 4), so any preset
runs on any mesh; `describe` says where that happened.

Train states and batches: `init_sharded_state` creates a TrainState already sharded (optimiser
moments follow their parameters), `abstract_train_state` gives the same shardings without
allocating (AOT compiles, checkpoint restores), `batch_shardings` / `shard_host_batch` split batch
rows over ("data", "fsdp") (and [B, T, V] logits' vocab over "tensor"), also from per-process data
on several hosts (smjax/distributed.py). `mesh_from_config` builds the mesh from a config.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis -> mesh axes (None: replicated)
LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("norm", None),
)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, *,
              devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A ("data", "fsdp", "tensor") mesh with Auto axis types over all (or the given) devices.

  `data=-1` takes whatever devices the other axes leave.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = [data, fsdp, tensor]
  if shape.count(-1) > 1:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))}: at most one axis may be -1")
  if -1 in shape:
    rest = int(np.prod([s for s in shape if s != -1]))
    if len(devices) % rest:
      raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))}: {len(devices)} devices are not a "
                       f"multiple of {rest}")
    shape[shape.index(-1)] = len(devices) // rest
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} devices; "
                     f"{len(devices)} are available")
  try:
    return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
  except NotImplementedError:
    # A TPU torus whose axes do not multiply to the mesh's (data=8, fsdp=8 on v5p's 4x4x4):
    # jax.make_mesh refuses to split a physical axis; mesh_utils can when asked.
    from jax.experimental import mesh_utils
    grid = mesh_utils.create_device_mesh(tuple(shape), devices, allow_split_physical_axes=True)
    return jax.sharding.Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def _axis_size(mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else axes
  return int(np.prod([mesh.shape[a] for a in axes]))


def spec_for(shape: Sequence[int], logical: Sequence[str | None], mesh,
             rules=LOGICAL_RULES) -> P:
  """The PartitionSpec of one array: its logical axes through the rules, undivisible dims replicated,
  and no mesh axis used twice."""
  table = dict(rules)
  out, used = [], set()
  for size, name in zip(shape, logical):
    axes = table.get(name) if name is not None else None
    flat = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    flat = tuple(a for a in flat if a not in used and mesh.shape.get(a, 1) > 1)
    if not flat or size % _axis_size(mesh, flat):
      out.append(None)
      continue
    used.update(flat)
    out.append(flat[0] if len(flat) == 1 else flat)
  return P(*out)


def param_shardings(abstract_params, logical_axes, mesh, rules=LOGICAL_RULES):
  """NamedShardings for a parameter tree given its logical axis names (a tree of PartitionSpecs)."""
  return jax.tree.map(
      lambda spec, a: NamedSharding(mesh, spec_for(a.shape, tuple(spec), mesh, rules)),
      logical_axes, abstract_params, is_leaf=lambda x: isinstance(x, P))


def init_sharded_params(cfg, mesh, rng, rules=LOGICAL_RULES):
  """Creates the model's parameters directly sharded: eval_shape -> shardings -> jit(init)."""
  # pylint: disable-next=import-outside-toplevel
  from smjax.models.transformer import init_params, param_logical_axes  # avoid import cycle

  def init(key):
    return init_params(cfg, key)

  abstract = jax.eval_shape(init, rng)
  shardings = param_shardings(abstract, param_logical_axes(cfg), mesh, rules)
  return jax.jit(init, out_shardings=shardings)(rng), shardings


def batch_sharding(mesh, ndim: int = 2) -> NamedSharding:
  """Leading (batch) dim over ("data", "fsdp"); the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def shard_batch(batch, mesh):
  """Places every array of a host batch with its leading dim split over the batch axes."""
  return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, np.ndim(x))
                                               if np.ndim(x) else replicated(mesh)), batch)


def describe(params, shardings) -> str:
  """A human-readable table: parameter path, shape, PartitionSpec."""
  rows = []
  flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
  flat_s = jax.tree_util.tree_leaves(shardings)
  for (path, p), s in zip(flat_p, flat_s):
    rows.append(f"{jax.tree_util.keystr(path):50s} {str(tuple(p.shape)):22s} {s.spec}")
  return "\n".join(rows)


# ------------------------------------------------------------------- meshes from configs

def parse_mesh(spec: str) -> dict[str, int]:
  """`"data=8,fsdp=8,tensor=1"` -> {"data": 8, "fsdp": 8, "tensor": 1}; missing axes are 1."""
  shape = {a: 1 for a in MESH_AXES}
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, _, size = part.partition("=")
    if name not in MESH_AXES or not size.lstrip("-").isdigit():
      raise ValueError(f"mesh spec {spec!r}: {part!r} must be AXIS=INT with AXIS in {MESH_AXES}")
    shape[name] = int(size)
  return shape


def mesh_from_config(cfg, *, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A mesh from a config holding `data`, `fsdp` and `tensor` ints (a dict, an ml_collections
  ConfigDict, or a "data=2,fsdp=4" string); absent axes are 1, one axis may be -1."""
  if isinstance(cfg, str):
    shape = parse_mesh(cfg)
  else:
    keys = set(cfg.keys())
    unknown = keys - set(MESH_AXES)
    if unknown:
      raise ValueError(f"mesh config has unknown axes {sorted(unknown)}; expected {MESH_AXES}")
    shape = {a: int(cfg[a]) if a in keys else 1 for a in MESH_AXES}
  return make_mesh(**shape, devices=devices)


def batch_shard_count(mesh) -> int:
  """How many ways the batch rows are split: the product of the batch axes' sizes."""
  return _axis_size(mesh, tuple(a for a in BATCH_AXES if a in mesh.shape))


def is_sharded(sharding) -> bool:
  """True when a NamedSharding splits its array over some mesh axis of size > 1."""
  mesh = sharding.mesh
  return any(_axis_size(mesh, axes) > 1 for axes in sharding.spec if axes is not None)


# ------------------------------------------------------------------ train-state shardings

def opt_state_shardings(tx, abstract_opt_state, param_shards, mesh):
  """Shardings of an optimiser state: every copy of the parameter tree inside it (Adam's mu and
  nu, ...) follows the parameters' shardings; everything else (step counts) is replicated."""
  import optax  # local: keeps this module importable without optax for mesh-only users

  return optax.tree_map_params(tx, lambda _, s: s, abstract_opt_state, param_shards,
                               transform_non_params=lambda _: replicated(mesh))


def abstract_train_state(cfg, tx, mesh, rules=LOGICAL_RULES):
  """(TrainState of ShapeDtypeStructs carrying their shardings, TrainState of shardings) for a
  model config and optimiser; allocates nothing (for AOT compiles and checkpoint restores)."""
  from smjax.models.transformer import init_params, param_logical_axes
  from smjax.train.state import TrainState, create_state

  abstract_params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  param_shards = param_shardings(abstract_params, param_logical_axes(cfg), mesh, rules)
  abstract = jax.eval_shape(lambda p: create_state(p, tx), abstract_params)
  shards = TrainState(step=replicated(mesh), params=param_shards,
                      opt_state=opt_state_shardings(tx, abstract.opt_state, param_shards, mesh))
  with_shards = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                             abstract, shards)
  return with_shards, shards


def init_sharded_state(cfg, tx, mesh, rng, rules=LOGICAL_RULES):
  """A fresh TrainState created directly sharded (params by the rules, optimiser state following
  them) and its shardings, for `jit_step(state_shardings=...)`. One jitted program with
  out_shardings: nothing is ever built whole on one device."""
  from smjax.models.transformer import init_params
  from smjax.train.state import create_state

  _, shards = abstract_train_state(cfg, tx, mesh, rules)
  state = jax.jit(lambda key: create_state(init_params(cfg, key), tx), out_shardings=shards)(rng)
  return state, shards


# ------------------------------------------------------------------------ batch shardings

def _batch_spec(shape, mesh, name: str) -> P:
  if not shape:
    return P()
  rows, shards = shape[0], batch_shard_count(mesh)
  if rows % shards:
    raise ValueError(f"batch field {name} has {rows} rows, not divisible by the {shards} batch "
                     f"shards of mesh {dict(mesh.shape)} (axes {BATCH_AXES})")
  # [B, T, V] logits also split their vocabulary like the model's lm_head (when it divides).
  logical = ("batch", None, "vocab") if len(shape) == 3 else ("batch",) + (None,) * (len(shape) - 1)
  return spec_for(shape, logical, mesh)


def batch_shardings(batch, mesh):
  """Shardings of a batch pytree (e.g. a SequenceBatch): rows over ("data", "fsdp"), [B, T, V]
  logits also over "tensor" on V where it divides, scalars replicated. Raises ValueError when
  the rows do not divide the batch shards. Works on arrays and ShapeDtypeStructs alike."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(batch)
  name = lambda path: jax.tree_util.keystr(path).lstrip(".")  # noqa: E731
  return jax.tree_util.tree_unflatten(treedef, [
      NamedSharding(mesh, _batch_spec(tuple(x.shape), mesh, name(path))) for path, x in flat])


def shard_host_batch(batch, mesh, shardings=None):
  """Global arrays from this process's part of a batch (numpy or arrays).

  One process: the whole batch, placed by `batch_shardings`. Several processes (each reading its
  own share, e.g. grain sharded by `smjax.distributed.grain_shard_options`): each passes the rows
  its devices hold, and the global batch has `local rows x processes-along-the-batch-axes` rows,
  process 0's first (jax.make_mesh orders devices by process). Other dims are taken whole.
  """
  host = jax.tree.map(np.asarray, batch)
  blocks = _row_blocks_per_process(mesh)
  structs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      (x.shape[0] * blocks,) + x.shape[1:] if x.ndim else (), x.dtype), host)
  shardings = batch_shardings(structs, mesh) if shardings is None else shardings
  return jax.tree.map(lambda x, st, s: jax.make_array_from_process_local_data(s, x, st.shape),
                      host, structs, shardings)


def _row_blocks_per_process(mesh) -> int:
  """Global rows / this process's rows: batch shards over the distinct batch-axis coordinates of
  this process's devices (1 with one process)."""
  axes = [mesh.axis_names.index(a) for a in BATCH_AXES if mesh.shape.get(a, 1) > 1]
  if not axes:
    return 1
  me = jax.process_index()
  mine = {tuple(pos[i] for i in axes) for pos, d in np.ndenumerate(mesh.devices)
          if d.process_index == me}
  return batch_shard_count(mesh) // len(mine)
