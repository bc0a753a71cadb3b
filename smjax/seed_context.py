"""What the phases of one study seed share (`SeedContext`): tokenizer, model config, held-out
set and evaluator, the sampler, the GRPO and OPD steps jitted once (with the train state's
shardings on a mesh), the OPD teacher router's settings, and the FLOP grid of evaluations.

smjax.experiment runs the phases on it.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections as mlc

from smjax import data as data_lib
from smjax import domains as domains_lib
from smjax import sharding
from smjax.models import hf
from smjax.rewards.verify import verify_batch
from smjax.models.presets import get_preset
from smjax.models.tokenizer import CharTokenizer, HFTokenizer
from smjax.models.transformer import Transformer, init_params, param_logical_axes
from smjax.rl.teachers import TeacherRouter
from smjax.rollout import Sampler
from smjax.study_config import check_lengths
from smjax.train import state as state_lib
from smjax.train import scoring
from smjax.train import steps as steps_lib
from smjax.train.evaluate import Evaluator
from smjax.train.metrics import MetricsWriter


class SeedContext:
  """Everything the phases of one seed share: data, evaluator, samplers and jitted steps."""

  def __init__(self, config: mlc.ConfigDict, seed: int, workdir: str):
    self.config, self.seed, self.workdir = config, seed, workdir
    m = config.model
    if m.hf_path:
      self.tokenizer = HFTokenizer(m.hf_path)
      self.model_cfg = hf.config_from_hf(m.hf_path, param_dtype=m.param_dtype, dtype=m.dtype,
                                         max_seq_len=m.max_seq_len or None)
    else:
      self.tokenizer = CharTokenizer()
      self.model_cfg = get_preset(m.preset, param_dtype=m.param_dtype, dtype=m.dtype,
                                  **({"max_seq_len": m.max_seq_len} if m.max_seq_len else {}))
    if self.tokenizer.vocab_size > self.model_cfg.vocab_size:
      raise ValueError(
          f"config.model: the tokenizer has {self.tokenizer.vocab_size} ids but the model's "
          f"vocab_size={self.model_cfg.vocab_size} ({m.hf_path or m.preset}): ids past the "
          "embedding would be silently clamped; the tokenizer.json and config.json must come "
          "from the same model")
    self.model = Transformer(self.model_cfg)
    mesh = sharding.mesh_from_config(config.mesh)
    self.mesh = mesh if mesh.size > 1 else None
    # `difficulty` is a knob of the toy domains only; file and reasoning-gym domains take none.
    self.domains = {d: domains_lib.get_domain(d, **({"difficulty": config.difficulty}
                                                    if d in domains_lib.TOY_DOMAINS else {}))
                    for d in config.domains}
    # The held-out split is disjoint from training by construction (smjax.domains); its seed is
    # fixed per study seed so every arm is scored on the same examples.
    self.heldout = {d: dom.generate("test", config.heldout_size, seed=10_000 + seed)
                    for d, dom in self.domains.items()}
    self.verifier = lambda examples, texts: verify_batch(examples, texts, domains=self.domains)
    check_lengths(config, self.tokenizer, self.model_cfg, self.heldout)
    rl = config.rl
    self.sampler = Sampler(self.model_cfg, max_new_tokens=rl.max_new_tokens,
                           eos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id,
                           mesh=self.mesh)
    self.evaluator = Evaluator(self.sampler, self.tokenizer, self.heldout, self.verifier,
                               batch_size=config.eval.batch_size)
    # One optimiser / step per algorithm, shared by every phase that uses it: compiles once.
    self.rl_opt = state_lib.OptimizerConfig(learning_rate=rl.learning_rate,
                                            warmup_steps=rl.warmup_steps, clip_norm=rl.clip_norm)
    self.rl_tx = state_lib.make_optimizer(self.rl_opt)
    grpo_cfg = steps_lib.GRPOConfig(
        group_size=rl.samples_per_prompt, advantage_mode=rl.advantage_mode, eps_low=rl.eps_low,
        eps_high=rl.eps_high, beta=rl.beta, kl_estimator=rl.kl_estimator,
        aggregation=rl.aggregation, micro_batches=rl.micro_batches, impl=rl.impl,
        # Completions are the last max_new_tokens targets (the sampler pads to that width): the
        # LM head never runs on prompt positions, whose logits no loss reads; with shared_prompt
        # each prompt's forward runs once for its samples_per_prompt rows (the sampler's order).
        logits_to_keep=rl.max_new_tokens,
        shared_prompt_rows=rl.samples_per_prompt if rl.shared_prompt else 1)
    self.grpo_step = steps_lib.jit_step(steps_lib.make_grpo_step(
        self.model, self.rl_tx, grpo_cfg, lr_schedule=state_lib.learning_rate_schedule(self.rl_opt),
        mesh=self.mesh), state_shardings=self.state_shardings(self.rl_tx))
    o = config.opd
    self.opd_opt = state_lib.OptimizerConfig(learning_rate=o.learning_rate, clip_norm=rl.clip_norm)
    self.opd_tx = state_lib.make_optimizer(self.opd_opt)
    self.opd_cfg = steps_lib.OPDConfig(objective=o.objective, eps_low=o.eps_low,
                                       eps_high=o.eps_high, top_k=o.top_k,
                                       micro_batches=o.micro_batches, impl=o.impl,
                                       logits_to_keep=rl.max_new_tokens,
                                       shared_prompt_rows=(o.samples_per_prompt
                                                           if o.shared_prompt else 1))
    self.opd_step = steps_lib.jit_step(steps_lib.make_opd_step(self.model, self.opd_tx,
                                                               self.opd_cfg, mesh=self.mesh),
                                       state_shardings=self.state_shardings(self.opd_tx))
    # pack_completions: each rollout batch carries its packed stream, which the step and the
    # reference read (the OPD teachers pack their own rows: teacher_router).
    self.grpo_pack = _packer(rl.max_new_tokens, rl.micro_batches,
                             rl.prompts_per_step * rl.samples_per_prompt, rl.pack_completions)
    self.opd_pack = _packer(rl.max_new_tokens, o.micro_batches,
                            o.prompts_per_step * o.samples_per_prompt, o.pack_completions)
    self.ref_fn = jax.jit(scoring.make_logprob_fn(
        self.model, logits_to_keep=rl.max_new_tokens,
        shared_prompt_rows=grpo_cfg.shared_prompt_rows)) if rl.beta else None
    self.eval_every_flops = self._load_eval_interval()

  # ------------------------------------------------------------------------------- helpers
  def abstract_params(self, cfg=None):
    """ShapeDtypeStructs of a model's parameters (with their shardings on a mesh): restore
    templates that allocate nothing, whatever the model's size."""
    cfg = cfg or self.model_cfg
    abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    if self.mesh is None:
      return abstract
    shards = sharding.param_shardings(abstract, param_logical_axes(cfg), self.mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shards)

  def teacher_router(self, teachers) -> TeacherRouter:
    """OPD teachers scoring the student's samples as the OPD step reads them (the completion
    columns only; each prompt once per block of rows with opd.shared_prompt)."""
    return TeacherRouter(self.model_cfg, teachers,
                         want_logits=self.config.opd.objective != "sampled",
                         logits_to_keep=self.opd_cfg.logits_to_keep,
                         shared_prompt_rows=self.opd_cfg.shared_prompt_rows,
                         pack_completions=self.config.opd.pack_completions)

  def state_shardings(self, tx, cfg=None):
    """The TrainState's shardings on the mesh (None on one device): parameters by their logical
    axes, optimiser moments following them, counters replicated. Steps are jitted with them as
    input and output shardings and states are created with them (`new_state`), so a step's output
    is its next input as it is: each step program compiles once."""
    if self.mesh is None:
      return None
    return sharding.abstract_train_state(cfg or self.model_cfg, tx, self.mesh)[1]

  def new_state(self, params, tx, cfg=None):
    """A fresh TrainState laid out by `state_shardings(tx, cfg)`; without a mesh, committed to this
    process's first local device, as a state restored from a checkpoint is. (An uncommitted state, and so every
    array computed from it, lowers the same programs without their sharding annotations: the same
    numbers, but other compilation-cache keys, so a resumed study would compile everything again
    where a persistent compilation cache is on.)"""
    shardings = self.state_shardings(tx, cfg)
    if shardings is None:
      shardings = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return state_lib.create_sharded_state(params, tx, shardings)

  def random_params(self, key, cfg=None):
    """A seeded random init, created sharded on the mesh (jitted with out_shardings, so the whole
    model never sits on one device) or on the default device without one."""
    cfg = cfg or self.model_cfg
    if self.mesh is None:
      return init_params(cfg, key)
    return sharding.init_sharded_params(cfg, self.mesh, key)[0]

  def initial_params(self):
    """The base phase's starting point: the HF checkpoint's weights, or a seeded random init."""
    m = self.config.model
    if m.hf_path:
      shards = jax.tree.map(lambda a: a.sharding, self.abstract_params()) if self.mesh else None
      put = None
      if shards is not None:
        put = lambda path, arr: jax.device_put(arr, _get_path(shards, path))
      _, params = hf.load_params(m.hf_path, self.model_cfg, put=put)
      return params if put is not None else jax.tree.map(jnp.asarray, params)
    return self.random_params(jax.random.key(self.seed))

  def prompts(self, domains, batch_size: int, stream_seed: int,
              transform=None) -> data_lib.PromptStream:
    ds = data_lib.prompt_pipeline([self.domains[d] for d in domains], batch_size=batch_size,
                                  split="train", seed=self.seed * 1000 + stream_seed)
    return data_lib.PromptStream(iter(ds), transform)

  def _interval_file(self):
    return os.path.join(self.workdir, "eval_interval.json")

  def _load_eval_interval(self) -> float:
    if self.config.eval.every_flops:
      return float(self.config.eval.every_flops)
    if os.path.exists(self._interval_file()):
      with open(self._interval_file()) as f:
        return float(json.load(f)["every_flops"])
    return 0.0

  def fix_eval_interval(self, flops_per_step: float) -> None:
    """Derives the FLOP interval between evaluations from the first GRPO step's cost, once per
    seed: (joint GRPO steps x that cost) / eval.points. Every arm is then evaluated on the same
    FLOP grid."""
    if self.eval_every_flops or not self.config.eval.points:
      return
    self.eval_every_flops = flops_per_step * self.config.joint.steps / self.config.eval.points
    os.makedirs(self.workdir, exist_ok=True)
    with open(self._interval_file(), "w") as f:
      json.dump({"every_flops": self.eval_every_flops, "from_step_flops": flops_per_step}, f)

  def writer(self, phase: str) -> MetricsWriter:
    return MetricsWriter(os.path.join(self.workdir, phase, "logs"))


def _get_path(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def _packer(keep: int, micro_batches: int, rows: int, on: bool):
  """`batch -> batch` adding its packed stream (`scoring.with_packing`), or None when `on` is
  False. The stream length is rounded up to an eighth of a micro-batch's completion columns, so a
  phase compiles its step for at most 8 lengths."""
  if not on:
    return None
  bucket = scoring.eighth_bucket(rows // micro_batches, keep)
  return lambda batch: scoring.with_packing(batch, keep, micro_batches=micro_batches,
                                            bucket=bucket)
