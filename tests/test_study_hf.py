"""The real-model study path end to end: `configs/qwen25_1p5b_v5e8.py` on a Hugging Face directory.

A tiny random Qwen2 checkpoint (transformers `save_pretrained`, safetensors, tied embeddings, model
vocabulary padded past the tokenizer's as in Qwen2.5) and a char-level `tokenizer.json` built
offline with `tokenizers` (no BOS, EOS `<|im_end|>`, pad `<|endoftext|>`, as Qwen's) stand in for
the 1.5B model; tiny JSONL files stand in for GSM8K / MBPP. The study runs through the real entry
point (`python -m smjax.main`) on 8 fake CPU devices, the config's own fsdp=8 mesh, in a
subprocess; only sizes are overridden. Runs share a persistent compilation cache.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from conftest import cache_env
from study_runs import phase_result, training_flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAD, EOS, UNK = "<|endoftext|>", "<|im_end|>", "<unk>"
EXTRA_MODEL_VOCAB = 5   # Qwen2.5 pads its embedding past the tokenizer (151936 vs 151665)
D, L, N, K, F = 64, 2, 4, 2, 128
H = D // N


def _write_tokenizer(path):
  """Char-level WordLevel tokenizer over '\\n' + printable ASCII; returns its vocabulary size."""
  chars = ["\n"] + [chr(c) for c in range(32, 127)]
  vocab = {t: i for i, t in enumerate([PAD, EOS, UNK] + chars)}
  tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  tok.decoder = decoders.Fuse()   # concatenate characters back (WordLevel joins with spaces)
  tok.add_special_tokens([PAD, EOS, UNK])
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": EOS, "pad_token": PAD, "bos_token": None}, f)
  return tok.get_vocab_size()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tiny_qwen2"))
  n_tok = _write_tokenizer(path)
  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(
      vocab_size=n_tok + EXTRA_MODEL_VOCAB, hidden_size=D, intermediate_size=F,
      num_hidden_layers=L, num_attention_heads=N, num_key_value_heads=K,
      max_position_embeddings=256, tie_word_embeddings=True, rope_theta=10000.0,
      rms_norm_eps=1e-6, dtype=torch.float32)
  model = transformers.Qwen2ForCausalLM(cfg).eval()
  # Default init leaves biases at 0 and norms at 1: randomise every tensor so each one matters.
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 and p.shape[0] == D else 0.0))
  model.save_pretrained(path)
  assert os.path.exists(os.path.join(path, "model.safetensors"))
  return path, {k: v.numpy().copy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """{question, answer} math and {prompt, tests, entry_point} code records (smjax.domains.real)."""
  d = tmp_path_factory.mktemp("data")
  math = [{"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"}
          for a in range(7) for b in range(5)]
  code = [{"prompt": f"Write a function add{k}(x) that returns x plus {k}.",
           "tests": [f"assert add{k}(1) == {1 + k}", f"assert add{k}(0) == {k}"],
           "entry_point": f"add{k}", "code": f"def add{k}(x):\n    return x + {k}\n"}
          for k in range(30)]
  for name, recs in (("math", math), ("code", code)):
    with open(d / f"{name}.jsonl", "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in recs)
  return str(d / "math.jsonl"), str(d / "code.jsonl")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp("jax_cache")


TINY = [
    "--config.progress=False", "--config.heldout_size=8", "--config.eval.batch_size=8",
    # A test file this small has no held-out prompts to spare for a stop set: the stop rules
    # read the report set (what config.stop_size=0 is for).
    "--config.stop_size=0",
    "--config.eval.points=2", "--config.model.max_seq_len=128", "--config.rl.max_new_tokens=16",
    "--config.joint.steps=2", "--config.experts.steps=2", "--config.mopd.steps=2",
    "--config.rl.prompts_per_step=4", "--config.rl.samples_per_prompt=2",
    "--config.opd.prompts_per_step=4", "--config.opd.samples_per_prompt=2",
    "--config.checkpoint_every=0", "--config.band.check=False", "--config.eval.samples=2",
    # One gradient program per step: micro-batching adds a compile per algorithm (its FLOPs are
    # counted from a separate program), about 10 s here; it is tested in test_grpo_loss.
    "--config.rl.micro_batches=1", "--config.opd.micro_batches=1",
    # 100 bootstrap replicates (the report's intervals coarser, its figures the same).
    "--config.report.bootstrap=100",
]


def _main(hf_path, data_files, workdir, cache, *overrides, timeout=600):
  arg = f"hf_path={hf_path},math={data_files[0]},code={data_files[1]}"
  env = dict(os.environ, JAX_PLATFORMS="cpu", **cache_env(cache),
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "")   # the suite's (conftest.py), and
             + " --xla_force_host_platform_device_count=8")   # the config's fsdp=8 mesh
  return subprocess.run(
      [sys.executable, "-m", "smjax.main", f"--config=configs/qwen25_1p5b_v5e8.py:{arg}",
       *TINY, *overrides, f"--workdir={workdir}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def study(tmp_path_factory, hf_dir, data, cache):
  wd = tmp_path_factory.mktemp("study")
  r = _main(hf_dir[0], data, wd, cache)   # base.steps=0 as the config says: HF weights are the base
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
  return str(wd), r


def _expected_params(state_dict):
  """Our parameter layout, written out here from the HF tensors (independent of smjax.models.hf)."""
  sd = state_dict
  out = {"embed": sd["model.embed_tokens.weight"], "final_norm": {"scale": sd["model.norm.weight"]}}
  for i in range(L):
    p = f"model.layers.{i}."
    attn = {"o": sd[p + "self_attn.o_proj.weight"].T.reshape(N, H, D)}
    for name, n in (("q", N), ("k", K), ("v", K)):
      attn[name] = sd[p + f"self_attn.{name}_proj.weight"].T.reshape(D, n, H)
      attn[name + "_bias"] = sd[p + f"self_attn.{name}_proj.bias"].reshape(n, H)
    out[f"layers_{i}"] = {
        "attn": attn,
        "mlp": {m: sd[p + f"mlp.{m}_proj.weight"].T for m in ("gate", "up", "down")},
        "input_norm": {"scale": sd[p + "input_layernorm.weight"]},
        "post_attn_norm": {"scale": sd[p + "post_attention_layernorm.weight"]},
    }
  return out   # tied embeddings: no lm_head


def _final_params(wd, phase):
  """A phase's saved final parameters as numpy, restored onto this (one-device) process."""
  import jax  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  root = os.path.join(wd, "seed_0", phase, "final", "checkpoints")
  (step,) = [d for d in os.listdir(root) if d.isdigit()]
  path = os.path.join(root, step, "state")
  ckptr = ocp.StandardCheckpointer()
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  # Saved from 8 devices: restore needs a target on this process's topology.
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                        ckptr.metadata(path).item_metadata)
  return jax.tree.map(np.asarray, ckptr.restore(path, target))["params"]


def _flat(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {prefix + k: v})
  return out


def test_report_arms_and_flops_add_up(study):
  wd, run = study
  rep = json.load(open(os.path.join(wd, "report", "report.json")))
  experts = sorted(a for a in rep["arms"] if a.startswith("expert_"))
  assert len(experts) == 2 and {"base", "joint_grpo", "split_merge"} <= set(rep["arms"])
  assert "split_merge" in run.stdout
  for arm in ["joint_grpo", "split_merge"] + experts:
    a = rep["arms"][arm]
    assert len(a["accuracy"]) == 2 and all(0.0 <= v["mean"] <= 1.0 for v in a["accuracy"].values())
    assert a["flops_total"]["mean"] > 0 and a["response_length"]["mean"] > 0
  results = {p: phase_result(wd, p) for p in ["base", "joint_grpo", "mopd"] + experts}
  for phase, res in results.items():
    led = res["ledger"]
    assert led["flops"] and all(v > 0 for v in led["flops"].values()), (phase, led["flops"])
    sums = {}
    for r in led["records"]:
      sums[r["phase"]] = sums.get(r["phase"], 0) + r["flops_per_call"] * r["calls"]
    assert sums == led["flops"], phase
  # The greedy pass beside the sampled one (eval.greedy, on by default): one 0/1 per prompt.
  point = results["joint_grpo"]["curve"][-1]
  for d, g in point["greedy_correct"].items():
    assert len(g) == len(point["correct"][d]) == 8 and set(g) <= {0, 1}, (d, g)
    assert point["greedy"][d] == pytest.approx(sum(g) / 8)
  assert len(point["greedy_correct"]) == 2
  # base.steps=0: the base phase only evaluates the HF weights (no SFT FLOPs).
  assert set(results["base"]["ledger"]["flops"]) == {"eval/heldout", "eval/band"}
  for phase in ["joint_grpo"] + experts:
    assert {"rollout/prefill", "rollout/decode", "train/policy"} <= set(
        training_flops(results[phase]["ledger"])), phase
  assert training_flops(results["mopd"]["ledger"]).get("train/teacher", 0) > 0
  # The experts at the per-domain batch (experts.prompts_per_step=0, the default): each samples
  # half of joint GRPO's rows a step, so each domain sees as many samples in both routes.
  rows = {}
  for phase in ["joint_grpo"] + experts:
    with open(os.path.join(wd, "seed_0", phase, "logs", "metrics.jsonl")) as f:
      rows[phase] = {json.loads(ln).get("num_sequences") for ln in f} - {None}
  assert rows["joint_grpo"] == {8.0} and all(rows[e] == {4.0} for e in experts), rows
  expert_total = sum(sum(training_flops(results[e]["ledger"]).values()) for e in experts)
  mopd_total = sum(training_flops(results["mopd"]["ledger"]).values())
  sm = rep["arms"]["split_merge"]
  assert sm["flops_total"]["mean"] == pytest.approx(expert_total + mopd_total, rel=1e-12)
  assert sm["distillation_share_run"]["mean"] == pytest.approx(mopd_total / expert_total)
  assert rep["arms"]["joint_grpo"]["flops_total"]["mean"] == pytest.approx(
      sum(training_flops(results["joint_grpo"]["ledger"]).values()), rel=1e-12)


def test_base_phase_is_the_hf_checkpoint(study, hf_dir):
  wd, _ = study
  want = _flat(_expected_params(hf_dir[1]))
  base = _flat(_final_params(wd, "base"))
  assert set(base) == set(want)
  for k in want:
    np.testing.assert_array_equal(base[k], want[k], err_msg=k)


def test_missing_tokenizer_json_is_named(tmp_path, hf_dir, data, cache):
  no_tok = str(tmp_path / "no_tokenizer")
  shutil.copytree(hf_dir[0], no_tok)
  os.remove(os.path.join(no_tok, "tokenizer.json"))
  r = _main(no_tok, data, tmp_path / "wd", cache, timeout=120)
  assert r.returncode != 0 and os.path.join(no_tok, "tokenizer.json") in r.stderr, r.stderr[-2000:]


def test_tokenizer_larger_than_model_vocab_is_an_error(tmp_path, hf_dir, data, cache):
  # Ids past the checkpoint's embedding would be clamped by the gather: garbage, not an error.
  big_tok = str(tmp_path / "big_tokenizer")
  shutil.copytree(hf_dir[0], big_tok)
  tok = Tokenizer.from_file(os.path.join(big_tok, "tokenizer.json"))
  n_model = tok.get_vocab_size() + EXTRA_MODEL_VOCAB
  tok.add_tokens([f"<extra_{i}>" for i in range(EXTRA_MODEL_VOCAB + 3)])
  tok.save(os.path.join(big_tok, "tokenizer.json"))
  r = _main(big_tok, data, tmp_path / "wd", cache, timeout=120)
  assert r.returncode != 0, r.stdout[-2000:]
  assert ("vocab_size" in r.stderr and str(tok.get_vocab_size()) in r.stderr
          and str(n_model) in r.stderr), r.stderr[-2000:]
