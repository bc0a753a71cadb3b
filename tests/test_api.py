"""The short API (smjax.api): `smjax.grpo` with a reward callable learns a trivially learnable task
on the smallest toy preset, and its ledger, curve and checkpoint agree (a rerun into its workdir
resumes at its end); `smjax.distill` from two teachers routed by domain takes the study's OPD step
on the same batch (smjax.study.shared.opd_parts, TeacherRouter, opd_batch), each domain's rows
scored by its teacher; a model directory loads back as the model written to it; records come from
lists or files, split by domain and by a hash of the prompt; a `module:attr` domain passes the
study's config validation and keys its shared record by its name, and a bad path (in the study
and on the command line) or bad inputs are one-line errors before anything compiles.

One GRPO run (module fixture, 20 steps of 4 prompts x 8 samples, 8 new tokens) is shared; the
distillation samples the same shapes, so its sampler programs are the GRPO run's (compiled once
per process: smjax.decode's module-level jits)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smjax
from smjax import api

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = dict(steps=20, prompts_per_step=4, samples_per_prompt=8, max_new_tokens=8,
            learning_rate=3e-3, progress=False, log_every=1, eval_size=8)
LETTERS = [{"prompt": f"{c}{n}:", "letter": c} for c in "abcdefghijklmnopqrstuvwxyz"
           for n in range(4)]


def share_of_ab(prompts, completions, **fields):
  """The share of a completion's 8 tokens that are `a` or `b`: a random char model writes them
  2 times in 128, and GRPO raises it within a few steps."""
  assert len(prompts) == len(completions) and all(len(v) == len(prompts) for v in fields.values())
  return [sum(ch in "ab" for ch in c) / 8 for c in completions]


def rows(result) -> list[dict]:
  with open(os.path.join(result.workdir, "logs", "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return smjax.grpo("toy-tiny", LETTERS, share_of_ab,
                    workdir=str(tmp_path_factory.mktemp("grpo")), **FAST)


def test_grpo_raises_the_reward_and_its_records_agree(run, tmp_path_factory):
  rewards = [r["reward/mean"] for r in rows(run) if "reward/mean" in r]
  assert len(rewards) == FAST["steps"]
  assert np.mean(rewards[:3]) < 0.06 and np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.1, rewards
  # The curve: held-out evaluations at the start and the end, at the ledger's training FLOPs.
  assert [p["step"] for p in run.curve] == [0, FAST["steps"]]
  assert run.curve[0]["flops"] == 0 and run.curve[-1]["flops"] == run.flops > 0
  assert set(run.curve[-1]["accuracy"]) == {"data"} and run.accuracy == run.curve[-1]["mean"]
  phases = run.ledger.by_phase()
  assert {"rollout/prefill", "rollout/decode", "train/policy", "eval/heldout"} <= set(phases)
  assert "train/reference" not in phases   # beta=0: no reference forward
  assert run.checkpoint == os.path.join(run.workdir, "checkpoints", str(FAST["steps"]))
  assert os.path.isdir(run.checkpoint)
  # A rerun into the workdir resumes from that checkpoint: nothing left to do, the same result.
  again = smjax.grpo("toy-tiny", LETTERS, share_of_ab, workdir=run.workdir, **FAST)
  assert again.curve == run.curve and again.ledger.by_phase() == phases
  for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(run.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # ...and a changed setting that changes the run is refused, naming it.
  with pytest.raises(ValueError) as e:
    smjax.grpo("toy-tiny", LETTERS, share_of_ab, workdir=run.workdir,
               **(FAST | {"temperature": 0.5}))
  assert "holds a checkpoint of another run (settings.temperature: 1.0 -> 0.5)" in str(e.value)
  assert "\n" not in str(e.value)


def test_a_model_directory_loads_back_as_a_model(run, tmp_path):
  """The GRPO result written as a Hugging Face directory (as `smjax export` writes a toy model:
  Llama flags, the char tokenizer's files) loads back with the same parameters and tokenizer."""
  # pylint: disable=import-outside-toplevel
  from smjax.models import hf
  from smjax.models.tokenizer import CharTokenizer, char_tokenizer_files
  out = tmp_path / "hf"
  hf.save_params(str(out), run.model.cfg, jax.tree.map(np.asarray, run.params),
                 architecture="LlamaForCausalLM")
  for name, text in char_tokenizer_files(run.model.cfg.max_seq_len).items():
    (out / name).write_text(text)
  model = api.load_model(str(out))
  assert isinstance(model.tokenizer, CharTokenizer) and model.source == str(out)
  for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(run.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(FileNotFoundError, match="a directory without config.json"):
    api.load_model(str(tmp_path))


def test_distill_routes_each_domain_to_its_teacher_as_the_study_does(run, tmp_path):
  """Two teachers (the GRPO result, and a fresh parameter tree of the student's architecture),
  routed by the records' "domain" field: the first step's metrics are the study's OPD step on
  the batch the study's pieces build from the same prompts and rollout."""
  # pylint: disable=import-outside-toplevel
  from smjax import data as data_lib
  from smjax.models.transformer import Transformer
  from smjax.rollout import Sampler
  from smjax.rewards.verify import verify_batch
  from smjax.study.config import study_defaults
  from smjax.study.shared import new_train_state, opd_parts
  from smjax.train.loop import opd_batch, rollout
  from smjax.train.teachers import Teacher, TeacherRouter
  data = [dict(r, domain="lower" if i % 2 else "upper") for i, r in enumerate(LETTERS)]
  other = api.load_model("toy-tiny", seed=1).params
  student = api.load_model("toy-tiny")
  settings = dict(FAST, steps=1, learning_rate=1e-4, objective="full_vocab")
  res = smjax.distill("toy-tiny", teachers={"lower": run, "upper": other}, data=data,
                      reward=share_of_ab, workdir=str(tmp_path / "d"), **settings)
  first = next(r for r in rows(res) if "loss" in r)   # the first step's (after the evaluation)
  routed = {k.removeprefix("teacher_rows/"): v for k, v in first.items()
            if k.startswith("teacher_rows/")}
  assert set(routed) == {"lower", "upper"} and all(routed.values()), routed
  assert sum(routed.values()) == FAST["prompts_per_step"] * FAST["samples_per_prompt"]
  assert res.ledger.by_phase()["train/teacher"] > 0

  # The study's pieces on the same prompts, rollout and teachers.
  cfg, tok = student.cfg, student.tokenizer
  c = study_defaults()
  c.opd.objective, c.opd.learning_rate = "full_vocab", 1e-4
  tx, step, layout = opd_parts(c.opd, c.rl.clip_norm, Transformer(cfg), cfg)
  domains = api.make_domains(data, share_of_ab)
  prompts = next(data_lib.PromptStream(iter(data_lib.prompt_pipeline(
      list(domains.values()), batch_size=FAST["prompts_per_step"], split="train", seed=0))))
  sampler = Sampler(cfg, max_new_tokens=FAST["max_new_tokens"], eos_id=tok.eos_id,
                    pad_id=tok.pad_id)
  ro, _ = rollout(sampler, student.params, prompts, tokenizer=tok,
                  verify=lambda e, t: verify_batch(e, t, domains=domains),
                  rng=jax.random.fold_in(jax.random.key(0), 0),
                  samples_per_prompt=FAST["samples_per_prompt"])
  router = TeacherRouter(cfg, [Teacher("lower", run.model.cfg, run.params, ("lower",)),
                               Teacher("upper", cfg, other, ("upper",))], want_logits=True)
  batch, _, host = opd_batch(ro, router=router, layout=layout)
  assert {k.removeprefix("teacher_rows/"): v for k, v in host.items()} == routed
  _, m = step(new_train_state(jax.tree.map(jnp.copy, student.params), tx, None, cfg), batch)
  for key in ("loss", "reverse_kl", "grad_norm"):
    np.testing.assert_allclose(first[key], float(m[key]), rtol=1e-5, err_msg=key)
  # Each domain's rows were scored by its own teacher: the other teacher disagrees with them.
  lower = np.array([e.domain == "lower" for e in ro.examples])
  swapped = TeacherRouter(cfg, [Teacher("lower", cfg, other, ("lower",)),
                                Teacher("upper", run.model.cfg, run.params, ("upper",))],
                          want_logits=True)
  mixed, _, _ = opd_batch(ro, router=swapped, layout=layout)
  diff = np.abs(np.asarray(batch.teacher_logits_BTV) - np.asarray(mixed.teacher_logits_BTV))
  mask = np.asarray(batch.loss_mask_BT)
  assert diff[lower][mask[lower]].max() > 1e-3 and diff[~lower][mask[~lower]].max() > 1e-3


def test_an_import_path_domain_goes_through_the_study_config():
  # pylint: disable=import-outside-toplevel
  from smjax.study.config import correct_fractions, domain_keys, study_defaults, validate
  from smjax.study.shared import seed_shared
  c = study_defaults()
  c.domains = ("math", "api_domains:EchoDomain")
  c.phases = ("base", "joint", "experts", "mopd")
  c.base.domain_correct_fraction = "echo=0.5"
  c.heldout_size, c.stop_size = 8, 4
  validate(c)
  assert domain_keys(c) == ("math", "echo")
  assert correct_fractions(c) == {"math": 0.1, "echo": 0.5}
  shared = seed_shared(c, 0)   # builds the seed's record: nothing compiles until a phase runs
  assert list(shared.domains) == ["math", "echo"] and set(shared.heldout) == {"math", "echo"}
  batch = next(shared.prompts(["echo"], 4, 0))
  assert {e.domain for e in batch} == {"echo"}
  rewards = shared.verify(batch, [e.reference for e in batch])
  assert list(rewards) == [1.0] * 4
  # Beside chain-form toy domains the base's flawed-chain mixture keeps its gold solutions.
  from smjax.study.phases import flaw_mixture  # pylint: disable=import-outside-toplevel
  assert flaw_mixture(shared.domains, correct_fractions(c))(batch[0]) == batch[0]
  # An instance works as well; a name two domains share is refused.
  c.domains = ("api_domains:ECHO",)
  c.base.domain_correct_fraction = ""
  assert domain_keys(c) == ("echo",)
  c.domains = ("api_domains:ECHO", "api_domains:EchoDomain")
  with pytest.raises(ValueError, match="two domains have one name"):
    validate(c)


@pytest.mark.parametrize("path, says", [
    ("nosuch_pkg.rewards:MyDomain", "cannot import module 'nosuch_pkg.rewards' "
                                    "(ModuleNotFoundError"),
    ("api_domains:Missing", "module 'api_domains' has no attribute 'Missing'"),
    ("api_domains:NOT_A_DOMAIN", "names '3' (int); expected a subclass or an instance"),
])
def test_a_bad_import_path_is_one_line(path, says):
  from smjax.study.config import study_defaults, validate  # pylint: disable=import-outside-toplevel
  c = study_defaults()
  c.domains = ("math", path)
  with pytest.raises(ValueError) as e:
    validate(c)
  assert str(e.value).startswith(f"domain {path!r}: ") and says in str(e.value), str(e.value)
  assert "\n" not in str(e.value)


def test_the_cli_names_a_bad_import_path_in_one_line(tmp_path):
  cmd = [sys.executable, "-m", "smjax.main", "--config=configs/study.py:two_domain,demo",
         "--config.domains=('math','nosuch_pkg.rewards:MyDomain')", f"--workdir={tmp_path / 'w'}"]
  p = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, SMJAX_CPU_MALLOC="glibc"),
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert p.stderr.startswith("smjax: error: domain 'nosuch_pkg.rewards:MyDomain': cannot import "
                             "module"), p.stderr


def test_records_from_a_file_split_by_domain_and_hash(tmp_path):
  path = tmp_path / "data.jsonl"
  path.write_text("".join(json.dumps(dict(r, domain="lower" if i % 2 else "upper")) + "\n"
                          for i, r in enumerate(LETTERS)))
  domains = api.make_domains(str(path), share_of_ab)
  assert sorted(domains) == ["lower", "upper"]
  for dom in domains.values():
    train, test = dom.records("train"), dom.records("test")
    assert train and test and not {e.prompt for e in train} & {e.prompt for e in test}
  assert sum(len(d.records("train")) + len(d.records("test")) for d in domains.values()) == 104
  # eval_data= gives the held-out records; every record of data is then trained on.
  held = api.make_domains(LETTERS[:8], share_of_ab, eval_data=LETTERS[8:10])
  assert len(held["data"].records("train")) == 8 and len(held["data"].records("test")) == 2
  # Domains by name, import path or object: each goes by its name, and verifies itself.
  from api_domains import EchoDomain  # pylint: disable=import-outside-toplevel
  domains = api.make_domains(["math", "api_domains:ECHO"])
  assert sorted(domains) == ["echo", "math"] and isinstance(domains["echo"], EchoDomain)
  with pytest.raises(ValueError, match="two domains are named 'echo'"):
    api.make_domains([EchoDomain(), "api_domains:ECHO"])
  with pytest.raises(TypeError, match="reward= goes with records"):
    api.make_domains("math", share_of_ab)
  path.write_text('{"prompt": "a1:"}\n{"prompt": 3}\n')
  with pytest.raises(ValueError, match=r"data.jsonl:2: 'prompt' is 3; expected a non-empty"):
    api.make_domains(str(path), share_of_ab)


def _bad_length(prompts, completions, **_):
  return [1.0]


def _bad_value(prompts, completions, **_):
  return ["yes"] * len(completions)


@pytest.mark.parametrize("kwargs, error, says", [
    (dict(reward=_bad_length), ValueError, "reward returned 1 values for 2 completions"),
    (dict(reward=_bad_value), ValueError, "reward returned 'yes' (str) at index 0"),
    (dict(model="toy-huge"), ValueError, "model='toy-huge' is neither a preset"),
    (dict(data=[]), ValueError, "data is empty"),
    (dict(data=[{"question": "1+1="}]), ValueError, "data[0]: 'prompt' is missing"),
    (dict(lr=1e-3), TypeError, "unknown setting lr=0.001"),
    (dict(config={"lr": 1}), TypeError, "unknown setting lr=1"),
    (dict(config=3), TypeError, "config= is of type int; expected an ml_collections ConfigDict"),
    (dict(steps="ten"), TypeError, "steps='ten' is of type str; expected an integer"),
    (dict(samples_per_prompt=1), ValueError, "samples_per_prompt=1: GRPO/RLOO advantages"),
    (dict(advantage_mode="ppo"), ValueError, "smjax.grpo: advantage_mode='ppo'; expected one of"),
    (dict(max_new_tokens=200), ValueError, "max_new_tokens=200 does not fit"),
    (dict(model={"w": np.zeros(3)}), TypeError, "parameters (dict) need arch="),
    (dict(model={"w": np.zeros(3)}, arch="toy-tiny"), ValueError, "the parameters do not fit"),
])
def test_bad_inputs_are_one_line_errors_before_any_work(kwargs, error, says):
  args = dict(model="toy-tiny", data=LETTERS, reward=share_of_ab) | kwargs
  with pytest.raises(error) as e:
    smjax.grpo(args.pop("model"), args.pop("data"), args.pop("reward"), **args)
  assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_distill_names_a_domain_without_a_teacher(run):
  data = [dict(r, domain="lower" if i % 2 else "upper") for i, r in enumerate(LETTERS)]
  with pytest.raises(ValueError, match=r"no teacher for domain\(s\) \['upper'\]"):
    smjax.distill("toy-tiny", teachers={"lower": run}, data=data)
  with pytest.raises(ValueError, match=r"\['math'\] name\(s\) no domain"):
    smjax.distill("toy-tiny", teachers={"lower": run, "upper": run, "math": run}, data=data)
