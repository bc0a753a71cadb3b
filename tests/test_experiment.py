"""A miniature study end to end: phases, report fields, FLOP bookkeeping, resume, bad configs.

The study runs in subprocesses through the real entry point (`python -m smjax.main`), sharing a
persistent compilation cache so that each run after the first compiles little.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import cache_env
from study_runs import phase_result, study_compilation_cache, training_flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MINI = [
    "--config=configs/study.py:two_domain,demo",
    "--config.seeds=(0,)", "--config.progress=False", "--config.heldout_size=16",
    "--config.stop_size=16",
    "--config.eval.batch_size=4", "--config.eval.points=3", "--config.base.steps=20",
    # 16 rows an SFT step (the base's and both teachers'), not 128: a 20-step base scores
    # nothing at either batch, and 128 rows were over a third of this study's CPU time (cold,
    # alone: 156 CPU-seconds against 98).
    "--config.base.batch_size=16",
    "--config.joint.steps=6", "--config.experts.steps=6", "--config.mopd.steps=6",
    "--config.external.teacher_sft_steps=4", "--config.external.steps=4",
    "--config.rl.prompts_per_step=4", "--config.opd.prompts_per_step=4",
    "--config.rl.samples_per_prompt=2", "--config.opd.samples_per_prompt=2",
    # Every sampler call holds 8 rows (4 prompts x 2 samples, rollouts and evaluations alike),
    # the experts at joint GRPO's batch (not the per-domain default, which test_parallel_phases
    # runs): their programs are joint GRPO's, found in the compilation cache, not compiled again.
    "--config.experts.prompts_per_step=4",
    # Padded steps: one step program per phase. A packed stream's length is bucketed, so a
    # packed phase compiles a step program per bucket it meets (a few per phase in 6 steps);
    # test_packed_completions runs joint GRPO and MOPD packed and compares.
    "--config.rl.pack_completions=False", "--config.opd.pack_completions=False",
    "--config.checkpoint_every=2", "--config.band.check=False", "--config.eval.samples=2",
    # Sampled accuracy only: a greedy pass doubles the sampler programs every phase compiles
    # (the greedy fields are checked in test_study_hf and test_report).
    "--config.eval.greedy=False",
    # 100 bootstrap replicates, not 1,000: the report's figures are the same, its intervals
    # coarser (1,000 cost each report of this study about 3 s more).
    "--config.report.bootstrap=100",
    "--config.phases=('base','joint','experts','mopd','external')",
]


def _env(cache):
  env = dict(os.environ, JAX_PLATFORMS="cpu", **cache_env(cache))
  return env   # XLA_FLAGS: the suite's fast-compile flags (conftest.py), no fake devices


def _main(args, workdir, cache, record=None, **kw):
  """The study's entry point on `args`; `record`: a JSON file where tests/record_reads.py writes
  which config fields each phase read (the same entry point, with the reads recorded)."""
  env = _env(cache)
  entry = ["-m", "smjax.main"]
  if record:
    env["SMJAX_RECORD_READS"] = str(record)
    entry = [os.path.join(ROOT, "tests", "record_reads.py")]
  return subprocess.run([sys.executable, *entry, *args, f"--workdir={workdir}"],
                        cwd=ROOT, env=env, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return study_compilation_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def study(tmp_path_factory, cache):
  wd = tmp_path_factory.mktemp("study")
  r = _main(MINI, wd, cache, record=wd.parent / f"{wd.name}_reads.json", timeout=900)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return wd, r


def _assert_reads_declared(path, phases):
  """Every config field each phase really read (tests/record_reads.py) is one it declares, so a
  change to any other field may reuse it; and the recording saw `phases` run."""
  from record_reads import undeclared  # pylint: disable=import-outside-toplevel
  segments = json.load(open(path))
  ran = {s["name"]: s["reads"] for s in segments if s["kind"] == "phase"}
  assert set(phases) <= set(ran), sorted(ran)
  # The recording sees what a phase computes from, not just bookkeeping.
  assert all(ran[p] for p in phases), {p: ran[p] for p in phases}
  assert undeclared(path) == []


def test_each_phase_reads_only_the_fields_it_declares(study):
  wd, _ = study
  path = wd.parent / f"{wd.name}_reads.json"
  _assert_reads_declared(path, ["base", "joint_grpo", "expert_math", "expert_code", "mopd",
                                "external_teacher", "control_teacher", "external_opd",
                                "control_opd"])
  ran = {s["name"]: s["reads"] for s in json.load(open(path)) if s["kind"] == "phase"}
  # The checks have teeth: MOPD reads its section, an expert the experts' batch, and only a phase
  # with a stop rule reads how far it runs on.
  assert "opd.samples_per_prompt" in ran["mopd"] and "run_on.evals" in ran["mopd"]
  assert "run_on.evals" not in ran["joint_grpo"]


def test_report_fields_and_files(study):
  wd, run = study
  rep = json.load(open(os.path.join(wd, "report", "report.json")))
  assert {"joint_grpo", "split_merge", "expert_math", "expert_code", "external_opd",
          "base", "external_teacher", "control_teacher", "control_opd"} <= set(rep["arms"])
  for arm in ("joint_grpo", "split_merge", "external_opd", "control_opd"):
    a = rep["arms"][arm]
    assert set(a["accuracy"]) == {"math", "code"}
    for d in ("math", "code"):
      assert 0.0 <= a["accuracy"][d]["mean"] <= 1.0
    assert a["flops_total"]["mean"] > 0 and a["response_length"]["mean"] > 0
    assert "flops_to_target" in a, sorted(a)
    if arm != "joint_grpo":     # the reference has no saving against itself
      assert "saving_at_target" in a and "saving_total" not in a, sorted(a)
  assert rep["arms"]["split_merge"]["distillation_share_run"]["mean"] > 0
  # The frontier at every level, read on the mean and on every domain, on levels of joint GRPO's
  # gain and of the better route's (each again with MOPD's other flat rule); the verdicts end
  # with what the intervals cover.
  ways = {"mean", "every", "mean_best", "every_best"}
  assert set(rep["frontier"]) == ways | {w + ":replayed" for w in ways}
  assert set(rep["frontier"]["mean"]) == {"0.5", "0.75", "0.9", "0.95"}
  assert rep["verdicts"] and "evaluation noise only" in rep["verdicts"][-1]
  # Every evaluation also measures the stop set (what the stop rules read), apart from the report
  # set: its own accuracy, no per-prompt counts in the report's figures.
  for phase in ("base", "joint_grpo", "expert_math", "mopd"):
    for p in phase_result(wd, phase)["curve"]:
      assert set(p["stop"]["accuracy"]) == set(p["accuracy"]) and p["stop"]["samples"] == 2
  # Every evaluation keeps its per-prompt counts (what the intervals are bootstrapped from).
  point = phase_result(wd, "joint_grpo")["curve"][-1]
  assert point["samples"] == 2
  for d in ("math", "code"):
    c = point["correct"][d]
    assert len(c) == 16 and all(0 <= x <= 2 for x in c)
    assert point["accuracy"][d] == pytest.approx(sum(c) / (2 * len(c)))
    assert len(point["lengths"][d]) == 16
  assert point["greedy"] == point["greedy_correct"] == {}   # eval.greedy=False: no greedy pass
  # The truncation rate and a few sample completions, per domain, at every evaluation.
  for d in ("math", "code"):
    assert 0.0 <= point["at_cap"][d] <= 1.0
    shown = point["completions"][d]
    assert len(shown) == 2 and all(set(x) == {"prompt", "completion", "reward"} for x in shown)
  # Claim (c)'s arms sample up to the teacher's cap (rl.max_new_tokens 44 + 24), the others 44.
  longest = lambda phase: max(max(v) for p in phase_result(wd, phase)["curve"]  # noqa: E731
                              for v in p["lengths"].values())
  for arm in ("external_opd", "control_opd"):
    notes = rep["arms"][arm]["notes"]
    assert notes == [f"OPD from the {arm.split('_')[0]} teacher, up to 68 new tokens"], notes
    assert longest(arm) <= 68
    # external.to_cap: each runs on to its cap past its rule, which marks where it would have
    # ended it; the report reads the arm there too ("<arm>@rule", never past the cap's FLOPs).
    res = phase_result(wd, arm)
    end = res["extra"]["rule_end"]
    assert res["curve"][-1]["step"] == 4 or res["extra"]["collapsed"], res["curve"][-1]
    assert set(end) == {"index", "step", "flops_by_phase", "met"}, end
    assert res["curve"][end["index"]]["step"] == end["step"]
    # Its parameters then are kept where the rule ended it (`smjax export --phase <arm>@rule`).
    kept = os.path.join(wd, "seed_0", arm, "snapshots", "rule")
    assert os.path.isdir(kept) == end["met"], (kept, end)
    assert rep["arms"][arm + "@rule"]["flops_total"]["mean"] <= (
        rep["arms"][arm]["flops_total"]["mean"])
  assert longest("joint_grpo") <= 44 and longest("mopd") <= 44
  assert rep["arms"]["joint_grpo"].get("greedy") in (None, {}), rep["arms"]["joint_grpo"]
  assert os.path.exists(os.path.join(wd, "seed_0", "arms.json"))
  for f in ("report.csv", "report.txt", "accuracy_vs_flops.png", "curves.json"):
    assert os.path.getsize(os.path.join(wd, "report", f)) > 0
  # The entry point restarted itself under tcmalloc where installed (smjax.cpu_malloc).
  from smjax import cpu_malloc  # pylint: disable=import-outside-toplevel
  expected = "malloc: tcmalloc (" if cpu_malloc.tcmalloc_library() else "malloc: off (glibc"
  log = open(os.path.join(wd, "smjax.log")).read()   # INFO goes to the workdir's log file
  assert expected in log, log[-3000:]
  assert "split_merge" in run.stdout and "accuracy_vs_flops.png" in run.stdout
  # TensorBoard event files and the JSONL stream for every phase.
  logs = os.path.join(wd, "seed_0", "joint_grpo", "logs")
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(logs))
  rows = [json.loads(l) for l in open(os.path.join(logs, "metrics.jsonl"))]
  assert any("reward/math" in r for r in rows) and any("heldout/mean" in r for r in rows)
  # Each evaluation logs its truncation rate and two sample completions per domain.
  evals = [r for r in rows if "heldout/mean" in r]
  assert all(0 <= r["heldout_at_cap/code"] <= 1 for r in evals)
  assert all(r["completions/math"].count(" → ") == 2 for r in evals), evals[-1]


def test_report_command_rerenders_without_running(study, tmp_path, capsys):
  """`smjax report WORKDIR` rebuilds the report from the seeds' arms.json: the same arms and
  point estimates as the study's own report (intervals differ only by the resample count)."""
  from smjax.study import report_cli  # pylint: disable=import-outside-toplevel
  wd, _ = study
  assert report_cli.main([str(wd), f"--out={tmp_path}", "--bootstrap=20"]) == 0
  assert "split_merge" in capsys.readouterr().out
  old = json.load(open(os.path.join(wd, "report", "report.json")))
  new = json.load(open(tmp_path / "report.json"))
  assert set(new["arms"]) == set(old["arms"]) and new["bootstrap"] == 20
  for arm, a in old["arms"].items():
    assert new["arms"][arm]["accuracy_mean"]["mean"] == a["accuracy_mean"]["mean"], arm
  with pytest.raises(FileNotFoundError, match="not a study workdir"):
    report_cli.main([str(tmp_path)])
  # --seeds: a partial study's finished seeds only; a seed without a finished phase is refused.
  assert report_cli.main([str(wd), f"--out={tmp_path / 'seed0'}", "--bootstrap=0",
                          "--seeds=0"]) == 0
  assert json.load(open(tmp_path / "seed0" / "report.json"))["arms"].keys() == old["arms"].keys()
  with pytest.raises(ValueError, match=r"--seeds=0,3: .* finished phases of seeds \[0\] only"):
    report_cli.main([str(wd), f"--out={tmp_path / 'x'}", "--seeds=0,3"])
  # A study still running: seed 1 has finished its base only; the report says which seeds to give.
  part = tmp_path / "partial"
  shutil.copytree(os.path.join(wd, "seed_0"), part / "seed_0", ignore=lambda d, names: [
      n for n in names if n != "arms.json" and d.endswith("seed_0")])
  shutil.copy(os.path.join(wd, "config.json"), part)
  arms = json.load(open(part / "seed_0" / "arms.json"))
  arms["arms"] = [dict(a, seed=1) for a in arms["arms"] if a["arm"] == "base"]
  (part / "seed_1").mkdir()
  (part / "seed_1" / "arms.json").write_text(json.dumps(arms))
  capsys.readouterr()
  assert report_cli.main([str(part), "--bootstrap=0"]) == 0
  assert ("note: seeds [1] have not finished joint_grpo and split_merge yet; --seeds=0 reports "
          "the ones that have") in capsys.readouterr().err


def test_a_record_renders_as_its_study_and_gathers_seeds_across_runs(study, tmp_path, capsys):
  """`smjax report WORKDIR --record DIR`: DIR holds the config, each seed's arms and joint GRPO's
  zero-advantage rows only, and renders the study's report (same arms, same point estimates); a
  second study's seed is added to it (the config naming both); refused, before anything is
  written: a directory that is not a record, a record of another study, a seed recorded again
  with fewer arms. A map's record is a map (its cells' records)."""
  from smjax.study import records, regimes, report_cli  # pylint: disable=import-outside-toplevel
  wd, _ = study
  rec = tmp_path / "rec"
  assert report_cli.main([str(wd), f"--out={tmp_path / 'r0'}", "--bootstrap=0",
                          f"--record={rec}"]) == 0
  assert f"record: {rec} (seeds 0)" in capsys.readouterr().err
  files = sorted(str(p.relative_to(rec)) for p in rec.rglob("*") if p.is_file())
  assert files == ["config.json", "record.json", "seed_0/arms.json.gz",
                   "seed_0/joint_grpo/logs/metrics.jsonl"]
  assert records.read_arms(str(rec / "seed_0")) == json.load(open(wd / "seed_0" / "arms.json"))[
      "arms"]
  size = sum(p.stat().st_size for p in rec.rglob("*") if p.is_file())
  assert size < sum(p.stat().st_size for p in wd.rglob("*") if p.is_file()) / 20
  rows = [json.loads(x) for x in (rec / "seed_0/joint_grpo/logs/metrics.jsonl").open()]
  assert rows and all(set(r) - {"step"} and all(k == "step" or "zero_variance" in k for k in r)
                      for r in rows)
  assert regimes._zero_variance(str(rec), [0], ["math", "code"]) == regimes._zero_variance(
      str(wd), [0], ["math", "code"])
  assert report_cli.main([str(rec), f"--out={tmp_path / 'r1'}", "--bootstrap=0"]) == 0
  old = json.load(open(tmp_path / "r0" / "report.json"))
  new = json.load(open(tmp_path / "r1" / "report.json"))
  assert new["verdicts"] == old["verdicts"] and new["frontier"] == old["frontier"]
  # A second run's seed (here seed 0's arms as seed 1) joins the record.
  other = tmp_path / "other"
  (other / "seed_1").mkdir(parents=True)
  config = json.load(open(wd / "config.json"))
  (other / "config.json").write_text(json.dumps({**config, "seeds": [1]}))
  arms = json.load(open(wd / "seed_0" / "arms.json"))
  (other / "seed_1" / "arms.json").write_text(json.dumps(
      {"arms": [dict(a, seed=1) for a in arms["arms"]]}))
  assert records.save(str(other), str(rec)) == {str(rec): [0, 1]}
  assert json.load(open(rec / "config.json"))["seeds"] == [0, 1]
  assert json.load(open(rec / "record.json"))["added"] == [1]
  assert report_cli.main([str(rec), f"--out={tmp_path / 'r2'}", "--bootstrap=0"]) == 0
  assert json.load(open(tmp_path / "r2" / "report.json"))["seeds"] == [0, 1]
  # Refusals, each before anything is written.
  before = {p: p.read_bytes() for p in rec.rglob("*") if p.is_file()}
  (other / "seed_1" / "arms.json").write_text(json.dumps(
      {"arms": [dict(a, seed=1) for a in arms["arms"] if a["arm"] != "joint_grpo"]}))
  with pytest.raises(ValueError, match=r"seed_1/arms.json.gz: the record's seed_1 has arms "
                     r"\['joint_grpo'\] that .* has not finished"):
    records.save(str(other), str(rec))
  (other / "config.json").write_text(json.dumps({**config, "seeds": [1], "domains": ["math"]}))
  with pytest.raises(ValueError, match=r"rec/config.json: the record is of another study; "
                     r"differing fields .*domains"):
    records.save(str(other), str(rec))
  assert {p: p.read_bytes() for p in rec.rglob("*") if p.is_file()} == before
  with pytest.raises(ValueError, match=r"other: not empty and not a record"):
    records.save(str(wd), str(other))
  (tmp_path / "fresh").mkdir()
  shutil.copy(wd / "config.json", tmp_path / "fresh")
  with pytest.raises(ValueError, match="fresh: no seed has finished a phase yet"):
    records.save(str(tmp_path / "fresh"), str(tmp_path / "r3"))
  assert not (tmp_path / "r3").exists()
  # A map's record: one record per cell, itself a map.
  root = tmp_path / "map"
  shutil.copytree(wd, root / "shared_even", ignore=shutil.ignore_patterns("report"))
  assert records.save(str(root), str(tmp_path / "maprec"), [c.name for c in regimes.CELLS]) == {
      str(tmp_path / "maprec" / "shared_even"): [0]}
  assert regimes.is_map(str(tmp_path / "maprec"))
  assert json.load(open(tmp_path / "maprec" / "record.json"))["cells"] == ["shared_even"]
  a = regimes.map_report(str(root), str(tmp_path / "m0"), bootstrap=0)
  b = regimes.map_report(str(tmp_path / "maprec"), str(tmp_path / "m1"), bootstrap=0)
  assert [dict(r, about=0) for r in a["cells"]] == [dict(r, about=0) for r in b["cells"]]


def test_the_report_reads_mopd_again_under_the_other_flat_rule(study):
  """The study's own MOPD runs are replayed under its own flat rule to where they ended (no seed
  left out of the replay), and the frontier is read again under the other rule."""
  wd, _ = study
  rep = json.load(open(os.path.join(wd, "report", "report.json")))
  config = json.load(open(os.path.join(wd, "config.json")))
  assert rep["flat_rule"] == {"ran": config["mopd"]["plateau_flops_fraction"], "replayed": 0.25,
                              "evals": config["mopd"]["plateau_evals"], "not_replayed": []}
  assert set(rep["frontier"]["mean:replayed"]) == set(rep["frontier"]["mean"])


def test_flop_totals_add_up_across_phases(study):
  wd, _ = study
  rep = json.load(open(os.path.join(wd, "report", "report.json")))
  experts = [phase_result(wd, f"expert_{d}") for d in ("math", "code")]
  mopd = phase_result(wd, "mopd")
  for res in experts + [mopd, phase_result(wd, "joint_grpo")]:
    led = res["ledger"]
    # Per-phase totals equal the sum of the per-call records.
    sums = {}
    for r in led["records"]:
      sums[r["phase"]] = sums.get(r["phase"], 0) + r["flops_per_call"] * r["calls"]
    assert sums == {p: v for p, v in led["flops"].items()}
  expert_total = sum(sum(training_flops(r["ledger"]).values()) for r in experts)
  mopd_total = sum(training_flops(mopd["ledger"]).values())
  sm = rep["arms"]["split_merge"]
  assert sm["flops_total"]["mean"] == pytest.approx(expert_total + mopd_total, rel=1e-12)
  assert sm["distillation_share_run"]["mean"] == pytest.approx(mopd_total / expert_total)
  assert training_flops(mopd["ledger"]).get("train/teacher", 0) > 0
  # MOPD's curve starts where the experts finished.
  assert mopd["curve"][0]["flops"] == pytest.approx(expert_total)
  joint = phase_result(wd, "joint_grpo")
  assert rep["arms"]["joint_grpo"]["flops_total"]["mean"] == pytest.approx(
      sum(training_flops(joint["ledger"]).values()))
  assert "train/teacher" not in joint["ledger"]["flops"]
  assert all(p.startswith("base/") or p.startswith("eval/")
             for p in phase_result(wd, "base")["ledger"]["flops"])


def _log_rows(wd, phase):
  with open(os.path.join(wd, "seed_0", phase, "logs", "metrics.jsonl")) as f:
    return {r["step"]: r for r in map(json.loads, f)}


def test_packed_completions_take_the_same_steps_with_fewer_flops(study, cache, tmp_path):
  """rl.pack_completions / opd.pack_completions (off in the study above): the joint GRPO and MOPD
  steps on the packed stream (smjax.batch.pack, its plan checked on the host). Run packed from the
  same base, the first step samples the same rollout and takes the same update, and the policy's
  and the teachers' FLOPs of that step are fewer than a padded step's. One packed step each: a
  packed stream's length is bucketed, so every further step could compile another program."""
  wd, _ = study
  packed_wd = tmp_path / "packed"
  # Each packed phase runs from the fixture's own inputs: joint GRPO from its base (which reads
  # no rl.* field), MOPD from its base, joint GRPO and experts (which read no opd.* field), so
  # that only the two phases compared run again.
  for phase in ("base", "joint_grpo", "expert_math", "expert_code"):
    shutil.copytree(os.path.join(wd, "seed_0", phase), packed_wd / "seed_0" / phase)
  shutil.copy(os.path.join(wd, "seed_0", "eval_interval.json"), packed_wd / "seed_0")
  args = [a for a in MINI if not a.startswith(("--config.phases", "--config.rl.pack_completions",
                                               "--config.opd.pack_completions"))]
  r = _main(args + ["--config.phases=('base','joint','experts','mopd')",
                    "--config.rl.pack_completions=False", "--config.mopd.steps=1"],
            packed_wd, cache, timeout=900)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  shutil.rmtree(packed_wd / "seed_0" / "joint_grpo")   # then joint GRPO packed, from the base
  r = _main(args + ["--config.phases=('base','joint')", "--config.opd.pack_completions=False",
                    "--config.joint.steps=1"], packed_wd, cache, timeout=900)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

  def step_flops(d, phase, part):   # one step's FLOPs of train/<part>: its total / steps run
    records = phase_result(d, phase)["ledger"]["records"]
    steps = sum(x["calls"] for x in records   # the step programs' calls (one per bucket met)
                if x["phase"] == "train/policy" and x["program"].startswith("step#"))
    return sum(x["flops_per_call"] * x["calls"] for x in records
               if x["phase"] == f"train/{part}") / steps

  for phase in ("joint_grpo", "mopd"):
    packed, padded = _log_rows(packed_wd, phase)[0], _log_rows(wd, phase)[0]
    assert packed["finite"] == padded["finite"] == 1
    for key in ("loss", "grad_norm", "reward/mean", "response_length"):
      assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-6), (phase, key)
    f_padded, f_packed = step_flops(wd, phase, "policy"), step_flops(packed_wd, phase, "policy")
    assert f_packed < 0.95 * f_padded, (phase, f_packed, f_padded)
  # MOPD's teachers score the packed rows too.
  assert step_flops(packed_wd, "mopd", "teacher") < 0.95 * step_flops(wd, "mopd", "teacher")


def test_finished_phases_are_not_run_again(study, cache):
  wd, _ = study
  before = os.path.getmtime(os.path.join(wd, "seed_0", "mopd", "result.json"))
  r = _main(MINI, wd, cache, timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  assert os.path.getmtime(os.path.join(wd, "seed_0", "mopd", "result.json")) == before
  assert "split_merge" in r.stdout


def test_finished_phase_with_another_config_is_refused(study, cache):
  wd, _ = study
  before = os.path.getmtime(os.path.join(wd, "seed_0", "base", "result.json"))
  r = _main(MINI + ["--config.rl.learning_rate=0.5"], wd, cache, timeout=300)
  assert r.returncode != 0
  assert "finished under a different config" in r.stderr and "rl.learning_rate" in r.stderr
  assert os.path.getmtime(os.path.join(wd, "seed_0", "base", "result.json")) == before


def test_changing_a_later_phase_reuses_the_phases_it_does_not_touch(study, cache):
  wd, _ = study
  mtime = lambda p: os.path.getmtime(os.path.join(wd, "seed_0", p, "result.json"))  # noqa: E731
  kept = ["base", "joint_grpo", "expert_math", "expert_code", "mopd", "external_teacher",
          "control_teacher"]
  # Runs after the tests above that rerun MINI unchanged (it leaves external_opd at 3 steps).
  before = {p: mtime(p) for p in kept + ["external_opd", "control_opd"]}
  args = [a for a in MINI if not a.startswith("--config.external.steps")] + [
      "--config.external.steps=3"]
  r = _main(args, wd, cache, timeout=600)   # external_opd finished with 4 steps: refused
  assert r.returncode != 0 and "external.steps: 4 -> 3" in r.stderr, r.stderr[-2000:]
  for phase in ("external_opd", "control_opd"):
    shutil.rmtree(os.path.join(wd, "seed_0", phase))
  r = _main(args, wd, cache, timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  assert all(mtime(p) == before[p] for p in kept)
  assert mtime("external_opd") > before["external_opd"]
  assert mtime("control_opd") > before["control_opd"]
  assert phase_result(wd, "external_opd")["config"]["external"]["steps"] == 3
  assert len(phase_result(wd, "external_opd")["curve"]) >= 2


def test_claim_d_degrades_by_noisy_sft_charges_it_to_no_arm_and_recovers(study, cache, tmp_path):
  """The self-teacher phases end to end on a copy of the mini study (its base, joint GRPO and
  external teacher reused): the degradation (noisy SFT on math) is under base/degrade, charged to
  no arm; every recovery arm trains and is evaluated on math alone; a further depth of the
  degradation (also_correct_fractions) runs its own degrade and recoveries, reported apart."""
  wd = tmp_path / "study"
  shutil.copytree(study[0], wd)
  args = [a for a in MINI if not a.startswith("--config.phases")] + [
      "--config.phases=('base','joint','self_teacher')",   # the external teacher: reused
      "--config.self_teacher.degrade_steps=3", "--config.self_teacher.recover_steps=2",
      "--config.self_teacher.eval_refine=1", "--config.self_teacher.also_correct_fractions=(0.0,)"]
  # (A loss below min_loss is refused naming the seed: test_study_rules, without a run.)
  reads = tmp_path / "reads.json"
  r = _main(args + ["--config.self_teacher.min_loss=0.0"], wd, cache, record=reads, timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  _assert_reads_declared(reads, ["degrade", "recover_self", "recover_external", "recover_grpo",
                                 "degrade@0", "recover_self@0", "recover_external@0",
                                 "recover_grpo@0"])
  degrade = phase_result(wd, "degrade")
  assert set(degrade["ledger"]["flops"]) == {"base/degrade", "eval/heldout", "eval/stop"}
  arms = {a["arm"]: a for a in json.load(open(os.path.join(wd, "seed_0", "arms.json")))["arms"]}
  assert arms["degrade"]["flops_by_phase"] == {} and "SFT'd 3 steps on math" in arms["degrade"][
      "note"]
  for name in ("recover_self", "recover_external", "recover_grpo"):
    assert set(arms[name]["curve"][-1]["accuracy"]) == {"math"}, name
    assert sum(arms[name]["flops_by_phase"].values()) > 0, name
  assert "50% of them right" in arms["degrade"]["note"]
  assert "SFT'd 3 steps on math chains, 0% of them right" in arms["degrade@0"]["note"]
  for name in ("recover_self@0", "recover_external@0", "recover_grpo@0"):
    assert arms[name]["start"] == "degrade@0" and set(arms[name]["curve"][-1]["accuracy"]) == {
        "math"}, name
  # The same phase as a study at that depth runs: its config, field for field, says 0.
  st = phase_result(wd, "degrade@0")["config"]["self_teacher"]
  assert st["degrade_correct_fraction"] == 0.0 and not st["also_correct_fractions"]
  rep = json.load(open(os.path.join(wd, "report", "report.json")))
  assert "recover_self" in rep["arms"] and rep["arms"]["recover_self@0"]["reference"] == (
      "recover_grpo@0")
  assert any(v.startswith("(d) the degradation degrade@0") for v in rep["verdicts"])


def test_unknown_field_and_bad_override_are_clear_errors(tmp_path, cache):
  r = _main(MINI + ["--config.joint.stepz=3"], tmp_path / "a", cache, timeout=120)
  assert r.returncode != 0 and "stepz" in r.stderr
  r = _main(MINI[:-1] + ["--config.phases=('base','jiont')"], tmp_path / "b", cache, timeout=120)
  assert r.returncode != 0 and "unknown phases ['jiont']" in r.stderr
  r = _main(["--config=configs/study.py:two_domain"], tmp_path / "c", cache, timeout=120)
  assert r.returncode != 0 and "exactly one of demo, full" in r.stderr


def test_study_config_arguments_choose_the_phases():
  from smjax import config_files  # pylint: disable=import-outside-toplevel

  def get_config(arg):  # this clone's configs/study.py, by path (not an installed copy)
    return config_files.load(os.path.join(ROOT, "configs", "study.py"), arg)

  main = ("base", "joint", "experts", "mopd")
  assert tuple(get_config("two_domain,demo").phases) == main
  full = get_config("four_domain,full")
  assert set(main) < set(full.phases) and len(full.domains) == 4
  # An expert steps on a quarter of joint GRPO's batch: its cap is joint GRPO's step count.
  assert full.joint.steps == full.experts.steps and full.experts.prompts_per_step == 0
  four_main = get_config("four_domain,full,main")
  assert tuple(four_main.phases) == main and four_main.seeds == (0, 1, 2, 3, 4)
  assert tuple(get_config("two_domain,demo").experts.bars) == (0.9, 1.0)
  short = get_config("two_domain,demo,short")
  assert short.form == "short" and not short.band.check and short.rl.max_new_tokens == 12
  from smjax.study.config import validate  # pylint: disable=import-outside-toplevel
  validate(short)
  with pytest.raises(ValueError, match="'mian' is not one of"):
    get_config("four_domain,full,mian")


def _final_params(wd, phase):
  """The phase's final parameters as saved (numpy leaves), read back without a target tree."""
  import jax
  import orbax.checkpoint as ocp
  root = os.path.join(wd, "seed_0", phase, "final", "checkpoints")
  (step,) = [d for d in os.listdir(root) if d.isdigit()]
  tree = ocp.StandardCheckpointer().restore(os.path.join(root, step, "state"))
  return jax.tree_util.tree_leaves(tree)


def _kill_when(proc, path_fn, timeout=600):
  """kill -9 `proc` as soon as path_fn() exists; returns False if the run ended first."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      return False
    if path_fn():
      os.kill(proc.pid, signal.SIGKILL)
      proc.wait()
      return True
    time.sleep(0.05)
  proc.kill()
  raise AssertionError("run did not reach the kill point in time")


def test_kill9_grpo_and_opd_resume_exactly(study, cache, tmp_path):
  """kill -9 in the middle of a GRPO phase and of the OPD phase, then one more run: every phase
  ends bitwise where the uninterrupted study fixture's did (same config, same compilation cache)."""
  ref, _ = study
  wd = tmp_path / "killed"
  # Finished under the same config: reused as they are (expert_code is the GRPO phase killed).
  for phase in ("base", "joint_grpo", "expert_math"):
    shutil.copytree(os.path.join(ref, "seed_0", phase), wd / "seed_0" / phase)
  # ...with the seed's FLOP grid of evaluations, which joint GRPO's first step fixed.
  shutil.copy(os.path.join(ref, "seed_0", "eval_interval.json"), wd / "seed_0")
  args = [sys.executable, "-m", "smjax.main",
          *[a for a in MINI if not a.startswith("--config.phases")],
          "--config.phases=('base','joint','experts','mopd')", f"--workdir={wd}"]
  env = dict(_env(cache), JAX_EXPLAIN_CACHE_MISSES="1")
  rng = np.random.default_rng(11)
  logs = []
  for phase in ("expert_code", "mopd"):
    at = int(rng.integers(0, 2)) * 2   # resume from step 2 or 4 of 6 (checkpoint_every=2)
    ckdir = os.path.join(wd, "seed_0", phase, "checkpoints", "checkpoints")
    logs.append(tmp_path / f"killed_in_{phase}.log")
    with open(logs[-1], "w") as log:
      proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
      assert _kill_when(proc, lambda: os.path.isdir(os.path.join(ckdir, str(at + 2)))), phase
  r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "resumed from its checkpoint" in r.stderr
  # A state restored from a checkpoint or a finished phase is laid out as a fresh one
  # (SeedContext.new_state), so every run's steps are the programs the fixture compiled, found in
  # the persistent compilation cache.
  for err in [open(f).read() for f in logs] + [r.stderr]:
    assert "PERSISTENT COMPILATION CACHE MISS for 'jit_step'" not in err, err[-3000:]
  for phase in ("expert_math", "expert_code", "mopd"):
    a, b = phase_result(ref, phase), phase_result(wd, phase)
    assert a["ledger"]["flops"] == b["ledger"]["flops"], phase
    assert a["curve"] == b["curve"], phase
    for x, y in zip(_final_params(ref, phase), _final_params(wd, phase)):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_recovery_eval_refine_is_validated_and_only_touches_the_recovery_arms():
  from smjax.study import layout  # pylint: disable=import-outside-toplevel
  from smjax.json_io import config_diff  # pylint: disable=import-outside-toplevel
  from smjax.study import config as study_config  # pylint: disable=import-outside-toplevel
  from smjax.study.store import unread_fields  # pylint: disable=import-outside-toplevel
  c = study_config.study_defaults()
  c.phases = tuple(c.phases) + ("self_teacher",) if "self_teacher" not in c.phases else c.phases
  study_config.validate(c)
  bad = study_config.study_defaults()
  bad.phases = c.phases
  bad.self_teacher.eval_refine = 0
  with pytest.raises(ValueError, match=r"config\.self_teacher\.eval_refine=0 must be >= 1"):
    study_config.validate(bad)
  finer = study_config.study_defaults()
  default = int(finer.self_teacher.eval_refine)
  finer.self_teacher.eval_refine = 2 * default
  old = study_config.study_defaults()
  ignored = lambda spec: unread_fields(old, layout.read_fields(spec))  # noqa: E731
  for spec in (layout.BASE, layout.JOINT, layout.MOPD, layout.DEGRADE):   # reused as they are
    assert config_diff(old.to_dict(), finer.to_dict(), ignored(spec)) == [], spec.name
  for spec in (layout.RECOVER_SELF, layout.RECOVER_GRPO, layout.RECOVER_EXTERNAL):   # rerun
    assert config_diff(old.to_dict(), finer.to_dict(), ignored(spec)) == [
        f"self_teacher.eval_refine: {default} -> {2 * default}"], spec.name


@pytest.mark.parametrize("field,value,needle", [
    ("joint.eval_refine", 0, r"config\.joint\.eval_refine=0 must be >= 1"),
    ("experts.eval_refine", 0, r"config\.experts\.eval_refine=0 must be >= 1"),
    ("experts.bars", (0.9, 0.5), r"config\.experts\.bars=\(0\.9, 0\.5\) must be increasing"),
    ("report.levels", (0.5, 1.5), r"config\.report\.levels=\(0\.5, 1\.5\) must be increasing"),
    ("report.target_fraction", 0.8, r"target_fraction=0\.8 must be one of"),
    ("stop_size", -1, r"config\.stop_size=-1 must be >= 0"),
    ("mopd.plateau_evals", 0, r"config\.mopd: plateau_evals=0 must be >= 1"),
])
def test_the_experts_stop_rule_and_the_refined_grids_are_validated(field, value, needle):
  from smjax.study import config as study_config  # pylint: disable=import-outside-toplevel
  c = study_config.study_defaults()
  sect, _, key = field.partition(".")
  if key:
    c[sect][key] = value
  else:
    c[sect] = value
  with pytest.raises(ValueError, match=needle):
    study_config.validate(c)


def test_each_phase_reads_what_it_declares_and_what_it_starts_from():
  from smjax.study import layout  # pylint: disable=import-outside-toplevel
  from smjax.study.config import RUN_NEUTRAL_FIELDS  # pylint: disable=import-outside-toplevel
  reads = {spec.name: set(layout.read_fields(spec)) for spec in layout.SPECS}
  common = set(layout.COMMON_READS)
  assert reads["base"] == common | {"base"}
  assert reads["joint_grpo"] == common | {"base", "rl", "joint"}
  # Strong-to-weak: the experts' bigger model (experts.preset) SFT'd as the base is, and joint
  # GRPO on it; neither reads the experts' other fields, nor does the student's base or joint.
  assert reads["base_strong"] == common | {"base", "experts.preset"}
  assert reads["joint_grpo_strong"] == common | {"base", "experts.preset", "rl", "joint"}
  assert not any(f.startswith("experts") for f in reads["base"] | reads["joint_grpo"])
  # An expert keeps checkpoints at bars of joint GRPO's gain (from its own base: base_strong
  # with experts.preset set); MOPD reads where they stopped.
  assert reads["expert_"] == common | {"base", "rl", "joint", "experts", "experts.preset",
                                       "report.reference_arm", "run_on"}
  assert reads["mopd"] == reads["expert_"] | {"opd", "mopd"}
  assert "stop_size" in common and "report.levels" not in set().union(*reads.values())
  assert "opd" not in reads["expert_"]
  assert "external.steps" not in reads["external_teacher"] and "rl" not in reads["external_teacher"]
  assert {"rl", "joint", "self_teacher.degrade_steps"} <= reads["recover_grpo"]
  assert "opd" not in reads["recover_grpo"] and "opd" in reads["recover_self"]
  assert reads["recover_external"] >= reads["external_teacher"]
  # The control teacher is SFT'd as the external one is, but is not its preset; both OPD arms
  # run under the same rules and token cap.
  assert reads["control_teacher"] == reads["external_teacher"] - {"external.teacher_preset"}
  assert reads["control_opd"] - reads["control_teacher"] == (
      reads["external_opd"] - reads["external_teacher"])
  assert "external.max_new_tokens" in reads["external_opd"]
  assert "external.max_new_tokens" not in reads["mopd"] | reads["joint_grpo"]
  # A run-neutral field is never read.
  assert not any(f in r for r in reads.values() for f in RUN_NEUTRAL_FIELDS)


def test_each_phase_declares_its_step_cap_once_and_reads_it():
  """A phase's cap is one declared field (what the phase runs to and `smjax status` shows "of"),
  a field of the schema that its result depends on; each workdir directory finds its phase."""
  from smjax.study import layout  # pylint: disable=import-outside-toplevel
  from smjax.study.config import study_defaults  # pylint: disable=import-outside-toplevel
  c = study_defaults()
  as_json = json.loads(c.to_json())
  for spec in layout.SPECS:
    section = spec.cap.partition(".")[0]
    assert spec.cap and any(r in (spec.cap, section) for r in layout.read_fields(spec)), spec.name
    assert spec.steps(c) == spec.steps(as_json) > 0, spec.name
  assert c.experts.steps != c.joint.steps   # so that the lookups below tell them apart
  assert layout.spec_of("expert_math").steps(c) == c.experts.steps
  assert layout.spec_of("joint_grpo").steps(c) == c.joint.steps
  assert layout.spec_of("mopd@0.9") is layout.MOPD
  assert layout.spec_of("recover_self@0") is layout.RECOVER_SELF
  assert layout.spec_of("degrade@0.25").cap == "self_teacher.degrade_steps"
  assert layout.spec_of("report") is None and layout.spec_of("logs") is None


def test_a_field_added_to_the_schema_keeps_earlier_workdirs_comparable():
  """A config saved before model.chat_template existed compares as it ran: a toy study (raw
  prompts = "auto" on the char tokenizer) as the defaults, an HF study as "none"."""
  from smjax.json_io import config_diff  # pylint: disable=import-outside-toplevel
  from smjax.study import config as study_config  # pylint: disable=import-outside-toplevel
  now = study_config.study_defaults().to_dict()
  old = json.loads(json.dumps(now))
  del old["model"]["chat_template"]
  assert config_diff(old, now) == ["model.chat_template: '<absent>' -> 'auto'"]
  assert config_diff(study_config.upgrade_old_config(old), now) == []
  old["model"]["hf_path"] = now["model"]["hf_path"] = "/models/qwen"
  assert config_diff(study_config.upgrade_old_config(old), now) == [
      "model.chat_template: 'none' -> 'auto'"]
  assert "chat_template" not in old["model"]   # the saved dict is left as it was


def test_a_regime_map_renders_its_cells_partial_ones_too(study, tmp_path, capsys):
  """`smjax report MAP` on a map folder: one cell finished (a copy of the mini study), one still
  running (its seed has joint GRPO but no MOPD yet); the finished cell's line carries its own
  report's figures, the running one says so, the others are listed as not started."""
  from smjax.study import regimes, report_cli, stats  # pylint: disable=import-outside-toplevel
  root = tmp_path / "map"
  shutil.copytree(study[0], root / "shared_even")
  shutil.copytree(study[0], root / "interfering_even")
  path = root / "interfering_even" / "seed_0" / "arms.json"
  data = json.load(open(path))
  data["arms"] = [a for a in data["arms"] if not a["arm"].startswith("split_merge")]
  json.dump(data, open(path, "w"))
  # A cell with more finished seeds than its config asks for (a shared study's): done.
  more = root / "disjoint_even"
  shutil.copytree(study[0], more)
  shutil.copytree(more / "seed_0", more / "seed_1")
  data = json.load(open(more / "seed_1" / "arms.json"))
  for a in data["arms"]:
    a["seed"] = 1
  json.dump(data, open(more / "seed_1" / "arms.json", "w"))
  assert regimes.is_map(str(root)) and not regimes.is_map(str(study[0]))
  assert report_cli.main([str(root), "--bootstrap=20"]) == 0
  out = capsys.readouterr().out
  m = json.load(open(root / "report" / "map.json"))
  rows = {r["cell"]: r for r in m["cells"]}
  assert list(rows) == ["shared_even", "disjoint_even", "interfering_even"]   # the grid's order
  assert json.load(open(more / "config.json"))["seeds"] == [0]
  assert rows["disjoint_even"]["status"] == "done" and rows["disjoint_even"]["seeds"] == [0, 1]
  done, running = rows["shared_even"], rows["interfering_even"]
  assert done["status"] == "done" and done["seeds"] == [0] and done["skill"] == "shared"
  own = json.load(open(root / "report" / "shared_even" / "report.json"))["frontier"]
  for on in ("mean", "every", "mean_best", "every_best"):
    assert stats.number(done[on]["saving"]["mean"]) == pytest.approx(
        stats.number(own[on]["0.9"]["saving"]["mean"]), nan_ok=True), on
  assert done["mean"]["verdict"].startswith("(a) at 90% of joint_grpo's gain (mean over domains)")
  assert done["mean_best"]["verdict"].startswith(
      "(a) at 90% of the better route's gain (mean over domains)")
  own_verdicts = json.load(open(root / "report" / "shared_even" / "report.json"))["verdicts"]
  assert done["mean"]["verdict"] in own_verdicts and done["mean_best"]["verdict"] in own_verdicts
  assert set(done["zero_variance_groups"]) == {"math", "code"}
  # Each route's ceiling: the merged student's final accuracy against joint GRPO's, per seed.
  own_arms = json.load(open(root / "report" / "shared_even" / "report.json"))["arms"]
  diff = own_arms["split_merge"]["accuracy_vs_reference"]
  assert done["final"]["difference"]["per_seed"] == diff["per_seed"]
  final = {a: own_arms[a]["accuracy_mean"]["mean"] for a in ("split_merge", "joint_grpo")}
  assert done["final"]["difference"]["mean"] == pytest.approx(
      final["split_merge"] - final["joint_grpo"])
  above = sum(x > 0 for x in diff["per_seed"])
  assert f"{100 * diff['mean']:+.1f}" in out and f"({above} of 1 seeds above)" in out
  assert "final" not in running
  # The mini study runs the teachers' arms: claim (c) across teachers, from the cell's report.
  assert done["teachers"] and all(v.startswith("(c)") for v in done["teachers"])
  assert any("external-teacher OPD" in v for v in done["teachers"])
  assert any("control-teacher OPD" in v for v in done["teachers"])
  assert "Claim (c) across teachers" in out
  assert all(0.0 <= v <= 1.0 for v in done["zero_variance_groups"].values())
  assert running["status"] == "running" and running["seeds"] == [] and "mean" not in running
  assert set(m["not_started"]) == {c.name for c in regimes.CELLS} - set(rows)
  assert os.path.getsize(root / "report" / "map.png") > 1000
  assert "| shared_even | shared | even | 1 |" in out and "| interfering_even |" in out
  assert "Not started:" in out
