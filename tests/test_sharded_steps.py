"""Sharded GRPO and OPD steps on 8 fake CPU devices equal the same step on one device.

One subprocess (XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before jax starts)
runs every step kind on one device and under the meshes (data=8), (fsdp=4, tensor=2) and
(data=2, fsdp=2, tensor=2), and writes the losses, the updated parameters and the shardings it saw
to an .npz; the tests compare them here. The three steps (GRPO, OPD sampled, OPD full-vocab, all
impl="xla") are jitted together by `jit_step` as one program per mesh, with the state and batch
shardings of smjax.sharding, which cuts the compiles from 12 to 4. The model is toy-tiny's shape with one layer: its dims
(d_model 64, 4 heads, d_ff 256, vocab 128) divide every mesh axis, so the parameters really are
split, which the tests also check. The same subprocess checks smjax.kernels.dispatch: the Pallas
GRPO and reverse-KL kernels (interpreted) under jax.shard_map equal the XLA path on one device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

MESHES = {"data8": dict(data=8), "fsdp4_tensor2": dict(fsdp=4, tensor=2),
          "data2_fsdp2_tensor2": dict(data=2, fsdp=2, tensor=2)}
STEPS = ("grpo", "opd_sampled", "opd_full_vocab")
B, S, V, GROUP = 8, 12, 128, 4
KERNEL_GROUP = 2  # 2 rows a device on the 4 batch shards of (data=2, fsdp=2, tensor=2)
TOL = 1e-5


# ------------------------------------------------------------------------ the subprocess

def _batch(seed: int):
  """A left-padded SequenceBatch of numpy arrays with every field any of the steps reads."""
  rng = np.random.default_rng(seed)
  prompt_pad = rng.integers(0, 4, B)            # left pads per row
  attn = np.arange(S)[None, :] >= prompt_pad[:, None]
  tokens = np.where(attn, rng.integers(3, V, (B, S)), 0).astype(np.int32)
  positions = np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)
  loss_mask = np.zeros((B, S - 1), bool)
  loss_mask[:, 5:] = attn[:, 6:]
  loss_mask[1, -3:] = False                      # ragged completions
  uniform = -np.log(V)                           # an untrained model is close to uniform
  old = (uniform + 0.1 * rng.standard_normal((B, S - 1))).astype(np.float32)
  teacher = (uniform + rng.standard_normal((B, S - 1))).astype(np.float32)
  rewards = rng.integers(0, 2, B).astype(np.float32)
  rewards[::GROUP] = 1.0 - rewards[1::GROUP]      # every group has signal
  logits = rng.standard_normal((B, S - 1, V)).astype(np.float32)
  return dict(tokens_BS=tokens, positions_BS=positions, attn_mask_BS=attn, loss_mask_BT=loss_mask,
              old_logp_BT=old, rewards_B=rewards, teacher_logp_BT=teacher,
              teacher_logits_BTV=logits)


def _flat(tree):
  import jax
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])


def _kernel_losses(arrays, *, impl, mesh):
  """GRPO loss, metrics and d loss / d logp, and sum(KL^2) and its gradient, through
  smjax.kernels.dispatch (the functions a sharded step calls)."""
  import jax
  import jax.numpy as jnp

  from smjax.kernels import dispatch as sk

  def grpo_loss(logp):
    return sk.grpo_loss_from_rewards(
        logp, arrays["old_logp_BT"], arrays["teacher_logp_BT"], arrays["rewards_B"],
        arrays["loss_mask_BT"], group_size=KERNEL_GROUP, advantage_mode="grpo", eps_low=0.2,
        eps_high=0.28, beta=0.05, kl_estimator="k3", aggregation="seq_mean_token_mean", impl=impl,
        mesh=mesh)

  def rkl(student):
    return jnp.sum(sk.reverse_kl(student, arrays["teacher_logits_BTV"], impl=impl, mesh=mesh) ** 2)

  (loss, aux), g_logp = jax.value_and_grad(grpo_loss, has_aux=True)(arrays["logp_BT"])
  kl, g_student = jax.value_and_grad(rkl)(arrays["student_logits_BTV"])
  return dict(loss=loss, g_logp=g_logp, kl=kl, g_student=g_student,
              **{f"aux_{k}": v for k, v in aux.items()})


def _worker(out_path: str) -> None:
  import time

  import jax
  import jax.numpy as jnp

  from smjax import sharding as shd
  from smjax.models.presets import get_preset
  from smjax.models.transformer import Transformer, init_params
  from smjax.batch import SequenceBatch
  from smjax.train import steps as st
  from smjax.train.state import OptimizerConfig, create_state, make_optimizer

  t0 = time.time()
  assert jax.device_count() == 8, jax.devices()
  cfg = get_preset("toy-tiny", n_layers=1)
  model = Transformer(cfg)
  # eps large enough that Adam's first update g / (sqrt(g^2) + eps) is smooth in g: tiny
  # reduction-order differences in near-zero gradients then stay tiny in the update.
  tx = make_optimizer(OptimizerConfig(learning_rate=1e-2, eps=1e-3, clip_norm=1.0))
  raw = _batch(0)
  fields = {"grpo": ("old_logp_BT", "rewards_B"), "opd_sampled": ("old_logp_BT", "teacher_logp_BT"),
            "opd_full_vocab": ("teacher_logits_BTV",)}
  step_defs = {
      "grpo": st.make_grpo_step(model, tx, st.GRPOConfig(group_size=GROUP, impl="xla")),
      "opd_sampled": st.make_opd_step(model, tx, st.OPDConfig(objective="sampled", impl="xla")),
      "opd_full_vocab": st.make_opd_step(model, tx, st.OPDConfig(objective="full_vocab",
                                                                 impl="xla")),
  }
  base = ("tokens_BS", "positions_BS", "attn_mask_BS", "loss_mask_BT")
  batches = {k: SequenceBatch(**{f: raw[f] for f in base + fields[k]}) for k in step_defs}

  # The three steps as one program (one compile per mesh instead of three), jitted by jit_step
  # exactly as a single step is: donated state, in/out shardings = state and batch shardings.
  def all_steps(states, batch_dict):
    results = {k: step_defs[k].step(states[k], batch_dict[k]) for k in step_defs}
    return {k: r[0] for k, r in results.items()}, {k: r[1] for k, r in results.items()}
  combined = st.StepDef(step=all_steps, loss_fn=None)

  out, info = {}, {}
  key = jax.random.key(0)
  params0 = jax.jit(lambda k: init_params(cfg, k))(key)
  state0 = create_state(params0, tx)
  out["init"] = _flat(params0)
  info["timings"] = {"init": time.time() - t0}
  copies = lambda st_: {k: jax.tree.map(jnp.copy, st_) for k in step_defs}  # steps donate
  new_states, metrics = st.jit_step(combined)(copies(state0), jax.tree.map(jnp.asarray, batches))
  for k in step_defs:
    out[f"single/{k}/loss"] = np.asarray(metrics[k]["loss"])
    out[f"single/{k}/params"] = _flat(new_states[k].params)
  info["timings"]["single_steps"] = time.time() - t0

  kernel_in = {**{k: raw[k] for k in ("old_logp_BT", "teacher_logp_BT", "rewards_B",
                                      "loss_mask_BT", "teacher_logits_BTV")},
               "logp_BT": raw["old_logp_BT"] + 0.05 * np.cos(np.arange(S - 1, dtype=np.float32)),
               "student_logits_BTV": np.roll(raw["teacher_logits_BTV"], 1, axis=-1) * 0.5}
  for name, value in jax.jit(lambda a: _kernel_losses(a, impl="xla", mesh=None))(
      jax.tree.map(jnp.asarray, kernel_in)).items():
    out[f"kernel_xla/{name}"] = np.asarray(value)
  info["timings"]["kernel_xla"] = time.time() - t0

  for mesh_name, axes in MESHES.items():
    mesh = shd.mesh_from_config(axes)
    if mesh_name == "data2_fsdp2_tensor2":  # created sharded (one compile; once is enough)
      sharded0, state_shards = shd.init_sharded_state(cfg, tx, mesh, key)
      out[f"{mesh_name}/init"] = _flat(sharded0.params)
    else:
      _, state_shards = shd.abstract_train_state(cfg, tx, mesh)
      sharded0 = jax.device_put(state0, state_shards)
    mu = sharded0.opt_state[1][0].mu  # chain(clip, adamw): (clip state, (ScaleByAdamState, ..))
    info[mesh_name] = {
        "param_specs": {jax.tree_util.keystr(p): list(x.sharding.spec) for p, x in
                        jax.tree_util.tree_flatten_with_path(sharded0.params)[0]},
        "params_sharded": sum(shd.is_sharded(x.sharding) for x in jax.tree.leaves(sharded0.params)),
        "mu_follows_params": all(m.sharding == p.sharding for m, p in zip(
            jax.tree.leaves(mu), jax.tree.leaves(sharded0.params))),
    }
    sharded_batches = {k: shd.shard_host_batch(b, mesh) for k, b in batches.items()}
    jitted = st.jit_step(combined, state_shardings={k: state_shards for k in step_defs},
                         batch_sharding=shd.batch_shardings(sharded_batches, mesh))
    new_states, metrics = jitted(copies(sharded0), sharded_batches)
    for k in step_defs:
      out[f"{mesh_name}/{k}/loss"] = np.asarray(metrics[k]["loss"])
      out[f"{mesh_name}/{k}/params"] = _flat(new_states[k].params)
      info[mesh_name][k] = {
          "batch_specs": {f: list(v.sharding.spec) for f, v in vars(sharded_batches[k]).items()
                          if isinstance(v, jax.Array)},   # not None fields, not the layout
          "out_state_same_shardings": all(a.sharding == s for a, s in zip(
              jax.tree.leaves(new_states[k]), jax.tree.leaves(state_shards))),
      }
    if mesh_name == "data2_fsdp2_tensor2":  # the Pallas kernels (interpreted) under shard_map
      placed = shd.shard_host_batch(kernel_in, mesh)
      fn = lambda a: _kernel_losses(a, impl="pallas", mesh=mesh)  # noqa: E731
      jaxpr = str(jax.make_jaxpr(fn)(placed))
      info["kernel_jaxpr_has"] = {w: w in jaxpr for w in ("shard_map", "pallas_call")}
      for name, value in jax.jit(fn)(placed).items():
        out[f"kernel_sharded/{name}"] = np.asarray(value)
    info["timings"][mesh_name] = time.time() - t0
  np.savez(out_path, **out)
  with open(out_path + ".json", "w") as f:
    json.dump(info, f)


# ---------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def results(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("sharded") / "results.npz")
  # XLA_FLAGS: the suite's fast-compile flags (conftest.py) and 8 fake devices.
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count=8 {os.environ['XLA_FLAGS']}")
  proc = subprocess.run([sys.executable, __file__, out], env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(out + ".json") as f:
    info = json.load(f)
  return dict(np.load(out)), info


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("kind", STEPS)
def test_sharded_step_equals_single_device(results, mesh_name, kind):
  arrays, _ = results
  single_p, sharded_p = arrays[f"single/{kind}/params"], arrays[f"{mesh_name}/{kind}/params"]
  # Not vacuous: the update moved the parameters by far more than the tolerance.
  assert np.max(np.abs(single_p - arrays["init"])) > 1e-3
  np.testing.assert_allclose(arrays[f"{mesh_name}/{kind}/loss"], arrays[f"single/{kind}/loss"],
                             atol=TOL, rtol=0)
  np.testing.assert_allclose(sharded_p, single_p, atol=TOL, rtol=0)


def test_sharded_init_equals_single_device_init(results):
  arrays, _ = results
  # Same threefry bits; the normal sampler may round differently in another fusion (1 ulp).
  np.testing.assert_allclose(arrays["data2_fsdp2_tensor2/init"], arrays["init"], atol=1e-7,
                             rtol=0)


def test_pallas_kernels_under_shard_map_equal_xla_on_one_device(results):
  arrays, info = results
  assert info["kernel_jaxpr_has"] == {"shard_map": True, "pallas_call": True}
  names = [k.split("/", 1)[1] for k in arrays if k.startswith("kernel_xla/")]
  assert {"loss", "g_logp", "kl", "g_student", "aux_ratio_max", "aux_advantage_std"} <= set(names)
  assert np.max(np.abs(arrays["kernel_xla/g_logp"])) > 1e-3  # gradients are not trivially zero
  for name in names:
    np.testing.assert_allclose(arrays[f"kernel_sharded/{name}"], arrays[f"kernel_xla/{name}"],
                               atol=2e-6, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("rows,group,shape,ok", [
    (16, 4, dict(data=2, fsdp=2, tensor=2), True),    # 4 rows a device: one whole group
    (8, 4, dict(data=8), False),                      # 1 row a device: groups would be split
    (12, 2, dict(data=8), False),                     # 12 rows do not divide 8 devices
    (8, 4, dict(fsdp=2, tensor=4), True),             # "tensor" does not split rows
])
def test_grpo_kernel_plan(rows, group, shape, ok):
  from smjax.kernels.dispatch import grpo_kernel_plan
  got, why = grpo_kernel_plan(rows, group, shape)
  assert got is ok and (why == "") is ok, why


def test_meshes_really_shard(results):
  _, info = results
  # data=8: parameters replicated, every batch field split 8 ways over "data".
  assert info["data8"]["params_sharded"] == 0
  for kind in STEPS:
    specs = info["data8"][kind]["batch_specs"]
    assert specs["tokens_BS"] == ["data", None], specs
  # fsdp/tensor meshes: embed over fsdp, heads/mlp/vocab over tensor.
  for name in ("fsdp4_tensor2", "data2_fsdp2_tensor2"):
    specs = info[name]["param_specs"]
    assert specs["['embed']"] == ["tensor", "fsdp"], specs
    assert specs["['layers_0']['mlp']['down']"] == ["tensor", "fsdp"], specs
    assert specs["['layers_0']['attn']['q']"] == ["fsdp", "tensor", None], specs
    assert specs["['lm_head']"] == ["fsdp", "tensor"], specs
  expect_rows = {"fsdp4_tensor2": "fsdp", "data2_fsdp2_tensor2": ["data", "fsdp"]}
  for name, rows in expect_rows.items():
    logits = info[name]["opd_full_vocab"]["batch_specs"]["teacher_logits_BTV"]
    assert logits == [rows, None, "tensor"], logits
  for name in MESHES:
    assert info[name]["mu_follows_params"]
    for kind in STEPS:
      assert info[name][kind]["out_state_same_shardings"], (name, kind)


if __name__ == "__main__":
  _worker(sys.argv[1])
