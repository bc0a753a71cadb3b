"""The study's rules: the base's band check and flawed-chain mixture, the collapse check (and a
collapse ending a run as its outcome), and an SFT run stopped by a signal and resumed
(smjax.study.run.check_band, smjax.study.phases.flaw_mixture, smjax.train.guards.Collapse,
smjax.train.loop.run_rl and run_sft)."""

import itertools
import logging
import re
import types

import jax
import numpy as np
import pytest

from smjax import data as data_lib
from smjax.domains import get_domain
from smjax.ledger import FlopLedger
from smjax.models.presets import get_preset
from smjax.models.tokenizer import CharTokenizer
from smjax.models.transformer import Transformer, init_params
from smjax.study.config import study_defaults, validate
from smjax.study.phases import flaw_mixture
from smjax.study.run import BandError, check_band
from smjax.study.store import PhaseOutput
from smjax.train import loop as loop_lib
from smjax.train import state as state_lib
from smjax.train import steps as steps_lib
from smjax.train.guards import Collapse, CollapseError
from smjax.train.loop import RLLoopConfig, RLProgress, run_sft


def _base(acc, pass_k):
  band = {"samples": 8, "accuracy": acc, "pass_at_k": pass_k}
  return PhaseOutput(params=None, ledger=None, curve=[], extra={"band": band})


def test_band_accepts_a_partly_right_base_with_headroom():
  check_band(study_defaults(), 0, _base({"math": 0.35, "code": 0.5}, {"math": 0.8, "code": 0.9}))


@pytest.mark.parametrize("acc,pass_k,needle", [
    ({"math": 0.12, "code": 0.4}, {"math": 0.7, "code": 0.9}, "math accuracy 12.0% is outside"),
    ({"math": 0.3, "code": 0.61}, {"math": 0.7, "code": 0.95}, "code accuracy 61.0% is outside"),
    ({"math": 0.3, "code": 0.4}, {"math": 0.45, "code": 0.9}, "math pass@8 45.0% is less than"),
])
def test_band_refuses_a_base_outside_it_naming_seed_and_values(acc, pass_k, needle):
  with pytest.raises(BandError) as e:
    check_band(study_defaults(), 3, _base(acc, pass_k))
  msg = str(e.value)
  assert msg.startswith("seed 3: the base model misses config.band") and needle in msg, msg
  assert "\n" not in msg and "config.band.check=False" in msg


def test_hard_domains_are_judged_by_the_hard_band_the_others_by_the_usual_one():
  """band.hard_domains: a slow domain beside an easy one (the map's uneven cells). The hard band's
  bounds and headroom apply to it alone; the message says which band it missed."""
  c = study_defaults()
  c.band.hard_domains = "math"
  check_band(c, 0, _base({"math": 0.06, "code": 0.35}, {"math": 0.37, "code": 0.65}))
  for acc, pass_k, needle in [
      ({"math": 0.2, "code": 0.35}, {"math": 0.6, "code": 0.65},
       "math accuracy 20.0% is outside its hard band [2%, 15%]"),
      ({"math": 0.06, "code": 0.06}, {"math": 0.37, "code": 0.4},
       "code accuracy 6.0% is outside [20%, 50%]"),
      ({"math": 0.06, "code": 0.35}, {"math": 0.09, "code": 0.65},
       "math pass@8 9.0% is less than 5% above"),
  ]:
    with pytest.raises(BandError, match=re.escape(needle)):
      check_band(c, 0, _base(acc, pass_k))
  c.band.hard_domains = "math,logic"
  with pytest.raises(ValueError, match=r"config.band.hard_domains='math,logic': 'logic' is not"):
    validate(c)


def test_band_check_off_warns_and_goes_on(caplog):
  c = study_defaults()
  c.band.check = False
  with caplog.at_level(logging.WARNING):
    check_band(c, 1, _base({"math": 0.0}, {"math": 0.0}))
  assert "seed 1: the base model misses config.band" in caplog.text
  # It says that it goes on, not to set what is set.
  assert "going on with it (config.band.check=False)" in caplog.text
  assert "Change config.base" not in caplog.text


@pytest.mark.parametrize("p", [0.25, 0.6])
def test_flaw_mixture_hits_its_correct_fraction_and_is_stable(p):
  """Of the examples that admit a mistake, a fraction p keeps a correct chain (binomial
  tolerance, 4 sigma), each domain its own; examples without one are always correct; the same
  example always gets the same chain (a resumed base sees the same mixture)."""
  doms = {d: get_domain(d, difficulty=1, form="chain") for d in ("math", "code", "logic")}
  want = {"math": p, "code": p, "logic": p / 2}
  mix = flaw_mixture(doms, want)
  for name, dom in doms.items():
    p = want[name]
    ex = [dom.example("train", i, seed=5) for i in range(1500)]
    mixed = [mix(e) for e in ex]
    assert [mix(e).solution for e in ex[:50]] == [m.solution for m in mixed[:50]]
    with_sites = [(e, m) for e, m in zip(ex, mixed) if dom.chain_sites(e) > 0]
    assert all(m.solution == e.solution for e, m in zip(ex, mixed) if dom.chain_sites(e) == 0)
    # A chain is correct iff it is the gold chain (every flawed site makes the answer wrong).
    correct = np.mean([m.solution == e.solution for e, m in with_sites])
    n = len(with_sites)
    assert abs(correct - p) < 4 * np.sqrt(p * (1 - p) / n), (name, correct, n)
    assert name != "logic" or n == len(ex)   # every logic chain has sites
    wrong = [m for e, m in with_sites if m.solution != e.solution][:200]
    if name == "math":
      assert all(dom.verify(m, m.solution) == 0.0 for m in wrong)


def test_domain_correct_fraction_overrides_per_domain_and_is_validated():
  from smjax.study.config import (  # pylint: disable=import-outside-toplevel
      correct_fractions, validate)
  c = study_defaults()
  c.domains = ("math", "code", "logic")
  c.base.correct_fraction = 0.1
  c.base.domain_correct_fraction = " logic=0.5, code=0.25 "
  assert correct_fractions(c) == {"math": 0.1, "code": 0.25, "logic": 0.5}
  for bad, says in (("strings=0.5", "'strings' is not one of config.domains"),
                    ("logic=1.5", "'logic=1.5' must be domain=fraction"),
                    ("logic", "'logic' must be domain=fraction"),
                    ("logic=half", "'logic=half' must be domain=fraction")):
    c.base.domain_correct_fraction = bad
    with pytest.raises(ValueError, match="config.base.domain_correct_fraction=") as e:
      validate(c)
    assert says in str(e.value), str(e.value)


def _collapse(window=3):
  return Collapse("joint_grpo", window, vocab_size=128, advice="config.rl.learning_rate too high")


def test_collapse_on_sustained_zero_reward_and_zero_gradient():
  c = _collapse()
  dead = {"reward/mean": 0.0, "grad_norm": 0.0, "entropy": 1.0}
  c.step(0, dead)
  c.step(1, dead)
  c.step(2, {"reward/mean": 0.1, "grad_norm": 0.3, "entropy": 1.0})   # resets the count
  c.step(3, dead)
  c.step(4, dead)
  with pytest.raises(CollapseError) as e:
    c.step(5, dead)
  msg = str(e.value)
  assert msg.startswith("joint_grpo: the policy collapsed at step 5: no sample has scored")
  assert "config.rl.learning_rate too high" in msg and "collapse_window=0" in msg
  # All samples right also has no variance and no gradient: that is saturation, not collapse.
  c = _collapse()
  for i in range(10):
    c.step(i, {"reward/mean": 1.0, "grad_norm": 0.0, "entropy": 0.1})


def test_collapse_on_uniform_output_and_on_heldout_falling_to_zero():
  c = _collapse()
  uniform = {"reward/mean": 0.2, "grad_norm": 1.0, "entropy": float(np.log(128))}
  c.step(0, uniform)
  c.step(1, uniform)
  with pytest.raises(CollapseError, match=r"entropy has been at ln V \(4.852\) for 3 steps"):
    c.step(2, uniform)
  c = _collapse()
  c.evaluation(0, 0.0)       # a base at 0 that stays there is not a collapse
  c.evaluation(10, 0.0)
  c.evaluation(20, 0.3)
  with pytest.raises(CollapseError, match="held-out accuracy fell to 0 from 30.0%"):
    c.evaluation(30, 0.0)
  off = _collapse(window=0)
  for i in range(5):
    off.step(i, {"reward/mean": 0.0, "grad_norm": 0.0, "entropy": 9.0})
  off.evaluation(0, 0.5)
  off.evaluation(1, 0.0)


def _scripted_grpo(loop, *, rewards, accuracies, progress=None, saves=None):
  """run_rl with its rollout, step and evaluator scripted: step i's batch scores rewards[i] with
  a zero gradient when it is 0; evaluation k reads accuracies[k]. Returns (result, rollouts)."""
  ex = types.SimpleNamespace(domain="math", prompt="q")
  calls, accs = [], iter(accuracies)

  def rollout(*a, rng, **k):
    calls.append(1)
    r = np.float32(rewards[len(calls) - 1])
    return loop_lib.Rollout(types.SimpleNamespace(lengths_B=np.array([3.0, 5.0]), num_samples=2),
                            [ex, ex], np.array([r, r])), []
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(loop_lib, "rollout", rollout)
    mp.setattr(loop_lib.steps_lib, "step_program_calls", lambda *a, **k: [])
    step = lambda state, batch: (state, {"loss": 0.0, "finite": 1.0, "grad_norm": batch})  # noqa
    result = loop_lib.run_rl(
        types.SimpleNamespace(params="p"), name="expert_math", loop=loop, progress=progress,
        step=step, make_batch=lambda ro: (float(ro.rewards_B.mean()), [], {}), sampler=None,
        tokenizer=None, prompts=itertools.repeat([ex]), verify=None,
        save=None if saves is None else lambda i, state, prog: saves.append(
            (i, dict(prog.collapsed or {}))),
        evaluator=lambda params: ({"accuracy": {"math": next(accs)}}, []))
  return result, len(calls)


def test_a_collapse_ends_the_run_as_an_outcome_when_asked_and_a_resume_returns_at_once():
  """loop.collapse_ends (a study's phases): the collapse is the run's result, not an error: the
  run stops at the step that showed it, saves with the collapse recorded, and a run resumed from
  that progress returns at once; without it, the same run raises. Held-out accuracy falling to 0
  ends it at that evaluation, the point kept on the curve."""
  dead = [0.5, 0.5] + [0.0] * 20
  loop = RLLoopConfig(steps=20, samples_per_prompt=2, eval_every_steps=10, log_every=5,
                      progress=False, collapse_window=3)
  with pytest.raises(CollapseError, match="collapsed at step 5: no sample has scored"):
    _scripted_grpo(loop, rewards=dead, accuracies=[0.1] * 5)
  ends = RLLoopConfig(**{**loop.__dict__, "collapse_ends": True})
  saves, prog = [], RLProgress()
  result, rollouts = _scripted_grpo(ends, rewards=dead, accuracies=[0.1] * 5, progress=prog,
                                    saves=saves)
  # Steps 2, 3 and 4 (0-based) score nothing; step 4's metrics are read after step 5 ran.
  assert result.collapsed == {"step": 5, "what": "no sample has scored and the gradient has "
                              "been 0 for 3 steps"}, result.collapsed
  assert rollouts == 6 and prog.step == 6 and saves == [(6, result.collapsed)], (rollouts, saves)
  assert [p["step"] for p in result.curve] == [0]      # no evaluation after the collapse
  again, more = _scripted_grpo(ends, rewards=dead, accuracies=[], progress=prog)
  assert more == 0 and again.collapsed == result.collapsed
  fall, _ = _scripted_grpo(ends, rewards=[0.5] * 20, accuracies=[0.0, 0.4, 0.0, 0.3])
  assert fall.collapsed == {"step": 20, "what": "held-out accuracy fell to 0 from 40.0%"}
  assert [p["mean"] for p in fall.curve] == [0.0, 0.4, 0.0]


def test_sft_stops_on_a_signal_at_a_save_and_resumes_exactly():
  """run_sft: a stop (SIGTERM flag) saves and returns; resuming from what was saved (state,
  stream position, ledger) gives bitwise the parameters of the uninterrupted run."""
  cfg = get_preset("toy-tiny")
  tx = state_lib.make_optimizer(state_lib.OptimizerConfig(learning_rate=3e-3))
  step = steps_lib.jit_step(steps_lib.make_sft_step(Transformer(cfg), tx))

  def stream():
    ds = data_lib.prompt_pipeline([get_domain("math")], batch_size=8, split="train", seed=1)
    return data_lib.PromptStream(iter(ds))

  def fresh():
    return state_lib.create_state(init_params(cfg, jax.random.key(0)), tx)

  kw = dict(phase="base/sft", step=step, tokenizer=CharTokenizer(), seq_len=16, num_steps=6,
            progress=False)
  want, _ = run_sft(state=fresh(), examples_iter=stream(), ledger=FlopLedger(), **kw)
  saves, s1, led = [], stream(), FlopLedger()
  calls = iter(range(100))
  state, _ = run_sft(state=fresh(), examples_iter=s1, ledger=led, checkpoint_every=2,
                     save=lambda done, st: saves.append((done, st, s1.get_state())),
                     should_stop=lambda: next(calls) >= 2, **kw)
  assert [s[0] for s in saves] == [2, 3]           # the regular save, then the stop's
  done, saved, data_state = saves[-1]
  s2 = stream()
  s2.set_state(data_state)
  got, _ = run_sft(state=saved, examples_iter=s2, ledger=led, start_step=done, **kw)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(want.params),
                                                  jax.tree.leaves(got.params)))
  # On the clock (SaveCadence): a step takes longer than a nanosecond, so every step saves.
  clocked = []
  run_sft(state=fresh(), examples_iter=stream(), ledger=FlopLedger(), checkpoint_seconds=1e-9,
          save=lambda done, st: clocked.append(done), **kw)
  assert clocked == [1, 2, 3, 4, 5, 6]


def test_a_too_long_training_record_is_refused_at_start_naming_file_and_line(tmp_path):
  """check_lengths reads every record of a file domain's splits, not only the held-out prompts:
  a training question too long for the model is refused before anything runs, with its file and
  line, and advice that makes sense when even the prompt alone does not fit."""
  import json  # pylint: disable=import-outside-toplevel
  from smjax.study.config import check_lengths  # pylint: disable=import-outside-toplevel
  train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
  rows = [{"question": "1+1?", "answer": "2"}] * 3
  train.write_text("\n".join(json.dumps(r) for r in rows[:2] + [
      {"question": "x" * 300, "answer": "3"}]) + "\n")
  test.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  name = f"jsonl_math:train={train},test={test}"
  dom = get_domain(name)
  c = study_defaults()
  c.domains, c.phases, c.rl.max_new_tokens = (name,), ("base", "joint"), 8
  heldout = {name: dom.generate("test", 3, seed=0)}
  with pytest.raises(ValueError) as e:
    check_lengths(c, CharTokenizer(), get_preset("toy-tiny"), heldout, {name: dom})
  msg = str(e.value)
  assert f"{train}:line 3" in msg and "leaves no room for an answer" in msg, msg
  check_lengths(c, CharTokenizer(), get_preset("toy-tiny"), heldout)   # held-out only: fits


def test_metrics_writer_keep_only_drops_rows_a_resumed_run_logs_again(tmp_path):
  from smjax.train.metrics import MetricsWriter  # pylint: disable=import-outside-toplevel
  import json  # pylint: disable=import-outside-toplevel
  with MetricsWriter(str(tmp_path), tensorboard=False) as w:
    for i in range(6):
      w.write(i, {"loss": float(i)})
    w.write(4, {"heldout/mean": 0.5})
    w.keep_only(lambda r: r["step"] < 4 or (r["step"] == 4 and "loss" not in r))
    for i in range(4, 6):
      w.write(i, {"loss": 10.0 + i})
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [(r["step"], r.get("loss")) for r in rows] == [
      (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, None), (4, 14.0), (5, 15.0)]


def test_a_phase_that_cannot_find_the_grid_refuses_instead_of_deriving_another(tmp_path):
  from smjax.study import store  # pylint: disable=import-outside-toplevel
  c = study_defaults()
  (tmp_path / "base").mkdir()
  (tmp_path / "base" / "result.json").write_text("{}")
  assert store.grid_or_refuse(str(tmp_path), c, "joint_grpo", may_fix=True) == 0.0
  with pytest.raises(FileNotFoundError, match="must be evaluated on the seed's grid"):
    store.grid_or_refuse(str(tmp_path), c, "mopd", may_fix=False)
  (tmp_path / "joint_grpo").mkdir()
  (tmp_path / "joint_grpo" / "result.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match="that joint_grpo finished on"):
    store.grid_or_refuse(str(tmp_path), c, "expert_math", may_fix=True)
  store.save_eval_every(str(tmp_path), c, 1e9)
  assert store.grid_or_refuse(str(tmp_path), c, "expert_math", may_fix=True) == pytest.approx(
      1e9 * c.joint.steps / c.eval.points)


def test_stop_set_is_disjoint_from_the_report_set_and_from_training(tmp_path):
  """The stop rules' prompts (smjax.study.shared.draw_stop_set) are in neither the report set
  nor the training split, by construction; a test file too small for both is refused at start,
  naming the field."""
  import json  # pylint: disable=import-outside-toplevel
  from smjax.study.shared import draw_stop_set  # pylint: disable=import-outside-toplevel
  for name in ("math", "code"):
    dom = get_domain(name, difficulty=1, form="chain")
    report = dom.generate("test", 512, seed=10_000)
    stop = draw_stop_set(dom, report, 256, seed=20_000)
    prompts = [e.prompt for e in stop]
    assert len(prompts) == len(set(prompts)) == 256
    assert not set(prompts) & {e.prompt for e in report}
    train = {e.prompt for e in dom.generate("train", 20_000, seed=3)}
    assert not set(prompts) & train
    assert all(e.metadata["split"] == "test" for e in stop)
    # The same seed gives the same set (every phase of a study seed reads one).
    assert [e.prompt for e in draw_stop_set(dom, report, 256, seed=20_000)] == prompts
  path = tmp_path / "q.jsonl"
  path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n"
                          for i in range(60)))
  small = get_domain(f"jsonl_math:{path}")
  report = small.generate("test", 32, seed=1)
  with pytest.raises(ValueError, match=r"config\.stop_size=256: domain .* has only \d+ held-out "
                     r"prompts that are not in its report set"):
    draw_stop_set(small, report, 256, seed=2)


def test_a_mild_degradation_is_refused_naming_the_seed_and_the_values():
  """Claim (d) needs a degradation the recovery can be measured against: the degrade phase must
  cost the recovered domain at least self_teacher.min_loss on the stop set."""
  from smjax.study.run import DegradationError, check_degradation  # pylint: disable=C0415
  c = study_defaults()   # noisy SFT on math (recovered), min_loss 0.2
  point = lambda math, report=0.5: {"accuracy": {"math": report, "code": .9},  # noqa: E731
                                    "stop": {"accuracy": {"math": math, "code": .9}}}
  out = lambda p: PhaseOutput(params=None, ledger=None, curve=[p], extra={})  # noqa: E731
  check_degradation(c, 3, out(point(.97)), out(point(.70)))        # 27 points: measurable
  with pytest.raises(DegradationError, match=r"seed 3: 300 noisy SFT steps on math cost math "
                     r"only 2\.2 points \(99\.4% -> 97\.2% on the stop set\), less than "
                     r"config\.self_teacher\.min_loss=0\.2: raise self_teacher\.degrade_steps "
                     r"or lower self_teacher\.degrade_correct_fraction"):
    check_degradation(c, 3, out(point(.994)), out(point(.972)))
  c.self_teacher.degrade, c.self_teacher.degrade_steps = "grpo", 1000
  with pytest.raises(DegradationError, match=r"seed 3: 1000 GRPO steps on code cost math only "
                     r"2\.2 points .* or choose a degrade_domain that interferes with math"):
    check_degradation(c, 3, out(point(.994)), out(point(.972)))
  # A further depth's degradation (run under the config with its depth set) names its own.
  c.self_teacher.degrade, c.self_teacher.degrade_correct_fraction = "noisy_sft", 0.45
  with pytest.raises(DegradationError, match=r"seed 3: 1000 noisy SFT steps on math \(degrade@0"
                     r"\.45: 45% of them right\) cost .* lower that depth in self_teacher\."
                     r"also_correct_fractions, .* deleting that seed's degrade@0\.45/ directory"):
    check_degradation(c, 3, out(point(.994)), out(point(.972)), "degrade@0.45")
  # Read on the stop set, not the report set: a report-set drop alone does not count.
  with pytest.raises(DegradationError, match="seed 1"):
    check_degradation(c, 1, out(point(.99, report=.99)), out(point(.98, report=.5)))


def test_the_phase_line_names_where_the_uncharged_flops_are():
  """`phase X: done ...` says the training FLOPs and the rest by the namespaces they are under
  (an RL phase's evaluations; a base's SFT and evaluations), by hand."""
  from smjax.ledger import FlopLedger  # pylint: disable=import-outside-toplevel
  from smjax.study.store import PhaseOutput, _flops  # pylint: disable=import-outside-toplevel
  rl = FlopLedger()
  rl.add_flops("rollout/decode", 3e9)
  rl.add_flops("train/policy", 2e9)
  rl.add_flops("eval/heldout", 4e9)
  rl.add_flops("eval/stop", 1e9)
  assert _flops(PhaseOutput(None, rl, [], {})) == "5e+09 training FLOPs, 5e+09 more in eval/*"
  base = FlopLedger()
  base.add_flops("base/sft", 7e12)
  base.add_flops("eval/band", 2e11)
  assert _flops(PhaseOutput(None, base, [], {})) == (
      "0 training FLOPs, 7.2e+12 more in base/*, eval/*")


def test_lending_a_studys_finished_phases_to_a_variants_workdir(tmp_path, capsys):
  """store.lend (`smjax lend`): each seed's finished phases of the names given, linked, with the
  seed's grid copied; unfinished ones left for the variant to run; every refusal before anything
  is written; and a lent phase is still checked as it is loaded: under a config differing in a
  field it reads it is refused, not reused."""
  import json  # pylint: disable=import-outside-toplevel
  from smjax import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel
  from smjax.study import store  # pylint: disable=import-outside-toplevel
  c = study_defaults()
  src, dst = tmp_path / "study", tmp_path / "variant"
  for k, done in ((0, ("base", "joint_grpo")), (1, ("base",))):
    for p in ("base", "joint_grpo", "degrade"):
      (src / f"seed_{k}" / p).mkdir(parents=True)
    for p in done:
      (src / f"seed_{k}" / p / "result.json").write_text(
          json.dumps({"ledger": {}, "curve": [], "config": c.to_dict()}))
    (src / f"seed_{k}" / "eval_interval.json").write_text(json.dumps({"every_flops": k + 2.0}))
  with pytest.raises(FileNotFoundError, match="no such study workdir"):
    store.lend(str(tmp_path / "nowhere"), str(dst), ["base"])
  with pytest.raises(ValueError, match="no seed has finished degrade"):
    store.lend(str(src), str(dst), ["base", "degrade"])
  with pytest.raises(ValueError, match="no seed_5 to lend"):
    store.lend(str(src), str(dst), ["base"], seeds=[0, 5])
  assert not dst.exists()   # refused before anything was written
  assert store.main([str(src), str(dst), "--phases", "base,joint_grpo"]) == 0
  assert "linked 3 phase directories" in capsys.readouterr().out
  for k, p in ((0, "base"), (0, "joint_grpo"), (1, "base")):
    assert (dst / f"seed_{k}" / p).resolve() == (src / f"seed_{k}" / p).resolve()
  assert not (dst / "seed_1" / "joint_grpo").exists()   # unfinished: the variant runs it
  assert json.loads((dst / "seed_1" / "eval_interval.json").read_text()) == {"every_flops": 3.0}
  assert store.lend(str(src), str(dst), ["base", "joint_grpo"]) == []   # again: nothing to do
  # A phase the variant ran itself, or a seed on another grid: refused, nothing written.
  (src / "seed_1" / "joint_grpo" / "result.json").write_text("{}")
  (dst / "seed_1" / "joint_grpo").mkdir()
  with pytest.raises(ValueError, match="seed_1/joint_grpo exists and is not a link"):
    store.lend(str(src), str(dst), ["joint_grpo"])
  (dst / "seed_1" / "joint_grpo").rmdir()
  (dst / "seed_1" / "eval_interval.json").write_text(json.dumps({"every_flops": 9.0}))
  with pytest.raises(ValueError, match="seed_1/eval_interval.json: this seed is on another"):
    store.lend(str(src), str(dst), ["joint_grpo"])
  assert not (dst / "seed_1" / "joint_grpo").exists()
  # Loaded through the link under a config that changes a field `base` reads: refused.
  other = study_defaults()
  other.base.steps = c.base.steps + 1
  with pytest.raises(ckpt_lib.ConfigMismatchError, match="base.steps"):
    store.load_done(str(dst / "seed_0"), other, "base", ("base",), None)


def test_a_further_depth_of_the_degradation_is_the_phase_a_study_at_that_depth_runs(
    tmp_path, monkeypatch):
  """self_teacher.also_correct_fractions: each depth's phases (`<phase>@<fraction>`) run under
  the study's config with degrade_correct_fraction set to that depth, field for field, so that
  a study run at that depth can lend them its finished phases under the new names (`lend` with
  src=dst), checked on loading like any lent phase; bad depths are one-line errors."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import json  # pylint: disable=import-outside-toplevel
  from smjax import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel
  from smjax.study import layout, run, store  # pylint: disable=import-outside-toplevel
  c = study_defaults()
  c.self_teacher.also_correct_fractions = (0.0, 0.2)
  validate(c)
  for depths, needle in (((0.5,), "differ from the others and from degrade_correct_fraction=0.5"),
                         ((0.0, 0.0), "differ from the others"), ((1.0,), r"in \[0, 1\)")):
    bad = c.copy_and_resolve_references()
    bad.self_teacher.also_correct_fractions = depths
    with pytest.raises(ValueError, match=needle):
      validate(bad)
  grpo = c.copy_and_resolve_references()
  grpo.self_teacher.degrade = "grpo"
  with pytest.raises(ValueError, match="depths of the noisy_sft degradation; degrade='grpo'"):
    validate(grpo)
  calls = []
  monkeypatch.setattr(run, "_recover", lambda shared, wd, joint, ext, suffix="": calls.append(
      (suffix, shared.config)) or [suffix])
  from smjax.study.shared import SeedShared  # pylint: disable=import-outside-toplevel
  shared = SeedShared(**{f.name: None for f in dataclasses.fields(SeedShared)} | {"config": c})
  assert run._self_teacher(shared, "wd", None, None) == ["", "@0", "@0.2"]
  assert [s for s, _ in calls] == ["", "@0", "@0.2"] and calls[0][1] is c
  for (_, got), f in zip(calls[1:], (0.0, 0.2)):
    at = study_defaults()
    at.self_teacher.degrade_correct_fraction = f
    assert got.to_dict() == at.to_dict()
  assert tuple(c.self_teacher.also_correct_fractions) == (0.0, 0.2)   # the study's own: as it was
  # A study run at depth 0 lends its degradation to one that lists 0 as a further depth.
  at0 = calls[1][1]
  src, dst = tmp_path / "at0", tmp_path / "study"
  (src / "seed_0" / "degrade").mkdir(parents=True)
  (src / "seed_0" / "degrade" / "result.json").write_text(
      json.dumps({"ledger": {}, "curve": [], "config": at0.to_dict()}))
  for spec in (["degrade="], ["=degrade@0"], ["degrade=a/b"]):
    with pytest.raises(ValueError, match="expected a phase directory's name, or src=dst"):
      store.lend(str(src), str(dst), spec)
  assert not dst.exists()
  assert store.main([str(src), str(dst), "--phases", "degrade=degrade@0"]) == 0
  lent = dst / "seed_0" / "degrade@0"
  assert lent.resolve() == (src / "seed_0" / "degrade").resolve()
  assert not (dst / "seed_0" / "degrade").exists()
  reads = layout.read_fields(layout.DEGRADE)
  # Loaded under the configured depth's config it is refused; under the depth's own, its config
  # is accepted (and only its missing parameters are reported).
  with pytest.raises(ckpt_lib.ConfigMismatchError, match="degrade_correct_fraction"):
    store.load_done(str(dst / "seed_0"), c, "degrade@0", reads, None)
  with pytest.raises(ckpt_lib.CorruptCheckpointError, match="holds no saved parameters"):
    store.load_done(str(dst / "seed_0"), at0, "degrade@0", reads, None)
  # `smjax export` knows them as arms, each the phase of its name.
  from smjax.study import export  # pylint: disable=import-outside-toplevel
  assert all(export._ARMS.match(a) and export.phase_of(a) == a
             for a in ("degrade@0", "recover_self@0.2", "recover_grpo@0"))
