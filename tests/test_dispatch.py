"""kernels/dispatch.py, the one place that picks a loss implementation: `impl` resolution, the mesh
it splits kernels over, and both routes of each loss on one device (the shard_map routes on a
multi-device mesh are tests/test_sharded_steps.py's). Also that smjax.rl imports no kernel and no
train code, so the choice cannot leak back into the loss math."""

import ast
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from smjax.kernels import dispatch
from smjax.rl import grpo

RL_DIR = pathlib.Path(grpo.__file__).parent


def _has_pallas_call(fn, *specs):
  return "pallas_call" in str(jax.make_jaxpr(fn)(*specs))


def test_resolve_impl():
  accelerator = jax.default_backend() in ("tpu", "gpu")
  assert dispatch.resolve_impl("auto") == ("pallas" if accelerator else "xla")
  assert [dispatch.resolve_impl(i) for i in ("pallas", "xla")] == ["pallas", "xla"]
  with pytest.raises(ValueError, match=r"impl='triton' must be one of \('auto', 'pallas', 'xla'\)"):
    dispatch.resolve_impl("triton")
  with pytest.raises(ValueError, match="impl='cuda'"):
    dispatch.reverse_kl(jnp.zeros((2, 5)), jnp.zeros((2, 5)), impl="cuda")


def test_resolve_mesh_ignores_a_single_device():
  one = jax.make_mesh((1,), ("data",), axis_types=(AxisType.Auto,))
  assert dispatch.resolve_mesh() is None and dispatch.resolve_mesh(one) is None
  with jax.set_mesh(one):
    assert dispatch.resolve_mesh() is None


def test_grpo_routes_agree_and_auto_is_xla_on_cpu():
  rng = np.random.default_rng(3)
  b, t, g = 6, 10, 3
  logp = jnp.asarray(rng.normal(-1.5, 0.7, (b, t)), jnp.float32)
  old = logp + jnp.asarray(rng.normal(0.0, 0.3, (b, t)), jnp.float32)
  ref = logp + jnp.asarray(rng.normal(0.0, 0.3, (b, t)), jnp.float32)
  rewards = jnp.asarray(rng.uniform(0, 2, b), jnp.float32)
  mask = jnp.arange(t)[None] < jnp.asarray(rng.integers(1, t + 1, (b, 1)))
  # beta=0 with ref given: KL is reported but carries no gradient (the backward skips ref).
  kw = dict(group_size=g, advantage_mode="grpo", eps_low=0.2, eps_high=0.28, beta=0.0,
            kl_estimator="k3", aggregation="token_mean")

  def loss(lp, impl):
    return dispatch.grpo_loss_from_rewards(lp, old, ref, rewards, mask, impl=impl, **kw)

  @functools.partial(jax.jit, static_argnames="impl")
  def run(lp, impl):
    return jax.value_and_grad(loss, has_aux=True)(lp, impl)

  (loss_p, aux_p), grad_p = run(logp, "pallas")
  (loss_x, aux_x), grad_x = run(logp, "xla")
  np.testing.assert_allclose(loss_p, loss_x, rtol=1e-5)
  assert aux_p.keys() == aux_x.keys()
  for k in aux_p:
    np.testing.assert_allclose(aux_p[k], aux_x[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert float(aux_p["kl_mean"]) > 0.0
  np.testing.assert_allclose(grad_p, grad_x, rtol=1e-5, atol=1e-7)
  if jax.default_backend() == "cpu":
    assert not _has_pallas_call(lambda lp: loss(lp, "auto"), logp)
    assert _has_pallas_call(lambda lp: loss(lp, "pallas"), logp)


def test_reverse_kl_auto_is_the_chunked_xla_path_on_cpu():
  spec = jax.ShapeDtypeStruct((4, 3, 150), jnp.float32)
  if jax.default_backend() == "cpu":
    assert not _has_pallas_call(lambda s, t: dispatch.reverse_kl(s, t), spec, spec)
  assert _has_pallas_call(lambda s, t: dispatch.reverse_kl(s, t, impl="pallas"), spec, spec)


def test_rl_imports_no_kernel_and_no_train_code():
  """Not even lazily: every import statement in smjax/rl/, at any depth."""
  for path in sorted(RL_DIR.glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
      else:
        continue
      bad = [n for n in names if n.startswith(("smjax.kernels", "smjax.train", "kernels"))]
      assert not bad, f"{path.name}:{node.lineno} imports {bad}"
