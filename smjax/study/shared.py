"""What the phases of one study seed share: `seed_shared(config, seed) -> SeedShared`.

A frozen record of the tokenizer, model, mesh, domains and held-out set, the sampler and
evaluator, and the GRPO and OPD steps jitted once (with the train state's shardings on a mesh), so
every phase of a seed runs the same compiled programs. Building it reads the model files and
generates the held-out set; it writes nothing (the phase store, smjax.study.store, owns the
workdir).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections as mlc
import optax

from smjax import data as data_lib
from smjax import domains as domains_lib
from smjax import sharding
from smjax.models import hf
from smjax.models.hub import check_model_dir
from smjax.models.presets import get_preset
from smjax.models.tokenizer import CharTokenizer, HFTokenizer
from smjax.models.transformer import ModelConfig, Transformer, init_params, param_logical_axes
from smjax.rewards.verify import verify_batch
from smjax.rollout import Sampler
from smjax.study.config import (check_lengths, difficulties, domain_keys, experts_model_cfg,
                                strong_to_weak)
from smjax.train import state as state_lib
from smjax.train import steps as steps_lib
from smjax.train.evaluate import Evaluator
from smjax.train.loop import BatchLayout
from smjax.train.teachers import Teacher, TeacherRouter


@dataclasses.dataclass(frozen=True, eq=False)
class SeedShared:
  """Everything the phases of one seed share (module docstring)."""
  config: mlc.ConfigDict
  seed: int
  tokenizer: Any
  model_cfg: ModelConfig
  mesh: Any                        # None on one device
  domains: dict                    # name -> Domain
  heldout: dict                    # name -> [Example], fixed per study seed: the report set
  stop: dict                       # name -> [Example]: the stop set (empty with stop_size=0)
  sampler: Sampler
  evaluator: Callable              # the report and stop sets (`evaluator_for`)
  rl_tx: optax.GradientTransformation
  grpo_step: steps_lib.JittedStep
  grpo_layout: BatchLayout
  opd_tx: optax.GradientTransformation
  opd_step: steps_lib.JittedStep
  opd_layout: BatchLayout
  verify: Callable   # (examples, completion texts) -> rewards, by each example's domain
  # Strong-to-weak (config.experts.preset, when the experts run): the experts' bigger model,
  # whose own record `experts_shared` builds; None: the experts are this record's model.
  experts_model: ModelConfig | None = None

  def abstract_params(self, cfg: ModelConfig | None = None):
    """ShapeDtypeStructs of a model's parameters (with their shardings on a mesh): restore
    templates that allocate nothing, whatever the model's size."""
    cfg = cfg or self.model_cfg
    abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    if self.mesh is None:
      return abstract
    shards = sharding.param_shardings(abstract, param_logical_axes(cfg), self.mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shards)

  def new_state(self, params, tx, cfg: ModelConfig | None = None):
    """A fresh TrainState on the seed's mesh (`new_train_state`)."""
    return new_train_state(params, tx, self.mesh, cfg or self.model_cfg)

  def random_params(self, key, cfg: ModelConfig | None = None):
    """A seeded random init, created sharded on the mesh (jitted with out_shardings, so the whole
    model never sits on one device) or on the default device without one."""
    cfg = cfg or self.model_cfg
    if self.mesh is None:
      return init_params(cfg, key)
    return sharding.init_sharded_params(cfg, self.mesh, key)[0]

  def initial_params(self):
    """The base phase's starting point: the HF checkpoint's weights, or a seeded random init."""
    m = self.config.model
    if not m.hf_path:
      return self.random_params(jax.random.key(self.seed))
    put = None
    if self.mesh is not None:
      shards = jax.tree.map(lambda a: a.sharding, self.abstract_params())
      put = lambda path, arr: jax.device_put(arr, _get_path(shards, path))
    _, params = hf.load_params(m.hf_path, self.model_cfg, put=put)
    return params if put is not None else jax.tree.map(jnp.asarray, params)

  def prompts(self, domains, batch_size: int, stream_seed: int,
              transform=None) -> data_lib.PromptStream:
    """A checkpointable stream of training prompt batches from `domains`."""
    ds = data_lib.prompt_pipeline([self.domains[d] for d in domains], batch_size=batch_size,
                                  split="train", seed=self.seed * 1000 + stream_seed)
    return data_lib.PromptStream(iter(ds), transform)

  def evaluator_for(self, sampler: Sampler | None = None, domains=None,
                    phase: str = "eval/heldout") -> StudyEvaluator:
    """The study's evaluation of `domains` (default: all) with `sampler` (default: the
    student's): the report set under `phase`, the stop set under eval/stop."""
    domains = list(domains or self.heldout)
    sampler = sampler or self.sampler
    report = make_evaluator(self.config, sampler, self.tokenizer,
                            {d: self.heldout[d] for d in domains}, self.verify, phase=phase)
    stop = None
    if self.stop:
      stop = make_evaluator(self.config, sampler, self.tokenizer,
                            {d: self.stop[d] for d in domains}, self.verify, greedy=False,
                            phase="eval/stop")
    return StudyEvaluator(report, stop)

  def teacher_router(self, teachers: list[Teacher]) -> TeacherRouter:
    """OPD teachers scoring the student's samples as the OPD objective reads them."""
    return TeacherRouter(self.model_cfg, teachers,
                         want_logits=self.config.opd.objective != "sampled")


@dataclasses.dataclass(frozen=True)
class StudyEvaluator:
  """`(params) -> (fields, program calls)`: the report set's fields (smjax.train.evaluate), with
  the stop set's accuracy under fields["stop"]["accuracy"] (what the stop rules read,
  smjax.study.rules) when there is one."""
  report: Evaluator
  stop: Evaluator | None = None

  def __call__(self, params):
    fields, calls = self.report(params)
    if self.stop is not None:
      more, stop_calls = self.stop(params)
      fields["stop"] = {"accuracy": more["accuracy"], "samples": more["samples"]}
      calls = list(calls) + list(stop_calls)
    return fields, calls


def draw_stop_set(domain, report: list, n: int, seed: int) -> list:
  """`n` held-out examples of `domain` whose prompts are in neither `report` nor each other:
  drawn from the test split with a seed of their own, skipping every prompt the report set
  holds, so the two sets are disjoint by construction. ValueError when the split has too few
  distinct prompts (a small test file)."""
  taken = {e.prompt for e in report}
  out = []
  for factor in (2, 4, 8, 16):
    out = []
    seen = set(taken)
    for e in domain.generate("test", factor * n, seed=seed):
      if e.prompt not in seen:
        seen.add(e.prompt)
        out.append(e)
        if len(out) == n:
          return out
  raise ValueError(
      f"config.stop_size={n}: domain {domain.name!r} has only {len(out)} held-out prompts that "
      f"are not in its report set (config.heldout_size={len(report)}); lower config.stop_size, "
      "or set it to 0 so that stop rules read the report set")


def make_evaluator(config, sampler, tokenizer, heldout, verify, *, samples: int | None = None,
                   greedy: bool | None = None, phase: str = "eval/heldout") -> Evaluator:
  """The study's held-out evaluation (config.eval; sampled at rl.temperature)."""
  e = config.eval
  return Evaluator(sampler, tokenizer, heldout, verify, batch_size=e.batch_size,
                   samples=samples or e.samples, temperature=config.rl.temperature,
                   greedy=e.greedy if greedy is None else greedy, phase=phase)


def new_train_state(params, tx, mesh, cfg: ModelConfig):
  """A fresh TrainState laid out by `state_shardings(mesh, tx, cfg)`; without a mesh, committed
  to this process's first local device, as a state restored from a checkpoint is. (An
  uncommitted state, and so every array computed from it, lowers the same programs without their
  sharding annotations: the same numbers, but other compilation-cache keys, so a resumed run
  would compile everything again where a persistent compilation cache is on.)"""
  shardings = state_shardings(mesh, tx, cfg)
  if shardings is None:
    shardings = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return state_lib.create_sharded_state(params, tx, shardings)


def state_shardings(mesh, tx, cfg: ModelConfig):
  """The TrainState's shardings on the mesh (None on one device): parameters by their logical
  axes, optimiser moments following them, counters replicated. Steps are jitted with them as
  input and output shardings and states are created with them, so a step's output is its next
  input as it is: each step program compiles once."""
  if mesh is None:
    return None
  return sharding.abstract_train_state(cfg, tx, mesh)[1]


def _get_path(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def _model_and_tokenizer(m: mlc.ConfigDict):
  if m.hf_path:
    check_model_dir(m.hf_path, "config.model.hf_path")
    tokenizer = HFTokenizer(m.hf_path, chat_template=m.chat_template)
    cfg = hf.config_from_hf(m.hf_path, param_dtype=m.param_dtype, dtype=m.dtype,
                            max_seq_len=m.max_seq_len or None)
  else:
    tokenizer = CharTokenizer()
    cfg = get_preset(m.preset, param_dtype=m.param_dtype, dtype=m.dtype,
                     **({"max_seq_len": m.max_seq_len} if m.max_seq_len else {}))
  if tokenizer.vocab_size > cfg.vocab_size:
    raise ValueError(
        f"config.model: the tokenizer has {tokenizer.vocab_size} ids but the model's "
        f"vocab_size={cfg.vocab_size} ({m.hf_path or m.preset}): ids past the embedding would be "
        "silently clamped; the tokenizer.json and config.json must come from the same model")
  return tokenizer, cfg


def seed_shared(config: mlc.ConfigDict, seed: int) -> SeedShared:
  """Builds what the phases of study seed `seed` share (module docstring)."""
  tokenizer, model_cfg = _model_and_tokenizer(config.model)
  model = Transformer(model_cfg)
  mesh = sharding.mesh_from_config(config.mesh)
  mesh = mesh if mesh.size > 1 else None
  # `difficulty` (per domain: `difficulties`, domain_difficulty overriding it) and `form` are
  # knobs of the toy domains only; file and reasoning-gym domains take none.
  level = difficulties(config)
  toy = lambda d: {"difficulty": level[d], "form": config.form}  # noqa: E731
  # Keyed by each domain's name (`domain_keys`: an import path's domain by its `name`), the tag
  # of its examples.
  domains = {k: domains_lib.get_domain(d, **(toy(d) if d in domains_lib.TOY_DOMAINS else {}))
             for d, k in zip(config.domains, domain_keys(config))}
  # The held-out split is disjoint from training by construction (smjax.domains); its seed is
  # fixed per study seed so every arm is scored on the same examples.
  heldout = {d: dom.generate("test", config.heldout_size, seed=10_000 + seed)
             for d, dom in domains.items()}
  stop = {d: draw_stop_set(dom, heldout[d], int(config.stop_size), seed=20_000 + seed)
          for d, dom in domains.items()} if config.stop_size else {}
  check_lengths(config, tokenizer, model_cfg,
                {d: heldout[d] + stop.get(d, []) for d in heldout}, domains)
  rl, o = config.rl, config.opd
  sampler = Sampler(model_cfg, max_new_tokens=rl.max_new_tokens, eos_id=tokenizer.eos_id,
                    pad_id=tokenizer.pad_id, mesh=mesh)
  verify = functools.partial(verify_batch, domains=domains)
  # One optimiser / step per algorithm, shared by every phase that uses it: compiles once.
  rl_tx, grpo_step, grpo_layout = grpo_parts(rl, model, model_cfg, mesh)
  opd_tx, opd_step, opd_layout = opd_parts(o, rl.clip_norm, model, model_cfg, mesh)
  out = SeedShared(
      config=config, seed=seed, tokenizer=tokenizer, model_cfg=model_cfg, mesh=mesh,
      domains=domains, heldout=heldout, stop=stop, sampler=sampler, evaluator=None,
      rl_tx=rl_tx, grpo_step=grpo_step, grpo_layout=grpo_layout,
      opd_tx=opd_tx, opd_step=opd_step, opd_layout=opd_layout,
      verify=verify, experts_model=experts_model_cfg(config) if strong_to_weak(config) else None)
  return dataclasses.replace(out, evaluator=out.evaluator_for())


def experts_shared(shared: SeedShared) -> SeedShared:
  """The seed's record of the experts' model in a strong-to-weak study (`shared.experts_model`,
  config.experts.preset; smjax.study.run): built by `seed_shared` from a copy of the config whose
  model.preset is that preset, so that its domains, report and stop sets are the student's (the
  same seeds draw the same prompts) and its sampler, evaluator and GRPO / OPD steps are that
  model's own (the FLOP ledger charges each model its own programs). It holds the study's config
  as it is: its phases are compared with that, and read experts.preset, which names their model.
  (The preset is taken from the record, not read off the config again between phases.)"""
  if shared.experts_model is None:
    raise ValueError("experts_shared: config.experts.preset is '' (or no phase runs the "
                     "experts): the experts are the student's model, whose record this is")
  copy = mlc.ConfigDict(shared.config.to_dict())
  # The copy's model is the experts' (its own experts.preset "": no bigger model beyond it).
  copy.model.preset, copy.experts.preset = shared.experts_model.name, ""
  return dataclasses.replace(seed_shared(copy, shared.seed), config=shared.config)


def grpo_parts(rl, model: Transformer, model_cfg: ModelConfig, mesh=None):
  """GRPO's optimiser, step (jitted with the train state's shardings on `mesh`) and batch layout
  from a section with config.rl's fields (the study's, and smjax.api's GRPO settings, which
  share their names): one wiring for both, so the short API trains as a study phase does."""
  opt = state_lib.OptimizerConfig(learning_rate=rl.learning_rate,
                                  warmup_steps=rl.warmup_steps, clip_norm=rl.clip_norm)
  tx = state_lib.make_optimizer(opt)
  # No group size here: the step reads it from each batch (the rollout's samples per prompt).
  cfg = steps_lib.GRPOConfig(
      advantage_mode=rl.advantage_mode, eps_low=rl.eps_low,
      eps_high=rl.eps_high, beta=rl.beta, kl_estimator=rl.kl_estimator,
      aggregation=rl.aggregation, micro_batches=rl.micro_batches, impl=rl.impl)
  step = steps_lib.jit_step(
      steps_lib.make_grpo_step(model, tx, cfg,
                               lr_schedule=state_lib.learning_rate_schedule(opt), mesh=mesh),
      state_shardings=state_shardings(mesh, tx, model_cfg))
  layout = BatchLayout(share_prompt=rl.shared_prompt, packed=rl.pack_completions,
                       micro_batches=rl.micro_batches)
  return tx, step, layout


def opd_parts(o, clip_norm: float, model: Transformer, model_cfg: ModelConfig, mesh=None):
  """On-policy distillation's optimiser, step and batch layout from a section with config.opd's
  fields (`grpo_parts`' twin; the gradient is clipped at `clip_norm`, config.rl's)."""
  tx = state_lib.make_optimizer(state_lib.OptimizerConfig(learning_rate=o.learning_rate,
                                                          clip_norm=clip_norm))
  cfg = steps_lib.OPDConfig(objective=o.objective, eps_low=o.eps_low, eps_high=o.eps_high,
                            top_k=o.top_k, micro_batches=o.micro_batches, impl=o.impl)
  step = steps_lib.jit_step(steps_lib.make_opd_step(model, tx, cfg, mesh=mesh),
                            state_shardings=state_shardings(mesh, tx, model_cfg))
  layout = BatchLayout(share_prompt=o.shared_prompt, packed=o.pack_completions,
                       micro_batches=o.micro_batches)
  return tx, step, layout
