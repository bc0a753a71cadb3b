"""On a mesh, a study's train step compiles once; a too-long rl.max_new_tokens fails at start-up.

Compile once: a subprocess with 8 fake CPU devices (XLA_FLAGS set before jax starts) builds the
study's shared record (`smjax.study.shared.seed_shared`) on an (fsdp=4, tensor=2) mesh and runs its
jitted GRPO step three times on a fresh state made the way `rl_phase` makes it (`new_state`). It records the step's compiles
(jax.monitoring's backend-compile events and the jitted function's cache size) and every state
leaf's PartitionSpec before step 1 and after step 3. Before the fix the state was created without
shardings: XLA made Adam's moments replicated, the step returned them (and the 1-D norm scales)
split over fsdp, and step 2 compiled the step again. The batch comes split over fsdp while the step
leaves its sharding unspecified (`jit_step(batch_sharding=None)`): were jax to read None as
"replicated", the call would be refused. A second subprocess runs the same three steps on one
device; losses and parameters must agree, so the shardings did not change the numbers.

Fail fast: `seed_shared` refuses an `rl.max_new_tokens` that does not fit the longest held-out
prompt into the model's (or the external teacher's) max_seq_len, before anything is compiled or
trained. The expected limits are computed here from the prompts' characters (the char tokenizer
gives one id per character, plus BOS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

B, G, P, T = 8, 4, 8, 6   # rows (2 prompts x 4 samples), group size, prompt width, new tokens
STEPS = 3
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
MESH = dict(data=1, fsdp=4, tensor=2)


def _config(**rl):
  from smjax.study.config import study_defaults
  c = study_defaults()
  c.heldout_size = 4
  c.stop_size = 4
  # Short answers: T new tokens hold them (a chain would be refused at start as cut off).
  c.form = "short"
  c.rl.samples_per_prompt, c.rl.max_new_tokens = G, T
  for k, v in rl.items():
    c.rl[k] = v
  return c


# ------------------------------------------------------------------------ the subprocess

def _batch(seed: int):
  """A left-padded GRPO batch (numpy) whose completions fill the last T target columns; the G rows
  of a group share their prompt (the study's step runs it once per group: rl.shared_prompt)."""
  from smjax.batch import Layout, SequenceBatch, check_layout
  rng = np.random.default_rng(seed)
  S, V = P + T, 128
  pads = np.repeat(rng.integers(0, 4, B // G), G)
  attn = np.arange(S)[None, :] >= pads[:, None]
  ids = rng.integers(3, V, (B, S))
  ids[:, :P] = np.repeat(ids[::G, :P], G, axis=0)
  tokens = np.where(attn, ids, 0).astype(np.int32)
  positions = np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)
  loss_mask = np.zeros((B, S - 1), bool)
  loss_mask[:, -T:] = True
  loss_mask[1, -2:] = False                         # a ragged completion
  old = np.where(loss_mask, -np.log(V) + 0.1 * rng.standard_normal((B, S - 1)), 0.0)
  rewards = rng.integers(0, 2, B).astype(np.float32)
  rewards[::G] = 1.0 - rewards[1::G]                # every group has signal
  batch = SequenceBatch(tokens_BS=tokens, positions_BS=positions, attn_mask_BS=attn,
                        loss_mask_BT=loss_mask, old_logp_BT=old.astype(np.float32),
                        rewards_B=rewards, layout=Layout(completion_len=T, rows_per_prompt=G,
                                                                  group_size=G))
  check_layout(batch)
  return batch


def _worker(out_path: str, mesh: dict) -> None:
  import jax
  import jax.numpy as jnp

  from smjax import sharding as shd
  from smjax.study.shared import seed_shared, state_shardings

  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, _secs, **kw: compiles.append(kw.get("fun_name")) if event == COMPILE_EVENT
      else None)
  config = _config()
  for axis, size in mesh.items():
    config.mesh[axis] = size
  ctx = seed_shared(config, 0)
  specs = lambda tree: {k: _spec(x.sharding) if ctx.mesh else None
                        for k, x in _by_path(tree).items()}
  # The base phase's starting point: on the mesh created sharded by its logical axes.
  params = ctx.initial_params()
  state = ctx.new_state(jax.tree.map(jnp.copy, params), ctx.rl_tx)   # as rl_phase does
  info = {"devices": jax.device_count(), "specs_before": specs(state), "losses": [],
          "grad_norms": [], "cache_sizes": []}
  if ctx.mesh is not None:
    info["specs_expected"] = {k: _spec(s) for k, s in
                              _by_path(state_shardings(ctx.mesh, ctx.rl_tx,
                                                       ctx.model_cfg)).items()}
  batches = [jax.tree.map(jnp.asarray, _batch(i)) for i in range(STEPS)]
  if ctx.mesh is not None:   # rows split over the batch axes, as the sampler's outputs are
    batches = [shd.shard_batch(b, ctx.mesh) for b in batches]
  jax.block_until_ready((state, batches))
  first_compile = len(compiles)   # from here on only the steps run
  for batch in batches:
    state, metrics = ctx.grpo_step(state, batch)
    info["losses"].append(float(metrics["loss"]))
    info["grad_norms"].append(float(metrics["grad_norm"]))
    info["cache_sizes"].append(ctx.grpo_step.fn._cache_size())
  info["step_compiles"] = compiles[first_compile:]
  info["specs_after"] = specs(state)
  np.save(out_path + ".npy", np.concatenate([np.ravel(np.asarray(x))
                                             for x in jax.tree.leaves(state.params)]))
  with open(out_path, "w") as f:
    json.dump(info, f)


def _by_path(tree):
  """{leaf path: leaf} of a pytree."""
  import jax
  return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _spec(sharding) -> list:
  """A NamedSharding's PartitionSpec as a list, trailing Nones dropped (P('x', None) == P('x'))."""
  spec = list(sharding.spec)
  while spec and spec[-1] is None:
    spec.pop()
  return spec


# ---------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{"mesh": info, "single": info}: both subprocesses, run side by side."""
  tmp = tmp_path_factory.mktemp("compile_once")
  fast = os.environ["XLA_FLAGS"]   # the suite's fast-compile flags (conftest.py)
  jobs = {"mesh": (f"--xla_force_host_platform_device_count=8 {fast}", MESH),
          "single": (fast, {})}
  procs = {}
  for name, (flags, mesh) in jobs.items():
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)   # it counts the step's compiles: no cache hits
    with open(tmp / f"{name}.log", "w") as log:
      procs[name] = subprocess.Popen([sys.executable, __file__, str(tmp / name), json.dumps(mesh)],
                                     env=env, stdout=log, stderr=subprocess.STDOUT)
  out = {}
  for name, proc in procs.items():
    proc.wait(timeout=300)
    log = (tmp / f"{name}.log").read_text()
    assert proc.returncode == 0, f"{name} worker failed:\n{log[-4000:]}"
    with open(tmp / name) as f:
      out[name] = json.load(f)
    out[name]["params"] = np.load(str(tmp / name) + ".npy")
  return out


def test_grpo_step_compiles_once_on_a_mesh(runs):
  info = runs["mesh"]
  assert info["devices"] == 8
  # One backend compile during the three steps (nothing else runs then): the step's, "jit(step)".
  assert len(info["step_compiles"]) == 1, info["step_compiles"]
  assert "step" in info["step_compiles"][0], info["step_compiles"]
  assert info["cache_sizes"] == [1, 1, 1]


def test_state_shardings_are_the_same_before_and_after_steps(runs):
  info = runs["mesh"]
  before, after, expected = info["specs_before"], info["specs_after"], info["specs_expected"]
  assert before == expected
  assert after == before
  # Not vacuous: parameters and both Adam moments really are split over the mesh, moments as
  # their parameters, and the 1-D norm scales (no mesh axis in the rules) stay replicated.
  mu = {k.split(".mu", 1)[1]: v for k, v in before.items() if ".mu[" in k}
  nu = {k.split(".nu", 1)[1]: v for k, v in before.items() if ".nu[" in k}
  params = {k[len(".params"):]: v for k, v in before.items() if k.startswith(".params")}
  assert mu == params and nu == params
  assert params["['lm_head']"] == ["fsdp", "tensor"]
  assert params["['final_norm']['scale']"] == []
  assert before[".step"] == []


def test_mesh_losses_equal_single_device(runs):
  mesh, single = runs["mesh"], runs["single"]
  assert single["devices"] == 1 and single["cache_sizes"] == [1, 1, 1]
  # Not vacuous: the steps changed the loss (the batches differ and the parameters moved).
  assert np.ptp(single["losses"]) > 1e-3
  np.testing.assert_allclose(mesh["losses"], single["losses"], atol=1e-5, rtol=0)
  np.testing.assert_allclose(mesh["grad_norms"], single["grad_norms"], atol=1e-5, rtol=1e-4)
  np.testing.assert_allclose(mesh["params"], single["params"], atol=1e-5, rtol=0)


# ------------------------------------------------------------------- max_new_tokens at start

def _longest_heldout_prompt(config) -> int:
  """Characters of the longest held-out prompt + 1 (BOS): what the char tokenizer makes of it."""
  from smjax import domains
  return 1 + max(len(e.prompt) for d in config.domains for e in domains.get_domain(
      d, difficulty=config.difficulty, form=config.form).generate("test", config.heldout_size,
                                                                  seed=10_000))


def test_too_long_max_new_tokens_fails_at_startup():
  from smjax.study.shared import seed_shared
  c = _config()
  c.phases = ("base", "joint")
  longest = _longest_heldout_prompt(c)
  fits = 64 - longest            # toy-tiny's max_seq_len is 64
  c.rl.max_new_tokens = fits
  seed_shared(c, 0)       # the largest that fits is accepted
  c.rl.max_new_tokens = fits + 1
  with pytest.raises(ValueError) as e:
    seed_shared(c, 0)
  msg = str(e.value)
  assert f"config.rl.max_new_tokens={fits + 1}" in msg, msg
  assert "max_seq_len=64" in msg and f"has {longest} tokens" in msg, msg
  assert f"config.rl.max_new_tokens <= {fits}" in msg, msg


def test_too_long_for_the_external_teacher_fails_at_startup():
  from smjax.study.shared import seed_shared
  c = _config()
  c.phases = ("base", "external")
  c.model.max_seq_len = 256      # the student fits; the teacher (toy-small: 96) samples T + 24
  longest = _longest_heldout_prompt(c)
  fits = 96 - longest - 24
  c.rl.max_new_tokens = fits
  seed_shared(c, 0)
  c.rl.max_new_tokens = fits + 1
  with pytest.raises(ValueError) as e:
    seed_shared(c, 0)
  msg = str(e.value)
  assert f"config.rl.max_new_tokens={fits + 1}" in msg, msg
  assert "config.external.teacher_preset='toy-small'" in msg and "max_seq_len=96" in msg, msg
  assert f"config.rl.max_new_tokens <= {fits}" in msg, msg


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  _worker(sys.argv[1], json.loads(sys.argv[2]))
