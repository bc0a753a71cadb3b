"""The one schema of a study config: every field a study reads is declared (and documented) here.

Sequences are tuples (ml_collections overrides them from the command line as
`--config.domains="('math', 'code')"`; lists cannot be overridden). A domain is a registry name or
a `module:attr` import path of your own Domain (smjax.domains); either way the study keys it by
its name (`domain_keys`), which the self_teacher and base.domain_correct_fraction fields name.

Config files in configs/ start from `study_defaults()` and change values; the dict is locked, so an
unknown field or a misspelt `--config.x=...` override is an error naming the field. `validate`
checks values before anything runs. Which fields each phase reads is declared with the phase
(smjax.study.layout), and decides when a finished phase may be reused (smjax.study.store).
"""

from __future__ import annotations

import json

import ml_collections as mlc

PHASES = ("base", "joint", "experts", "mopd", "external", "self_teacher", "joint_strong")
# Fields that do not change what a run computes: a resumed run may differ in these.
# `seeds` and `phases` (and `external.control`, whether the control arm runs) choose which phases
# run, not what a phase computes: seeds of one study may run as separate processes into one
# workdir (`make study`), then one run with every seed reports.
# `band` is checked on the base's measurement after the phase (a changed band re-judges the same
# base), `self_teacher.min_loss` likewise on the degrade phase's; the recovery target is read
# off the recovery arms' whole curves by the report, like its levels; the report's levels and
# intervals are computed from the curves (its reference arm and target fraction are not neutral:
# the experts and the external arm stop on them).
RUN_NEUTRAL_FIELDS = ("progress", "log_every", "checkpoint_every", "checkpoint_seconds", "name",
                      "report.bootstrap", "report.confidence", "report.levels", "band",
                      "self_teacher.min_loss", "self_teacher.recover_target_fraction",
                      "collapse_window", "seeds", "phases", "wandb", "external.control",
                      "parallel_phases", "self_teacher.also_correct_fractions")


# Fields added to the schema after studies were run, each with the value that does what a config
# written before it did: a finished phase, a checkpoint or a workdir's config.json from before is
# compared as if written with that value (`upgrade_old_config`), so adding a field orphans no
# earlier workdir whose run it would not change. model.chat_template: raw-text prompts were all
# there was; "auto" is the same for the char tokenizer (no template), "none" for an HF model.
# experts.preset: the experts were the student's model, which "" names. domain_difficulty: every
# domain took `difficulty`, which "" means. parallel_phases: one phase at a time (run-neutral).
# self_teacher.also_correct_fractions: one degradation (run-neutral: it adds phases).
# external.to_cap: the teachers' OPD arms ended at their stop rule.
ADDED_FIELDS = {
    "model.chat_template": lambda old: "none" if old.get("model", {}).get("hf_path") else "auto",
    "experts.preset": lambda old: "",
    "domain_difficulty": lambda old: "",
    "parallel_phases": lambda old: 1,
    "mopd.plateau_flops_fraction": lambda old: 0.0,
    "self_teacher.also_correct_fractions": lambda old: (),
    "external.to_cap": lambda old: False,
}


def upgrade_old_config(old: dict) -> dict:
  """A copy of a saved config dict with every `ADDED_FIELDS` field it lacks filled in."""
  out = json.loads(json.dumps(old))
  for field, value in ADDED_FIELDS.items():
    *sections, key = field.split(".")
    d = out
    for sect in sections:
      d = d.setdefault(sect, {})
    if key not in d:
      d[key] = value(old)
  return out

def study_defaults() -> mlc.ConfigDict:
  c = mlc.ConfigDict()
  c.name = "study"
  c.seeds = (0,)
  c.phases = PHASES
  c.domains = ("math", "code")
  # The toy domains' difficulty (smjax.domains.toy_*; file and reasoning-gym domains take none),
  # overridden per domain by `domain_difficulty="code=3,math=2"` (others: `difficulty`). In the
  # chain form every toy domain has levels 0-3; 3 is the hard level, where every example has
  # several mistake sites of two kinds (smjax.domains.chains), so that the one-bit reward is
  # sparse. Some levels' chains are longer than the defaults of rl.max_new_tokens and
  # base.seq_len hold (logic 3: a 24-token prompt, a 65-token chain): the toy modules' docstrings
  # give each level's longest prompt and chain, and a study whose settings cannot hold them is
  # refused at start (check_lengths), naming the field and what fits.
  c.difficulty = 1
  c.domain_difficulty = ""
  # form: "chain" (the toy domains' solutions are written-out chains of >= ~24 tokens before the
  # final answer: the paper's regime, where a teacher's per-token signal carries more than one
  # bit per sample) or "short" (the answer alone); smjax.domains.chains.
  c.form = "chain"
  c.heldout_size = 512            # report prompts per domain (a fixed held-out set per seed)
  # The stop set: held-out prompts per domain, disjoint from the report set by construction,
  # that every stop rule reads (an expert's checkpoint bars, an OPD phase's capture and target),
  # so that no reported figure is read on the prompts that decided where an arm stopped
  # (smjax.study.shared). 0: stop rules read the report set (a data set too small for two).
  c.stop_size = 256
  # Every arm with a stop rule runs on past the first evaluation that meets it, by at least
  # `evals` more evaluations and `flops_fraction` more of its own training FLOPs, so that no
  # reported curve ends at its crossing (a level a prompt resample moves up is still reached).
  c.run_on = mlc.ConfigDict(dict(evals=3, flops_fraction=0.25))
  # A progress bar per phase where stderr is a terminal; without one (progress=False, or a log
  # file) a plain metric line on stdout every `log_every` steps and one per evaluation
  # (smjax.train.metrics.MetricLines). `log_every` is also the steps between metrics.jsonl rows.
  c.progress = True
  c.log_every = 25
  # Weights & Biases (the optional `wandb` extra): every phase's metrics.jsonl rows (scalars and
  # sample completions) also go to a wandb run of its own in `project` ("": off), `group`
  # defaulting to the study workdir's name. WANDB_MODE=offline logs without the network.
  c.wandb = mlc.ConfigDict(dict(project="", entity="", group=""))
  c.checkpoint_every = 200        # RL steps between checkpoints of a running phase
  # ...and a checkpoint once this much wall time has passed since the last (0: off), so that a
  # process killed where steps are slow (seeds and phases side by side on 2 cores) loses at most
  # this much of a phase. A save of the toy's state takes well under a second.
  c.checkpoint_seconds = 600.0
  # Phases of a seed that depend on none of each other (the experts; the MOPD runs from each set
  # of their checkpoints) run up to this many at a time, in threads: the same results in less
  # wall time where cores would idle (the toy model keeps about one busy; `make demo` runs 2).
  # Leave it at 1 when several seeds run as processes side by side (`make study`).
  c.parallel_phases = 1
  # An RL/OPD phase stops with a CollapseError when, for this many steps in a row, no sample
  # scores and the gradient is 0, or the policy's entropy sits at ln V; or when its held-out
  # accuracy falls to 0 after it was above 5% (smjax.train.guards.Collapse). 0: no check.
  c.collapse_window = 25

  # hf_path: a local Hugging Face directory (config.json, safetensors, tokenizer.json). When set,
  # it replaces `preset` and the char tokenizer, and the base phase starts from its weights.
  # chat_template: "auto" feeds an HF model that has a chat template (an instruct model) each
  # prompt as its chat (a user message, the assistant's turn opened; smjax.models.chat); "none"
  # feeds the raw prompt text. The char tokenizer has none: the toy study is the same either way.
  c.model = mlc.ConfigDict(dict(preset="toy-tiny", hf_path="", param_dtype="float32",
                                dtype="float32", max_seq_len=0, chat_template="auto"))
  # Device mesh (smjax.sharding): rows over data x fsdp, parameters over fsdp and tensor.
  # data=-1 takes every device the other axes leave.
  c.mesh = mlc.ConfigDict(dict(data=-1, fsdp=1, tensor=1))

  # The base is partly right by construction: SFT to convergence on chains whose mistake sites (a
  # carry or borrow, a link, a repeated letter) are flawed independently, so that a fraction
  # `correct_fraction` of the examples that admit a mistake are correct (smjax.domains.chains).
  # The model learns each site as a coin flip, so its sampled accuracy lands near the mixture's
  # rate on every seed and machine (`band` checks it), with headroom (pass@8 well above pass@1):
  # the regime where RL sharpens a policy. (Chain form; the short form trains on gold answers.)
  # seq_len fits BOS + the longest chain-form prompt (16) + chain (40) + EOS; rows are left-padded.
  # The learning rate follows a cosine over `schedule_steps` (0: over `steps`). steps=900 and
  # correct_fraction=0.1 are the recipe for which seeds 0-4 of two_domain all land in the band
  # (benchmarks/study_seeds.py -> docs/archive/fixed_budget/study_seeds.json; the base is the
  # same under every later instrument).
  # Domains that learn their chain at different rates take their own fraction:
  # `domain_correct_fraction="logic=0.5,strings=0.3"` (others: `correct_fraction`).
  c.base = mlc.ConfigDict(dict(steps=900, schedule_steps=0, batch_size=128,
                               learning_rate=3e-3, warmup_steps=20, seq_len=64,
                               correct_fraction=0.1, domain_correct_fraction=""))
  # The band the base's held-out accuracy (mean of 8 samples at rl.temperature, every domain)
  # must land in, with pass@8 at least `min_headroom` above it; a seed outside it stops the study
  # with the measured values (check=False: warn and go on).
  # `hard_domains` ("math,code"; by their names, as config.domains' keys) take the hard band
  # instead, [hard_low, hard_high] with pass@8 at least hard_min_headroom above: a domain set at a
  # hard level (domain_difficulty) to be slow beside an easy one, or a sparse-reward study.
  c.band = mlc.ConfigDict(dict(low=0.2, high=0.5, min_headroom=0.2, check=True, hard_domains="",
                               hard_low=0.02, hard_high=0.15, hard_min_headroom=0.05))

  # Shared by every GRPO phase (joint, experts, self-teacher degradation / GRPO recovery).
  # shared_prompt: the step runs each prompt's forward once for its samples_per_prompt rows (as
  # the sampler's prefill does); the same update with fewer FLOPs (smjax.train.score).
  # pack_completions: the step (and the reference; in OPD the teachers) run the completions as
  # one stream without their padding (smjax.batch.pack); the same update with fewer FLOPs,
  # one compiled step per stream length (rounded up to an eighth of the completion columns).
  c.rl = mlc.ConfigDict(dict(
      prompts_per_step=16, samples_per_prompt=8, max_new_tokens=44, temperature=1.0,
      learning_rate=1e-4, warmup_steps=0, clip_norm=1.0, advantage_mode="grpo", eps_low=0.2,
      eps_high=0.28, beta=0.0, kl_estimator="k3", aggregation="token_mean", micro_batches=1,
      impl="auto", shared_prompt=True, pack_completions=True))
  # Joint GRPO and the experts are evaluated `eval_refine` times as often as the study's grid
  # (which joint.steps / eval.points of joint GRPO's steps fix), so that the FLOPs at which each
  # reaches a level are resolved: in this toy most of GRPO's gain comes in its first tenth.
  # Split-then-merge is charged its cheapest route to each accuracy level (its frontier): each
  # expert keeps a checkpoint the first time its domain, on the stop set, has gained each of
  # `bars` (fractions of joint GRPO's final gain there), and MOPD runs from every such set of
  # checkpoints (an expert that never crossed a bar stands in its set with its whole run); an
  # expert stops once past its last bar (and its run-on) or after `steps` (the cap).
  # `prompts_per_step`: the expert's batch; 0 is joint GRPO's prompts per step over the number
  # of domains, so that a domain gets as many samples per step in both routes
  # (rl.prompts_per_step: the full-batch variant).
  # `preset`: strong-to-weak distillation, the experts a bigger model than the student (a toy
  # preset of smjax.models.presets, e.g. "toy-small"; its max_seq_len, as the student's,
  # overridden by model.max_seq_len when set). A second base, `base_strong`, is SFT'd on that
  # preset exactly as the base is (config.base, the same mixture; charged to no arm), the experts
  # grow from it (their bars read from its stop-set accuracy), MOPD distils them into the
  # student, and with the phase `joint_strong` (in the default's every phase), joint GRPO on it
  # (`joint_grpo_strong`, joint.steps at rl's batch) is reported beside joint_grpo, which stays
  # the reference: a second reference, and at the bigger size a study's longest phase, so a run
  # may leave it for later (phases are run-neutral). "": the experts are the student's model.
  c.joint = mlc.ConfigDict(dict(steps=1200, eval_refine=4))
  c.experts = mlc.ConfigDict(dict(steps=600, prompts_per_step=0, bars=(0.75, 0.9, 0.95, 1.0),
                                  eval_refine=4, preset=""))

  # Shared by every OPD phase (MOPD, external-teacher OPD, self-teacher recovery). shared_prompt:
  # the student step and the teachers run each prompt once for its samples_per_prompt rows.
  # full_vocab: the exact per-token reverse KL (cheap at the char vocabulary's V=128; the sampled
  # estimator's held-out accuracy is much noisier, tests/test_learning.py).
  # Distillation is measured, not set: an OPD phase stops (then runs on, `run_on`) at the first
  # evaluation where the student has captured `capture_fraction` of its teachers' in-domain gain
  # over its starting point (summed over the domains) on the stop set, or after its phase's
  # `steps` (the cap); the external teacher's arm must also be at the report's level
  # (report.target_fraction). Its evaluations come `eval_refine` times as often as the study's
  # grid, so that distillation is resolved by several evaluations, not two.
  c.opd = mlc.ConfigDict(dict(
      objective="full_vocab", prompts_per_step=16, samples_per_prompt=4, temperature=1.0,
      learning_rate=1e-4, eps_low=0.2, eps_high=0.28, top_k=16, micro_batches=1, impl="auto",
      shared_prompt=True, pack_completions=True, capture_fraction=0.95, eval_refine=24))
  # MOPD stops only once it has captured that fraction and its stop-set curve is flat as well
  # (rules.Plateau: the last `plateau_evals` evaluations lifted no domain more than `plateau_tol`
  # above its best before them), so that every set of expert checkpoints is distilled as far as
  # it goes and the frontier is not censored by a distillation cut short while still rising. It
  # then runs on (run_on) like every arm: "flat" within plateau_tol is not the end of its rise
  # (without the run-on, the demo's "every domain at 90 %" moved from 81 % to 112 % more FLOPs).
  # plateau_flops_fraction: the flat window also spans at least this fraction more of the run's
  # own FLOPs, so that "flat" does not depend on how densely it is evaluated (0: `plateau_evals`
  # alone, as the studies and the first six regime cells ran; the later cells use 0.25).
  c.mopd = mlc.ConfigDict(dict(steps=300, plateau_evals=3, plateau_tol=0.01,
                               plateau_flops_fraction=0.0))

  # The external teacher stands for someone else's post-trained model: a larger model SFT'd on
  # gold solutions in a verbose style (the answer restated after the solution), long enough to
  # be good at the task, so that claim (c) is a fair test (docs/calibration.md). Its OPD arm
  # samples up to `max_new_tokens` (0: the teacher's own cap, rl.max_new_tokens +
  # TEACHER_EXTRA_TOKENS), so that the student can write the teacher's longest answer instead of
  # being cut off (and scored) mid-imitation; the other phases keep rl.max_new_tokens. `control`:
  # a control teacher too, the student's architecture SFT'd the same way on the plain chains,
  # distilled under the same rules (arm control_opd): it tells "a bigger teacher" from "a
  # verbose one" (external_opd against control_opd against joint GRPO). `to_cap`: both arms run
  # on to their cap (external.steps) past their stop rule, which only marks where it would have
  # ended them: what a teacher does to its student's accuracy and length is the stop rule's
  # choice otherwise (two_domain,full's verbose teacher broke 2 of 5 students before its rule
  # ended them, 4 of 5 by the cap), so the report reads each arm at both ends (`<arm>@rule`:
  # smjax.study.report.rule_views). False: the rule ends them, as studies ran before it.
  c.external = mlc.ConfigDict(dict(
      teacher_preset="toy-small", teacher_sft_steps=1000, teacher_learning_rate=2e-3,
      teacher_seq_len=96, steps=300, max_new_tokens=0, control=True, to_cap=True))

  # Claim (d): the joint model degraded on `recover_domain` (which must cost it at least
  # `min_loss` of accuracy there, checked on every seed like the base's band), then recovered by
  # three routes, each running its whole `recover_steps`. `degrade`: "noisy_sft" (`degrade_steps`
  # SFT steps at `degrade_learning_rate` on recover_domain's chains with mistakes, a fraction
  # `degrade_correct_fraction` of them right, as the base's mixture: later training on noisy
  # data, a loss that lands near that fraction on every seed) or "grpo" (`degrade_steps` more
  # GRPO steps on `degrade_domain`: forgetting by interference, which in the toy's shared-skill
  # domains cost math 13 points on average, under 20 on some seeds, docs/study.md);
  # the report reads from their whole curves the FLOPs each needs to get back
  # `recover_target_fraction` of what was lost. The recovery arms are evaluated `eval_refine`
  # times as often as the study's grid: they are short, and their FLOPs to target is the claim.
  # `also_correct_fractions` (noisy_sft): more depths of the same degradation, each with its own
  # degrade phase and three recoveries, named `<phase>@<fraction>` (e.g. recover_grpo@0), each
  # exactly the phase a study with degrade_correct_fraction=<fraction> runs: what the self
  # teacher saves depends on how deep the loss went (GRPO's one-bit reward finds its way back
  # from a partial loss, not from one with no right answer left), so a study can report both.
  c.self_teacher = mlc.ConfigDict(dict(
      degrade="noisy_sft", degrade_domain="code", recover_domain="math", degrade_steps=300,
      degrade_learning_rate=1e-3, degrade_correct_fraction=0.5, recover_steps=200,
      recover_target_fraction=0.9, eval_refine=64, min_loss=0.2, also_correct_fractions=()))

  # Evaluation: each held-out prompt sampled `samples` times at rl.temperature (the headline
  # accuracy is their mean), plus greedy pass@1 (`greedy`); `batch_size` prompts per sampler call.
  # An RL/OPD phase is evaluated on the grid (`points` over joint GRPO's run, refined per phase)
  # and also whenever its own training FLOPs have grown by `growth` since its last evaluation:
  # dense where its curve rises fast, so that each first passage is bracketed to about that share
  # of its FLOPs (the report gives each bracket).
  c.eval = mlc.ConfigDict(dict(every_steps=0, every_flops=0.0, points=12, batch_size=128,
                               samples=4, greedy=True, growth=0.1))
  # The frontier's accuracy levels: the base plus each fraction of the reference arm's (joint
  # GRPO's) final gain; every route is charged its cheapest way to each level, and the verdicts
  # read `target_fraction` (one of them; the paper's "comparable accuracy"). Intervals: Student's
  # t over seeds with several seeds; with one, a percentile bootstrap (`bootstrap` resamples)
  # over held-out prompts, evaluation noise only (smjax.study.stats).
  c.report = mlc.ConfigDict(dict(levels=(0.5, 0.75, 0.9, 0.95), target_fraction=0.9,
                                 reference_arm="joint_grpo", bootstrap=1000, confidence=0.95))
  return c


def validate(c: mlc.ConfigDict) -> None:
  """Value checks with errors naming the field."""
  bad = [p for p in c.phases if p not in PHASES]
  if bad:
    raise ValueError(f"config.phases has unknown phases {bad}; known: {list(PHASES)}")
  if not c.seeds:
    raise ValueError("config.seeds is empty; give at least one seed")
  if len(set(c.domains)) != len(c.domains) or not c.domains:
    raise ValueError(f"config.domains={list(c.domains)} must be a non-empty list without repeats")
  keys = domain_keys(c)   # imports every `module:attr` domain: a failing one is named here
  if len(set(keys)) != len(keys):
    raise ValueError(f"config.domains={list(c.domains)}: two domains have one name ({list(keys)}); "
                     "give each imported domain a name of its own")
  from smjax.domains import domain_label  # pylint: disable=import-outside-toplevel
  labels = [domain_label(d) for d in keys]
  if len(set(labels)) != len(labels):
    raise ValueError(f"config.domains={list(c.domains)}: two domains share the short name used "
                     f"for arms and directories ({labels}); rename one data file")
  if c.model.chat_template not in ("auto", "none"):
    raise ValueError(f"config.model.chat_template={c.model.chat_template!r} must be 'auto' (the "
                     "model's chat template where it has one) or 'none' (raw-text prompts)")
  experts_model_cfg(c)   # experts.preset: "" or a toy preset of the student's vocabulary
  if c.base.steps < 0 or (c.base.steps == 0 and not c.model.hf_path):
    raise ValueError(f"config.base.steps={c.base.steps}: a toy base needs >= 1 SFT step (0 is "
                     "allowed only with model.hf_path, whose weights are then the base)")
  if c.base.schedule_steps and c.base.schedule_steps < c.base.steps:
    raise ValueError(f"config.base.schedule_steps={c.base.schedule_steps} must be 0 (the cosine "
                     f"ends at base.steps) or >= config.base.steps={c.base.steps}")
  for field in ("joint.steps", "experts.steps", "mopd.steps", "external.steps",
                "rl.prompts_per_step", "rl.samples_per_prompt", "rl.max_new_tokens",
                "opd.prompts_per_step", "opd.samples_per_prompt", "heldout_size",
                "eval.samples", "eval.batch_size", "opd.eval_refine", "joint.eval_refine",
                "experts.eval_refine", "report.bootstrap", "log_every"):
    sect, _, key = field.partition(".")
    value = c[sect][key] if key else c[sect]
    if int(value) < 1:
      raise ValueError(f"config.{field}={value} must be >= 1")
  # pylint: disable-next=import-outside-toplevel
  from smjax.train.steps import GRPOConfig, OPDConfig
  for sect, cls, fields in (("rl", GRPOConfig, ("advantage_mode", "kl_estimator", "aggregation",
                                                  "impl", "micro_batches")),
                            ("opd", OPDConfig, ("objective", "impl", "micro_batches"))):
    try:  # the step configs' own checks (choices, >= 1), with the flag's name in the error
      cls(**{f: c[sect][f] for f in fields})
    except ValueError as e:
      raise ValueError(f"config.{sect}." + str(e).split(".", 1)[1]) from None
    n, prompts = int(c[sect].micro_batches), int(c[sect].prompts_per_step)
    if prompts % n:
      raise ValueError(f"config.{sect}.micro_batches={n} must divide config.{sect}."
                       f"prompts_per_step={prompts} (a micro-batch holds whole prompt groups)")
  if c.rl.samples_per_prompt < 2 and c.rl.advantage_mode in ("grpo", "rloo"):
    raise ValueError(f"config.rl.samples_per_prompt={c.rl.samples_per_prompt}: GRPO/RLOO "
                     "advantages need groups of at least 2")
  if "self_teacher" in c.phases:
    for f in ("degrade_domain", "recover_domain"):
      if c.self_teacher[f] not in keys:
        raise ValueError(f"config.self_teacher.{f}={c.self_teacher[f]!r} is not one of "
                         f"config.domains' names {list(keys)}")
    if c.self_teacher.degrade not in ("noisy_sft", "grpo"):
      raise ValueError(f"config.self_teacher.degrade={c.self_teacher.degrade!r} must be "
                       "'noisy_sft' or 'grpo'")
    if (c.self_teacher.degrade == "grpo" and
        c.self_teacher.degrade_domain == c.self_teacher.recover_domain):
      raise ValueError("config.self_teacher: degrade_domain and recover_domain must differ "
                       "(degrade='grpo' degrades recover_domain by training on another)")
    from smjax.domains import TOY_DOMAINS  # pylint: disable=import-outside-toplevel
    if c.self_teacher.degrade == "noisy_sft" and (
        c.form != "chain" or c.self_teacher.recover_domain not in TOY_DOMAINS):
      raise ValueError(f"config.self_teacher.degrade='noisy_sft' flaws the chains of a toy "
                       f"domain (form='chain'); recover_domain={c.self_teacher.recover_domain!r}"
                       f", form={c.form!r}: use degrade='grpo'")
    if not 0.0 <= float(c.self_teacher.degrade_correct_fraction) < 1.0:
      raise ValueError(f"config.self_teacher.degrade_correct_fraction="
                       f"{c.self_teacher.degrade_correct_fraction} must be in [0, 1) (1: no "
                       "mistakes, nothing degrades)")
    more = [float(x) for x in c.self_teacher.also_correct_fractions]
    if more and c.self_teacher.degrade != "noisy_sft":
      raise ValueError(f"config.self_teacher.also_correct_fractions={tuple(more)} are depths of "
                       f"the noisy_sft degradation; degrade={c.self_teacher.degrade!r}: set it "
                       "to ()")
    every = [float(c.self_teacher.degrade_correct_fraction)] + more
    if any(not 0.0 <= x < 1.0 for x in more) or len(set(every)) < len(every):
      raise ValueError(f"config.self_teacher.also_correct_fractions={tuple(more)}: each must be "
                       f"in [0, 1) and differ from the others and from degrade_correct_fraction="
                       f"{every[0]:g}")
    if not 0.0 <= float(c.self_teacher.min_loss) <= 1.0:
      raise ValueError(f"config.self_teacher.min_loss={c.self_teacher.min_loss} must be in "
                       "[0, 1] (an accuracy drop)")
    if int(c.self_teacher.eval_refine) < 1:
      raise ValueError(f"config.self_teacher.eval_refine={c.self_teacher.eval_refine} must be "
                       ">= 1 (1: the recovery arms are evaluated as often as the others)")
  if int(c.parallel_phases) < 1:
    raise ValueError(f"config.parallel_phases={c.parallel_phases} must be >= 1 (1: one phase "
                     "at a time)")
  for field in ("log_every", "checkpoint_every", "checkpoint_seconds", "collapse_window"):
    if float(c[field]) < (1 if field == "log_every" else 0):
      raise ValueError(f"config.{field}={c[field]} must be >= "
                       f"{1 if field == 'log_every' else 0}")
  if (c.eval.every_steps < 0 or c.eval.every_flops < 0 or c.eval.points < 0
      or c.eval.growth < 0):
    raise ValueError("config.eval.every_steps / every_flops / points / growth must be >= 0")
  if c.form not in ("chain", "short"):
    raise ValueError(f"config.form={c.form!r} must be 'chain' or 'short'")
  for field in ("base.correct_fraction", "opd.capture_fraction", "band.low", "band.high",
                "band.hard_low", "band.hard_high", "report.target_fraction",
                "run_on.flops_fraction"):
    sect, _, key = field.partition(".")
    if not 0.0 <= float(c[sect][key]) <= 1.0:
      raise ValueError(f"config.{field}={c[sect][key]} must be in [0, 1]")
  for field in ("experts.bars", "report.levels"):
    sect, _, key = field.partition(".")
    xs = tuple(c[sect][key])
    if not xs or any(not 0.0 < float(x) <= 1.0 for x in xs) or list(xs) != sorted(set(xs)):
      raise ValueError(f"config.{field}={xs} must be increasing fractions in (0, 1]")
  if c.report.target_fraction not in tuple(c.report.levels):
    raise ValueError(f"config.report.target_fraction={c.report.target_fraction} must be one of "
                     f"config.report.levels={tuple(c.report.levels)} (the verdicts read it)")
  if (int(c.mopd.plateau_evals) < 1 or float(c.mopd.plateau_tol) < 0
      or float(c.mopd.plateau_flops_fraction) < 0):
    raise ValueError(f"config.mopd: plateau_evals={c.mopd.plateau_evals} must be >= 1, "
                     f"plateau_tol={c.mopd.plateau_tol} >= 0 and plateau_flops_fraction="
                     f"{c.mopd.plateau_flops_fraction} >= 0")
  for field in ("stop_size", "experts.prompts_per_step", "run_on.evals",
                "external.max_new_tokens"):
    sect, _, key = field.partition(".")
    value = c[sect][key] if key else c[sect]
    if int(value) < 0:
      raise ValueError(f"config.{field}={value} must be >= 0")
  correct_fractions(c)   # base.domain_correct_fraction parses and names study domains
  difficulties(c)   # domain_difficulty parses, names toy domains, and every level is in range
  if c.band.low > c.band.high or c.band.hard_low > c.band.hard_high:
    raise ValueError(f"config.band: low={c.band.low} > high={c.band.high}, or hard_low="
                     f"{c.band.hard_low} > hard_high={c.band.hard_high}")
  hard_domains(c.band, domain_keys(c))   # names study domains
  if not 0.0 < c.report.confidence < 1.0:
    raise ValueError(f"config.report.confidence={c.report.confidence} must be in (0, 1)")


def parse_arg(arg: str | None, **defaults) -> mlc.ConfigDict:
  """big_vision-style `get_config` argument: "two_domain,demo" or "k=v,flag" into a ConfigDict."""
  out = mlc.ConfigDict(defaults)
  if not arg:
    return out
  for part in arg.split(","):
    part = part.strip()
    if not part:
      continue
    if "=" in part:
      k, v = part.split("=", 1)
      if k not in out:
        raise ValueError(f"config argument {k!r} is not one of {sorted(out.keys())}")
      out[k] = type(out[k])(v) if not isinstance(out[k], bool) else v.lower() in ("1", "true")
    elif part in out and isinstance(out[part], bool):
      out[part] = True
    else:
      raise ValueError(f"config argument {part!r} is not one of {sorted(out.keys())}")
  return out


# The external teacher samples this many tokens past rl.max_new_tokens: its verbose style restates
# the problem and the answer after the solution (smjax.study.phases.verbose).
TEACHER_EXTRA_TOKENS = 24


def experts_model_cfg(c: mlc.ConfigDict):
  """The experts' ModelConfig in a strong-to-weak study: experts.preset with config.model's
  dtypes and max_seq_len override, as the student's preset takes them; None when experts.preset
  is "" (the experts are the student's model). A ValueError naming the field for a preset that
  is unknown, is the student's own, or has another vocabulary than the student's (MOPD scores
  the student's tokens with the teachers' distributions)."""
  preset = c.experts.get("preset", "")   # a workdir's config.json from before the field: ""
  if not preset:
    return None
  # pylint: disable-next=import-outside-toplevel
  from smjax.models.presets import PRESETS, get_preset
  m = c.model
  if preset not in PRESETS:
    raise ValueError(f"config.experts.preset={preset!r} is not a known preset; known: "
                     f"{sorted(PRESETS)} ('': the student's model)")
  if m.hf_path:
    raise ValueError(f"config.experts.preset={preset!r} needs a toy student (the char tokenizer), "
                     f"but config.model.hf_path={m.hf_path!r} is set: leave experts.preset ''")
  if preset == m.preset:
    raise ValueError(f"config.experts.preset={preset!r} is the student's own preset "
                     "(config.model.preset); '' gives experts of the student's model")
  cfg = get_preset(preset, param_dtype=m.param_dtype, dtype=m.dtype,
                   **({"max_seq_len": m.max_seq_len} if m.max_seq_len else {}))
  student = get_preset(m.preset)
  if cfg.vocab_size != student.vocab_size:
    raise ValueError(f"config.experts.preset={preset!r} has vocab_size={cfg.vocab_size}, the "
                     f"student (config.model.preset={m.preset!r}) {student.vocab_size}: MOPD "
                     "needs one vocabulary; pick a toy preset")
  return cfg


def strong_to_weak(c: mlc.ConfigDict) -> bool:
  """Whether a study runs the experts' bigger model: experts.preset is set and the experts, MOPD
  or joint_strong (joint GRPO on that model) are among its phases (then base_strong runs too).
  The phases are read first: a study without them never reads experts.preset."""
  return (bool({"experts", "mopd", "joint_strong"} & set(c.phases))
          and bool(c.experts.get("preset", "")))


def external_max_new_tokens(c: mlc.ConfigDict) -> int:
  """The token cap of the external teacher's OPD arm (and its control's): external.max_new_tokens,
  0 meaning the teacher's own (rl.max_new_tokens + TEACHER_EXTRA_TOKENS)."""
  return int(c.external.max_new_tokens) or int(c.rl.max_new_tokens) + TEACHER_EXTRA_TOKENS


def domain_keys(c: mlc.ConfigDict) -> tuple[str, ...]:
  """The names config.domains' domains go by, in order: a registry name as it is, a
  `module:attr` import path as its domain's `name` attribute (smjax.domains.domain_key). Every
  phase, report column, teacher route and directory is keyed by these; a ValueError naming the
  path when one fails to import."""
  from smjax.domains import domain_key  # pylint: disable=import-outside-toplevel
  return tuple(domain_key(d) for d in c.domains)


def correct_fractions(c: mlc.ConfigDict) -> dict[str, float]:
  """{domain: the base mixture's correct fraction}: base.correct_fraction, overridden per domain
  by base.domain_correct_fraction ("logic=0.5,strings=0.3"); ValueError naming the field."""
  out = {d: float(c.base.correct_fraction) for d in domain_keys(c)}
  spec = c.base.domain_correct_fraction.strip()
  for item in filter(None, (x.strip() for x in spec.split(","))):
    name, eq, value = item.partition("=")
    try:
      frac = float(value) if eq else None
    except ValueError:
      frac = None
    if frac is None or not 0.0 <= frac <= 1.0:
      raise ValueError(f"config.base.domain_correct_fraction={spec!r}: {item!r} must be "
                       "domain=fraction with the fraction in [0, 1]")
    if name.strip() not in out:
      raise ValueError(f"config.base.domain_correct_fraction={spec!r}: {name.strip()!r} is not "
                       f"one of config.domains' names {tuple(out)}")
    out[name.strip()] = frac
  return out


def hard_domains(band, domains) -> tuple[str, ...]:
  """The domains config.band.hard_domains ("math,code") puts in the hard band; ValueError naming
  the field when one is not in `domains` (the study's domain keys). `band`: config.band, or the
  band section of a workdir's config.json (one from before the field: none)."""
  spec = str(band.get("hard_domains", "") or "")
  names = tuple(filter(None, (x.strip() for x in spec.split(","))))
  for name in names:
    if name not in domains:
      raise ValueError(f"config.band.hard_domains={spec!r}: {name!r} is not one of "
                       f"config.domains' names {tuple(domains)}")
  return names


def difficulties(c: mlc.ConfigDict) -> dict[str, int]:
  """{toy domain: its difficulty}: config.difficulty, overridden per domain by
  config.domain_difficulty ("code=3,math=2"); the study's other domains take none and are not
  keys. ValueError naming the field: an item not domain=integer, a name that is not one of
  config.domains' toy domains, or a level outside the domain's range in config.form."""
  from smjax.domains import TOY_DOMAINS, get_domain  # pylint: disable=import-outside-toplevel
  out = {d: c.difficulty for d in c.domains if d in TOY_DOMAINS}  # a toy name is its key
  spec, named = c.domain_difficulty.strip(), set()
  for item in filter(None, (x.strip() for x in spec.split(","))):
    name, eq, value = (x.strip() for x in item.partition("="))
    if not eq or not (value.isascii() and value.isdigit()):
      raise ValueError(f"config.domain_difficulty={spec!r}: {item!r} must be domain=level with "
                       "the level an integer >= 0")
    if name not in out:
      raise ValueError(f"config.domain_difficulty={spec!r}: {name!r} is not one of config.domains'"
                       f" toy domains {tuple(out)}")
    out[name] = int(value)
    named.add(name)
  for name, level in out.items():
    dom = get_domain(name, difficulty=0, form=c.form)
    top = dom.max_chain_difficulty if c.form == "chain" else dom.max_difficulty
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= top:
      field = (f"config.domain_difficulty={spec!r}" if name in named
               else f"config.difficulty={c.difficulty!r}")
      raise ValueError(f"{field}: {name} takes a difficulty in [0, {top}] in the {c.form} form, "
                       f"not {level!r}")
  return out


def check_lengths(config, tokenizer, model_cfg, heldout, domains=None) -> None:
  """Prompt + completion must fit max_seq_len, or the sampler refuses the prompt: checked at start
  on the held-out prompts and on every record of the file domains' splits (training prompts are
  sampled minutes later), not when a batch meets it.

  `heldout`: {domain: [Example]}; `domains`: {name: Domain}; `tokenizer`, `model_cfg`: the
  study's (smjax.study.shared)."""
  from smjax.models.presets import get_preset  # pylint: disable=import-outside-toplevel
  from smjax.batch import encode_prompt  # pylint: disable=import-outside-toplevel
  examples = [e for ex in heldout.values() for e in ex]
  for dom in (domains or {}).values():
    if hasattr(dom, "all_examples"):   # file domains: every record of every split
      examples.extend(dom.all_examples())
  longest, worst = 1, None
  for e in examples:
    n = len(encode_prompt(tokenizer, e))
    if n > longest:
      longest, worst = n, e
  where = ((worst.metadata or {}).get("where") if worst is not None else None)
  which = f"the prompt at {where}" if where else (
      f"the longest held-out prompt of config.domains={list(config.domains)}")
  T, m = config.rl.max_new_tokens, config.model
  limits = [(T, model_cfg.max_seq_len,
             f"the model's max_seq_len={model_cfg.max_seq_len} ({m.hf_path or m.preset}; "
             "config.model.max_seq_len overrides it)")]
  if {"external", "self_teacher"} & set(config.phases):
    teacher = get_preset(config.external.teacher_preset)
    limits.append((T + TEACHER_EXTRA_TOKENS, teacher.max_seq_len,
                   f"the external teacher's max_seq_len={teacher.max_seq_len} (config.external."
                   f"teacher_preset={config.external.teacher_preset!r}, which samples "
                   f"max_new_tokens + {TEACHER_EXTRA_TOKENS})"))
  if strong_to_weak(config):
    strong = experts_model_cfg(config)
    limits.append((T, strong.max_seq_len,
                   f"the experts' max_seq_len={strong.max_seq_len} (config.experts.preset="
                   f"{config.experts.preset!r}; config.model.max_seq_len overrides it)"))
  for new_tokens, max_seq_len, what in limits:
    if longest + new_tokens <= max_seq_len:
      continue
    fits = max_seq_len - longest - (new_tokens - T)
    fix = (f"use config.rl.max_new_tokens <= {fits}" if fits >= 1 else
           "the prompt alone leaves no room for an answer: shorten or remove it, or raise the "
           "max_seq_len")
    raise ValueError(
        f"config.rl.max_new_tokens={T} does not fit: {which} has {longest} tokens (BOS or "
        f"chat template included), and {longest} + {new_tokens} new tokens exceeds {what}; {fix}")
  # A toy domain's written-out solution must fit the completion budget, or every right answer is
  # cut off before its final answer and scores 0 (the sampler would not refuse it); and the base's
  # SFT rows (prompt + solution + EOS) must fit base.seq_len, which sft_batch checks only when a
  # batch meets the longest one, minutes in.
  from smjax.domains.base import ToyDomain  # pylint: disable=import-outside-toplevel
  toy = [e for d, ex in heldout.items() for e in ex
         if isinstance((domains or {}).get(d), ToyDomain) and e.solution]
  if toy:
    sol = max(toy, key=lambda e: len(tokenizer.encode(e.solution)))
    n = len(tokenizer.encode(sol.solution))
    level = f"difficulty {sol.metadata.get('difficulty')}, form {config.form!r}"
    if n > T:
      raise ValueError(
          f"config.rl.max_new_tokens={T} is shorter than the longest held-out solution of "
          f"{sol.domain} ({n} tokens at {level}): a right answer would be cut off before it "
          f"ends and score 0; use config.rl.max_new_tokens >= {n} (and a model.max_seq_len "
          "that holds the prompt and it)")
    row = max(toy, key=lambda e: len(encode_prompt(tokenizer, e)) + len(tokenizer.encode(
        e.solution)))
    n = len(encode_prompt(tokenizer, row)) + len(tokenizer.encode(row.solution)) + 1
    if n > int(config.base.seq_len):
      raise ValueError(
          f"config.base.seq_len={config.base.seq_len} cannot hold the base's longest training "
          f"row of {row.domain} ({n} tokens: prompt, solution and EOS, at {level}); use "
          f"config.base.seq_len >= {n}")
