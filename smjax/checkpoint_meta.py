"""What a checkpoint stores beside its arrays (smjax.checkpoint): JSON-safe metadata, config diffs,
RNG states, the state's tree signature and per-leaf bit checksums; and `read_json`, the one reader
of the project's small JSON files, whose errors name the file, the line or field, and what to do.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from smjax import paths

_BYTES_TAG = "__bytes_b64__"


# ------------------------------------------------------------------------------ JSON files

def one_line(text: Any, limit: int = 300) -> str:
  """`text` with its whitespace runs (newlines included) collapsed, cut to `limit` characters: a
  library's message quoted inside ours keeps the error on one line."""
  return " ".join(str(text).split())[:limit]


def require_keys(obj: Any, keys: Sequence[str], path: str, what: str) -> dict:
  """`obj` if it is a JSON object holding every one of `keys`; else a ValueError naming the file
  and the first missing field. `what` says what to do about it."""
  if not isinstance(obj, dict):
    raise ValueError(f"{path}: holds a JSON {type(obj).__name__}, expected a JSON object; {what}")
  missing = [k for k in keys if k not in obj]
  if missing:
    raise ValueError(f"{path}: field {missing[0]!r} is missing (expected fields {list(keys)}; the "
                     f"file has {sorted(obj)[:12]}); {what}")
  return obj


def read_json(path: str, what: str, *, keys: Sequence[str] = ()) -> dict:
  """The JSON object in the file `path` (local or a URL, smjax.paths), holding every one of `keys`.

  Every fault is one line naming the file: FileNotFoundError if it is absent, ValueError if it is
  not UTF-8, not valid JSON (with the line and column), not an object, or lacks one of `keys`.
  `what` is what the user should do about it, e.g. "delete the phase directory to rerun it".
  """
  try:
    text = paths.read_text(path)
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: no such file (expected a JSON object); {what}") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                     f"{e.start}); expected a JSON object; {what}") from None
  try:
    obj = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno} column {e.colno}); "
                     f"expected a JSON object; {what}") from None
  return require_keys(obj, keys, path, what)


# ------------------------------------------------------------------------------ JSON helpers

def _to_json(x: Any, path: str = "") -> Any:
  """A JSON-safe copy: dataclasses and ConfigDicts as dicts, tuples as lists, bytes tagged."""
  if isinstance(x, (str, bool, int, float)) or x is None:
    return x
  if isinstance(x, (bytes, bytearray)):
    return {_BYTES_TAG: base64.b64encode(bytes(x)).decode("ascii")}
  if isinstance(x, np.generic) or (isinstance(x, (np.ndarray, jax.Array)) and x.ndim == 0):
    return np.asarray(x).item()
  if isinstance(x, (np.ndarray, jax.Array)):
    return np.asarray(x).tolist()
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    x = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
  elif not isinstance(x, Mapping) and callable(getattr(x, "to_dict", None)):
    x = x.to_dict()  # ml_collections.ConfigDict, FlopLedger
  if isinstance(x, Mapping):
    return {str(k): _to_json(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_to_json(v, f"{path}[{i}]") for i, v in enumerate(x)]
  raise TypeError(f"checkpoint: {path or 'value'} of type {type(x).__name__} is not JSON-able; "
                  "pass dicts, lists, numbers, strings, bytes or dataclasses")


def _from_json(x: Any) -> Any:
  if isinstance(x, dict):
    if set(x) == {_BYTES_TAG}:
      return base64.b64decode(x[_BYTES_TAG])
    return {k: _from_json(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_from_json(v) for v in x]
  return x


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
  if not isinstance(d, dict):
    return {prefix: d}
  out = {}
  for k, v in d.items():
    out.update(_flatten(v, f"{prefix}.{k}" if prefix else k))
  return out


def flat_fields(d: Any) -> list[str]:
  """The dotted names of every leaf field of a (JSON-like) config dict."""
  return list(_flatten(_to_json(d)))


def _ignored(field: str, ignore: Sequence[str]) -> bool:
  return any(field == f or field.endswith("." + f) or field.startswith(f + ".") for f in ignore)


def config_diff(old: Any, new: Any, ignore_fields: Sequence[str] = ()) -> list[str]:
  """`field: old -> new` for every dotted field that differs and is not run-neutral."""
  a, b = _flatten(_to_json(old)), _flatten(_to_json(new))
  rows = []
  for k in sorted(set(a) | set(b)):
    if _ignored(k, ignore_fields):
      continue
    va, vb = a.get(k, "<absent>"), b.get(k, "<absent>")
    if va != vb or type(va) is not type(vb):
      rows.append(f"{k}: {va!r} -> {vb!r}")
  return rows


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
