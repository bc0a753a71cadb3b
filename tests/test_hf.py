"""HF directory import/export: round trip through `transformers`, sharded files, and bad input."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
import transformers
import jax
import jax.numpy as jnp

from errors import one_line_error
from hf_models import tiny_hf_model
from smjax.models import hf, safetensors_io
from smjax.models.tokenizer import CharTokenizer, HFTokenizer
from smjax.models.transformer import Transformer, init_params
from smjax.models.presets import get_preset


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("qwen3"))
  tiny_hf_model("qwen3", seed=5).save_pretrained(path)
  return path


def _logits(cfg, params, toks):
  return np.asarray(Transformer(cfg).apply({"params": params}, jnp.asarray(toks))[0])


@pytest.mark.parametrize("arch,overrides", [
    ("Qwen3ForCausalLM", dict(qk_norm=True)),
    ("Qwen2ForCausalLM", dict(qkv_bias=True, tie_embeddings=True)),
    ("LlamaForCausalLM", dict(rope_scaling=get_preset("llama-3.1-8b").rope_scaling)),
])
def test_export_round_trip_through_transformers(tmp_path, arch, overrides):
  cfg = get_preset("toy-tiny").replace(n_kv_heads=2, **overrides)
  params = init_params(cfg, jax.random.key(1))
  # Perturb norms/biases away from their 1/0 init so a dropped tensor would show.
  params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(2), x.shape), params)
  hf.save_params(str(tmp_path), cfg, params, architecture=arch, max_shard_bytes=40_000)
  assert os.path.exists(tmp_path / "model.safetensors.index.json")  # small shards: sharded path
  model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  toks = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 20))
  with torch.no_grad():
    ref = model(torch.tensor(toks)).logits.numpy()
  ours = _logits(cfg, params, toks)
  assert np.abs(ours - ref).max() <= 1e-4
  cfg2, params2 = hf.load_params(str(tmp_path))
  assert cfg2.replace(name=cfg.name, max_seq_len=cfg.max_seq_len) == cfg
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), b)


def test_sharded_hf_checkpoint_loads(tmp_path, qwen3_dir):
  model = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir)
  model.save_pretrained(str(tmp_path), max_shard_size="20KB")
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  _, a = hf.load_params(qwen3_dir)
  _, b = hf.load_params(str(tmp_path))
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_bf16_load_converts_dtype(tmp_path, qwen3_dir):
  model = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.bfloat16)
  model.save_pretrained(str(tmp_path))
  cfg, params = hf.load_params(str(tmp_path), param_dtype="float32")
  leaf = params["layers_0"]["attn"]["q"]
  assert leaf.dtype == np.float32
  want = model.model.layers[0].self_attn.q_proj.weight.detach().float().numpy().T.reshape(leaf.shape)
  np.testing.assert_array_equal(leaf, want)
  cfg16, p16 = hf.load_params(str(tmp_path), param_dtype="bfloat16")
  assert str(p16["embed"].dtype) == "bfloat16" and cfg16.param_dtype == "bfloat16"


def _copy(src, dst):
  shutil.copytree(src, dst)
  return dst


def test_missing_tensor_is_named(tmp_path, qwen3_dir):
  path = _copy(qwen3_dir, str(tmp_path / "m"))
  _, params = hf.load_params(qwen3_dir)
  tensors = {}
  from safetensors.numpy import load_file
  tensors = load_file(os.path.join(path, "model.safetensors"))
  del tensors["model.layers.1.mlp.up_proj.weight"]
  safetensors_io.write_safetensors(os.path.join(path, "model.safetensors"), tensors)
  with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*missing.*\[80, 48\]"):
    hf.load_params(path)


def test_wrong_shape_is_named(tmp_path, qwen3_dir):
  path = _copy(qwen3_dir, str(tmp_path / "m"))
  from safetensors.numpy import load_file
  tensors = load_file(os.path.join(path, "model.safetensors"))
  tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 48), np.float32)
  safetensors_io.write_safetensors(os.path.join(path, "model.safetensors"), tensors)
  with pytest.raises(ValueError, match=r"k_proj\.weight.*shape \[8, 48\]; expected \[32, 48\]"):
    hf.load_params(path)


def test_unsupported_architecture_is_named(tmp_path, qwen3_dir):
  path = _copy(qwen3_dir, str(tmp_path / "m"))
  cfg = json.load(open(os.path.join(path, "config.json")))
  cfg["architectures"] = ["GPT2LMHeadModel"]
  json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
  with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*Qwen2ForCausalLM"):
    hf.load_params(path)


def test_missing_files_are_named(tmp_path, qwen3_dir):
  with pytest.raises(FileNotFoundError, match=str(tmp_path / "nothing" / "config.json")):
    hf.load_params(str(tmp_path / "nothing"))
  path = _copy(qwen3_dir, str(tmp_path / "m"))
  os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(FileNotFoundError, match="neither model.safetensors"):
    hf.load_params(path)


def test_tokenizers_share_an_interface(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers
  vocab = {"<pad>": 0, "<eos>": 1, "a": 2, "b": 3, "ab": 4, "c": 5}
  tok = Tokenizer(models.WordPiece(vocab, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(str(tmp_path / "tokenizer.json"))
  json.dump({"eos_token": "<eos>", "pad_token": "<pad>"}, open(tmp_path / "tokenizer_config.json", "w"))
  t = HFTokenizer(str(tmp_path))
  assert (t.eos_id, t.pad_id, t.vocab_size) == (1, 0, 6)
  assert t.encode("ab c") == [4, 5]
  assert t.decode([4, 5, 1, 2]).replace(" ", "") == "abc"
  c = CharTokenizer()
  assert c.decode(c.encode("12+35=47\n") + [c.eos_id] + c.encode("zz")) == "12+35=47\n"
  assert max(c.encode("~ \n")) < c.vocab_size
  # Pad and BOS decode to nothing; an id past the characters (the model may sample one of the
  # padded vocabulary's) or a negative one to U+FFFD; numpy ids as Python ones.
  ids = [c.bos_id, *c.encode("7"), c.pad_id, 120, -1, *c.encode("x"), c.eos_id, 5]
  assert c.decode(ids) == c.decode(np.asarray(ids)) == c.decode(tuple(ids)) == "7\ufffd\ufffdx"
  with pytest.raises(ValueError, match="cannot encode character"):
    c.encode("é")


# ------------------------------------------------------------------- unreadable model files
# Each fault is one line naming the file (and the field or tensor), what was expected and what to
# do, raised before any tensor is converted.

def test_truncated_safetensors_names_file_and_tensor(tmp_path):
  from safetensors.numpy import save_file
  file = str(tmp_path / "t.safetensors")
  save_file({"a": np.ones((4, 4), np.float32), "b": np.arange(64, dtype=np.float32)}, file)
  size = os.path.getsize(file)
  with open(file, "r+b") as f:
    f.truncate(size - 10)  # cuts into the last tensor's bytes
  with pytest.raises(ValueError) as e:
    safetensors_io.SafetensorsFile(file)
  one_line_error(e, f"{file}: tensor 'b' needs data bytes 64..320", "the file is truncated",
                  f"expected {size} bytes, found {size - 10}", "re-download")
  with open(file, "r+b") as f:
    f.truncate(20)  # cuts into the JSON header
  with pytest.raises(ValueError) as e:
    safetensors_io.SafetensorsFile(file)
  one_line_error(e, f"{file}: header says", "bytes of JSON but the file has 20 bytes")
  with open(file, "r+b") as f:
    f.truncate(3)
  with pytest.raises(ValueError) as e:
    safetensors_io.SafetensorsFile(file)
  one_line_error(e, f"{file}: 3 bytes, too short for a safetensors header")


def test_truncated_model_safetensors_fails_before_loading(tmp_path, qwen3_dir):
  path = _copy(qwen3_dir, str(tmp_path / "m"))
  file = os.path.join(path, "model.safetensors")
  with open(file, "r+b") as f:
    f.truncate(os.path.getsize(file) // 2)
  with pytest.raises(ValueError) as e:
    hf.load_params(path)
  one_line_error(e, f"{file}: tensor 'model.", "the file is truncated")


def test_index_naming_a_missing_shard_is_named(tmp_path, qwen3_dir):
  path = str(tmp_path / "m")
  transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir).save_pretrained(
      path, max_shard_size="20KB")
  index = os.path.join(path, "model.safetensors.index.json")
  weight_map = json.load(open(index))["weight_map"]
  shard = weight_map["model.norm.weight"]
  os.remove(os.path.join(path, shard))
  with pytest.raises(FileNotFoundError) as e:
    hf.load_params(path)
  one_line_error(e, f"{index} names shard {shard}", f"{os.path.join(path, shard)} does not exist",
                  "re-download")
  open(index, "w").write('{"metadata": {}, "weight_map": {"model.norm.weight": ')
  with pytest.raises(ValueError) as e:
    hf.load_params(path)
  one_line_error(e, f"{index}: not valid JSON (Expecting value, line 1 column 54)")


def test_truncated_config_json_is_named(tmp_path, qwen3_dir):
  path = _copy(qwen3_dir, str(tmp_path / "m"))
  file = os.path.join(path, "config.json")
  text = open(file).read()
  open(file, "w").write(text[:len(text) // 2])
  with pytest.raises(ValueError) as e:
    hf.load_params(path)
  one_line_error(e, f"{file}: not valid JSON (", ", line ", "re-download config.json")


@pytest.mark.parametrize("field,value,expected", [
    ("num_attention_heads", None, "field 'num_attention_heads' is missing; expected a positive "
     "integer (the number of query heads)"),
    ("hidden_size", "48", "field 'hidden_size' is '48'; expected a positive integer"),
])
def test_config_json_missing_or_bad_field_is_named(tmp_path, qwen3_dir, field, value, expected):
  path = _copy(qwen3_dir, str(tmp_path / "m"))
  file = os.path.join(path, "config.json")
  cfg = json.load(open(file))
  if value is None:
    del cfg[field]
  else:
    cfg[field] = value
  json.dump(cfg, open(file, "w"))
  with pytest.raises(ValueError) as e:
    hf.config_from_hf(path)
  one_line_error(e, f"{file}: {expected}", "re-download config.json")


def test_garbled_tokenizer_files_are_named(tmp_path):
  file = tmp_path / "tokenizer.json"
  file.write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": ')
  with pytest.raises(ValueError) as e:
    HFTokenizer(str(tmp_path))
  one_line_error(e, f"{file}: not a readable tokenizer.json (", "re-download it")
  from tokenizers import Tokenizer, models
  Tokenizer(models.WordPiece({"<eos>": 0, "a": 1}, unk_token="<eos>")).save(str(file))
  config = tmp_path / "tokenizer_config.json"
  config.write_bytes(b'{"eos_token": "<eos>",\n "pad_token": \xff}')
  with pytest.raises(ValueError) as e:
    HFTokenizer(str(tmp_path))
  one_line_error(e, f"{config}: not UTF-8 text (byte 0xff at offset 37)", "pass eos_token=")
  config.write_text('{"eos_token": "<eos>",\n "pad_token": }')
  with pytest.raises(ValueError) as e:
    HFTokenizer(str(tmp_path))
  one_line_error(e, f"{config}: not valid JSON (Expecting value, line 2 column 15)")


def test_repo_kernels_dir_does_not_shadow_the_installed_kernels_distribution():
  """With the repository root first on sys.path (`python -c` there), the bare name `kernels` is
  Hugging Face's distribution where one is installed (transformers >= 5.25 imports it), and our
  kernels stay importable as smjax.kernels; a subprocess so the import runs from scratch."""
  import importlib.metadata
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ("import kernels, smjax.kernels.reverse_kl as r, transformers.activations; "
          "print(kernels.__file__); print(r.__file__)")
  out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-2000:]
  bare, ours = out.stdout.split()
  assert os.path.dirname(ours) == os.path.join(root, "kernels")
  try:
    importlib.metadata.version("kernels")
    installed = True
  except importlib.metadata.PackageNotFoundError:
    installed = False
  assert (os.path.dirname(bare) != os.path.join(root, "kernels")) == installed, bare
