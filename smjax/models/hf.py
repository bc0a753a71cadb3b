"""Hugging Face checkpoints in and out: config.json, safetensors (single or sharded), tokenizer.json.

Loading reads the safetensors files through a memory map and converts one tensor at a time into our
layout and dtype, so the checkpoint is never held twice in host memory. Export writes a directory
that `transformers.AutoModelForCausalLM.from_pretrained` loads (tested in tests/test_hf.py).

Supported `architectures`: Qwen2ForCausalLM (Qwen2, Qwen2.5), Qwen3ForCausalLM, LlamaForCausalLM.
"""

from __future__ import annotations

import json
import mmap
import os
from typing import Any, Callable, Iterator

import ml_dtypes
import numpy as np

from smjax.models.transformer import ModelConfig, RopeScaling

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM")

_ST_DTYPES = {
    "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F64": np.dtype(np.float64),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
}
_NP_TO_ST = {v: k for k, v in _ST_DTYPES.items()}
_HF_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


# ----------------------------------------------------------------------------------------- config

def config_from_hf(path: str, *, param_dtype: str = "float32", dtype: str = "float32",
                   max_seq_len: int | None = None) -> ModelConfig:
  """Reads `path/config.json` into a ModelConfig; unsupported settings raise a ValueError."""
  file = os.path.join(path, "config.json")
  if not os.path.exists(file):
    raise FileNotFoundError(f"{file} does not exist: expected a Hugging Face model directory")
  with open(file) as f:
    hf = json.load(f)
  archs = hf.get("architectures") or []
  if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
    raise ValueError(f"{file}: architectures={archs} is not supported; expected exactly one of "
                     f"{list(SUPPORTED_ARCHITECTURES)}")
  arch = archs[0]
  if hf.get("use_sliding_window"):
    raise ValueError(f"{file}: use_sliding_window=true is not supported (full attention only)")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"{file}: hidden_act={hf['hidden_act']!r}; expected 'silu'")
  scaling = None
  rs = hf.get("rope_scaling") or None
  if rs is None and isinstance(hf.get("rope_parameters"), dict):
    rs = hf["rope_parameters"]  # transformers >= 5 stores theta and scaling here
  rope_theta = hf.get("rope_theta")
  if rs:
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    rope_theta = rs.get("rope_theta", rope_theta)
    if rope_type == "llama3":
      scaling = RopeScaling(factor=float(rs["factor"]), low_freq_factor=float(rs["low_freq_factor"]),
                            high_freq_factor=float(rs["high_freq_factor"]),
                            original_max_position_embeddings=int(
                                rs["original_max_position_embeddings"]))
    elif rope_type != "default":
      raise ValueError(f"{file}: rope_scaling type {rope_type!r} is not supported; expected "
                       "'llama3' or none")
  n_heads = hf["num_attention_heads"]
  head_dim = hf.get("head_dim") or hf["hidden_size"] // n_heads
  is_qwen2 = arch == "Qwen2ForCausalLM"
  qkv_bias = True if is_qwen2 else bool(hf.get("attention_bias", False))
  if arch == "LlamaForCausalLM" and hf.get("mlp_bias"):
    raise ValueError(f"{file}: mlp_bias=true is not supported")
  return ModelConfig(
      vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
      n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads", n_heads), head_dim=head_dim,
      d_ff=hf["intermediate_size"],
      max_seq_len=max_seq_len or hf.get("max_position_embeddings", 2048),
      rope_theta=float(rope_theta if rope_theta is not None else 10000.0), rope_scaling=scaling,
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), qkv_bias=qkv_bias,
      qk_norm=arch == "Qwen3ForCausalLM", tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      param_dtype=param_dtype, dtype=dtype, name=hf.get("_name_or_path") or arch)


def config_to_hf(cfg: ModelConfig, architecture: str) -> dict:
  """The config.json for exporting `cfg` as `architecture`."""
  if architecture not in SUPPORTED_ARCHITECTURES:
    raise ValueError(f"{architecture=} is not one of {list(SUPPORTED_ARCHITECTURES)}")
  is_qwen2 = architecture == "Qwen2ForCausalLM"
  if is_qwen2 != cfg.qkv_bias and architecture != "LlamaForCausalLM":
    raise ValueError(f"cannot export qkv_bias={cfg.qkv_bias} as {architecture}")
  if cfg.qk_norm != (architecture == "Qwen3ForCausalLM"):
    raise ValueError(f"cannot export qk_norm={cfg.qk_norm} as {architecture}")
  model_type = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                "LlamaForCausalLM": "llama"}[architecture]
  out = {
      "architectures": [architecture], "model_type": model_type, "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
      "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
      "head_dim": cfg.head_dim, "intermediate_size": cfg.d_ff,
      "max_position_embeddings": cfg.max_seq_len, "rope_theta": cfg.rope_theta,
      "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
      "hidden_act": "silu", "torch_dtype": _HF_DTYPE_NAMES[cfg.param_dtype],
      "attention_bias": cfg.qkv_bias if architecture == "LlamaForCausalLM" else is_qwen2,
      "use_sliding_window": False,
  }
  if cfg.rope_scaling is not None:
    sc = cfg.rope_scaling
    out["rope_scaling"] = {"rope_type": "llama3", "factor": sc.factor,
                           "low_freq_factor": sc.low_freq_factor,
                           "high_freq_factor": sc.high_freq_factor,
                           "original_max_position_embeddings": sc.original_max_position_embeddings}
  return out


# ------------------------------------------------------------------------------------ safetensors

class _SafetensorsFile:
  """A memory-mapped safetensors file: tensors are read lazily, one at a time."""

  def __init__(self, file: str):
    self.file = file
    self._f = open(file, "rb")
    self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
    n = int.from_bytes(self._mm[:8], "little")
    self.header = json.loads(self._mm[8:8 + n])
    self.header.pop("__metadata__", None)
    self._base = 8 + n

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
      self._mm.close()
    except BufferError:
      pass  # a caller still holds a view of a tensor; the map closes when that view is freed
    self._f.close()


class _Checkpoint:
  """All safetensors files of an HF directory, single-file or sharded with an index."""

  def __init__(self, path: str):
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      files = sorted(set(weight_map.values()))
      for name in files:
        if not os.path.exists(os.path.join(path, name)):
          raise FileNotFoundError(f"{index} names shard {name}, but {os.path.join(path, name)} "
                                  "does not exist")
      self._files = {name: _SafetensorsFile(os.path.join(path, name)) for name in files}
      self._where = {k: self._files[v] for k, v in weight_map.items()}
    elif os.path.exists(single):
      f = _SafetensorsFile(single)
      self._files = {"model.safetensors": f}
      self._where = {k: f for k in f.header}
    else:
      raise FileNotFoundError(f"{path}: neither model.safetensors nor "
                              "model.safetensors.index.json exists")
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


# ------------------------------------------------------------------------------- name/shape mapping

def _mapping(cfg: ModelConfig) -> Iterator[tuple[str, tuple[str, ...], Callable, Callable, tuple]]:
  """(hf name, our param path, hf->ours, ours->hf, our shape) for every tensor of the model."""
  D, N, K, H, F, V = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                      cfg.vocab_size)
  ident = lambda x: x
  T = lambda x: x.T

  def heads_in(n):  # [n*H, D] -> [D, n, H]
    return (lambda x: x.T.reshape(D, n, H)), (lambda x: x.reshape(D, n * H).T)

  yield "model.embed_tokens.weight", ("embed",), ident, ident, (V, D)
  for i in range(cfg.n_layers):
    hp, ours = f"model.layers.{i}.", f"layers_{i}"
    for name, n in (("q", N), ("k", K), ("v", K)):
      to_ours, to_hf = heads_in(n)
      yield hp + f"self_attn.{name}_proj.weight", (ours, "attn", name), to_ours, to_hf, (D, n, H)
      if cfg.qkv_bias:
        yield (hp + f"self_attn.{name}_proj.bias", (ours, "attn", name + "_bias"),
               (lambda x, n=n: x.reshape(n, H)), (lambda x, n=n: x.reshape(n * H)), (n, H))
    yield (hp + "self_attn.o_proj.weight", (ours, "attn", "o"), (lambda x: x.T.reshape(N, H, D)),
           (lambda x: x.reshape(N * H, D).T), (N, H, D))
    if cfg.qk_norm:
      yield hp + "self_attn.q_norm.weight", (ours, "attn", "q_norm", "scale"), ident, ident, (H,)
      yield hp + "self_attn.k_norm.weight", (ours, "attn", "k_norm", "scale"), ident, ident, (H,)
    yield hp + "mlp.gate_proj.weight", (ours, "mlp", "gate"), T, T, (D, F)
    yield hp + "mlp.up_proj.weight", (ours, "mlp", "up"), T, T, (D, F)
    yield hp + "mlp.down_proj.weight", (ours, "mlp", "down"), T, T, (F, D)
    yield hp + "input_layernorm.weight", (ours, "input_norm", "scale"), ident, ident, (D,)
    yield hp + "post_attention_layernorm.weight", (ours, "post_attn_norm", "scale"), ident, ident, (D,)
  yield "model.norm.weight", ("final_norm", "scale"), ident, ident, (D,)
  if not cfg.tie_embeddings:
    yield "lm_head.weight", ("lm_head",), T, T, (D, V)


def _hf_shape(to_hf, our_shape):
  return to_hf(np.empty(our_shape, np.int8)).shape


def _set(tree: dict, path: tuple[str, ...], value) -> None:
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


def _get(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def load_params(path: str, cfg: ModelConfig | None = None, *, put: Callable | None = None,
                param_dtype: str | None = None):
  """Loads an HF directory's weights into our parameter tree.

  Tensors are converted one at a time; `put(path, np_array) -> array` places each one (e.g. with a
  sharding from smjax.sharding); the default keeps numpy arrays on the host. Returns `(cfg, params)`.
  """
  if cfg is None:
    cfg = config_from_hf(path, param_dtype=param_dtype or "float32")
  target = np.dtype(cfg.jnp_param_dtype)
  ckpt = _Checkpoint(path)
  try:
    params: dict[str, Any] = {}
    expected = set()
    for hf_name, ours, to_ours, to_hf, shape in _mapping(cfg):
      expected.add(hf_name)
      if hf_name not in ckpt.names():
        raise KeyError(f"{path}: tensor {hf_name!r} is missing (expected shape "
                       f"{list(_hf_shape(to_hf, shape))} for {cfg.name})")
      raw = ckpt.get(hf_name)
      want = _hf_shape(to_hf, shape)
      if tuple(raw.shape) != tuple(want):
        raise ValueError(f"{path}: tensor {hf_name!r} has shape {list(raw.shape)}; expected "
                         f"{list(want)} from config.json")
      arr = np.array(to_ours(raw), dtype=target)  # a copy: nothing keeps the map alive
      del raw
      _set(params, ours, put(ours, arr) if put is not None else arr)
    if cfg.tie_embeddings:
      expected.add("lm_head.weight")  # tied checkpoints may still carry a copy; it is ignored
    unknown = sorted(n for n in ckpt.names() - expected if "rotary_emb" not in n)
    if unknown:
      raise ValueError(f"{path}: unexpected tensors {unknown[:5]}{'...' if len(unknown) > 5 else ''}"
                       f" for architecture flags qkv_bias={cfg.qkv_bias}, qk_norm={cfg.qk_norm}")
  finally:
    ckpt.close()
  return cfg, params


def save_params(path: str, cfg: ModelConfig, params, *, architecture: str,
                max_shard_bytes: int = 4 << 30, dtype: str | None = None) -> None:
  """Writes `params` as an HF directory (config.json + safetensors, sharded past max_shard_bytes)."""
  os.makedirs(path, exist_ok=True)
  out_dtype = np.dtype({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16,
                        "float16": np.float16}[dtype or cfg.param_dtype])
  hf_cfg = config_to_hf(cfg, architecture)
  hf_cfg["torch_dtype"] = dtype or cfg.param_dtype
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for hf_name, ours, _, to_hf, shape in _mapping(cfg):
    arr = np.asarray(_get(params, ours))
    if arr.shape != shape:
      raise ValueError(f"parameter {'/'.join(ours)} has shape {list(arr.shape)}; expected "
                       f"{list(shape)} for this config")
    arr = np.ascontiguousarray(to_hf(arr).astype(out_dtype))
    if size and size + arr.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][hf_name] = arr
    size += arr.nbytes
  for stale in ("model.safetensors", "model.safetensors.index.json"):
    if os.path.exists(os.path.join(path, stale)):
      os.remove(os.path.join(path, stale))
  if len(shards) == 1:
    write_safetensors(os.path.join(path, "model.safetensors"), shards[0])
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      write_safetensors(os.path.join(path, name), shard)
      weight_map.update({k: name for k in shard})
    total = sum(a.nbytes for s in shards for a in s.values())
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=1)
