"""The one schema of a study config: every field a study reads is declared (and documented) here.

Sequences are tuples (ml_collections overrides them from the command line as
`--config.domains="('math', 'code')"`; lists cannot be overridden).

Config files in configs/ start from `study_defaults()` and change values; the dict is locked, so an
unknown field or a misspelt `--config.x=...` override is an error naming the field. `validate`
checks values before anything runs. Which fields each phase reads is declared beside the phase
(smjax.study.phases), and decides when a finished phase may be reused (smjax.study.store).
"""

from __future__ import annotations

import ml_collections as mlc

PHASES = ("base", "joint", "experts", "mopd", "external", "self_teacher")
# Fields that do not change what a run computes: a resumed run may differ in these.
# `seeds` and `phases` choose which phases run, not what a phase computes: seeds of one study may
# run as separate processes into one workdir (see README), then one run with every seed reports.
RUN_NEUTRAL_FIELDS = ("progress", "log_every", "checkpoint_every", "name", "report",
                      "eval.batch_size", "seeds", "phases")


def study_defaults() -> mlc.ConfigDict:
  c = mlc.ConfigDict()
  c.name = "study"
  c.seeds = (0,)
  c.phases = PHASES
  c.domains = ("math", "code")
  c.difficulty = 1
  c.heldout_size = 128            # held-out examples per domain (fixed set, greedy pass@1)
  c.progress = True
  c.log_every = 25
  c.checkpoint_every = 200        # RL steps between checkpoints of a running phase

  # hf_path: a local Hugging Face directory (config.json, safetensors, tokenizer.json). When set,
  # it replaces `preset` and the char tokenizer, and the base phase starts from its weights.
  c.model = mlc.ConfigDict(dict(preset="toy-tiny", hf_path="", param_dtype="float32",
                                dtype="float32", max_seq_len=0))
  # Device mesh (smjax.sharding): rows over data x fsdp, parameters over fsdp and tensor.
  # data=-1 takes every device the other axes leave.
  c.mesh = mlc.ConfigDict(dict(data=-1, fsdp=1, tensor=1))

  # seq_len fits BOS + the longest toy prompt (24) + solution (10) + EOS; rows are left-padded.
  # The learning rate follows a cosine over `schedule_steps` (0: over `steps`); stopping before
  # its end leaves the base mid-way, with partial accuracy: RL sharpens a partly-right model, it
  # does not rescue a hopeless one or improve a saturated one.
  # Calibration (2-core CPU, 2026-11-30, seed 0, greedy held-out math / code): held-out accuracy
  # jumps late and in a seed-dependent order. Cosine over 1000: step 600 -> 9% / 25%, 700 ->
  # 11% / 41%, 750 -> 15% / 48% (66% / 55% when the same config ran in another process: the
  # transition is that sensitive), 1000 -> 21% / 76%; cosine over 800, step 800 -> 94% / 23%.
  # GRPO (lr 1e-4, 16 x 8) from a partial base: math 37% -> 55%, code 41% -> 56% in 600 steps,
  # while the other domain decays; from a saturated domain (94%) it only loses accuracy.
  c.base = mlc.ConfigDict(dict(steps=750, schedule_steps=1000, batch_size=128,
                               learning_rate=3e-3, warmup_steps=20, seq_len=36))

  # Shared by every GRPO phase (joint, experts, self-teacher degradation / GRPO recovery).
  # shared_prompt: the step runs each prompt's forward once for its samples_per_prompt rows (as
  # the sampler's prefill does); the same update with fewer FLOPs (smjax.train.score).
  # pack_completions: the step (and the reference; in OPD the teachers) run the completions as
  # one stream without their padding (smjax.batch.pack); the same update with fewer FLOPs,
  # one compiled step per stream length (rounded up to an eighth of the completion columns).
  c.rl = mlc.ConfigDict(dict(
      prompts_per_step=16, samples_per_prompt=8, max_new_tokens=12, temperature=1.0,
      learning_rate=1e-4, warmup_steps=0, clip_norm=1.0, advantage_mode="grpo", eps_low=0.2,
      eps_high=0.28, beta=0.0, kl_estimator="k3", aggregation="token_mean", micro_batches=1,
      impl="auto", shared_prompt=True, pack_completions=True))
  c.joint = mlc.ConfigDict(dict(steps=1200))
  c.experts = mlc.ConfigDict(dict(steps=600))

  # Shared by every OPD phase (MOPD, external-teacher OPD, self-teacher recovery). shared_prompt:
  # the student step and the teachers run each prompt once for its samples_per_prompt rows.
  # full_vocab: the exact per-token reverse KL (cheap at the char vocabulary's V=128); on toy math it
  # recovered 95% of a GRPO expert's gain in 100 steps where the sampled estimator's held-out
  # accuracy swung between 48% and 57% (tests/test_learning.py, 2026-11-30).
  c.opd = mlc.ConfigDict(dict(
      objective="full_vocab", prompts_per_step=16, samples_per_prompt=4, temperature=1.0,
      learning_rate=1e-4, eps_low=0.2, eps_high=0.28, top_k=16, micro_batches=1, impl="auto",
      shared_prompt=True, pack_completions=True))
  c.mopd = mlc.ConfigDict(dict(steps=300))

  # The teacher must be good at the task for claim (c) to be a fair test: toy-small on verbose
  # solutions (seed 0) scores 2/1 % (math/code) after 200 steps of this 1000-step cosine, 23/14 %
  # after 400, 87/75 % after 600, 98/89 % after 800, 100/91 % after 1000 (measured 2026-11-30);
  # 300 steps of a 300-step cosine gave ~10 %.
  c.external = mlc.ConfigDict(dict(
      teacher_preset="toy-small", teacher_sft_steps=1000, teacher_learning_rate=2e-3,
      teacher_seq_len=72, steps=300))

  # degrade_steps: in the two-domain full study, 300 code-only GRPO steps cost the joint model
  # 5-9 math points, leaving seed 0 within a point of the recovery target (0.9 x its joint math
  # accuracy), so every route "recovered" within an evaluation or two; 1000 steps cost 4-33
  # points (2026-12-01).
  c.self_teacher = mlc.ConfigDict(dict(
      degrade_domain="code", recover_domain="math", degrade_steps=1000, recover_steps=200,
      recover_target_fraction=0.9,
      # The recovery arms are evaluated this many times as often as the rest (every
      # eval interval / eval_refine FLOPs): they are short, and their FLOPs to target is the claim
      # (at 4, with 300 degrade steps, seven of the nine two-domain recovery arms crossed it by
      # their first evaluation).
      eval_refine=16))

  c.eval = mlc.ConfigDict(dict(every_steps=0, every_flops=0.0, points=12, batch_size=128))
  c.report = mlc.ConfigDict(dict(target_fraction=0.9, reference_arm="joint_grpo"))
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
  from smjax.domains import domain_label  # pylint: disable=import-outside-toplevel
  labels = [domain_label(d) for d in c.domains]
  if len(set(labels)) != len(labels):
    raise ValueError(f"config.domains={list(c.domains)}: two domains share the short name used "
                     f"for arms and directories ({labels}); rename one data file")
  if c.base.steps < 0 or (c.base.steps == 0 and not c.model.hf_path):
    raise ValueError(f"config.base.steps={c.base.steps}: a toy base needs >= 1 SFT step (0 is "
                     "allowed only with model.hf_path, whose weights are then the base)")
  if c.base.schedule_steps and c.base.schedule_steps < c.base.steps:
    raise ValueError(f"config.base.schedule_steps={c.base.schedule_steps} must be 0 (the cosine "
                     f"ends at base.steps) or >= config.base.steps={c.base.steps}")
  for field in ("joint.steps", "experts.steps", "mopd.steps", "external.steps",
                "rl.prompts_per_step", "rl.samples_per_prompt", "rl.max_new_tokens",
                "opd.prompts_per_step", "opd.samples_per_prompt", "heldout_size"):
    sect, _, key = field.partition(".")
    value = c[sect][key] if key else c[sect]
    if int(value) < 1:
      raise ValueError(f"config.{field}={value} must be >= 1")
  if c.rl.samples_per_prompt < 2 and c.rl.advantage_mode in ("grpo", "rloo"):
    raise ValueError(f"config.rl.samples_per_prompt={c.rl.samples_per_prompt}: GRPO/RLOO "
                     "advantages need groups of at least 2")
  if "self_teacher" in c.phases:
    for f in ("degrade_domain", "recover_domain"):
      if c.self_teacher[f] not in c.domains:
        raise ValueError(f"config.self_teacher.{f}={c.self_teacher[f]!r} is not one of "
                         f"config.domains={list(c.domains)}")
    if c.self_teacher.degrade_domain == c.self_teacher.recover_domain:
      raise ValueError("config.self_teacher: degrade_domain and recover_domain must differ")
    if int(c.self_teacher.eval_refine) < 1:
      raise ValueError(f"config.self_teacher.eval_refine={c.self_teacher.eval_refine} must be "
                       ">= 1 (1: the recovery arms are evaluated as often as the others)")
  if c.eval.every_steps < 0 or c.eval.every_flops < 0 or c.eval.points < 0:
    raise ValueError("config.eval.every_steps / every_flops / points must be >= 0")


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
# the problem after the answer (`verbose`).
TEACHER_EXTRA_TOKENS = 16


def check_lengths(config, tokenizer, model_cfg, heldout) -> None:
  """Prompt + completion must fit max_seq_len, or the sampler refuses the prompt: checked at start
  on the held-out prompts (the first evaluation samples them), not at that evaluation.

  `heldout`: {domain: [Example]}; `tokenizer`, `model_cfg`: the study's (smjax.study.shared)."""
  from smjax.models.presets import get_preset  # pylint: disable=import-outside-toplevel
  from smjax.batch import encode_prompt  # pylint: disable=import-outside-toplevel
  longest = max((len(encode_prompt(tokenizer, e.prompt)) for ex in heldout.values() for e in ex),
                default=1)
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
  for new_tokens, max_seq_len, what in limits:
    if longest + new_tokens > max_seq_len:
      raise ValueError(
          f"config.rl.max_new_tokens={T} does not fit: the longest held-out prompt of "
          f"config.domains={list(config.domains)} has {longest} tokens (BOS included), and "
          f"{longest} + {new_tokens} new tokens exceeds {what}; use config.rl.max_new_tokens <= "
          f"{max_seq_len - longest - (new_tokens - T)}")
