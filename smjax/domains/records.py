"""Loading and validating task records from local JSONL (.jsonl, .jsonl.gz) or Parquet files.

A malformed record is an error that names the file, the line (JSONL) or row (Parquet), and the
missing or ill-typed field with what was expected.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
from typing import Any, Mapping, Sequence

# field -> (accepted types, aliases, description of what is expected)
Schema = Mapping[str, tuple[tuple[type, ...], tuple[str, ...], str]]

MATH_SCHEMA: Schema = {
    "question": ((str,), ("problem",), "a string"),
    "answer": ((str, int, float), ("solution",), "a string or a number"),
}
CODE_SCHEMA: Schema = {
    "prompt": ((str,), (), "a string"),
    "tests": ((str, list), ("test", "test_list"), "test code: a string or a list of strings"),
    "entry_point": ((str,), (), "the name of the function under test (a string)"),
}


def _read_raw(path: str) -> list[tuple[str, Any]]:
  """[(location, record)] where location is 'line N' or 'row N' (1-based)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such file (expected a .jsonl, .jsonl.gz or .parquet)")
  if path.endswith(".parquet"):
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    return [(f"row {i + 1}", rec) for i, rec in enumerate(pq.read_table(path).to_pylist())]
  if not path.endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson")):
    raise ValueError(f"{path}: unknown file type (expected .jsonl, .jsonl.gz or .parquet)")
  opener = gzip.open if path.endswith(".gz") else open
  out = []
  with opener(path, "rt", encoding="utf-8") as f:
    for i, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        out.append((f"line {i}", json.loads(line)))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{i}: not valid JSON ({e.msg} at column {e.colno})") from None
  return out


def _check(path: str, where: str, rec: Any, schema: Schema) -> dict:
  loc = f"{path}:{where.split()[1]}" if where.startswith("line") else f"{path}: {where}"
  if not isinstance(rec, dict):
    raise ValueError(f"{loc}: record is {type(rec).__name__}, expected a JSON object with fields "
                     f"{sorted(schema)}")
  out = dict(rec)
  for field, (types, aliases, expected) in schema.items():
    name = next((n for n in (field,) + aliases if n in rec), None)
    if name is None:
      alias = f" (or {' / '.join(repr(a) for a in aliases)})" if aliases else ""
      raise ValueError(f"{loc}: missing field {field!r}{alias}: expected {expected}; record has "
                       f"{sorted(rec)}")
    value = rec[name]
    if not isinstance(value, types) or isinstance(value, bool) or (
        isinstance(value, list) and not all(isinstance(v, str) for v in value)):
      raise ValueError(f"{loc}: field {name!r} is {type(value).__name__} "
                       f"({str(value)[:60]!r}), expected {expected}")
    out[field] = value
  return out


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, mtime: float, schema_key: str) -> tuple[dict, ...]:
  del mtime  # part of the cache key only
  schema = {"math": MATH_SCHEMA, "code": CODE_SCHEMA}[schema_key]
  recs = []
  for where, rec in _read_raw(path):
    rec = _check(path, where, rec, schema)
    rec["_where"] = f"{path}:{where}"
    recs.append(rec)
  if not recs:
    raise ValueError(f"{path}: no records")
  return tuple(recs)


def load_records(path: str, kind: str) -> Sequence[dict]:
  """Validated records of `kind` "math" ({question, answer}) or "code" ({prompt, tests,
  entry_point}); each gets `_where` = "file:line N" / "file:row N". Cached per file version."""
  if kind not in ("math", "code"):
    raise ValueError(f"kind={kind!r} must be 'math' or 'code'")
  path = os.path.abspath(os.path.expanduser(path))
  mtime = os.path.getmtime(path) if os.path.exists(path) else 0.0
  return _load_cached(path, mtime, kind)
