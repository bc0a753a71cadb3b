"""How a study's workdir is laid out: its `seed_<k>` directories, and in each one directory per
phase, declared here (`PhaseSpec`): its name, the config sections or fields its result depends on,
the phases whose outputs it starts from and the config field that holds its step cap.

The runners are smjax.study.phases; the store (smjax.study.store) reuses a finished phase exactly
when none of the fields `read_fields` gives for it changed (tests/record_reads.py checks, on a
recorded run, that a phase reads no field it does not declare). This module imports nothing
heavy, so what only reads a workdir (`smjax status`) starts without jax.
"""

from __future__ import annotations

import dataclasses

from etils import epath

from smjax import paths

# Every phase reads these: the model and data, and the evaluation every curve is made of
# (rl.max_new_tokens and rl.temperature are also the evaluation sampler's).
COMMON_READS = ("model", "mesh", "domains", "difficulty", "domain_difficulty", "form",
                "heldout_size", "stop_size", "eval",
                "rl.max_new_tokens", "rl.temperature")


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
  """A phase's name (its directory; `expert_` names one per domain), the config sections or
  fields its result depends on, the phases whose outputs it starts from, and the config field
  that holds its step cap (`cap`, dotted; an SFT phase runs all of them, an RL phase stops at
  them unless its rule stops it first)."""
  name: str
  reads: tuple[str, ...]
  after: tuple[PhaseSpec, ...] = ()
  cap: str = ""

  def dir(self, suffix: str = "") -> str:
    return self.name + suffix

  def steps(self, config) -> int:
    """Its step cap in `config` (a ConfigDict, or a workdir's config.json as a dict)."""
    section, _, field = self.cap.partition(".")
    return int(config[section][field])


def read_fields(spec: PhaseSpec) -> tuple[str, ...]:
  """Every config field `spec`'s result depends on: its own, its inputs' (transitively) and the
  common ones."""
  out = list(COMMON_READS)
  todo = [spec]
  while todo:
    s = todo.pop()
    out.extend(s.reads)
    todo.extend(s.after)
  return tuple(dict.fromkeys(out))


def seed_dirs(workdir: str) -> list[str]:
  """The seed_<k> directories of a study workdir (local or a URL, smjax.paths), in seed order."""
  return sorted((d for d in paths.listdir(workdir) if d.startswith("seed_")
                 and epath.Path(paths.join(workdir, d)).is_dir()), key=lambda d: (len(d), d))


# --------------------------------------------------------------------------------- the base model

BASE = PhaseSpec("base", reads=("base",), cap="base.steps")
# Strong-to-weak (experts.preset set): the experts' bigger model SFT'd exactly as the base is,
# from a random init of that preset; the experts and joint_grpo_strong start from it.
BASE_STRONG = PhaseSpec("base_strong", reads=("base", "experts.preset"), cap="base.steps")

# -------------------------------------------------------------- the external and control teachers

_TEACHER_SFT = ("external.teacher_sft_steps", "external.teacher_learning_rate",
                "external.teacher_seq_len")
EXTERNAL_TEACHER = PhaseSpec("external_teacher", reads=("external.teacher_preset",) + _TEACHER_SFT,
                             after=(BASE,), cap="external.teacher_sft_steps")
# The control teacher: the student's architecture, SFT'd like the external teacher on plain chains.
CONTROL_TEACHER = PhaseSpec("control_teacher", reads=_TEACHER_SFT, after=(BASE,),
                            cap="external.teacher_sft_steps")

# ---------------------------------------------------------------------------------- the RL phases

JOINT = PhaseSpec("joint_grpo", reads=("rl", "joint"), after=(BASE,), cap="joint.steps")
# An expert keeps checkpoints at bars of joint GRPO's gain (experts.bars) and stops past the last
# one, so it starts from joint GRPO's result; every arm with a stop rule runs on past it.
# With experts.preset set it grows from base_strong instead of the base.
EXPERT = PhaseSpec("expert_", reads=("rl", "experts", "report.reference_arm", "run_on"),
                   after=(BASE, BASE_STRONG, JOINT), cap="experts.steps")   # expert_<domain>
# Strong-to-weak: joint GRPO on the experts' bigger model, from base_strong (an arm beside the
# reference, joint_grpo, not a route of the frontier).
JOINT_STRONG = PhaseSpec("joint_grpo_strong", reads=("rl", "joint"), after=(BASE_STRONG,),
                        cap="joint.steps")
MOPD = PhaseSpec("mopd", reads=("opd", "mopd", "run_on"), after=(EXPERT,),
                cap="mopd.steps")  # mopd[@<bar>]
_EXTERNAL_OPD = ("rl", "opd", "external.steps", "external.max_new_tokens", "external.to_cap",
                 "run_on", "report.target_fraction", "report.reference_arm")
EXTERNAL_OPD = PhaseSpec("external_opd", reads=_EXTERNAL_OPD, after=(EXTERNAL_TEACHER,),
                        cap="external.steps")
CONTROL_OPD = PhaseSpec("control_opd", reads=_EXTERNAL_OPD, after=(CONTROL_TEACHER,),
                       cap="external.steps")
# Claim (d): the joint model trained further on one domain, then that domain's loss recovered.
DEGRADE = PhaseSpec("degrade", reads=(
    "self_teacher.degrade", "self_teacher.degrade_domain", "self_teacher.degrade_steps",
    "self_teacher.degrade_learning_rate", "self_teacher.degrade_correct_fraction",
    "self_teacher.recover_domain"), after=(JOINT,), cap="self_teacher.degrade_steps")

# The recovery arms run their whole budget: their target (self_teacher.recover_target_fraction)
# is the report's to read off their curves, and self_teacher.min_loss is checked between the
# phases (smjax.study.run.check_degradation); neither changes what a recovery phase computes.
_RECOVER = ("self_teacher.recover_domain", "self_teacher.recover_steps",
            "self_teacher.eval_refine")
RECOVER_SELF = PhaseSpec("recover_self", reads=("opd",) + _RECOVER, after=(DEGRADE,),
                        cap="self_teacher.recover_steps")
RECOVER_EXTERNAL = PhaseSpec("recover_external", reads=("opd",) + _RECOVER,
                             after=(DEGRADE, EXTERNAL_TEACHER), cap="self_teacher.recover_steps")
RECOVER_GRPO = PhaseSpec("recover_grpo", reads=_RECOVER, after=(DEGRADE,),
                        cap="self_teacher.recover_steps")

# Every phase's declaration, for what reads a workdir by its phases' directories (`spec_of`:
# smjax.study.status).
SPECS = (BASE, BASE_STRONG, EXTERNAL_TEACHER, CONTROL_TEACHER, JOINT, EXPERT, JOINT_STRONG, MOPD,
         EXTERNAL_OPD, CONTROL_OPD, DEGRADE, RECOVER_SELF, RECOVER_EXTERNAL, RECOVER_GRPO)


def spec_of(directory: str) -> PhaseSpec | None:
  """The declaration of the phase whose directory is `directory` (`expert_<domain>`, a suffix
  from "@" on: `mopd@0.9`, `recover_self@0`), None for a name no phase has."""
  name = directory.partition("@")[0]
  return next((s for s in SPECS if s.name == name or (s.name.endswith("_") and
                                                      name.startswith(s.name))), None)
