"""Strong-to-weak: experts bigger than the student (config.experts.preset), distilled by MOPD.

The field and its checks; the FLOP ledger charging each model its own programs (a bigger
teacher's forward and a bigger expert's GRPO step against analytic counts of their presets);
and a miniature strong-to-weak study end to end through the real entry point (recording which
config fields each phase reads, tests/record_reads.py, with the suite's shared compilation
cache): its arms, which model each phase ran, what split_merge is charged, a rerun that reuses
every phase, and `smjax export` of the new arms.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from smjax.flops import analytic_flops
from smjax.json_io import config_diff
from smjax.ledger import FlopLedger
from smjax.models.presets import get_preset
from smjax.models.transformer import init_params
from smjax.study import config as study_config
from smjax.study import export as export_lib
from smjax.study import layout
from smjax.study import render
from smjax.study.report import ArmResult
from smjax.study.run import start_study
from smjax.study.shared import experts_shared, seed_shared
from smjax.train.loop import BatchLayout, grpo_batch, opd_batch, rollout
from smjax.train.steps import step_program_calls
from smjax.train.teachers import Teacher

from conftest import cache_env
from study_runs import phase_result, study_compilation_cache, training_flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STUDENT, EXPERTS = "toy-tiny", "toy-small"
STRONG_PHASES = ("base_strong", "joint_grpo_strong", "expert_math", "expert_code")
STUDENT_PHASES = ("base", "joint_grpo", "mopd")


def _n_params(preset: str) -> int:
  shapes = jax.eval_shape(lambda: init_params(get_preset(preset), jax.random.key(0)))
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))


# The smallest study that runs every strong-to-weak phase: short answers, a few prompts, two or
# three steps each, one expert bar (one MOPD set). Every sampler call holds 4 prompts x 2 samples
# (rollouts and evaluations alike) and completions are not packed, so that few programs compile.
STRONG = [
    "--config=configs/study.py:two_domain,demo", f"--config.experts.preset={EXPERTS}",
    "--config.progress=False", "--config.form=short", "--config.rl.max_new_tokens=12",
    "--config.base.seq_len=36", "--config.heldout_size=8", "--config.stop_size=8",
    "--config.eval.batch_size=4", "--config.eval.samples=2", "--config.eval.points=2",
    "--config.eval.growth=0.0", "--config.base.steps=10", "--config.base.batch_size=16",
    "--config.joint.steps=3", "--config.experts.steps=3", "--config.mopd.steps=3",
    "--config.joint.eval_refine=1", "--config.experts.eval_refine=1",
    "--config.opd.eval_refine=1", "--config.experts.bars=(1.0,)",
    "--config.rl.prompts_per_step=4", "--config.experts.prompts_per_step=4",
    "--config.opd.prompts_per_step=4", "--config.rl.samples_per_prompt=2",
    "--config.opd.samples_per_prompt=2", "--config.rl.pack_completions=False",
    "--config.opd.pack_completions=False", "--config.run_on.evals=0",
    "--config.run_on.flops_fraction=0.0", "--config.mopd.plateau_evals=1",
    "--config.checkpoint_every=0", "--config.band.check=False", "--config.report.bootstrap=20",
    # The demo's phases are the main comparison's; joint GRPO on the bigger model is its own.
    "--config.phases=('base','joint','experts','mopd','joint_strong')",
]


def _main(args, workdir, cache, record=None):
  """The study's entry point (`python -m smjax.main`) on `args`, in a subprocess with the
  suite's compilation cache; `record`: where tests/record_reads.py writes each phase's reads."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", **cache_env(cache))
  entry = ["-m", "smjax.main"]
  if record:
    env["SMJAX_RECORD_READS"] = str(record)
    entry = [os.path.join(ROOT, "tests", "record_reads.py")]
  return subprocess.run([sys.executable, *entry, *args, f"--workdir={workdir}"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=900)


# ------------------------------------------------------------------------------ the field

@pytest.mark.parametrize("change,needle", [
    (dict(preset="toy-huge"), r"config\.experts\.preset='toy-huge' is not a known preset; "
                              r"known: \[.*'toy-small'.*\]"),
    (dict(preset=STUDENT), r"config\.experts\.preset='toy-tiny' is the student's own preset"),
    (dict(preset="qwen3-0.6b"), r"config\.experts\.preset='qwen3-0\.6b' has vocab_size=151936, "
                                r"the student .* 128: MOPD needs one vocabulary"),
    (dict(preset=EXPERTS, hf_path="/models/qwen"),
     r"config\.experts\.preset='toy-small' needs a toy student .*config\.model\.hf_path='/models/qwen' is set"),
])
def test_experts_preset_is_validated_in_one_line(change, needle):
  c = study_config.study_defaults()
  c.experts.preset = change["preset"]
  if "hf_path" in change:
    c.model.hf_path = change["hf_path"]
  with pytest.raises(ValueError, match=needle) as e:
    study_config.validate(c)
  assert "\n" not in str(e.value)


def test_an_experts_preset_too_short_for_prompt_and_answer_is_refused_at_start(tmp_path):
  """The student (toy-small, 96 positions) fits prompt + 60 new tokens; experts of toy-tiny (64
  positions) do not: refused by the start-up check, before any phase runs or any file is
  written, naming the field."""
  c = study_config.study_defaults()
  c.model.preset, c.experts.preset = EXPERTS, STUDENT
  c.phases = ("base", "joint", "experts", "mopd")
  c.rl.max_new_tokens, c.heldout_size, c.stop_size = 60, 8, 0
  with pytest.raises(ValueError, match=r"config\.rl\.max_new_tokens=60 does not fit: .* the "
                     r"experts' max_seq_len=64 \(config\.experts\.preset='toy-tiny'"):
    start_study(c, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()
  c.phases = ("base", "external")   # no phase runs the experts' model: nothing to refuse
  assert not study_config.strong_to_weak(c)


def test_experts_preset_keeps_earlier_workdirs_comparable():
  """A config saved before experts.preset existed compares as the default "" (the experts were
  the student's model); only the phases that read it see a strong-to-weak config as changed."""
  from smjax.study.store import unread_fields  # pylint: disable=import-outside-toplevel
  now = study_config.study_defaults()
  old = json.loads(json.dumps(now.to_dict()))
  del old["experts"]["preset"]
  assert config_diff(study_config.upgrade_old_config(old), now.to_dict()) == []
  strong = study_config.study_defaults()
  strong.experts.preset = EXPERTS
  for spec, changed in ((layout.BASE, False), (layout.JOINT, False), (layout.BASE_STRONG, True),
                        (layout.JOINT_STRONG, True), (layout.EXPERT, True), (layout.MOPD, True)):
    diff = config_diff(study_config.upgrade_old_config(old), strong.to_dict(),
                       unread_fields(strong, layout.read_fields(spec)))
    assert diff == (["experts.preset: '' -> 'toy-small'"] if changed else []), spec.name


# ------------------------------------------------------------------- the FLOP ledger's sizes

def test_teacher_forward_and_expert_step_are_charged_at_their_own_size():
  """The seed's records of the student and of the experts' bigger model (as smjax.study.run
  builds them): in a MOPD step the bigger teacher's forward is charged what an analytic count of
  its preset says (not the student's), and a GRPO step of the experts' model what one of its
  preset says, against the student's step on the same batch. Unpacked, unshared rows: every
  program runs B x S tokens against S keys, the LM head on the C completion columns."""
  c = study_config.study_defaults()
  c.form, c.rl.max_new_tokens, c.heldout_size, c.stop_size = "short", 12, 4, 0
  c.experts.preset = EXPERTS
  student = seed_shared(c, 0)
  strong = experts_shared(student)
  assert (student.model_cfg.name, strong.model_cfg.name) == (STUDENT, EXPERTS)
  # The same prompts and config; the bigger model's own sampler and steps.
  assert strong.heldout == student.heldout and strong.config is student.config
  assert strong.model_cfg == study_config.experts_model_cfg(c)
  p_student, p_strong = student.initial_params(), strong.initial_params()
  ro, _ = rollout(student.sampler, p_student, student.heldout["math"][:4],
                  tokenizer=student.tokenizer, verify=student.verify, rng=jax.random.key(0),
                  samples_per_prompt=2)
  layout = BatchLayout(share_prompt=False, packed=False)
  router = student.teacher_router([Teacher("expert_math", strong.model_cfg, p_strong,
                                           ("math",))])
  batch, calls, _ = opd_batch(ro, router=router, layout=layout)
  B, S = batch.tokens_BS.shape
  C = batch.layout.completion_len
  assert B == 8 and 0 < C < S   # 8 rows: the teacher's bucket, no padding rows

  def analytic(cfg, backward):
    return analytic_flops(cfg, tokens=B * S, context_len=S, backward=backward,
                          logit_tokens=B * C)
  ledger = FlopLedger()
  ledger.add(calls)
  teacher = ledger.by_phase()["train/teacher"]
  # XLA counts every matmul exactly, plus the elementwise ops the analytic count leaves out.
  assert analytic(strong.model_cfg, False) <= teacher < 1.05 * analytic(strong.model_cfg, False)
  assert teacher > 5 * analytic(student.model_cfg, False)

  step_batch, _, _ = grpo_batch(ro, layout=layout)
  steps = {}
  for shared, params in ((student, p_student), (strong, p_strong)):
    ledger = FlopLedger()
    ledger.add(step_program_calls(shared.grpo_step, shared.new_state(params, shared.rl_tx),
                                  step_batch))
    steps[shared.model_cfg.name] = ledger.by_phase()["train/policy"]
    want = analytic(shared.model_cfg, True)
    assert want <= steps[shared.model_cfg.name] < 1.1 * want, shared.model_cfg.name
  ratio = analytic(strong.model_cfg, True) / analytic(student.model_cfg, True)
  assert steps[EXPERTS] / steps[STUDENT] == pytest.approx(ratio, rel=0.05)


# --------------------------------------------------------------- a miniature study, end to end

@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return study_compilation_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def study(tmp_path_factory, cache):
  wd = tmp_path_factory.mktemp("strong_to_weak")
  r = _main(STRONG, wd, cache, record=wd.parent / f"{wd.name}_reads.json")
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return str(wd), json.load(open(wd / "report" / "report.json"))


def test_each_phase_reads_only_the_fields_it_declares(study):
  """The new phases and the gaps around them (run_seed deciding whether they run, building the
  experts' record) read no config field their phases do not declare."""
  from record_reads import undeclared  # pylint: disable=import-outside-toplevel
  wd, _ = study
  path = os.path.join(os.path.dirname(wd), f"{os.path.basename(wd)}_reads.json")
  ran = {s["name"]: s["reads"] for s in json.load(open(path)) if s["kind"] == "phase"}
  assert set(STRONG_PHASES + STUDENT_PHASES) <= set(ran), sorted(ran)
  assert "experts.preset" not in ran["base"] + ran["joint_grpo"]
  assert undeclared(path) == []


def _saved_params(wd, phase) -> int:
  """The parameter count of a phase's final checkpoint, read back without a target tree."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  root = os.path.join(wd, "seed_0", phase, "final", "checkpoints")
  (step,) = [d for d in os.listdir(root) if d.isdigit()]
  tree = ocp.StandardCheckpointer().restore(os.path.join(root, step, "state"))
  return int(sum(np.asarray(x).size for x in jax.tree_util.tree_leaves(tree)))


def _per_call(ledger: dict, phase: str) -> float:
  calls = sum(r["calls"] for r in ledger["records"] if r["phase"] == phase)
  return ledger["flops"][phase] / calls


def test_the_arms_and_the_report(study):
  wd, report = study
  arms = report["arms"]
  assert {"base", "base_strong", "joint_grpo", "joint_grpo_strong", "expert_math",
          "expert_code", "split_merge"} <= set(arms)
  assert report["reference_arm"] == "joint_grpo"
  # joint_grpo_strong is charged its GRPO run and compared with the reference; the strong base
  # is charged to no arm.
  assert arms["joint_grpo_strong"]["flops_total"]["mean"] > 0
  assert "saving_at_target" in arms["joint_grpo_strong"]
  assert "flops_total" not in arms["base_strong"]
  assert "joint GRPO on toy-small" in arms["joint_grpo_strong"]["notes"][0]
  assert "(toy-small)" in arms["split_merge"]["notes"][0]
  # The frontier still faces the split_merge sets with joint GRPO, and no other arm (read again
  # under MOPD's other flat rule, the bigger experts' MOPD runs replaying to where they ended).
  ways = {"mean", "every", "mean_best", "every_best"}
  assert set(report["frontier"]) == ways | {w + ":replayed" for w in ways}
  assert report["flat_rule"]["not_replayed"] == []
  for mode in report["frontier"].values():
    for at in mode.values():
      assert all(s is None or s.startswith("split_merge") for s in at["sets"])
  # ... and the new arm is in the table and on the plot.
  table = open(os.path.join(wd, "report", "report.txt")).read()
  assert "joint_grpo_strong" in table and "base_strong" in table
  curves = [ArmResult(**a) for a in json.load(open(os.path.join(wd, "report", "curves.json")))]
  drawn = {s[0] for s in render.curve_series(curves)["main"]["series"]}
  assert {"joint_grpo", "joint_grpo_strong", "split_merge"} <= drawn
  assert os.path.getsize(os.path.join(wd, "report", "accuracy_vs_flops.png")) > 0


def test_each_phase_ran_its_own_model(study):
  wd, _ = study
  for phase in STRONG_PHASES:
    assert _saved_params(wd, phase) == _n_params(EXPERTS), phase
    assert phase_result(wd, phase)["config"]["experts"]["preset"] == EXPERTS, phase
  for phase in STUDENT_PHASES:   # MOPD's student is the student
    assert _saved_params(wd, phase) == _n_params(STUDENT), phase
  # The experts grew from base_strong: their bars and start are its stop-set accuracy, and
  # their first evaluation (step 0, before any update) is base_strong's model.
  base_strong = phase_result(wd, "base_strong")["curve"][-1]
  for d in ("math", "code"):
    start = phase_result(wd, f"expert_{d}")["curve"][0]
    assert start["step"] == 0 and start["stop"]["accuracy"] == base_strong["stop"]["accuracy"]
  # The seed's evaluation grid was fixed by the student's joint GRPO step, before any phase of
  # the bigger model ran: far below one of its steps.
  grid = json.load(open(os.path.join(wd, "seed_0", "eval_interval.json")))
  strong_step = _per_call(phase_result(wd, "joint_grpo_strong")["ledger"], "train/policy")
  assert grid["from_step_flops"] < strong_step


def test_each_model_is_charged_its_own_programs(study):
  """The experts' and joint_grpo_strong's GRPO steps at the bigger model's size (several times
  the student's, on batches of the same rows); MOPD's teachers, the bigger experts, cost more
  per forward than the student's whole update; split_merge is charged the bigger experts'
  FLOPs up to the checkpoints it distils plus its MOPD run."""
  wd, _ = study
  student_step = _per_call(phase_result(wd, "joint_grpo")["ledger"], "train/policy")
  for phase in ("joint_grpo_strong", "expert_math", "expert_code"):
    ratio = _per_call(phase_result(wd, phase)["ledger"], "train/policy") / student_step
    assert 4 < ratio < 10, (phase, ratio)
  mopd = phase_result(wd, "mopd")["ledger"]
  assert _per_call(mopd, "train/teacher") > 1.5 * _per_call(mopd, "train/policy")
  arms = {a["arm"]: a for a in json.load(open(os.path.join(wd, "seed_0", "arms.json")))["arms"]}
  sm = arms["split_merge"]
  assert sm["teachers"] == {"math": "expert_math", "code": "expert_code"}
  experts = 0.0
  for d, at in sm["experts_at"].items():
    curve = phase_result(wd, f"expert_{d}")["curve"]
    assert at["flops"] == [p for p in curve if p["step"] == at["step"]][-1]["flops"]
    if at["at"] == "final":
      assert at["flops"] == pytest.approx(sum(training_flops(
          phase_result(wd, f"expert_{d}")["ledger"]).values()))
    experts += at["flops"]
  mopd_train = sum(training_flops(mopd).values())
  assert sm["expert_flops"] == pytest.approx(experts)
  assert sum(sm["flops_by_phase"].values()) == pytest.approx(experts + mopd_train)
  # The bigger model's SFT (base_strong) is charged to no arm, as the base's is not.
  assert all(p.split("/")[0] in ("rollout", "train") for p in sm["flops_by_phase"])
  assert arms["base_strong"]["flops_by_phase"] == {}
  assert sm["distill_flops"] == pytest.approx(mopd_train)


def test_a_rerun_reuses_every_phase(study, cache):
  wd, report = study
  seed = os.path.join(wd, "seed_0")
  mtime = lambda p: os.path.getmtime(os.path.join(seed, p, "result.json"))  # noqa: E731
  phases = STRONG_PHASES + STUDENT_PHASES
  before = {p: mtime(p) for p in phases}
  r = _main(STRONG, wd, cache)
  assert r.returncode == 0, r.stderr[-3000:]
  assert {p: mtime(p) for p in phases} == before
  assert all(f"phase {p}: finished before, reused" in r.stdout for p in phases), r.stdout[-3000:]
  again = json.load(open(os.path.join(wd, "report", "report.json")))
  assert set(again["arms"]) == set(report["arms"])
  for arm, a in report["arms"].items():
    assert again["arms"][arm]["accuracy_mean"]["mean"] == a["accuracy_mean"]["mean"], arm
  # Without the phase joint_strong (run-neutral: it chooses phases), joint GRPO on the bigger
  # model is left out, and every other phase is reused as it was.
  main = [a for a in STRONG if not a.startswith("--config.phases")]
  r = _main(main + ["--config.phases=('base','joint','experts','mopd')"], wd, cache)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "joint_grpo_strong" not in r.stdout and {p: mtime(p) for p in phases} == before
  arms = json.load(open(os.path.join(seed, "arms.json")))["arms"]
  assert "joint_grpo_strong" not in {a["arm"] for a in arms} and "base_strong" in {
      a["arm"] for a in arms}


def test_export_the_new_arms(study, tmp_path):
  wd, _ = study
  for arm, preset in (("joint_grpo_strong", EXPERTS), ("expert_math", EXPERTS),
                      ("base_strong", EXPERTS), ("split_merge", STUDENT)):
    out = str(tmp_path / arm)
    got = export_lib.export(wd, arm, out)
    assert got["parameters"] == _n_params(preset), arm
    meta = json.load(open(os.path.join(out, export_lib.EXPORT_FILE)))
    assert meta["model"] == preset and meta["phase"] == export_lib.phase_of(arm), arm
    hf_cfg = json.load(open(os.path.join(out, "config.json")))
    assert hf_cfg["hidden_size"] == get_preset(preset).d_model, arm


def test_turning_strong_to_weak_off_refuses_the_bigger_experts(study, cache, tmp_path):
  """The same workdir with experts.preset="" reuses the student's base and joint GRPO (which do
  not read it) and refuses the finished experts of the bigger model, naming the field; an
  export still reads each phase's model from its own config (the workdir's config.json now
  says "")."""
  wd = str(tmp_path / "copy")
  shutil.copytree(study[0], wd)
  r = _main(STRONG + ["--config.experts.preset="], wd, cache)
  assert r.returncode != 0 and "experts.preset: 'toy-small' -> ''" in r.stderr, r.stderr[-3000:]
  assert "phase joint_grpo: finished before, reused" in r.stdout
  got = export_lib.export(wd, "expert_math", str(tmp_path / "expert"))
  assert got["parameters"] == _n_params(EXPERTS)
