"""Loading and validating task records from local JSONL (.jsonl, .jsonl.gz) or Parquet files.

A malformed record is an error that names the file, the line (JSONL) or row (Parquet), and the
missing or ill-typed field with what was expected. A caller may adapt each raw record before it is
checked (`load_records(..., adapt=)`: the code domain reads MBPP's own schema so, through
smjax.domains.datasets); this module knows no published data set.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import zlib
from typing import Any, Mapping, Sequence

from smjax.json_io import one_line

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


def _read_parquet(path: str) -> list[tuple[str, Any]]:
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  try:
    rows = pq.read_table(path).to_pylist()
  except (pa.ArrowException, OSError) as e:  # ArrowInvalid: not Parquet, or a truncated footer
    raise ValueError(f"{path}: not a readable Parquet file ({one_line(e, 200)}); expected a "
                     "Parquet table with one row per record; re-export or re-download it") from None
  return [(f"row {i + 1}", rec) for i, rec in enumerate(rows)]


def _read_jsonl(path: str) -> list[tuple[str, Any]]:
  # Bytes are decoded line by line, so a bad byte is reported with its line number.
  opener = gzip.open if path.endswith(".gz") else open
  out, i = [], 0
  try:
    with opener(path, "rb") as f:
      for i, raw in enumerate(f, start=1):
        try:
          line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          raise ValueError(f"{path}:{i}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                           f"{e.start + 1}); expected UTF-8 JSON lines; re-encode the file as "
                           "UTF-8 (e.g. iconv -t utf-8)") from None
        if not line.strip():
          continue
        try:
          out.append((f"line {i}", json.loads(line)))
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{i}: not valid JSON ({e.msg}, column {e.colno}); expected "
                           "one JSON object per line; fix or remove that line") from None
  except (EOFError, OSError, zlib.error) as e:  # gzip: truncated stream, bad header, bad data
    if not path.endswith(".gz"):
      raise
    raise ValueError(f"{path}: the gzip stream is truncated or corrupt after line {i} "
                     f"({type(e).__name__}: {one_line(e, 200)}); expected a complete gzip file "
                     "of JSON lines; re-download or re-compress it (gzip -t checks it)") from None
  return out


def _read_raw(path: str) -> list[tuple[str, Any]]:
  """[(location, record)] where location is 'line N' or 'row N' (1-based). The whole file is read
  and decoded before any record is used, so a fault anywhere in it raises first."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such file (expected a .jsonl, .jsonl.gz or .parquet)")
  if path.endswith(".parquet"):
    return _read_parquet(path)
  if not path.endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson")):
    raise ValueError(f"{path}: unknown file type (expected .jsonl, .jsonl.gz or .parquet)")
  return _read_jsonl(path)


def location(path: str, where: str) -> str:
  """How errors name a record: "file:N" for JSONL line N, "file: row N" for a Parquet row."""
  return f"{path}:{where.split()[1]}" if where.startswith("line") else f"{path}: {where}"


def _check(path: str, where: str, rec: Any, schema: Schema) -> dict:
  loc = location(path, where)
  if not isinstance(rec, dict):
    raise ValueError(f"{loc}: record is {type(rec).__name__}, expected a JSON object with fields "
                     f"{sorted(schema)}; fix or remove the record")
  out = dict(rec)
  for field, (types, aliases, expected) in schema.items():
    name = next((n for n in (field,) + aliases if n in rec), None)
    if name is None:
      alias = f" (or {' / '.join(repr(a) for a in aliases)})" if aliases else ""
      raise ValueError(f"{loc}: missing field {field!r}{alias}: expected {expected}; record has "
                       f"{sorted(rec)}; add the field or remove the record")
    value = rec[name]
    if not isinstance(value, types) or isinstance(value, bool) or (
        isinstance(value, list) and not all(isinstance(v, str) for v in value)):
      raise ValueError(f"{loc}: field {name!r} is {type(value).__name__} "
                       f"({str(value)[:60]!r}), expected {expected}; fix or remove the record")
    out[field] = value
  return out


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, mtime: float, schema_key: str, adapt) -> tuple[dict, ...]:
  del mtime  # part of the cache key only
  schema = {"math": MATH_SCHEMA, "code": CODE_SCHEMA}[schema_key]
  recs = []
  for where, rec in _read_raw(path):
    if adapt is not None:
      rec = adapt(rec, location(path, where))
    rec = _check(path, where, rec, schema)
    rec["_where"] = f"{path}:{where}"
    recs.append(rec)
  if not recs:
    raise ValueError(f"{path}: no records (the file is empty or blank); expected at least one "
                     f"{schema_key} record with fields {sorted(schema)}")
  return tuple(recs)


def load_records(path: str, kind: str, adapt=None) -> Sequence[dict]:
  """Validated records of `kind` "math" ({question, answer}) or "code" ({prompt, tests,
  entry_point}); each gets `_where` = "file:line N" / "file:row N". Cached per file version.
  `adapt(raw record, its location) -> record`, when given, runs on each record before the check
  (a module-level function: it is part of the cache key)."""
  if kind not in ("math", "code"):
    raise ValueError(f"kind={kind!r} must be 'math' or 'code'")
  path = os.path.abspath(os.path.expanduser(path))
  mtime = os.path.getmtime(path) if os.path.exists(path) else 0.0
  return _load_cached(path, mtime, kind, adapt)
