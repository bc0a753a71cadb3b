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

from hf_models import tiny_hf_model
from smjax.models import hf
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
  hf.write_safetensors(os.path.join(path, "model.safetensors"), tensors)
  with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*missing.*\[80, 48\]"):
    hf.load_params(path)


def test_wrong_shape_is_named(tmp_path, qwen3_dir):
  path = _copy(qwen3_dir, str(tmp_path / "m"))
  from safetensors.numpy import load_file
  tensors = load_file(os.path.join(path, "model.safetensors"))
  tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 48), np.float32)
  hf.write_safetensors(os.path.join(path, "model.safetensors"), tensors)
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
  with pytest.raises(ValueError, match="cannot encode character"):
    c.encode("é")
