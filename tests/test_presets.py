"""Every full-size preset, built abstractly (nothing allocated), against its published size."""

import jax
import pytest

from smjax.models.presets import PRESETS, get_preset
from smjax.models.transformer import Transformer, count_params

# (total, non-embedding) in billions as each model card publishes them, and the digits given.
PUBLISHED = {
    "qwen2.5-0.5b": (0.49, 0.36, 2), "qwen2.5-1.5b": (1.54, 1.31, 2),
    "qwen2.5-7b": (7.61, 6.53, 2), "qwen3-0.6b": (0.6, 0.44, 1), "qwen3-1.7b": (1.7, 1.4, 1),
    "qwen3-4b": (4.0, 3.6, 1), "qwen3-8b": (8.2, 6.95, 1), "llama-3.2-1b": (1.23, None, 2),
    "llama-3.2-3b": (3.21, None, 2), "llama-3.1-8b": (8.03, None, 2),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_full_size_preset_eval_shape(name):
  cfg = get_preset(name)
  shapes = jax.eval_shape(lambda: Transformer(cfg).init(
      jax.random.key(0), jax.numpy.zeros((1, 1), "int32"), jax.numpy.zeros((1, 1), "int32")))
  n = count_params(shapes["params"])
  total, non_emb, digits = PUBLISHED[name]
  tol = 10 ** -digits + 1e-9  # cards round or truncate to the digits shown
  assert abs(n / 1e9 - total) <= tol, (name, n)
  emb = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
  if non_emb is not None:
    assert abs((n - emb) / 1e9 - non_emb) <= tol, (name, n - emb)
  assert n == cfg.num_params()  # the analytic count the FLOP ledger uses agrees with the tree


def test_unknown_preset_lists_known():
  with pytest.raises(ValueError, match="qwen3-8b"):
    get_preset("qwen9-1t")
  assert set(PUBLISHED) <= set(PRESETS)
