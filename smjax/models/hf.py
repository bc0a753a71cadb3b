"""Hugging Face checkpoints in and out: config.json, safetensors (single or sharded), tokenizer.json.

Loading reads the safetensors files through a memory map (smjax.models.safetensors_io) and converts
one tensor at a time into our layout and dtype, so the checkpoint is never held twice in host
memory. Export writes a directory that `transformers.AutoModelForCausalLM.from_pretrained` loads
(tested in tests/test_hf.py). A config.json or weight file that cannot be read is refused before
any tensor is converted, naming the file and the field or tensor.

Supported `architectures`: Qwen2ForCausalLM (Qwen2, Qwen2.5), Qwen3ForCausalLM, LlamaForCausalLM.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator

import ml_dtypes
import numpy as np

from smjax.json_io import read_json, require_keys
from smjax.models.safetensors_io import HFWeights, write_safetensors
from smjax.models.transformer import ModelConfig, RopeScaling

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM")

_HF_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


# ----------------------------------------------------------------------------------------- config

_REDOWNLOAD = "re-download config.json or copy it from the model's Hugging Face repository"
_REQUIRED_FIELDS = {
    "vocab_size": "the vocabulary size", "hidden_size": "the model dimension",
    "num_hidden_layers": "the number of layers", "num_attention_heads": "the number of query heads",
    "intermediate_size": "the MLP dimension",
}
_OPTIONAL_FIELDS = {"num_key_value_heads": "the number of kv heads", "head_dim": "the head dim",
                    "max_position_embeddings": "the longest sequence"}


def _int_field(hf: dict, field: str, file: str, what: str) -> int:
  """hf[field] as a positive int, or a ValueError naming the file and the field."""
  if field not in hf:
    raise ValueError(f"{file}: field {field!r} is missing; expected a positive integer ({what}); "
                     f"the file may be truncated or not a decoder config; {_REDOWNLOAD}")
  value = hf[field]
  if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
    raise ValueError(f"{file}: field {field!r} is {value!r}; expected a positive integer ({what}); "
                     f"{_REDOWNLOAD}")
  return value


def config_from_hf(path: str, *, param_dtype: str = "float32", dtype: str = "float32",
                   max_seq_len: int | None = None) -> ModelConfig:
  """Reads `path/config.json` into a ModelConfig; unsupported settings raise a ValueError."""
  file = os.path.join(path, "config.json")
  if not os.path.exists(file):
    from smjax.models.hub import check_model_dir  # pylint: disable=import-outside-toplevel
    check_model_dir(path)   # a Hub id: say how to download it
    raise FileNotFoundError(f"{file} does not exist: expected a Hugging Face model directory")
  hf = read_json(file, _REDOWNLOAD)
  archs = hf.get("architectures") or []
  if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
    raise ValueError(f"{file}: architectures={archs} is not supported; expected exactly one of "
                     f"{list(SUPPORTED_ARCHITECTURES)}")
  arch = archs[0]
  for field, what in _REQUIRED_FIELDS.items():
    _int_field(hf, field, file, what)
  for field, what in _OPTIONAL_FIELDS.items():
    if hf.get(field) is not None:
      _int_field(hf, field, file, what)
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
      require_keys(rs, ("factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings"), f"{file} (rope_scaling)", _REDOWNLOAD)
      scaling = RopeScaling(factor=float(rs["factor"]), low_freq_factor=float(rs["low_freq_factor"]),
                            high_freq_factor=float(rs["high_freq_factor"]),
                            original_max_position_embeddings=int(
                                rs["original_max_position_embeddings"]))
    elif rope_type != "default":
      raise ValueError(f"{file}: rope_scaling type {rope_type!r} is not supported; expected "
                       "'llama3' or none")
  n_heads = hf["num_attention_heads"]
  if not hf.get("head_dim") and hf["hidden_size"] % n_heads:
    raise ValueError(f"{file}: hidden_size={hf['hidden_size']} is not a multiple of "
                     f"num_attention_heads={n_heads} and head_dim is absent; expected head_dim "
                     "or a divisible hidden_size; fix the config")
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
  ckpt = HFWeights(path)
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
                max_shard_bytes: int = 4 << 30, dtype: str | None = None,
                extra_config: dict | None = None) -> None:
  """Writes `params` as an HF directory (config.json + safetensors, sharded past max_shard_bytes).
  `extra_config`: more config.json fields (e.g. the token ids `generate` reads), added last."""
  os.makedirs(path, exist_ok=True)
  out_dtype = np.dtype({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16,
                        "float16": np.float16}[dtype or cfg.param_dtype])
  hf_cfg = config_to_hf(cfg, architecture)
  hf_cfg["torch_dtype"] = dtype or cfg.param_dtype
  hf_cfg.update(extra_config or {})
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
