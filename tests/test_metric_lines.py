"""Watching a run: the plain metric lines a run without a progress bar prints (their format and
cadence, in run_rl and run_sft with every model piece scripted: no model, no compile), none
beside a progress bar, the Weights & Biases writer against a fake `wandb` module, and the
one-line error for a wandb project set without the extra installed."""

import io
import itertools
import json
import re
import sys
import types

import numpy as np
import pytest

from smjax.ledger import FlopLedger
from smjax.models.tokenizer import CharTokenizer
from smjax.train import loop as loop_lib
from smjax.train import metrics as metrics_lib
from smjax.train.metrics import MetricLines, MetricsWriter, sci


class _Terminal(io.StringIO):
  """A stderr that says it is a terminal: loops show their bar there (tqdm writes into it)."""

  def isatty(self):
    return True


def test_a_line_shows_reward_accuracy_kl_tokens_per_second_and_flops(capsys):
  lines = MetricLines("joint_grpo", 800, 25, on=True)
  ev = lines.evaluation(100, {"accuracy": {"math": 0.6, "code": 0.5},
                              "stop": {"accuracy": {"math": 0.62, "code": 0.54}}}, flops=2.0e12)
  assert ev == ("joint_grpo eval step 100/800  acc math 0.600 code 0.500 mean 0.550  "
                "acc(stop) 0.580  flops 2.0e12")
  # Steps 101..124 add up their tokens and time; step 125 prints them as one rate.
  for done in range(101, 125):
    assert lines.step(done, {"reward/mean": 0.5}, flops=1.0, tokens=100, seconds=0.05) is None
  line = lines.step(125, {"reward/mean": 0.61, "kl_mean": 0.0123, "loss": 0.1}, flops=2.3e12,
                    tokens=100, seconds=0.05)
  assert line == ("joint_grpo step 125/800  reward 0.61  acc(stop) 0.58  kl(ref) 0.0123  "
                  "tok/s 2.0e3  flops 2.3e12")
  # OPD: its reverse KL to the teachers; SFT: loss and token accuracy; no KL without a reference.
  opd = MetricLines("mopd", 10, 5, on=True).step(5, {"reward/mean": 0.2, "reverse_kl": 0.35,
                                                     "kl_mean": 0.0}, flops=1e9)
  assert opd == "mopd step 5/10  reward 0.20  kl(teacher) 0.35  flops 1.0e9"
  sft = MetricLines("base/sft", 900, 50, on=True).step(
      1, {"loss": 1.23456, "token_accuracy": 0.4}, flops=3.4e13, tokens=8192, seconds=0.5)
  assert sft == "base/sft step 1/900  loss 1.235  acc(token) 0.40  tok/s 1.6e4  flops 3.4e13"
  assert capsys.readouterr().out.splitlines() == [ev, line, opd, sft]
  # Off (a bar is shown): nothing, though evaluations still set what later lines show.
  off = MetricLines("x", 10, 1, on=False)
  assert off.evaluation(1, {"accuracy": {"math": 0.3}}, flops=1.0) is None
  assert off.step(1, {"reward/mean": 0.1}, flops=1.0) is None and off.acc == ("heldout", 0.3)
  assert capsys.readouterr().out == ""
  assert [sci(x) for x in (2.3e12, 3100.0, 0.012, 0.0, float("inf"))] == [
      "2.3e12", "3.1e3", "1.2e-2", "0", "inf"]


def _scripted_rl(monkeypatch, *, steps=10, log_every=4, progress=False, writer=None):
  """run_rl with its rollout, step and evaluator scripted (as tests/test_report.py does)."""
  ex = types.SimpleNamespace(domain="math", prompt="q")
  ro = loop_lib.Rollout(types.SimpleNamespace(lengths_B=np.array([3.0, 5.0]), num_samples=2),
                        [ex, ex], np.array([0.0, 1.0], np.float32))
  monkeypatch.setattr(loop_lib, "rollout", lambda *a, **k: (ro, []))
  monkeypatch.setattr(loop_lib.steps_lib, "step_program_calls", lambda *a, **k: [])
  progress_ = loop_lib.RLProgress()

  def make_batch(_):
    progress_.ledger.add_flops("train/policy", 1e9)
    return None, [], {}

  accs = itertools.count()
  cfg = loop_lib.RLLoopConfig(steps=steps, samples_per_prompt=2, eval_every_steps=5,
                              log_every=log_every, progress=progress, collapse_window=0)
  return loop_lib.run_rl(
      types.SimpleNamespace(params="p"), name="joint_grpo", loop=cfg, progress=progress_,
      step=lambda state, batch: (state, {"loss": 0.0, "finite": 1.0, "kl_mean": 0.0}),
      make_batch=make_batch, sampler=None, tokenizer=None, prompts=itertools.repeat([ex]),
      verify=None, writer=writer,
      evaluator=lambda params: ({"accuracy": {"math": 0.1 * next(accs)},
                                 "completions": {"math": [{"prompt": "1+1=", "completion": "2",
                                                           "reward": 1.0}]}}, []))


def test_without_a_bar_run_rl_prints_a_line_every_log_every_steps_and_per_evaluation(
    monkeypatch, capsys):
  monkeypatch.setattr(sys, "stderr", io.StringIO())     # not a terminal: no bar even if asked
  _scripted_rl(monkeypatch, progress=True)
  out = capsys.readouterr().out.splitlines()
  assert sys.stderr.getvalue() == "", "no progress bar without a terminal"
  steps = [int(re.match(r"joint_grpo step (\d+)/10  ", l).group(1)) for l in out
           if " step " in l and " eval " not in l]
  evals = [l for l in out if l.startswith("joint_grpo eval step ")]
  assert steps == [1, 4, 8, 10], out                    # the first, every 4th, the last
  assert [l.split()[3] for l in evals] == ["0/10", "5/10", "10/10"], out
  assert evals[1] == "joint_grpo eval step 5/10  acc math 0.100  flops 5.0e9", out
  step8 = next(l for l in out if l.startswith("joint_grpo step 8/10"))
  # The last evaluation (after step 5) is the accuracy step 8 shows; 8 tokens a step, 1e9 FLOPs.
  assert re.fullmatch(r"joint_grpo step 8/10  reward 0\.50  acc\(heldout\) 0\.10  "
                      r"tok/s \d\.\de-?\d+  flops 8\.0e9", step8), step8
  assert out[-1].startswith("joint_grpo step 10/10") and out[-1].endswith("flops 1.0e10")


def test_beside_a_progress_bar_the_terminal_gets_no_lines(monkeypatch, capsys):
  monkeypatch.setattr(sys, "stderr", _Terminal())
  _scripted_rl(monkeypatch, progress=True)
  assert capsys.readouterr().out == ""
  assert "joint_grpo" in sys.stderr.getvalue()          # the bar, on the terminal


def test_run_sft_prints_its_lines_without_a_bar(monkeypatch, capsys):
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  monkeypatch.setattr(loop_lib.steps_lib, "step_program_calls", lambda *a, **k: [])
  ledger = FlopLedger()

  def step(state, batch):
    ledger.add_flops("base/sft", 1e6)
    return state, {"loss": 1.5, "token_accuracy": 0.25, "finite": 1.0}

  ex = types.SimpleNamespace(prompt="1+1=", solution="2", domain="math")
  loop_lib.run_sft(phase="base/sft", state="s", step=step, examples_iter=itertools.repeat([ex]),
                   tokenizer=CharTokenizer(), seq_len=16, num_steps=7, ledger=ledger,
                   log_every=3, progress=False)
  out = capsys.readouterr().out.splitlines()
  assert [l.split()[2] for l in out] == ["1/7", "3/7", "6/7", "7/7"], out
  assert re.fullmatch(r"base/sft step 3/7  loss 1\.500  acc\(token\) 0\.25  tok/s \S+  "
                      r"flops 3\.0e6", out[1]), out


class _FakeRun:
  def __init__(self, calls):
    self.calls = calls

  def define_metric(self, name, **kw):
    self.calls.append(("define_metric", name, kw))

  def log(self, row):
    self.calls.append(("log", row))

  def finish(self, exit_code=0):
    self.calls.append(("finish", exit_code))


def _fake_wandb(monkeypatch):
  """A `wandb` module that records what it is asked (wandb's servers cannot be reached here)."""
  calls = []
  mod = types.ModuleType("wandb")

  def init(**kw):
    calls.append(("init", kw))
    return _FakeRun(calls)

  class Html:  # pylint: disable=too-few-public-methods
    def __init__(self, data):
      self.data = data
  mod.init, mod.Html = init, Html
  monkeypatch.setitem(sys.modules, "wandb", mod)
  return calls


def test_the_wandb_writer_gets_the_rows_metrics_jsonl_gets(monkeypatch, tmp_path, capsys):
  calls = _fake_wandb(monkeypatch)
  writer = MetricsWriter(str(tmp_path), tensorboard=False,
                         wandb=dict(project="proj", name="seed_0/joint_grpo", run_id="abc",
                                    group="study", config={"log_every": 4}))
  with writer:
    _scripted_rl(monkeypatch, steps=6, log_every=2, writer=writer)
  capsys.readouterr()
  (_, init), *rest = calls
  assert init == dict(project="proj", entity=None, group="study", name="seed_0/joint_grpo",
                      id="abc", resume="allow", config={"log_every": 4}, dir=str(tmp_path))
  assert rest[:2] == [("define_metric", "step", {}),
                      ("define_metric", "*", {"step_metric": "step"})]
  assert rest[-1] == ("finish", 0)
  logged = [c[1] for c in rest if c[0] == "log"]
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert len(logged) == len(rows) > 3
  for row, got in zip(rows, logged):
    assert got["step"] == row["step"]
    scalars = {k: v for k, v in row.items() if isinstance(v, float)}
    assert {k: v for k, v in got.items() if k != "step" and isinstance(v, float)} == scalars
  # Every evaluation's completions, as HTML (escaped).
  texts = [got["completions/math"] for got in logged if "completions/math" in got]
  assert len(texts) == sum("completions/math" in r for r in rows) >= 2
  assert texts[0].data == "<pre>`1+1=` → `2` (reward 1)</pre>"
  assert any("heldout/mean" in got and "flops/cumulative" in got for got in logged)


def test_a_study_phase_names_its_wandb_run_and_keeps_its_id(monkeypatch, tmp_path):
  from smjax.study import phases as ph  # pylint: disable=import-outside-toplevel
  from smjax.study.config import study_defaults  # pylint: disable=import-outside-toplevel
  calls = _fake_wandb(monkeypatch)
  c = study_defaults()
  c.wandb.project = "proj"
  seed_dir = str(tmp_path / "my_study" / "seed_3")
  for _ in range(2):
    ph._writer(c, seed_dir, "joint_grpo").close()   # pylint: disable=protected-access
  inits = [kw for name, *kw in calls if name == "init"]
  assert len(inits) == 2 and inits[0][0] == inits[1][0]
  kw = inits[0][0]
  assert (kw["project"], kw["group"], kw["name"]) == ("proj", "my_study", "seed_3/joint_grpo")
  assert kw["resume"] == "allow" and kw["id"] and kw["config"]["wandb"]["project"] == "proj"
  assert kw["dir"] == str(tmp_path / "my_study" / "seed_3" / "joint_grpo" / "logs")
  # A phase that fails marks its run so; a SIGTERM's stop (SystemExit) does not.
  for error, code in ((FloatingPointError, 1), (SystemExit, 0)):
    with pytest.raises(error):
      with ph._writer(c, seed_dir, "joint_grpo"):   # pylint: disable=protected-access
        raise error("stop")
    assert calls[-1] == ("finish", code)
  c.wandb.project = ""
  calls.clear()
  ph._writer(c, seed_dir, "base").close()   # pylint: disable=protected-access
  assert calls == []


def test_a_wandb_project_without_the_extra_is_one_line_before_any_work(monkeypatch, tmp_path):
  from smjax.domains.base import MissingExtraError  # pylint: disable=import-outside-toplevel
  from smjax.main import user_error  # pylint: disable=import-outside-toplevel
  from smjax.study.config import study_defaults  # pylint: disable=import-outside-toplevel
  from smjax.study.run import start_study  # pylint: disable=import-outside-toplevel
  monkeypatch.setitem(sys.modules, "wandb", None)       # not installed
  c = study_defaults()
  c.wandb.project = "proj"
  with pytest.raises(MissingExtraError) as e:
    start_study(c, str(tmp_path / "w"))
  msg = user_error(e.value)
  assert "\n" not in msg and "config.wandb.project" in msg, msg
  assert "pip install 'smjax[wandb]'" in msg, msg
  assert not (tmp_path / "w").exists()
  with pytest.raises(MissingExtraError):
    MetricsWriter(str(tmp_path / "logs"), tensorboard=False, wandb=dict(project="p", name="n"))
  assert metrics_lib.progress_bar_shown(False) is False


def test_phase_lines_go_to_stdout_without_a_bar(monkeypatch, capsys):
  from smjax.study import store  # pylint: disable=import-outside-toplevel
  from smjax.study.config import study_defaults  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  c = study_defaults()
  c.progress = False
  store._say(c, "phase base: done in 3 s")   # pylint: disable=protected-access
  assert capsys.readouterr().out == "phase base: done in 3 s\n"
