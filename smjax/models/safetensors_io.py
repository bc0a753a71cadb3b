"""safetensors files: a lazy memory-mapped reader that checks a file before any tensor is used, the
reader of a Hugging Face directory's weights (single file or sharded with an index), and a writer.

Every fault names the file (and the tensor, where there is one), says what was expected and what to
do, on one line.
"""

from __future__ import annotations

import json
import mmap
import os

import ml_dtypes
import numpy as np

from smjax.json_io import one_line, read_json

_ST_DTYPES = {
    "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F64": np.dtype(np.float64),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
}
_NP_TO_ST = {v: k for k, v in _ST_DTYPES.items()}
REEXPORT = "re-download the checkpoint or export it again"
# Bytes per element of every dtype the safetensors format names (we read only those in _ST_DTYPES).
_ST_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


class SafetensorsFile:
  """A memory-mapped safetensors file: tensors are read lazily, one at a time.

  Opening checks the header and that every tensor's bytes lie inside the file, so a truncated or
  garbled file is refused, naming the file and the tensor, before any tensor is converted.
  """

  def __init__(self, file: str):
    self.file = file
    size = os.path.getsize(file)
    if size < 8:
      raise ValueError(f"{file}: {size} bytes, too short for a safetensors header (8-byte length "
                       f"+ JSON); the file is truncated; {REEXPORT}")
    self._f = open(file, "rb")
    try:
      self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
      self.header, self._base = self._read_header(size)
    except BaseException:
      self.close()
      raise

  def _read_header(self, size: int) -> tuple[dict, int]:
    file, n = self.file, int.from_bytes(self._mm[:8], "little")
    if 8 + n > size:
      raise ValueError(f"{file}: header says {n} bytes of JSON but the file has {size} bytes; "
                       f"expected a safetensors file (truncated, or not safetensors); {REEXPORT}")
    try:
      header = json.loads(self._mm[8:8 + n])
    except ValueError as e:  # JSONDecodeError or UnicodeDecodeError
      raise ValueError(f"{file}: the safetensors header is not valid JSON ({one_line(e)}); "
                       f"expected a safetensors file; {REEXPORT}") from None
    if not isinstance(header, dict):
      raise ValueError(f"{file}: the safetensors header is a JSON {type(header).__name__}; "
                       f"expected an object of tensors; {REEXPORT}")
    header.pop("__metadata__", None)
    data, spans = size - 8 - n, {}
    for name, info in header.items():
      try:
        dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        start, end = int(start), int(end)
        count = int(np.prod(shape, dtype=np.int64))
      except (KeyError, TypeError, ValueError):
        raise ValueError(f"{file}: tensor {name!r} has header entry {one_line(info, 120)}; "
                         "expected {dtype, shape, data_offsets}; " + REEXPORT) from None
      if dtype in _ST_ITEMSIZE and (not 0 <= start <= end or
                                    end - start != count * _ST_ITEMSIZE[dtype]):
        raise ValueError(f"{file}: tensor {name!r} ({dtype}{list(shape)}) has data_offsets "
                         f"[{start}, {end}]; expected {count * _ST_ITEMSIZE[dtype]} bytes; "
                         f"{REEXPORT}")
      spans[name] = (start, end)
    cut = [(s, name) for name, (s, e) in spans.items() if e > data]
    if cut:
      _, name = min(cut)
      start, end = spans[name]
      need = 8 + n + max(e for _, e in spans.values())
      raise ValueError(f"{file}: tensor {name!r} needs data bytes {start}..{end} but the file "
                       f"holds {data}: the file is truncated (expected {need} bytes, found "
                       f"{size}); {REEXPORT}")
    return header, 8 + n

  def get(self, name: str) -> np.ndarray:
    info = self.header[name]
    if info["dtype"] not in _ST_DTYPES:
      raise ValueError(f"{self.file}: tensor {name} has dtype {info['dtype']}; expected one of "
                       f"{sorted(_ST_DTYPES)}")
    start, end = info["data_offsets"]
    return np.frombuffer(self._mm, dtype=_ST_DTYPES[info["dtype"]], count=int(np.prod(
        info["shape"], dtype=np.int64)), offset=self._base + start).reshape(info["shape"])

  def close(self):
    try:
      if getattr(self, "_mm", None) is not None:
        self._mm.close()
    except BufferError:
      pass  # a caller still holds a view of a tensor; the map closes when that view is freed
    self._f.close()


class HFWeights:
  """All safetensors files of an HF directory, single-file or sharded with an index."""

  def __init__(self, path: str):
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index):
      weight_map = read_json(index, REEXPORT, keys=("weight_map",))["weight_map"]
      if not isinstance(weight_map, dict) or not all(
          isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index}: field 'weight_map' is {one_line(weight_map, 80)}; expected "
                         f"an object of tensor name -> shard file name; {REEXPORT}")
      files = sorted(set(weight_map.values()))
      for name in files:
        if not os.path.exists(os.path.join(path, name)):
          tensor = next(k for k, v in weight_map.items() if v == name)
          raise FileNotFoundError(f"{index} names shard {name} (for tensor {tensor!r}), but "
                                  f"{os.path.join(path, name)} does not exist; expected every "
                                  f"shard beside the index; {REEXPORT}")
      self._files = {}
      try:
        for name in files:
          self._files[name] = SafetensorsFile(os.path.join(path, name))
      except BaseException:
        self.close()
        raise
      self._where = {k: self._files[v] for k, v in weight_map.items()}
      for k, v in weight_map.items():
        if k not in self._files[v].header:
          self.close()
          raise ValueError(f"{index} maps tensor {k!r} to {v}, but that shard has no such tensor; "
                           f"expected the index and its shards from one export; {REEXPORT}")
    elif os.path.exists(single):
      f = SafetensorsFile(single)
      self._files = {"model.safetensors": f}
      self._where = {k: f for k in f.header}
    else:
      raise FileNotFoundError(f"{path}: neither model.safetensors nor "
                              "model.safetensors.index.json exists; expected a Hugging Face model "
                              "directory with its weights")
    self.path = path

  def names(self):
    return set(self._where)

  def get(self, name: str) -> np.ndarray:
    if name not in self._where:
      raise KeyError(f"{self.path}: tensor {name!r} is missing from the checkpoint")
    return self._where[name].get(name)

  def close(self):
    for f in self._files.values():
      f.close()


def write_safetensors(file: str, tensors: dict[str, np.ndarray]) -> None:
  """Writes numpy arrays (bfloat16 included, via ml_dtypes) to one safetensors file."""
  header, offset = {}, 0
  for name, arr in tensors.items():
    dt = np.dtype(arr.dtype)
    if dt not in _NP_TO_ST:
      raise ValueError(f"tensor {name} has dtype {dt}; expected one of {list(_NP_TO_ST)}")
    nbytes = arr.nbytes
    header[name] = {"dtype": _NP_TO_ST[dt], "shape": list(arr.shape),
                    "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  header["__metadata__"] = {"format": "pt"}
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  tmp = file + ".tmp"
  with open(tmp, "wb") as f:
    f.write(len(blob).to_bytes(8, "little"))
    f.write(blob)
    for arr in tensors.values():
      f.write(np.ascontiguousarray(arr).tobytes())
  os.replace(tmp, file)
