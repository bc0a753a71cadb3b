"""A whole study: base → joint GRPO | experts → MOPD, external OPD, self-teacher recovery.

Every arm starts from the same SFT base model (its FLOPs are reported apart, under base/*):

- `joint_grpo`: one policy, GRPO on the mixed prompt stream of all domains;
- `split_merge`: one GRPO expert per domain, then multi-teacher OPD (MOPD) of the base student on
  its own samples, each row scored by the expert of its domain; its FLOPs are the experts' plus
  the distillation's, and its curve starts where the experts stopped. Each expert keeps its
  parameters where it first crossed each of `experts.bars` (shares of joint GRPO's gain on its
  domain, read on the stop set); `split_merge` distils from the experts at the last bar, and
  `split_merge@<bar>` from each lower one: the report charges split-then-merge its cheapest set
  per accuracy level (its frontier);
- strong-to-weak (`experts.preset` names a bigger model than the student): the experts are that
  model, grown from `base_strong` (that model SFT'd as the base is, charged to no arm) with their
  bars read from its stop-set accuracy, and MOPD distils them into the student; beside joint
  GRPO (still the reference), with the phase `joint_strong`, runs `joint_grpo_strong`, joint
  GRPO on the bigger model from base_strong, an arm of the report but no route of its frontier;
- `external_opd`: OPD of the base student from a larger teacher warmed up on verbose solutions
  (an "external post-trained teacher": its own training is not charged to the arm);
- `self_teacher`: the joint model trained further on one domain (which degrades the other), then
  the degraded domain recovered by OPD from the model's own earlier checkpoint (the self-GRPO
  teacher), by OPD from the external teacher, and by GRPO; FLOPs to recover are compared; with
  self_teacher.also_correct_fractions, again from each further depth of the degradation
  (`degrade@<f>`, `recover_*@<f>`).

Each phase (smjax.study.phases) has its own work dir `<workdir>/seed_<s>/<phase>/`: a finished phase
is not run again, and an interrupted one resumes from its last checkpoint (smjax.study.store). All
phases of a seed run in one process and share their jitted programs (smjax.study.shared), so each
program compiles once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import signal

import jax
import ml_collections as mlc

from smjax import distributed, paths
from smjax import domains as domains_lib
from smjax.checkpoint import ConfigMismatchError
from smjax.preemption import PreemptionGuard
from smjax.json_io import config_diff, read_json
from smjax.models.presets import get_preset
from smjax.study import layout
from smjax.study import phases as ph
from smjax.study import store
from smjax.study.config import (domain_keys, external_max_new_tokens, hard_domains, study_defaults,
                                upgrade_old_config, validate)
from smjax.study.render import format_table, write_report
from smjax.study import records, rules
from smjax.study.report import ArmResult, build_report
from smjax.study.shared import SeedShared, experts_shared, seed_shared
from smjax.study.store import PhaseOutput
from smjax.train.metrics import require_wandb
from smjax.train.teachers import Teacher

log = logging.getLogger(__name__)


class BandError(ValueError):
  """The base misses config.band on a seed: the study's arms would have nothing to show."""


def band_problems(band: dict, b) -> list[str]:
  """What a base's band measurement (smjax.study.phases: accuracy and pass@k per domain) misses
  of config.band `b`: accuracy outside [low, high], or pass@k less than min_headroom above it;
  for the domains in b's hard_domains, of the hard band (hard_low, hard_high,
  hard_min_headroom)."""
  k, problems = band["samples"], []
  hard = hard_domains(b, list(band["accuracy"]))
  for d, acc in band["accuracy"].items():
    pk = band["pass_at_k"][d]
    pre, which = ("hard_", "its hard band ") if d in hard else ("", "")
    low, high, room = b[pre + "low"], b[pre + "high"], b[pre + "min_headroom"]
    if not low <= acc <= high:
      problems.append(f"{d} accuracy {acc:.1%} is outside {which}[{low:.0%}, {high:.0%}]")
    if pk - acc < room:
      problems.append(f"{d} pass@{k} {pk:.1%} is less than {room:.0%} above its "
                      f"accuracy {acc:.1%}")
  return problems


def check_band(config: mlc.ConfigDict, seed: int, base: PhaseOutput) -> None:
  """The base's sampled held-out accuracy must lie in [band.low, band.high] on every domain, with
  pass@k at least band.min_headroom above it (the base's `band` measurement, smjax.study.phases);
  BandError naming the seed and the measured values otherwise (band.check=False: a warning)."""
  band = base.extra.get("band")
  if not band:
    return
  problems = band_problems(band, config.band)
  if not problems:
    return
  msg = (f"seed {seed}: the base model misses config.band: {'; '.join(problems)} (accuracy: mean "
         f"of {band['samples']} samples per held-out prompt at temperature "
         f"{config.rl.temperature})")
  if config.band.check:
    raise BandError(f"{msg}. Change config.base (correct_fraction, domain_correct_fraction, "
                    "steps) and rerun, or set config.band.check=False to go on with this base")
  log.warning("%s; going on with it (config.band.check=False)", msg)


def _train_flops(out: PhaseOutput) -> dict[str, float]:
  return ph.train_flops(out.ledger)


def _arm(name: str, seed: int, out: PhaseOutput, flops: dict[str, float] | None = None,
         **kw) -> ArmResult:
  """The arm of a training phase's output: its curve, its FLOPs by phase (`flops`, else the
  phase's own training FLOPs) and its collapse, if the run ended at one."""
  return ArmResult(name, seed, out.curve, _train_flops(out) if flops is None else flops,
                   collapsed=out.extra.get("collapsed"), **kw)


def _expert_sets(config, experts: dict[str, PhaseOutput]) -> list[tuple[str, dict]]:
  """The experts' checkpoint sets MOPD runs from, as (arm name, {domain: {"at": the bar the expert
  was stopped at, or "final", "step", "flops", "flops_by_phase"}}): `split_merge` from the
  experts at the last of experts.bars (joint GRPO's level when it is 1.0), then
  `split_merge@<bar>` for each lower bar. An expert that never crossed a bar stands in that set
  with its final parameters (so without bars, e.g. no joint GRPO to set them, `split_merge` is
  MOPD from the experts' ends). A set identical to an earlier one (every expert stopped at the
  same step) is left out."""
  bars = [f"{float(b):g}" for b in config.experts.bars]
  out, seen = [], set()
  for i, label in enumerate(reversed(bars)):
    members = {}
    for d, x in experts.items():
      snap = (x.extra.get("snapshots") or {}).get(label)
      if snap is None:
        last = x.curve[-1]
        snap = {"step": last["step"], "flops": last["flops"], "flops_by_phase": _train_flops(x)}
        members[d] = {"at": "final", **snap}
      else:
        members[d] = {"at": label, **snap}
    key = tuple(members[d]["step"] for d in sorted(members))
    if key not in seen:
      seen.add(key)
      out.append(("split_merge" if i == 0 else f"split_merge@{label}", members))
  return out


def _side_by_side(fn, items: list, workers: int) -> list:
  """[fn(item) for item in items], up to `workers` at a time in threads (config.parallel_phases):
  for phases that depend on none of each other. Each phase's programs, data streams and files
  are its own, so the results are those of the phases run in turn; with 2 CPU cores and a toy
  model that keeps one busy, two phases take about the wall time of one. The first error is
  raised (after the others have finished)."""
  if workers <= 1 or len(items) <= 1 or jax.process_count() > 1:   # hosts run phases in step
    return [fn(x) for x in items]
  # SIGTERM reaches the threads' loops through the guard the main thread holds; so does Ctrl-C
  # (which only the main thread receives): each phase stops at its next step, saved.
  with PreemptionGuard() as guard, concurrent.futures.ThreadPoolExecutor(
      min(workers, len(items)), thread_name_prefix="phase") as pool:
    futures = [pool.submit(fn, x) for x in items]
    try:
      concurrent.futures.wait(futures)
    except KeyboardInterrupt:
      guard.received = signal.SIGINT
      concurrent.futures.wait(futures)
      raise
    return [f.result() for f in futures]


def _stop_final(out: PhaseOutput) -> dict:
  """A phase's final accuracy on the stop set (what the stop rules read)."""
  return rules.stop_accuracy(out.curve[-1])


def run_seed(config: mlc.ConfigDict, seed: int, workdir: str,
             shared: SeedShared | None = None) -> list[ArmResult]:
  """All configured phases for one seed (in `workdir`); returns the arms for the report.
  `shared`: the seed's record when already built (start_study builds the first seed's)."""
  shared = shared or seed_shared(config, seed)
  # The experts' model: the student's, or in a strong-to-weak study (experts.preset) a bigger
  # one's, with a seed record of its own (built before any phase: nothing compiles yet).
  grown = shared if shared.experts_model is None else experts_shared(shared)
  phases = set(config.phases)
  workers = int(config.parallel_phases)
  domains = domain_keys(config)   # every domain by its name (an import path's: its `name`)
  train = _train_flops
  arms = _ArmLog(workdir)
  base = ph.phase_base(shared, workdir)
  check_band(config, seed, base)
  arms.append(ArmResult("base", seed, base.curve, {}, note="SFT warm-up; not in any arm's FLOPs"))
  o = config.opd

  def rl(spec, name, on=shared, **kw):   # a GRPO / OPD phase of the model `on` holds
    return ph.rl_phase(on, workdir, spec, name, **kw)
  joint = None
  if "joint" in phases or "self_teacher" in phases:
    joint = rl(layout.JOINT, layout.JOINT.name, algo=ph.grpo(shared), init_params=base.params,
               domains=domains, stream_seed=10,
               eval_refine=int(config.joint.eval_refine))
    arms.append(_arm("joint_grpo", seed, joint))
  # The base the experts grow from: the student's, or the bigger model SFT'd as the base is,
  # after joint GRPO has fixed the seed's evaluation grid with the student's step.
  grown_base, preset = base, grown.model_cfg.name
  if grown is not shared:
    grown_base = ph.phase_base(grown, workdir, layout.BASE_STRONG)
    arms.append(ArmResult(layout.BASE_STRONG.name, seed, grown_base.curve, {},
                          note=f"{preset} SFT'd as the base is; the experts' start; not in any "
                          "arm's FLOPs"))
  # Split-then-merge is charged its cheapest route to each accuracy level: each expert keeps its
  # parameters at its first crossings of bars of joint GRPO's final gain on its domain (read on
  # the stop set) and stops past the last bar; MOPD runs from every set of those checkpoints.
  def reference():   # joint GRPO's final stop-set accuracy, read by the phases that declare it
    return (_stop_final(joint) if joint is not None
            and config.report.reference_arm == "joint_grpo" else None)
  if "experts" in phases or "mopd" in phases:
    ref = reference()
    experts = {}
    per_step = (int(config.experts.prompts_per_step) or
                max(1, int(config.rl.prompts_per_step) // len(domains)))
    # Bars: shares of joint GRPO's final gain over the base, from the experts' own start.
    bars = {d: {} if ref is None else {
        f"{float(b):g}": rules.bar_rule(d, _stop_final(grown_base), ref, float(b))
        for b in config.experts.bars} for d in domains}
    last_bar = f"{float(config.experts.bars[-1]):g}"
    refine = int(config.experts.eval_refine)

    def expert(i, d):
      return rl(layout.EXPERT, layout.EXPERT.dir(domains_lib.domain_label(d)), on=grown,
                algo=ph.grpo(grown), init_params=grown_base.params, domains=[d],
                stream_seed=20 + i, eval_refine=refine, stop_at=bars[d].get(last_bar),
                prompts_per_step=per_step, snapshot_at=bars[d])
    # The experts are independent of each other: side by side when the seed's evaluation grid
    # is fixed already (joint GRPO fixed it; an expert would otherwise fix it).
    experts = dict(zip(domains, _side_by_side(
        lambda x: expert(*x), list(enumerate(domains)), workers if joint is not None else 1)))
    for d in domains:
      name = layout.EXPERT.dir(domains_lib.domain_label(d))
      arms.append(_arm(name, seed, experts[d],
                       note=f"GRPO on {d} only, {per_step} prompts per step" + (
                           "" if grown is shared else f", {preset} from base_strong"),
                       reached=experts[d].extra.get("reached") if bars[d] else None,
                       experts_at=experts[d].extra.get("snapshots") or {}))
    if "mopd" in phases:
      names = {d: layout.EXPERT.dir(domains_lib.domain_label(d)) for d in experts}
      template = grown.abstract_params()
      plateau = (int(config.mopd.plateau_evals), float(config.mopd.plateau_tol),
                 float(config.mopd.plateau_flops_fraction))
      refine, capture = int(o.eval_refine), o.capture_fraction

      def distil(arm, members):   # MOPD from one set of the experts' checkpoints
        params = {d: experts[d].params if m["at"] == "final" else store.load_params(
            store.snapshot_dir(workdir, names[d], m["at"]), template, f"{names[d]} at {m['at']}")
                  for d, m in members.items()}
        # The experts' own model (a bigger one in strong-to-weak) scores the student's rows.
        teachers = [Teacher(names[d], grown.model_cfg, p, (d,)) for d, p in params.items()]
        # The student's capture is measured against what these teachers hold on the stop set.
        teacher_acc = {d: rules.stop_accuracy(_point_at(experts[d].curve, m["step"]))[d]
                       for d, m in members.items()}
        expert_flops = sum(m["flops"] for m in members.values())
        return rl(layout.MOPD, layout.MOPD.name + arm.removeprefix("split_merge"),
                  algo=ph.opd(shared), init_params=base.params, domains=domains,
                  stream_seed=30, flops_offset=expert_flops,
                  router=shared.teacher_router(teachers), eval_refine=refine,
                  stop_at=rules.all_rules(
                      rules.capture_rule(_stop_final(base), teacher_acc, capture),
                      rules.Plateau(*plateau, offset=expert_flops)))
      sets = _expert_sets(config, experts)
      for (arm, members), mopd in zip(sets, _side_by_side(lambda a: distil(*a), sets, workers)):
        expert_flops = sum(m["flops"] for m in members.values())
        by_phase: dict[str, float] = {}
        for part in [m["flops_by_phase"] for m in members.values()] + [train(mopd)]:
          for p, v in part.items():
            by_phase[p] = by_phase.get(p, 0.0) + v
        arms.append(_arm(
            arm, seed, mopd, by_phase, expert_flops=expert_flops,
            distill_flops=sum(train(mopd).values()), teachers=names,
            capture_fraction=o.capture_fraction, reached=mopd.extra.get("reached"),
            experts_at={d: {k: m[k] for k in ("at", "step", "flops")} for d, m in members.items()},
            note="MOPD from the experts " + (
                "" if grown is shared else f"({preset}) ") + "stopped at " + ", ".join(
                f"{d} {m['at']} (step {m['step']}"
                + (", collapsed" if experts[d].extra.get("collapsed") else "") + ")"
                for d, m in members.items())))
  if grown is not shared and "joint_strong" in phases:
    # Joint GRPO on the bigger model: a second reference beside the frontier, not a route of it,
    # so it runs after the routes (its whole budget at the bigger size is the cell's longest
    # phase; nothing else reads it, and each phase's streams are its own, so order is neutral).
    strong = rl(layout.JOINT_STRONG, layout.JOINT_STRONG.name, on=grown, algo=ph.grpo(grown),
                init_params=grown_base.params, domains=domains,
                stream_seed=10, eval_refine=int(config.joint.eval_refine))
    arms.append(_arm(layout.JOINT_STRONG.name, seed, strong,
                     note=f"joint GRPO on {preset} from base_strong (beside the "
                     "reference, not a route of the frontier)"))
  external = None
  if "external" in phases or "self_teacher" in phases:
    # The external teacher and its control (claim (c)) read only the base: trained side by side.
    sft = [ph.phase_external_teacher]
    if "external" in phases and config.external.control:
      sft.append(ph.phase_control_teacher)
    external, *control = _side_by_side(lambda phase: phase(shared, workdir), sft, workers)
    arms.append(ArmResult("external_teacher", seed, external.curve, {},
                          note=f"{config.external.teacher_preset} SFT on verbose solutions; "
                          "not charged to any arm"))
  if "external" in phases:
    # Claim (c): OPD from the external teacher, and from its control (the student's size, plain
    # chains), each under MOPD's capture rule plus the report's level, both on the stop set, with
    # the student's token cap raised to the teacher's (external.max_new_tokens); side by side.
    # With external.to_cap the rule only marks its end: both run on to their cap.
    teachers = [(layout.EXTERNAL_OPD, "external", external,
                 get_preset(config.external.teacher_preset), 40)]
    if control:
      arms.append(ArmResult("control_teacher", seed, control[0].curve, {},
                            note="the student's architecture SFT'd on plain chains, as the "
                            "external teacher on verbose ones; not charged to any arm"))
      teachers.append((layout.CONTROL_OPD, "control", control[0], shared.model_cfg, 41))
    cap, ref = external_max_new_tokens(config), reference()

    def teacher_opd(t):
      spec, who, teacher, cfg, stream_seed = t
      return rl(spec, spec.name, algo=ph.opd(shared), init_params=base.params,
                domains=domains, stream_seed=stream_seed,
                router=shared.teacher_router([Teacher(who, cfg, teacher.params,
                                                       tuple(domains))]),
                eval_refine=int(o.eval_refine), max_new_tokens=cap,
                to_cap=bool(config.external.to_cap), stop_at=rules.all_rules(
                    rules.capture_rule(_stop_final(base), _stop_final(teacher),
                                       o.capture_fraction),
                    None if ref is None else rules.target_rule(
                        _stop_final(base), ref, float(config.report.target_fraction))))
    for (spec, who, *_), ext in zip(teachers, _side_by_side(teacher_opd, teachers, workers)):
      arms.append(_arm(spec.name, seed, ext, distill_flops=sum(train(ext).values()),
                       teachers={d: f"{who}_teacher" for d in domains},
                       capture_fraction=o.capture_fraction, reached=ext.extra.get("reached"),
                       rule_end=ext.extra.get("rule_end"),
                       note=f"OPD from the {who} teacher, up to {cap} new tokens"))
  if "self_teacher" in phases:
    for arm in _self_teacher(shared, workdir, joint, external):
      arms.append(arm)
  return list(arms)


def _point_at(curve: list[dict], step: int) -> dict:
  """The curve point evaluated after `step` steps (the last one when several share it)."""
  return [p for p in curve if p["step"] == step][-1]


class _ArmLog(list):
  """A seed's arms, also written to `<seed workdir>/arms.json` (atomically, by process 0) as each
  is added, so that `smjax report` can render a partial study without running anything."""

  def __init__(self, workdir: str):
    super().__init__()
    self.workdir = workdir
    self.path = paths.join(workdir, ARMS_FILE)

  def append(self, arm: ArmResult) -> None:
    super().append(arm)
    if distributed.is_coordinator():
      paths.makedirs(self.workdir)
      paths.write_atomic(self.path, json.dumps({"arms": [dataclasses.asdict(a) for a in self]}))


ARMS_FILE = records.ARMS_FILE


def load_arms(workdir: str) -> list[ArmResult]:
  """Every arm the seeds under a study workdir (or a record of one: smjax.study.records) have
  finished so far (their arms.json, a record's arms.json.gz)."""
  arms = []
  for name in paths.listdir(workdir):
    held = records.read_arms(paths.join(workdir, name)) if name.startswith("seed_") else None
    arms.extend(ArmResult(**a) for a in held or [])
  return arms


def make_report(config: mlc.ConfigDict, arms: list[ArmResult], out_dir: str) -> dict:
  """The study report of `arms` under `config` (report.json/csv/txt, curves.json, the plot in
  `out_dir`); returns it with "paths" and "table" added."""
  ref = config.report.reference_arm
  report = build_report(arms, target_fraction=config.report.target_fraction,
                        # a workdir from before the frontier has no report.levels: the default
                        levels=tuple(config.report.get("levels", study_defaults().report.levels)),
                        reference_arm=ref if any(a.arm == ref for a in arms) else None,
                        recover_domain=(config.self_teacher.recover_domain
                                        if "self_teacher" in config.phases else None),
                        bootstrap=int(config.report.bootstrap),
                        confidence=float(config.report.confidence),
                        flat_rule=flat_rule_replay(config))
  report["paths"] = write_report(report, arms, out_dir)
  report["table"] = format_table(report)
  return report


def flat_rule_replay(config: mlc.ConfigDict) -> dict | None:
  """The other flat rule a report reads MOPD under (report.replay_distillation), so that a
  verdict the rule could move is seen under both: without the FLOPs span where the study ran with
  one, with rules.FLAT_SPAN where it ran without. None for a study without MOPD, or from before
  MOPD had a flat rule and a run-on."""
  m = config.get("mopd") or {}
  if "mopd" not in config.phases or "plateau_evals" not in m or "run_on" not in config:
    return None
  ran = float(m.get("plateau_flops_fraction", 0.0))
  return {"evals": int(m.plateau_evals), "tol": float(m.plateau_tol), "ran": ran,
          "replay": 0.0 if ran > 0 else rules.FLAT_SPAN, "cap": int(m.steps),
          "run_on": (int(config.run_on.evals), float(config.run_on.flops_fraction))}


class DegradationError(ValueError):
  """The degrade phase cost the recovered domain too little for claim (d) to be measured."""


def check_degradation(config: mlc.ConfigDict, seed: int, joint: PhaseOutput,
                      degraded: PhaseOutput, phase: str = layout.DEGRADE.name) -> None:
  """The degrade phase (`phase`: a further depth's is degrade@<f>) must cost the recovered domain
  at least self_teacher.min_loss of accuracy (read on the stop set, like the base's band on the
  report set), or the recovery target sits within noise of where recovery starts and no
  interval can form; DegradationError naming the seed and the values otherwise."""
  st = config.self_teacher
  rec = st.recover_domain
  before, after = _stop_final(joint)[rec], _stop_final(degraded)[rec]
  if before - after < st.min_loss:
    how, fix = ((f"{st.degrade_steps} GRPO steps on {st.degrade_domain}",
                 f"choose a degrade_domain that interferes with {rec}")
                if st.degrade == "grpo" else
                (f"{st.degrade_steps} noisy SFT steps on {rec}" + (
                    f" ({phase}: {100 * float(st.degrade_correct_fraction):g}% of them right)"
                    if phase != layout.DEGRADE.name else ""),
                 "lower self_teacher.degrade_correct_fraction" if phase == layout.DEGRADE.name
                 else "lower that depth in self_teacher.also_correct_fractions"))
    raise DegradationError(
        f"seed {seed}: {how} cost {rec} only "
        f"{100 * (before - after):.1f} points ({100 * before:.1f}% -> {100 * after:.1f}% on the "
        f"stop set), less than config.self_teacher.min_loss={st.min_loss:g}: raise "
        f"self_teacher.degrade_steps or {fix}, into a fresh --workdir or after deleting that "
        f"seed's {phase}/ directory")


def _self_teacher(shared: SeedShared, workdir: str, joint: PhaseOutput, external: PhaseOutput):
  """Claim (d): recover a domain degraded by later training, from the model's own earlier GRPO
  checkpoint (self teacher) vs the external teacher vs GRPO (`_recover`), at the configured
  degradation and at each further depth of it (self_teacher.also_correct_fractions), whose
  phases are named `<phase>@<fraction>` and compute exactly what a study with
  degrade_correct_fraction=<fraction> does (the same config where any phase reads it, the same
  streams), so such a study's finished phases can be lent to them (`smjax lend`)."""
  arms = _recover(shared, workdir, joint, external)
  for f in shared.config.self_teacher.also_correct_fractions:
    c = shared.config.copy_and_resolve_references()
    c.self_teacher.degrade_correct_fraction = float(f)
    c.self_teacher.also_correct_fractions = ()
    arms += _recover(dataclasses.replace(shared, config=c), workdir, joint, external,
                     f"@{float(f):g}")
  return arms


def _recover(shared: SeedShared, workdir: str, joint: PhaseOutput, external: PhaseOutput,
             suffix: str = ""):
  """One degradation and its three recoveries (named with `suffix`). The degradation must cost
  the domain at least self_teacher.min_loss (`check_degradation`); each route then runs its whole
  recover_steps with dense evaluation, and the report reads from the whole curves the FLOPs each
  needs to get back recover_target_fraction of what the degradation lost."""
  st = shared.config.self_teacher
  deg_d, rec_d = st.degrade_domain, st.recover_domain
  start = layout.DEGRADE.name + suffix
  if st.degrade == "grpo":
    degraded = ph.rl_phase(shared, workdir, layout.DEGRADE, start, algo=ph.grpo(shared),
                           init_params=joint.params, domains=[deg_d],
                           stream_seed=50)
    how = f"joint model trained {st.degrade_steps} more GRPO steps on {deg_d}"
  else:
    degraded = ph.phase_degrade_sft(shared, workdir, joint, start)
    how = (f"joint model SFT'd {st.degrade_steps} steps on {rec_d} chains, "
           f"{100 * float(st.degrade_correct_fraction):g}% of them right")
  check_degradation(shared.config, shared.seed, joint, degraded, start)
  lost_from = degraded.curve[-1]["accuracy"][rec_d]
  target = lost_from + st.recover_target_fraction * (joint.curve[-1]["accuracy"][rec_d] - lost_from)
  arms = [_arm(start, shared.seed, degraded, group="recovery", note=how)]
  opd, grpo = ph.opd(shared), ph.grpo(shared)
  # Each route's teacher is made as its phase starts (the external one reads its preset then).
  routes = (
      (layout.RECOVER_SELF, opd, lambda: Teacher("self", shared.model_cfg, joint.params, (rec_d,))),
      (layout.RECOVER_EXTERNAL, opd, lambda: Teacher(
          "external", get_preset(shared.config.external.teacher_preset), external.params,
          (rec_d,))),
      (layout.RECOVER_GRPO, grpo, None),
  )
  for i, (spec, algo, teacher) in enumerate(routes):
    router = None if teacher is None else shared.teacher_router([teacher()])
    out = ph.rl_phase(shared, workdir, spec, spec.name + suffix, algo=algo,
                      init_params=degraded.params, domains=[rec_d],
                      stream_seed=60 + i, router=router, heldout_domains=[rec_d],
                      eval_refine=int(st.eval_refine))
    arms.append(_arm(spec.name + suffix, shared.seed, out, group="recovery", target=target,
                     teachers={rec_d: "joint_grpo"}, start=start,
                     capture_fraction=st.recover_target_fraction,
                     distill_flops=sum(_train_flops(out).values()) if algo is opd else 0.0))
  return arms


def run_study(config: mlc.ConfigDict, workdir: str) -> dict:
  """Every seed of the study, then the report (report.json/csv/txt, curves.json, the plot).
  `workdir`: a local path or a gs:// URL (smjax.paths; one this install cannot write is refused
  before anything runs)."""
  paths.check_workdir(workdir)
  workdir = paths.resolve(workdir)
  first = start_study(config, workdir)
  arms = []
  for seed in config.seeds:
    arms.extend(run_seed(config, seed, paths.join(workdir, f"seed_{seed}"),
                         shared=first if seed == config.seeds[0] else None))
  return make_report(config, arms, paths.join(workdir, "report"))


def start_study(config: mlc.ConfigDict, workdir: str) -> SeedShared:
  """The start-up check, before any phase runs or any file is written: every config value
  (`validate`), the model files, the data and every held-out prompt's length (building the first
  seed's shared record, smjax.study.shared), and a workdir that holds no other study (its
  config.json may differ only in fields no finished base could have used). Then config.json is
  written, atomically, by process 0. Returns the first seed's shared record. With
  config.wandb.project set, wandb must be installed (MissingExtraError naming the extra)."""
  validate(config)
  if config.wandb.project:
    require_wandb()
  path = paths.join(workdir, "config.json")
  if paths.exists(path):
    old = read_json(path, "delete the workdir or use a fresh --workdir")
    diff = config_diff(upgrade_old_config(old), config.to_dict(),
                       store.unread_fields(config, layout.read_fields(layout.BASE)))
    if diff:
      raise ConfigMismatchError(
          f"{workdir} holds another study (its config.json differs in fields every phase "
          f"depends on: {'; '.join(diff)}); use a fresh --workdir, or delete that one")
  shared = seed_shared(config, config.seeds[0])
  if distributed.is_coordinator():
    paths.makedirs(workdir)
    # Seeds of one study may start as parallel processes: each its own temporary file.
    paths.write_atomic(path, json.dumps(config.to_dict(), indent=1),
                       tmp_suffix=f".{os.getpid()}.tmp")
  return shared
