"""The project's JSON, read and written without jax: `read_json`, the one reader of its small JSON
files, whose errors name the file, the line or field, and what to do; JSON-safe copies of what a
run records (`to_json`, `from_json`: dataclasses, ConfigDicts, arrays, bytes); and a config's
dotted fields and their differences (`flat_fields`, `config_diff`).

It imports no jax, so what only reads files (`smjax status`, the tokenizer and chat-template
loaders) starts without it. smjax.checkpoint_meta holds what needs jax: RNG keys, tree signatures
and checksums.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
from typing import Any, Mapping, Sequence

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

def _is_array(x: Any) -> bool:
  """A numpy or jax array (a jax.Array exists only once jax is imported, so this module need
  not import it)."""
  jax = sys.modules.get("jax")
  return isinstance(x, np.ndarray) or (jax is not None and isinstance(x, jax.Array))


def to_json(x: Any, path: str = "") -> Any:
  """A JSON-safe copy: dataclasses and ConfigDicts as dicts, tuples as lists, bytes tagged."""
  if isinstance(x, (str, bool, int, float)) or x is None:
    return x
  if isinstance(x, (bytes, bytearray)):
    return {_BYTES_TAG: base64.b64encode(bytes(x)).decode("ascii")}
  if isinstance(x, np.generic) or (_is_array(x) and x.ndim == 0):
    return np.asarray(x).item()
  if _is_array(x):
    return np.asarray(x).tolist()
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    x = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
  elif not isinstance(x, Mapping) and callable(getattr(x, "to_dict", None)):
    x = x.to_dict()  # ml_collections.ConfigDict, FlopLedger
  if isinstance(x, Mapping):
    return {str(k): to_json(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [to_json(v, f"{path}[{i}]") for i, v in enumerate(x)]
  raise TypeError(f"checkpoint: {path or 'value'} of type {type(x).__name__} is not JSON-able; "
                  "pass dicts, lists, numbers, strings, bytes or dataclasses")


def from_json(x: Any) -> Any:
  if isinstance(x, dict):
    if set(x) == {_BYTES_TAG}:
      return base64.b64decode(x[_BYTES_TAG])
    return {k: from_json(v) for k, v in x.items()}
  if isinstance(x, list):
    return [from_json(v) for v in x]
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
  return list(_flatten(to_json(d)))


def _ignored(field: str, ignore: Sequence[str]) -> bool:
  return any(field == f or field.endswith("." + f) or field.startswith(f + ".") for f in ignore)


def config_diff(old: Any, new: Any, ignore_fields: Sequence[str] = ()) -> list[str]:
  """`field: old -> new` for every dotted field that differs and is not run-neutral."""
  a, b = _flatten(to_json(old)), _flatten(to_json(new))
  rows = []
  for k in sorted(set(a) | set(b)):
    if _ignored(k, ignore_fields):
      continue
    va, vb = a.get(k, "<absent>"), b.get(k, "<absent>")
    if va != vb or type(va) is not type(vb):
      rows.append(f"{k}: {va!r} -> {vb!r}")
  return rows
