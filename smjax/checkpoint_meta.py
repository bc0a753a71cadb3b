"""What a checkpoint stores beside its arrays (smjax.checkpoint) that needs jax: RNG states, the
state's tree signature, per-leaf bit checksums and the abstract restore target. Its JSON (JSON-safe
copies, config diffs) is smjax.json_io, which does not import jax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


# ---------------------------------------------------------------------- RNG and tree signature

def _rng_to_json(key) -> dict | None:
  if key is None:
    return None
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    return {"typed": True, "impl": str(jax.random.key_impl(key)),
            "data": np.asarray(jax.random.key_data(key)).tolist()}
  return {"typed": False, "dtype": str(key.dtype), "data": np.asarray(key).tolist()}


def _rng_from_json(d: dict | None):
  if d is None:
    return None
  if d["typed"]:
    return jax.random.wrap_key_data(jnp.asarray(d["data"], jnp.uint32), impl=d["impl"])
  return jnp.asarray(np.asarray(d["data"], dtype=d["dtype"]))


def _host_rng_to_json(gen: np.random.Generator | None) -> dict | None:
  if gen is None:
    return None
  return {"bit_generator": type(gen.bit_generator).__name__, "state": gen.bit_generator.state}


def _host_rng_from_json(d: dict | None) -> np.random.Generator | None:
  if d is None:
    return None
  bit_gen = getattr(np.random, d["bit_generator"])()
  bit_gen.state = d["state"]
  return np.random.Generator(bit_gen)


def _signature(tree) -> dict[str, str]:
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(p): f"{np.dtype(x.dtype).name}{list(x.shape)}" for p, x in flat}


def _leaf_checksum(x: jax.Array) -> jax.Array:
  """Sum of the bit patterns times odd position weights, mod 2**32: any single changed element
  changes it, it is exact (integer arithmetic, any reduction order) and sharded arrays reduce
  in place (no reshape)."""
  itemsize = np.dtype(x.dtype).itemsize
  if x.dtype == jnp.bool_:
    bits = x.astype(jnp.uint32)
  else:
    bits = jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16}.get(itemsize, jnp.uint32))
    bits = bits.astype(jnp.uint32)
  index = jnp.zeros(bits.shape, jnp.uint32)
  for axis in range(bits.ndim):
    index = index * jnp.uint32(bits.shape[axis]) + jax.lax.broadcasted_iota(
        jnp.uint32, bits.shape, axis)
  weight = index * jnp.uint32(0x9E3779B1) | jnp.uint32(1)
  return jnp.sum(bits * weight, dtype=jnp.uint32)


_checksums = jax.jit(lambda tree: [_leaf_checksum(x) for x in jax.tree.leaves(tree)])


def _checksum_dict(tree) -> dict[str, int]:
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  return dict(zip(paths, (int(c) for c in jax.device_get(_checksums(tree)))))


def _abstract(target):
  """ShapeDtypeStructs with shardings (single default device where a leaf has none)."""
  default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  def leaf(x):
    sharding = getattr(x, "sharding", None) or default
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return jax.tree.map(leaf, target)
