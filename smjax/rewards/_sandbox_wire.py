"""Wire format shared by the host (sandbox.py) and the sandbox processes: length-prefixed JSON
messages on pipes, and a type-exact encoding of plain data.

Standard library only: the sandbox runs it with no site-packages. Messages are a 4-byte
big-endian length and UTF-8 JSON. Values cross the boundary only as plain data (None, bool, int,
float, str, bytes, complex and list/tuple/dict/set/frozenset of them), tagged with their exact
type, so a candidate cannot return an object whose __eq__ lies, and 1, 1.0 and True differ.
"""

import json
import os
import select
import struct
import time

MAX_MSG = 8 << 20


def read_exact(fd, n, deadline=None):
  """Reads exactly n bytes (None on EOF or past the deadline)."""
  chunks, got = [], 0
  while got < n:
    if deadline is not None:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        return None
    try:
      b = os.read(fd, min(n - got, 1 << 20))
    except (BlockingIOError, InterruptedError):
      continue
    if not b:
      return None
    chunks.append(b)
    got += len(b)
  return b"".join(chunks)


def read_msg(fd, deadline=None, limit=MAX_MSG):
  head = read_exact(fd, 4, deadline)
  if head is None:
    return None
  (n,) = struct.unpack(">I", head)
  if n > limit:
    raise ValueError(f"message of {n} bytes exceeds the {limit}-byte limit")
  body = read_exact(fd, n, deadline)
  return None if body is None else json.loads(body)


def write_msg(fd, obj, deadline=None):
  """Writes one message. Returns False when the reader has gone (EPIPE) or, with a deadline,
  stalls: the caller then still reads what the reader sent before going (a candidate that
  failed to load has written its error and exited)."""
  data = json.dumps(obj, separators=(",", ":")).encode()
  data = memoryview(struct.pack(">I", len(data)) + data)
  while data:
    if deadline is not None:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([], [fd], [], left)[1]:
        return False
    try:
      data = data[os.write(fd, data[:65536] if deadline is not None else data):]
    except BrokenPipeError:
      return False
  return True


def encode(v, _budget=None):
  """Type-exact JSON form of plain data (None/bool/int/float/str/bytes/complex and list/tuple/
  dict/set/frozenset of them). Anything else raises TypeError: a candidate cannot return an
  object whose __eq__ lies."""
  budget = [100_000] if _budget is None else _budget
  budget[0] -= 1
  if budget[0] < 0:
    raise ValueError("value too large")
  t = type(v)
  if t is type(None):
    return ["n"]
  if t is bool:
    return ["b", int(v)]
  if t is int:
    return ["i", str(v)]
  if t is float:
    return ["f", repr(v)]
  if t is str:
    return ["s", v]
  if t is bytes:
    return ["y", v.hex()]
  if t is complex:
    return ["c", repr(v.real), repr(v.imag)]
  if t in (list, tuple, set, frozenset):
    items = [encode(x, budget) for x in v]
    if t in (set, frozenset):
      items.sort(key=lambda e: json.dumps(e))
    return [{list: "l", tuple: "t", set: "e", frozenset: "z"}[t], items]
  if t is dict:
    items = [[encode(k, budget), encode(x, budget)] for k, x in v.items()]
    return ["d", items]
  raise TypeError(f"not plain data: {t.__name__}")


def decode(e):
  tag = e[0]
  if tag == "n":
    return None
  if tag == "b":
    return bool(e[1])
  if tag == "i":
    return int(e[1])
  if tag == "f":
    return float(e[1])
  if tag == "s":
    return e[1]
  if tag == "y":
    return bytes.fromhex(e[1])
  if tag == "c":
    return complex(float(e[1]), float(e[2]))
  if tag in ("l", "t", "e", "z"):
    items = [decode(x) for x in e[1]]
    return {"l": list, "t": tuple, "e": set, "z": frozenset}[tag](items)
  if tag == "d":
    return {decode(k): decode(x) for k, x in e[1]}
  raise ValueError(f"bad tag {tag!r}")
