"""Meshes, logical-axis rules and the shardings of parameters, states and batches.

Every parameter carries logical axis names (`nn.with_logical_partitioning` in the model); one rules
table maps them to the mesh axes `("data", "fsdp", "tensor")`. A logical dimension whose size the
mesh axes do not divide is replicated instead (e.g. 2 KV heads on a tensor axis of 4), so any preset
runs on any mesh; `describe` says where that happened.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
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
  return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


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
  from smjax.models.transformer import Transformer, param_logical_axes  # avoid import cycle
  import jax.numpy as jnp

  def init(key):
    variables = Transformer(cfg).init(key, jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32))
    return nn.unbox(variables["params"])

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


def shardings_of(tree):
  """The shardings a (sharded-initialised) tree of arrays actually has: the in/out shardings of a
  jitted step are read off the state it was created with, so optimiser states follow their params."""
  return jax.tree.map(lambda x: x.sharding, tree)


def describe(params, shardings) -> str:
  """A human-readable table: parameter path, shape, PartitionSpec."""
  rows = []
  flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
  flat_s = jax.tree_util.tree_leaves(shardings)
  for (path, p), s in zip(flat_p, flat_s):
    rows.append(f"{jax.tree_util.keystr(path):50s} {str(tuple(p.shape)):22s} {s.spec}")
  return "\n".join(rows)
