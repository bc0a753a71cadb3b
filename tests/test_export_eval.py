"""`smjax export` and `smjax eval` (smjax.study.export, smjax.model_eval): a study arm's model as a
Hugging Face directory that `transformers` and smjax load to the same logits and the same greedy
tokens, a source model's tokenizer and chat template carried over, an evaluation that matches a
hand count, and bad input as one line (exit 2).

No study runs: a workdir is laid out as a study leaves it (config.json, seed_0/arms.json, each
phase's result.json and final/ parameters, smjax.study.store) with parameters made here: random
ones for the parity checks, and a hand-built toy model that answers "7" to every math prompt for
the evaluation (its residual stream is the token embedding alone, so it is a bigram model).
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from hf_models import tiny_hf_model
from smjax import main as smjax_main
from smjax import model_eval
from smjax.batch import encode_prompt
from smjax.models import hf
from smjax.models.presets import get_preset
from smjax.models.tokenizer import CharTokenizer, char_tokenizer_files, load_tokenizer
from smjax.models.transformer import Transformer, init_params
from smjax.rollout import Sampler
from smjax.study import export as export_lib
from smjax.study import store
from smjax.study.config import study_defaults
from smjax.study.report import ArmResult
from smjax.study.stats import wilson_interval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = get_preset("toy-tiny")
CHAR = CharTokenizer()


def _random_params(cfg, seed, scale=0.3):
  """N(0, scale^2) matrices and unit norm scales (numpy-filled: no init program compiles)."""
  rs = np.random.RandomState(seed)
  shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  return jax.tree.map(lambda a: np.asarray(rs.normal(0, scale, a.shape) if len(a.shape) >= 2
                                           else 1.0 + rs.normal(0, 0.1, a.shape), a.dtype), shapes)


def _answers_seven(cfg):
  """A toy model whose greedy and sampled completion of any prompt ending in '.' is "7" then EOS:
  attention and MLP outputs are zero, so the logits are a function of the last token alone."""
  params = jax.tree.map(np.zeros_like, _random_params(cfg, 0))
  for i in range(cfg.n_layers):
    for norm in ("input_norm", "post_attn_norm"):
      params[f"layers_{i}"][norm]["scale"][:] = 1.0
  params["final_norm"]["scale"][:] = 1.0
  dot, seven = CHAR.encode(".7")
  params["embed"][dot, 0] = params["embed"][seven, 1] = 1.0
  params["lm_head"][0, seven] = params["lm_head"][1, CHAR.eos_id] = 10.0   # logit 80 vs 0
  return params


def _study_workdir(root, phases: dict, model: dict | None = None):
  """A study workdir as smjax.study leaves it, `phases` ({arm: (phase, params)}) finished in
  seed 0."""
  config = study_defaults()
  for k, v in (model or {}).items():
    config.model[k] = v
  wd = root / "wd"
  seed_dir = wd / "seed_0"
  seed_dir.mkdir(parents=True)
  (wd / "config.json").write_text(json.dumps(config.to_dict()))
  arms = []
  for arm, (phase, params) in phases.items():
    store.save_params(str(seed_dir / phase / "final"), params)
    curve = [{"step": 3, "flops": 1.0, "accuracy": {"math": 0.25}, "mean": 0.25}]
    (seed_dir / phase / "result.json").write_text(json.dumps({"ledger": {}, "curve": curve}))
    arms.append(dataclasses.asdict(ArmResult(arm, 0, curve, {})))
  (seed_dir / "arms.json").write_text(json.dumps({"arms": arms}))
  return str(wd)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
  """A toy study's workdir with split_merge (random) and joint_grpo (answers 7), both exported."""
  root = tmp_path_factory.mktemp("toy")
  random = _random_params(CFG, 1)
  wd = _study_workdir(root, {"split_merge": ("mopd", random),
                             "joint_grpo": ("joint_grpo", _answers_seven(CFG))})
  out = str(root / "split_merge")
  summary = export_lib.export(wd, "split_merge", out)
  seven = str(root / "joint")
  export_lib.export(wd, "joint_grpo", seven)
  return {"wd": wd, "out": out, "seven": seven, "params": random, "summary": summary,
          "root": root}


def test_export_writes_an_hf_directory(toy):
  s = toy["summary"]
  assert (s["arm"], s["phase"], s["architecture"], s["tokenizer"]) == (
      "split_merge", "mopd", "LlamaForCausalLM", "char")
  for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", export_lib.EXPORT_FILE):
    assert name in s["files"] and os.path.exists(os.path.join(toy["out"], name)), name
  meta = json.load(open(os.path.join(toy["out"], export_lib.EXPORT_FILE)))
  assert (meta["arm"], meta["phase"], meta["seed"], meta["model"]) == (
      "split_merge", "mopd", 0, "toy-tiny")
  assert not os.path.exists(toy["out"] + ".partial")
  # An earlier export is replaced in place.
  again = export_lib.export(toy["wd"], "mopd", toy["out"])
  assert again["phase"] == "mopd" and json.load(open(os.path.join(
      toy["out"], export_lib.EXPORT_FILE)))["arm"] == "mopd"


def test_toy_tokenizer_loads_in_transformers_with_the_studys_ids(toy):
  tok = transformers.AutoTokenizer.from_pretrained(toy["out"])
  text = "057+038=3+8+0=1,1;\n#95 {x}"
  assert tok(text).input_ids == encode_prompt(CHAR, text)
  assert tok.decode(CHAR.encode(text) + [CHAR.eos_id], skip_special_tokens=True) == text
  assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
  assert isinstance(load_tokenizer(toy["out"]), CharTokenizer)


def test_transformers_and_smjax_give_the_same_logits_and_greedy_tokens(toy):
  """The export loaded by transformers and by smjax: the logits of the parameters the study
  saved, and greedy decoding token for token (through EOS where one comes)."""
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(toy["out"]).eval()
  cfg, params, tok = model_eval.load_model(toy["out"])
  assert cfg.replace(name=CFG.name) == CFG
  prompts = ["057+038=", "abc->", "x"]
  ids = [encode_prompt(tok, p) for p in prompts]
  toks = np.asarray([i + [0] * (10 - len(i)) for i in ids])   # right-padded: causal, unmasked
  with torch.no_grad():
    ref = hf_model(torch.tensor(toks)).logits.numpy()
  forward = jax.jit(lambda p: Transformer(cfg).apply({"params": p}, jnp.asarray(toks))[0])
  ours = np.asarray(forward(params))
  assert np.abs(ours - np.asarray(forward(jax.tree.map(jnp.asarray, toy["params"])))).max() == 0
  assert np.abs(ours - ref).max() <= 1e-4
  n = 24
  sampler = Sampler(cfg, max_new_tokens=n, eos_id=tok.eos_id, pad_id=tok.pad_id,
                    prompt_buckets=(16,))
  res = sampler.generate(params, ids, jax.random.key(0), greedy=True)
  with torch.no_grad():   # the sampler's left-padded prompts, as a batch
    want = hf_model.generate(torch.tensor(np.asarray(res.prompt_BP), dtype=torch.long),
                             attention_mask=torch.tensor(np.asarray(res.prompt_mask_BP),
                                                         dtype=torch.long),
                             max_new_tokens=n, do_sample=False)[:, 16:].numpy()
  for row in range(len(prompts)):
    got = np.asarray(res.completion_BC[row])[:int(res.lengths_B[row])].tolist()
    assert got == want[row, :len(got)].tolist(), (prompts[row], got, want[row])
    assert len(got) == n or got[-1] == tok.eos_id   # transformers pads the rest of a stopped row
  assert len(set(np.asarray(res.completion_BC).ravel().tolist())) > 3  # not one repeated token


def test_hf_study_export_copies_tokenizer_and_chat_template(tmp_path):
  """A study on an HF model (model.hf_path): the export has the source's architecture, token
  ids, tokenizer files and chat template, and transformers gives the source model's logits."""
  src = tmp_path / "src"
  model = tiny_hf_model("qwen2", seed=3, vocab=128)
  model.save_pretrained(str(src))
  tok_cfg = {"eos_token": "<eos>", "pad_token": "<pad>", "bos_token": "<bos>",
             "tokenizer_class": "PreTrainedTokenizerFast",
             "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}
  (src / "tokenizer.json").write_text(char_tokenizer_files(64)["tokenizer.json"])
  (src / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
  (src / "chat_template.jinja").write_text(tok_cfg["chat_template"])
  _, params = hf.load_params(str(src))
  wd = _study_workdir(tmp_path, {"joint_grpo": ("joint_grpo", params)},
                      model={"hf_path": str(src), "max_seq_len": 32})
  out = str(tmp_path / "out")
  s = export_lib.export(wd, "joint_grpo", out)
  assert (s["architecture"], s["tokenizer"], s["chat_template"]) == (
      "Qwen2ForCausalLM", "source", True)
  for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
               "generation_config.json"):
    assert (src / name).read_bytes() == open(os.path.join(out, name), "rb").read(), name
  got = json.load(open(os.path.join(out, "config.json")))
  want = json.load(open(src / "config.json"))
  assert got["max_position_embeddings"] == want["max_position_embeddings"]   # not the study's 32
  assert all(got.get(k) == want.get(k) for k in ("bos_token_id", "eos_token_id"))
  toks = torch.tensor(np.random.RandomState(0).randint(0, 99, (2, 12)))
  with torch.no_grad():
    ref = model(toks).logits.numpy()
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()(toks).logits.numpy()
  assert np.abs(back - ref).max() <= 1e-5
  assert transformers.AutoTokenizer.from_pretrained(out).chat_template == tok_cfg["chat_template"]


MATH = [("What is 3 plus 4?", "3+4=7\n#### 7"), ("Seven?", 7), ("Box it.", "\\boxed{7}"),
        ("What is 4 plus 4?", "#### 8"), ("Ten times seven?", "#### 70")]


def test_eval_accuracy_matches_a_hand_count(toy, tmp_path, capsys):
  """The model answers "7" to everything: 3 of the 5 records have 7 as their answer."""
  data = tmp_path / "math.jsonl"
  data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in MATH))
  out = tmp_path / "r" / "eval.json"
  assert model_eval.main([toy["seven"], "--data", str(data), "--samples", "2",
                          "--max-new-tokens", "4", "--json", str(out)]) == 0
  r = json.load(open(out))
  assert r["domain"].startswith("jsonl_math:") and r["prompts"] == 5 and r["samples"] == 2
  assert [p["correct"] for p in r["per_prompt"]] == [2, 2, 2, 0, 0]
  assert r["accuracy"] == pytest.approx(3 / 5) and r["pass_at_k"] == pytest.approx(3 / 5)
  assert (r["lo"], r["hi"]) == pytest.approx(wilson_interval(0.6, 5, 0.95))
  assert r["completions"][0]["completion"] == "7" and r["mean_length"] == 2.0  # "7" and EOS
  printed = capsys.readouterr().out
  assert "accuracy 60.0% (95% interval 23.1% to 88.2%, Wilson over prompts)" in printed, printed


def _one_line(e):
  msg = smjax_main.user_error(e)
  assert msg is not None and "\n" not in msg, (type(e), str(e))
  return msg


@pytest.mark.parametrize("args, says", [
    (["--phase", "expert_math"], "its phase 'expert_math' has not finished"),
    (["--phase", "bogus"], "--phase bogus: no such arm"),
    (["--phase", "split_merge", "--seed", "4"],
     "give --seed one of the seeds this workdir has (0)"),
])
def test_export_bad_input_is_one_line(toy, tmp_path, args, says):
  with pytest.raises(Exception) as e:
    export_lib.main([toy["wd"], "--out", str(tmp_path / "o"), *args])
  msg = _one_line(e.value)
  assert says in msg, msg
  if "bogus" in args:   # the arms the seed has are listed
    assert "seed 0 has finished split_merge, joint_grpo" in msg, msg
  assert not (tmp_path / "o").exists()


def test_export_refuses_an_out_dir_that_is_not_an_export(toy, tmp_path):
  (tmp_path / "o").mkdir()
  (tmp_path / "o" / "notes.txt").write_text("mine")
  with pytest.raises(FileExistsError) as e:
    export_lib.export(toy["wd"], "split_merge", str(tmp_path / "o"))
  assert "holds files that are not an earlier export" in _one_line(e.value)
  assert os.listdir(tmp_path / "o") == ["notes.txt"]


def test_the_rules_end_and_an_experts_bar_are_exported_from_their_snapshots(tmp_path):
  """`<arm>@rule` is the run where its stop rule would have ended it (its kept snapshot, read at
  that evaluation); where the rule never ended the run it is the run's end; `expert_<d>@<bar>`
  is the expert's checkpoint at that bar; a snapshot never kept is a one-line error."""
  a, b, c = (_random_params(CFG, s) for s in (2, 3, 4))
  wd = _study_workdir(tmp_path, {"control_opd": ("control_opd", a), "external_opd":
                                 ("external_opd", a), "expert_math": ("expert_math", a),
                                 "joint_grpo": ("joint_grpo", b), "base": ("base", c)})
  seed_dir = os.path.join(wd, "seed_0")
  curve = [{"step": s, "flops": float(s), "accuracy": {"math": s / 10}, "mean": s / 10}
           for s in (3, 6, 9)]
  extras = {"control_opd": {"rule_end": {"index": 1, "step": 6, "met": True}},
            "external_opd": {"rule_end": {"index": 2, "step": 9, "met": False}},
            "expert_math": {"snapshots": {"0.9": {"step": 3, "flops": 3.0}}}}
  for phase, extra in extras.items():
    with open(os.path.join(seed_dir, phase, "result.json"), "w") as f:
      json.dump({"ledger": {}, "curve": curve, "extra": extra}, f)
  store.save_params(store.snapshot_dir(seed_dir, "control_opd", store.RULE_SNAPSHOT), b)
  store.save_params(store.snapshot_dir(seed_dir, "expert_math", "0.9"), c)

  def exported(arm):
    out = str(tmp_path / arm.replace("@", "_at_"))
    s = export_lib.export(wd, arm, out)
    meta = json.load(open(os.path.join(out, export_lib.EXPORT_FILE)))
    tensors = safetensors.numpy.load_file(os.path.join(out, "model.safetensors"))
    return s["phase"], meta["step"], meta["accuracy"], tensors

  def same(x, y):
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)

  ref = {arm: exported(arm)[3] for arm in ("control_opd", "joint_grpo", "base")}
  assert not same(ref["control_opd"], ref["joint_grpo"])
  phase, step, acc, t = exported("control_opd@rule")
  assert (phase, step, acc) == ("control_opd", 6, {"math": 0.6}) and same(t, ref["joint_grpo"])
  assert exported("control_opd")[1] == 9
  phase, step, _, t = exported("external_opd@rule")   # its rule never ended it: its end
  assert (phase, step) == ("external_opd", 9) and same(t, ref["control_opd"])
  phase, step, _, t = exported("expert_math@0.9")
  assert (phase, step) == ("expert_math", 3) and same(t, ref["base"])
  with pytest.raises(ValueError) as e:
    export_lib.export(wd, "expert_math@0.5", str(tmp_path / "o"))
  assert "expert_math kept no checkpoint at '0.5'; it kept 0.9" in _one_line(e.value)
  shutil.rmtree(store.snapshot_dir(seed_dir, "control_opd", store.RULE_SNAPSHOT))
  with pytest.raises(FileNotFoundError) as e:
    export_lib.export(wd, "control_opd@rule", str(tmp_path / "o"))
  assert "control_opd kept no parameters where its stop rule would have ended it" in _one_line(
      e.value)
  assert not (tmp_path / "o").exists()
  assert export_lib.checkpoint_of("split_merge@0.9") == ("split_merge@0.9", None)


def test_eval_bad_input_is_one_line(toy, tmp_path):
  data = tmp_path / "math.jsonl"
  data.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
  cases = [([toy["seven"], "--data", str(tmp_path / "none.jsonl")], "no such file"),
           ([str(tmp_path), "--data", str(data)], f"{tmp_path}/config.json does not exist"),
           ([toy["seven"], "--data", str(data), "--domain", "poetry"], "--domain poetry"),
           ([toy["seven"], "--data", str(data), "--temperature", "0", "--samples", "4"],
            "--samples 4 with")]
  for args, says in cases:
    with pytest.raises(Exception) as e:
      model_eval.main(args)
    assert says in _one_line(e.value), (args, str(e.value))


def test_cli_wiring_help_and_errors_exit_codes(toy, tmp_path):
  """Through the console script's entry: --help exits 0, a missing phase is one line, exit 2."""
  def smjax(*args):
    code = f"import sys; sys.argv = ['smjax', *{list(args)!r}]; from smjax.main import cli; cli()"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  p = smjax("export", toy["wd"], "--phase", "recover_self", "--out", str(tmp_path / "o"))
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert p.stderr.startswith("smjax: error: --phase recover_self: its phase"), p.stderr
  for cmd in ("export", "eval"):
    with pytest.raises(SystemExit) as e:
      (export_lib if cmd == "export" else model_eval).main(["--help"])
    assert e.value.code == 0


def test_argument_errors_are_one_line_exit_2(capsys):
  for fn in (export_lib.main, model_eval.main):
    with pytest.raises(SystemExit) as e:
      fn([])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("smjax: error: the following arguments are "
                                                   "required"), err


def test_tensorboard_hint_says_how_to_install_the_viewer(monkeypatch):
  import importlib.util  # pylint: disable=import-outside-toplevel
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "tensorboard" else real(name, *a))
  assert smjax_main.tensorboard_hint("runs/x") == (
      "TensorBoard: pip install 'smjax[tensorboard]', then tensorboard --logdir runs/x")
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
  assert smjax_main.tensorboard_hint("runs/x") == "TensorBoard: tensorboard --logdir runs/x"
