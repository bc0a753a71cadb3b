"""The Tunix side of benchmarks/grpo_step_vs_tunix.py; runs inside the Tunix venv, not smjax's.

Usage (the driver does this): `<envs-dir>/tunix/bin/python _peer_tunix.py --spec s.json --out r.json`.

The model is Tunix's own Qwen3 (`tunix.models.qwen3`), loaded from the same safetensors directory
smjax loads (`params.create_model_from_safe_tensors`), on a one-device ("fsdp", "tp") mesh. The
learner is `tunix.rl.grpo.grpo_learner.GRPOLearner` on an `RLCluster` with the "vanilla" rollout
engine (Tunix's KV-cache sampler), beta 0 (no reference model), one iteration per batch,
`loss_agg_mode="token-mean"`, and optax clip_by_global_norm(1.0) + AdamW (0.9, 0.999, 1e-8, no
decay), as the smjax side.

What is timed:
- step: the actor trainer's jitted train step (`PeftTrainer._train_step` under `nnx.jit`, the
  function its train loop calls per step: GRPO policy loss over prompt + completion, grad,
  optimizer update) on a `TrainExample` holding the fixed batch, median of `reps` calls after
  `warmup`, each blocked until ready.
- iteration: `GRPOLearner.train()`, timed per global step (rollout with G samples per prompt and
  no EOS, so every row runs the full length, reward, advantages, the actor update, bookkeeping).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import numpy as np

import _peer_common as common


class WordTokenizer:
  """The "t<id>" text format with the methods Tunix's TokenizerAdapter needs. No BOS (so
  prompts tokenise to the same ids as on the other sides)."""

  def encode(self, text, **_):
    return common.text_to_ids(text)

  def decode(self, ids, **_):
    return common.ids_to_text([i for i in np.asarray(ids).reshape(-1).tolist()
                               if i >= common.FIRST_WORD_ID])

  def bos_id(self):
    return None

  def eos_id(self):
    return common.EOS_ID

  def pad_id(self):
    return common.PAD_ID


def build(spec: dict, *, steps: int, log_dir: str):
  """(learner, rl_cluster, mesh) for `steps` optimizer steps."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from tunix.models.qwen3 import model as qwen3_model  # pylint: disable=import-outside-toplevel
  from tunix.models.qwen3 import params as qwen3_params  # pylint: disable=import-outside-toplevel
  from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=import-outside-toplevel
  from tunix.rl.grpo import grpo_learner  # pylint: disable=import-outside-toplevel
  from tunix.rl.rollout import base_rollout  # pylint: disable=import-outside-toplevel
  from tunix.sft import metrics_logger  # pylint: disable=import-outside-toplevel

  vocab, d, ff, layers, heads, kv, hd = common.SIZES[spec["size"]]
  cfg = qwen3_model.ModelConfig(num_layers=layers, vocab_size=vocab, embed_dim=d, hidden_dim=ff,
                                num_heads=heads, head_dim=hd, num_kv_heads=kv,
                                rope_theta=1_000_000, norm_eps=1e-6, use_tied_embedding=False,
                                dtype=jnp.float32, param_dtype=jnp.float32)
  # Auto axes: Tunix's trainer shards with with_sharding_constraint (jax.make_mesh's default
  # Explicit axes reject that).
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with mesh:
    model = qwen3_params.create_model_from_safe_tensors(spec["model_dir"], cfg, mesh,
                                                        dtype=jnp.float32)
  G, C = spec["group_size"], spec["completion_len"]
  max_prompt = 1 << (spec["prompt_len"][1] - 1).bit_length()
  tx = optax.chain(optax.clip_by_global_norm(1.0),
                   optax.adamw(spec["lr"], b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))
  training = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=tx, eval_every_n_steps=10 ** 9, max_steps=steps,
      metrics_logging_options=metrics_logger.MetricsLoggerOptions(log_dir=log_dir),
      pbar_description=None)
  rollout = base_rollout.RolloutConfig(
      max_tokens_to_generate=C, max_prompt_length=max_prompt, kv_cache_size=max_prompt + C + 8,
      temperature=1.0, top_p=1.0, top_k=None,
      eos_tokens=[vocab])  # an id the model cannot emit: every row runs the full length
  roles = rl_cluster_lib.Role
  cluster = rl_cluster_lib.RLCluster(
      actor=model, reference=None, tokenizer=WordTokenizer(),
      cluster_config=rl_cluster_lib.ClusterConfig(
          role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
          rollout_engine="vanilla", offload_to_cpu=False, training_config=training,
          rollout_config=rollout))

  def even_token_reward(prompts, completions, **_):
    del prompts
    return [common.reward_of_ids(common.text_to_ids(c)) for c in completions]

  algo = grpo_learner.GRPOConfig(num_generations=G, num_iterations=1, beta=0.0, epsilon=0.2,
                                 loss_agg_mode="token-mean")
  learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo,
                                     reward_fns=[even_token_reward])
  return learner, cluster, mesh


def step_bench(spec: dict, log_dir: str) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=import-outside-toplevel
  from tunix.rl.grpo import grpo_learner  # pylint: disable=import-outside-toplevel
  _, cluster, mesh = build(spec, steps=spec["warmup"] + spec["reps"], log_dir=log_dir)
  b = np.load(spec["batch_npz"])
  example = grpo_learner.TrainExample(
      prompt_ids=jnp.asarray(b["prompt_BP"], jnp.int32),
      prompt_mask=jnp.asarray(b["prompt_mask_BP"] > 0),
      completion_ids=jnp.asarray(b["completion_BC"], jnp.int32),
      completion_mask=jnp.asarray(b["completion_mask_BC"] > 0),
      advantages=jnp.asarray(b["advantages_B"], jnp.float32),
      ref_per_token_logps=None, old_per_token_logps=None)
  trainer = cluster.actor_trainer
  # pylint: disable-next=protected-access
  with cluster._get_mesh_and_logical_axis_rules_cm(rl_cluster_lib.Role.ACTOR):
    train_step, _ = trainer.jit_train_and_eval_step(skip_jit=False, cache_nnx_graph=True)

    def run():
      out = train_step(example)
      jax.block_until_ready(out)
      return out

    t0 = time.perf_counter()
    loss, _, grad_norm = run()
    first = time.perf_counter() - t0
    for _ in range(max(spec["warmup"] - 1, 0)):
      run()
    faults = []
    times = common.timed(run, spec["reps"], faults)
  del mesh
  return dict(common.summary(times, faults), first_call_s=first, first_loss=float(loss),
              first_grad_norm=float(grad_norm),
              what="the actor trainer's nnx.jit train step (GRPO policy loss, grad, "
                   "clip + AdamW) on the fixed batch")


def iteration_bench(spec: dict, log_dir: str) -> dict:
  warm, reps = spec["iter_warmup"], spec["iter_reps"]
  learner, _, mesh = build(spec, steps=warm + reps, log_dir=log_dir)
  # An array, as a grain batch gives it: the learner repeats each leaf G times along axis 0.
  prompts = np.array([common.ids_to_text(p) for p in spec["prompts"]])
  starts = []
  run_global_step = learner._run_global_step  # pylint: disable=protected-access

  def timed_global_step(*a, **kw):
    starts.append(time.perf_counter())
    return run_global_step(*a, **kw)

  learner._run_global_step = timed_global_step  # pylint: disable=protected-access
  with mesh:
    learner.train([{"prompts": prompts}] * (warm + reps + 1))
  starts.append(time.perf_counter())
  # Global step i runs from its start to the next one's (generation, update, weight sync and
  # the learner's bookkeeping); the last ends when train() returns (incl. closing the cluster).
  times = [b - a for a, b in zip(starts, starts[1:])]
  return dict(common.summary(times[warm:]), first_call_s=times[0], global_steps=len(times),
              what="GRPOLearner.train() global step: vanilla rollout (G samples, no EOS) + "
                   "reward + advantages + actor update; start to next start")


def main():
  spec, out_path = common.read_spec(__doc__.split("\n\n")[0])
  import flax  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  result = dict(threads=len(os.sched_getaffinity(0)), jax=jax.__version__,
                flax=flax.__version__, tunix=metadata.version("google-tunix"),
                devices=[str(d) for d in jax.devices()])
  with tempfile.TemporaryDirectory() as log_dir:
    if "step" in spec["modes"]:
      result["step"] = step_bench(spec, os.path.join(log_dir, "step"))
    if "iteration" in spec["modes"]:
      result["iteration"] = iteration_bench(spec, os.path.join(log_dir, "iteration"))
  with open(out_path, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
